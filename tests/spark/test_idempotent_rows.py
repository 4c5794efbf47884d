"""The Spark reader shows the user's attribute of records stored by put_idem (the part before the \\x02)."""

from metaq.client import Message, Producer
from metaq.spark.ranges import OffsetRange, read_range
from tests.harness.broker import url_of


def test_read_range_attribute_column_of_idempotent_and_remoting_records(broker):
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=3,
                  selector=lambda topic, partitions, message: partitions[0]) as p:
        sent = [p.send(Message("tsi", b"v%d" % i, attribute="a%d" % i if i % 2 else None,
                               properties={"KEYS": "k"} if i == 3 else None)) for i in range(4)]
    part = sent[0].partition.partition
    rows = list(read_range(OffsetRange("tsi", 7, part, 0, 4, url_of(broker))))
    assert [(r[4], r[5]) for r in rows] == [(None, b"v0"), ("a1", b"v1"), (None, b"v2"), ("a3", b"v3")]
