"""A peer's failover: broker 0 follows broker 1, whose master is killed and whose slave is promoted; broker 0 resumes
at the new master from the same positions (the slave's offsets are the master's): nothing lost, nothing twice."""

import pytest

from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import FollowedGroup
from tests.harness.replication import caught_up

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def test_after_a_peers_failover_its_new_master_is_followed_from_the_same_positions(broker_factory, tmp_path,
                                                                                     zk_connect, capsys):
    group = FollowedGroup(broker_factory, tmp_path, zk_connect)
    m1, s1, sub = group.m1, group.s1, group.keeper
    pub = Paho(m1, "pub")
    for i in range(10):
        pub.publish("sensors/seq", b"%d" % i, 1)
    assert len(sub.wait_messages(10, 15)) == 10
    caught_up(m1, s1)
    m1.kill()
    group.promote_slave(capsys)
    pub = Paho(s1, "pub2")
    for i in range(10, 20):
        pub.publish("sensors/seq", b"%d" % i, 1)
    sub.wait_messages(20, 20)
    sub.settle()
    got = [m.payload for m in sub.wait_messages(21, 1.0)]
    assert got == [b"%d" % i for i in range(20)], got
