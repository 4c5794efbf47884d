"""Delayed-delivery benchmark: put rate with a delay level beside plain puts, backlog drain rate, lateness.

    python -m bench.bench_delay [--runs 3] [--messages 20000]

Against a real broker process on 127.0.0.1 (``sync`` flush, delay levels
``"1s"``), 1 KiB messages, medians of ``--runs`` runs:

* put rate: ``--messages`` pipelined ``put_delayed`` (level 1) on one connection;
  the peer row is the same number of plain ``put`` frames in the same run;
* backlog drain: the broker is stopped before those messages are due and started
  again after; the rate is messages delivered per second from the restart's
  "ready" (less those delivered before it was seen) until the last one is readable in its topic (one greenlet per level,
  batches of 256 KiB, each batch made durable before the next offset save);
* lateness: 20 single delayed puts, 20 ms apart, read by a long-polling get;
  arrival minus (acknowledgement + 1 s). It includes the get's round trip.

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

from bench.run import MSG, pipelined, pipelined_puts  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.text import serialize  # noqa: E402

TOPIC = "bench"


def start(root, name):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    cfg = small_config(os.path.join(wd, "data"), store=full_size_store(),
                       topics=[{"name": "*", "partitions": 1}], delay={"levels": "1s"})
    return BrokerProcess(wd, cfg).start()


def delayed_puts(port, n, depth=64):
    payload = b"d" * MSG
    crc = metaq_checksum(payload)
    return pipelined(port, [serialize(ev.DelayedPut(TOPIC, 0, 0, payload, i, crc, 1)) for i in range(n)], depth)


def readable(b):
    """Messages readable in TOPIC (its partition 0's max offset)."""
    with b.client() as c:
        r = c.call(ev.Offset(TOPIC, "g", 0, 1 << 62, c.opaque()))
        return int(r.body)


def drain(b, n, plain):
    b.stop()
    time.sleep(1.2)  # every scheduled message is now overdue
    b.start()
    t = time.perf_counter()
    already = readable(b) - plain  # delivered between the scheduler's start and "ready" being seen
    while readable(b) < plain + n:
        time.sleep(0.005)
    return (n - already) / (time.perf_counter() - t)


def lateness(b, count=20):
    out = []
    with b.client() as c:
        payload = b"late"
        for i in range(count):
            r = c.call(ev.DelayedPut("late", 0, 0, payload, c.opaque(), -1, 1))
            acked = time.perf_counter()
            assert r.code == 200, r
            while True:
                v = c.get("late", 0, i, max_wait_ms=5000)
                if isinstance(v, ev.Value):
                    break
            out.append((time.perf_counter() - acked - 1.0) * 1000)
            time.sleep(0.02)
    return out


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-delay-", dir=args.dir)
    rows = {"plain": [], "delayed": [], "drain": [], "late50": [], "late_max": []}
    try:
        for run_no in range(args.runs):
            b = start(root, "r%d" % run_no)
            rows["plain"].append(pipelined_puts(b.port, args.messages))
            rows["delayed"].append(delayed_puts(b.port, args.messages))
            rows["drain"].append(drain(b, args.messages, args.messages))
            late = sorted(lateness(b))
            rows["late50"].append(late[len(late) // 2])
            rows["late_max"].append(late[-1])
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print("delayed delivery, %d x 1 KiB messages, sync flush, median of %d runs" % (args.messages, args.runs))
    print("%-44s %14s" % ("measure", "value"))
    print("%-44s %11.0f/s" % ("plain put, pipelined (peer)", med["plain"]))
    print("%-44s %11.0f/s" % ("put_delayed level 1, pipelined", med["delayed"]))
    print("%-44s %11.0f/s" % ("backlog drain after a restart (all overdue)", med["drain"]))
    print("%-44s %11.1f ms" % ("lateness p50 (arrival - ack - 1 s)", med["late50"]))
    print("%-44s %11.1f ms" % ("lateness max of 20", med["late_max"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: the temp dir)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
