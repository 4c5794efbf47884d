"""Timer benchmark: put_at's rate beside put_delayed and plain puts, the backlog drain, lateness beside a level.

    python -m bench.bench_timers [--runs 3] [--messages 10000]

Against a real broker process on 127.0.0.1 (``sync`` flush, delay levels ``"1s"``), 1 KiB messages, medians of
``--runs`` runs, every row of one run against the same broker:

* put rate: ``--messages`` pipelined ``put_at +1000`` on one connection; the peers are the same number of
  ``put_delayed`` level 1 and of plain ``put`` frames;
* backlog drain: the broker is stopped before the ``put_at`` messages are due and started again after; messages
  delivered per second from "ready" until the last is readable (the index is caught up first, then the window
  loads, then batches of at most ``MAX_TIMER_DONE_IDS`` with one DONE record each);
* lateness: 20 single ``put_at +1000`` and, as the peer, 20 ``put_delayed`` level 1, each read by a long-polling
  get: arrival minus (acknowledgement + 1 s). It includes the get's round trip.

Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.bench_delay import delayed_puts, start  # noqa: E402
from bench.run import MSG, pipelined, pipelined_puts  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.text import serialize  # noqa: E402
from metaq.timers.wire import TimerPut  # noqa: E402

TOPIC = "bench"


def timer_puts(port, n, depth=64):
    payload = b"t" * MSG
    crc = metaq_checksum(payload)
    return pipelined(port, [serialize(TimerPut(TOPIC, 0, 0, payload, i, crc, "+1000")) for i in range(n)], depth)


def readable(b, topic=TOPIC):
    with b.client() as c:
        return int(c.call(ev.Offset(topic, "g", 0, 1 << 62, c.opaque())).body)


def drain(b, target):
    b.stop()
    time.sleep(1.2)  # every timer is now overdue
    b.start()
    t = time.perf_counter()
    before = readable(b)
    while readable(b) < target:
        time.sleep(0.005)
    return (target - before) / (time.perf_counter() - t)


def lateness(b, make, topic, count=20):
    out = []
    with b.client() as c:
        for i in range(count):
            r = c.call(make(topic, c.opaque()))
            acked = time.perf_counter()
            assert r.code == 200, r
            while not isinstance(c.get(topic, 0, i, max_wait_ms=5000), ev.Value):
                pass
            out.append((time.perf_counter() - acked - 1.0) * 1000)
            time.sleep(0.02)
    return sorted(out)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-timers-", dir=args.dir)
    rows = {k: [] for k in ("plain", "delayed", "timer", "drain", "t50", "tmax", "d50", "dmax")}
    try:
        for run_no in range(args.runs):
            b = start(root, "r%d" % run_no)
            n = args.messages
            rows["plain"].append(pipelined_puts(b.port, n))
            rows["delayed"].append(delayed_puts(b.port, n))
            while readable(b) < 2 * n:  # the level's deliveries are over before the timers go in
                time.sleep(0.05)
            rows["timer"].append(timer_puts(b.port, n))
            rows["drain"].append(drain(b, 3 * n))
            late = lateness(b, lambda t, o: TimerPut(t, 0, 0, b"late", o, -1, "+1000"), "late-t")
            rows["t50"].append(late[len(late) // 2])
            rows["tmax"].append(late[-1])
            late = lateness(b, lambda t, o: ev.DelayedPut(t, 0, 0, b"late", o, -1, 1), "late-d")
            rows["d50"].append(late[len(late) // 2])
            rows["dmax"].append(late[-1])
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print("timers, %d x 1 KiB messages, sync flush, median of %d runs" % (args.messages, args.runs))
    print("%-48s %14s" % ("measure", "value"))
    print("%-48s %11.0f/s" % ("plain put, pipelined (peer)", med["plain"]))
    print("%-48s %11.0f/s" % ("put_delayed level 1, pipelined (peer)", med["delayed"]))
    print("%-48s %11.0f/s" % ("put_at +1000, pipelined", med["timer"]))
    print("%-48s %11.0f/s" % ("put_at backlog drain after a restart", med["drain"]))
    print("%-48s %11.1f ms" % ("put_at lateness p50 (arrival - ack - 1 s)", med["t50"]))
    print("%-48s %11.1f ms" % ("put_at lateness max of 20", med["tmax"]))
    print("%-48s %11.1f ms" % ("put_delayed level 1 lateness p50 (peer)", med["d50"]))
    print("%-48s %11.1f ms" % ("put_delayed level 1 lateness max of 20 (peer)", med["dmax"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=10000)
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: the temp dir)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
