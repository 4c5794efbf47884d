"""The one-step send from a publisher's turn (``direct._plain``: a QoS 1 PUBLISH without properties, expiry or
Subscription Identifiers to a waiting subscriber without outbound topic aliases, its packet id recorded in flight
before it is written and given back when nothing of it is) and the cases it must leave to the general path
(``direct._send``, ``Outbound.prepare``): each test here gets what only the general path makes (QoS 0, a topic alias)
or what only a given-back packet id lets through (a window of one going on), so a one-step send that took its case,
or kept an id it did not write, fails it. On a real broker with ``flush: async``, where a publisher's turn sends to a
subscriber waiting caught up (docs/mqtt.md "Subscribing")."""

import time
from types import SimpleNamespace

import pytest
from gevent.event import Event

from metaq.client.local import small_config
from metaq.mqtt import direct, wire
from metaq.mqtt.delivery import Delivery
from metaq.mqtt.records import stored_message
from metaq.mqtt.session import PUBLISH_SENT, MqttSession
from tests.harness.mqtt import Raw, next_publish, with_mqtt


def config(tmp_path, **mqtt):
    return with_mqtt(small_config(tmp_path / "data", store={"flush": "async"}), **mqtt)


def subscriber(b, client_id, filters=(("one/t", 1),), version=wire.MQTT_5, properties=None, **connect):
    s = Raw(b, version, timeout=10)
    ack = s.connect(client_id, properties=dict(properties or {}), **connect)
    assert ack.reason_code == 0, ack
    s.send(wire.Subscribe(1, tuple(wire.Subscription(f, qos) for f, qos in filters)))
    assert isinstance(s.read(), wire.Suback)
    return s


def publisher(b):
    pub = Raw(b, wire.MQTT_5, timeout=10)
    assert pub.connect("pub").reason_code == 0
    return pub


def publish(pub, payload, packet_id=1, name="one/t"):
    pub.send(wire.Publish(name, payload, 1, packet_id=packet_id))
    ack = pub.read()
    assert isinstance(ack, wire.PubAck) and ack.reason_code == 0


@pytest.mark.parametrize("version", [wire.MQTT_311, wire.MQTT_5])
def test_a_qos_1_message_to_a_waiting_qos_0_subscription_goes_at_qos_0(broker_factory, tmp_path, version):
    """min(granted, its QoS) is 0: the general path's QoS 0 PUBLISH, no packet id, nothing in flight. The session's
    QoS 1 filter on the same metaq topic (``one``, the names' first level) keeps its partitions its own (a QoS 0
    one alone would be handed to a fan-out reader), so the publisher's turn sends both names' messages."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "zero", (("one/t", 0), ("one/u", 1)), version=version)
    pub = publisher(b)
    time.sleep(0.5)  # its delivery caught up, waiting
    for i in range(3):
        publish(pub, b"t%d" % i, 2 * i + 1)
        p = next_publish(sub)
        assert (p.topic, p.payload, p.qos, p.packet_id) == ("one/t", b"t%d" % i, 0, None)
        publish(pub, b"u%d" % i, 2 * i + 2, "one/u")
        p = next_publish(sub)
        assert (p.topic, p.payload, p.qos) == ("one/u", b"u%d" % i, 1)
        sub.send(wire.PubAck(p.packet_id))


def test_a_waiting_subscriber_with_topic_aliases_gets_them_from_the_publishers_turn(broker_factory, tmp_path):
    """A connection with outbound topic aliases: the general path's aliases (the first delivery of a name sets a
    free one, the next use it alone), not the one-step PUBLISH with the name each time."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "aliased", properties={"topic_alias_maximum": 4})
    pub = publisher(b)
    time.sleep(0.5)
    forms = []
    for i in range(3):
        publish(pub, b"m%d" % i, i + 1)
        p = next_publish(sub)
        forms.append((p.topic, p.properties.get("topic_alias"), p.payload))
        sub.send(wire.PubAck(p.packet_id))
    assert forms == [("one/t", 1, b"m0"), ("", 1, b"m1"), ("", 1, b"m2")]


def test_a_message_past_the_maximum_packet_size_is_dropped_and_its_packet_id_given_back(broker_factory, tmp_path):
    """Receive Maximum 1 and a Maximum Packet Size: the message past it is not sent (as if delivered) and takes no
    place in flight, so the next ones still come, each once, in order."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "small", properties={"maximum_packet_size": 300, "receive_maximum": 1})
    pub = publisher(b)
    time.sleep(0.5)
    publish(pub, b"B" * 600, 1)
    got = []
    for i in range(3):
        publish(pub, b"m%d" % i, i + 2)
        p = next_publish(sub)
        got.append((p.payload, p.qos))
        sub.send(wire.PubAck(p.packet_id))
    assert got == [(b"m0", 1), (b"m1", 1), (b"m2", 1)]


def test_a_session_taken_over_between_two_messages_gets_the_next_once_on_its_new_connection(broker_factory,
                                                                                            tmp_path):
    b = broker_factory(config(tmp_path))
    old = subscriber(b, "moving", clean_start=False, properties={"session_expiry_interval": 60})
    pub = publisher(b)
    time.sleep(0.5)
    publish(pub, b"first", 1)
    p = next_publish(old)
    assert p.payload == b"first"
    old.send(wire.PubAck(p.packet_id))
    time.sleep(0.2)  # the PUBACK taken before the takeover
    new = Raw(b, wire.MQTT_5, timeout=10)
    ack = new.connect("moving", clean_start=False, properties={"session_expiry_interval": 60})
    assert ack.reason_code == 0 and ack.session_present
    time.sleep(0.5)  # its delivery caught up, waiting
    for i in range(3):
        publish(pub, b"next%d" % i, i + 2)
        p = next_publish(new)
        assert (p.payload, p.qos, p.dup) == (b"next%d" % i, 1, False)
        new.send(wire.PubAck(p.packet_id))
    new.send(wire.PingReq())
    assert isinstance(new.read(), wire.PingResp)  # nothing doubled before the answer


class _Conn:
    """What ``direct._plain`` reads of a connection, its write taking ``took`` bytes of each packet."""

    def __init__(self, took):
        self.took = took
        self.version = wire.MQTT_5
        self.client_max_packet = None
        self.inflight_window = 2
        self.written = []

    def try_send(self, data):
        self.written.append(data)
        return self.took(data)


def _session():
    session = MqttSession("c", wire.MQTT_5, 10)
    session.cursors[("t", 0)] = 5
    return session


def test_a_packet_id_whose_publish_was_not_written_is_given_back():
    m = stored_message("one/t", b"x", 1, "pub", None)
    session, conn = _session(), _Conn(lambda data: 0)  # the socket's buffer full
    assert not direct._plain(conn, session, ("t", 0), 5, m, False)
    assert not session.inflight and not session.where
    conn.took = len  # taken whole: in flight under the next id, the message's place kept
    assert direct._plain(conn, session, ("t", 0), 5, m, False)
    assert list(session.inflight.items()) == [(2, PUBLISH_SENT)] and session.where == {2: (1, "t", 0, 5)}
    assert conn.written[1] == wire.encode(wire.Publish("one/t", b"x", 1, False, False, 2, {}), wire.MQTT_5)
    conn.took = lambda data: 3  # begun: in flight, the cursor past it, the rest the connection's
    assert not direct._plain(conn, session, ("t", 0), 6, m, True)
    assert list(session.inflight) == [2, 3] and session.cursors[("t", 0)] == 7
    assert conn.written[2][0] == 0x33  # RETAIN as the decision said
    assert not direct._plain(conn, session, ("t", 0), 7, m, False)  # the window of 2 full: held, no id taken
    assert list(session.inflight) == [2, 3] and len(conn.written) == 3


def test_a_delivery_with_retained_messages_to_send_is_out_of_the_publishers_turn():
    """``MqttPort.deliver_now`` serves every delivery listed waiting: one given retained messages to send first
    leaves the list until its greenlet waits again, so nothing of a publisher's turn comes before them."""
    d = Delivery.__new__(Delivery)
    other = object()
    d.conn = SimpleNamespace(room=Event(), closed=True)
    d.port = SimpleNamespace(waiting={("t", 0): {d: None, other: None}, ("t", 1): {d: None}, ("u", 0): {other: None}})
    d.out = SimpleNamespace(session=SimpleNamespace(cursors={("t", 0): 1, ("t", 1): 0}))
    d.fan = SimpleNamespace(leave_all=lambda: None)
    d._retained, d._greenlet = [], None
    d.retained_after_suback([("r/#", 1)])
    assert d.port.waiting == {("t", 0): {other: None}, ("u", 0): {other: None}}
    assert d._retained == [("r/#", 1)] and d.conn.room.is_set()
