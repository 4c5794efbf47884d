"""Retained messages (docs/mqtt.md "Retained messages"): set, replaced and cleared by an empty payload; sent to a new
subscription as Retain Handling says, RETAIN set; Retain As Published; bounded by mqtt.max_retained and
mqtt.max_retained_bytes; kept across a restart and a kill -9 (the sessions' log)."""

import pytest

from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho, Raw, mosquitto_pub, mosquitto_sub, mqtt_config


def _pub(b, name, payload, qos=1, version=wire.MQTT_5, **props):
    raw = Raw(b, version)
    assert raw.connect("retainer").reason_code == 0
    raw.send(wire.Publish(name, payload, qos, retain=True, packet_id=1 if qos else None, properties=props))
    ack = raw.read() if qos else None
    raw.send(wire.Disconnect())
    assert raw.closed()  # the broker handled the PUBLISH before it closed (QoS 0 has no acknowledgement to wait for)
    raw.close()
    return ack


def _retained(b, topic_filter, handling=0, n=None, timeout=1.0):
    """The retained messages a new subscription gets: ``(name, payload, retain flag)``."""
    raw = Raw(b)
    assert raw.connect("sub-%s" % topic_filter.replace("/", "_").replace("#", "H").replace("+", "P")).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription(topic_filter, 1, retain_handling=handling),)))
    assert raw.read() == wire.Suback(1, (1,))
    raw.sock.settimeout(timeout)
    got = []
    try:
        while n is None or len(got) < n:
            p = raw.read()
            got.append((p.topic, p.payload, p.retain))
            if p.qos:
                raw.send(wire.PubAck(p.packet_id))
    except OSError:
        pass
    raw.close()
    return sorted(got)


def _stats(b):
    with b.client() as c:
        return c.stats_dict()


@pytest.fixture
def b(broker_factory, tmp_path):
    return broker_factory(mqtt_config(tmp_path, max_retained=2, max_retained_bytes=4096))


def test_set_replaced_cleared(b):
    assert _pub(b, "home/a", b"1") == wire.PubAck(1)
    assert _pub(b, "home/a", b"2") == wire.PubAck(1)  # replaced
    _pub(b, "home/b", b"3", qos=0)
    assert _retained(b, "home/#", n=2) == [("home/a", b"2", True), ("home/b", b"3", True)]
    assert _retained(b, "home/a", n=1) == [("home/a", b"2", True)]
    _pub(b, "home/a", b"")  # an empty payload clears it
    assert _retained(b, "home/#") == [("home/b", b"3", True)]


def test_retain_handling(b):
    _pub(b, "rh/x", b"kept")
    assert _retained(b, "rh/#", handling=2) == []  # never
    raw = Raw(b)
    assert raw.connect("rh1").reason_code == 0
    sub = (wire.Subscription("rh/#", 1, retain_handling=1),)
    raw.send(wire.Subscribe(1, sub))
    assert raw.read() == wire.Suback(1, (1,))
    p = raw.read()
    assert (p.payload, p.retain) == (b"kept", True)  # a new subscription: sent
    raw.send(wire.PubAck(p.packet_id))
    raw.send(wire.Subscribe(2, sub))
    assert raw.read() == wire.Suback(2, (1,))
    raw.sock.settimeout(1.0)
    with pytest.raises(OSError):
        raw.read()  # it existed already: not sent again


def test_retain_as_published(b):
    raw = Raw(b)
    assert raw.connect("rap").reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("rap/#", 0, retain_as_published=True),
                                wire.Subscription("other/#", 0))))
    assert raw.read() == wire.Suback(1, (0, 0))
    _pub(b, "rap/x", b"r", qos=0)
    _pub(b, "other/x", b"o", qos=0)
    p, q = raw.read(), raw.read()
    assert (p.topic, p.retain) == ("rap/x", True)
    assert (q.topic, q.retain) == ("other/x", False)  # forwarded live: RETAIN 0 without Retain As Published


def test_max_retained_at_the_limit_and_one_past(b):
    assert _pub(b, "lim/a", b"1").reason_code == 0
    assert _pub(b, "lim/b", b"2").reason_code == 0  # at the limit (max_retained=2)
    assert _pub(b, "lim/c", b"3").reason_code == wire.QUOTA_EXCEEDED  # one past
    assert _pub(b, "lim/a", b"replaced").reason_code == 0  # replacing one is not one more
    assert _retained(b, "lim/#", n=2) == [("lim/a", b"replaced", True), ("lim/b", b"2", True)]
    with b.client() as c:
        assert c.stats_dict()["mqtt_retained"] == "2"


def test_max_retained_bytes_at_the_limit_and_one_past(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path, max_retained_bytes=2000))
    _pub(b, "size/probe", b"")  # nothing retained: measures nothing
    assert _pub(b, "size/a", b"x" * 100).reason_code == 0
    with b.client() as c:
        one = int(c.stats_dict()["mqtt_retained_bytes"])  # a record of 100 payload bytes
    extra = one - 100
    room = 2000 - one
    assert _pub(b, "size/b", b"y" * (room - extra)).reason_code == 0  # exactly at the limit
    with b.client() as c:
        assert int(c.stats_dict()["mqtt_retained_bytes"]) == 2000
    assert _pub(b, "size/c", b"z").reason_code == wire.QUOTA_EXCEEDED  # one byte past


@pytest.mark.slow
@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_retained_messages_survive_the_broker(b, how):
    _pub(b, "keep/a", b"A")
    _pub(b, "keep/b", b"B")
    _pub(b, "keep/b", b"")
    if how == "restart":
        b.stop()
    else:
        b.kill()
    b.start()
    assert _retained(b, "keep/#") == [("keep/a", b"A", True)]


def test_mosquitto_and_paho_311(b):
    assert mosquitto_pub(b, "cli/x", "from-mosquitto", 1, "mqttv311", "-r").returncode == 0
    sub = mosquitto_sub(b, "cli/#", 1, 1, "mqttv311")
    out, err = sub.communicate(timeout=30)
    assert out.strip() == "cli/x from-mosquitto", err
    c = Paho(b, client_id="paho-r", version=V311)
    c.subscribe("cli/#", qos=1)
    m = c.wait_messages(1)[0]
    assert (m.topic, m.payload, m.retain) == ("cli/x", b"from-mosquitto", True)


def test_a_retained_will_becomes_the_retained_message(b):
    raw = Raw(b)
    will = wire.Will("status/dev9", b"offline", 1, True)
    assert raw.connect("dev9", will=will).reason_code == 0
    raw.close()  # no DISCONNECT: the will is published, retained
    wait_for(lambda: _stats(b)["mqtt_retained"] == "1", 10, "the will retained")
    assert _retained(b, "status/#", n=1) == [("status/dev9", b"offline", True)]
