"""Single-put latency, interleaved: brokers and Redis side by side, measured in turns (issue 22 point 1).

    python bench/bench_latency.py [--flush sync] [--puts 3000] [--runs 3] [--dir /dev/shm]
                                  [--baseline /path/to/another/metaq/tree] [--floor]

On a shared machine the load changes from one minute to the next, and a row measured a minute after
its peer compares two different machines. Here every target is up at once (this tree's broker, the
``--baseline`` tree's broker when given, Redis Streams with ``appendfsync always`` for ``sync`` and
``everysec`` for ``async``) and each takes ``CHUNK`` sequential puts in turn, the first of a turn
rotating, so all of them see the same minutes. Every server runs on the CPUs other than the client's
(``run.placed``: a round trip within one CPU and one across two differ eightfold here). ``--dir /dev/shm`` puts
the logs on tmpfs: fdatasync then costs next to nothing and
what is left is the broker's own time above the disk (the hand-offs, wake-ups and Python of a put).
``--floor`` adds the two floor servers of ``bench/gevent_floor.py`` (``sync`` only): the smallest gevent server
that writes a put into a map and acks it after an fdatasync in gevent's thread pool (``floor``), and the same
fdatasyncing on its event loop as Redis does (``floor-inline``): what any broker written on gevent pays.
Prints p50 / p90 / p99 per target and the ratio to Redis, per run and the medians of the runs.
Not a test: nothing here asserts.
"""

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import run as bench_run  # noqa: E402
from bench import wire  # noqa: E402
from bench.gevent_floor import FloorServer  # noqa: E402
from metaq.client.local import free_port  # noqa: E402
from bench.redis_streams import XADD, Reader, RedisBench, redis_available  # noqa: E402

#: Sequential puts a target takes before the next one has its turn.
CHUNK = 100
#: Puts each target takes before the measurement (connections, maps and page cache warm).
WARM_UP = 200


class MetaqTarget:
    def __init__(self, root, flush, name, source=None):
        saved = os.environ.get("PYTHONPATH")
        if source is not None:  # the broker process imports metaq from that tree
            os.environ["PYTHONPATH"] = os.path.abspath(source)
        try:
            self.broker = bench_run.start_broker(root, flush, name)
        finally:
            if source is not None:
                os.environ.pop("PYTHONPATH") if saved is None else os.environ.__setitem__("PYTHONPATH", saved)
        self.pid = self.broker.proc.pid
        self.frame = bench_run.put_frames(1)[0]
        self.sock = wire.connect(self.broker.port)
        self.replies = wire.ResultReplies(self.sock)

    def put(self):
        started = time.perf_counter()
        self.sock.sendall(self.frame)
        self.replies.wait(1)
        return time.perf_counter() - started

    def close(self):
        self.sock.close()
        self.broker.stop()


class FloorTarget(MetaqTarget):
    def __init__(self, root, inline):  # no super().__init__(): it starts a broker, this starts a floor server instead
        directory = os.path.join(root, "floor-inline" if inline else "floor")
        os.makedirs(directory, exist_ok=True)
        self.broker = FloorServer(free_port(), directory, inline=inline)
        self.pid = self.broker.proc.pid
        self.frame = bench_run.put_frames(1)[0]
        self.sock = wire.connect(self.broker.port)
        self.replies = wire.ResultReplies(self.sock)


class RedisTarget:
    def __init__(self, root, flush):
        self.redis = RedisBench(root)
        self.redis.set_fsync("always" if flush == "sync" else "everysec")
        self.pid = self.redis.proc.pid
        self.sock = socket.create_connection(("127.0.0.1", self.redis.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = Reader(self.sock)

    def put(self):
        started = time.perf_counter()
        self.sock.sendall(XADD)
        self.reader.skip()
        return time.perf_counter() - started

    def close(self):
        self.sock.close()
        self.redis.close()


def percentile(sorted_xs, q):
    return sorted_xs[min(len(sorted_xs) - 1, int(len(sorted_xs) * q))] * 1e3


def one_run(args, root, run):
    targets = {}
    # The brokers start in turn too (this tree's first in even runs): the first one started was seen to be
    # slower in some runs on a busy machine.
    for name in (("metaq", "baseline") if run % 2 == 0 else ("baseline", "metaq")):
        if name == "metaq":
            targets[name] = MetaqTarget(root, args.flush, "metaq-%d" % run)
        elif args.baseline:
            targets[name] = MetaqTarget(root, args.flush, "baseline-%d" % run, args.baseline)
    if args.floor:
        targets["floor"] = FloorTarget(root, inline=False)
        targets["floor-inline"] = FloorTarget(root, inline=True)
    if redis_available():
        targets["redis"] = RedisTarget(os.path.join(root, "redis-%d" % run), args.flush)
    placement = contextlib.ExitStack()  # this client on the first CPU, every server on the others (run.placed)
    try:
        for target in targets.values():
            placement.enter_context(bench_run.placed(target.pid))
        for target in targets.values():
            for _ in range(WARM_UP):
                target.put()
        lat = {name: [] for name in targets}
        order = list(targets.items())
        for turn in range(0, args.puts, CHUNK):
            k = turn // CHUNK % len(order)  # each target goes first in turn (what ran just before it varies)
            for name, target in order[k:] + order[:k]:
                lat[name].extend(target.put() for _ in range(CHUNK))
    finally:
        placement.close()
        for target in targets.values():
            target.close()
    return {name: [percentile(sorted(xs), q) for q in (0.5, 0.9, 0.99)] for name, xs in lat.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--flush", choices=("sync", "async"), default="sync")
    p.add_argument("--puts", type=int, default=3000, help="sequential puts per target and run")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the logs go (default: $TMPDIR; /dev/shm: tmpfs)")
    p.add_argument("--baseline", default=None, help="another metaq source tree (its C helper built) to run beside")
    p.add_argument("--floor", action="store_true", help="the gevent floor servers beside (bench/gevent_floor.py)")
    args = p.parse_args()
    if args.floor and args.flush != "sync":
        p.error("--floor measures durable puts: use it with --flush sync")
    runs = []
    for run in range(args.runs):
        root = tempfile.mkdtemp(prefix="metaq-latency-", dir=args.dir)
        try:
            runs.append(one_run(args, root, run))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print("run %d: %s  (load %.1f)" % (run + 1, "  ".join(
            "%s %.3f/%.3f/%.3f" % (name, *figs) for name, figs in runs[-1].items()), os.getloadavg()[0]), flush=True)
    print("\n%-12s %9s %9s %9s %12s %12s" % ("flush=" + args.flush, "p50 ms", "p90 ms", "p99 ms", "p50 vs redis",
                                           "p99 vs redis"))
    names = [n for n in ("metaq", "baseline", "floor", "floor-inline", "redis") if n in runs[0]]
    medians = {name: [statistics.median(r[name][k] for r in runs) for k in range(3)] for name in names}
    red = medians.get("redis")
    for name, (p50, p90, p99) in medians.items():
        ratios = ("%11.2fx %11.2fx" % (red[0] / p50, red[2] / p99)) if red else ""
        print("%-12s %9.3f %9.3f %9.3f %s" % (name, p50, p90, p99, ratios))
    if red:
        print("ratio > 1: metaq lower (better); medians of %d runs, each target %d puts per run"
              % (args.runs, args.puts))


if __name__ == "__main__":
    main()
