"""The timer store's index (metaq.timers.index): pure, a tmp dir, no network."""

from metaq.timers.records import TimerCancel, TimerDone, TimerEntry
from metaq.timers.index import CANCELLED, DELIVERED, TimerIndex

NOW = 1_700_000_000_000


def entry(due, topic="t", data=b"x"):
    return TimerEntry(topic, 0, 0, 1, due, NOW, data)


def test_apply_due_and_reopen(tmp_path):
    ix = TimerIndex(str(tmp_path))
    assert (ix.indexed_offset, ix.scan_from, ix.count()) == (0, 0, 0)
    ix.apply([(1, entry(NOW + 30)), (2, entry(NOW + 10)), (3, entry(NOW + 20, topic="u"))], 3, NOW)
    assert [r[0] for r in ix.due(NOW + 20, 10)] == [2, 3]
    assert [r[0] for r in ix.due(NOW + 100, 1)] == [2]
    assert ix.next_due() == NOW + 10
    assert ix.get(1)[1:] == (NOW + 30, "t", 0, 0, 1, NOW, b"x")
    assert [r[0] for r in ix.list("u")] == [3]
    assert [r[0] for r in ix.list(after=(NOW + 10, 2))] == [3, 1]
    ix.set_scan_from(4096)
    ix.close()
    ix = TimerIndex(str(tmp_path))
    assert (ix.indexed_offset, ix.scan_from, ix.count()) == (3, 4096, 3)
    ix.close()


def test_done_and_cancel_move_to_outcomes(tmp_path):
    ix = TimerIndex(str(tmp_path))
    ix.apply([(1, entry(NOW)), (2, entry(NOW)), (3, entry(NOW))], 3, NOW)
    added, ended = ix.apply([(9, TimerDone((1, 2))), (10, TimerCancel(3)), (11, TimerCancel(1)),
                             (12, TimerCancel(77))], 7, NOW)
    assert (added, ended) == (0, [1, 2, 3])
    assert ix.count() == 0
    assert [ix.outcome(i) for i in (1, 2, 3, 77)] == [DELIVERED, DELIVERED, CANCELLED, None]
    # a replayed entry after its end stays ended
    ix.apply([(1, entry(NOW))], 8, NOW)
    assert ix.count() == 0 and ix.indexed_offset == 8
    ix.close()


def test_outcomes_limit_and_one_past(tmp_path):
    ix = TimerIndex(str(tmp_path), max_outcomes=3)
    ix.apply([(i, entry(NOW)) for i in range(1, 5)], 4, NOW)
    ix.apply([(10, TimerDone((1, 2, 3)))], 5, NOW)
    assert [ix.outcome(i) for i in (1, 2, 3)] == [DELIVERED] * 3
    ix.apply([(11, TimerDone((4,)))], 6, NOW + 1)
    assert ix.outcome(1) is None  # the oldest pruned
    assert [ix.outcome(i) for i in (2, 3, 4)] == [DELIVERED] * 3
    ix.close()


def test_failed_apply_changes_nothing(tmp_path):
    ix = TimerIndex(str(tmp_path))
    ix.apply([(1, entry(NOW))], 1, NOW)
    try:
        ix.apply([(2, entry(NOW)), (3, TimerEntry("t", 0, 0, 0, NOW, NOW, object()))], 3, NOW)
    except Exception:  # noqa: BLE001 - data sqlite cannot store
        pass
    assert ix.count() == 1 and ix.indexed_offset == 1
    ix.close()


def test_a_done_moves_scan_from_forward_in_the_same_transaction_never_back(tmp_path):
    ix = TimerIndex(str(tmp_path))
    ix.apply([(1, entry(NOW)), (2, entry(NOW))], 2, NOW)
    ix.apply([(9, TimerDone((1,)))], 3, NOW, scan_from=8192)  # the end of that DONE record in the log
    assert ix.scan_from == 8192
    ix.apply([(10, TimerDone((2,)))], 4, NOW, scan_from=4096)  # never back (a master's later position stays)
    assert ix.scan_from == 8192
    ix.close()
    ix = TimerIndex(str(tmp_path))
    assert (ix.indexed_offset, ix.scan_from) == (4, 8192)
    ix.close()


def test_rewind_goes_back_only_and_keeps_what_was_applied(tmp_path):
    ix = TimerIndex(str(tmp_path))
    ix.apply([(1, entry(NOW)), (2, entry(NOW)), (3, entry(NOW))], 3, NOW)
    ix.rewind(5)  # past indexed_offset: nothing
    assert ix.indexed_offset == 3
    ix.rewind(1)  # a cut at %TIMER% offset 1: indexed again from there, the entries stay
    assert (ix.indexed_offset, ix.count()) == (1, 3)
    ix.close()
    ix = TimerIndex(str(tmp_path))
    assert ix.indexed_offset == 1
    ix.close()


_IDS = [1, 2, 3, 4, 5, 600, 601]


def _records():
    from hypothesis import strategies as st
    ent = st.tuples(st.sampled_from(_IDS), st.integers(0, 50)).map(
        lambda t: (t[0], entry(NOW + t[1], data=b"%d" % t[1])))
    done = st.lists(st.sampled_from(_IDS + [999]), min_size=1, max_size=8).map(lambda ids: (0, TimerDone(tuple(ids))))
    cancel = st.sampled_from(_IDS + [999]).map(lambda i: (0, TimerCancel(i)))
    return st.lists(st.lists(st.one_of(ent, ent, done, cancel), max_size=12), max_size=6)


def _model_apply(pending, outcomes, batch):
    """What apply must do, one record at a time (the first end wins; a cancel needs something pending)."""
    added, ended = 0, []
    for msg_id, rec in batch:
        if isinstance(rec, TimerEntry):
            if msg_id not in outcomes and msg_id not in pending:
                pending[msg_id] = rec
                added += 1
        elif isinstance(rec, TimerCancel):
            if rec.msg_id not in outcomes and rec.msg_id in pending:
                del pending[rec.msg_id]
                outcomes[rec.msg_id] = CANCELLED
                ended.append(rec.msg_id)
        else:
            for i in rec.msg_ids:
                if i not in outcomes:
                    pending.pop(i, None)
                    outcomes[i] = DELIVERED
                    ended.append(i)
    return added, ended


def test_apply_does_what_one_record_at_a_time_would(tmp_path_factory):
    """Batched inserts (one executemany per run of entries) and a DONE's ids ended in a few statements: the same
    pending rows, outcomes and (added, ended) counts as applying each record alone, for any mix, repeated ids and
    re-applied records included."""
    from hypothesis import given, settings

    @settings(max_examples=150, deadline=None)
    @given(_records())
    def check(batches):
        ix = TimerIndex(str(tmp_path_factory.mktemp("ix")))
        pending, outcomes = {}, {}
        for n, batch in enumerate(batches, 1):
            assert ix.apply(batch, n, NOW) == _model_apply(pending, outcomes, batch)
        assert {r[0]: r[1:] for r in ix.due(NOW + 100, 100)} == {
            i: (e.due_ms, e.topic, e.partition, e.flag, e.checksum, e.born_ms, e.data) for i, e in pending.items()}
        assert {i: ix.outcome(i) for i in _IDS + [999]} == {i: outcomes.get(i) for i in _IDS + [999]}
        ix.close()
    check()


def _fill_in_batches(ix, batches, per, first_id=1):
    """``batches`` applies of ``per`` entries due at scattered times (each dirties index pages all over)."""
    msg_id = first_id
    for _ in range(batches):
        recs = []
        for _ in range(per):
            recs.append((msg_id, entry(NOW + (msg_id * 7919) % 1_000_003, data=b"d" * 100)))
            msg_id += 1
        ix.apply(recs, msg_id, NOW)
    return msg_id


def test_the_write_ahead_log_is_cut_back_to_its_limit_after_each_checkpoint(tmp_path, monkeypatch):
    """TIMER_INDEX_CHECKPOINT_PAGES and TIMER_INDEX_WAL_BYTES: after a batch far larger than a checkpoint, the
    -wal file is cut back, and after every later small batch it holds at most a checkpoint's pages and that
    batch's; without the limit (one past: none) it keeps its peak."""
    import os

    from metaq.timers import index as timerindex
    checkpoint = 64
    monkeypatch.setattr(timerindex, "TIMER_INDEX_CHECKPOINT_PAGES", checkpoint)
    limit = 256 << 10
    page = 4096 + 24  # a page in the log, with its frame header
    bound = max(limit, (checkpoint + 64) * page + 32)  # a batch of 50 entries dirties fewer than 64 pages
    peaks = {}
    for name, wal_bytes in (("limited", limit), ("unlimited", -1)):
        monkeypatch.setattr(timerindex, "TIMER_INDEX_WAL_BYTES", wal_bytes)
        d = tmp_path / name
        d.mkdir()
        ix = timerindex.TimerIndex(str(d))
        assert ix.settings() == {"cache_size": -(timerindex.TIMER_INDEX_CACHE_BYTES // 1024),
                                 "wal_autocheckpoint": checkpoint, "journal_size_limit": wal_bytes}
        _fill_in_batches(ix, 1, 20_000)  # one large batch: a log far past the checkpoint size
        sizes = []
        for k in range(6):  # small ones after it: checkpoints come, then the cut
            _fill_in_batches(ix, 1, 50, first_id=100_000 + 50 * k)
            sizes.append(os.path.getsize(str(d / "timers.db-wal")))
        peaks[name] = max(sizes)
        assert ix.count() == 20_300
        ix.close()
    assert peaks["limited"] <= bound, peaks
    assert peaks["unlimited"] > 2 * bound, peaks


def test_a_damaged_index_refuses_in_one_line_naming_the_file(tmp_path):
    # a disk review: one changed byte in SQLite's header ended the start with a thread pool's raw traceback
    import pytest

    from metaq.errors import StoreError
    TimerIndex(str(tmp_path)).close()
    path = tmp_path / "timers.db"
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF  # "SQLite format 3" no more
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="cannot open the timer index %s .*file is not a database.*restore it"
                       % path):
        TimerIndex(str(tmp_path))
    path.unlink()
    path.mkdir()  # a directory in its place
    with pytest.raises(StoreError, match="cannot open the timer index"):
        TimerIndex(str(tmp_path))


def test_the_position_is_committed_with_its_batch_and_a_rewind_only_moves_it_back(tmp_path):
    ix = TimerIndex(str(tmp_path))
    assert ix.indexed_position is None  # a new file, or one from before positions: mapped from the offset
    ix.apply([(1, entry(NOW))], 1, NOW, position=500)
    ix.rewind(5, 900)  # past both: nothing
    assert (ix.indexed_offset, ix.indexed_position) == (1, 500)
    ix.rewind(0, 200)  # a cut
    ix.close()
    ix = TimerIndex(str(tmp_path))
    assert (ix.indexed_offset, ix.indexed_position, ix.count()) == (0, 200, 1)
    ix.close()


def owned(due, owner, topic="t"):
    return TimerEntry(topic, 0, 0, 0, due, NOW, b"x", owner)


def test_each_owners_pending_count_follows_its_entries_and_survives_a_reopen(tmp_path):
    ix = TimerIndex(str(tmp_path))
    ix.apply([(1, owned(NOW + 10, "alice")), (2, owned(NOW + 20, "alice")), (3, owned(NOW + 30, "bob")),
              (4, entry(NOW + 40))], 4, NOW)
    assert ix.held == {"alice": 2, "bob": 1}  # the entry of no owner is not a user's
    ix.apply([(5, TimerDone((1, 9))), (6, TimerCancel(3)), (7, TimerCancel(3))], 7, NOW)
    assert ix.held == {"alice": 1}
    ix.apply([(1, owned(NOW + 10, "alice"))], 8, NOW)  # a replayed entry already delivered: not pending again
    assert ix.held == {"alice": 1} and ix.count() == 2
    ix.close()
    ix = TimerIndex(str(tmp_path))
    assert ix.held == {"alice": 1}
    ix.close()


def test_a_file_from_before_owners_gets_them_its_rows_no_ones(tmp_path):
    import sqlite3
    path = str(tmp_path / "timers.db")
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE pending (msg_id INTEGER PRIMARY KEY, due_ms INTEGER NOT NULL, topic TEXT NOT NULL,"
                     " partition INTEGER NOT NULL, flag INTEGER NOT NULL, checksum INTEGER NOT NULL, born_ms INTEGER "
                     "NOT NULL, data BLOB NOT NULL); INSERT INTO pending VALUES (1, 5, 't', 0, 0, 0, 1, x'00');"
                     "INSERT INTO pending VALUES (2, 6, 't', 0, 0, 0, 1, x'00');")
    db.close()
    ix = TimerIndex(str(tmp_path))
    assert ix.held == {} and ix.count() == 2 and ix.get(1)[0] == 1
    ix.apply([(3, owned(NOW, "alice")), (4, TimerDone((1, 2, 3)))], 4, NOW)
    assert ix.held == {} and ix.count() == 0
    assert dict(ix._db.execute("SELECT owner, pending FROM owners")) == {"": 0, "alice": 0}
    ix.close()


def test_owner_of_names_a_pending_rows_owner_until_it_ends(tmp_path):
    ix = TimerIndex(str(tmp_path))
    ix.apply([(1, owned(NOW + 10, "alice")), (2, entry(NOW + 20))], 2, NOW)
    assert ix.owner_of(1) == (True, "alice") and ix.owner_of(2) == (True, None)  # the second is no one's
    assert ix.owner_of(3) == (False, None)
    ix.apply([(3, TimerCancel(1))], 3, NOW)
    assert ix.owner_of(1) == (False, None)  # recalled: nothing pending to own
    ix.close()
