"""Topic aliases from the broker (MQTT 5.0 §3.3.2.3.4; docs/mqtt.md "Topic aliases"): a client whose CONNECT allows
them (Topic Alias Maximum > 0) is sent an alias for a topic name at its first delivery while one is free, within its
maximum and ``mqtt.max_outbound_aliases``, the least recently used reassigned (its name sent again) when all are
taken, from a name's second delivery; a
client that allows none never gets one; aliases are per connection. And the broker's keep-alive bound
(``mqtt.max_keep_alive_s``): MQTT 5 told a Server Keep Alive, MQTT 3.1.1 refused past it."""

import socket
import time

import pytest

from metaq.mqtt import wire
from metaq.protocol.stream import NEED_DATA
from metaq.client.local import BrokerProcess
from tests.harness.mqtt import V5, Paho, Raw, mqtt_config, mqtt_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def b(tmp_path_factory):
    wd = tmp_path_factory.mktemp("mqtt-aliases")
    broker = BrokerProcess(wd, mqtt_config(wd)).start()
    yield broker
    broker.kill()


class Resolver:
    """The client's side of the broker's topic aliases, kept as MQTT 5.0 §3.3.2.3.4 says a receiver keeps them: the
    topic of each PUBLISH; an alias past ``most`` or used before it was set fails the test."""

    def __init__(self, most):
        self.most = most
        self.names = {}
        self.used = set()  # aliases seen, set or used

    def topic(self, name, alias):
        if alias is None:
            assert name, "an empty topic name without an alias"
            return name
        assert 1 <= alias <= self.most, "alias %d past the client's maximum of %d" % (alias, self.most)
        self.used.add(alias)
        if name:
            self.names[alias] = name
            return name
        assert alias in self.names, "alias %d used before it was set" % alias
        return self.names[alias]


def subscriber(b, client_id, topic_filter, most=None, qos=0, version=wire.MQTT_5, **connect):
    s = Raw(b, version, timeout=30)
    props = dict(connect.pop("properties", {}))
    if most is not None:
        props["topic_alias_maximum"] = most
    ack = s.connect(client_id, properties=props, **connect)
    assert ack.reason_code == 0, ack
    s.send(wire.Subscribe(1, (wire.Subscription(topic_filter, qos),)))
    assert isinstance(s.read(), wire.Suback)
    return s


def next_publish(s):
    while True:
        p = s.read()
        assert p is not None, "closed"
        if isinstance(p, wire.Publish):
            if p.qos == 1:
                s.send(wire.PubAck(p.packet_id))
            return p


def form(p):
    """How a PUBLISH names its topic: ``(name, alias)``, the alias None when it has none."""
    return p.topic, p.properties.get("topic_alias")


#: One delivery at a time of these names, and how each must come with two aliases at most: a name's first delivery
#: sets a free alias (name and alias), the next use it alone; a name past the two gets none at its first delivery,
#: and at its second the least recently used one's, its name sent with it; a name whose alias was taken starts over.
STEPS = [("al/a", ("al/a", 1)), ("al/a", ("", 1)), ("al/a", ("", 1)),
         ("al/b", ("al/b", 2)), ("al/b", ("", 2)),
         ("al/a", ("", 1)),  # al/a used last: al/b is now the least recently used
         ("al/c", ("al/c", None)), ("al/c", ("al/c", 2)),  # one past the maximum: al/b's alias goes to al/c
         ("al/c", ("", 2)), ("al/b", ("al/b", None)), ("al/a", ("", 1)),
         ("al/b", ("al/b", 2)), ("al/b", ("", 2)),  # al/c least recently used: its alias goes to al/b
         ("al/c", ("al/c", None)), ("al/a", ("", 1))]  # al/c starts over


@pytest.mark.parametrize("client_most, broker_most", [(2, 64), (100, 2)], ids=["client-maximum", "broker-limit"])
def test_a_name_gets_a_free_alias_at_its_first_delivery_and_the_least_recently_used_is_reassigned(
        broker_factory, tmp_path, client_most, broker_most):
    b = broker_factory(mqtt_config(tmp_path, max_outbound_aliases=broker_most))
    sub = subscriber(b, "aliased", "al/#", most=client_most, qos=1)
    pub = subscriber(b, "pub", "nothing/here")
    resolver = Resolver(client_most)
    for i, (name, want) in enumerate(STEPS):
        payload = b"%d" % i
        pub.send(wire.Publish(name, payload, 1, packet_id=i + 1))
        p = next_publish(sub)
        assert (form(p), p.payload) == (want, payload), "step %d" % i
        assert resolver.topic(*form(p)) == name
    assert resolver.used == {1, 2}  # at the limit, never one past it


def test_a_client_that_allows_no_aliases_never_gets_one(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path, max_outbound_aliases=0))
    quiet = subscriber(b, "off-at-the-broker", "na/#", most=8)  # the broker sends none: mqtt.max_outbound_aliases 0
    subs = [subscriber(b, "none-asked", "na/#"), subscriber(b, "zero", "na/#", most=0),
            subscriber(b, "old", "na/#", version=wire.MQTT_311)]
    b2 = broker_factory(mqtt_config(tmp_path / "b2"))
    subs2 = [subscriber(b2, "none-asked", "na/#"), subscriber(b2, "zero", "na/#", most=0),
             subscriber(b2, "old", "na/#", version=wire.MQTT_311)]
    for broker, readers in ((b, subs + [quiet]), (b2, subs2)):
        pub = subscriber(broker, "pub", "nothing/here")
        want = [("na/%d" % (i % 3), b"%d" % i) for i in range(30)]
        for name, payload in want:
            pub.send(wire.Publish(name, payload))
        for s in readers:
            got = [next_publish(s) for _ in want]
            assert all("topic_alias" not in p.properties for p in got)
            assert sorted((p.topic, p.payload) for p in got) == sorted(want)


def test_aliases_are_per_connection_and_start_empty_after_a_resume(b):
    sub = subscriber(b, "resumed", "rs/#", most=4, qos=1, clean_start=False,
                     properties={"session_expiry_interval": 600})
    pub = subscriber(b, "rs-pub", "nothing/here")
    for i in range(3):
        pub.send(wire.Publish("rs/x", b"%d" % i, 1, packet_id=i + 1))
        assert form(next_publish(sub)) == [("rs/x", 1), ("", 1), ("", 1)][i]
    sub.send(wire.Disconnect(wire.SUCCESS))
    sub.close()
    again = Raw(b, timeout=30)
    ack = again.connect("resumed", clean_start=False, properties={"topic_alias_maximum": 4,
                                                                  "session_expiry_interval": 600})
    assert ack.session_present
    for i in range(3, 6):
        pub.send(wire.Publish("rs/x", b"%d" % i, 1, packet_id=i + 1))
        p = next_publish(again)
        assert p.payload == b"%d" % i
        assert form(p) == [("rs/x", 1), ("", 1), ("", 1)][i - 3]  # the new connection starts empty
    other = subscriber(b, "other", "rs/#", most=4)  # another connection's table is its own
    pub.send(wire.Publish("rs/x", b"6", 1, packet_id=7))
    assert form(next_publish(other)) == ("rs/x", 1)
    assert form(next_publish(again)) == ("", 1)


def _resolved_paho(client, most):
    resolver = Resolver(most)
    return [(resolver.topic(m.topic, getattr(m.properties, "TopicAlias", None)), m.payload)
            for m in client.messages]


def test_paho_gets_the_right_topics(b):
    """paho-mqtt 2 hands an alias sent alone to the application with an empty topic and the alias among the
    properties (it keeps no table): resolved here as MQTT 5.0 §3.3.2.3.4 says, every topic is the one published."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)
    props.TopicAliasMaximum = 3
    client = Paho(b, "paho-aliases", version=V5, properties=props)
    client.subscribe("pa/#", qos=1)
    pub = subscriber(b, "pa-pub", "nothing/here")
    want = [("pa/%s" % ("abc" if i < 20 else "def")[i % 3], b"%02d" % i) for i in range(40)]  # d, e, f take theirs
    for i, (name, payload) in enumerate(want):
        pub.send(wire.Publish(name, payload, 1, packet_id=i + 1))
        assert isinstance(pub.read(), wire.PubAck)
    assert len(client.wait_messages(40)) == 40
    got = _resolved_paho(client, 3)
    assert sorted(got) == sorted(want)
    assert any(not m.topic for m in client.messages)  # sent by their alias alone
    assert len({m.properties.TopicAlias for m in client.messages if hasattr(m.properties, "TopicAlias")}) == 3


def _collect(s, n, resolver):
    got = []
    aliased = 0
    while len(got) < n:
        p = next_publish(s)
        alias = p.properties.get("topic_alias")
        if alias is not None and not p.topic:
            aliased += 1
        got.append((resolver.topic(p.topic, alias) if resolver else p.topic, p.payload))
    return got, aliased


def _in_order_per_name(got, want):
    for name in {n for n, _p in want}:
        assert [p for n, p in got if n == name] == [p for n, p in want if n == name], name


def test_one_message_fanned_out_to_many_subscribers_some_with_aliases_reaches_each_right(broker_factory, tmp_path):
    """The plain subscribers share one encoding and one write of each run; those with aliases get their own, each
    alias decided per connection; all of them caught up, read by the partition's one reader."""
    b = broker_factory(mqtt_config(tmp_path))
    aliased = [subscriber(b, "aliased%d" % i, "fo/#", most=1 + i % 3) for i in range(6)]
    plain = [subscriber(b, "plain%d" % i, "fo/#") for i in range(6)]
    old = [subscriber(b, "old%d" % i, "fo/#", version=wire.MQTT_311) for i in range(2)]
    pub = subscriber(b, "pub", "nothing/here")
    want = [("fo/%s" % "pqrs"[i % 4], b"%05d" % i) for i in range(200)]
    for start in range(0, len(want), 50):  # bursts of 50: each read of a reader holds many records
        pub.send_bytes(b"".join(wire.encode(wire.Publish(n, p), wire.MQTT_5) for n, p in want[start:start + 50]))
        pub.send(wire.PingReq())
        assert isinstance(pub.read(), wire.PingResp)
    for i, s in enumerate(aliased):
        got, by_alias = _collect(s, len(want), Resolver(1 + i % 3))
        assert sorted(got) == sorted(want)
        _in_order_per_name(got, want)
        assert by_alias >= 20  # the busiest names came by their alias alone
    for s in plain + old:
        got, by_alias = _collect(s, len(want), None)
        assert by_alias == 0 and sorted(got) == sorted(want)
        _in_order_per_name(got, want)


def _stuck(b, client_id, topic_filter, most):
    """A subscriber whose socket takes little and that does not read (yet)."""
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", mqtt_port(b)))
    stuck.settimeout(30)
    stuck.sendall(wire.encode(wire.Connect(wire.MQTT_5, client_id, properties={"topic_alias_maximum": most}),
                              wire.MQTT_5)
                  + wire.encode(wire.Subscribe(1, (wire.Subscription(topic_filter, 0),)), wire.MQTT_5))
    return stuck


def _read_all(stuck, n, resolver):
    parser = wire.MqttParser(wire.MQTT_5, sender="server")
    got = []
    while len(got) < n:
        p = parser.next_event()
        if p is NEED_DATA:
            data = stuck.recv(1 << 16)
            assert data, "closed after %d PUBLISHes" % len(got)
            parser.receive_data(data)
        elif isinstance(p, wire.Publish):
            got.append((resolver.topic(*form(p)), p.payload))
    return got


def test_stuck_subscribers_with_aliases_catch_up_with_every_topic_right(broker_factory, tmp_path):
    """Their sockets full, the PUBLISHes not written have their alias decisions taken back: once they read again,
    each alias sent alone was set before, by a PUBLISH they got, to the name it stands for. Each name is delivered
    three times in a row (past the 16 free aliases: its name, its alias set, its alias alone, a third of the
    PUBLISHes reassigning an alias), so where a socket fills, decisions are among those not written."""
    b = broker_factory(mqtt_config(tmp_path))
    stuck = [_stuck(b, "stuck%d" % i, "st/#", 16) for i in range(6)]
    readers = [subscriber(b, "reader%d" % i, "st/#", most=16) for i in range(2)]
    pub = subscriber(b, "pub", "nothing/here")
    body = 40 * 1024  # 8 MB in all: past what a stuck socket and the broker's send buffer hold
    want = [("st/%d" % (i // 3), b"%05d" % i + b"x" * (body - 5)) for i in range(200)]
    for name, payload in want:
        pub.send(wire.Publish(name, payload))
    for s in readers:
        got, by_alias = _collect(s, len(want), Resolver(16))
        _in_order_per_name(got, want)
        assert by_alias >= 60
    for s in stuck:
        got = _read_all(s, len(want), Resolver(16))
        assert len(got) == len(want)
        _in_order_per_name(got, want)
        s.close()


def test_one_connections_aliases_are_shared_by_its_qos1_and_qos0_deliveries(broker_factory, tmp_path):
    """One table for every path that writes to the connection: its own reader (QoS 1, under the write lock), the
    partition's shared reader and the publisher's turn (QoS 0): with two aliases and four busy names the aliases
    move between names of both, each set before it is used alone, standing for the right name."""
    b = broker_factory(mqtt_config(tmp_path, **{"max_inflight": 4}))
    sub = Raw(b, timeout=30)
    assert sub.connect("mixed", properties={"topic_alias_maximum": 2}).reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription("mx/#", 1), wire.Subscription("my/#", 0))))
    assert isinstance(sub.read(), wire.Suback)
    pub = subscriber(b, "pub", "nothing/here")
    names = ["mx/a", "my/a", "mx/b", "my/b"]
    want = []
    for burst in range(20):  # each burst favours two names, so aliases move on from one burst to the next
        hot = names[burst % 4], names[(burst + 1) % 4]
        want += [(hot[i % 2] if i % 5 else names[(burst + 2) % 4], b"%03d-%02d" % (burst, i)) for i in range(20)]
    for start in range(0, len(want), 20):
        pub.send_bytes(b"".join(wire.encode(wire.Publish(n, p, 1, packet_id=1 + (start + i) % 60000), wire.MQTT_5)
                                for i, (n, p) in enumerate(want[start:start + 20])))
        for _ in range(20):  # within its Receive Maximum
            assert isinstance(pub.read(), wire.PubAck)
    got, by_alias = _collect(sub, len(want), Resolver(2))
    assert sorted(got) == sorted(want)
    _in_order_per_name(got, want)
    assert by_alias >= 100


# -- the keep-alive bound ---------------------------------------------------------------------------------------------

def test_the_keep_alive_bound_is_off_by_default(b):
    for asked in (0, 65535):
        ack = Raw(b).connect("free-%d" % asked, keep_alive=asked)
        assert ack.reason_code == 0 and "server_keep_alive" not in ack.properties
    assert Raw(b, wire.MQTT_311).connect("free-311", keep_alive=0).reason_code == 0


def test_mqtt5_past_the_keep_alive_bound_is_told_the_bound_and_held_to_it(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path, max_keep_alive_s=2))
    for asked, told in ((1, None), (2, None), (3, 2), (600, 2), (0, 2)):  # at the bound, one past it, none asked
        ack = Raw(b).connect("ka-%d" % asked, keep_alive=asked)
        assert ack.reason_code == 0 and ack.properties.get("server_keep_alive") == told, (asked, ack)
    silent = Raw(b)
    assert silent.connect("silent", keep_alive=600, will=wire.Will("status/silent", b"lost", 0)).properties[
        "server_keep_alive"] == 2
    started = time.monotonic()
    assert silent.closed()
    assert 2.9 <= time.monotonic() - started < 10  # 1.5 x the bound (late when loaded), not its own 600 s
    pinging = Paho(b, "pinging", version=V5, keepalive=600)  # paho uses the Server Keep Alive: it stays
    time.sleep(4)
    assert pinging.c.is_connected()


def test_mqtt311_past_the_keep_alive_bound_is_refused_identifier_rejected(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path, max_keep_alive_s=2))
    at = Raw(b, wire.MQTT_311)
    assert at.connect("at", keep_alive=2).reason_code == 0
    started = time.monotonic()
    for asked in (3, 0):  # one past the bound; none at all
        raw = Raw(b, wire.MQTT_311)
        assert raw.connect("past-%d" % asked, keep_alive=asked).reason_code == 0x02
        assert raw.closed()
    assert at.closed()  # silent at the bound: closed after 1.5 x it
    assert 2.9 <= time.monotonic() - started < 10
    assert "mqtt.max_keep_alive_s" in b.log_text()
