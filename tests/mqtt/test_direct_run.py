"""A run of plain QoS 1 messages sent from a publisher's turn in one step (``direct.deliver_now`` through
``direct.direct_publishes``: packet ids, their place in flight, the PUBLISHes and one write) and the records it leaves
to the general path (``direct._plain``, ``direct._send``), on a real broker with ``flush: async``, where a
publisher's read sends to a subscriber waiting caught up (docs/mqtt.md "Subscribing"). Each burst below is one write
of the publisher's, so its PUBLISHes are one run; what only the general path makes (a message's properties, QoS 0,
a Subscription Identifier) shows it ran for the records the one step leaves, in their order among the others. The
session a takeover or a restart reads after a one-step delivery is the one the general path leaves: the message
unacknowledged comes again, with DUP, and nothing after it twice."""

import time

import pytest

from metaq.client.local import small_config
from metaq.mqtt import wire
from tests.harness.mqtt import Raw, next_publish, with_mqtt

HOUR = {"session_expiry_interval": 3600}


def config(tmp_path, **mqtt):
    return with_mqtt(small_config(tmp_path / "data", store={"flush": "async"}), **mqtt)


def subscriber(b, client_id, filters=(("one/#", 1),), version=wire.MQTT_5, properties=None, ids=None, **connect):
    s = Raw(b, version, timeout=10)
    ack = s.connect(client_id, properties=dict(properties or {}), **connect)
    assert ack.reason_code == 0, ack
    s.send(wire.Subscribe(1, tuple(wire.Subscription(f, qos) for f, qos in filters),
                          {"subscription_identifier": ids} if ids else {}))
    assert isinstance(s.read(), wire.Suback)
    return s


def publisher(b, version=wire.MQTT_5):
    pub = Raw(b, version, timeout=10)
    assert pub.connect("pub").reason_code == 0
    return pub


def burst(pub, packets):
    """``packets`` (PUBLISHes) in one write; their acknowledgements read."""
    pub.send_bytes(b"".join(wire.encode(p, pub.version) for p in packets))
    for p in packets:
        if p.qos:
            ack = pub.read()
            assert isinstance(ack, wire.PubAck) and ack.reason_code == 0, ack


def plain(name, payload, packet_id):
    return wire.Publish(name, payload, 1, packet_id=packet_id)


def received(sub, n, ack=True):
    got = []
    for _ in range(n):
        p = next_publish(sub)
        got.append(p)
        if ack and p.qos:
            sub.send(wire.PubAck(p.packet_id))
    return got


@pytest.mark.parametrize("version", [wire.MQTT_311, wire.MQTT_5])
def test_a_burst_of_plain_messages_goes_out_whole_in_order_with_distinct_packet_ids(broker_factory, tmp_path,
                                                                                   version):
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "many", version=version)
    pub = publisher(b, version)
    time.sleep(0.5)  # its delivery caught up, waiting
    for round_ in range(3):
        burst(pub, [plain("one/t", b"r%d-%d" % (round_, k), 1 + k) for k in range(20)])
        got = received(sub, 20, ack=False)
        assert [(p.payload, p.qos, p.dup) for p in got] == [(b"r%d-%d" % (round_, k), 1, False) for k in range(20)]
        assert len({p.packet_id for p in got}) == 20
        for p in got:
            sub.send(wire.PubAck(p.packet_id))
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)  # nothing more, nothing twice


def test_records_the_one_step_does_not_take_go_the_general_way_in_their_order(broker_factory, tmp_path):
    """A burst of plain messages with, among them, one carrying properties, one at QoS 0, and the first of a name not
    matched before: each gets what only the general path makes (its properties, QoS 0), and all come in order."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "mixed")
    pub = publisher(b)
    time.sleep(0.5)
    burst(pub, [plain("one/t", b"warm", 1)])
    assert [p.payload for p in received(sub, 1)] == [b"warm"]
    packets = [plain("one/t", b"a", 2),
               wire.Publish("one/t", b"props", 1, packet_id=3, properties={"user_property": (("k", "v"),)}),
               plain("one/t", b"b", 4),
               wire.Publish("one/t", b"zero", 0),
               plain("one/t", b"c", 5),
               plain("one/new", b"first of its name", 6),
               plain("one/new", b"second of its name", 7)]
    burst(pub, packets)
    got = received(sub, len(packets))
    assert [(p.topic, p.payload, p.qos) for p in got] == [(q.topic, q.payload, q.qos) for q in packets]
    assert got[1].properties.get("user_property") == (("k", "v"),)
    assert len({p.packet_id for p in got if p.qos}) == 6


def test_a_full_window_leaves_the_rest_of_the_run_to_the_delivery(broker_factory, tmp_path):
    """Receive Maximum 2 and a burst of 5: two go from the publisher's turn, the others as acknowledgements make
    room, each once, in order."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "narrow", properties={"receive_maximum": 2})
    pub = publisher(b)
    time.sleep(0.5)
    burst(pub, [plain("one/t", b"m%d" % k, 1 + k) for k in range(5)])
    first = received(sub, 2, ack=False)
    assert [p.payload for p in first] == [b"m0", b"m1"]
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)  # no third before an acknowledgement
    for p in first:
        sub.send(wire.PubAck(p.packet_id))
    assert [p.payload for p in received(sub, 3)] == [b"m2", b"m3", b"m4"]


def test_a_subscription_changed_between_two_runs_applies_to_the_next(broker_factory, tmp_path):
    """The names a publisher's turn sends in one step are dropped with the session's subscriptions: the same filter
    subscribed again at QoS 0, then with a Subscription Identifier, then removed, each applies to the very next
    message (sent at QoS 0, carrying the identifier, not at all)."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "changing", filters=(("one/t", 1), ("one/other", 1)))
    pub = publisher(b)
    time.sleep(0.5)
    burst(pub, [plain("one/t", b"a", 1)])
    assert [(p.payload, p.qos) for p in received(sub, 1)] == [(b"a", 1)]
    sub.send(wire.Subscribe(2, (wire.Subscription("one/t", 0),)))
    assert isinstance(next_suback(sub), wire.Suback)
    time.sleep(0.3)
    burst(pub, [plain("one/t", b"b", 2)])
    assert [(p.payload, p.qos) for p in received(sub, 1)] == [(b"b", 0)]
    sub.send(wire.Subscribe(3, (wire.Subscription("one/t", 1),), {"subscription_identifier": 7}))
    assert isinstance(next_suback(sub), wire.Suback)
    time.sleep(0.3)
    burst(pub, [plain("one/t", b"c", 3)])
    [p] = received(sub, 1)
    assert (p.payload, p.qos, p.properties.get("subscription_identifier")) == (b"c", 1, (7,))
    sub.send(wire.Unsubscribe(4, ("one/t",)))
    assert isinstance(next_suback(sub), wire.Unsuback)
    time.sleep(0.3)
    burst(pub, [plain("one/t", b"d", 4), plain("one/other", b"e", 5)])
    assert [p.payload for p in received(sub, 1)] == [b"e"]


def next_suback(sub):
    while True:
        p = sub.read()
        assert p is not None, "closed"
        if isinstance(p, (wire.Suback, wire.Unsuback)):
            return p


def test_a_takeover_right_after_a_one_step_delivery_gets_the_message_again_with_dup(broker_factory, tmp_path):
    b = broker_factory(config(tmp_path))
    old = subscriber(b, "moving", clean_start=False, properties=HOUR)
    pub = publisher(b)
    time.sleep(0.5)
    burst(pub, [plain("one/t", b"m0", 1), plain("one/t", b"m1", 2)])
    m0, m1 = received(old, 2, ack=False)
    old.send(wire.PubAck(m0.packet_id))  # m1 never acknowledged
    time.sleep(0.2)
    new = Raw(b, wire.MQTT_5, timeout=10)
    ack = new.connect("moving", clean_start=False, properties=HOUR)
    assert ack.reason_code == 0 and ack.session_present
    again = next_publish(new)
    assert (again.payload, again.dup, again.packet_id, again.qos) == (b"m1", True, m1.packet_id, 1)
    new.send(wire.PubAck(again.packet_id))
    time.sleep(0.5)  # its delivery caught up, waiting
    burst(pub, [plain("one/t", b"m2", 3)])
    [m2] = received(new, 1)
    assert (m2.payload, m2.dup) == (b"m2", False)
    new.send(wire.PingReq())
    assert isinstance(new.read(), wire.PingResp)  # nothing twice


@pytest.mark.slow
def test_a_clean_restart_after_a_one_step_delivery_sends_the_message_again_with_dup(broker_factory, tmp_path):
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "staying", clean_start=False, properties=HOUR)
    pub = publisher(b)
    time.sleep(0.5)
    burst(pub, [plain("one/t", b"m0", 1), plain("one/t", b"m1", 2)])
    m0, m1 = received(sub, 2, ack=False)
    sub.send(wire.PubAck(m0.packet_id))
    time.sleep(0.3)
    pub.send(wire.Disconnect())
    b.stop()  # the session written as it stands: m1 in flight, the cursor past both
    b.start()
    again = Raw(b, wire.MQTT_5, timeout=10)
    ack = again.connect("staying", clean_start=False, properties=HOUR)
    assert ack.reason_code == 0 and ack.session_present
    p = next_publish(again)
    assert (p.payload, p.dup, p.packet_id) == (b"m1", True, m1.packet_id)
    again.send(wire.PubAck(p.packet_id))
    again.send(wire.PingReq())
    assert isinstance(again.read(), wire.PingResp)  # m0 not again, nothing new


def test_a_message_past_the_maximum_packet_size_within_a_run_is_skipped_and_the_run_goes_on(broker_factory,
                                                                                             tmp_path):
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "small", properties={"maximum_packet_size": 300})
    pub = publisher(b)
    time.sleep(0.5)
    burst(pub, [plain("one/t", b"warm", 1)])  # its name's match kept: the runs below go in one step
    assert [p.payload for p in received(sub, 1)] == [b"warm"]
    burst(pub, [plain("one/t", b"a", 2), plain("one/t", b"B" * 600, 3), plain("one/t", b"c", 4)])
    assert [p.payload for p in received(sub, 2)] == [b"a", b"c"]
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)


@pytest.mark.slow
def test_a_run_the_socket_takes_part_of_is_finished_whole_in_order_once_the_client_reads(broker_factory, tmp_path):
    """A subscriber that does not read: the one step's write is cut inside a PUBLISH (its rest written first by the
    connection, the PUBLISHes after it given back to the delivery); read at last, every message comes whole, once,
    in order."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "slow")
    pub = publisher(b)
    time.sleep(0.5)
    burst(pub, [plain("one/t", b"warm", 1)])
    assert [p.payload for p in received(sub, 1)] == [b"warm"]
    payloads = [bytes([65 + k]) * 200_000 for k in range(40)]  # past what the kernel holds of both sockets
    for k in range(0, 40, 4):
        burst(pub, [plain("one/t", payloads[j], 2 + j) for j in range(k, k + 4)])
    got = received(sub, 40)
    assert [p.payload for p in got] == payloads and not any(p.dup for p in got)
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)
