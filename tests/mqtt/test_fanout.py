"""Many subscribers of one topic: each gets every message once, in order, whatever the others do; a subscriber that
stops reading holds nobody up and, once it reads again, gets what it missed in order (docs/mqtt.md "Subscribing":
one reader per partition writes to every subscriber caught up on it; one whose socket is full reads on alone)."""

import socket
import time

from metaq.mqtt import wire
from metaq.protocol.stream import NEED_DATA
from tests.harness.mqtt import Raw, mqtt_config, mqtt_port

SUBSCRIBERS = 40
MESSAGES = 200


def subscriber(b, client_id, topic_filter, version=wire.MQTT_5, no_local=False):
    s = Raw(b, version, timeout=30)
    assert s.connect(client_id).reason_code == 0
    s.send(wire.Subscribe(1, (wire.Subscription(topic_filter, 0, no_local=no_local),)))
    assert isinstance(s.read(), wire.Suback)
    return s


def publishes(s, n):
    """The payloads of the next ``n`` PUBLISHes ``s`` reads (a PUBLISH past them would be read by the next call)."""
    got = []
    while len(got) < n:
        p = s.read()
        assert p is not None, "closed after %d PUBLISHes" % len(got)
        if isinstance(p, wire.Publish):
            assert p.topic == "fan/out" and p.qos == 0
            got.append(p.payload)
    return got


def test_many_subscribers_of_one_topic_each_get_every_message_in_order(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    subs = [subscriber(b, "sub%d" % i, "fan/out", wire.MQTT_5 if i % 2 else wire.MQTT_311)
            for i in range(SUBSCRIBERS)]
    wild = subscriber(b, "wild", "fan/+")
    pub = subscriber(b, "pub", "fan/out", no_local=True)  # its own messages are not for it
    want = [b"%05d" % i for i in range(MESSAGES)]
    for payload in want:
        pub.send(wire.Publish("fan/out", payload))
    for s in subs + [wild]:
        assert publishes(s, MESSAGES) == want
    marker = subscriber(b, "marker-pub", "nothing/here")
    marker.send(wire.Publish("fan/out", b"last"))
    for s in subs[:3]:
        assert publishes(s, 1) == [b"last"]  # exactly once each: nothing doubled came before it
    assert publishes(pub, 1) == [b"last"]  # No Local: the first it gets is another client's


def test_a_subscriber_that_stops_reading_holds_nobody_up_and_catches_up_in_order(broker_factory, tmp_path):
    """The stuck subscriber's socket takes the first messages (its share of the reader's writes, like everyone's),
    then is full: past that point it reads on alone from its own position while the others go on."""
    b = broker_factory(mqtt_config(tmp_path))
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", mqtt_port(b)))
    stuck.settimeout(30)
    stuck.sendall(wire.encode(wire.Connect(wire.MQTT_5, "stuck", keep_alive=0), wire.MQTT_5)
                  + wire.encode(wire.Subscribe(1, (wire.Subscription("fan/out", 0),)), wire.MQTT_5))
    readers = [subscriber(b, "reader%d" % i, "fan/out") for i in range(5)]
    pub = subscriber(b, "pub", "nothing/here")
    body = 40 * 1024  # 8 MB in all: past what the stuck socket and the broker's send buffer (4 MiB at most) hold
    want = [b"%05d" % i + b"x" * (body - 5) for i in range(MESSAGES)]
    started = time.monotonic()
    for payload in want:
        pub.send(wire.Publish("fan/out", payload))
    for s in readers:
        assert publishes(s, MESSAGES) == want
    assert time.monotonic() - started < 20
    parser = wire.MqttParser(wire.MQTT_5, sender="server")
    got = []
    while len(got) < MESSAGES:  # it reads now: everything, in order, once
        p = parser.next_event()
        if p is NEED_DATA:
            data = stuck.recv(1 << 16)
            assert data, "closed after %d PUBLISHes" % len(got)
            parser.receive_data(data)
        elif isinstance(p, wire.Publish):
            got.append(p.payload)
    assert [g[:5] for g in got] == [w[:5] for w in want] and got == want
    stuck.close()


def test_subscribers_decided_differently_each_get_their_own_from_one_read(broker_factory, tmp_path):
    """One reader's read holds many records (all published in one write); each subscriber's PUBLISHes are its own
    decisions: a Subscription Identifier carried, the messages past its Maximum Packet Size left out, MQTT 3.1.1's
    encoding, No Local, a second filter matching only some names; the plain ones share one write of them all."""
    b = broker_factory(mqtt_config(tmp_path))
    plain = [subscriber(b, "plain%d" % i, "fan/out") for i in range(6)]
    old = [subscriber(b, "old%d" % i, "fan/out", wire.MQTT_311) for i in range(2)]
    with_id = Raw(b, wire.MQTT_5, timeout=30)
    assert with_id.connect("with-id").reason_code == 0
    with_id.send(wire.Subscribe(1, (wire.Subscription("fan/out", 0),), {"subscription_identifier": 7}))
    assert isinstance(with_id.read(), wire.Suback)
    small = Raw(b, wire.MQTT_5, timeout=30)
    assert small.connect("small", properties={"maximum_packet_size": 200}).reason_code == 0
    small.send(wire.Subscribe(1, (wire.Subscription("fan/out", 0),)))
    assert isinstance(small.read(), wire.Suback)
    pub = subscriber(b, "pub", "fan/out", no_local=True)
    want = [b"%05d" % i + (b"L" * 300 if i % 7 == 3 else b"") for i in range(MESSAGES)]
    pub.send_bytes(b"".join(wire.encode(wire.Publish("fan/out", p), wire.MQTT_5) for p in want))
    for s in plain + old:
        assert publishes(s, MESSAGES) == want
    got = []
    while len(got) < MESSAGES:
        p = with_id.read()
        assert isinstance(p, wire.Publish) and p.properties.get("subscription_identifier") == (7,)
        got.append(p.payload)
    assert got == want
    fitting = [w for w in want if len(w) < 100]
    assert publishes(small, len(fitting)) == fitting  # the large ones dropped, the rest in order
    pub.send(wire.Publish("fan/out", b"mine"))
    pub.send(wire.PingReq())
    assert isinstance(pub.read(), wire.PingResp)  # "mine" is stored before "last" is sent
    marker = subscriber(b, "marker-pub", "nothing/here")
    marker.send(wire.Publish("fan/out", b"last"))
    for s in plain[:2] + old[:1] + [small]:
        assert publishes(s, 2) == [b"mine", b"last"]
    assert publishes(pub, 1) == [b"last"]  # No Local: none of its own, from the burst or after
