"""Spark benchmark (issue 18 point 7): the streaming source, the sink and the batch source in the same run.

    python -m bench.bench_spark [--messages 200000] [--size 1024] [--runs 3]

One broker on 127.0.0.1 (64 MiB segments, ``flush: async``) and a ``local[2]`` Spark. The topic is filled
once with ``--messages`` messages of ``--size`` bytes (4 partitions), then, ``--runs`` times each:

* **batch source**: ``spark.read.format("metaq")`` of the whole topic, counted;
* **streaming source**: ``readStream.format("metaq")`` from the earliest offset with
  ``maxOffsetsPerTrigger`` 100,000 into Spark's ``noop`` sink, ``availableNow``: messages/s over the whole
  run, and the median micro-batch's rate (Spark's ``processedRowsPerSecond``);
* **sink**: ``df.write.format("metaq")`` of as many rows of the same size (2 tasks), idempotent (the default)
  and not: rows/s, and the cost of idempotence as the ratio of the two;
* **client peer**: the same number of messages through ``metaq.client.Producer`` (pipelined, one process).

Medians of the runs, printed as a markdown table. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from metaq.client import Message, Producer  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402

TOPIC = "tbench"


def fill(url, n, size, topic=TOPIC):
    body = os.urandom(size)
    t0 = time.perf_counter()
    with Producer(brokers=[url]) as producer:
        futures = [producer.send_async(Message(topic, body)) for _ in range(n)]
        assert all(f.result(120).success for f in futures)
    return n / (time.perf_counter() - t0)


def session():
    from metaq.spark import local_session, register

    spark = local_session("metaq-bench", "local[2]", {"spark.sql.shuffle.partitions": "2"})  # loopback only
    register(spark)
    return spark


def batch_read(spark, url, n):
    t0 = time.perf_counter()
    count = spark.read.format("metaq").option("brokers", url).option("topic", TOPIC).load().count()
    assert count == n, count
    return n / (time.perf_counter() - t0)


def stream_read(spark, url, n, work):
    ck = tempfile.mkdtemp(dir=work)
    t0 = time.perf_counter()
    q = (spark.readStream.format("metaq").option("brokers", url).option("subscribe", TOPIC)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100000).load()
         .writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    assert rows == n, rows
    per_batch = [p["processedRowsPerSecond"] for p in q.recentProgress if p["numInputRows"]]
    return n / elapsed, statistics.median(per_batch)


def sink_write(spark, url, n, size, idempotent, topic):
    df = spark.range(n, numPartitions=2).selectExpr("unhex(repeat('ab', %d)) AS value" % size)
    t0 = time.perf_counter()
    (df.write.format("metaq").option("brokers", url).option("topic", topic)
     .option("idempotent", "true" if idempotent else "false").mode("append").save())
    return n / (time.perf_counter() - t0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="metaq-bench-spark-")
    cfg = small_config(os.path.join(work, "data"), store={"segment_size": 64 << 20, "flush": "async",
                                                          "index_file_units": 1 << 20})
    cfg["limits"] = {"max_body_bytes": 1 << 20}
    broker = BrokerProcess(work, cfg).start()
    url = "meta://127.0.0.1:%d" % broker.port
    try:
        fill(url, args.messages, args.size)
        spark = session()
        rows = {"batch source": [], "streaming source (whole run)": [], "streaming source (median micro-batch)": [],
                "sink, idempotent": [], "sink, not idempotent": [], "client Producer (peer)": []}
        for run in range(args.runs):
            rows["batch source"].append(batch_read(spark, url, args.messages))
            whole, batch = stream_read(spark, url, args.messages, work)
            rows["streaming source (whole run)"].append(whole)
            rows["streaming source (median micro-batch)"].append(batch)
            rows["sink, idempotent"].append(sink_write(spark, url, args.messages, args.size, True, "tsink%d" % run))
            rows["sink, not idempotent"].append(sink_write(spark, url, args.messages, args.size, False,
                                                           "tplain%d" % run))
            rows["client Producer (peer)"].append(fill(url, args.messages, args.size, "tpeer%d" % run))
        spark.stop()
    finally:
        broker.kill()
        shutil.rmtree(work, ignore_errors=True)
    print("\n%d messages of %d bytes, %d runs (medians), local[2]\n" % (args.messages, args.size, args.runs))
    print("| what | msgs/s | MB/s |")
    print("|---|---|---|")
    for name, values in rows.items():
        m = statistics.median(values)
        print("| %s | %s | %.1f |" % (name, format(int(m), ","), m * args.size / 1e6))
    idem, plain = statistics.median(rows["sink, idempotent"]), statistics.median(rows["sink, not idempotent"])
    print("\nidempotent sink / plain sink: %.2f×" % (idem / plain))


if __name__ == "__main__":
    main()
