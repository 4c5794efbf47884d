"""spark.read.format("metaq") and the RDD fallback against two real brokers, with a real local Spark."""

import collections
import json
import os
import time

import pytest

from metaq.client import Message, Producer
from metaq.client.local import small_config
from tests.harness.broker import url_of

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

TOPIC = "tdata"  # t* topics have 4 partitions in small_config
N = 10_000


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory):
    """Brokers 7 and 8 holding N messages of TOPIC spread over their 8 partitions, each once; what was sent, by
    (partition, offset). A put may take its whole minute: on a slow machine 10,000 puts
    queued at once outlast the default send timeout, and the at-least-once producer's retry stores one again."""
    from metaq.client.local import BrokerProcess

    started = []
    try:
        for broker_id in (7, 8):
            wd = tmp_path_factory.mktemp("b%d" % broker_id)
            cfg = small_config(os.path.join(str(wd), "data"))
            cfg["broker"]["id"] = broker_id
            started.append(BrokerProcess(wd, cfg).start())
        urls = [url_of(b) for b in started]
        t0 = time.time()
        with Producer(brokers=urls, send_timeout=60) as producer:
            messages = [Message(TOPIC, os.urandom(8) + b"payload %05d" % i,
                                attribute="k%d" % (i % 5) if i % 4 else None,
                                properties={"KEYS": "key%d" % i, "region": "eu"} if i % 3 == 0 else None)
                        for i in range(N)]
            futures = [producer.send_async(m, timeout=60) for m in messages]
            results = [f.result(60) for f in futures]
        t1 = time.time()
        failed = collections.Counter(str(r.error) for r in results if not r.success)
        assert not failed, failed
        sent = {(str(r.partition), r.offset): (m.body, m.attribute, r.msg_id, m.properties)
                for m, r in zip(messages, results, strict=True)}
        assert len(sent) == N
        yield urls, sent, (t0, t1)
    finally:
        for b in started:
            b.kill()


def test_reads_every_message_exactly_once_in_parallel_ranges(spark, two_brokers):
    urls, sent, (t0, t1) = two_brokers
    df = (spark.read.format("metaq").option("brokers", ",".join(urls)).option("topic", TOPIC)
          .option("maxOffsetsPerPartition", 500).load())
    assert df.columns == ["topic", "partition", "offset", "msg_id", "attribute", "value", "timestamp", "key",
                          "properties"]
    per_partition = {}
    for part, _offset in sent:
        per_partition[part] = per_partition.get(part, 0) + 1
    assert len(per_partition) == 8  # both brokers, 4 partitions each
    expected_splits = sum(-(-count // 500) for count in per_partition.values())
    assert df.rdd.getNumPartitions() == expected_splits  # one Spark partition per 500-offset range

    rows = df.collect()
    keys = [(r["partition"], r["offset"]) for r in rows]
    assert len(rows) == N and len(set(keys)) == N  # no duplicates
    assert set(keys) == set(sent)  # no gaps: every (partition, offset) sent, and nothing else
    for r in rows:
        body, attribute, msg_id, properties = sent[(r["partition"], r["offset"])]
        assert (r["topic"], bytes(r["value"]), r["attribute"], r["msg_id"]) == (TOPIC, body, attribute, msg_id)
        assert (r["key"], r["properties"]) == ((properties or {}).get("KEYS"), properties or {})
        assert t0 - 1 <= r["timestamp"].timestamp() <= t1 + 1


def test_starting_and_ending_offsets_json_and_partition_filter(spark, two_brokers):
    urls, sent, _ = two_brokers
    ends = {}
    for part, offset in sent:
        ends[part] = max(ends.get(part, 0), offset + 1)
    reader = spark.read.format("metaq").option("brokers", ",".join(urls)).option("topic", TOPIC)
    df = (reader.option("startingOffsets", json.dumps({TOPIC: {"7-0": 100, "8-3": -2}}))
          .option("endingOffsets", json.dumps({TOPIC: {"7-0": 350, "8-1": 1000}})).load())
    bounds = {r["partition"]: (r["lo"], r["hi"], r["n"]) for r in
              df.groupBy("partition").agg({"offset": "min", "*": "count"}).withColumnRenamed("min(offset)", "lo")
              .withColumnRenamed("count(1)", "n").join(df.groupBy("partition").max("offset")
                                                       .withColumnRenamed("max(offset)", "hi"), "partition").collect()}
    want = {part: (0, end - 1, end) for part, end in ends.items()}
    want["7-0"] = (100, 349, 250)
    want["8-1"] = (0, 999, 1000)
    assert bounds == want

    only = reader.option("partitions", "8-2").load()
    assert only.count() == ends["8-2"]


def test_rdd_fallback_gives_the_same_rows(spark, two_brokers):
    from metaq.spark import read_ranges_rdd

    urls, sent, _ = two_brokers
    options = {"brokers": ",".join(urls), "topic": TOPIC, "startingOffsets": json.dumps({TOPIC: {"7-1": 1000}}),
               "endingOffsets": json.dumps({TOPIC: {"7-1": 1100}}), "partitions": "7-1",
               "maxOffsetsPerPartition": "30"}
    rdd_df = read_ranges_rdd(spark, **options)
    assert rdd_df.rdd.getNumPartitions() == 4
    ds_df = spark.read.format("metaq").options(**options).load()
    got = sorted((r["partition"], r["offset"], bytes(r["value"]), r["msg_id"], r["attribute"])
                 for r in rdd_df.collect())
    assert got == sorted((r["partition"], r["offset"], bytes(r["value"]), r["msg_id"], r["attribute"])
                         for r in ds_df.collect())
    assert [g[1] for g in got] == list(range(1000, 1100))
    assert all(g[2] == sent[("7-1", g[1])][0] for g in got)


def test_bad_requests_fail_with_the_reason(spark, two_brokers):
    urls, _, _ = two_brokers
    reader = spark.read.format("metaq").option("brokers", ",".join(urls)).option("topic", TOPIC)
    with pytest.raises(Exception, match="past the log end"):
        reader.option("endingOffsets", json.dumps({TOPIC: {"7-0": 10**6}})).load().count()
    with pytest.raises(Exception, match="needs the option 'brokers'"):
        spark.read.format("metaq").option("topic", TOPIC).load().count()
