"""Client-library benchmark: what an application gets through ``metaq.client``.

    python -m bench.bench_client [--runs 3] [--messages 20000] [--e2e 1000]

Against a real broker process on 127.0.0.1 (started here, data in a temporary
directory), 1 KiB messages, medians of ``--runs`` runs:

* raw pipelined puts (depth 64) over a plain socket: the broker's ceiling, the peer
  every client figure is compared with in the same run;
* ``Producer.send`` (sync: one request at a time) throughput and p50/p99 latency;
* ``Producer.send_async`` (pipelined) throughput;
* end to end: ``Producer.send`` → broker → a long-polling ``Consumer`` handler,
  p50/p99 from send to handler, messages paced 2 ms apart.

Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.run import pipelined_puts, start_broker  # noqa: E402
from metaq.client import Consumer, Message, Producer  # noqa: E402

MSG = 1024


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def producer_sync(url, n):
    """(msgs/s, p50 ms, p99 ms) for n sequential Producer.send calls."""
    lat = []
    with Producer(brokers=[url]) as p:
        p.send(Message("bench", b"w" * MSG))  # warm up: discovery and connection
        started = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            r = p.send(Message("bench", b"s" * MSG))
            lat.append((time.perf_counter() - t) * 1000)
            assert r.success, r
        elapsed = time.perf_counter() - started
    return n / elapsed, pct(lat, 0.50), pct(lat, 0.99)


def producer_async(url, n):
    """msgs/s for n Producer.send_async calls, all acknowledged."""
    with Producer(brokers=[url]) as p:
        p.send(Message("bench", b"w" * MSG))
        started = time.perf_counter()
        futures = [p.send_async(Message("bench", b"a" * MSG)) for _ in range(n)]
        failed = sum(1 for f in futures if not f.result(timeout=120).success)
        elapsed = time.perf_counter() - started
    assert failed == 0, failed
    return n / elapsed


def end_to_end(url, n, gap_s=0.002):
    """(p50 ms, p99 ms) from send to the handler of a long-polling consumer."""
    sent_at, latencies = {}, []
    done = threading.Event()

    def handler(msg):
        latencies.append((time.perf_counter() - sent_at[msg.body]) * 1000)
        if len(latencies) >= n:
            done.set()

    consumer = Consumer("bench-e2e", brokers=[url], start_from="latest")
    consumer.subscribe("e2e", handler)
    with Producer(brokers=[url]) as p:
        p.send(Message("e2e", b"warm-up"))
        consumer.start()
        time.sleep(1.0)  # let the consumer settle on its long polls
        latencies.clear()
        for i in range(n):
            body = b"%08d" % i + b"e" * (MSG - 8)
            sent_at[body] = time.perf_counter()
            p.send(Message("e2e", body))
            time.sleep(gap_s)
        done.wait(60)
    consumer.close()
    return pct(latencies, 0.50), pct(latencies, 0.99)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-client-", dir=args.dir)
    rows = {}
    try:
        for r in range(args.runs):
            b = start_broker(root, args.flush, "client-%d" % r)
            url = "meta://127.0.0.1:%d" % b.port
            rows.setdefault("raw", []).append(pipelined_puts(b.port, args.messages))
            rows.setdefault("async", []).append(producer_async(url, args.messages))
            rows.setdefault("sync", []).append(producer_sync(url, args.sync_messages))
            rows.setdefault("e2e", []).append(end_to_end(url, args.e2e))
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    raw = med(rows["raw"])
    sync_rate = med(x[0] for x in rows["sync"])
    table = [
        ("raw socket, pipelined depth 64 (peer)", "%s msgs/s" % f"{raw:,.0f}", "1.00×"),
        ("Producer.send_async (pipelined)", "%s msgs/s" % f"{med(rows['async']):,.0f}",
         "%.2f×" % (med(rows["async"]) / raw)),
        ("Producer.send (sync, one at a time)", "%s msgs/s" % f"{sync_rate:,.0f}", "%.2f×" % (sync_rate / raw)),
        ("Producer.send p50 / p99", "%.2f / %.2f ms" % (med(x[1] for x in rows["sync"]),
                                                    med(x[2] for x in rows["sync"])), ""),
        ("send → long-polling handler p50 / p99", "%.2f / %.2f ms" % (med(x[0] for x in rows["e2e"]),
                                                                  med(x[1] for x in rows["e2e"])), ""),
    ]
    print("\nmetaq client, 1 KiB messages, flush=%s, median of %d runs\n" % (args.flush, args.runs))
    width = max(len(t[0]) for t in table)
    print("| %s | result | vs raw |" % "measurement".ljust(width))
    print("|%s|---|---|" % ("-" * (width + 2)))
    for name, value, ratio in table:
        print("| %s | %s | %s |" % (name.ljust(width), value, ratio))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=20000, help="messages for the pipelined rows")
    p.add_argument("--sync-messages", type=int, default=3000, help="messages for the sync row")
    p.add_argument("--e2e", type=int, default=1000, help="messages for the end-to-end row")
    p.add_argument("--flush", choices=("sync", "async"), default="sync")
    p.add_argument("--dir", default=None)
    run(p.parse_args())


if __name__ == "__main__":
    main()
