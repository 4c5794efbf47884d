"""MQTT subscriptions across a cluster of three brokers (docs/mqtt.md "A cluster"): a subscriber on one broker gets
what is published on any other, by any protocol, at its QoS, in order per publisher and topic, exactly once."""

import time

import pytest

from tests.harness.acl import SECRETS, write_acl
from tests.harness.mqtt import Paho, mosquitto_pub, mqtt_config
from tests.harness.mqttcluster import Cluster, wait_routed

pytestmark = pytest.mark.slow


def probe(broker, topic="sensors/probe"):
    return lambda i: mosquitto_pub(broker, topic, "probe-%d" % i, 0)


def test_a_subscriber_gets_mqtt_and_text_puts_from_other_brokers(cluster):
    sub = Paho(cluster[0], "sub-0")
    assert sub.subscribe("sensors/#", 1) == [1]
    wait_routed(sub, probe(cluster[2]))
    wait_routed(sub, probe(cluster[1]))
    r = mosquitto_pub(cluster[2], "sensors/room1/temp", "21.5", 1)
    assert r.returncode == 0, r.stderr
    with cluster[1].client() as c:
        c.put_ok("sensors", b"from-text")
    got = sub.wait_messages(2, 15)
    by_topic = {m.topic: m for m in got}
    assert set(by_topic) == {"sensors/room1/temp", "sensors"}, [m.topic for m in got]
    assert by_topic["sensors/room1/temp"].payload == b"21.5" and by_topic["sensors/room1/temp"].qos == 1
    assert by_topic["sensors"].payload == b"from-text" and by_topic["sensors"].qos == 1
    sub.settle()
    assert len(sub.wait_messages(3, 1.0)) == 2  # nothing twice


def test_qos2_across_brokers_exactly_once_and_in_order(cluster):
    sub = Paho(cluster[0], "sub-q2")
    assert sub.subscribe("sensors/#", 2) == [2]
    wait_routed(sub, probe(cluster[2]))
    pub = Paho(cluster[2], "pub-q2")
    for i in range(50):
        pub.publish("sensors/line", b"%d" % i, 2)
    got = sub.wait_messages(50, 30)
    sub.settle()
    got = sub.wait_messages(51, 2.0)
    assert [m.payload for m in got] == [b"%d" % i for i in range(50)]
    assert all(m.qos == 2 for m in got)


def test_a_subscriber_on_the_publishers_broker_is_not_sent_copies(cluster):
    """The copies are another broker's: a subscriber on the publisher's own broker gets each message once."""
    sub0 = Paho(cluster[0], "sub-a")
    sub0.subscribe("sensors/#", 1)
    sub2 = Paho(cluster[2], "sub-b")
    sub2.subscribe("sensors/#", 1)
    wait_routed(sub0, probe(cluster[2]))
    wait_routed(sub2, probe(cluster[0]))
    time.sleep(1.0)  # every probe arrived
    for sub in (sub0, sub2):
        with sub.got:
            del sub.messages[:]
    assert mosquitto_pub(cluster[2], "sensors/x", "one", 1).returncode == 0
    assert [m.payload for m in sub2.wait_messages(1, 10)] == [b"one"]
    assert [m.payload for m in sub0.wait_messages(1, 10)] == [b"one"]
    sub0.settle()
    sub2.settle()
    assert len(sub0.wait_messages(2, 1.0)) == 1 and len(sub2.wait_messages(2, 0.2)) == 1


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_a_copy_is_delivered_only_to_users_who_may_read_its_topic(broker_factory, tmp_path, zk_connect, flush):
    """The inbox holds every peer's topics: each copy is asked for the permission of the topic it was published to
    (reader may read every topic but payroll), by the subscriber's delivery (``sync`` flush) or by the turn that
    writes the copy (``async``: ``MqttPort.serve_copies``)."""
    acl = write_acl(tmp_path / "acl.yaml")
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 3, store={"flush": flush},
                      security={"acl_file": acl, "acl_reload_s": 0.2}).start()
    reader = Paho(cluster[0], "reader-0", user="reader", secret=SECRETS["reader"])
    assert reader.subscribe("#", 1) == [1]
    admin = Paho(cluster[2], "admin-2", user="admin", secret=SECRETS["admin"])
    wait_routed(reader, lambda i: admin.publish("orders/probe", b"probe-%d" % i, 1))
    admin.publish("payroll/alice", b"secret", 1)
    admin.publish("orders/1", b"visible", 1)
    got = reader.wait_messages(1, 15)
    time.sleep(1.0)
    assert [(m.topic, m.payload) for m in reader.messages] == [("orders/1", b"visible")], got


def test_a_clients_put_to_the_inbox_is_refused(broker_factory, tmp_path):
    """Only copies from peers go to the inbox: a put there would hand devices messages no peer published."""
    b = broker_factory(mqtt_config(tmp_path))
    with b.client() as c:
        r = c.put("%MQTTIN%", b"forged", partition=0)
        assert r.code == 400 and b"internal topic for the MQTT cluster" in r.body, r
