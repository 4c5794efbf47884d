"""A retried COMMIT or ROLLBACK of a branch already decided is answered with that decision, never "unknown
transaction" (docs/replication.md "Transactions and failover", issue 41 point 1).

Real brokers: a ``sync`` master and its slave. The slave is frozen (SIGSTOP) while a prepared XA branch is
committed: the commit is written and visible on the master but answered 503 (no slave confirmed it); the
coordinator's retry is answered 503 again while the slave stays silent, then OK once the slave has caught up,
and the messages are stored once. A rolled-back branch's retried commit answers XA_RBROLLBACK, its retried
rollback OK; another user never learns a decision that is not theirs (tests/security/test_tx_owners.py)."""

import signal

import pytest

from metaq.transactions.wire import XA_RBROLLBACK, XAER_PROTO
from tests.harness.replication import caught_up, sync_pair
from tests.harness.tx import ok, payloads, prepared_branch, tx, xa_code

XID1 = "XID:1:0b01:b1:test-rm"
XID2 = "XID:1:0b02:b1:test-rm"


@pytest.mark.fault
def test_a_commit_answered_503_is_answered_ok_on_retry_once_a_slave_confirms(broker_factory, tmp_path):
    master, slave = sync_pair(broker_factory, tmp_path, sync_timeout_ms=500)
    with master.client() as c:
        prepared_branch(c, XID1, 3)
        prepared_branch(c, XID2, 1)
        slave.proc.send_signal(signal.SIGSTOP)  # connected but silent: no confirmation comes
        try:
            r = tx(c, XID1, "COMMIT_TWO_PHASE")
            assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
            assert len(payloads(c, "tx", 0) + payloads(c, "tx", 1)) == 3  # written: visible on the master
            r = tx(c, XID1, "COMMIT_TWO_PHASE")  # the coordinator retries: still not confirmed, and says so
            assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
        finally:
            slave.proc.send_signal(signal.SIGCONT)
        caught_up(master, slave)
        assert ok(tx(c, XID1, "COMMIT_TWO_PHASE")) == b""  # now confirmed: the decision, nothing appended again
        got = sorted(payloads(c, "tx", 0) + payloads(c, "tx", 1))
        assert got == sorted(b"%s-%d" % (XID1.encode(), i) for i in range(3))
        assert xa_code(tx(c, XID1, "ROLLBACK")) == XAER_PROTO  # committed: it cannot be rolled back
        ok(tx(c, XID2, "ROLLBACK"))
        ok(tx(c, XID2, "ROLLBACK"))  # a retried rollback: done already
        assert xa_code(tx(c, XID2, "COMMIT_TWO_PHASE")) == XA_RBROLLBACK
        assert ok(tx(c, "null", "RECOVER", 0, "test-rm")) == b""
    with slave.client() as sc:
        assert sorted(payloads(sc, "tx", 0) + payloads(sc, "tx", 1)) == got
    with master.client() as c:  # the journal is the broker's: no client writes it
        r = c.put("%TX%", b"a forged PREPARE", partition=0)
        assert r.code == 400 and b"internal topic for the transaction journal" in r.body, r
