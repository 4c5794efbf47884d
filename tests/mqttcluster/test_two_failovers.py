"""A peer away through two failovers of one group in a row (``async`` mode): broker 0 follows broker 1 and copies
a tail its master ``m1`` acknowledged alone; broker 0 stops; ``m1`` dies, its slave ``s1`` is promoted and writes
messages at the lost tail's offsets (the middle master); a fresh slave ``s2`` copies them, ``s1`` dies, ``s2`` is
promoted and writes more. Broker 0 comes back with its position past the middle master's messages and the epoch of
its last copy (``m1``'s): ``s2`` answers where that epoch ended in its history, and broker 0 resumes there, so its
subscriber gets the middle master's messages and the last one's, and none of what it had twice."""

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port
from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho
from tests.harness.mqttcluster import FollowedGroup, cluster_config
from tests.harness.replication import caught_up, stats

pytestmark = [pytest.mark.slow, pytest.mark.fault]

ONE_PARTITION = [{"name": "*", "partitions": 1}]


def put(broker, body):
    with broker.client() as c:
        r = c.put("sensors", body, 0)
    assert getattr(r, "code", None) == 200, r


def promote(member, capsys):
    wait_for(lambda: stats(member)["replication_link"] == "down", 15, "the slave sees its master gone")
    assert admin.main(["promote", "127.0.0.1:%d" % member.port, "--force"]) == 0, capsys.readouterr()
    wait_for(lambda: stats(member)["replication_role"] == "master", 15, "promoted")


def bodies(sub, n, timeout):
    return [m.payload for m in sub.wait_messages(n, timeout) if not m.payload.startswith(b"p")]


def back_with(b0, n):
    """Start broker 0 again, reconnect its persistent subscriber and return what it gets once ``n`` came and the
    stream settled (one more looked for: none sent twice)."""
    b0.start()
    back = Paho(b0, client_id="keeper", version=V311, clean=False)
    back.wait_messages(n, 30)
    back.settle()
    return bodies(back, n + 1, 1.0)


def test_a_peer_away_through_two_failovers_gets_what_the_middle_master_wrote(broker_factory, tmp_path, zk_connect,
                                                                             capsys):
    group = FollowedGroup(broker_factory, tmp_path, zk_connect, topics=ONE_PARTITION)
    b0, m1, s1, sub = group.b0, group.m1, group.s1, group.keeper
    with sub.got:
        del sub.messages[:]
    for i in range(3):
        put(m1, b"old-%d" % i)
    caught_up(m1, s1)
    s1.stop()  # the slave misses what follows: the async master acknowledges it alone
    for i in range(3, 13):
        put(m1, b"old-%d" % i)
    wait_for(lambda: len(bodies(sub, 13, 0.2)) >= 13, 15, "broker 0 copied the tail")
    sub.close()
    b0.stop()  # broker 0 is away through both failovers
    m1.kill()
    s1.start()
    promote(s1, capsys)
    for i in range(5):
        put(s1, b"mid-%d" % i)  # the middle master: at the lost tail's first offsets
    s2cfg = cluster_config(tmp_path / "s2", 1, zk_connect, topics=ONE_PARTITION)
    s2cfg["replication"] = {}
    s2_port = free_port()
    s2 = broker_factory(s2cfg, workdir=tmp_path / "s2", extra_args=[
        "--slave-of", "127.0.0.1:%d" % group.s1_port, "--slave-id", "2", "--replication-port", str(s2_port)])
    caught_up(s1, s2)
    s1.kill()
    promote(s2, capsys)
    for i in range(3):
        put(s2, b"new-%d" % i)
    got = back_with(b0, 8)
    assert got == [b"mid-%d" % i for i in range(5)] + [b"new-%d" % i for i in range(3)], got
    assert "past where its epoch 1 ended" in s2.log_text()
