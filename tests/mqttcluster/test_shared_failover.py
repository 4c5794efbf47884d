"""A ``$share`` group across a failover and a kill -9 (docs/mqtt.md "Shared subscriptions", "What survives what"):
the broker a message is published on assigns it to one broker's members, and that assignment is kept in the
sessions' log, so the slave promoted in its place, or the broker started again, assigns what it reads again as
before: a message goes again only to where it was assigned, never to a member of another broker, and nothing
assigned is lost."""

import socket
import time

import pytest

from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho, Raw
from tests.harness.mqttcluster import Cluster, FollowedGroup
from tests.harness.replication import caught_up, stats

pytestmark = [pytest.mark.slow, pytest.mark.fault]

HOUR = {"session_expiry_interval": 3600}


def read_acking(raw, quiet_s):
    """The PUBLISHes ``raw`` gets until none came for ``quiet_s``, each acknowledged: ``[(payload, dup)]``."""
    raw.sock.settimeout(quiet_s)
    got = []
    while True:
        try:
            p = raw.read()
        except (TimeoutError, socket.timeout):
            return got
        assert p is not None, "closed"
        if isinstance(p, wire.Publish):
            got.append((p.payload, p.dup))
            raw.send(wire.PubAck(p.packet_id))


def assignment_kept(b0, b1, fail):
    """Broker 1 (``b1``) assigns each message of a group's topic to its own member or to broker 0's. Its member
    takes one message and stops acknowledging (its window full), so the rest of its share waits in the log; then
    ``fail()`` (returning broker 1's master after it). The member resumes there and gets its share (what broker 0's
    did not get), each once but the one in flight (again, as DUP); broker 0's member gets nothing again."""
    share = "$share/g/jobs/#"
    a = Paho(b0, "member-a")
    assert a.subscribe(share, 1) == [1]
    stuck = Raw(b1)
    ack = stuck.connect("member-b", clean_start=False, properties=dict(HOUR, receive_maximum=1))
    assert ack.reason_code == 0
    stuck.send(wire.Subscribe(1, (wire.Subscription(share, 1),)))
    assert isinstance(stuck.read(), wire.Suback)
    for b in (b0, b1):
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_peer_groups") == "1", 20, "the group reached the peers")
    names = ["jobs/%d" % i for i in range(40)]
    pub = Paho(b1, "pub")
    for n in names:
        pub.publish(n, n.encode(), 1)
    pub.close()
    first = stuck.read()
    assert isinstance(first, wire.Publish)  # then its window is full: no more
    time.sleep(1.0)  # broker 0's member has its share
    a.settle()
    ours = {m.payload for m in a.messages}
    theirs = {n.encode() for n in names} - ours
    assert ours and first.payload in theirs and len(ours) == len(a.messages), (len(ours), len(a.messages))
    time.sleep(1.5)  # the session (its message in flight) and the group's read positions saved (once a second)
    master = fail()
    stuck.close()
    again = Raw(master, timeout=30)
    ack = again.connect("member-b", clean_start=False, properties=HOUR)
    assert ack.reason_code == 0 and ack.session_present
    got = read_acking(again, 5.0)
    assert got and got[0] == (first.payload, True)  # in flight: again, as DUP
    assert sorted(p for p, _dup in got) == sorted(theirs), (len(got), len(theirs))
    assert len(a.messages) == len(ours), "broker 0's member got messages again"


def test_a_promoted_slave_keeps_the_assignment_of_what_its_master_published(broker_factory, tmp_path, zk_connect,
                                                                               capsys):
    group = FollowedGroup(broker_factory, tmp_path, zk_connect)

    def fail():
        caught_up(group.m1, group.s1)
        group.m1.kill()
        group.promote_slave(capsys)
        return group.s1

    assignment_kept(group.b0, group.m1, fail)


def test_a_broker_started_again_after_a_kill_keeps_the_assignment(broker_factory, tmp_path, zk_connect):
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    assignment_kept(cluster[0], cluster[1], lambda: cluster.restart(1, kill=True))


def test_a_group_whose_members_are_all_on_a_peer_loses_nothing_while_its_link_is_down(broker_factory, tmp_path,
                                                                                      zk_connect):
    """Every member of a group on broker 1, which is killed (its link to broker 0 ends) and started again: what
    broker 0 published meanwhile stays broker 1's, copied to it once its link resumes, and its member gets all of it
    (as a plain subscription would)."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    member = Paho(cluster[1], client_id="member", version=V311, clean=False)
    assert member.subscribe("$share/g/jobs/#", 1) == [1]
    wait_for(lambda: stats(cluster[0]).get("mqtt_cluster_peer_groups") == "1", 20, "the group reached broker 0")
    pub = Paho(cluster[0], "pub")
    pub.publish("jobs/before", b"before", 1)
    assert [m.payload for m in member.wait_messages(1, 20)] == [b"before"]
    time.sleep(1.5)  # the group's read positions saved
    cluster[1].kill()
    member.close()
    wait_for(lambda: stats(cluster[0]).get("mqtt_cluster_peer_groups") == "0", 20, "broker 0 sees the link end")
    sent = [b"away-%d" % i for i in range(20)]
    for i, payload in enumerate(sent):
        pub.publish("jobs/%d" % i, payload, 1)
    pub.close()
    cluster[1].start()
    cluster.wait_linked()
    member = Paho(cluster[1], client_id="member", version=V311, clean=False)
    assert member.session_present
    got = member.wait_messages(len(sent), 30)
    assert sorted(m.payload for m in got) == sorted(sent), len(got)
