"""A delivery keeps the match of a topic name against its session's filters (``Outbound.decision``, at most
``limits.MQTT_KEPT_MATCHES`` names of at most ``limits.MQTT_KEPT_NAME`` characters): a subscription added, replaced
or dropped, or a topic a wildcard filter comes to read, applies to the very next message, whichever way it is sent
(from the publisher's turn or the subscriber's own delivery); a PUBLISH without properties
(``outbound.encode_publish``) is byte for byte the one ``wire.encode`` makes."""

import itertools
import time
from types import SimpleNamespace

import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.client.local import small_config
from metaq.mqtt import wire
from metaq.mqtt.outbound import Outbound, encode_publish
from metaq.mqtt.session import MqttSession, Subscribed
from tests.harness.mqtt import Raw, with_mqtt


def config(tmp_path, flush):
    """flush async: a message goes from the publisher's turn to a subscriber waiting; sync: from the subscriber's
    own delivery, after the flush."""
    return with_mqtt(small_config(tmp_path / "data", store={"flush": flush}))


def client(b, client_id):
    c = Raw(b, wire.MQTT_5, timeout=30)
    assert c.connect(client_id).reason_code == 0
    c.got = []  # PUBLISHes read while waiting for a PUBACK (``publish``)
    return c


def subscribe(c, packet_id, topic_filter, qos, sub_id, no_local=False):
    c.send(wire.Subscribe(packet_id, (wire.Subscription(topic_filter, qos, no_local),),
                          {"subscription_identifier": sub_id}))
    ack = c.read()
    assert isinstance(ack, wire.Suback) and ack.reason_codes == (qos,)


def unsubscribe(c, packet_id, topic_filter):
    c.send(wire.Unsubscribe(packet_id, (topic_filter,)))
    assert isinstance(c.read(), wire.Unsuback)


def publish(pub, name, payload, packet_id=1):
    """Publish at QoS 1 and wait for the PUBACK; a PUBLISH read meanwhile (a subscriber of its own) is kept for
    ``next_publish``."""
    pub.send(wire.Publish(name, payload, 1, packet_id=packet_id))
    while True:
        p = pub.read()
        assert p is not None, "closed"
        if isinstance(p, wire.PubAck):
            assert p.reason_code == 0
            return
        pub.got.append(p)


def next_publish(c):
    """The next PUBLISH ``c`` gets, acknowledged when QoS 1; PUBACKs of its own PUBLISHes passed over."""
    while True:
        p = c.got.pop(0) if c.got else c.read()
        assert p is not None, "closed"
        if isinstance(p, wire.Publish):
            if p.qos == 1:
                c.send(wire.PubAck(p.packet_id))
            return p


def ids(p):
    return tuple(sorted(p.properties.get("subscription_identifier", ())))


@pytest.mark.parametrize("flush,name", [("async", "km/x"), ("sync", "km/x"),
                                        ("async",
                                         "km/" + "l" * mqtt_limits.MQTT_KEPT_NAME)])  # past the bound: not kept
def test_a_subscription_added_replaced_or_dropped_between_two_messages_applies_to_the_next(broker_factory, tmp_path,
                                                                                            flush, name):
    b = broker_factory(config(tmp_path, flush))
    sub = client(b, "sub")
    pub = client(b, "pub")
    subscribe(sub, 1, "km/+", 0, 1)
    publish(pub, name, b"one")
    p = next_publish(sub)
    assert (p.payload, p.qos, ids(p)) == (b"one", 0, (1,))
    subscribe(sub, 2, name, 1, 2)  # added: a second match, a higher QoS
    publish(pub, name, b"two")
    p = next_publish(sub)
    assert (p.payload, p.qos, ids(p)) == (b"two", 1, (1, 2))
    subscribe(sub, 3, "km/+", 1, 3)  # replaced: its identifier
    publish(pub, name, b"three")
    p = next_publish(sub)
    assert (p.payload, p.qos, ids(p)) == (b"three", 1, (2, 3))
    unsubscribe(sub, 4, name)  # dropped
    publish(pub, name, b"four")
    p = next_publish(sub)
    assert (p.payload, p.qos, ids(p)) == (b"four", 1, (3,))
    unsubscribe(sub, 5, "km/+")  # the last: nothing of km/x comes any more
    subscribe(sub, 6, "other/t", 1, 9)
    publish(pub, name, b"five")
    publish(pub, "other/t", b"six")
    p = next_publish(sub)
    assert (p.topic, p.payload, ids(p)) == ("other/t", b"six", (9,))


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_no_local_set_by_a_subscription_replaced_between_two_messages_applies_to_the_next(broker_factory, tmp_path,
                                                                                          flush):
    b = broker_factory(config(tmp_path, flush))
    me = client(b, "me")
    subscribe(me, 1, "nl/t", 1, 1)
    publish(me, "nl/t", b"mine", 10)
    assert next_publish(me).payload == b"mine"
    subscribe(me, 2, "nl/t", 1, 1, no_local=True)
    publish(me, "nl/t", b"not sent", 11)
    other = client(b, "other")
    publish(other, "nl/t", b"theirs")
    assert next_publish(me).payload == b"theirs"  # its own message of before was not sent


def test_a_topic_a_wildcard_filter_comes_to_read_applies_to_the_next_message(broker_factory, tmp_path):
    b = broker_factory(config(tmp_path, "async"))
    sub = client(b, "sub")
    pub = client(b, "pub")
    subscribe(sub, 1, "fresh/x", 1, 2)  # a topic not made yet: the wildcard filter below does not read it
    subscribe(sub, 2, "+/x", 1, 1)
    publish(pub, "fresh/x", b"first")  # makes the topic; the wildcard filter finds it at its next look
    seen = ids(next_publish(sub))
    deadline = time.monotonic() + 10 * mqtt_limits.MQTT_TOPIC_RESCAN_S
    n = 0
    while seen != (1, 2):
        assert seen == (2,) and time.monotonic() < deadline, seen
        time.sleep(0.1)
        n += 1
        publish(pub, "fresh/x", b"again %d" % n, n % 60000 + 1)
        seen = ids(next_publish(sub))


def test_a_wildcard_subscriber_gets_each_name_rightly_at_the_kept_bound_and_past_it(broker_factory, tmp_path):
    b = broker_factory(config(tmp_path, "async"))
    sub = client(b, "sub")
    pub = client(b, "pub")
    subscribe(sub, 1, "many/+", 1, 1)
    subscribe(sub, 2, "many/odd1", 1, 2)
    names = ["many/n%d" % i for i in range(mqtt_limits.MQTT_KEPT_MATCHES + 1)] + ["many/odd1", "many/n0"]
    for i, name in enumerate(names):
        publish(pub, name, b"%d" % i, i % 60000 + 1)
        p = next_publish(sub)
        assert (p.topic, p.payload, ids(p)) == (name, b"%d" % i, (1, 2) if name == "many/odd1" else (1,))
    unsubscribe(sub, 3, "many/+")
    publish(pub, "many/odd1", b"last")
    p = next_publish(sub)
    assert (p.topic, ids(p)) == ("many/odd1", (2,))


def _outbound():
    session = MqttSession("c", wire.MQTT_5, 10)
    session.subscribe(Subscribed("k/+", 1, False, ["k"]))
    conn = SimpleNamespace(mqtt=session)
    port = SimpleNamespace(store=None, guard=None, decoded=None, max_transfer=0, cluster_topics=())
    return Outbound(conn, port)


def test_the_matches_kept_are_bounded_at_the_limit_and_past_it_begin_again():
    out = _outbound()
    msg = SimpleNamespace(client_id="p", retain=False)
    for i in range(mqtt_limits.MQTT_KEPT_MATCHES):
        msg.topic = "k/%d" % i
        assert out.decision("k", msg)[0] == 1
    assert len(out._matched) == mqtt_limits.MQTT_KEPT_MATCHES  # at the limit: all kept
    msg.topic = "k/past"
    assert out.decision("k", msg)[0] == 1
    assert len(out._matched) == 1  # one past it: the others dropped, the new one kept


def test_a_name_is_kept_up_to_the_longest_kept_and_matched_each_time_past_it():
    out = _outbound()
    msg = SimpleNamespace(client_id="p", retain=False, topic="k/" + "n" * (mqtt_limits.MQTT_KEPT_NAME - 2))
    assert out.decision("k", msg)[0] == 1
    assert len(out._matched) == 1  # at the bound: kept
    msg.topic += "n"
    assert out.decision("k", msg)[0] == 1
    assert len(out._matched) == 1  # one past it: matched, not kept


def test_a_publish_without_properties_is_the_one_wire_encode_makes():
    for name, payload, qos, retain, version in itertools.product(
            ["a", "km/x", "é/ü/\u20ac", "n" * 300], [b"", b"p" * 5, b"q" * 127, b"r" * 20_000]
            + [b"s" * n for n in (121, 122, 123, 16_377, 16_378, 16_379)], (0, 1, 2),
            (False, True), (wire.MQTT_311, wire.MQTT_5)):
        pid = 513 if qos else None
        want = wire.encode(wire.Publish(name, payload, qos, retain, False, pid, {}), version)
        assert encode_publish(name, payload, qos, retain, version, pid) == want
    for bad in ("a\x00b", "n" * 70_000):
        with pytest.raises(ValueError):
            encode_publish(bad, b"", 1, False, wire.MQTT_5, 1)
