"""A peer's failover: broker 0 follows broker 1, whose master is killed and whose slave is promoted; broker 0 resumes
at the new master from the same positions (the slave's offsets are the master's): nothing lost, nothing twice."""

import pytest

from metaq.admin import cli as admin
from tests.harness.broker import wait_for
from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import FollowedGroup
from tests.harness.replication import caught_up, stats

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def test_after_a_peers_failover_its_new_master_is_followed_from_the_same_positions(broker_factory, tmp_path,
                                                                                     zk_connect, capsys):
    group = FollowedGroup(broker_factory, tmp_path, zk_connect)
    b0, m1, s1, srport, sub = group.b0, group.m1, group.s1, group.s1_port, group.keeper
    pub = Paho(m1, "pub")
    for i in range(10):
        pub.publish("sensors/seq", b"%d" % i, 1)
    assert len(sub.wait_messages(10, 15)) == 10
    caught_up(m1, s1)
    m1.kill()
    wait_for(lambda: stats(s1)["replication_link"] == "down", 15, "the slave sees its master gone")
    code = admin.main(["promote", "127.0.0.1:%d" % s1.port, "--force"])
    assert code == 0, capsys.readouterr()
    wait_for(lambda: stats(b0).get("mqtt_cluster_peer_1", "").startswith("up 127.0.0.1:%d" % srport), 30,
             "0 follows the new master of broker 1")
    pub = Paho(s1, "pub2")
    for i in range(10, 20):
        pub.publish("sensors/seq", b"%d" % i, 1)
    sub.wait_messages(20, 20)
    sub.settle()
    got = [m.payload for m in sub.wait_messages(21, 1.0)]
    assert got == [b"%d" % i for i in range(20)], got
