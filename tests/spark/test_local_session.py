"""metaq.spark.local_session: every session metaq's examples, tests, benchmarks and metaq-spark-report start
listens on 127.0.0.1 only, its web UI off. The shared test session is one; its JVM's sockets are read from /proc."""

import os

import pytest

from metaq.spark.session import LOOPBACK_SETTINGS, local_session
from tests.harness.listeners import is_loopback, listening


def test_the_session_has_the_loopback_settings(spark):
    for key, value in LOOPBACK_SETTINGS.items():
        assert spark.sparkContext.getConf().get(key) == value, key
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert spark.sparkContext.uiWebUrl is None  # no web UI


def test_the_sessions_jvm_listens_on_loopback_only(spark):
    assert spark.range(100).count() == 100  # the driver has served a job: its ports are open
    ports = listening(os.getpid())  # PySpark's JVM is a child of this process
    assert ports and all(is_loopback(address) for address, _port in ports), ports


def test_a_setting_that_would_leave_loopback_is_refused():
    with pytest.raises(ValueError, match="spark.driver.bindAddress, spark.ui.enabled"):
        local_session("x", config={"spark.ui.enabled": "true", "spark.driver.bindAddress": "0.0.0.0"})


def test_metaq_spark_report_listens_on_loopback_only(broker, tmp_path):
    """The report's own session (a new process, no session running) is a local_session too."""
    import sys

    from tests.harness.broker import url_of
    from tests.harness.listeners import run_watching

    with broker.client() as c:
        c.put_ok("orders", b"x")
    code, stdout, stderr, seen = run_watching(
        [sys.executable, "-m", "metaq.spark", "--brokers", url_of(broker), "--out", str(tmp_path / "out"), "-q",
         "--master", "local[2]"], 300, env=dict(os.environ, SPARK_LOCAL_IP=""))  # the Spark settings alone hold it
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    assert (tmp_path / "out" / "report.html").exists()
    assert seen and all(is_loopback(address) for address, _port in seen), seen
