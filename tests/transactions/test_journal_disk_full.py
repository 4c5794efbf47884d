"""A journal on a small tmpfs filled for real (root): a put that cannot be journaled stores nothing and leaves
no partial record; a DONE that cannot be written is retried; everything recovers once space returns."""

import os
import subprocess

import pytest

from metaq.errors import TransactionError
from metaq.transactions.wire import XAER_RMFAIL
from tests.harness.store import NOW
from tests.harness.tx import TxBroker, local

pytestmark = [pytest.mark.fault, pytest.mark.root]


@pytest.fixture
def small_journal_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    jdir = tmp_path / "data" / "transactions"
    os.makedirs(jdir)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(jdir)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount tmpfs: %s" % r.stderr.decode().strip())
    try:
        yield tmp_path / "data", jdir
    finally:
        subprocess.run(["umount", "-l", str(jdir)], check=False)


def journal_size(jdir):
    return sum(os.path.getsize(os.path.join(jdir, n)) for n in os.listdir(jdir))


def fill_until_refused(b, txid, owner, data):
    while True:
        try:
            b.tx.put(txid, owner, "test", 0, 0, data, -1, NOW)
        except TransactionError as exc:
            assert exc.xa_code == XAER_RMFAIL
            return


def test_full_journal_refuses_puts_whole_and_retries_done(small_journal_fs):
    data_dir, jdir = small_journal_fs
    b = TxBroker(data_dir)
    t = local(1, "s" * 40)  # a long key: its DONE record is larger than the smallest put record
    b.tx.begin(t, "c1", 0, NOW)
    b.tx.put(t, "c1", "test", 1, 0, b"committed", -1, NOW)
    plan = b.tx.commit(t, "c1", True, NOW)
    b.tx.flush_journal()
    filler = local(1, "f")
    b.tx.begin(filler, "c2", 0, NOW)
    fill_until_refused(b, filler, "c2", b"x" * 500)
    fill_until_refused(b, filler, "c2", b"")  # now less than one empty put record is left
    size = journal_size(jdir)
    held = [i.puts for i in b.tx.in_doubt() if i.key == filler.key]
    with pytest.raises(TransactionError):
        b.tx.put(filler, "c2", "test", 0, 0, b"", -1, NOW)
    assert journal_size(jdir) == size  # the refused append left nothing behind
    assert [i.puts for i in b.tx.in_doubt() if i.key == filler.key] == held

    results = b.tx.apply_commit(plan, NOW)  # the messages go in; DONE does not fit
    assert len(results) == 1 and b.messages("test", 1) == [b"committed"]
    assert [i.state for i in b.tx.in_doubt() if i.key == t.key] == ["committing"]
    b.tx.expire(NOW)
    assert [i.state for i in b.tx.in_doubt() if i.key == t.key] == ["committing"]  # still no room

    subprocess.run(["mount", "-o", "remount,size=1m", str(jdir)], check=True)
    b.tx.expire(NOW)  # DONE retried
    assert t.key not in [i.key for i in b.tx.in_doubt()]
    b.tx.rollback(filler, "c2", NOW)
    b.tx.flush_journal()
    report = b.restart()
    assert report.torn_bytes == 0 and report.commits_completed == 0 and report.messages_reappended == 0
    assert b.messages("test", 1) == [b"committed"] and b.messages("test", 0) == []
    b.crash()
