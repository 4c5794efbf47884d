"""The subscriber's turn (``Subscriptions.read_pubacks``): a read that begins with PUBACKs has them split in one step
(``MqttParser.end_acks``) and each ends its message in flight once, in order, as the general path would; whatever
follows them in the read (a PINGREQ, a part of a packet) is handled in its place; a PUBACK of an unknown packet id
is ignored; a persistent session's unacknowledged message is sent again after a reconnect (docs/mqtt.md)."""

import socket
import time

import pytest

from metaq.mqtt import wire
from tests.harness.mqtt import Raw, mqtt_config

pytestmark = pytest.mark.integration  # one broker for the module (a module fixture)

HOUR = {"session_expiry_interval": 3600}


@pytest.fixture(scope="module")
def mqtt_broker(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("mqtt-acks")
    b = BrokerProcess(wd, mqtt_config(wd)).start()
    yield b
    b.kill()


def _subscriber(b, client_id, name, window, version=wire.MQTT_5, clean=True):
    """A QoS 1 subscriber of ``name`` that takes at most ``window`` messages in flight (MQTT 5's Receive
    Maximum; 3.1.1: the broker's own)."""
    raw = Raw(b, version)
    props = dict(HOUR, receive_maximum=window) if version == wire.MQTT_5 else {}
    ack = raw.connect(client_id, clean_start=clean, properties=props) if version == wire.MQTT_5 else \
        raw.connect(client_id, clean_start=clean)
    assert ack.reason_code == 0
    if clean:
        raw.send(wire.Subscribe(1, (wire.Subscription(name, 1),)))
        assert isinstance(raw.read(), wire.Suback)
    return raw


def _publisher(b, client_id):
    raw = Raw(b)
    assert raw.connect(client_id).reason_code == 0
    return raw


def _publish(pub, name, bodies, first_id):
    for i, body in enumerate(bodies):
        pub.send(wire.Publish(name, body, 1, False, False, first_id + i))
    assert [pub.read().packet_id for _ in bodies] == [first_id + i for i in range(len(bodies))]


def _delivered(sub, n):
    got = [sub.read() for _ in range(n)]
    assert all(isinstance(p, wire.Publish) for p in got), got
    return got


def _puback(packet_id, version=wire.MQTT_5):
    return wire.encode(wire.PubAck(packet_id), version)


def test_pubacks_split_at_every_byte_each_end_their_message_once(mqtt_broker):
    """Two PUBACKs (the short form and MQTT 5's with a reason code and an empty property length) whose bytes come in
    two reads, cut at every byte: with a window of 2, the next two messages are delivered only once both ended."""
    name = "acks1/t"
    sub = _subscriber(mqtt_broker, "acks-split-sub", name, 2)
    pub = _publisher(mqtt_broker, "acks-split-pub")
    pid = 1
    _publish(pub, name, [b"m0", b"m1"], pid)
    pid += 2
    got = _delivered(sub, 2)
    for cut in range(1, 10):
        a, b = got[0].packet_id, got[1].packet_id
        data = _puback(a) + bytes([0x40, 4, b >> 8, b & 0xFF, 0x00, 0x00])
        sub.send_bytes(data[:cut])
        time.sleep(0.005)  # the broker reads the first part alone
        sub.send_bytes(data[cut:])
        bodies = [b"c%da" % cut, b"c%db" % cut]
        _publish(pub, name, bodies, pid)
        pid += 2
        got = _delivered(sub, 2)
        assert [p.payload for p in got] == bodies
    sub.close()
    pub.close()


def test_a_puback_of_an_unknown_id_is_ignored_and_the_known_one_ends_its_message(mqtt_broker):
    name = "acks2/t"
    sub = _subscriber(mqtt_broker, "acks-unknown-sub", name, 1)
    pub = _publisher(mqtt_broker, "acks-unknown-pub")
    _publish(pub, name, [b"first"], 1)
    (p,) = _delivered(sub, 1)
    unknown = p.packet_id % 65535 + 1
    sub.send_bytes(_puback(unknown) + _puback(p.packet_id) + _puback(p.packet_id))  # a repeat is unknown too
    _publish(pub, name, [b"second"], 2)
    assert [q.payload for q in _delivered(sub, 1)] == [b"second"]
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)  # still connected
    sub.close()
    pub.close()


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311], ids=["v5", "v311"])
def test_pubacks_around_a_pingreq_in_one_read_are_each_handled_in_their_place(mqtt_broker, version):
    name = "acks3v%d/t" % version
    sub = _subscriber(mqtt_broker, "acks-ping-sub-%d" % version, name, 2, version)
    pub = _publisher(mqtt_broker, "acks-ping-pub-%d" % version)
    _publish(pub, name, [b"a", b"b"], 1)
    a, b = (p.packet_id for p in _delivered(sub, 2))
    sub.send_bytes(_puback(a, version) + wire.encode(wire.PingReq(), version) + _puback(b, version)
                   + wire.encode(wire.PingReq(), version))
    assert isinstance(sub.read(), wire.PingResp)
    assert isinstance(sub.read(), wire.PingResp)
    _publish(pub, name, [b"c", b"d"], 3)
    assert [p.payload for p in _delivered(sub, 2)] == [b"c", b"d"]
    sub.close()
    pub.close()


def test_a_persistent_sessions_unacknowledged_message_is_sent_again_after_a_reconnect(mqtt_broker):
    """Three messages in flight, the first and third acknowledged in one read: after a reconnect only the second is
    sent again (DUP, its packet id), and once acknowledged the next message follows."""
    name = "acks4/t"
    sub = _subscriber(mqtt_broker, "acks-again-sub", name, 3)
    pub = _publisher(mqtt_broker, "acks-again-pub")
    _publish(pub, name, [b"one", b"two", b"three"], 1)
    one, two, three = _delivered(sub, 3)
    sub.send_bytes(_puback(one.packet_id) + _puback(three.packet_id))
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)  # the PUBACKs before it were handled
    sub.sock.shutdown(socket.SHUT_RDWR)
    sub.close()
    again = Raw(mqtt_broker)
    assert again.connect("acks-again-sub", clean_start=False, properties=dict(HOUR, receive_maximum=3)).session_present
    p = again.read()
    assert isinstance(p, wire.Publish) and (p.payload, p.packet_id, p.dup) == (b"two", two.packet_id, True)
    again.send_bytes(_puback(p.packet_id))
    _publish(pub, name, [b"four"], 4)
    assert [q.payload for q in _delivered(again, 1)] == [b"four"]
    again.close()
    pub.close()
