"""A peer's failover in ``async`` mode: broker 0 follows broker 1, whose master acknowledged and sent broker 0
messages its slave never got; the slave is promoted and gives those offsets to other messages. Broker 0's resume
position is past what the new master holds there: the new master proves it with the check of the record before it
(sent with ROUTES), finds another record, and resumes broker 0 from the first record of its own epoch, so broker 0
skips none of the new master's messages (its copies of the lost ones stay delivered)."""

import pytest

from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import FollowedGroup
from tests.harness.replication import caught_up

pytestmark = [pytest.mark.slow, pytest.mark.fault]

#: One partition per topic on broker 1: every message of the test at the next offset of one partition.
ONE_PARTITION = [{"name": "*", "partitions": 1}]


def test_after_an_async_peers_failover_none_of_its_new_masters_messages_is_skipped(broker_factory, tmp_path,
                                                                                   zk_connect, capsys):
    group = FollowedGroup(broker_factory, tmp_path, zk_connect, topics=ONE_PARTITION)
    m1, s1, sub = group.m1, group.s1, group.keeper
    pub = Paho(m1, "pub")
    for i in range(5):
        pub.publish("sensors/seq", b"old-%d" % i, 1)
    assert len(sub.wait_messages(5, 15)) == 5
    caught_up(m1, s1)
    s1.stop()  # the slave misses what follows: the async master acknowledges it alone
    for i in range(5, 10):
        pub.publish("sensors/seq", b"old-%d" % i, 1)
    assert len(sub.wait_messages(10, 15)) == 10  # copied to broker 0: its position is past the slave's end
    m1.kill()
    s1.start()
    group.promote_slave(capsys)
    pub = Paho(s1, "pub2")
    for i in range(10):
        pub.publish("sensors/seq", b"new-%d" % i, 1)  # at the offsets of old-5..old-9 first
    sub.wait_messages(20, 20)
    sub.settle()
    got = [m.payload for m in sub.wait_messages(21, 1.0)]
    assert got[:10] == [b"old-%d" % i for i in range(10)], got
    assert got[10:] == [b"new-%d" % i for i in range(10)], got
    assert "resumes at" in s1.log_text()
