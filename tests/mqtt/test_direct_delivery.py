"""QoS 1 subscribers waiting caught up get a publisher's message from the publisher's own turn (docs/mqtt.md
"Subscribing"; ``MqttPort.deliver_now``, at most ``limits.MQTT_DIRECT_DELIVERIES`` of them per burst): each gets
every message once, in order, within its window in flight; the ones past the bound, and a subscriber that does not
read, get theirs from their own delivery, and the one that does not read holds the publisher up in nothing. A message
sent from the publisher's turn is the one the log gives back: its MQTT 5 properties, Subscription Identifiers,
RETAIN flag, expiry and size decided as for one read from the log."""

import socket
import time

import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.client.local import small_config
from metaq.mqtt import wire
from tests.harness.mqtt import Raw, mqtt_port, next_publish, with_mqtt

MESSAGES = 60


def config(tmp_path, flush="async"):
    """flush async: a stored message is visible at once, so the publisher's turn sends it; sync: after its flush,
    by the subscribers' own deliveries (as before)."""
    return with_mqtt(small_config(tmp_path / "data", store={"flush": flush}))


def subscriber(b, client_id, version=wire.MQTT_5, window=None):
    s = Raw(b, version, timeout=30)
    props = {"receive_maximum": window} if window else {}
    assert s.connect(client_id, properties=props).reason_code == 0
    s.send(wire.Subscribe(1, (wire.Subscription("direct/t", 1),)))
    assert isinstance(s.read(), wire.Suback)
    return s


def receive(s, n, ack=True):
    """The payloads of the next ``n`` PUBLISHes ``s`` reads (QoS 1, acknowledged when ``ack``)."""
    got = []
    while len(got) < n:
        p = s.read()
        assert p is not None, "closed after %d PUBLISHes" % len(got)
        if isinstance(p, wire.Publish):
            assert p.topic == "direct/t" and p.qos == 1 and not p.dup
            got.append(p.payload)
            if ack:
                s.send(wire.PubAck(p.packet_id))
    return got


def publish_one_at_a_time(pub, payloads):
    for i, payload in enumerate(payloads):
        pub.send(wire.Publish("direct/t", payload, 1, packet_id=i % 60000 + 1))
        ack = pub.read()
        assert isinstance(ack, wire.PubAck) and ack.reason_code == 0


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_every_waiting_subscriber_gets_each_message_once_in_order_at_the_bound_and_past_it(broker_factory, tmp_path,
                                                                                           flush):
    b = broker_factory(config(tmp_path, flush))
    n = mqtt_limits.MQTT_DIRECT_DELIVERIES + 1  # the bound's worth served from the publisher's turn, one past it not
    subs = [subscriber(b, "sub%d" % i, wire.MQTT_5 if i % 2 else wire.MQTT_311) for i in range(n)]
    pub = Raw(b, wire.MQTT_5, timeout=30)
    assert pub.connect("pub").reason_code == 0
    want = [b"%05d" % i for i in range(MESSAGES)]
    for k in range(0, MESSAGES, 10):  # one at a time, each subscriber reading as it comes
        publish_one_at_a_time(pub, want[k:k + 10])
        for s in subs:
            assert receive(s, 10) == want[k:k + 10]
    pub.send(wire.Publish("direct/t", b"last", 1, packet_id=9))
    for s in subs:
        assert receive(s, 1) == [b"last"]  # exactly once each: nothing doubled came before it


def test_a_full_window_waits_for_acknowledgements_and_goes_on_in_order(broker_factory, tmp_path):
    b = broker_factory(config(tmp_path))
    slow = subscriber(b, "slow", window=2)
    pub = Raw(b, wire.MQTT_5, timeout=30)
    assert pub.connect("pub").reason_code == 0
    want = [b"%05d" % i for i in range(10)]
    publish_one_at_a_time(pub, want)
    assert receive(slow, 2, ack=False) == want[:2]
    slow.sock.settimeout(0.5)
    try:
        extra = slow.read()
    except socket.timeout:
        extra = None
    assert extra is None, "a third PUBLISH in flight past a Receive Maximum of 2: %r" % (extra,)
    slow.sock.settimeout(30)
    for pid in (1, 2):
        slow.send(wire.PubAck(pid))
    assert receive(slow, 8) == want[2:]


def test_a_subscriber_that_does_not_read_holds_the_publisher_up_in_nothing(broker_factory, tmp_path):
    b = broker_factory(config(tmp_path))
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", mqtt_port(b)))
    stuck.sendall(wire.encode(wire.Connect(wire.MQTT_5, "stuck", keep_alive=0), wire.MQTT_5)
                  + wire.encode(wire.Subscribe(1, (wire.Subscription("direct/t", 1),)), wire.MQTT_5))
    reader = subscriber(b, "reader")
    time.sleep(0.5)  # both subscribed, waiting caught up
    pub = Raw(b, wire.MQTT_5, timeout=30)
    assert pub.connect("pub").reason_code == 0
    want = [b"%05d" % i + b"x" * (60 * 1024) for i in range(40)]  # far past what the stuck socket holds
    started = time.monotonic()
    publish_one_at_a_time(pub, want[:20])
    assert receive(reader, 20) == want[:20]
    publish_one_at_a_time(pub, want[20:])
    assert receive(reader, 20) == want[20:]
    assert time.monotonic() - started < 20
    stuck.close()


# Published in one write (one burst), then a retained one: MQTT 5 properties of every kind kept in a record, a
# Message Expiry Interval, a Topic Alias (delivery-only: not passed on), QoS 0 and 1, and one past a small Maximum
# Packet Size.
PROPERTIES = {"content_type": "text/plain", "response_topic": "direct/reply", "correlation_data": b"\x00\x01c",
              "payload_format_indicator": 1, "user_property": (("k", "v"), ("k", "w"), ("é", "ÿ"))}
BIG = b"B" * 600  # past SMALL_PACKET: dropped as delivered for the subscriber that set it


def _burst():
    return [wire.Publish("direct/t", b"plain", 1, False, False, 1, {}),
            wire.Publish("direct/t", b"props", 0, False, False, None, dict(PROPERTIES)),
            wire.Publish("direct/t", b"expiry", 1, False, False, 2, {"message_expiry_interval": 60}),
            wire.Publish("direct/t", b"alias", 1, False, False, 3, {"topic_alias": 1}),
            wire.Publish("", b"aliased", 0, False, False, None, {"topic_alias": 1}),
            wire.Publish("direct/t", BIG, 1, False, False, 4, {}),
            wire.Publish("direct/t", b"last", 1, False, False, 5, {"user_property": (("n", "1"),)})]


SMALL_PACKET = 300


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_subscriber_served_from_the_publishers_turn_gets_each_message_as_one_served_from_the_log(
        broker_factory, tmp_path, flush):
    """async: the waiting subscribers get the burst from the publisher's turn, from the PUBLISHes it has; sync: from
    the log, by their own deliveries. What each reads is the same: the MQTT 5 properties kept, the Subscription
    Identifiers of its matching subscriptions, RETAIN as its Retain As Published says, the expiry left, nothing past
    its Maximum Packet Size, nothing of its own with No Local."""
    b = broker_factory(config(tmp_path, flush))
    v5 = Raw(b, wire.MQTT_5, timeout=30)
    assert v5.connect("v5", properties={"maximum_packet_size": SMALL_PACKET}).reason_code == 0
    v5.send(wire.Subscribe(1, (wire.Subscription("direct/t", 1, retain_as_published=True),),
                           {"subscription_identifier": 7}))
    assert isinstance(v5.read(), wire.Suback)
    v5.send(wire.Subscribe(2, (wire.Subscription("direct/#", 0),), {"subscription_identifier": 9}))
    assert isinstance(v5.read(), wire.Suback)
    v311 = Raw(b, wire.MQTT_311, timeout=30)
    assert v311.connect("v311").reason_code == 0
    v311.send(wire.Subscribe(1, (wire.Subscription("direct/t", 1),)))
    assert isinstance(v311.read(), wire.Suback)
    pub = Raw(b, wire.MQTT_5, timeout=30)  # subscribed itself, No Local: gets none of its own
    assert pub.connect("pub").reason_code == 0
    pub.send(wire.Subscribe(9, (wire.Subscription("direct/t", 1, no_local=True),)))
    assert isinstance(pub.read(), wire.Suback)
    time.sleep(0.5)  # every delivery caught up, waiting
    pub.send_bytes(b"".join(wire.encode(p, wire.MQTT_5) for p in _burst()))
    pub.send(wire.Publish("direct/t", b"kept", 1, True, False, 6, {}))  # retained: stored alone, from the log
    acks = [pub.read() for _ in range(6)]
    assert [(a.packet_id, a.reason_code) for a in acks] == [(i, 0) for i in range(1, 7)]

    got = [next_publish(v5) for _ in range(7)]
    assert [(p.payload, p.qos, p.retain) for p in got] == [
        (b"plain", 1, False), (b"props", 0, False), (b"expiry", 1, False), (b"alias", 1, False),
        (b"aliased", 0, False), (b"last", 1, False), (b"kept", 1, True)]  # BIG: past its Maximum Packet Size
    for p in got:
        assert p.topic == "direct/t" and not p.dup
        assert sorted(p.properties.pop("subscription_identifier")) == [7, 9]
        if p.qos:
            v5.send(wire.PubAck(p.packet_id))
    assert got[1].properties == PROPERTIES
    assert 59 <= got[2].properties.pop("message_expiry_interval") <= 60
    assert got[5].properties == {"user_property": (("n", "1"),)}
    assert all(p.properties == {} for p in (got[0], got[2], got[3], got[4], got[6]))

    old = [next_publish(v311) for _ in range(8)]
    assert [(p.payload, p.qos, p.retain, p.properties) for p in old] == [
        (b"plain", 1, False, {}), (b"props", 0, False, {}), (b"expiry", 1, False, {}), (b"alias", 1, False, {}),
        (b"aliased", 0, False, {}), (BIG, 1, False, {}), (b"last", 1, False, {}), (b"kept", 1, False, {})]

    pub.send(wire.PingReq())
    assert isinstance(pub.read(), wire.PingResp)  # nothing of its own came before the answer


def test_a_session_subscribed_alone_and_in_a_shared_group_to_one_topic_gets_both_copies_at_once(broker_factory,
                                                                                                 tmp_path):
    """A session holding a subscription of its own and a shared one on the same partition: the publisher's turn
    sends the copy of its own subscription (its cursor then at the end), and the append still wakes its delivery
    for the group's copy, which waits on the same partition; neither copy waits for the delivery's timeout."""
    b = broker_factory(config(tmp_path))
    s = Raw(b, wire.MQTT_5, timeout=30)
    assert s.connect("both").reason_code == 0
    s.send(wire.Subscribe(1, (wire.Subscription("direct/t", 0),), {"subscription_identifier": 1}))
    assert isinstance(s.read(), wire.Suback)
    s.send(wire.Subscribe(2, (wire.Subscription("$share/g/direct/t", 0),), {"subscription_identifier": 2}))
    assert isinstance(s.read(), wire.Suback)
    pub = Raw(b, wire.MQTT_5, timeout=30)
    assert pub.connect("pub").reason_code == 0
    time.sleep(0.5)  # its delivery caught up, waiting
    rounds = 6
    started = time.monotonic()
    for i in range(rounds):
        payload = b"%05d" % i
        publish_one_at_a_time(pub, [payload])
        got = sorted((p.properties.get("subscription_identifier"), p.payload) for p in
                     (next_publish(s), next_publish(s)))
        assert got == [((1,), payload), ((2,), payload)]
    # each copy waiting for the delivery's own timeout (limits.MQTT_TOPIC_RESCAN_S) would take about a second a round
    assert time.monotonic() - started < rounds * mqtt_limits.MQTT_TOPIC_RESCAN_S / 2


@pytest.mark.parametrize("ack_first", [True, False])
def test_a_receive_maximum_of_one_gets_a_one_at_a_time_publishers_messages_in_order_without_waiting(
        broker_factory, tmp_path, ack_first):
    """A subscriber with Receive Maximum 1 and a publisher that waits for each PUBACK: its acknowledgement comes
    before the next message (the publisher's turn sends it: the ack found a window not full and woke nobody) or
    after it (the window full, the message held: the ack wakes the delivery, which sends it). Every message comes
    once, in order, and none waits for the delivery's timeout (``limits.MQTT_TOPIC_RESCAN_S`` each)."""
    b = broker_factory(config(tmp_path))
    sub = subscriber(b, "one", window=1)
    pub = Raw(b, wire.MQTT_5, timeout=30)
    assert pub.connect("pub").reason_code == 0
    time.sleep(0.5)  # its delivery caught up, waiting
    want = [b"%05d" % i for i in range(200)]
    got, held = [], None
    started = time.monotonic()
    for payload in want:
        publish_one_at_a_time(pub, [payload])
        if held is not None:
            sub.send(wire.PubAck(held))
        p = next_publish(sub)
        got.append(p.payload)
        if ack_first:
            sub.send(wire.PubAck(p.packet_id))
        else:
            held = p.packet_id
    assert got == want
    assert time.monotonic() - started < 20 * mqtt_limits.MQTT_TOPIC_RESCAN_S


def test_a_qos_2_subscriber_with_a_receive_maximum_of_one_gets_each_message_once_its_pubcomp_frees_the_window(
        broker_factory, tmp_path):
    """QoS 2 end to end, Receive Maximum 1, the subscriber ending each exchange (PUBREC, PUBREL, PUBCOMP) only after
    the next message was published: that message waits for the window, and the PUBCOMP that frees it wakes the
    delivery; nothing waits for the delivery's timeout."""
    b = broker_factory(config(tmp_path))
    sub = Raw(b, wire.MQTT_5, timeout=30)
    assert sub.connect("two", properties={"receive_maximum": 1}).reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription("direct/t", 2),)))
    assert isinstance(sub.read(), wire.Suback)
    pub = Raw(b, wire.MQTT_5, timeout=30)
    assert pub.connect("pub").reason_code == 0
    time.sleep(0.5)  # its delivery caught up, waiting
    want = [b"%05d" % i for i in range(60)]
    got, held = [], None
    started = time.monotonic()
    for i, payload in enumerate(want):
        pub.send(wire.Publish("direct/t", payload, 2, packet_id=i + 1))
        assert isinstance(pub.read(), wire.PubRec)
        pub.send(wire.PubRel(i + 1))
        assert isinstance(pub.read(), wire.PubComp)
        if held is not None:
            sub.send(wire.PubRec(held))
            assert sub.read() == wire.PubRel(held)
            sub.send(wire.PubComp(held))
        p = next_publish(sub)
        assert p.qos == 2 and not p.dup
        got.append(p.payload)
        held = p.packet_id
    assert got == want
    assert time.monotonic() - started < 10 * mqtt_limits.MQTT_TOPIC_RESCAN_S


def test_the_window_in_flight_is_each_connections_own_receive_maximum_under_mqtt_max_inflight(broker_factory,
                                                                                              tmp_path):
    """The window in flight (``Connection.inflight_window``) is made from each connection's own CONNECT: a session's
    first connection with a Receive Maximum of 1 is sent one message unacknowledged, its next one with 3 (the
    session resumed) three, a third with none said min(``mqtt.max_inflight``, 65535), here 4, both on the publisher's
    turn (``direct``) and in the delivery's greenlet. A window kept from an earlier connection fails this."""
    cfg = config(tmp_path)
    cfg["mqtt"]["max_inflight"] = 4
    b = broker_factory(cfg)
    pub = Raw(b, wire.MQTT_5, timeout=30)
    assert pub.connect("win-pub").reason_code == 0
    n = 0
    for window, want in ((1, 1), (3, 3), (None, 4)):
        sub = Raw(b, wire.MQTT_5, timeout=30)
        props = {"session_expiry_interval": 60}
        if window:
            props["receive_maximum"] = window
        assert sub.connect("win-sub", clean_start=n == 0, properties=props).reason_code == 0
        if n == 0:
            sub.send(wire.Subscribe(1, (wire.Subscription("direct/t", 1),)))
            assert isinstance(sub.read(), wire.Suback)
        time.sleep(0.3)  # its delivery caught up, waiting
        for _ in range(6):
            n += 1
            pub.send(wire.Publish("direct/t", b"%d" % n, 1, packet_id=n))
            assert isinstance(pub.read(), wire.PubAck)
        got = []
        sub.sock.settimeout(1.0)
        try:
            while True:
                p = sub.read()
                if isinstance(p, wire.Publish):
                    got.append(p)
        except OSError:
            pass
        assert len(got) == want, (window, [p.payload for p in got])
        sub.send(wire.Disconnect(0))
        sub.close()
        time.sleep(0.2)
