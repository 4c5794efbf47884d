"""spark.read.format("metaq") over bodies a RocketMQ producer sent compressed: rows hold the original bytes
(README "Compressed bodies"), with a real local Spark and the official client."""

import pytest

from bench.rocketmq_peer import run_peer, sized_body
from metaq.client.local import BrokerProcess, ns_of, rmq_config
from tests.harness.broker import url_of
from tests.harness.rocketmq import require_official_client

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


def test_rows_hold_the_bodies_the_rocketmq_producer_was_given(spark, tmp_path):
    require_official_client()
    cfg = rmq_config(tmp_path / "data", limits={"max_body_bytes": 2 << 20}, store={"segment_size": 8 << 20})
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        expected = []
        for size, prefix, count in ((8 << 10, "s8", 3), (1 << 20, "s1", 2)):
            sent = [s for s in run_peer(tmp_path / prefix, "produce", "--ns", ns_of(b), "--topic", "tSpz",
                                        "--count", count, "--size", size, "--prefix", prefix) if "msg_id" in s]
            assert len(sent) == count
            expected += [sized_body(prefix, i, size).encode() for i in range(count)]
        rows = (spark.read.format("metaq").option("brokers", url_of(b)).option("topic", "tSpz").load()
                .select("value", "key").collect())
        assert sorted(bytes(r["value"]) for r in rows) == sorted(expected)
        assert all(r["key"].startswith(("s8-key-", "s1-key-")) for r in rows)
    finally:
        b.kill()
