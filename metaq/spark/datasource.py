"""``spark.read.format("metaq")``: message ranges as DataFrames (PySpark's Python data source API, Spark >= 4.0).

    from metaq.spark import register
    register(spark)                                    # once per SparkSession
    df = (spark.read.format("metaq")
          .option("brokers", "meta://127.0.0.1:8123")  # or .option("zk", "127.0.0.1:2181")
          .option("topic", "orders")
          .option("startingOffsets", '{"orders": {"0-0": 100}}')   # default earliest
          # or .option("startingTimestamp", 1767225600000): from the first message stored at/after it (ms)
          .option("endingOffsets", "latest")                      # default latest
          .option("maxOffsetsPerPartition", 10000)                # optional: smaller Spark partitions
          .option("credentials", "/etc/metaq/spark.yaml")         # brokers with authentication / TLS
          .option("maxRecordsPerBatch", 10000)                    # optional: rows per Arrow batch
          .load())

Every task reads its range into Arrow record batches built straight from the brokers' replies
(:mod:`metaq.spark.arrowread`: no Python object per message), at most ``maxRecordsPerBatch`` rows each
(default 10,000; 1 .. ``limits.MAX_ARROW_BATCH_ROWS``). ``arrow=false`` reads row by row instead (the
same rows, slower).

Credentials: ``credentials`` (a credentials file, ``metaq.client.security``), or ``user`` with
``secretFile``; TLS: ``tls``, ``ca``, ``cert``, ``key``, ``serverHostname``. Only paths travel in the
options (never a secret): every executor reads the files at the same paths. Without them the
``METAQ_*`` environment of each process is used.

Columns (``metaq.spark.rows``): ``topic string, partition string ("<brokerId>-<p>"), offset long,
msg_id long, attribute string, value binary, timestamp timestamp`` (when the broker stored the
message, from the message id), ``key string`` (the RocketMQ ``KEYS`` property) and
``properties map<string,string>``. The streaming source (``spark.readStream.format("metaq")``) is
:mod:`metaq.spark.stream`; the sink
(``df.write`` / ``df.writeStream`` ``.format("metaq")``) is :mod:`metaq.spark.sink`.

The ranges are resolved once when the query is planned (``latest`` is
the log end at that moment), then every range is one Spark input partition, read in
parallel by the executors: exactly the requested offsets, each once.

:func:`read_ranges_rdd` is the same read over an RDD of offset ranges, for Spark 3.5 (no
Python data sources) or Python workers without pyarrow.
"""

from metaq.spark.ranges import SCHEMA_DDL, arrow_options, plan_ranges, read_options, read_range, security_options

try:  # Spark >= 4.0
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # Spark 3.5: only the RDD fallback
    DataSource = DataSourceReader = InputPartition = None

__all__ = ["register", "read_ranges_rdd", "MetaQDataSource"]


def _fetch_options(opts):
    return {"fetch_bytes": int(opts.get("fetchbytes", 1 << 20)), "timeout": float(opts.get("timeoutseconds", 30)),
            "security": security_options(opts)}


if DataSource is not None:

    class RangePartition(InputPartition):
        """One offset range: the unit a Spark task reads (pickled to the executor)."""

        def __init__(self, offset_range):
            super().__init__(offset_range)
            self.range = offset_range

    class MetaQReader(DataSourceReader):
        def __init__(self, options):
            self.options = read_options(options)
            self.arrow, self.batch_rows = arrow_options(self.options)

        def partitions(self):
            return [RangePartition(r) for r in plan_ranges(self.options)]

        def read(self, partition):
            if self.arrow:
                from metaq.spark.arrowread import read_batches

                return read_batches(partition.range, max_rows=self.batch_rows, **_fetch_options(self.options))
            return read_range(partition.range, **_fetch_options(self.options))

    class MetaQDataSource(DataSource):
        """The ``metaq`` format; see the module docstring for the options."""

        @classmethod
        def name(cls):
            return "metaq"

        def schema(self):
            return SCHEMA_DDL

        def reader(self, schema):
            return MetaQReader(self.options)

        def streamReader(self, schema):
            from metaq.spark.stream import MetaQStreamReader

            return MetaQStreamReader(self.options)

        def writer(self, schema, overwrite):
            from metaq.spark.sink import MetaQDataSourceWriter

            return MetaQDataSourceWriter(self.options, schema)

        def streamWriter(self, schema, overwrite):
            from metaq.spark.sink import MetaQStreamWriter

            return MetaQStreamWriter(self.options, schema)

else:  # pragma: no cover - Spark 3.5
    MetaQDataSource = None


def register(spark):
    """Make ``spark.read.format("metaq")`` available in ``spark`` (Spark >= 4.0)."""
    if MetaQDataSource is None:
        raise RuntimeError("Python data sources need Spark >= 4.0; use metaq.spark.read_ranges_rdd on Spark 3.5")
    spark.dataSource.register(MetaQDataSource)
    return spark


def read_ranges_rdd(spark, ranges=None, **options):
    """The same DataFrame as ``format("metaq")``, built from an RDD of offset ranges (one RDD partition each).

    Give the ranges (``[OffsetRange]``) or the source's options as keyword arguments
    (``brokers=..., topic=..., startingOffsets=...``). Works on Spark 3.5 and needs no pyarrow.
    """
    opts = read_options(options)
    if ranges is None:
        ranges = plan_ranges(opts)
    ranges = list(ranges)
    fetch = _fetch_options(opts)
    sc = spark.sparkContext
    if not ranges:
        return spark.createDataFrame(sc.emptyRDD(), SCHEMA_DDL)
    rdd = sc.parallelize(ranges, len(ranges)).flatMap(lambda r: read_range(r, **fetch))
    return spark.createDataFrame(rdd, SCHEMA_DDL)
