"""A peer whose last copies are of an epoch the group's new master never held (``async`` mode): broker 1's slave
``s1`` lags at offset 3 while its master ``m1`` acknowledges 3..12 alone, and broker 0 is away then too. ``m1``
stops, ``s1`` is promoted and writes from offset 3 (the middle master, its epoch begun before where ``m1``'s ended),
and broker 0, back, copies those. Then ``s1`` stops and ``m1`` is promoted again: it never held ``s1``'s epoch, and
its own ended at 13, past where broker 0's copy entered ``s1``'s (3). Broker 0 resumes at 3, not at 13: its
subscriber gets what ``m1`` wrote at 3..12, which it never copied, and what ``m1`` writes after."""

import pytest

from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho
from tests.harness.mqttcluster import FollowedGroup
from tests.harness.replication import caught_up, stats
from tests.mqttcluster.test_two_failovers import ONE_PARTITION, back_with, bodies, promote, put

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def test_a_peer_resumes_where_its_copy_entered_an_epoch_the_new_master_never_held(broker_factory, tmp_path,
                                                                                    zk_connect, capsys):
    group = FollowedGroup(broker_factory, tmp_path, zk_connect, topics=ONE_PARTITION)
    b0, m1, s1, sub = group.b0, group.m1, group.s1, group.keeper
    with sub.got:
        del sub.messages[:]
    for i in range(3):
        put(m1, b"old-%d" % i)
    caught_up(m1, s1)
    wait_for(lambda: len(bodies(sub, 3, 0.2)) >= 3, 15, "broker 0 copied the first three")
    sub.close()
    s1.stop()
    b0.stop()  # neither sees what follows: the async master acknowledges it alone
    for i in range(3, 13):
        put(m1, b"old-%d" % i)
    m1.stop()
    s1.start()
    promote(s1, capsys)
    for i in range(15):
        put(s1, b"mid-%d" % i)  # the middle master: offsets 3..17, its epoch begun at 3
    b0.start()
    back = Paho(b0, client_id="keeper", version=V311, clean=False)
    assert bodies(back, 15, 30) == [b"mid-%d" % i for i in range(15)]
    wait_for(lambda: stats(b0).get("mqtt_cluster_peer_1", "").startswith("up"), 15, "broker 0 follows s1")
    back.close()
    b0.stop()
    s1.stop()
    m1.start()
    promote(m1, capsys)
    for i in range(3):
        put(m1, b"new-%d" % i)
    got = back_with(b0, 13)
    assert got == [b"old-%d" % i for i in range(3, 13)] + [b"new-%d" % i for i in range(3)], got
