"""Batched puts (issue 45): the Producer with and without batches, and the broker's ceiling for each wire form.

    python -m bench.bench_batches [--runs 5] [--messages 100000] [--flush sync|async] [--profile]

Against a real broker process on 127.0.0.1 (started here, data in a temporary directory), 100 B and 1 KiB
messages to one topic of 4 partitions, medians of ``--runs`` runs, the rows of a run measured one after the
other in an order that alternates between runs:

* ``Producer.send_async`` of ``--messages`` messages, all acknowledged, batching on (``batch_bytes`` 256 KiB,
  ``linger_ms`` 5) and off (one ``put`` each, pipelined);
* ``Producer.send_many`` of the same messages, in calls of ``--many`` payloads each (one future a call, the frames
  encoded by the C helper), all acknowledged;
* raw ``putb`` frames of 256 KiB (at most 1,000 messages) over a plain socket, 8 in flight, pre-encoded: what
  the broker takes when the client costs nothing;
* raw pipelined ``put`` frames (depth 64), pre-encoded: the put burst path's figure.

``--profile``: one batched Producer run under cProfile, its top functions by own time. Not a test: nothing
here asserts.
"""

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import wire  # noqa: E402
from bench.run import start_broker  # noqa: E402
from metaq.client import Message, Producer  # noqa: E402
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.putbatch import PutBatch, sub_record  # noqa: E402
from metaq.protocol.text import serialize  # noqa: E402

TOPIC = "bench"
BATCH_BYTES = 256 * 1024


def producer_rate(url, n, size, batching):
    """msgs/s of ``n`` Producer.send_async calls, all acknowledged."""
    options = dict(batch_bytes=BATCH_BYTES, linger_ms=5) if batching else {}
    body = b"p" * size
    with Producer(brokers=[url], **options) as p:
        assert p.send(Message(TOPIC, b"w")).success  # discovery and connection
        started = time.perf_counter()
        futures = [p.send_async(Message(TOPIC, body)) for _ in range(n)]
        p.flush()
        failed = sum(1 for f in futures if not f.result(timeout=120).success)
        elapsed = time.perf_counter() - started
    assert failed == 0, failed
    return n / elapsed


def many_rate(url, n, size, per_call):
    """msgs/s of ``n`` messages sent by ``Producer.send_many`` calls of ``per_call`` payloads, all acknowledged.
    The payload list is built once (a user's messages are bytes already)."""
    payloads = [b"m" * size] * per_call
    calls = max(1, n // per_call)
    with Producer(brokers=[url]) as p:
        assert p.send(Message(TOPIC, b"w")).success
        started = time.perf_counter()
        futures = [p.send_many(TOPIC, payloads) for _ in range(calls)]
        stored = sum(f.result(timeout=120).stored for f in futures)
        elapsed = time.perf_counter() - started
    assert stored == calls * per_call, stored
    return stored / elapsed


def raw_batches(port, n, size, depth=8):
    """msgs/s of pre-encoded ``putb`` frames as large as the Producer's (at most 1,000 messages), each of one
    partition as the Producer's are (the 4 partitions in turn)."""
    per_batch = min(1000, BATCH_BYTES // (size + 40))
    data = b"r" * size
    checksum = metaq_checksum(data)
    frames = []
    for b in range(4):
        body = b"".join(sub_record(TOPIC.encode(), b, 0, data, checksum, k) for k in range(per_batch))
        frames.append(serialize(PutBatch(TOPIC, per_batch, body, b + 1)))
    sock = wire.connect(port)
    replies = wire.ResultReplies(sock)
    batches = max(1, n // per_batch)
    started = time.perf_counter()
    wire.pipeline(sock, replies, frames, batches, depth)
    elapsed = time.perf_counter() - started
    sock.close()
    return batches * per_batch / elapsed


def raw_puts(port, n, size, depth=64):
    """msgs/s of pre-encoded pipelined ``put`` frames (the burst path)."""
    data = b"q" * size
    frame = b"put %s 0 %d 0 %d 1\r\n%s" % (TOPIC.encode(), size, metaq_checksum(data), data)
    frames = [frame.replace(b" 0 %d" % size, b" %d %d" % (k, size), 1) for k in range(4)]
    sock = wire.connect(port)
    replies = wire.ResultReplies(sock)
    started = time.perf_counter()
    wire.pipeline(sock, replies, frames, n, depth)
    elapsed = time.perf_counter() - started
    sock.close()
    return n / elapsed


ROWS = (
    ("Producer.send_many, 10,000 payloads a call", lambda url, port, n, size: many_rate(url, n, size, 10_000)),
    ("Producer.send_many, 1,000 payloads a call", lambda url, port, n, size: many_rate(url, n, size, 1_000)),
    ("Producer, batches (batch_bytes 256 KiB, linger 5 ms)",
     lambda url, port, n, size: producer_rate(url, n, size, True)),
    ("Producer, no batches (pipelined puts)", lambda url, port, n, size: producer_rate(url, n // 4, size, False)),
    ("raw putb, 256 KiB (at most 1,000 msgs) a frame, 8 in flight",
     lambda url, port, n, size: raw_batches(port, n, size)),
    ("raw put, pipelined depth 64", lambda url, port, n, size: raw_puts(port, n, size)),
)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-batches-", dir=args.dir)
    results = {}
    try:
        for r in range(args.runs):
            b = start_broker(root, args.flush, "batches-%d" % r)
            url = "meta://127.0.0.1:%d" % b.port
            order = list(ROWS) if r % 2 == 0 else list(reversed(ROWS))
            for size in (100, 1024):
                for name, measure in order:
                    results.setdefault((size, name), []).append(measure(url, b.port, args.messages, size))
            if args.profile and r == 0:
                prof = cProfile.Profile()
                prof.enable()
                producer_rate(url, args.messages // 2, 100, True)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(14)
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nbatched puts, flush=%s, one topic of 4 partitions, median of %d runs (min..max)\n"
          % (args.flush, args.runs))
    print("| measurement | 100 B msgs/s | 1 KiB msgs/s |")
    print("|---|---|---|")
    for name, _measure in ROWS:
        cells = []
        for size in (100, 1024):
            xs = results[(size, name)]
            cells.append("%s (%s..%s)" % (f"{statistics.median(xs):,.0f}", f"{min(xs):,.0f}", f"{max(xs):,.0f}"))
        print("| %s | %s | %s |" % (name, cells[0], cells[1]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--messages", type=int, default=100_000, help="messages a batched row sends (unbatched: 1/4)")
    p.add_argument("--flush", choices=("sync", "async"), default="sync")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--dir", default=None)
    run(p.parse_args())


if __name__ == "__main__":
    main()
