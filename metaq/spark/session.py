"""A local SparkSession that listens on loopback only: what metaq's examples, tests, benchmarks and
``metaq-spark-report`` start.

Spark's defaults bind the driver's RPC and block-manager ports to this machine's address and its web UI to
every interface (port 4040 and up): a local run would be reachable from the network. ``local_session`` sets
``SPARK_LOCAL_IP`` (unless already set) and ``LOOPBACK_SETTINGS`` (the driver's host and bind address
127.0.0.1, the UI off) before the session starts; pyspark is imported only when it is called.

    from metaq.spark import local_session, register
    spark = local_session("orders")          # local[2], on 127.0.0.1
    register(spark)
"""

import os
import sys

__all__ = ["LOOPBACK", "LOOPBACK_SETTINGS", "local_session"]

LOOPBACK = "127.0.0.1"

#: What every session ``local_session`` starts is given: the driver on loopback, no web UI, no console bar.
LOOPBACK_SETTINGS = {
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def local_session(app_name, master="local[2]", config=None, log_level="ERROR"):
    """A new (or the running) SparkSession named ``app_name`` on ``master``, listening on 127.0.0.1 only.

    ``config``: more Spark settings (``{"spark.sql.shuffle.partitions": "2"}``); it may not change one of
    ``LOOPBACK_SETTINGS`` (ValueError). ``PYSPARK_PYTHON`` defaults to this Python (the workers need metaq) and
    ``SPARK_LOCAL_IP`` to 127.0.0.1. A session already running is returned as it is (Spark's ``getOrCreate``):
    its settings were fixed when it started."""
    config = dict(config or {})
    clash = sorted(k for k in config if k in LOOPBACK_SETTINGS and str(config[k]) != LOOPBACK_SETTINGS[k])
    if clash:
        raise ValueError("local_session keeps Spark on loopback with its web UI off: %s may not be changed"
                         % ", ".join(clash))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in dict(config, **LOOPBACK_SETTINGS).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if log_level is not None:
        spark.sparkContext.setLogLevel(log_level)
    return spark
