"""A streaming pipeline on metaq: orders -> revenue per minute -> a Parquet table and a summary topic.

    python examples/orders_pipeline.py --brokers meta://127.0.0.1:8123 --demo 5000

The topic ``orders`` holds JSON orders, ``{"order_id": "o-17", "amount": 12.5, "ts": 1767225600.25}``
(``ts``: when the order was placed, seconds since the epoch). Two streaming queries read it with
``spark.readStream.format("metaq")``:

* revenue per minute of order time, with a 1-minute watermark for late orders, appended to the
  Parquet table ``<work>/revenue`` once a minute is closed;
* the same closed minutes as JSON messages to the topic ``revenue`` with the streaming sink
  (``writeStream.format("metaq")``), keyed by the minute, each stored exactly once even when the
  pipeline is killed and restarted from its checkpoints (``<work>/checkpoints``).

``--demo N`` first puts N orders spread over ten minutes of order time (starting at
2026-01-01 00:00 UTC, amounts from a fixed seed). The pipeline processes what the topic holds
(Spark's ``availableNow`` trigger), prints the table and stops, within ``--timeout`` seconds (600;
past them it stops its queries and exits 1); run it again and it goes on from its checkpoints
(``--forever`` keeps it running until Ctrl-C). The last minute stays open until an order more than
a minute later arrives: that is what the watermark means. ``<work>`` is ``metaq-orders-pipeline`` in
the temporary directory unless ``--work`` names another. Spark listens on 127.0.0.1 only, its web UI
off (``metaq.spark.local_session``).
"""

import argparse
import json
import os
import random
import tempfile
import time

ORDERS, REVENUE = "orders", "revenue"
DEMO_START = 1767225600  # 2026-01-01 00:00:00 UTC


def demo_orders(n, seed=7):
    """N orders over ten minutes of order time, in time order: ``[(order_id, amount, ts)]``."""
    rnd = random.Random(seed)
    return [("o-%d" % i, round(rnd.uniform(1, 100), 2), DEMO_START + i * 600.0 / n) for i in range(n)]


def put_demo(brokers, n):
    from metaq.client import Message, Producer

    with Producer(brokers=brokers.split(",")) as producer:
        futures = [producer.send_async(Message(ORDERS, json.dumps({"order_id": o, "amount": a, "ts": t}).encode()))
                   for o, a, t in demo_orders(n)]
        failed = [r for r in (f.result(60) for f in futures) if not r.success]
    if failed:
        raise SystemExit("%d demo orders were not sent: %s" % (len(failed), failed[0].error))
    print("put %d demo orders into %s" % (n, ORDERS))


def build(spark, brokers, work):
    """Start the two queries; return them."""
    from pyspark.sql import functions as F

    orders = (spark.readStream.format("metaq").option("brokers", brokers).option("subscribe", ORDERS)
              .option("startingOffsets", "earliest").load()
              .select(F.from_json(F.col("value").cast("string"), "order_id string, amount double, ts double")
                      .alias("o"))
              .select("o.*").withColumn("ordered_at", F.col("ts").cast("timestamp")))
    per_minute = (orders.withWatermark("ordered_at", "1 minute")
                  .groupBy(F.window("ordered_at", "1 minute").alias("w"))
                  .agg(F.round(F.sum("amount"), 2).alias("revenue"), F.count("*").alias("orders"))
                  .select(F.col("w.start").alias("minute"), "revenue", "orders"))
    checkpoints = os.path.join(work, "checkpoints")
    table = (per_minute.writeStream.format("parquet").option("path", os.path.join(work, "revenue"))
             .option("checkpointLocation", os.path.join(checkpoints, "table")).outputMode("append"))
    summary = (per_minute.select(F.date_format("minute", "yyyy-MM-dd'T'HH:mm'Z'").alias("key"),
                                 F.to_json(F.struct("minute", "revenue", "orders")).alias("value"))
               .writeStream.format("metaq").option("brokers", brokers).option("topic", REVENUE)
               .option("checkpointLocation", os.path.join(checkpoints, "topic")).outputMode("append"))
    return table, summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brokers", default="meta://127.0.0.1:8123")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "metaq-orders-pipeline"),
                    help="where the table and the checkpoints go (default: under the temporary directory)")
    ap.add_argument("--demo", type=int, default=0, metavar="N", help="first put N demo orders")
    ap.add_argument("--forever", action="store_true", help="keep running (Ctrl-C stops)")
    ap.add_argument("--timeout", type=float, default=600.0, metavar="S",
                    help="without --forever: the most seconds the queries may take (then they are stopped)")
    args = ap.parse_args(argv)
    if args.demo:
        put_demo(args.brokers, args.demo)

    from metaq.spark import local_session, register

    # On 127.0.0.1 only, no web UI; the workers run this Python (with metaq): PYSPARK_PYTHON.
    spark = local_session("orders-pipeline", "local[2]", {"spark.sql.shuffle.partitions": "2",
                                                           "spark.sql.session.timeZone": "UTC"})
    register(spark)
    table, summary = build(spark, args.brokers, args.work)
    trigger = {"processingTime": "5 seconds"} if args.forever else {"availableNow": True}
    queries = [table.trigger(**trigger).start(), summary.trigger(**trigger).start()]
    deadline = None if args.forever else time.monotonic() + args.timeout
    try:
        for q in queries:
            if deadline is None:
                q.awaitTermination()
            elif not q.awaitTermination(max(0.001, deadline - time.monotonic())):
                for other in queries:
                    other.stop()
                spark.stop()
                raise SystemExit("the queries did not finish within %.0f s (--timeout): stopped" % args.timeout)
    except KeyboardInterrupt:
        for q in queries:
            q.stop()
    for q in queries:
        if q.exception() is not None:
            raise SystemExit("query failed: %s" % q.exception())
    path = os.path.join(args.work, "revenue")
    if os.path.isdir(path):
        spark.read.parquet(path).orderBy("minute").show(truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
