"""metaq and Spark: consumer-lag reports and message ranges as DataFrames (DESIGN §2, §9).

    from metaq.spark import register
    register(spark)
    df = spark.read.format("metaq").option("brokers", "meta://127.0.0.1:8123").option("topic", "orders").load()

    $ metaq-spark-report --zk 127.0.0.1:2181 --out report/

Importing this package is cheap: pyspark, pyarrow and matplotlib are imported only by the
functions that need them (install them with the ``spark`` extra: ``pip install 'metaq[spark]'``).

* :mod:`metaq.spark.session` — ``local_session``: a local SparkSession on loopback only, its web UI off;
* :mod:`metaq.spark.ranges` — offset ranges and the plain-Python range reader (no Spark);
* :mod:`metaq.spark.datasource` — ``format("metaq")`` and the RDD-of-ranges fallback;
* :mod:`metaq.spark.collector` — offsets snapshots to a Parquet history;
* :mod:`metaq.spark.burrow` — Burrow's lag rules in Python;
* :mod:`metaq.spark.lagjob`, :mod:`metaq.spark.render`, :mod:`metaq.spark.report` — the report.
"""

try:
    from metaq import lazy_exports
except ImportError:  # 'metaq' is not this package (a clone's folder): metaq.client's import says so
    import metaq.client  # noqa: F401

    raise

_EXPORTS = {
    "local_session": "metaq.spark.session",
    "register": "metaq.spark.datasource",
    "read_ranges_rdd": "metaq.spark.datasource",
    "OffsetRange": "metaq.spark.ranges",
    "plan_ranges": "metaq.spark.ranges",
    "read_range": "metaq.spark.ranges",
    "msg_timestamp_ms": "metaq.spark.ranges",
    "collect_snapshot": "metaq.spark.collector",
    "write_snapshot": "metaq.spark.collector",
    "partition_status": "metaq.spark.burrow",
    "run_lag_job": "metaq.spark.lagjob",
    "run_report": "metaq.spark.report",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
