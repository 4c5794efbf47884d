"""A Spark driver running one streaming query from metaq, as its own process (so a test can SIGKILL it).

    python -m tests.spark.stream_driver --brokers meta://127.0.0.1:8123 --subscribe tin \\
        --checkpoint /tmp/ck (--parquet /tmp/out | --to-topic tout) [--max-per-trigger 500] [--row-delay-ms 2]

Reads ``--subscribe`` from the earliest offset, and writes either every row to a Parquet file sink
or ``"<partition>:<offset>:<value>"`` to the metaq topic ``--to-topic`` (the streaming sink). Each
finished micro-batch prints ``BATCH <id> <rows>``. When the file ``--stop-file`` appears it stops the
query cleanly and exits 0; otherwise it runs until it is killed. ``--row-delay-ms`` slows
every row (a Python UDF that sleeps) so that a batch lasts long enough to be killed in the middle.
"""

import argparse
import os
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--subscribe", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--parquet")
    ap.add_argument("--to-topic")
    ap.add_argument("--max-per-trigger", type=int, default=0)
    ap.add_argument("--row-delay-ms", type=float, default=0.0)
    ap.add_argument("--stop-file")
    ap.add_argument("--option", action="append", default=[], help="extra source option name=value")
    args = ap.parse_args(argv)

    from pyspark.sql import functions as F

    from metaq.spark import local_session, register

    spark = local_session("metaq-stream-driver", "local[2]", {  # loopback only, UI off
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"})
    register(spark)
    reader = (spark.readStream.format("metaq").option("brokers", args.brokers).option("subscribe", args.subscribe)
              .option("startingOffsets", "earliest"))
    if args.max_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_per_trigger)
    for item in args.option:
        name, _, value = item.partition("=")
        reader = reader.option(name, value)
    df = reader.load()
    if args.row_delay_ms:
        delay = args.row_delay_ms / 1000.0

        @F.udf("binary")
        def slow(value):
            time.sleep(delay)
            return value

        df = df.withColumn("value", slow("value"))
    if args.parquet:
        writer = df.writeStream.format("parquet").option("path", args.parquet)
    else:
        out = df.select(F.concat(F.col("partition"), F.lit(":"), F.col("offset").cast("string"), F.lit(":"),
                                 F.col("value").cast("string")).alias("value"))
        writer = out.writeStream.format("metaq").option("brokers", args.brokers).option("topic", args.to_topic)
    query = writer.option("checkpointLocation", args.checkpoint).trigger(processingTime="200 milliseconds").start()
    print("STARTED %s" % query.id, flush=True)
    seen = -1
    while query.isActive:
        time.sleep(0.1)
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != seen:
            seen = progress["batchId"]
            print("BATCH %d %d" % (seen, progress["numInputRows"]), flush=True)
        if args.stop_file and os.path.exists(args.stop_file):
            query.stop()
    if query.exception() is not None:
        print("QUERY FAILED: %s" % query.exception(), flush=True)
        return 1
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
