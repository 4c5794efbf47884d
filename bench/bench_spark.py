"""Spark benchmark (issue 18 point 7, issue 45 point 4): the streaming source, the sink and the batch source in the
same run, the Arrow paths against the row-by-row ones they replaced, and the client's ceilings.

    python -m bench.bench_spark [--messages 200000] [--size 1024] [--runs 3]

One broker on 127.0.0.1 (64 MiB segments, ``flush: async``) and a ``local[2]`` Spark. The topic is filled
once with ``--messages`` messages of ``--size`` bytes (4 partitions), then, ``--runs`` times each:

* **batch source**: ``spark.read.format("metaq")`` of the whole topic into Spark's ``noop`` sink (every column
  materialised), with Arrow batches (the default) and ``arrow=false`` (row by row, the old path);
* **streaming source**: ``readStream.format("metaq")`` from the earliest offset with
  ``maxOffsetsPerTrigger`` 100,000 into Spark's ``noop`` sink, ``availableNow``: messages/s over the whole
  run, and the median micro-batch's rate (Spark's ``processedRowsPerSecond``), Arrow and ``arrow=false``;
* **raw fetch ceiling**: the same ranges read in this process without Spark, Arrow batches
  (``arrowread.read_batches``) one range after the other;
* **Spark's floor** (peer): a Python data source with no broker (``format("arrowfloor")``, registered here) whose
  4 tasks yield the same number of rows as ready-made Arrow batches of 1,000 ``--size``-byte values into
  ``noop``: what Spark itself takes to move the rows from Python workers into the JVM here;
* **sink**: ``df.write.format("metaq")`` of as many rows of the same size (2 tasks), idempotent (the default)
  and not, through the Arrow writer, and the same through the old row writer (``write_rows`` fed rows by a
  ``DataSourceWriter``, registered here as ``metaqrows``);
* **client peers**: the same number of messages through ``metaq.client.Producer``: ``send_async`` (pipelined)
  and ``send_many`` (batches of 1,000), of a plain and of an idempotent producer (``putb_idem``), one process.

``--sink-only`` runs the sink rows and the client peers alone.

Medians of the runs, printed as a markdown table. Each Spark row also gets the CPU time it took (Linux
``/proc``): microseconds per message spent by the broker, the JVM (driver and executor: ``local``), the Python
workers the JVM started, and their sum, whose inverse times the cores is the rate the row could reach with
every core of the machine its own (the "ceiling"; the row's rate is printed as a fraction of it). On a shared
machine the rates follow the CPU share the run got; the CPU per message moves much less.
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


def _proc_cpu(pid):
    """``(ppid, own CPU s, reaped children's CPU s)`` of ``pid`` from ``/proc``, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


class CpuMeter:
    """CPU seconds used so far by the broker, the JVM and the JVM's descendants (the Python workers)."""

    def __init__(self, broker_pid, jvm_pid):
        self.broker_pid, self.jvm_pid = broker_pid, jvm_pid

    def sample(self):
        children = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                st = _proc_cpu(int(name))
                if st is not None:
                    children.setdefault(st[0], []).append(int(name))
        workers, todo = 0.0, list(children.get(self.jvm_pid, ()))
        while todo:
            pid = todo.pop()
            st = _proc_cpu(pid)
            if st is not None:
                workers += st[1] + st[2]
            todo.extend(children.get(pid, ()))
        broker, jvm = _proc_cpu(self.broker_pid), _proc_cpu(self.jvm_pid)
        return {"broker": broker[1] if broker else 0.0, "jvm": jvm[1] if jvm else 0.0, "workers": workers}


def metered(meter, cpu, name, n, fn, *args):
    """Run ``fn(*args)`` (msgs/s, or a tuple whose first item is), adding its CPU per message to ``cpu[name]``."""
    before = meter.sample() if meter else None
    out = fn(*args)
    if meter:
        after = meter.sample()
        cpu.setdefault(name, []).append({k: (after[k] - before[k]) / n for k in after})
    return out


def session():
    from metaq.spark import local_session, register

    spark = local_session("metaq-bench", "local[2]", {"spark.sql.shuffle.partitions": "2"})  # loopback only
    register(spark)
    return spark


def fill_many(url, n, size, topic, idempotent=False):
    """``n`` messages through ``Producer.send_many`` (1,000 a call, the topic's partitions in turn), of an
    idempotent producer (``putb_idem`` frames) or not; msgs/s."""
    body = os.urandom(size)
    with Producer(brokers=[url]) as producer:  # the first put creates the topic: then it has all its partitions
        assert producer.send(Message(topic, body)).success
    t0 = time.perf_counter()
    with Producer(brokers=[url], idempotent=idempotent) as producer:
        futures = [producer.send_many(topic, [body] * min(1000, n - 1 - k)) for k in range(0, n - 1, 1000)]
        assert all(f.result(120).success for f in futures)
    return (n - 1) / (time.perf_counter() - t0)


def register_row_sink(spark):
    """``format("metaqrows")``: the sink as it was before the Arrow writer (a row writer over ``write_rows``)."""
    from pyspark.sql.datasource import DataSourceWriter

    from metaq.spark.datasource import MetaQDataSource
    from metaq.spark.sink import MetaQDataSourceWriter, SinkCommit, _task_partition, producer_id_of, write_rows

    class RowWriter(DataSourceWriter):
        def __init__(self, options, schema):
            self.inner = MetaQDataSourceWriter(options, schema)

        def write(self, iterator):
            _ctx, part = _task_partition()
            inner = self.inner
            return SinkCommit(write_rows(iterator, inner.opts, producer_id_of("batch", inner.write_id, part)))

        def commit(self, messages):
            self.inner.commit(messages)

    class RowSink(MetaQDataSource):
        @classmethod
        def name(cls):
            return "metaqrows"

        def writer(self, schema, overwrite):
            return RowWriter(self.options, schema)

    spark.dataSource.register(RowSink)


def register_floor(spark):
    """``format("arrowfloor")``: ``rows`` rows of ``size``-byte values in 4 tasks, from ready-made Arrow batches."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Part(InputPartition):
        pass

    class Reader(DataSourceReader):
        def __init__(self, options):
            self.rows, self.size = int(options["rows"]), int(options["size"])

        def partitions(self):
            return [Part(k) for k in range(4)]

        def read(self, partition):
            import array

            import pyarrow as pa

            per = 1000
            offsets = pa.py_buffer(array.array("i", range(0, self.size * per + 1, self.size)).tobytes())
            batch = pa.RecordBatch.from_arrays([pa.Array.from_buffers(
                pa.binary(), per, [None, offsets, pa.py_buffer(os.urandom(self.size) * per)])], names=["value"])
            left = self.rows // 4 + (1 if partition.value < self.rows % 4 else 0)
            while left > 0:
                yield batch if left >= per else batch.slice(0, left)
                left -= per

    class Floor(DataSource):
        @classmethod
        def name(cls):
            return "arrowfloor"

        def schema(self):
            return "value binary"

        def reader(self, schema):
            return Reader(self.options)

    spark.dataSource.register(Floor)


def floor_read(spark, n, size):
    t0 = time.perf_counter()
    (spark.read.format("arrowfloor").option("rows", n).option("size", size).load()
     .write.format("noop").mode("overwrite").save())
    return n / (time.perf_counter() - t0)


def raw_read(url, n):
    from metaq.spark.arrowread import read_batches
    from metaq.spark.ranges import plan_ranges

    t0 = time.perf_counter()
    rows = sum(b.num_rows for r in plan_ranges({"brokers": url, "topic": TOPIC}) for b in read_batches(r))
    assert rows == n, rows
    return n / (time.perf_counter() - t0)


def batch_read(spark, url, n, arrow=True):
    t0 = time.perf_counter()
    (spark.read.format("metaq").option("brokers", url).option("topic", TOPIC).option("arrow", str(arrow).lower())
     .load().write.format("noop").mode("overwrite").save())
    return n / (time.perf_counter() - t0)


def stream_read(spark, url, n, work, arrow=True):
    ck = tempfile.mkdtemp(dir=work)
    t0 = time.perf_counter()
    q = (spark.readStream.format("metaq").option("brokers", url).option("subscribe", TOPIC)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100000)
         .option("arrow", str(arrow).lower()).load()
         .writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    elapsed = time.perf_counter() - t0
    rows = sum(p["numInputRows"] for p in q.recentProgress)
    assert rows == n, rows
    per_batch = [p["processedRowsPerSecond"] for p in q.recentProgress if p["numInputRows"]]
    return n / elapsed, statistics.median(per_batch)


def sink_write(spark, url, n, size, idempotent, topic, fmt="metaq"):
    df = spark.range(n, numPartitions=2).selectExpr("unhex(repeat('ab', %d)) AS value" % size)
    t0 = time.perf_counter()
    (df.write.format(fmt).option("brokers", url).option("topic", topic)
     .option("idempotent", "true" if idempotent else "false").mode("append").save())
    return n / (time.perf_counter() - t0)


def sinks(spark, url, args, run, add, meter=None, cpu=None):
    """The sink rows and the client peers of one run."""
    for idem in (True, False):
        what = "idempotent" if idem else "not idempotent"
        name = "sink, %s, Arrow writer" % what
        add(name, metered(meter, cpu, name, args.messages, sink_write, spark, url, args.messages, args.size, idem,
                          "ta%s%d" % (what[:3], run)))
        add("sink, %s, row writer (old)" % what,
            sink_write(spark, url, args.messages, args.size, idem, "tr%s%d" % (what[:3], run), "metaqrows"))
    add("client Producer.send_async (peer)", fill(url, args.messages, args.size, "tpeer%d" % run))
    add("client Producer.send_many (peer)", fill_many(url, args.messages, args.size, "tmany%d" % run))
    add("client Producer.send_many, idempotent (peer)",
        fill_many(url, args.messages, args.size, "tidem%d" % run, idempotent=True))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sink-only", action="store_true", help="only the sinks and the client peers")
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
        register_row_sink(spark)
        register_floor(spark)
        batch_read(spark, url, args.messages)  # warm-up: the first query also starts the JVM's JIT and workers
        rows, cpu = {}, {}
        meter = None
        if os.path.isdir("/proc/self"):
            meter = CpuMeter(broker.proc.pid, spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

        def add(name, value):
            rows.setdefault(name, []).append(value)

        n = args.messages
        for run in range(args.runs):
            if args.sink_only:
                sinks(spark, url, args, run, add, meter, cpu)
                continue
            add("batch source, Arrow", metered(meter, cpu, "batch source, Arrow", n, batch_read, spark, url, n))
            add("batch source, arrow=false (old)", batch_read(spark, url, n, False))
            add("raw fetch ceiling (read_batches, one process)", raw_read(url, n))
            add("Spark's floor, no broker (peer)",
                metered(meter, cpu, "Spark's floor, no broker (peer)", n, floor_read, spark, n, args.size))
            for arrow, label in ((True, "Arrow"), (False, "arrow=false (old)")):
                if arrow:
                    whole, batch = metered(meter, cpu, "streaming source (whole run), Arrow", n, stream_read, spark,
                                           url, n, work, arrow)
                else:
                    whole, batch = stream_read(spark, url, n, work, arrow)
                add("streaming source (whole run), %s" % label, whole)
                add("streaming source (median micro-batch), %s" % label, batch)
            sinks(spark, url, args, run, add, meter, cpu)
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
    med = {name: statistics.median(values) for name, values in rows.items()}
    if cpu:
        cores = os.cpu_count() or 1
        print("\nCPU per message (medians, microseconds); ceiling: %d cores / the total\n" % cores)
        print("| what | broker | JVM | Python workers | total | ceiling msgs/s | measured / ceiling |")
        print("|---|---|---|---|---|---|---|")
        for name, samples in cpu.items():
            part = {k: statistics.median(x[k] for x in samples) * 1e6 for k in samples[0]}
            total = sum(part.values())
            ceiling = cores * 1e6 / total if total > 0 else float("inf")
            print("| %s | %.2f | %.2f | %.2f | %.2f | %s | %.2f |" % (
                name, part["broker"], part["jvm"], part["workers"], total, format(int(ceiling), ","),
                med[name] / ceiling))
    print("\nidempotent sink / plain sink: %.2f; idempotent send_many / send_many: %.2f"
          % (med["sink, idempotent, Arrow writer"] / med["sink, not idempotent, Arrow writer"],
             med["client Producer.send_many, idempotent (peer)"] / med["client Producer.send_many (peer)"]))
    if args.sink_only:
        return
    print("\nArrow / old: batch source %.1f×, streaming micro-batch %.1f×, idempotent sink %.1f×, plain sink %.1f×"
          % (med["batch source, Arrow"] / med["batch source, arrow=false (old)"],
             med["streaming source (median micro-batch), Arrow"]
             / med["streaming source (median micro-batch), arrow=false (old)"],
             med["sink, idempotent, Arrow writer"] / med["sink, idempotent, row writer (old)"],
             med["sink, not idempotent, Arrow writer"] / med["sink, not idempotent, row writer (old)"]))
    floor = med["Spark's floor, no broker (peer)"]
    many = med["client Producer.send_many (peer)"]
    print("batch source / Spark's floor: %.2f; streaming micro-batch / Spark's floor: %.2f; plain sink / "
          "send_many peer: %.2f" % (med["batch source, Arrow"] / floor,
                                    med["streaming source (median micro-batch), Arrow"] / floor,
                                    med["sink, not idempotent, Arrow writer"] / many))

if __name__ == "__main__":
    main()
