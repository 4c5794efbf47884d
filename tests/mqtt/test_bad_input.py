"""Bad input on the MQTT port gets the specification's answer and a close, one log line, never a traceback
(docs/mqtt.md "Bad input")."""

import socket
import time

import pytest

from metaq.mqtt import wire
from tests.harness.mqtt import Raw, mqtt_config

pytestmark = pytest.mark.integration  # one broker for the module (a module fixture)


@pytest.fixture(scope="module")
def mqtt_broker(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("mqtt-bad")
    b = BrokerProcess(wd, mqtt_config(wd)).start()
    yield b
    b.kill()


def _v5(b, client_id):
    raw = Raw(b)
    assert raw.connect(client_id).reason_code == 0
    return raw


def _publish_bytes(topic_bytes, flags=0, body=b""):
    """A PUBLISH's bytes by hand (what a well-behaved client never sends): MQTT 5, no properties."""
    var = len(topic_bytes).to_bytes(2, "big") + topic_bytes + (b"\x00\x01" if flags & 0x06 else b"") + b"\x00"
    rest = var + body
    return bytes((0x30 | flags, len(rest))) + rest


def test_a_packet_before_connect_is_closed_without_an_answer(mqtt_broker):
    raw = Raw(mqtt_broker)
    raw.send_bytes(wire.encode(wire.PingReq(), wire.MQTT_5))
    assert raw.closed()
    assert mqtt_broker.log_text().count("the first packet must be CONNECT, not PINGREQ") == 1  # logged once


def test_a_second_connect_is_a_protocol_error(mqtt_broker):
    raw = _v5(mqtt_broker, "twice")
    raw.send(wire.Connect(wire.MQTT_5, "twice"))
    assert raw.read() == wire.Disconnect(wire.PROTOCOL_ERROR)
    assert raw.closed()
    old = Raw(mqtt_broker, wire.MQTT_311)
    assert old.connect("twice-311").reason_code == 0
    old.send(wire.Connect(wire.MQTT_311, "twice-311"))
    assert old.closed()  # MQTT 3.1.1: no DISCONNECT from a server


@pytest.mark.parametrize("raw_bytes, code, why", [
    (_publish_bytes(b"a/+/b"), wire.TOPIC_NAME_INVALID, "wildcard"),
    (_publish_bytes(b"a/#"), wire.TOPIC_NAME_INVALID, "wildcard"),
    (_publish_bytes(b"a/b", flags=0x06), wire.MALFORMED_PACKET, "QoS 3"),
    (_publish_bytes(b"a/\xff\xfe"), wire.MALFORMED_PACKET, "UTF-8"),
], ids=["plus", "hash", "qos3", "utf8"])
def test_a_bad_publish_is_answered_and_closed(mqtt_broker, raw_bytes, code, why):
    raw = _v5(mqtt_broker, "bad-%s" % why.replace(" ", ""))
    raw.send_bytes(raw_bytes)
    assert raw.read() == wire.Disconnect(code)
    assert raw.closed()


def test_a_name_already_served_keeps_every_refusal_of_its_publish(mqtt_broker):
    """A topic name the broker has served is split and decoded in one step (``wire.split``): a PUBLISH of that name
    with packet id 0, a topic length past the packet or a Remaining Length past 4 bytes is refused as any other."""
    for client_id, bad, code in (
            ("known-pid0", b"\x32\x0c\x00\x07known/x\x00\x00\x00", wire.PROTOCOL_ERROR),
            ("known-past", bytes((0x30, 0x0A, 0x00, 0x09)) + b"known/x\x00", wire.MALFORMED_PACKET),
            ("known-5", b"\x32\xff\xff\xff\xff\x01", wire.MALFORMED_PACKET)):
        raw = _v5(mqtt_broker, client_id)
        raw.send(wire.Publish("known/x", b"x", 1, packet_id=1))
        assert raw.read() == wire.PubAck(1)
        raw.send_bytes(bad)
        assert raw.read() == wire.Disconnect(code), client_id
        assert raw.closed()


@pytest.mark.parametrize("version", [wire.MQTT_311, wire.MQTT_5], ids=["v311", "v5"])
def test_a_publish_split_across_two_reads_at_every_byte_is_acknowledged(mqtt_broker, version):
    raw = Raw(mqtt_broker, version)
    assert raw.connect("split-%d" % version).reason_code == 0
    raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = wire.encode(wire.Publish("split/x", b"p" * 130, 1, packet_id=1), version)
    for cut in range(1, len(data)):
        raw.send_bytes(data[:cut])
        time.sleep(0.005)  # the broker reads the first part alone
        raw.send_bytes(data[cut:])
        assert raw.read() == wire.PubAck(1), cut


def test_a_topic_alias_out_of_range_is_refused(mqtt_broker):
    raw = _v5(mqtt_broker, "alias")
    raw.send(wire.Publish("", b"x", 0, properties={"topic_alias": 17}))  # past the default maximum, 16
    assert raw.read() == wire.Disconnect(wire.TOPIC_ALIAS_INVALID)
    assert raw.closed()
    raw = _v5(mqtt_broker, "alias-unknown")
    raw.send(wire.Publish("", b"x", 0, properties={"topic_alias": 1}))
    assert raw.read() == wire.Disconnect(wire.PROTOCOL_ERROR)  # an alias never set
    raw = _v5(mqtt_broker, "alias-ok")
    raw.send(wire.Publish("aliased/x", b"x", 1, packet_id=1, properties={"topic_alias": 1}))
    assert raw.read() == wire.PubAck(1)
    raw.send(wire.Publish("", b"y", 1, packet_id=2, properties={"topic_alias": 1}))
    assert raw.read() == wire.PubAck(2)


def test_a_name_beginning_with_dollar_is_the_brokers_refused_with_topic_name_invalid(mqtt_broker):
    raw = _v5(mqtt_broker, "dollar")
    raw.send(wire.Publish("$SYS/broker/uptime", b"x", 1, packet_id=1))
    ack = raw.read()
    assert (type(ack), ack.packet_id, ack.reason_code) == (wire.PubAck, 1, wire.TOPIC_NAME_INVALID)
    assert "topic names beginning with '$' are the broker's" in ack.properties["reason_string"]
    raw.send(wire.Publish("$x", b"x", 2, packet_id=2))
    ack = raw.read()
    assert (type(ack), ack.packet_id, ack.reason_code) == (wire.PubRec, 2, wire.TOPIC_NAME_INVALID)
    raw.send(wire.Subscribe(3, (wire.Subscription("$SYS/#", 1), wire.Subscription("b@d/#", 1))))
    assert raw.read() == wire.Suback(3, (wire.TOPIC_FILTER_INVALID, 1))  # no '$' topic is served; b@d is a name
    old = Raw(mqtt_broker, wire.MQTT_311)
    assert old.connect("dollar-311").reason_code == 0
    old.send(wire.Publish("$SYS/x", b"x", 1, packet_id=1))
    assert old.closed()
    will = Raw(mqtt_broker)
    assert will.connect("dollar-will", will=wire.Will("$SYS/status", b"gone")).reason_code == wire.TOPIC_NAME_INVALID
    assert will.closed()


def test_what_this_release_does_not_serve_is_refused_as_the_connack_said(mqtt_broker):
    raw = Raw(mqtt_broker)
    ack = raw.connect("phase")
    assert "subscription_identifier_available" not in ack.properties  # absent: 1, served
    assert "retain_available" not in ack.properties and "shared_subscription_available" not in ack.properties  # 1
    raw.send(wire.Subscribe(1, (wire.Subscription("a/#", 1),), {"subscription_identifier": 5}))
    assert raw.read() == wire.Suback(1, (1,))
    auth = Raw(mqtt_broker)
    ack = auth.connect("enhanced", properties={"authentication_method": "SCRAM-SHA-1"})
    assert ack.reason_code == wire.BAD_AUTHENTICATION_METHOD
    assert auth.closed()


def test_no_bad_input_left_a_traceback(mqtt_broker):
    text = mqtt_broker.log_text()
    assert "Traceback" not in text and "unexpected error" not in text
