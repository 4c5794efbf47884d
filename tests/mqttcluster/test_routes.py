"""A broker's route to its peers at its bounds, and a followed topic deleted (docs/mqtt.md "A cluster"), on real
brokers: a route past one ROUTES frame goes in parts, and a topic an admin deletes stops being followed at once,
without ending the peers' links."""

import time

import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.mqttcluster import limits as mqttcluster_limits
from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import Cluster, wait_routed
from tests.integration.test_topic_table import admin

pytestmark = pytest.mark.slow

#: Bytes of each long filter: 80 of them (two sessions of 40, within MQTT_MAX_SUBSCRIPTIONS each) make a route past
#: MQTT_CLUSTER_ROUTES_BYTES.
LONG_BYTES = 60_000
LONG_FILTERS = 80


def long_name(i):
    return "long/%02d/%s" % (i, "x" * LONG_BYTES)


def test_a_route_past_one_routes_frame_goes_in_parts(broker_factory, tmp_path, zk_connect):
    """Broker 0's sessions subscribe filters whose route is past MQTT_CLUSTER_ROUTES_BYTES: the route goes to broker
    1 in parts, as a change of the route while the link is up and in the handshake of a link made again (broker 1
    restarted); each time a message for a filter of any part, and for a filter added after them, crosses."""
    assert LONG_FILTERS * LONG_BYTES > mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES
    assert LONG_FILTERS // 2 <= mqtt_limits.MQTT_MAX_SUBSCRIPTIONS
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    subs = [Paho(cluster[0], "long-%d" % k) for k in range(2)]
    assert subs[0].subscribe("probe/#", 1) == [1]
    pub = Paho(cluster[1], "pub-long")
    wait_routed(subs[0], lambda i: pub.publish("probe/x", b"probe-%d" % i, 1))
    for i in range(LONG_FILTERS):
        assert subs[i % 2].subscribe(long_name(i), 1) == [1]
    assert subs[0].subscribe("after/#", 1) == [1]
    for round_ in range(2):
        wait_routed(subs[0], lambda i, pub=pub: pub.publish("after/x", b"after-%d" % i, 1))
        for i in (0, LONG_FILTERS // 2, LONG_FILTERS - 1):  # the first part's, a middle one's and the last's
            pub.publish(long_name(i), b"long-%d" % i, 1)
            got = subs[i % 2].wait_messages(1, 10.0)
            assert [(m.topic, m.payload) for m in got] == [(long_name(i), b"long-%d" % i)], (round_, i)
            with subs[i % 2].got:
                del subs[i % 2].messages[:]
        if round_ == 0:
            pub.close()
            cluster.restart(1)  # broker 0's link to it is made again: the whole route in the handshake
            pub = Paho(cluster[1], "pub-long")
    assert "goes in" in cluster[0].log_text()  # the parts are logged


def test_a_deleted_topic_stops_being_followed_at_once(broker_factory, tmp_path, zk_connect):
    """Broker 0's subscriber follows topic ``gone`` of broker 1; an admin deletes it there and makes it again, at
    once, after a moment, and after longer than a heartbeat (the follow woken by the deletion, or not woken by
    anything but the heartbeat), and a message is published to it right after each: the follow dropped the topic at
    the deletion's wake, so each time it follows the topic made again from its start and each message crosses, in
    order; the link is never ended."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    admin(cluster[1], "topics", "create", "gone")  # known when the route comes: followed from its end then
    sub = Paho(cluster[0], "sub-deleted")
    assert sub.subscribe("gone/#", 1) == [1]
    pub = Paho(cluster[1], "pub-deleted")
    wait_routed(sub, lambda i: pub.publish("gone/x", b"probe-%d" % i, 1))
    sent = []
    for n, pause in enumerate((0.0, 0.3, 1.5, 3.0)):
        admin(cluster[1], "topics", "delete", "gone", "--yes")
        time.sleep(pause)
        admin(cluster[1], "topics", "create", "gone")
        sent.append(b"again-%d" % n)
        pub.publish("gone/y", sent[-1], 1)
        got = sub.wait_messages(len(sent), 10.0)
        assert [m.payload for m in got] == sent, (pause, [m.payload for m in got])
    assert "link to peer broker 1" not in cluster[0].log_text(), cluster[0].log_text()[-3000:]  # "... lost"
    assert "link ended:" not in cluster[1].log_text(), cluster[1].log_text()[-3000:]
