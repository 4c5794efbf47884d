"""Timer-store benchmark: 1,000,000 messages pending over 30 days, and lateness at 10,000 due messages a second.

    python -m bench.bench_timer_scale [--runs 3] [--pending 1000000] [--due-rate 10000] [--due-seconds 10]

Against a real broker process on 127.0.0.1 (``sync`` flush, the real segment
sizes), 100-byte messages, medians of ``--runs`` runs, each on a fresh data dir:

* put rate: ``--pending`` pipelined ``put_at`` frames (depth 64, one connection),
  each due at a random time within the next 30 days; the peer row is the same
  number of plain ``put`` frames of the same size in the same run;
* RSS growth: the broker's resident memory once every timer is indexed
  (``stats``: ``timers_pending``) minus its resident memory after the plain puts
  (so the growth is what the pending timers cost, not the log's own maps);
* start-up after kill -9: SIGKILL with every timer pending, then the time from
  the new process's start until it answers and reports all of them pending;
* lateness: ``--due-rate`` × ``--due-seconds`` messages, put first (due 5 s and
  more after the last put), each carrying its due time; four long-polling
  readers (one per partition) note when each arrives: arrival − due, p50, p99
  and max. It includes the get's wake-up and round trip, as a consumer sees it.

Not a test: nothing here asserts. Targets (issue 21): RSS growth < 200 MB,
start-up < 5 s, put_at ≥ 0.5× put, lateness p99 < 50 ms.
"""

import argparse
import os
import random
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import wire  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from bench.run import pipelined  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.message import iter_records  # noqa: E402

SIZE = 100
PARTITIONS = 4
DAY_MS = 86_400_000
DUE = struct.Struct(">q")


def start(workdir):
    os.makedirs(workdir, exist_ok=True)
    cfg = small_config(os.path.join(workdir, "data"), store=full_size_store(),
                       topics=[{"name": "*", "partitions": PARTITIONS}])
    return BrokerProcess(workdir, cfg).start(timeout=120)


def put_at_frame(topic, partition, payload, when, opaque):
    return b"put_at %s %d %d 0 %d %s %d\r\n%s" % (topic.encode(), partition, len(payload), metaq_checksum(payload),
                                                   when.encode(), opaque, payload)


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def stat(b, name):
    with b.client(timeout=60) as c:
        return int(c.stats_dict()[name])


def wait_pending(b, n, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stat(b, "timers_pending") >= n:
            return
        time.sleep(0.05)
    raise TimeoutError("timers_pending stayed below %d" % n)


def fill(b, n):
    """Plain puts then ``put_at`` puts of the same size; (plain/s, put_at/s, rss growth MB)."""
    payload = b"p" * SIZE
    plain = wire.put_block("plain", payload, 1000)
    plain_rate = pipelined(b.port, plain, n=n)
    time.sleep(1.0)
    before = rss_mb(b.proc.pid)
    now = int(time.time() * 1000)
    frames = [put_at_frame("later", i % PARTITIONS, payload,
                           "@%d" % (now + random.randrange(3_600_000, 30 * DAY_MS)), i)
              for i in range(n)]
    timed_rate = pipelined(b.port, frames)
    del frames
    wait_pending(b, n)
    time.sleep(1.0)
    return plain_rate, timed_rate, rss_mb(b.proc.pid) - before


def restart_after_kill(b, n):
    b.kill()
    t = time.perf_counter()
    b.start(timeout=300)
    wait_pending(b, n)
    return time.perf_counter() - t


def lateness(b, rate, seconds):
    count = rate * seconds
    first_due = int(time.time() * 1000) + 5000 + count * 1000 // 50_000  # puts of them all end before the first is due
    arrivals = []
    lock = threading.Lock()

    def reader(partition, expect):
        got = []
        offset = 0
        with b.client(timeout=60) as c:
            while len(got) < expect:
                r = c.get("due", partition, offset, max_size=1 << 20, max_wait_ms=10_000)
                if not isinstance(r, ev.Value):
                    continue
                now = time.time() * 1000
                for rec, _end in iter_records(r.body):
                    got.append(now - DUE.unpack_from(rec.data, 0)[0])
                    offset += 1
        with lock:
            arrivals.extend(got)

    dues = [first_due + i * 1000 // rate for i in range(count)]
    frames = [put_at_frame("due", i % PARTITIONS, DUE.pack(due) + b"l" * (SIZE - DUE.size), "@%d" % due, i)
              for i, due in enumerate(dues)]
    per = [len(range(p, count, PARTITIONS)) for p in range(PARTITIONS)]
    threads = [threading.Thread(target=reader, args=(p, per[p])) for p in range(PARTITIONS)]
    for t in threads:
        t.start()
    pipelined(b.port, frames)
    for t in threads:
        t.join()
    arrivals.sort()
    with b.client(timeout=60) as c:  # what the disk did meanwhile: a sync put is visible once flushed
        s = c.stats_dict()
    return (arrivals[len(arrivals) // 2], arrivals[int(len(arrivals) * 0.99)], arrivals[-1],
            float(s["flush_time_p99_ms"]), float(s["flush_time_max_ms"]))


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-timers-", dir=args.dir)
    rows = {k: [] for k in ("plain", "timed", "rss", "restart", "p50", "p99", "max", "fsync99", "fsyncmax")}
    try:
        for run_no in range(args.runs):
            b = start(os.path.join(root, "r%d" % run_no))
            try:
                plain, timed, rss = fill(b, args.pending)
                rows["plain"].append(plain)
                rows["timed"].append(timed)
                rows["rss"].append(rss)
                rows["restart"].append(restart_after_kill(b, args.pending))
                p50, p99, worst, fsync99, fsyncmax = lateness(b, args.due_rate, args.due_seconds)
                rows["fsync99"].append(fsync99)
                rows["fsyncmax"].append(fsyncmax)
                rows["p50"].append(p50)
                rows["p99"].append(p99)
                rows["max"].append(worst)
            finally:
                b.stop()
                shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print("timer store: %d pending over 30 days, %d-byte messages, sync flush, median of %d runs"
          % (args.pending, SIZE, args.runs))
    print()
    print("| measure | value | target |")
    print("|---|---|---|")
    print("| plain put, pipelined depth 64 (peer) | %.0f/s | |" % med["plain"])
    print("| put_at (due within 30 days), pipelined depth 64 | %.0f/s (%.2f×) | ≥ 0.5× |"
          % (med["timed"], med["timed"] / med["plain"]))
    print("| broker RSS growth, %d pending | %.0f MB | < 200 MB |" % (args.pending, med["rss"]))
    print("| start-up after kill -9 until all pending | %.2f s | < 5 s |" % med["restart"])
    print("| lateness p50 / p99 / max at %d due/s | %.1f / %.1f / %.1f ms | p99 < 50 ms |"
          % (args.due_rate, med["p50"], med["p99"], med["max"]))
    print("| the log's flush (fsync) time p99 / max meanwhile (the machine's share) | %.1f / %.1f ms | |"
          % (med["fsync99"], med["fsyncmax"]))
    for k in ("timed", "rss", "restart", "p99"):
        print("  runs %s: %s" % (k, ", ".join("%.2f" % x for x in rows[k])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--due-rate", type=int, default=10_000)
    ap.add_argument("--due-seconds", type=int, default=10)
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: the temp dir)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
