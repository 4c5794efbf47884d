"""spark.readStream.format("metaq") with real brokers and a real local Spark, on the shared SparkSession. The queries
that must survive their driver being killed run in a driver process of their own: test_stream_parquet_killed.py and
test_stream_sink_killed.py."""

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from metaq.client.local import small_config
from tests.harness.broker import url_of, wait_for
from tests.harness.spark_stream import ROOT, ends_of, put_many

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


def test_new_partitions_and_a_new_broker_are_picked_up_mid_stream(broker_factory, tmp_path, zk_connect, spark):
    def zk_broker(broker_id):
        cfg = small_config(tmp_path / ("data%d" % broker_id), zk={"connect": zk_connect, "session_timeout_ms": 4000})
        cfg["broker"]["id"] = broker_id
        return broker_factory(cfg)

    b7 = zk_broker(7)
    topic, sent = "tgrow", {}
    with b7.client() as c:
        for i in range(50):
            sent[("7-0", c.put_ok(topic, b"a%d" % i, 0)[2])] = b"a%d" % i
    wait_for(lambda: _registered(zk_connect, topic, 7), 20, "broker 7's topic in ZooKeeper")
    stream = (spark.readStream.format("metaq").option("zk", zk_connect).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("group", "streamers").load())
    query = (stream.writeStream.format("memory").queryName("grow").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="100 milliseconds").start())
    try:
        query.processAllAvailable()
        assert _rows(spark, "grow") == sent
        with b7.client() as c:  # a partition of the topic that held nothing so far
            for i in range(30):
                sent[("7-3", c.put_ok(topic, b"b%d" % i, 3)[2])] = b"b%d" % i
        b8 = zk_broker(8)  # and a second broker
        with b8.client() as c:
            for i in range(40):
                sent[("8-%d" % (i % 2), c.put_ok(topic, b"c%d" % i, i % 2)[2])] = b"c%d" % i
        wait_for(lambda: _registered(zk_connect, topic, 8), 20, "broker 8's topic in ZooKeeper")

        def all_in():
            query.processAllAvailable()
            return len(_rows(spark, "grow", check_unique=True)) >= len(sent)
        wait_for(all_in, 60, "the new partition and broker in the stream")
        assert _rows(spark, "grow", check_unique=True) == sent
        ends = ends_of(sent, topic)[topic]

        def group_lag():  # what metaq-admin shows for the stream's group
            out = subprocess.run([sys.executable, "-m", "metaq.admincli", "--zk", zk_connect, "--json", "groups",
                                  "streamers"], capture_output=True, text=True, timeout=60, cwd=ROOT)
            return {r["partition"]: (r["committed"], r["lag"]) for r in json.loads(out.stdout)}
        want = {k: (e, 0) for k, e in ends.items()}
        wait_for(lambda: group_lag() == want, 30, lambda: "group offsets %s, not %s" % (group_lag(), want))
    finally:
        query.stop()


def _registered(zk_connect, topic, broker_id):
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=zk_connect, timeout=10)
    zk.start(timeout=15)
    try:
        return zk.exists("/meta/brokers/topics-pub/%s/%d-m" % (topic, broker_id)) is not None
    finally:
        zk.stop()
        zk.close()


def _rows(spark, table, check_unique=True):
    rows = spark.sql("SELECT partition, offset, value FROM %s" % table).collect()
    keys = [(r["partition"], r["offset"]) for r in rows]
    if check_unique:
        assert len(keys) == len(set(keys)), "a row read twice"
    return {(r["partition"], r["offset"]): bytes(r["value"]) for r in rows}


@pytest.mark.fault
def test_retention_behind_a_stopped_stream_fails_it_or_is_skipped(broker_factory, tmp_path, spark):
    """Also: a query stopped cleanly goes on from its checkpoint, each offset once."""
    cfg = small_config(tmp_path / "data", store={"retention_hours": 24, "retention_check_interval_s": 0.2})
    b = broker_factory(cfg)
    topic, ck = "tret", str(tmp_path / "ck")
    with b.client() as c:
        for i in range(100):
            c.put_ok(topic, b"%05d" % i + b"r" * 1200, 0)

    out = str(tmp_path / "table")

    def run(fail_on_data_loss):
        stream = (spark.readStream.format("metaq").option("brokers", url_of(b)).option("subscribe", topic)
                  .option("startingOffsets", "earliest").option("failOnDataLoss", fail_on_data_loss).load())
        return (stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
                .trigger(processingTime="100 milliseconds").start())

    def offsets_in_table():
        rows = spark.read.parquet(out).select("offset").collect()
        return sorted(r["offset"] for r in rows)

    query = run("true")
    query.processAllAvailable()
    query.stop()
    assert offsets_in_table() == list(range(100))
    with b.client() as c:  # the stream is stopped; 2,000 more (three 1 MiB segments) ...
        for i in range(100, 2100):
            c.put_ok(topic, b"%05d" % i + b"r" * 1200, 0)
    assert b.stop() == 0
    segments = sorted(glob.glob(os.path.join(b.data_dir, "commitlog", "*")))
    old = time.time() - 48 * 3600
    for seg in segments[:-1]:  # ... and retention deletes all but the last segment, unread offsets included
        os.utime(seg, (old, old))
    b.start()
    with b.client() as c:
        wait_for(lambda: int(c.call(_offset_request(topic)).body) > 100, 15, "retention to run")
        low = int(c.call(_offset_request(topic)).body)

    query = run("true")  # restarted from its checkpoint: the next offset to read, 100, is gone
    with pytest.raises(Exception) as failed:
        query.processAllAvailable()
    assert "offsets 100..%d were deleted by retention" % (low - 1) in str(failed.value)
    assert "failOnDataLoss=false" in str(failed.value)
    assert offsets_in_table() == list(range(100))  # nothing written by the failed query

    query = run("false")  # the same checkpoint, told to skip what is gone
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert offsets_in_table() == list(range(100)) + list(range(low, 2100))
    rows = spark.read.parquet(out).where("offset = %d" % low).collect()
    assert bytes(rows[0]["value"])[:5] == b"%05d" % low


def _offset_request(topic):
    from metaq.protocol import events as ev

    return ev.Offset(topic, "g", 0, 0, 1)


def test_starting_timestamp_starts_at_the_second_of_three_bursts(broker, spark, tmp_path):
    topic, bursts = "tburst", []
    for n in range(3):
        if n:
            time.sleep(1.1)
        t0 = int(time.time() * 1000)
        bursts.append((t0, put_many(broker, topic, n * 100, 100)))
    since = bursts[1][0]
    expected = {**bursts[1][1], **bursts[2][1]}
    stream = (spark.readStream.format("metaq").option("brokers", url_of(broker)).option("subscribe", topic)
              .option("startingTimestamp", str(since)).load())
    query = stream.writeStream.format("memory").queryName("bursts").trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert _rows(spark, "bursts") == expected
    batch = (spark.read.format("metaq").option("brokers", url_of(broker)).option("topic", topic)
             .option("startingTimestamp", str(since)).load().select("partition", "offset").collect())
    assert {(r["partition"], r["offset"]) for r in batch} == set(expected)
