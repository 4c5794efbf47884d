"""Across a cluster of three brokers: a persistent session offline keeps what another broker received, retained
messages and wills are the cluster's, and a restarted broker (stopped, or killed) resumes its links with nothing
lost and nothing twice (its resume positions are its inbox's)."""

import time

import pytest

from metaq.client.raw import TextClient
from metaq.mqtt import wire
from metaq.mqtt.records import partition_for
from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho, Raw, mosquitto_pub
from tests.harness.mqttcluster import wait_routed
from tests.harness.replication import stats

pytestmark = pytest.mark.slow


def probe(broker, topic="sensors/probe"):
    return lambda i: mosquitto_pub(broker, topic, "probe-%d" % i, 0)


def test_a_persistent_session_offline_keeps_what_another_broker_received(cluster):
    c = Paho(cluster[0], client_id="away", version=V311, clean=False)
    assert c.subscribe("sensors/#", qos=1) == [1]
    wait_routed(c, probe(cluster[2]))
    c.settle()
    c.close()
    for i in range(5):
        assert mosquitto_pub(cluster[2], "sensors/away", "m%d" % i, 1).returncode == 0
    c = Paho(cluster[0], client_id="away", version=V311, clean=False)
    assert c.session_present
    got = c.wait_messages(5, 15)
    assert [m.payload for m in got] == [b"m%d" % i for i in range(5)]


def test_a_retained_message_set_on_one_broker_reaches_a_new_subscriber_on_another(cluster):
    assert mosquitto_pub(cluster[1], "sensors/state", "on", 1, "mqttv5", "-r").returncode == 0
    wait_for(lambda: stats(cluster[2]).get("mqtt_cluster_retained") == "1", 15, "the retained message reached 2")
    sub = Paho(cluster[2], "late")
    sub.subscribe("sensors/#", 1)
    got = sub.wait_messages(1, 10)
    assert [(m.topic, m.payload, m.retain) for m in got] == [("sensors/state", b"on", True)]
    # cleared on another broker than the one that set it: cleared everywhere
    assert mosquitto_pub(cluster[0], "sensors/state", "", 1, "mqttv5", "-r").returncode == 0
    wait_for(lambda: all(stats(cluster[i]).get("mqtt_cluster_retained") == "0" for i in (1, 2)), 15,
             "the clear reached 1 and 2")
    for i in range(3):
        again = Paho(cluster[i], "later-%d" % i)
        again.subscribe("sensors/#", 1)
        time.sleep(0.5)
        assert again.messages == [], i


def test_a_wildcard_subscriber_gets_a_peers_retained_message_of_a_topic_its_broker_never_held(cluster):
    before = int(stats(cluster[2]).get("mqtt_cluster_retained", "0"))
    assert mosquitto_pub(cluster[1], "fresh/state", "on", 1, "mqttv5", "-r").returncode == 0
    wait_for(lambda: int(stats(cluster[2]).get("mqtt_cluster_retained", "0")) > before, 15, "it reached 2")
    with TextClient("127.0.0.1", cluster[2].port) as c:
        assert "fresh" not in c.stats_dict("topics")  # broker 2 never had the metaq topic the name is stored in
    sub = Paho(cluster[2], "wild")
    sub.subscribe("+/state", 1)
    got = sub.wait_messages(1, 10)
    assert [(m.topic, m.payload, m.retain) for m in got] == [("fresh/state", b"on", True)]
    assert mosquitto_pub(cluster[1], "fresh/state", "", 1, "mqttv5", "-r").returncode == 0  # cleared for the next


def test_a_will_of_a_client_gone_from_one_broker_reaches_a_subscriber_on_another(cluster):
    watcher = Paho(cluster[0], "watcher")
    watcher.subscribe("status/#", qos=1)
    wait_routed(watcher, probe(cluster[2], "status/probe"))
    gone = Raw(cluster[2])
    assert gone.connect("dev-a", will=wire.Will("status/dev-a", b"offline", 1)).reason_code == 0
    gone.close()  # no DISCONNECT: the will goes
    got = watcher.wait_messages(1, 15)
    assert [(m.topic, m.payload) for m in got] == [("status/dev-a", b"offline")]


def _names_in_two_partitions():
    """``(name, probe, other)``: MQTT names of topic sensors (2 partitions), the first two in one partition, the
    third in the other."""
    names = ["sensors/n%d" % i for i in range(20)]
    first = partition_for(names[0], 2)
    same = [n for n in names if partition_for(n, 2) == first]
    other = next(n for n in names if partition_for(n, 2) != first)
    return same[0], same[1], other


@pytest.mark.fault
@pytest.mark.parametrize("kill", [False, True], ids=["stopped", "killed"])
def test_a_restarted_broker_resumes_with_nothing_lost_and_nothing_twice(cluster, kill):
    """Broker 0 holds a persistent session; it is stopped (or killed -9) while broker 2 takes publishes, and after
    its restart the session gets every one of them once, in order, the ones copied before the restart too, and
    those of a partition of which nothing had been copied before (its position was kept all the same)."""
    name, probe_name, other = _names_in_two_partitions()
    c = Paho(cluster[0], client_id="keeper", version=V311, clean=False)
    assert c.subscribe("sensors/#", qos=1) == [1]
    wait_routed(c, probe(cluster[2], probe_name))
    pub = Paho(cluster[2], "pub")
    for i in range(20):
        pub.publish(name, b"%d" % i, 1)
    assert len(c.wait_messages(20, 15)) == 20
    c.settle()
    c.close()
    for i in range(20, 40):  # copied into 0's inbox while the session is away
        pub.publish(name, b"%d" % i, 1)
    wait_for(lambda: int(stats(cluster[0]).get("mqtt_cluster_copied", 0)) >= 40, 15, "copied before the restart")
    cluster[0].kill() if kill else cluster[0].stop()
    for i in range(40, 60):  # published while broker 0 is down
        pub.publish(name, b"%d" % i, 1)
    pub.publish(other, b"other", 1)  # a partition broker 0 followed and never copied from
    cluster[0].start()
    cluster.wait_linked()
    c = Paho(cluster[0], client_id="keeper", version=V311, clean=False)
    assert c.session_present
    c.wait_messages(41, 20)
    c.settle()
    time.sleep(1.0)
    got = [m.payload for m in c.messages if m.topic == name]
    assert got == [b"%d" % i for i in range(20, 60)], got
    assert [m.payload for m in c.messages if m.topic == other] == [b"other"]
