"""The one-step turns fall back to the general path where they must (docs/mqtt.md): a publisher's read of plain
PUBLISHes (``Publishes.read``) leaves a QoS 2 or retained PUBLISH among them to the general path, in its place; a
subscriber's read of PUBACKs (``Subscriptions.read_pubacks``) leaves a PUBREC after them to it; a burst's PUBACKs
are written from the reader's turn only when they may go at once (``Acknowledgements.pubacks``), else queued for the
writer, which waits for the burst's durability first; and a produce rate given between two messages paces the reads
of a connection that lingers between its PUBLISHes (``Connection.receive``)."""

import socket
import time
from types import SimpleNamespace

import gevent
import gevent.socket
import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt import wire
from metaq.mqtt.connection import Connection
from metaq.serving.connections import ConnectionLimits
from tests.harness.acl import SECRETS, reload_user, secured_config
from tests.harness.mqtt import Raw, mqtt_config, with_mqtt


@pytest.fixture(scope="module")
def mqtt_broker(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("mqtt-fallbacks")
    b = BrokerProcess(wd, mqtt_config(wd)).start()
    yield b
    b.kill()


def _publish(name, body, qos, packet_id=None, retain=False):
    return wire.encode(wire.Publish(name, body, qos, retain, False, packet_id), wire.MQTT_5)


def _staged(b, client_id, name, **connect):
    """A connection that published once to ``name``: its next reads of plain PUBLISHes to it take the one-step turn
    (its staging plan and write decision kept)."""
    raw = Raw(b)
    assert raw.connect(client_id, **connect).reason_code == 0
    raw.send_bytes(_publish(name, b"first", 1, 1))
    assert raw.read() == wire.PubAck(1)
    return raw


@pytest.mark.integration
def test_a_qos2_and_a_retained_publish_among_plain_ones_take_the_general_path_in_their_place(mqtt_broker):
    """One read: QoS 1, QoS 2, QoS 1, a retained QoS 1, QoS 0, QoS 1 PUBLISHes of a name staged before. The plain ones
    are the one-step turn's; the QoS 2 one is answered PUBREC (the general path's answer: the one-step turn stores and
    acknowledges only QoS 0 and 1), the retained one is kept as the name's retained message (the one-step turn never
    stores one retained), each in its place; a subscriber sees every message once, in order."""
    name = "fallback/q2"
    sub = Raw(mqtt_broker)
    assert sub.connect("fallback-q2-sub").reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription(name, 2),)))
    assert isinstance(sub.read(), wire.Suback)
    pub = _staged(mqtt_broker, "fallback-q2-pub", name)
    assert sub.read().payload == b"first"
    pub.send_bytes(_publish(name, b"a", 1, 2) + _publish(name, b"b", 2, 3) + _publish(name, b"c", 1, 4)
                   + _publish(name, b"kept", 1, 5, retain=True) + _publish(name, b"d", 0) + _publish(name, b"e", 1, 6))
    assert [pub.read() for _ in range(5)] == [wire.PubAck(2), wire.PubRec(3), wire.PubAck(4), wire.PubAck(5),
                                              wire.PubAck(6)]
    pub.send(wire.PubRel(3))
    assert pub.read() == wire.PubComp(3)
    got = []
    while len(got) < 6:
        p = sub.read()
        if isinstance(p, wire.PubRel):
            sub.send(wire.PubComp(p.packet_id))
            continue
        got.append(p.payload)
        if p.qos == 1:
            sub.send(wire.PubAck(p.packet_id))
        elif p.qos == 2:
            sub.send(wire.PubRec(p.packet_id))
    assert got == [b"a", b"b", b"c", b"kept", b"d", b"e"]
    late = Raw(mqtt_broker)
    assert late.connect("fallback-q2-late").reason_code == 0
    late.send(wire.Subscribe(1, (wire.Subscription(name, 1),)))
    assert isinstance(late.read(), wire.Suback)
    retained = late.read()
    assert (retained.payload, retained.retain) == (b"kept", True)
    for raw in (sub, pub, late):
        raw.close()


@pytest.mark.integration
def test_a_pubrec_after_pubacks_in_one_read_takes_the_general_path(mqtt_broker):
    """A subscriber's read of a PUBACK and a PUBREC: the PUBACK ends its message in one step, the PUBREC is the
    general path's (answered PUBREL: the one-step turn takes only PUBACKs), in its place. With a window of 2, the next
    two messages are delivered once both ended."""
    sub = Raw(mqtt_broker)
    assert sub.connect("fallback-rec-sub", properties={"receive_maximum": 2}).reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription("fallback/one", 1), wire.Subscription("fallback/two", 2))))
    assert isinstance(sub.read(), wire.Suback)
    pub = Raw(mqtt_broker)
    assert pub.connect("fallback-rec-pub").reason_code == 0
    pub.send_bytes(_publish("fallback/one", b"one", 1, 1))
    assert pub.read() == wire.PubAck(1)
    pub.send_bytes(_publish("fallback/two", b"two", 2, 2))
    assert pub.read() == wire.PubRec(2)
    pub.send(wire.PubRel(2))
    assert pub.read() == wire.PubComp(2)
    one, two = sub.read(), sub.read()
    assert (one.payload, one.qos, two.payload, two.qos) == (b"one", 1, b"two", 2)
    sub.send_bytes(wire.encode(wire.PubAck(one.packet_id), wire.MQTT_5)
                   + wire.encode(wire.PubRec(two.packet_id), wire.MQTT_5))
    assert sub.read() == wire.PubRel(two.packet_id)
    sub.send(wire.PubComp(two.packet_id))
    pub.send_bytes(_publish("fallback/one", b"three", 1, 3) + _publish("fallback/one", b"four", 1, 4))
    assert [pub.read(), pub.read()] == [wire.PubAck(3), wire.PubAck(4)]
    assert [p.payload for p in (sub.read(), sub.read())] == [b"three", b"four"]
    sub.close()
    pub.close()


def _connection(durable):
    ours, theirs = socket.socketpair()
    port = SimpleNamespace(settings=SimpleNamespace(max_packet_bytes=mqtt_limits.MQTT_MAX_PACKET_BYTES,
                                                   max_inflight=mqtt_limits.MQTT_MAX_INFLIGHT), put_path=None,
                           burst_durable=durable, core=SimpleNamespace(rules=ConnectionLimits(60, 60)))
    conn = Connection(gevent.socket.socket(fileno=ours.detach()), ("127.0.0.1", 1), 1, port)
    return conn, gevent.socket.socket(fileno=theirs.detach())


def test_a_bursts_pubacks_that_must_wait_are_queued_for_the_writer_not_written_at_once():
    """``Acknowledgements.pubacks`` writes at once only PUBACKs that may go at once with nothing queued before them;
    a burst whose acknowledgement waits (its durability: ``wait`` given) goes to the writer, which writes it only
    once ``burst_durable`` returned, and a burst after it, though it may go at once, waits behind it."""
    asked = []

    def durable(*wait):
        asked.append(wait)
        gevent.sleep(0.1)  # a flush under way

    conn, peer = _connection(durable)
    acks = conn.acks
    acks.unacked = 3
    first, second = wire.encode_pubacks([1, 2]), wire.encode_pubacks([3])
    acks.pubacks(first, ("keys", 10, 0, 0))
    assert acks.writing and acks.pending == 1 and not asked  # queued: nothing written from the reader's turn
    acks.pubacks(second)  # may go at once, but after the first
    assert acks.pending == 2
    peer.settimeout(0.05)
    with pytest.raises(socket.timeout):
        peer.recv(16)  # nothing before the first burst is durable
    peer.settimeout(5)
    got = b""
    while len(got) < len(first + second):
        got += peer.recv(64)
    assert got == first + second and asked == [("keys", 10, 0, 0)]
    gevent.sleep(0.01)
    assert acks.unacked == 0 and acks.pending == 0 and not acks.writing
    acks.unacked = 1
    acks.pubacks(wire.encode_pubacks([4]))  # nothing queued now: written at once, no writer
    assert not acks.writing and acks.pending == 0 and acks.unacked == 0
    assert peer.recv(16) == wire.encode_pubacks([4])
    conn.close()
    peer.close()


@pytest.mark.integration
def test_a_produce_rate_given_between_two_messages_paces_the_next_reads(broker_factory, tmp_path):
    """A publisher lingering between its PUBLISHes (the one-step turn, its reads at once after each linger): once a
    reload gives its user a produce rate of a few bytes a second, its next PUBLISHes wait for the rate instead of all
    being read and acknowledged at once."""
    config = with_mqtt(secured_config(tmp_path))
    config["store"]["flush"] = "async"
    b = broker_factory(config)
    pub = _staged(b, "fallback-rate", "orders/a", username="alice", password=SECRETS["alice"].encode())
    for packet_id in (2, 3):  # a busy connection: read at once after its linger
        pub.send_bytes(_publish("orders/a", b"fast", 1, packet_id))
        assert pub.read() == wire.PubAck(packet_id)
    reload_user(b, tmp_path, "alice", quotas={"produce_bytes_per_s": 64})
    started = time.monotonic()
    for packet_id in (4, 5, 6):
        pub.send_bytes(_publish("orders/a", b"x" * 100, 1, packet_id))
    assert [pub.read() for _ in range(3)] == [wire.PubAck(4), wire.PubAck(5), wire.PubAck(6)]
    assert time.monotonic() - started >= 1.5  # 300 bytes and more at 64 a second
    pub.close()
