"""Transactions survive failover (issue 41 point 1; docs/replication.md "Transactions and failover").

Real brokers, ``sync`` replication: a master with prepared XA branches, a committed one and an open local
transaction; its slave holds the journal (the log's ``%TX%``) and, once promoted, lists the prepared branches
(RECOVER), commits one exactly once, answers a coordinator's retry of the commit the old master made with that
decision, and rolls the open local transaction back. A branch the old master prepared without a slave confirming
it (answered 503) is gone from the new master; when the old master rejoins, its log is cut and that branch with it:
promoted again later, it brings none of them back."""

import os

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from metaq.transactions.wire import XAER_NOTA
from tests.harness.broker import consume_all, wait_for
from tests.harness.faults import LinkProxy
from tests.harness.ha import Group
from tests.harness.replication import caught_up, master_config, stats
from tests.harness.tx import ok, prepared_branch, recovered, tput, tx, xa_code

pytestmark = pytest.mark.fault

XID1 = "XID:1:0c01:b1:test-rm"
XID2 = "XID:1:0c02:b1:test-rm"
XID3 = "XID:1:0c03:b1:test-rm"
XID4 = "XID:1:0c04:b1:test-rm"


def promote(capsys, broker):
    code = admin.main(["promote", "127.0.0.1:%d" % broker.port, "--force"])
    out = capsys.readouterr()
    assert code == admin.EXIT_OK, out.err
    wait_for(lambda: stats(broker)["replication_role"] == "master", 10, "promoted")


def slave_args(rport, slave_id, own_rport):
    return ["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", str(slave_id), "--replication-port", str(own_rport)]


def all_tx(c):
    return sorted(r.payload for p in (0, 1) for r in consume_all(c, "tx", p))


def test_prepared_branches_survive_failover_and_a_rejoining_master_brings_none_back(broker_factory, tmp_path,
                                                                                     capsys, request):
    rport, srport = free_port(), free_port()
    m = broker_factory(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=500),
                       workdir=tmp_path / "m")
    link = LinkProxy(("127.0.0.1", rport)).start()
    request.addfinalizer(link.close)
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=slave_args(int(link.address.rsplit(":", 1)[1]), 1, srport))
    wait_for(lambda: stats(m)["replication_slaves"] == "1", 10, "slave connected")
    with m.client() as c:
        prepared_branch(c, XID1, 3)  # XA_OK: the slave holds the PREPARE (sync)
        prepared_branch(c, XID2, 1)
        prepared_branch(c, XID3, 2)
        ok(tx(c, XID3, "COMMIT_TWO_PHASE"))
        ok(tx(c, "TX:s1:1", "BEGIN"))
        tput(c, "TX:s1:1", "tx", 0, b"an open local transaction")
        assert int(c.stats_dict()["tx_prepared"]) == 2
    caught_up(m, s)
    link.cut(blackhole=True)  # connected, but nothing crosses: nothing more is confirmed
    with m.client() as c:  # prepared with no slave to confirm it: written on the master, answered 503
        ok(tx(c, XID4, "BEGIN", 30, "test-rm"))
        tput(c, XID4, "tx", 0, b"only the old master holds this")
        c.send(b"transaction %s s1 END 0\r\n" % XID4.encode())
        r = tx(c, XID4, "PREPARE")
        assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
    m.kill()
    promote(capsys, s)  # it learned the master's records as they came: no restart
    with s.client() as c:
        assert recovered(c, "test-rm") == [XID1, XID2]  # the old master's prepared branches, not the unconfirmed one
        assert int(c.stats_dict()["tx_prepared"]) == 2
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))  # a coordinator's retry: the decision, stored once
        ok(tx(c, XID3, "COMMIT_TWO_PHASE"))  # the old master's commit, learned from the log: answered as made
        assert xa_code(tx(c, XID4, "COMMIT_TWO_PHASE")) == XAER_NOTA
        assert xa_code(tx(c, "TX:s1:1", "COMMIT_ONE_PHASE")) == XAER_NOTA  # rolled back at the take-over
        ok(tx(c, XID2, "ROLLBACK"))
        assert recovered(c, "test-rm") == []
        got = all_tx(c)
    expected = sorted([b"%s-%d" % (XID1.encode(), i) for i in range(3)] + [b"%s-%d" % (XID3.encode(), i)
                                                                             for i in range(2)])
    assert got == expected

    # the old master rejoins as the new master's slave: its tail (XID4's records) is cut
    m.extra_args = slave_args(srport, 2, free_port())
    m.start()
    caught_up(s, m)
    assert "CUT our tail" in m.log_text()
    s.kill()
    promote(capsys, m)
    with m.client() as c:
        # nothing resurfaces: not XID4, not the branches decided on the other master
        assert recovered(c, "test-rm") == []
        assert xa_code(tx(c, XID4, "COMMIT_TWO_PHASE")) == XAER_NOTA
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))  # the decision travelled with the log
        assert all_tx(c) == expected


def test_an_elected_member_takes_the_prepared_branches_over(broker_factory, tmp_path, zk_connect):
    """``ha: auto``, two members in ``sync`` mode: the master is killed with branches prepared; the member elected
    in its place lists them, answers the retry of the commit the old master made and, once a member follows it
    again, commits the prepared one exactly once."""
    group = Group(broker_factory, tmp_path, zk_connect, n=2, mode="sync")
    first = group.master()
    other = 1 - first
    group.following(first, [other])
    wait_for(lambda: group.insync(first) == "0,1", 20, "both members in sync")
    m, s = group.members[first], group.members[other]
    with m.client() as c:
        prepared_branch(c, XID1, 2)
        prepared_branch(c, XID3, 1)
        ok(tx(c, XID3, "COMMIT_TWO_PHASE"))
    caught_up(m, s)
    m.kill()
    assert group.master(timeout=30, exclude=(first,)) == other
    with s.client() as c:
        assert recovered(c, "test-rm") == [XID1]
        ok(tx(c, XID3, "COMMIT_TWO_PHASE"))  # a decision answered: nothing to write
    m.start()  # a sync master alone writes nothing: the old master back as its member first
    group.following(other, [first])
    wait_for(lambda: group.insync(other) == "0,1", 20, "the old master back in sync")
    with s.client() as c:
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))
        ok(tx(c, XID3, "COMMIT_TWO_PHASE"))
        assert all_tx(c) == sorted([b"%s-%d" % (XID1.encode(), i) for i in range(2)] + [b"%s-0" % XID3.encode()])
