"""What bounds the durable rows: 16 producers that each wait for their fsynced ack (issue 22 point 1).

    python -m bench.bench_durable [--depths 1 8] [--runs 3] [--per N] [--baseline /path/to/another/tree] [--floor]

The durable rows of ``bench/run.py`` give a rate; this says why it is what it is. For each depth, in turns
(this tree's broker in ``sync`` mode, the ``--baseline`` tree's when given, Redis Streams with ``appendfsync
always``), 16 producer processes put 1 KiB messages with ``depth`` in flight each, and the run reports:

* the rate, and the server's CPU per put (all its threads, ``/proc/<pid>/task/*/stat``);
* ``loop``: the share of one core its busiest thread used (metaq's event loop; Redis's main thread). Near 100%,
  the loop is the bound: faster puts need less CPU per put, not a faster disk or more producers;
* metaq's flush rounds (``stats``: ``flush_rounds``) and the puts that shared each fsync;
* ``machine``: how busy both CPUs were over the run (``/proc/stat``), so a row bound by the machine itself
  (every CPU busy, clients included) shows as one.

``--floor`` adds ``bench/gevent_floor.py``, the smallest gevent server that does what a durable put needs
(read, copy into a map, a group fdatasync off the loop, ack) and nothing else: the cost of the runtime itself;
and ``floor-inline``, the same server fdatasyncing on its event loop as Redis does (which metaq must not).

Medians of the runs per target. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import run as bench_run  # noqa: E402
from bench.gevent_floor import FloorServer  # noqa: E402
from metaq.client.local import free_port  # noqa: E402
from bench.redis_streams import RedisBench, redis_available  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def thread_ticks(pid):
    """``{tid: user + system ticks}`` of every thread of ``pid``."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        out[tid] = int(fields[11]) + int(fields[12])
    return out


def machine_ticks():
    """``(all ticks, idle + iowait ticks)`` of the machine, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def flush_rounds(port):
    """The broker's ``flush_rounds`` from its ``stats`` summary."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(b"stats\r\n")
        data = b""
        while b"\r\nflush_rounds " not in data or not data.endswith(b"\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    for line in data.split(b"\r\n"):
        if line.startswith(b"flush_rounds "):
            return int(line.split()[1])
    raise RuntimeError("no flush_rounds in the broker's stats")


class Measured:
    """Run ``drive()`` (returns puts/s) while watching ``pid``: the figures of one run."""

    def __init__(self, pid, drive, puts):
        t0, m0 = thread_ticks(pid), machine_ticks()
        self.rate = drive()
        t1, m1 = thread_ticks(pid), machine_ticks()
        used = {tid: t1[tid] - t0.get(tid, 0) for tid in t1}
        elapsed = puts / self.rate
        self.cpu_us = sum(used.values()) / HZ / puts * 1e6
        self.loop = max(used.values()) / HZ / elapsed
        all_ticks, idle = m1[0] - m0[0], m1[1] - m0[1]
        self.machine = 1 - idle / max(1, all_ticks)
        self.puts = puts
        self.rounds = None  # metaq's flush rounds over the run (set by metaq_run)


def metaq_run(root, name, depth, per, source=None):
    saved = os.environ.get("PYTHONPATH")
    if source is not None:  # the broker process imports metaq from that tree
        os.environ["PYTHONPATH"] = os.path.abspath(source)
    try:
        broker = bench_run.start_broker(root, "sync", name)
    finally:
        if source is not None:
            os.environ.pop("PYTHONPATH") if saved is None else os.environ.__setitem__("PYTHONPATH", saved)
    try:
        bench_run.concurrent_producers(broker.port, 16, 200, depth=depth)  # connections, maps, page cache warm
        before = flush_rounds(broker.port)
        m = Measured(broker.proc.pid, lambda: bench_run.concurrent_producers(broker.port, 16, per, depth=depth),
                     16 * per)
        m.rounds = flush_rounds(broker.port) - before
        return m
    finally:
        broker.stop()
        shutil.rmtree(broker.workdir, ignore_errors=True)


def floor_run(root, depth, per, inline=False):
    floor = FloorServer(free_port(), root, inline=inline)
    try:
        bench_run.concurrent_producers(floor.port, 16, 200, depth=depth)
        return Measured(floor.proc.pid, lambda: bench_run.concurrent_producers(floor.port, 16, per, depth=depth),
                        16 * per)
    finally:
        floor.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per", type=int, default=None,
                        help="puts per producer and run (default: 2000 at depth 1, 1000 x depth past it)")
    parser.add_argument("--baseline", help="another metaq source tree (its C helper built) measured in turns")
    parser.add_argument("--dir", default=None, help="where the data goes (default: $TMPDIR)")
    parser.add_argument("--floor", action="store_true", help="measure bench/gevent_floor.py too (the runtime's cost)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="metaq-durable-", dir=args.dir)
    redis = RedisBench(root) if redis_available() else None
    try:
        if redis:
            redis.set_fsync("always")
        for depth in args.depths:
            per = args.per or max(2000, 1000 * depth)  # a run of a few seconds: the start-up's idle ticks weigh little
            results = {}
            for r in range(args.runs):
                name = "d%d-%d" % (depth, r)
                results.setdefault("metaq", []).append(metaq_run(root, name, depth, per))
                if args.baseline:
                    results.setdefault("baseline", []).append(
                        metaq_run(root, name + "-base", depth, per, args.baseline))
                if args.floor:
                    results.setdefault("floor", []).append(floor_run(root, depth, per))
                    results.setdefault("floor-inline", []).append(floor_run(root, depth, per, inline=True))
                if redis:
                    results.setdefault("redis", []).append(Measured(
                        redis.proc.pid, lambda per=per, depth=depth: redis.concurrent_xadd(16, per, depth), 16 * per))
                print("depth %d run %d: %s" % (depth, r + 1, "  ".join(
                    "%s %.0f/s" % (key, runs[-1].rate) for key, runs in results.items())), flush=True)
            print_depth(depth, results, args.runs)
    finally:
        if redis:
            redis.close()
        shutil.rmtree(root, ignore_errors=True)


def print_depth(depth, results, runs):
    med = statistics.median
    peer = med([m.rate for m in results["redis"]]) if "redis" in results else None
    print("\n16 producers x depth %d (medians of %d runs)" % (depth, runs))
    print("%-12s %10s %8s %12s %7s %9s %11s %8s" % ("target", "puts/s", "vs redis", "cpu us/put", "loop",
                                                  "machine", "fsyncs", "puts/fsync"))
    for key, ms in results.items():
        rate = med([m.rate for m in ms])
        with_rounds = [m for m in ms if m.rounds]
        print("%-12s %10.0f %8s %12.1f %6.0f%% %8.0f%% %11s %8s" % (
            key, rate, "%.2fx" % (rate / peer) if peer else "-", med([m.cpu_us for m in ms]),
            100 * med([m.loop for m in ms]), 100 * med([m.machine for m in ms]),
            "%d" % med([m.rounds for m in with_rounds]) if with_rounds else "-",
            "%.1f" % med([m.puts / m.rounds for m in with_rounds]) if with_rounds else "-"))
    print(flush=True)


if __name__ == "__main__":
    main()
