"""One store, two protocols: RocketMQ clients and MetaQ text clients see each other's messages.

Queue id = partition, queue offset = our offset, tags = the MetaQ attribute,
keys and other properties kept (README "RocketMQ clients").
"""

import pytest

from bench.rocketmq_peer import run_peer
from metaq.client import Consumer, Message, Producer
from metaq.client.local import ns_of
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from tests.harness.broker import consume_all, url_of
from tests.harness.rocketmq import pull, send_v1
from tests.harness.rocketmq import received, require_official_client


def test_remoting_send_is_a_text_get_with_tags_as_attribute(rmq_broker, rc):
    r = send_v1(rc, "tX1", b"payload", queue=3, props={"TAGS": "TagA", "KEYS": "k1", "UNIQ_KEY": "U"})
    offset = int(r.ext_fields["queueOffset"])
    with rmq_broker.client() as text:
        [rec] = consume_all(text, "tX1", 3)
    assert rec.payload == b"payload"  # the user's body, untouched
    # tags first; properties after \x02; then the sender's address (RocketMQ's born host), an internal property
    assert rec.attribute == "TagA\x02KEYS\x01k1\x02UNIQ_KEY\x01U\x02@BORNHOST\x01%s:%d\x02" % rc.sock.getsockname()[:2]
    assert offset == 0


def test_text_put_is_pulled_over_remoting_at_the_same_offsets(rmq_broker, rc):
    with rmq_broker.client() as text:
        put = [text.put_ok("tX2", b"text %d" % i, partition=1, attribute="T%d" % i if i else None) for i in range(3)]
    msgs = decode_stored_messages(pull(rc, "tX2", 1, 0).body)
    assert [(m.queue_id, m.queue_offset, m.body) for m in msgs] == [(1, p[2], b"text %d" % i)
                                                                     for i, p in enumerate(put)]
    assert [m.properties.get("TAGS") for m in msgs] == [None, "T1", "T2"]
    assert [m.flag for m in msgs] == [0, 1, 1]  # the MetaQ flag
    # a pulled record's physical offset finds it again (the offset msg id a RocketMQ consumer computes)
    [again] = decode_stored_messages(rc.call(R.VIEW_MESSAGE_BY_ID, {"offset": msgs[2].physical_offset}).body)
    assert again.body == b"text 2"


def test_metaq_client_and_remoting_exchange_keys_and_properties(rmq_broker, rc):
    with Producer(brokers=[url_of(rmq_broker)]) as producer:
        m = Message("tX3", b"from metaq", attribute="TagM", properties={"KEYS": "order-1", "color": "red"})
        assert producer.send(m).success
    [got] = decode_stored_messages(pull(rc, "tX3", m.partition.partition, 0).body)
    assert got.body == b"from metaq"
    assert got.properties == {"TAGS": "TagM", "KEYS": "order-1", "color": "red"}
    reply = send_v1(rc, "tX3", b"from rocketmq", queue=0, props={"TAGS": "TagR", "KEYS": "order-2", "x": "y"}, flag=9)
    consumer = Consumer("CGX3", brokers=[url_of(rmq_broker)])
    try:
        fetched = consumer.fetch("tX3", "7-0", int(reply.ext_fields["queueOffset"]))
    finally:
        consumer.close()
    assert [(f.body, f.attribute, f.properties) for f in fetched][-1] == (b"from rocketmq", "TagR",
                                                                          {"KEYS": "order-2", "x": "y"})


@pytest.mark.slow
def test_official_client_and_metaq_client_both_ways(rmq_factory, tmp_path):
    require_official_client()
    b = rmq_factory(store={"flush": "async", "flush_interval_ms": 50})
    ns = ns_of(b)
    # RocketMQ producer -> metaq consumer (text protocol)
    sent = [s for s in run_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tX4", "--count", 20,
                                "--tags", "TagC") if "msg_id" in s]
    assert len(sent) == 20, sent
    with b.client() as text:
        records = [rec for part in range(4) for rec in consume_all(text, "tX4", part)]
    assert sorted(r.payload for r in records) == sorted(b"m-%d" % i for i in range(20))
    assert all(r.attribute.startswith("TagC\x02") and "KEYS\x01m-key-" in r.attribute for r in records)
    # metaq producer (text) -> RocketMQ push consumer, tags and keys included
    with Producer(brokers=[url_of(b)]) as producer:
        for i in range(20):
            assert producer.send(Message("tX5", b"t-%d" % i, attribute="TagT",
                                         properties={"KEYS": "k-%d" % i, "seq": str(i)})).success
    got = received(run_peer(tmp_path / "c", "consume", "--ns", ns, "--topic", "tX5", "--group", "CGX5",
                            "--expect", 20))
    assert sorted(m["body"] for m in got) == sorted("t-%d" % i for i in range(20))
    assert all(m["tags"] == "TagT" and m["keys"] == "k-%s" % m["seq"] for m in got)
    # the RocketMQ group's committed offsets are the broker store's, read here over text
    with b.client() as text:
        replies = [text.call(ev.QueryOffset("CGX5", "tX5", part, text.opaque())) for part in range(4)]
    assert sum(int(r.body) for r in replies if r.code == 200) == 20
