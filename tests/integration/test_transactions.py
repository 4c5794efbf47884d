"""Transactions on the wire against a real broker: kill -9, torn journal, admin decisions (F16)."""

import glob
import os
import subprocess
import sys

import pytest

from metaq.transactions.wire import XA_HEURCOM, XA_RBROLLBACK, XAER_NOTA
from tests.harness.tx import ok, payloads, prepared_branch, tput, tx, xa_code

XID1 = "XID:1:0a01:b1:test-rm"
XID2 = "XID:1:0a02:b1:test-rm"
OTHER = "XID:1:0a03:b1:other-rm"


@pytest.mark.fault
def test_kill_9_after_prepare_then_recover_and_decide(broker):
    with broker.client() as c:
        prepared_branch(c, XID1, 4)
        prepared_branch(c, XID2, 2)
        prepared_branch(c, OTHER, 1, qualifier="other-rm")
        ok(tx(c, "XID:1:0a04:b1:test-rm", "BEGIN", 30, "test-rm"))  # never prepared: rolled back by the crash
        tput(c, "XID:1:0a04:b1:test-rm", "tx", 0, b"unprepared")
        ok(tx(c, "TX:s1:1", "BEGIN"))
        tput(c, "TX:s1:1", "tx", 1, b"local, open")
        assert payloads(c, "tx", 0) == [] and payloads(c, "tx", 1) == []
    broker.kill()
    broker.start()
    with broker.client() as c:
        assert sorted(ok(tx(c, "null", "RECOVER", 0, "test-rm")).decode().split("\r\n")) == [XID1, XID2]
        assert ok(tx(c, "null", "RECOVER")).decode().split("\r\n") == sorted([XID1, XID2, OTHER])
        assert payloads(c, "tx", 0) == [] and payloads(c, "tx", 1) == []
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))
        ok(tx(c, XID2, "ROLLBACK"))
        assert xa_code(tx(c, "XID:1:0a04:b1:test-rm", "COMMIT_ONE_PHASE")) == XAER_NOTA
        assert xa_code(tx(c, "TX:s1:1", "COMMIT_ONE_PHASE")) == XAER_NOTA
        got = payloads(c, "tx", 0) + payloads(c, "tx", 1)
        assert sorted(got) == sorted(b"%s-%d" % (XID1.encode(), i) for i in range(4))
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))  # a repeated commit is answered with the decision, appends nothing
        assert xa_code(tx(c, XID2, "COMMIT_TWO_PHASE")) == XA_RBROLLBACK  # a rolled-back one says so
        ok(tx(c, XID2, "ROLLBACK"))
        assert sorted(payloads(c, "tx", 0) + payloads(c, "tx", 1)) == sorted(got)
        assert ok(tx(c, "null", "RECOVER", 0, "test-rm")) == b""
        assert ok(tx(c, "null", "RECOVER", 0, "other-rm")).decode() == OTHER


@pytest.mark.fault
def test_torn_journal_tail_is_cut_and_the_broker_starts(broker):
    """The journal is the log's: a torn log tail (the last record zeroed, as a lost page cache leaves it) is cut by
    the store's recovery, and the transaction in it with it."""
    with broker.client() as c:
        prepared_branch(c, XID1, 2)
        ok(tx(c, XID2, "BEGIN", 30, "test-rm"))
        before = int(c.stats_dict()["log_end_position"])
        tput(c, XID2, "tx", 0, b"x" * 500)  # the last journal record: we tear it
        after = int(c.stats_dict()["log_end_position"])
    broker.kill()
    segments = sorted(glob.glob(os.path.join(broker.data_dir, "commitlog", "[0-9]" * 20)))
    last = segments[-1]
    start = int(os.path.basename(last))
    assert start <= before < after
    with open(last, "r+b") as f:
        f.seek(before - start + 100)
        f.write(b"\0" * (after - before - 100))
    broker.start()
    with broker.client() as c:
        assert int(c.stats_dict()["log_end_position"]) == before  # cut at the torn record
        assert ok(tx(c, "null", "RECOVER", 0, "test-rm")).decode() == XID1
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))
        assert len(payloads(c, "tx", 0) + payloads(c, "tx", 1)) == 2


def test_admin_lists_in_doubt_and_decides_by_hand(broker):
    url = "meta://127.0.0.1:%d" % broker.port
    with broker.client() as c:
        prepared_branch(c, XID1, 3)
        lines = c.stats("transactions")
        assert XID1 + " prepared puts 3 " in lines
    admin = [sys.executable, "-m", "metaq.admincli", "--brokers", url]
    out = subprocess.run(admin + ["transactions"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert XID1 in out.stdout and "prepared" in out.stdout
    out = subprocess.run(admin + ["transactions", "commit", XID1], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with broker.client() as c:
        assert len(payloads(c, "tx", 0) + payloads(c, "tx", 1)) == 3
        assert xa_code(tx(c, XID1, "COMMIT_TWO_PHASE")) == XA_HEURCOM  # the coordinator learns what happened
        ok(tx(c, XID1, "FORGET"))
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))  # forgotten; its commit is still remembered for a while
        assert len(payloads(c, "tx", 0) + payloads(c, "tx", 1)) == 3
    out = subprocess.run(admin + ["transactions", "rollback", "XID:9:00:00:nobody"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "no broker holds" in out.stderr


@pytest.mark.slow
def test_the_broker_compacts_its_journal_and_keeps_live_branches(broker_factory, tmp_path):
    """The journal is the log's ``%TX%``: once the log has grown a segment past its last snapshot, the broker writes
    the live branches again at the log end, so retention need keep only about a segment for it."""
    from metaq.client.local import small_config
    from tests.harness.broker import wait_for

    cfg = small_config(tmp_path / "data")
    b = broker_factory(config=cfg)
    segment = cfg["store"]["segment_size"]
    with b.client() as c:
        prepared_branch(c, XID1, 2)  # live across every snapshot
        for i in range(300):  # ~1.5 MiB of finished transactions: more than a segment of journal
            key = "TX:s1:%d" % (i + 1)
            ok(tx(c, key, "BEGIN"))
            tput(c, key, "tx", 0, b"y" * 5000)
            ok(tx(c, key, "COMMIT_ONE_PHASE"))
        assert int(c.stats_dict()["tx_prepared"]) == 1
        wait_for(lambda: int(c.stats_dict()["tx_journal_bytes"]) < segment, 20,
                 lambda: "a journal snapshot: %s" % c.stats_dict()["tx_journal_bytes"])
    b.kill()
    b.start()
    with b.client() as c:
        assert ok(tx(c, "null", "RECOVER", 0, "test-rm")).decode() == XID1
        ok(tx(c, XID1, "COMMIT_TWO_PHASE"))
        from tests.harness.broker import consume_all
        assert len(consume_all(c, "tx", 0)) == 300 + 1
