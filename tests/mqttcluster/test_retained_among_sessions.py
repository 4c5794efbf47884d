"""Retained messages reach a peer however many sessions' records surround them in the sessions' log of the broker
that holds them: a peer's follow reads that log only where a retained record may lie (``PeerFollow._retained``, the
port's ``RetainedMark``), and what the broker's log held when it began writing it (a restart, a promotion) is read in
full."""

import time

import pytest

from metaq.mqtt import wire
from metaq.serving.replication.link import LINK_TIMEOUT_S
from tests.harness.broker import wait_for
from tests.harness.mqtt import Paho, Raw, mosquitto_pub
from tests.harness.mqttcluster import Cluster, FollowedGroup
from tests.harness.replication import caught_up, stats

pytestmark = pytest.mark.slow


def sessions(broker, n, prefix):
    """``n`` persistent sessions connected and gone: a record each (two) in ``broker``'s sessions' log."""
    for i in range(n):
        raw = Raw(broker)
        ack = raw.connect("%s-%d" % (prefix, i), clean_start=False, properties={"session_expiry_interval": 600})
        assert ack is not None and ack.reason_code == 0, ack
        raw.send(wire.Disconnect(0))
        raw.close()


def retained_count(broker):
    return int(stats(broker).get("mqtt_cluster_retained", "0"))


def got_retained(broker, topic_filter, client_id):
    """The retained messages a new subscription of ``topic_filter`` on ``broker`` is sent."""
    sub = Paho(broker, client_id)
    sub.subscribe(topic_filter, 1)
    wait_for(lambda: any(m.retain for m in sub.messages), 10, "a retained message for %s" % topic_filter)
    return [(m.topic, m.payload) for m in sub.messages if m.retain]


def test_set_and_cleared_among_sessions_and_across_a_restart_of_the_broker_holding_it(cluster):
    sessions(cluster[1], 20, "before")
    assert mosquitto_pub(cluster[1], "storm/state", "on", 1, "mqttv5", "-r").returncode == 0
    sessions(cluster[1], 20, "after")
    wait_for(lambda: retained_count(cluster[2]) == 1, 15, "the retained message reached 2")
    assert got_retained(cluster[2], "storm/#", "late") == [("storm/state", b"on")]
    assert mosquitto_pub(cluster[1], "storm/state", "", 1, "mqttv5", "-r").returncode == 0
    sessions(cluster[1], 10, "cleared")
    wait_for(lambda: retained_count(cluster[2]) == 0, 15, "the clear reached 2")
    # set while broker 2 is away, then broker 1 restarts: its log from before is read in full by 2's new follow
    cluster[2].stop()
    assert mosquitto_pub(cluster[1], "storm/state", "again", 1, "mqttv5", "-r").returncode == 0
    sessions(cluster[1], 20, "away")
    cluster[1].stop()
    cluster[1].start()
    sessions(cluster[1], 20, "restarted")
    cluster[2].start()
    cluster.wait_linked()
    wait_for(lambda: retained_count(cluster[2]) == 1, 15, "the retained message reached 2 after the restarts")
    assert got_retained(cluster[2], "storm/#", "later") == [("storm/state", b"again")]
    assert mosquitto_pub(cluster[1], "storm/state", "", 1, "mqttv5", "-r").returncode == 0
    wait_for(lambda: retained_count(cluster[2]) == 0, 15, "the clear after the restart reached 2")


@pytest.mark.fault
def test_a_retained_message_the_old_master_wrote_reaches_a_peer_from_the_promoted_slave(broker_factory, tmp_path,
                                                                                          zk_connect, capsys):
    """Broker 0 is away while broker 1's master retains a message amid sessions' records; the master dies, its slave
    (which holds them by replication) is promoted, and broker 0, back, gets the message from it, then what the new
    master retains."""
    group = FollowedGroup(broker_factory, tmp_path, zk_connect)
    m1, s1, b0 = group.m1, group.s1, group.b0
    sessions(m1, 10, "m")
    group.keeper.close()
    b0.stop()
    assert mosquitto_pub(m1, "sensors/kept", "m1", 1, "mqttv5", "-r").returncode == 0
    sessions(m1, 20, "m-after")
    caught_up(m1, s1)
    m1.kill()
    b0.start()
    group.promote_slave(capsys)
    wait_for(lambda: retained_count(b0) == 1, 20, "the old master's retained message reached 0")
    assert got_retained(b0, "sensors/kept", "late") == [("sensors/kept", b"m1")]
    sessions(s1, 20, "s")
    assert mosquitto_pub(s1, "sensors/new", "s1", 1, "mqttv5", "-r").returncode == 0
    sessions(s1, 20, "s-after")
    wait_for(lambda: retained_count(b0) == 2, 20, "the new master's retained message reached 0")


def test_a_peers_link_stays_up_while_sessions_records_keep_waking_its_follow(broker_factory, tmp_path, zk_connect):
    """Persistent sessions connecting and leaving a broker twenty times a second for longer than a link's timeout:
    each wakes the peer's follow of the sessions' log and sends it nothing, yet the peer hears a frame every
    HEARTBEAT_S and its link stays up (``mqtt_cluster_links_lost`` 0 on both)."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    a, b = cluster[0], cluster[1]
    wait_for(lambda: stats(b).get("mqtt_cluster_peers_up") == "1", 30, "b follows a")
    until, i = time.monotonic() + LINK_TIMEOUT_S * 1.3, 0
    while time.monotonic() < until:
        sessions(a, 1, "churn-%d" % i)
        i += 1
        time.sleep(0.05)
    assert i > LINK_TIMEOUT_S * 2  # more than one wake a second, every second
    assert stats(b).get("mqtt_cluster_links_lost") == "0" and stats(b).get("mqtt_cluster_peers_up") == "1"
    assert stats(a).get("mqtt_cluster_links_lost") == "0"
