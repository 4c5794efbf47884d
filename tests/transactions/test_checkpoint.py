"""Journal roll and checkpoint (``maintain``): live branches kept, old files deleted, and a crash at every step
of the checkpoint still recovers the same state.

The intermediate states are built from two copies of the same data dir, one taken just before ``maintain``
(A) and one just after (B); only ``transactions/`` differs between them. A crash can leave:
A (snapshot not written), A + a partial ``snapshot.N.tmp``, A + the complete ``snapshot.N`` (renamed, nothing
deleted yet), the same minus some sealed journal files (deletes under way), and B.
"""

import os
import shutil

from metaq.transactions import records as R
from metaq.transactions.journal import read_snapshot
from metaq.transactions.config import TxConfig
from tests.harness.store import NOW
from tests.harness.tx import TxBroker, local, xid
from tests.harness.tx import body, fill, ids_in

SMALL = TxConfig(journal_file_size=1024)


def build(b):
    """Live at the end: x1 prepared (puts in the first file), x2 active, x3 heuristically rolled back,
    t99 committed but its messages not flushed by the store; 12 local commits in between."""
    x1, x2, x3 = xid(1), xid(2), xid(3)
    for x in (x1, x3):
        b.tx.begin(x, None, 0, NOW)
        fill(b, x, None, 3, 100)
        b.tx.prepare(x, None, NOW)
    b.tx.heuristic(x3.key, False, NOW)
    b.tx.begin(x2, None, 0, NOW)
    for n in range(1, 13):
        t = local(n)
        b.tx.begin(t, "c1", 0, NOW)
        fill(b, t, "c1", 2, 100)
        b.commit(t, "c1")
        if n == 6:
            fill(b, x2, None, 1, 100)
    b.store.mark_flushed(b.store.flush_log())  # everything so far is durable in the log ...
    t = local(99)
    b.tx.begin(t, "c1", 0, NOW)
    fill(b, t, "c1", 2, 100)
    b.commit(t, "c1")  # ... but not this commit
    for n in range(200, 206):  # push its records out of the active journal file
        b.tx.begin(local(n), "c1", 0, NOW)
        fill(b, local(n), "c1", 2, 100)
        b.tx.rollback(local(n), "c1", NOW)
    b.tx.flush_journal()
    return x1, x2, x3


def expected_ids(b):
    return sorted(ids_in(b))


def check_recovered(b, x1, x3, committed):
    assert b.tx.recover() == sorted([x1.key, x3.key])
    assert sorted(ids_in(b)) == committed  # nothing lost, nothing twice
    assert b.tx.recovery.heuristic_kept == 1
    b.commit(x1, None, one_phase=False)
    assert sorted(b.messages("test", 0) + b.messages("test", 1)).count(body(x1, 0, 100)) == 1
    assert len(ids_in(b)) == len(committed) + 3


def test_roll_and_checkpoint_keep_live_branches_and_delete_old_files(tmp_path):
    b = TxBroker(tmp_path / "d", SMALL)
    x1, x2, x3 = build(b)
    files = os.listdir(b.journal_dir)
    assert len([f for f in files if f.startswith("journal.")]) > 3
    assert b.tx.wants_maintenance
    committed = expected_ids(b)
    gone = b.tx.maintain(NOW)
    assert not b.tx.wants_maintenance
    left = sorted(os.listdir(b.journal_dir))
    assert [f for f in left if f.startswith("snapshot.")] and all(os.path.basename(p) not in left for p in gone)
    assert len([f for f in left if f.startswith("journal.")]) == 1
    snap = [f for f in left if f.startswith("snapshot.")][0]
    recs, problem = read_snapshot(os.path.join(b.journal_dir, snap), int(snap.split(".")[1]))
    assert problem is None
    keys = {getattr(r, "key", None) for r in recs}
    assert {x1.key, x2.key, x3.key} <= keys and local(1).key not in keys
    assert any(type(r) is R.Done and r.key == local(99).key for r in recs)  # its log is not flushed yet
    assert sum(1 for r in recs if type(r) is R.Put and r.key == x1.key) == 3
    assert b.tx.stats()["journal_bytes"] == sum(os.path.getsize(os.path.join(b.journal_dir, f)) for f in left)
    b.crash()
    b.open()
    assert b.tx.recovery.rolled_back == 1  # x2
    check_recovered(b, x1, x3, committed)


def test_checkpoint_drops_commits_once_the_log_is_flushed(tmp_path):
    b = TxBroker(tmp_path / "d", SMALL)
    build(b)
    b.tx.maintain(NOW)
    b.store.mark_flushed(b.store.flush_log())
    for n in range(100, 112):  # fill the active file until it rolls
        b.tx.begin(local(n), "c1", 0, NOW)
        fill(b, local(n), "c1", 2, 100)
        b.tx.rollback(local(n), "c1", NOW)
    assert b.tx.wants_maintenance
    b.tx.maintain(NOW)
    snap = [f for f in os.listdir(b.journal_dir) if f.startswith("snapshot.")]
    assert len(snap) == 1
    recs, _p = read_snapshot(os.path.join(b.journal_dir, snap[0]), int(snap[0].split(".")[1]))
    assert local(99).key not in {getattr(r, "key", None) for r in recs}
    b.crash()


def test_crash_at_every_step_of_a_checkpoint_recovers_the_same_state(fast_root):
    b = TxBroker(os.path.join(fast_root, "live"), SMALL)
    x1, _x2, x3 = build(b)
    committed = expected_ids(b)
    before = os.path.join(fast_root, "A")
    shutil.copytree(b.data_dir, before)
    sealed = sorted(f for f in os.listdir(b.journal_dir) if f.startswith("journal."))[:-1]
    b.tx.maintain(NOW)
    after = os.path.join(fast_root, "B")
    shutil.copytree(b.data_dir, after)
    b.crash()
    snap = [f for f in os.listdir(os.path.join(after, "transactions")) if f.startswith("snapshot.")][0]
    with open(os.path.join(after, "transactions", snap), "rb") as f:
        snap_bytes = f.read()

    def state(name, snapshot=None, as_name=None, delete=()):
        work = os.path.join(fast_root, name)
        shutil.copytree(before, work)
        tdir = os.path.join(work, "transactions")
        if snapshot is not None:
            with open(os.path.join(tdir, as_name), "wb") as f:
                f.write(snapshot)
        for n in delete:
            os.unlink(os.path.join(tdir, n))
        return work

    works = [
        state("not-written"),
        state("tmp-partial", snap_bytes[:len(snap_bytes) // 2], snap + ".tmp"),
        state("tmp-complete", snap_bytes, snap + ".tmp"),
        state("renamed", snap_bytes, snap),
        state("deleting", snap_bytes, snap, sealed[:2]),
        state("deleted", snap_bytes, snap, sealed),
        after,
    ]
    for work in works:
        c = TxBroker(work, SMALL)
        left = os.listdir(c.journal_dir)
        assert not [f for f in left if f.endswith(".tmp")], work
        if os.path.basename(work) not in ("not-written", "tmp-partial", "tmp-complete"):
            assert not set(sealed) & set(left), work  # what the snapshot covers is deleted at open
        check_recovered(c, x1, x3, committed)
        c.crash()
