"""Recovery after a simulated kill -9 (nothing closed, ``abandon``) and interrupted commits, on a real store (the
journal is the log's ``%TX%``: its torn tails are the log's, tests/store).

How the interrupted commits are built (honestly, with the real code paths):
* COMMIT without DONE, nothing applied: ``commit`` + journal fsync, then the "crash" before ``apply_commit``.
* COMMIT without DONE, part applied: ``apply_commit`` really fails in ``store.put`` with DiskFull: the disk
  danger ratio is lowered so that the first message needing a new segment is refused (``check_disk`` runs
  on the real filesystem), after some messages already went into the current segment.
* DONE journaled but part of the commit lost from the log (a power loss that kept the journal's pages but
  not the log's): the commit-log bytes from the first lost record on are zeroed in the segment file, as a
  lost page cache leaves them; the store's own recovery then cuts its log there.
"""

import os

import pytest

from metaq.errors import DiskFull, TransactionError
from metaq.transactions.wire import XA_HEURCOM, XA_OK, XAER_RMFAIL
from metaq.transactions import records as R
from tests.harness.store import NOW
from tests.harness.tx import local, xid
from tests.harness.tx import body, fill, ids_in


def test_crash_rolls_back_unprepared_and_keeps_prepared(tx_broker):
    b = tx_broker
    t, x_active, x_prep = local(1), xid(1), xid(2)
    b.tx.begin(t, "c1", 0, NOW)
    b.tx.begin(x_active, None, 0, NOW)
    b.tx.begin(x_prep, None, 0, NOW)
    fill(b, t, "c1", 2)
    fill(b, x_active, None, 2)
    fill(b, x_prep, None, 3)
    assert b.tx.prepare(x_prep, None, NOW + 1) == XA_OK
    b.tx.flush_journal()
    report = b.restart()
    assert (report.rolled_back, report.prepared_kept, report.commits_completed) == (2, 1, 0)
    assert report.torn_bytes == 0
    assert b.tx.recover() == [x_prep.key]
    assert [(i.key, i.state, i.puts, i.prepared_ms) for i in b.tx.in_doubt()] == [(x_prep.key, "prepared", 3,
                                                                                    NOW + 1)]
    assert ids_in(b) == []
    report = b.restart()  # the rollbacks were journaled: nothing to do the second time
    assert (report.rolled_back, report.prepared_kept) == (0, 1)
    b.commit(x_prep, None, one_phase=False)
    assert sorted(b.messages("test", 0) + b.messages("test", 1)) == \
        sorted(body(x_prep, i) for i in range(3))
    b.restart()
    assert b.tx.recover() == [] and len(ids_in(b)) == 3


def test_prepared_branch_can_be_rolled_back_after_restart(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    fill(b, x, None, 2)
    b.tx.prepare(x, None, NOW)
    b.tx.flush_journal()
    b.restart(crash=False)
    b.tx.rollback(x, None, NOW)
    b.restart()
    assert b.tx.recover() == [] and ids_in(b) == []


def test_commit_without_done_is_completed_exactly_once(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    fill(b, x, None, 6)
    b.tx.prepare(x, None, NOW)
    plan = b.tx.commit(x, None, False, NOW)
    b.tx.flush_journal()  # COMMIT is durable; the crash comes before apply_commit
    journaled = list(plan.branch.ids)
    report = b.restart()
    assert (report.commits_completed, report.messages_reappended) == (1, 6)
    # the re-appended messages are flushed before the journal's DONE is made durable (and so visible at once)
    assert b.store.flushed_position == b.store.written_position
    assert sorted(ids_in(b)) == sorted(journaled)
    assert b.tx.recover() == []
    # lose the DONE that recovery wrote (the log's tail cut there): the next recovery finds every message in the
    # log and appends none
    [done_at] = [pos for pos, _flag, rec in b.journal() if type(rec) is R.Done]
    b.store.truncate_log(done_at, NOW)
    b.crash()
    report = b.open()
    assert (report.commits_completed, report.messages_reappended) == (1, 0)  # DONE written, nothing appended
    assert sorted(ids_in(b)) == sorted(journaled)


def _partial_commit_by_disk_full(b, n=10, size=400):
    """Commit ``n`` messages of ``size`` bytes; the store refuses them from the first one needing a new segment.
    (The commit's check for room passes, as when the disk fills between it and the appends: another process.)"""
    t = local(1)
    b.store.put("test", 3, 0, b"s", NOW)  # the first segment exists
    b.tx.begin(t, "c1", 0, NOW)
    fill(b, t, "c1", n, size)
    plan = b.tx.commit(t, "c1", True, NOW)
    b.tx.flush_journal()
    b.store.check_room = lambda nbytes, units, largest: None
    b.store.config.disk_danger_ratio = 1e-9
    with pytest.raises(TransactionError) as info:
        b.tx.apply_commit(plan, NOW)
    b.store.config.disk_danger_ratio = 0.9
    del b.store.check_room
    assert info.value.xa_code == XAER_RMFAIL and isinstance(info.value.__cause__, DiskFull)
    stored = len(ids_in(b)) - 1
    assert 0 < stored < n
    return t, list(plan.branch.ids), stored


def test_a_commit_the_full_disk_cannot_hold_is_refused_whole_and_stored_whole_later(tx_broker):
    # an attack review: 34 of 60 messages visible after a full disk, an unrelated put stored between them
    b = tx_broker
    t = local(1)
    b.store.put("test", 3, 0, b"s", NOW)
    b.tx.begin(t, "c1", 0, NOW)
    fill(b, t, "c1", 10, 400)  # needs a second segment
    plan = b.tx.commit(t, "c1", True, NOW)
    b.store.config.disk_danger_ratio = 1e-9
    with pytest.raises(TransactionError) as info:
        b.tx.apply_commit(plan, NOW)
    assert info.value.xa_code == XAER_RMFAIL and isinstance(info.value.__cause__, DiskFull)
    assert "refused before storing any of its 10 messages" in str(info.value)
    assert len(ids_in(b)) == 1 and [i.state for i in b.tx.in_doubt()] == ["committing"]  # nothing of it visible
    b.store.config.disk_danger_ratio = 0.9
    plan = b.tx.commit(t, "c1", True, NOW)
    assert len(b.tx.apply_commit(plan, NOW)) == 10 and len(ids_in(b)) == 11


def test_a_commit_that_fits_its_segment_needs_no_disk_measurement(tx_broker):
    b = tx_broker
    t = local(1)
    for partition in (0, 1):
        b.store.put("test", partition, 0, b"s", NOW)  # their segment and index files exist
    b.tx.begin(t, "c1", 0, NOW)
    fill(b, t, "c1", 2, 100)
    plan = b.tx.commit(t, "c1", True, NOW)
    b.store.check_disk = None  # not called: a commit within the active segment costs no statvfs
    try:
        assert len(b.tx.apply_commit(plan, NOW)) == 2
    finally:
        del b.store.check_disk


def test_commit_interrupted_by_a_full_disk_is_completed_by_a_later_commit(tx_broker):
    b = tx_broker
    t, journaled, stored = _partial_commit_by_disk_full(b)
    assert [i.state for i in b.tx.in_doubt()] == ["committing"]
    plan = b.tx.commit(t, "c1", True, NOW)
    assert plan.messages == 10 - stored
    assert len(b.tx.apply_commit(plan, NOW)) == 10 - stored
    assert sorted(i for i in ids_in(b) if i in journaled) == sorted(journaled)
    assert len(ids_in(b)) == 11
    b.restart()
    assert len(ids_in(b)) == 11 and b.tx.recovery.commits_completed == 0


def test_commit_interrupted_by_a_full_disk_is_completed_by_recovery(tx_broker):
    b = tx_broker
    _t, journaled, stored = _partial_commit_by_disk_full(b)
    report = b.restart()
    assert (report.commits_completed, report.messages_reappended) == (1, 10 - stored)
    assert sorted(i for i in ids_in(b) if i in journaled) == sorted(journaled)
    assert len(ids_in(b)) == 11
    b.restart()
    assert len(ids_in(b)) == 11


def test_done_whose_messages_the_log_lost_is_completed(tx_broker):
    b = tx_broker
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    fill(b, t, "c1", 6)
    results = b.commit(t, "c1")
    b.tx.flush_journal()  # DONE reached the disk, the log's last pages did not
    b.crash()
    cut = results[2].log_end  # records 3.. are lost
    for start, path in b.store.dirs.list_segments():
        size = os.path.getsize(path)
        if start + size > cut:
            with open(path, "r+b") as f:
                f.seek(max(0, cut - start))
                f.write(b"\0" * (size - max(0, cut - start)))
    report = b.open()
    assert b.store.recovery.log_end == cut
    assert (report.commits_completed, report.messages_reappended) == (1, 3)
    assert sorted(ids_in(b)) == sorted(r.msg_id for r in results)
    b.restart()
    assert sorted(ids_in(b)) == sorted(r.msg_id for r in results)


def test_partition_chosen_at_put_is_kept_through_recovery(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    chosen = [b.tx.put(x, None, "test", -1, 0, b"m%d" % i, -1, NOW) for i in range(8)]
    b.tx.prepare(x, None, NOW)
    b.tx.flush_journal()
    b.restart()
    b.commit(x, None, one_phase=False)
    for p in range(4):
        assert b.messages("test", p) == [b"m%d" % i for i, c in enumerate(chosen) if c == p]


def test_heuristic_commit_survives_a_crash_and_is_not_applied_twice(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    fill(b, x, None, 3)
    b.tx.prepare(x, None, NOW)
    plan = b.tx.heuristic(x.key, True, NOW)
    b.tx.flush_journal()  # COMMIT + HEURISTIC durable before the appends, as the broker does it
    results = b.tx.apply_commit(plan, NOW)
    report = b.restart()
    assert report.heuristic_kept == 1 and report.messages_reappended == 0
    assert b.tx.recover() == [x.key]
    assert sorted(ids_in(b)) == sorted(r.msg_id for r in results)
    with pytest.raises(TransactionError) as info:
        b.tx.commit(x, None, False, NOW)
    assert info.value.xa_code == XA_HEURCOM
    b.tx.forget(x, NOW)
    b.restart()
    assert b.tx.recover() == [] and len(ids_in(b)) == 3
