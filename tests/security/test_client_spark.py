"""spark.read.format("metaq") against a broker with authentication and TLS on: the credentials file named in
the options (user, secret and the CA) is used by the planner and by every executor (a real local Spark)."""

import os

import pytest
import yaml

from metaq import errors
from metaq.client import Message, Producer
from metaq.client.local import BrokerProcess, small_config
from metaq.client.security import ClientSecurity
from metaq.spark.ranges import plan_ranges
from tests.harness.acl import SECRETS, write_acl
from tests.harness.broker import url_of
from tests.harness.pki import Pki
from tests.spark import conftest as spark_conftest

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

spark = spark_conftest.spark  # the session-wide SparkSession fixture of the Spark tests


def test_the_metaq_source_reads_with_credentials(spark, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("METAQ_"):
            monkeypatch.delenv(name)
    pki = Pki(tmp_path / "pki")
    security = {"acl_file": write_acl(tmp_path / "acl.yaml"), "tls": pki.tls_config("on")}
    broker = BrokerProcess(tmp_path, small_config(tmp_path / "data", security=security)).start()
    try:
        url = url_of(broker)
        with Producer(brokers=[url], security=ClientSecurity("alice", SECRETS["alice"], ca=pki.ca)) as producer:
            assert all(producer.send(Message("orders-spark", b"row %d" % i)).success for i in range(30))
        creds = tmp_path / "reader.yaml"
        creds.write_text(yaml.safe_dump({"user": "reader", "secret": SECRETS["reader"], "tls": {"ca": pki.ca}}))
        creds.chmod(0o600)
        with pytest.raises(errors.Unauthenticated):  # TLS without credentials: the plan cannot even be made
            plan_ranges({"brokers": url, "topic": "orders-spark", "ca": pki.ca})
        df = (spark.read.format("metaq").option("brokers", url).option("topic", "orders-spark")
              .option("credentials", str(creds)).option("maxOffsetsPerPartition", 5).load())
        assert df.rdd.getNumPartitions() >= 6  # several executor tasks, each connecting and authenticating
        assert sorted(bytes(r["value"]) for r in df.collect()) == sorted(b"row %d" % i for i in range(30))
        assert SECRETS["reader"] not in broker.log_text()
    finally:
        broker.kill()
