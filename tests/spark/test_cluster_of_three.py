"""Spark reads a topic from every broker of a three-broker cluster (``metaq-cluster``'s, a real ZooKeeper), found
through ZooKeeper: every message once, each row naming its broker in ``partition`` (``<broker>-<p>``)."""

import pytest

from metaq.client import Message, Producer
from tests.harness.broker import wait_for
from tests.harness.devcluster import LocalCluster

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOPIC = "spread-spark"
N = 300


@pytest.fixture(scope="module")
def three(tmp_path_factory, zk_server):
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), 3, zk_server.chroot())
    try:
        with Producer(zk_connect=cluster.zk_connect) as producer:
            wait_for(lambda: len(producer.discovery.broker_urls()) == 3, 20, "three brokers registered")
            cluster.sent = [producer.send(Message(TOPIC, b"s%03d" % i), timeout=30) for i in range(N)]
        yield cluster
    finally:
        cluster.stop()


def test_spark_reads_a_topic_from_every_broker_through_zookeeper(spark, three):
    assert all(r.success for r in three.sent)
    df = spark.read.format("metaq").option("zk", three.zk_connect).option("topic", TOPIC).load()
    rows = df.select("partition", "offset", "value").collect()
    got = {(r["partition"], r["offset"]): bytes(r["value"]) for r in rows}
    assert len(rows) == N == len(got)
    assert got == {(str(r.partition), r.offset): b"s%03d" % i for i, r in enumerate(three.sent)}
    assert {p.split("-")[0] for p, _ in got} == {"0", "1", "2"}
