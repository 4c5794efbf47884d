"""Issue 41 point 4 with real brokers and a real ZooKeeper (``ha: auto``): only the master takes offset commits.

A member that is not the master refuses a commit by every door (text ``commit_offset``, RocketMQ
UPDATE_CONSUMER_OFFSET, the HTTP offset reset) with ``503 NOT_MASTER`` naming the elected master, and stores
nothing; the client's broker offset store sends the commit there. After a failover commits go to the new master,
and the old one, back as a slave, takes the new master's table (the replication OFFSETS frames): the members'
tables agree. A master paused past its session refuses commits the moment it resumes (its lease), never 200.
"""

import os
import signal

import pytest

from metaq import errors
from metaq.client.connection import ConnectionPool
from metaq.client.local import free_port
from metaq.client.message import Partition
from metaq.client.raw import PULL_FLAGS, RemotingClient
from metaq.client.offsets import BrokerOffsetStore
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.headers import PULL_COMMIT_OFFSET
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode as C
from tests.harness.broker import wait_for
from tests.harness.ha import SESSION_MS, Group, put_until_ok
from tests.harness.http import request
from tests.harness.rocketmq import committed, pull
from tests.integration.test_replication_offsets import REACH_S, holds, offsets_of, query

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def url(broker):
    return "meta://127.0.0.1:%d" % broker.port


def commit_reply(broker, group, topic, partition, offset):
    with broker.client() as c:
        return c.call(ev.CommitOffset(group, topic, partition, offset, c.opaque()))


def assert_not_master(reply, master):
    """A ``result 503 NOT_MASTER ...`` naming ``master`` (a BrokerProcess)."""
    assert reply.code == 503, reply
    text = bytes(reply.body).decode()
    assert text.startswith("NOT_MASTER: this broker is not the master: "), text
    assert text.endswith("; the master is %s" % url(master)), text


def table(broker):
    """Every (group, topic, partition, offset) of the broker's consumer-offset table (``stats groups``)."""
    with broker.client() as c:
        lines = c.stats("groups").splitlines()
    out = set()
    for line in lines:
        words = line.split()
        if len(words) >= 5 and words[3] == "offset":
            out.add((words[0], words[1], int(words[2]), int(words[4])))
    return out


def group_with_http(broker_factory, tmp_path, zk):
    g = Group(broker_factory, tmp_path, zk, n=2, mode="async", start=False, remoting=True)
    for b in g.members:
        b.config["http"] = {"port": free_port()}
        b.start()
    return g


def test_only_the_master_takes_commits_and_the_tables_agree_after_a_failover(broker_factory, tmp_path, own_zk):
    g = group_with_http(broker_factory, tmp_path, own_zk.connect)
    first = g.master()
    other = 1 - first
    g.following(first, [other])
    master, slave = g.members[first], g.members[other]
    for i in range(8):
        put_until_ok(master, "t-a", b"m-%d" % i, partition=i % 2)
    want = {("g", "t-a", 0): 3, ("g", "t-a", 1): 2}
    for key, offset in want.items():
        assert commit_reply(master, *key, offset).code == 200
    holds(slave, want)

    # the slave refuses by every door, naming the master, and keeps the master's word
    assert_not_master(commit_reply(slave, "g", "t-a", 0, 1), master)
    assert_not_master(commit_reply(slave, "new", "t-a", 0, 1), master)
    q = {"consumerGroup": "g", "topic": "t-a", "queueId": 0}
    with RemotingClient(slave.config["remoting"]["port"]) as rc:
        r = rc.call(R.UPDATE_CONSUMER_OFFSET, dict(q, commitOffset=1))
        assert r.code == C.SERVICE_NOT_AVAILABLE and r.remark.startswith("NOT_MASTER: "), r
        assert r.remark.endswith("the master is %s" % url(master)), r.remark
        served = pull(rc, "t-a", 0, 0, group="g", sys_flag=PULL_FLAGS | PULL_COMMIT_OFFSET, commit_offset=1)
        assert served.code == C.SUCCESS, served  # served; its commit dropped, as RocketMQ's slave does
    reset = request(slave, "POST", "/api/groups/g/offsets/t-a/0?to=1&execute=1&force=1")
    assert reset.status == 503 and "NOT_MASTER" in reset.text and url(master) in reset.text, reset
    assert offsets_of(slave, {**want, ("new", "t-a", 0): None}) == {**want, ("new", "t-a", 0): None}
    assert committed(slave, "g", "t-a", 1) == {0: 3}

    # the client's store, pointed at the slave, commits on the master it names
    pool = ConnectionPool()
    try:
        BrokerOffsetStore(pool, lambda broker_id: url(slave), "g").commit({("t-a", Partition(7, 0)): (4, -1)})
        assert query(master, "g", "t-a", 0) == 4
        want[("g", "t-a", 0)] = 4
        holds(slave, want)

        # a failover: commits go to the new master; the old one, back as a slave, takes its table
        master.stop()
        assert g.master(timeout=15, exclude=(first,)) == other
        new, old = slave, master
        put_until_ok(new, "t-a", b"on the new master", partition=0)
        assert commit_reply(new, "g", "t-a", 1, 3).code == 200
        want[("g", "t-a", 1)] = 3
        old.start()
        g.following(other, [first])
        holds(old, want)
        assert_not_master(commit_reply(old, "g", "t-a", 0, 2), new)
        BrokerOffsetStore(pool, lambda broker_id: url(old), "g").commit({("t-a", Partition(7, 0)): (5, -1)})
        want[("g", "t-a", 0)] = 5
        assert offsets_of(new, want) == want
        holds(old, want)
        wait_for(lambda: table(old) == table(new), REACH_S,
                 lambda: "the members' tables agree: %s vs %s" % (table(old), table(new)))
    finally:
        pool.close()


def test_a_master_paused_past_its_session_refuses_commits_from_the_moment_it_resumes(broker_factory, tmp_path,
                                                                                      own_zk):
    g = Group(broker_factory, tmp_path, own_zk.connect, n=2, mode="async")
    first = g.master()
    other = 1 - first
    g.following(first, [other])
    old = g.members[first]
    for i in range(4):
        put_until_ok(old, "t-a", b"m-%d" % i, partition=0)
    assert commit_reply(old, "g", "t-a", 0, 2).code == 200
    holds(g.members[other], {("g", "t-a", 0): 2})
    with old.client() as c:  # connected before the pause: the first request after it is the commit
        os.kill(old.proc.pid, signal.SIGSTOP)
        try:
            new = g.members[g.master(timeout=SESSION_MS / 1000.0 * 3 + 10, exclude=(first,))]
            assert commit_reply(new, "g", "t-a", 0, 3).code == 200
        finally:
            os.kill(old.proc.pid, signal.SIGCONT)
        r = c.call(ev.CommitOffset("g", "t-a", 0, 4, c.opaque()))
        assert r.code == 503 and bytes(r.body).startswith(b"NOT_MASTER: "), r
        error = errors.parse_not_master(bytes(r.body).decode())
        assert error is not None and error.master in (None, url(new)), r  # it may not know the new one yet

    def names_the_new_master():
        reply = commit_reply(old, "g", "t-a", 0, 4)
        assert reply.code == 503, reply  # refused all along
        return errors.parse_not_master(bytes(reply.body).decode()).master == url(new)
    wait_for(names_the_new_master, 15, "the old master to name the new one")
    g.following(g.members.index(new), [first])
    holds(old, {("g", "t-a", 0): 3})  # the new master's word; the refused 4 is nowhere
    assert query(new, "g", "t-a", 0) == 3
