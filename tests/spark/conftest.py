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
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)  # workers must run this venv's Python too
    from metaq.spark import local_session, register

    session = local_session("metaq-tests", "local[2]", {  # loopback only, UI off (metaq/spark/session.py)
        "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"})
    register(session)
    yield session
    session.stop()
