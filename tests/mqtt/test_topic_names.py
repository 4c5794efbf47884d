"""Every legal MQTT topic name works, whatever its first level (docs/mqtt.md "Topics"): publish at every QoS (the
burst path too), filters, retained messages and wills, with paho-mqtt, Mosquitto's clients and our raw client; the
messages in the documented metaq topic for every other protocol; a data directory written before keeps working."""

import base64

import pytest

from metaq.mqtt.limits import MQTT_MAX_TOPIC_LEVELS
from metaq.mqtt import wire
from metaq.mqtt.records import partition_for
from metaq.protocol import events as ev
from tests.harness.acl import SECRETS, secured_config
from tests.harness.mqtt import V311, Paho, Raw, SubscribedMosquittoSub, mosquitto_pub, mqtt_config, with_mqtt

PARTITIONS = 2  # small_config's "*" topics
DEVICES = [{"filter": "/devices/#", "topic": "devices"}]


def _got(sub, n):
    return [(m.topic, m.payload) for m in sub.wait_messages(n)]


def _stored(b, topic, name):
    """The bodies a text ``get`` reads from ``topic``'s partition of MQTT name ``name``, with that MQTT_TOPIC."""
    out = []
    with b.client() as c:
        r = c.get(topic, partition_for(name, PARTITIONS), 0)
        if isinstance(r, ev.Value):
            out.append(r.body)
    marker = b"MQTT_TOPIC\x01" + name.encode("utf-8") + b"\x02"
    return [body for body in out if marker in body]


def test_names_whose_first_level_is_no_metaq_topic_work_at_every_qos_with_filters(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    exact = Paho(b, "exact")
    assert exact.subscribe("/devices/+/up", qos=2) == [2]
    levels = Paho(b, "levels", version=V311)
    assert levels.subscribe("+/+/+/up", qos=2) == [2]
    spaced = Paho(b, "spaced")
    assert spaced.subscribe("x y/#", qos=1) == [1]
    dev = Paho(b, "dev-1")
    for qos in (0, 1, 2):
        dev.publish("/devices/1/up", b"q%d" % qos, qos=qos)
    dev.publish("x y/z", b"spaced", qos=1)
    dev.publish("/devices/1/down", b"not up", qos=1)
    want = [("/devices/1/up", b"q0"), ("/devices/1/up", b"q1"), ("/devices/1/up", b"q2")]
    assert _got(exact, 3) == want
    assert _got(levels, 3) == want
    assert _got(spaced, 1) == [("x y/z", b"spaced")]
    # the other protocols see them in the fallback topic, the whole name kept
    assert _stored(b, "mqtt", "x y/z") and _stored(b, "mqtt", "/devices/1/up")


def test_everything_subscribes_with_hash_and_mosquitto_clients_use_such_names(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    mosquitto_pub(b, "/devices/0/up", "first", 1)  # the fallback topic exists: a '#' reads it at once
    every = Paho(b, "every")
    assert every.subscribe("#", qos=1) == [1]
    proc = SubscribedMosquittoSub(b, "/devices/+/up", 2)
    r = mosquitto_pub(b, "/devices/7/up", "v5", 1)
    assert r.returncode == 0, r.stderr
    r = mosquitto_pub(b, "/devices/8/up", "v311", 2, "mqttv311")
    assert r.returncode == 0, r.stderr
    out, _err = proc.communicate(timeout=30)
    assert out.splitlines() == ["/devices/7/up v5", "/devices/8/up v311"]
    assert _got(every, 2) == [("/devices/7/up", b"v5"), ("/devices/8/up", b"v311")]


def test_a_burst_of_plain_publishes_to_such_names_is_stored_and_delivered_in_order(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    sub = Paho(b, "burst-sub")
    assert sub.subscribe("/devices/2/up", qos=1) == [1]
    raw = Raw(b)
    assert raw.connect("burst-pub").reason_code == 0
    n = 60
    names = ["/devices/2/up" if k % 2 else "x y/%d" % k for k in range(n)]
    raw.send_bytes(b"".join(wire.encode(wire.Publish(name, b"m%d" % k, k % 2, packet_id=k + 1 if k % 2 else None),
                                        wire.MQTT_5) for k, name in enumerate(names)))
    acks = [raw.read() for _ in range(n // 2)]
    assert [(a.packet_id, a.reason_code) for a in acks] == [(k + 1, 0) for k in range(1, n, 2)]
    assert _got(sub, n // 2) == [("/devices/2/up", b"m%d" % k) for k in range(1, n, 2)]
    raw.close()


def test_a_topic_map_rule_puts_names_in_its_topic_and_get_sees_them_there(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path, topic_map=DEVICES, fallback_topic="odd"))
    sub = Paho(b, "ruled")
    assert sub.subscribe("/devices/+/up", qos=1) == [1]
    dev = Paho(b, "dev-r")
    dev.publish("/devices/3/up", b"ruled", qos=1)
    dev.publish("/elsewhere/x", b"odd one", qos=1)
    assert _got(sub, 1) == [("/devices/3/up", b"ruled")]
    assert _stored(b, "devices", "/devices/3/up") and not _stored(b, "odd", "/devices/3/up")
    assert _stored(b, "odd", "/elsewhere/x")


def test_a_will_on_a_name_with_an_empty_first_level_is_accepted_and_published(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    watcher = Paho(b, "watcher")
    assert watcher.subscribe("/devices/+/status", qos=1) == [1]
    dev = Raw(b)
    assert dev.connect("dev-w", will=wire.Will("/devices/1/status", b"offline", 1)).reason_code == 0
    dev.close()  # no DISCONNECT: the will goes out
    assert _got(watcher, 1) == [("/devices/1/status", b"offline")]


def test_a_retained_message_on_a_name_with_empty_levels_reaches_every_matching_filter(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    raw = Raw(b)
    assert raw.connect("retainer").reason_code == 0
    raw.send(wire.Publish("/a//b", b"kept", 1, retain=True, packet_id=1))
    assert raw.read() == wire.PubAck(1)
    raw.close()
    for k, topic_filter in enumerate(("/a//b", "/a/+/b", "+/a/#", "#")):
        sub = Paho(b, "late-%d" % k)
        assert sub.subscribe(topic_filter, qos=1) == [1]
        [m] = sub.wait_messages(1)
        assert (m.topic, m.payload, m.retain) == ("/a//b", b"kept", True), topic_filter


def test_a_name_of_65535_bytes_works_and_one_level_past_the_level_limit_is_refused(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    levels = ["l" * 511] * (MQTT_MAX_TOPIC_LEVELS - 1)
    name = "/".join(levels + ["x" * (65_535 - 512 * (MQTT_MAX_TOPIC_LEVELS - 1))])
    assert len(name.encode()) == 65_535 and name.count("/") + 1 == MQTT_MAX_TOPIC_LEVELS
    sub = Raw(b)
    assert sub.connect("long-sub").reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription(name, 1),)))
    assert sub.read() == wire.Suback(1, (1,))
    pub = Raw(b)
    assert pub.connect("long-pub").reason_code == 0
    pub.send(wire.Publish(name, b"long", 1, packet_id=1))
    assert pub.read() == wire.PubAck(1)
    got = sub.read()
    assert (got.topic, got.payload) == (name, b"long")
    past = "/".join(["l"] * (MQTT_MAX_TOPIC_LEVELS + 1))
    pub.send(wire.Publish(past, b"deep", 1, packet_id=2))
    refused = pub.read()  # a name the codec refuses: the connection is told why and closed
    assert (type(refused), refused.reason_code) == (wire.Disconnect, wire.TOPIC_NAME_INVALID), refused
    assert pub.closed()
    pub.close()
    sub.close()


def test_a_broker_restarted_with_a_rule_still_delivers_what_the_first_level_rule_stored(broker_factory, tmp_path):
    """Sessions, queued messages and retained messages stored under the first-level rule (what every earlier release
    wrote) are delivered after a restart whose ``mqtt.topic_map`` sends those names elsewhere; new ones go there."""
    b = broker_factory(mqtt_config(tmp_path))
    keeper = Paho(b, "keeper", version=V311, clean=False)
    assert keeper.subscribe("sensors/#", qos=1) == [1]
    keeper.close()
    pub = Paho(b, "pub-old")
    pub.publish("sensors/queued", b"while away", qos=1)
    pub.c.publish("sensors/r", b"retained", 1, retain=True).wait_for_publish(10)
    pub.close()
    b.stop()
    b.config["mqtt"]["topic_map"] = [{"filter": "sensors/#", "topic": "moved"}]
    b.start()
    keeper = Paho(b, "keeper", version=V311, clean=False)
    assert keeper.session_present
    got = _got(keeper, 2)
    assert got == [("sensors/queued", b"while away"), ("sensors/r", b"retained")]
    late = Paho(b, "late")
    assert late.subscribe("sensors/#", qos=1) == [1]
    [m] = late.wait_messages(1)
    assert (m.topic, m.payload, m.retain) == ("sensors/r", b"retained", True)
    Paho(b, "pub-new").publish("sensors/new", b"moved", qos=1)
    assert _got(keeper, 3)[2:] == [("sensors/new", b"moved")]
    assert _got(late, 2)[1:] == [("sensors/new", b"moved")]
    assert _stored(b, "moved", "sensors/new") and not _stored(b, "sensors", "sensors/new")


@pytest.mark.parametrize("fallback", ["mqtt", "devices_misc"])
def test_a_get_of_the_fallback_topic_sees_the_message_with_its_mqtt_topic(broker_factory, tmp_path, fallback):
    b = broker_factory(mqtt_config(tmp_path, fallback_topic=fallback))
    Paho(b, "dev-f").publish("/devices/9/up", b"reading", qos=1)
    [body] = _stored(b, fallback, "/devices/9/up")
    assert body.endswith(b"reading")


def test_permissions_are_on_the_topic_a_name_is_stored_in_the_fallback_one_for_every_odd_name(broker_factory,
                                                                                              tmp_path):
    config = with_mqtt(secured_config(tmp_path), topic_map=[{"filter": "/orders/#", "topic": "orders_dev"}])
    b = broker_factory(config)
    alice = Raw(b)  # may publish to and read orders*, not the fallback topic
    assert alice.connect("alice-1", username="alice", password=SECRETS["alice"].encode()).reason_code == 0
    alice.send(wire.Subscribe(1, (wire.Subscription("/orders/+/x", 1), wire.Subscription("x y/#", 1))))
    assert alice.read() == wire.Suback(1, (1, wire.NOT_AUTHORIZED))  # reads orders_dev alone; the fallback: none
    alice.send(wire.Publish("/orders/1/x", b"mine", 1, packet_id=2))
    alice.send(wire.Publish("/other/x", b"not mine", 1, packet_id=3))
    got = sorted((type(p).__name__, getattr(p, "packet_id", None), getattr(p, "reason_code", None), p.topic
                  if isinstance(p, wire.Publish) else None) for p in (alice.read(), alice.read(), alice.read()))
    assert got == [("PubAck", 2, 0, None), ("PubAck", 3, wire.NOT_AUTHORIZED, None),
                   ("Publish", 1, None, "/orders/1/x")]
    reader = Raw(b)  # may read every topic: the fallback's names too
    assert reader.connect("reader-1", username="reader", password=SECRETS["reader"].encode()).reason_code == 0
    reader.send(wire.Subscribe(1, (wire.Subscription("x y/#", 1),)))
    assert reader.read() == wire.Suback(1, (1,))
    alice.close()
    reader.close()


def test_a_name_holding_the_record_separators_is_published_retained_and_delivered(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    name = "a\x01b/c\x02"
    sub = Raw(b)
    assert sub.connect("sep-sub").reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription("a\x01b/+", 1),)))
    assert sub.read() == wire.Suback(1, (1,))
    pub = Raw(b)
    assert pub.connect("sep-pub").reason_code == 0
    pub.send(wire.Publish(name, b"odd", 1, retain=True, packet_id=1))
    assert pub.read() == wire.PubAck(1)
    got = sub.read()
    assert (got.topic, got.payload) == (name, b"odd")
    late = Paho(b, "sep-late")
    assert late.subscribe("a\x01b/#", qos=1) == [1]
    [m] = late.wait_messages(1)
    assert (m.topic, m.payload, m.retain) == (name, b"odd", True)
    with b.client() as c:  # the other protocols see it in the fallback topic, its name in base64
        r = c.get("mqtt", partition_for(name, PARTITIONS), 0)
    assert isinstance(r, ev.Value) and b"MQTT_TOPIC_B64\x01" + base64.b64encode(name.encode()) + b"\x02" in r.body
    pub.close()
    sub.close()
