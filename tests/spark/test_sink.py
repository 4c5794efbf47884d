"""df.write.format("metaq") with a real broker and the shared local Spark: columns, partitions, bad rows."""

import pytest

from metaq.client.local import small_config
from tests.harness.broker import url_of

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def strict_broker(tmp_path_factory):
    """A broker taking only the topics t* (4 partitions) with bodies of at most 4 KiB."""
    from metaq.client.local import BrokerProcess

    wd = tmp_path_factory.mktemp("sink")
    cfg = small_config(str(wd / "data"), topics=[{"name": "t*", "partitions": 4}], limits={"max_body_bytes": 4096})
    b = BrokerProcess(wd, cfg).start()
    with b.client() as c:  # the topics exist: one message in each partition (a topic no broker has yet is
        for topic in ("tcols", "troute0", "troute1"):  # written to its partition 0 until its first put creates it)
            for p in range(4):
                c.put_ok(topic, b"seed", p)
    yield b
    b.kill()


def read_back(spark, url, topic):
    return (spark.read.format("metaq").option("brokers", url).option("topic", topic).load()
            .where("value != X'73656564'").select("partition", "offset", "value", "attribute", "key", "properties")
            .collect())


def test_every_column_lands_where_it_says(spark, strict_broker):
    url = url_of(strict_broker)
    rows = [("v%d" % i, "k%d" % (i % 5) if i % 2 else None, "7-%d" % (i % 4) if i % 3 == 0 else None,
             "tag%d" % i if i % 4 == 0 else None, {"source": "test", "n": str(i)}) for i in range(200)]
    df = spark.createDataFrame(rows, "value string, key string, partition string, attribute string, "
                                     "properties map<string,string>")
    df.write.format("metaq").option("brokers", url).option("topic", "tcols").mode("append").save()
    got = read_back(spark, url, "tcols")
    assert len(got) == 200
    by_value = {r["value"].decode(): r for r in got}
    assert set(by_value) == {"v%d" % i for i in range(200)}
    key_partitions = {}
    for value, key, partition, attribute, props in rows:
        r = by_value[value]
        assert (r["key"], r["attribute"]) == (key, attribute)
        shown = dict(r["properties"])
        assert {"METAQ_PID", "METAQ_SEQ"} <= set(shown)  # stored by the sink's idempotent producer
        del shown["METAQ_PID"], shown["METAQ_SEQ"]
        assert shown == dict(props, **({"KEYS": key} if key else {}))
        if partition is not None:
            assert r["partition"] == partition
        elif key is not None:
            key_partitions.setdefault(key, set()).add(r["partition"])
    assert key_partitions and all(len(parts) == 1 for parts in key_partitions.values())  # a key keeps its partition


def test_a_topic_column_routes_rows_and_an_int_partition_is_an_index(spark, strict_broker):
    url = url_of(strict_broker)
    df = spark.createDataFrame([(b"x%d" % i, "troute%d" % (i % 2), i % 4) for i in range(40)],
                               "value binary, topic string, partition int")
    df.write.format("metaq").option("brokers", url).mode("append").save()
    for n in (0, 1):
        got = read_back(spark, url, "troute%d" % n)
        assert sorted(r["value"] for r in got) == sorted(b"x%d" % i for i in range(40) if i % 2 == n)
        assert all(r["partition"] == "7-%d" % (int(r["value"][1:]) % 4) for r in got)


@pytest.mark.parametrize("rows, schema, problem", [
    ([("a",), (None,)], "value string", "row 1 of this task has no value"),
    ([("a", "tgood"), ("b", "nope")], "value string, topic string", "row 1 of this task was not stored"),
    ([("a",), ("b" * 5000,)], "value string", "row 1 of this task was not stored"),
    ([("a", "9-9")], "value string, partition string", "row 0 of this task: partition 9-9 is not one of"),
    ([("a", "7-2", "tfresh")], "value string, partition string, topic string", "topic tfresh has no data yet"),
])
def test_a_bad_row_fails_the_write_naming_its_position(spark, strict_broker, rows, schema, problem):
    url = url_of(strict_broker)
    df = spark.createDataFrame(rows, schema).coalesce(1)
    writer = df.write.format("metaq").option("brokers", url).option("topic", "tbad").mode("append")
    with pytest.raises(Exception) as failed:
        writer.save()
    assert problem in str(failed.value)


def test_columns_the_sink_does_not_write_are_refused_before_anything_is_sent(spark, strict_broker):
    url = url_of(strict_broker)
    df = spark.createDataFrame([("a", "b")], "value string, values string")
    with pytest.raises(Exception, match="not among them: values"):
        df.write.format("metaq").option("brokers", url).option("topic", "trefused").mode("append").save()
    with strict_broker.client() as c:
        assert "trefused" not in c.stats("offsets")  # the topic was never created: nothing was put
