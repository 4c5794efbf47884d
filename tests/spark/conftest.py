"""Fixtures of the Spark tests: ONE SparkSession for the whole run (starting one costs 5-10 s)."""

import os
import shutil
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession (UI off, 2 shuffle partitions, loopback only) with format("metaq") registered."""
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")  # the Python data source's workers need it
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must run this venv's Python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver binds to loopback only
    from pyspark.sql import SparkSession

    from metaq.spark import register

    session = (SparkSession.builder.master("local[2]").appName("metaq-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
