"""MQTT 5 Subscription Identifiers (docs/mqtt.md "Subscribing"): a SUBSCRIBE's identifier is kept with its filters
(and with a persistent session), every PUBLISH delivered carries the identifiers of all the matching subscriptions,
0 is a protocol error, past 268,435,455 is malformed, and a PUBLISH carries at most ``mqtt.max_subscriptions``."""

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.client.local import BrokerProcess
from metaq.mqtt import wire
from tests.harness.mqtt import V311, Paho, Raw, mqtt_config
from tests.mqtt.test_persistent_sessions import HOUR

pytestmark = pytest.mark.integration  # one broker for the module (a module fixture)

MAX_SUBSCRIPTIONS = 3
LARGEST = 268_435_455  # the largest variable byte integer


@pytest.fixture(scope="module")
def b(tmp_path_factory):
    wd = tmp_path_factory.mktemp("mqtt-subids")
    broker = BrokerProcess(wd, mqtt_config(wd, max_subscriptions=MAX_SUBSCRIPTIONS)).start()
    yield broker
    broker.kill()


def _ids(sub_id):
    props = Properties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = sub_id
    return props


def _carried(msg):
    return sorted(getattr(msg.properties, "SubscriptionIdentifier", []) or [])


def test_a_publish_carries_the_identifiers_of_every_matching_subscription(b):
    sub = Paho(b, "ids")
    assert sub.subscribe("sid/#", 1, properties=_ids(1)) == [1]
    assert sub.subscribe("sid/+/t", 1, properties=_ids(LARGEST)) == [1]  # the largest identifier
    assert sub.subscribe("sid/a/t", 1) == [1]  # no identifier: the limit's third subscription
    assert sub.subscribe("sid/a/#", 1, properties=_ids(4)) == [wire.QUOTA_EXCEEDED]  # one past the limit
    pub = Paho(b, "ids-pub")
    pub.publish("sid/a/t", b"three", 1)
    pub.publish("sid/b/x", b"one", 1)
    got = sub.wait_messages(2)
    assert [(m.topic, m.payload, _carried(m)) for m in got] == [("sid/a/t", b"three", [1, LARGEST]),
                                                              ("sid/b/x", b"one", [1])]
    assert sub.subscribe("sid/#", 1) == [1]  # subscribed again without one: the identifier is gone
    pub.publish("sid/b/x", b"none", 1)
    m = sub.wait_messages(3)[2]
    assert (m.payload, _carried(m)) == (b"none", [])


def test_retained_shared_and_311_deliveries(b):
    pub = Paho(b, "ret-pub")
    pub.c.publish("rsid/kept", b"retained", 1, retain=True).wait_for_publish(10)
    sub = Paho(b, "ret-sub")
    assert sub.subscribe("rsid/#", 1, properties=_ids(21)) == [1]
    m = sub.wait_messages(1)[0]
    assert (m.payload, m.retain, _carried(m)) == (b"retained", True, [21])  # sent at the subscribe, with its id
    shared = Paho(b, "shared-sub")
    assert shared.subscribe("$share/g/gsid/#", 1, properties=_ids(9)) == [1]
    old = Paho(b, "old-sub", version=V311)
    assert old.subscribe("gsid/#", 1) == [1]
    pub.publish("gsid/x", b"s", 1)
    m = shared.wait_messages(1)[0]
    assert (m.payload, _carried(m)) == (b"s", [9])
    m = old.wait_messages(1)[0]
    assert m.payload == b"s"  # MQTT 3.1.1 has no properties


def test_0_is_a_protocol_error_and_past_the_largest_is_malformed(b):
    raw = Raw(b)
    assert raw.connect("zero").reason_code == 0
    raw.send_bytes(b"\x82\x09\x00\x01\x02\x0b\x00\x00\x01a\x01")  # SUBSCRIBE, identifier 0
    assert raw.read() == wire.Disconnect(wire.PROTOCOL_ERROR)
    assert raw.closed()
    raw = Raw(b)
    assert raw.connect("past").reason_code == 0
    raw.send_bytes(b"\x82\x0d\x00\x01\x06\x0b\xff\xff\xff\xff\x01\x00\x01a\x01")  # five bytes: LARGEST + 1 and more
    assert raw.read() == wire.Disconnect(wire.MALFORMED_PACKET)
    assert raw.closed()


def test_identifiers_are_kept_with_a_persistent_session_across_a_restart(b):
    raw = Raw(b)
    assert raw.connect("keeps-ids", clean_start=False, properties=dict(HOUR)).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("psid/#", 1),), {"subscription_identifier": 7}))
    assert raw.read() == wire.Suback(1, (1,))
    raw.send(wire.Disconnect())
    raw.close()
    b.stop()
    b.start()
    Paho(b, "psid-pub").publish("psid/x", b"away", 1)
    raw = Raw(b)
    ack = raw.connect("keeps-ids", clean_start=False, properties=dict(HOUR))
    assert ack.session_present
    p = raw.read()
    assert (p.topic, p.payload, p.properties.get("subscription_identifier")) == ("psid/x", b"away", (7,))
    raw.send(wire.PubAck(p.packet_id))
