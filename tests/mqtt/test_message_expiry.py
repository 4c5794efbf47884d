"""MQTT 5 Message Expiry Interval (docs/mqtt.md "Message expiry"): a message past its interval is not delivered (to
a session that was offline, nor as a retained message); one within it is sent with the interval left."""

import time

from metaq.mqtt import wire
from tests.harness.mqtt import Raw, mqtt_config
from tests.mqtt.test_persistent_sessions import _resume, _subscribed


def test_expired_messages_are_not_delivered_and_the_rest_carry_what_is_left(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    raw = _subscribed(b, "dev1", topic_filter="exp/#")
    raw.send(wire.Disconnect())
    raw.close()
    pub = Raw(b)
    assert pub.connect("pub").reason_code == 0
    pub.send(wire.Publish("exp/short", b"gone", 1, packet_id=1, properties={"message_expiry_interval": 1}))
    assert pub.read() == wire.PubAck(1)
    pub.send(wire.Publish("exp/long", b"kept", 1, packet_id=2, properties={"message_expiry_interval": 60}))
    assert pub.read() == wire.PubAck(2)
    pub.send(wire.Publish("exp/r", b"retained-gone", 1, retain=True, packet_id=3,
                          properties={"message_expiry_interval": 1}))
    assert pub.read() == wire.PubAck(3)
    time.sleep(2.1)
    raw, present = _resume(b, "dev1")
    assert present
    p = raw.read()
    assert p.payload == b"kept" and 55 <= p.properties["message_expiry_interval"] <= 58
    raw.send(wire.PubAck(p.packet_id))
    raw.send(wire.Subscribe(2, (wire.Subscription("exp/#", 1),)))
    assert raw.read() == wire.Suback(2, (1,))
    raw.sock.settimeout(1.0)
    try:
        late = raw.read()
    except OSError:
        late = None
    assert late is None  # neither the expired message nor the expired retained one
