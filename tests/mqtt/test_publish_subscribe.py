"""The MQTT port with clients nobody here wrote (paho-mqtt, Mosquitto's mosquitto_pub and mosquitto_sub): one log,
every protocol (docs/mqtt.md)."""

import json
import time

import paho.mqtt.client as paho
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes

from metaq.client.consumer import Consumer
from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient
from metaq.mqtt import wire
from metaq.mqtt.records import partition_for
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from tests.harness.broker import url_of
from tests.harness.mqtt import (V311, V5, Paho, Raw, SubscribedMosquittoSub, mosquitto_pub, mqtt_config,
                                 with_mqtt)
from tests.harness.rocketmq import pull, send_v1

PARTITIONS = 2  # small_config's "*" topics


def test_a_device_publish_is_seen_by_get_and_the_python_client_with_its_mqtt_topic_qos_and_properties(
        broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("unit", "celsius"), ("unit", "again")]
    props.ContentType = "text/plain"
    props.ResponseTopic = "replies/room1"
    props.CorrelationData = b"\x00req-1"
    dev = Paho(b, "device-1")
    info = dev.publish("sensors/room1/temp", b"21.5", qos=1, properties=props)
    assert info.is_published() and info.rc == paho.MQTT_ERR_SUCCESS
    r = mosquitto_pub(b, "sensors/room2/temp", "19", 2, "mqttv311")
    assert r.returncode == 0, r.stderr
    dev.close()
    with Consumer("g", brokers=[url_of(b)]) as consumer:
        p1 = partition_for("sensors/room1/temp", PARTITIONS)
        m1 = consumer.fetch("sensors", "7-%d" % p1, 0)[0]
        p2 = partition_for("sensors/room2/temp", PARTITIONS)
        m2 = [m for m in consumer.fetch("sensors", "7-%d" % p2, 0) if m.body == b"19"][0]
    assert m1.body == b"21.5"
    assert m1.properties["MQTT_TOPIC"] == "sensors/room1/temp" and m1.properties["MQTT_QOS"] == "1"
    assert m1.properties["MQTT_CONTENT_TYPE"] == "text/plain"
    assert m1.properties["MQTT_RESPONSE_TOPIC"] == "replies/room1"
    assert json.loads(m1.properties["MQTT_USER_PROPERTIES"]) == [["unit", "celsius"], ["unit", "again"]]
    assert m2.properties["MQTT_TOPIC"] == "sensors/room2/temp" and m2.properties["MQTT_QOS"] == "2"
    with b.client() as c:  # a text get sees the record, its properties in the attribute
        r = c.get("sensors", p1, 0)
        assert isinstance(r, ev.Value) and b"MQTT_TOPIC\x01sensors/room1/temp\x02" in r.body and b"21.5" in r.body


def test_a_text_put_reaches_mqtt_subscribers_under_its_topic_name(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    sub = Paho(b, "watcher", version=V311)
    assert sub.subscribe("orders", qos=1) == [1]
    proc = SubscribedMosquittoSub(b, "orders/#", 1)  # its SUBSCRIBE is in before the put
    with b.client() as c:
        c.put_ok("orders", b"o-1")
    got = sub.wait_messages(1)
    assert [(m.topic, m.payload, m.qos) for m in got] == [("orders", b"o-1", 1)]
    out, err = proc.communicate(timeout=30)
    assert out.strip() == "orders o-1", err
    sub.close()


def test_wildcard_filters_deliver_what_matches_filtered_in_the_broker(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    plus = Paho(b, "plus")
    hashed = Paho(b, "hash")
    everything = Paho(b, "all")
    assert plus.subscribe("sensors/+/temp", qos=1) == [1]
    assert hashed.subscribe("sensors/room1/#", qos=2) == [2]
    assert everything.subscribe("#", qos=0) == [0]
    pub = Paho(b, "pub")
    for name, qos in (("sensors/room1/temp", 1), ("sensors/room2/temp", 2), ("sensors/room1/humidity", 2),
                      ("sensors/room1", 1), ("other/x", 1)):
        pub.publish(name, name.encode(), qos)
    assert sorted(m.topic for m in plus.wait_messages(2)) == ["sensors/room1/temp", "sensors/room2/temp"]
    got = hashed.wait_messages(3)
    assert sorted((m.topic, m.qos) for m in got) == [("sensors/room1", 1), ("sensors/room1/humidity", 2),
                                                     ("sensors/room1/temp", 1)]  # min(published, granted)
    assert len(everything.wait_messages(5)) == 5 and {m.qos for m in everything.messages} == {0}
    assert len(plus.messages) == 2 and len(hashed.messages) == 3
    for c in (plus, hashed, everything, pub):
        c.close()


def test_filters_without_wildcards_of_one_topic_get_their_names_from_every_partition(broker_factory, tmp_path):
    """A filter without wildcards reads only its name's partition: a second one of the same metaq topic on another
    partition, and a wildcard filter added after, still get every message published after their SUBSCRIBE, QoS 0
    and 1 alike, and a QoS 0 message goes to many subscribers the same (encoded once for all of them)."""
    b = broker_factory(mqtt_config(tmp_path))
    names = ["fleet/a", "fleet/b", "fleet/c", "fleet/d", "fleet/e"]
    assert len({partition_for(n, PARTITIONS) for n in names}) == PARTITIONS
    one = Paho(b, "one")
    assert one.subscribe(names[0], qos=1) == [1]
    assert one.subscribe(names[1], qos=0) == [0]
    many = [Paho(b, "many-%d" % i, version=V311 if i % 2 else V5) for i in range(4)]
    for i, c in enumerate(many):
        assert c.subscribe(names[i % len(names)] if i < 2 else "fleet/+", qos=0) == [0]
    pub = Paho(b, "pub")
    for n in names:
        pub.publish(n, n.encode(), 1)
    assert sorted((m.topic, m.payload, m.qos) for m in one.wait_messages(2)) == [
        ("fleet/a", b"fleet/a", 1), ("fleet/b", b"fleet/b", 0)]
    assert one.subscribe("fleet/#", qos=0) == [0]
    for n in names:
        pub.publish(n, b"again " + n.encode(), 0)
    got = one.wait_messages(2 + len(names))
    assert sorted(m.payload for m in got[2:]) == sorted(b"again " + n.encode() for n in names)
    for i, c in enumerate(many):
        want = 2 if i < 2 else 2 * len(names)
        assert len(c.wait_messages(want)) == want
        assert all(m.qos == 0 and m.payload.endswith(m.topic.encode()) for m in c.messages)
    time.sleep(0.3)
    assert len(one.messages) == 2 + len(names) and [len(c.messages) for c in many] == [2, 2, 10, 10]
    for c in [one, pub] + many:
        c.close()


def test_qos1_and_qos2_are_acknowledged_and_a_qos2_resend_is_stored_once(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    raw = Raw(b)
    assert raw.connect("resender").reason_code == 0
    raw.send(wire.Publish("exact/once", b"one", 1, packet_id=1))
    assert raw.read() == wire.PubAck(1)
    raw.send(wire.Publish("exact/once", b"two", 2, packet_id=2))
    assert raw.read() == wire.PubRec(2)
    raw.send(wire.Publish("exact/once", b"two", 2, dup=True, packet_id=2))  # a resend before the PUBREL
    assert raw.read() == wire.PubRec(2)
    raw.send(wire.PubRel(2))
    assert raw.read() == wire.PubComp(2)
    raw.send(wire.Publish("exact/once", b"three", 2, packet_id=2))  # the id released: a new message
    assert raw.read() == wire.PubRec(2)
    raw.close()
    with b.client() as c:
        p = partition_for("exact/once", PARTITIONS)
        bodies = [r.data[-5:] for r in c.get_records("exact", p, 0)]
    assert len(bodies) == 3 and all(x.endswith(y) for x, y in zip(bodies, (b"one", b"two", b"three"), strict=True))


def test_a_pubrel_of_an_id_not_held_is_answered_packet_identifier_not_found(broker_factory, tmp_path):
    """A PUBREL for a packet id the broker does not hold gets PUBCOMP 0x92 in MQTT 5: refused at the PUBREC (not
    stored: a client that ignores the PUBREC's reason is not told it was delivered), never sent, or already released
    (a PUBREL sent again after a lost PUBCOMP: that message was stored); a held one 0x00; MQTT 3.1.1 has no reason
    code."""
    b = broker_factory(mqtt_config(tmp_path, max_retained=1))
    raw = Raw(b)
    assert raw.connect("releaser").reason_code == 0
    raw.send(wire.Publish("rel/kept", b"1", 2, retain=True, packet_id=1))
    assert raw.read() == wire.PubRec(1)
    raw.send(wire.Publish("rel/past", b"2", 2, retain=True, packet_id=2))  # one past mqtt.max_retained
    assert raw.read().reason_code == wire.QUOTA_EXCEEDED
    for pid, code in ((2, 0x92), (9, 0x92), (1, wire.SUCCESS), (1, 0x92)):  # refused, never sent, held, released
        raw.send(wire.PubRel(pid))
        assert raw.read() == wire.PubComp(pid, code), pid
    reader = Raw(b)
    assert reader.connect("reader").reason_code == 0
    reader.send(wire.Subscribe(1, (wire.Subscription("rel/#", 0),)))
    assert isinstance(reader.read(), wire.Suback)
    assert reader.read().payload == b"1"  # the one released twice was stored, once
    old = Raw(b, wire.MQTT_311)
    assert old.connect("releaser-311").reason_code == 0
    old.send(wire.PubRel(3))
    assert old.read() == wire.PubComp(3)
    done = []  # paho-mqtt 2 ignores the PUBREC's reason and tells the application the PUBCOMP's
    client = Paho(b, "releaser-paho")
    client.c.on_publish = lambda c, u, mid, reason, props: done.append(reason.value)
    client.c.publish("rel/also-past", b"3", 2, retain=True).wait_for_publish(10)  # one past: refused at PUBREC
    assert done == [0x92]


def test_paho_v5_subscriber_gets_the_publishers_properties(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    sub = Paho(b, "props-sub", version=V5)
    sub.subscribe("req/#", qos=1)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("a", "1")]
    props.ResponseTopic = "resp/1"
    props.CorrelationData = b"cid"
    props.ContentType = "application/json"
    Paho(b, "props-pub").publish("req/x", b"{}", qos=1, properties=props)
    m = sub.wait_messages(1)[0]
    assert m.properties.UserProperty == [("a", "1")] and m.properties.ResponseTopic == "resp/1"
    assert m.properties.CorrelationData == b"cid" and m.properties.ContentType == "application/json"


def test_a_message_past_the_clients_maximum_packet_size_is_skipped(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    small = Raw(b)
    assert small.connect("small", properties={"maximum_packet_size": 200}).reason_code == 0
    small.send(wire.Subscribe(1, (wire.Subscription("sizes/#", 0),)))
    assert small.read() == wire.Suback(1, (0,))
    pub = Paho(b, "sizer")
    pub.publish("sizes/x", b"b" * 500, 1)
    pub.publish("sizes/x", b"fits", 1)
    got = small.read()
    assert got.payload == b"fits"  # the large one was dropped as delivered, never sent


def test_rocketmq_pulls_see_mqtt_messages_and_rocketmq_sends_reach_mqtt(broker_factory, tmp_path):
    b = broker_factory(with_mqtt(rmq_config(tmp_path / "data")))
    sub = Paho(b, "rmq-watcher")
    sub.subscribe("shipments/#", qos=1)
    r = mosquitto_pub(b, "shipments/eu/1", "parcel", 1, "mqttv5", "-D", "publish", "user-property", "carrier", "dhl")
    assert r.returncode == 0, r.stderr
    queue = partition_for("shipments/eu/1", PARTITIONS)
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        pulled = pull(rc, "shipments", queue, 0)
        assert pulled.code == 0, pulled
        [m] = decode_stored_messages(pulled.body)
        assert m.body == b"parcel" and m.properties["MQTT_TOPIC"] == "shipments/eu/1"
        assert json.loads(m.properties["MQTT_USER_PROPERTIES"]) == [["carrier", "dhl"]]
        assert send_v1(rc, "shipments", b"from rocketmq", props={"KEYS": "k-1"}).code == 0
    got = sub.wait_messages(2)
    assert [(m.topic, m.payload) for m in got] == [("shipments/eu/1", b"parcel"), ("shipments", b"from rocketmq")]
    assert ("KEYS", "k-1") in got[1].properties.UserProperty and got[1].qos == 1
