"""Bulk-decoded reads (issue 45): ``Consumer.fetch`` (a Message per message) beside ``fetch_batch``/``iter_batches``.

    python -m bench.bench_consume [--runs 5] [--messages 200000] [--flush sync|async]

Against a real broker process on 127.0.0.1 (started here, data in a temporary directory): one partition filled
with ``--messages`` messages of 100 B and of 1 KiB (by ``Producer.send_many``), then read from offset 0 to its
end in gets of 1 MiB by each row, the rows of a run one after the other in an order that alternates between
runs, medians of ``--runs`` runs (min..max), and the client's CPU per message (process time):

* ``Consumer.fetch`` with a handler called with each ``Message`` (the per-message path);
* ``Consumer.iter_batches`` with a handler iterating each batch's ``(offset, id, payload view)``;
* ``Consumer.iter_batches`` with a batch handler that takes the batch whole (its ids and payload bounds).

The peers' clients (redis-py ``XRANGE``, nats-py's pull consumer) are measured beside ``iter_batches`` in
``bench/bench_pyclients.py``. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.run import start_broker  # noqa: E402
from metaq.client import Consumer, Message, Producer  # noqa: E402

TOPIC = "consume"
MAX_SIZE = 1 << 20


def fill(url, n, size):
    """``n`` messages of ``size`` bytes in one partition of ``TOPIC + size``; that partition."""
    topic = "%s%d" % (TOPIC, size)
    with Producer(brokers=[url]) as p:
        assert p.send(Message(topic, b"w")).success
        part = p.partitions(topic)[0]
        futures = [p.send_many(topic, [b"c" * size] * 10_000, partition=0) for _ in range(n // 10_000)]
        assert all(f.result(120).success for f in futures)
    return topic, part


def per_message(consumer, topic, part):
    got, nbytes, offset = 0, 0, 0
    while True:
        messages = consumer.fetch(topic, part, offset, max_size=MAX_SIZE)
        if not messages:
            return got, nbytes
        for m in messages:
            nbytes += len(m.body)
        got += len(messages)
        offset = messages[-1].offset + 1


def batch_iterated(consumer, topic, part):
    got = nbytes = 0
    for batch in consumer.iter_batches(topic, part, 0, max_size=MAX_SIZE):
        for _offset, _id, payload in batch:
            nbytes += len(payload)
        got += len(batch)
    return got, nbytes


def batch_whole(consumer, topic, part):
    got = nbytes = 0
    for batch in consumer.iter_batches(topic, part, 0, max_size=MAX_SIZE):
        ids = batch.ids()
        got += len(ids)
        nbytes += len(batch.data)
    return got, nbytes


ROWS = (
    ("Consumer.fetch, a handler per Message", per_message),
    ("Consumer.iter_batches, handler iterates (offset, id, payload view)", batch_iterated),
    ("Consumer.iter_batches, batch handler (ids, payload bounds)", batch_whole),
)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-consume-", dir=args.dir)
    results = {}
    try:
        for r in range(args.runs):
            b = start_broker(root, args.flush, "consume-%d" % r)
            url = "meta://127.0.0.1:%d" % b.port
            consumer = Consumer("bench-consume", brokers=[url])
            try:
                for size in (100, 1024):
                    topic, part = fill(url, args.messages, size)
                    order = list(ROWS) if r % 2 == 0 else list(reversed(ROWS))
                    for name, read in order:
                        c0, t0 = time.process_time(), time.perf_counter()
                        got, _nbytes = read(consumer, topic, part)
                        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                        assert got >= args.messages, got  # and the first message, if it went here
                        results.setdefault((size, name), []).append((got / elapsed, cpu / got * 1e6))
            finally:
                consumer.close()
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nreads of one partition from offset 0 to its end, gets of 1 MiB, flush=%s, median of %d runs (min..max); "
          "client CPU per message\n" % (args.flush, args.runs))
    print("| measurement | 100 B msgs/s | 100 B µs/msg | 1 KiB msgs/s | 1 KiB µs/msg |")
    print("|---|---|---|---|---|")
    for name, _read in ROWS:
        cells = []
        for size in (100, 1024):
            rates = [x[0] for x in results[(size, name)]]
            cells.append("%s (%s..%s)" % (f"{statistics.median(rates):,.0f}", f"{min(rates):,.0f}",
                                          f"{max(rates):,.0f}"))
            cells.append("%.2f" % statistics.median(x[1] for x in results[(size, name)]))
        print("| %s | %s |" % (name, " | ".join(cells)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--messages", type=int, default=200_000, help="messages in the partition read (a multiple of "
                   "10,000)")
    p.add_argument("--flush", choices=("sync", "async"), default="async")
    p.add_argument("--dir", default=None)
    run(p.parse_args())


if __name__ == "__main__":
    main()
