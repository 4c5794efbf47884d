"""Every bound of the MQTT port, at its value and one past (docs/mqtt.md "Limits"; conf/server.yaml ``mqtt:``)."""

import time

import pytest

from metaq.client.local import BrokerProcess
from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import Paho, Raw, mqtt_config

pytestmark = pytest.mark.integration  # one broker for the module (a module fixture)

LIMITS = {"max_packet_bytes": 1024, "receive_maximum": 2, "max_inflight": 2, "max_subscriptions": 2,
          "max_wildcard_topics": 2, "max_client_id_bytes": 23, "topic_alias_maximum": 2, "max_delayed_wills": 1}


@pytest.fixture(scope="module")
def b(tmp_path_factory):
    wd = tmp_path_factory.mktemp("mqtt-limits")
    broker = BrokerProcess(wd, mqtt_config(wd, **LIMITS)).start()
    yield broker
    broker.kill()


def _v5(b, client_id, **kwargs):
    raw = Raw(b)
    ack = raw.connect(client_id, **kwargs)
    assert ack.reason_code == 0, ack
    return raw


def test_the_connack_tells_the_limits(b):
    ack = Raw(b).connect("told")
    assert ack.properties["receive_maximum"] == 2 and ack.properties["maximum_packet_size"] == 1024
    assert ack.properties["topic_alias_maximum"] == 2


def test_max_packet_bytes(b):
    raw = _v5(b, "packets")
    at = wire.Publish("big/x", b"", 1, packet_id=1)
    at = wire.Publish("big/x", b"p" * (1024 - len(wire.encode(at, wire.MQTT_5)) - 1), 1, packet_id=1)  # 2-byte length
    assert len(wire.encode(at, wire.MQTT_5)) == 1024
    raw.send(at)
    assert raw.read() == wire.PubAck(1)
    raw.send(wire.Publish("big/x", at.payload + b"p", 1, packet_id=2))
    assert raw.read() == wire.Disconnect(wire.PACKET_TOO_LARGE)
    assert raw.closed()


def test_receive_maximum(b):
    raw = _v5(b, "flood")
    for pid in (1, 2):  # two QoS 2 PUBLISHes waiting for their PUBREL: at the limit
        raw.send(wire.Publish("flood/x", b"x", 2, packet_id=pid))
        assert raw.read() == wire.PubRec(pid)
    raw.send(wire.PubRel(1))
    assert raw.read() == wire.PubComp(1)
    raw.send(wire.Publish("flood/x", b"x", 2, packet_id=3))  # room again: one was released
    assert raw.read() == wire.PubRec(3)
    raw.send(wire.Publish("flood/x", b"x", 1, packet_id=4))  # one past
    assert raw.read() == wire.Disconnect(wire.RECEIVE_MAXIMUM_EXCEEDED)
    assert raw.closed()
    old = Raw(b, wire.MQTT_311)
    assert old.connect("flood-311").reason_code == 0
    for pid in (1, 2, 3):
        old.send(wire.Publish("flood/x", b"x", 2, packet_id=pid))
    assert [old.read(), old.read(), old.read()] == [wire.PubRec(1), wire.PubRec(2), None]  # closed: no DISCONNECT
    piped = Raw(b, wire.MQTT_311)  # QoS 1 pipelined past the limit: MQTT 3.1.1 is told no limit, so it waits
    assert piped.connect("piped-311").reason_code == 0
    piped.send_bytes(b"".join(wire.encode(wire.Publish("flood/x", b"x", 1, packet_id=i), wire.MQTT_311)
                              for i in (1, 2, 3, 4)))
    assert [piped.read() for _ in range(4)] == [wire.PubAck(i) for i in (1, 2, 3, 4)]


def test_max_inflight(b):
    sub = _v5(b, "slow-reader")
    sub.send(wire.Subscribe(1, (wire.Subscription("inflight/#", 1),)))
    assert sub.read() == wire.Suback(1, (1,))
    pub = Paho(b, "inflight-pub")
    for i in range(3):
        pub.publish("inflight/x", b"m%d" % i, 1)
    first, second = sub.read(), sub.read()
    assert [first.payload, second.payload] == [b"m0", b"m1"]
    sub.sock.settimeout(1.0)
    with pytest.raises(OSError):  # the third waits: two in flight is the limit
        sub.read()
    sub.sock.settimeout(10.0)
    sub.send(wire.PubAck(first.packet_id))
    third = sub.read()
    assert third.payload == b"m2" and third.qos == 1


def test_max_subscriptions(b):
    raw = _v5(b, "subs")
    raw.send(wire.Subscribe(1, (wire.Subscription("s1/#", 0), wire.Subscription("s2/#", 0))))
    assert raw.read() == wire.Suback(1, (0, 0))
    raw.send(wire.Subscribe(2, (wire.Subscription("s1/#", 1), wire.Subscription("s3/#", 0))))
    assert raw.read() == wire.Suback(2, (1, wire.QUOTA_EXCEEDED))  # a replaced filter is no new one


def test_max_wildcard_topics(broker_factory, tmp_path):
    """Its own broker: the module's has the other tests' topics."""
    own = broker_factory(mqtt_config(tmp_path, max_wildcard_topics=2))
    with own.client() as c:
        c.put_ok("wa", b"x")
        c.put_ok("wb", b"x")
    at = _v5(own, "wild")
    at.send(wire.Subscribe(1, (wire.Subscription("#", 0),)))
    assert at.read() == wire.Suback(1, (0,))  # two topics: at the limit
    with own.client() as c:
        c.put_ok("wc", b"x")
    past = _v5(own, "wild-2")
    past.send(wire.Subscribe(1, (wire.Subscription("+/x", 0),)))
    assert past.read() == wire.Suback(1, (wire.QUOTA_EXCEEDED,))
    past.send(wire.Subscribe(2, (wire.Subscription("wc/#", 0),)))  # a literal first level is no wildcard's
    assert past.read() == wire.Suback(2, (0,))


def test_max_client_id_bytes(b):
    assert Raw(b).connect("c" * 23).reason_code == 0
    assert Raw(b).connect("c" * 24).reason_code == wire.CLIENT_ID_NOT_VALID
    assert Raw(b, wire.MQTT_311).connect("c" * 24).reason_code == 0x02


def test_topic_alias_maximum(b):
    raw = _v5(b, "aliases")
    raw.send(wire.Publish("alias/x", b"x", 1, packet_id=1, properties={"topic_alias": 2}))
    assert raw.read() == wire.PubAck(1)
    raw.send(wire.Publish("alias/x", b"x", 1, packet_id=2, properties={"topic_alias": 3}))
    assert raw.read() == wire.Disconnect(wire.TOPIC_ALIAS_INVALID)


def _stat(b, name):
    with b.client() as c:
        return int(c.stats_dict()[name])


def test_max_delayed_wills(b):
    watcher = Paho(b, "will-watcher")
    watcher.subscribe("wills/#", qos=1)
    for name in ("held", "past"):
        raw = _v5(b, name, will=wire.Will("wills/" + name, name.encode(), 1, properties={"will_delay_interval": 30}),
                  properties={"session_expiry_interval": 60})
        raw.close()
        wait_for(lambda: _stat(b, "mqtt_delayed_wills") == 1, what="held's will waiting for its delay")  # then past
    got = watcher.wait_messages(1)
    time.sleep(0.5)
    assert [m.payload for m in got] == [b"past"] and len(watcher.messages) == 1  # one held for its delay: the limit
    with b.client() as c:
        stats = c.stats_dict()
    assert stats["mqtt_delayed_wills"] == "1" and int(stats["mqtt_wills_published"]) >= 1
    assert stats["mqtt_port"] == str(b.config["mqtt"]["port"]) and int(stats["mqtt_connections"]) >= 1
