"""The timer index's subscriber of the log follower (timers/follow.py), on a real store: it finds the %TIMER% records
through their partition index, collects them into a bounded batch the service applies, keeps retention below what
timers.db has not committed, goes back on a cut, and maps an old timers.db's offset to a position."""

import pytest

from metaq.timers.limits import TIMER_INDEX_BATCH, TIMER_INDEX_BATCH_BYTES
from metaq.store.record import record_size
from metaq.timers import follow as follow_mod
from metaq.timers.follow import TimerFollow
from metaq.timers.handoff import Handoff
from metaq.timers.index import TimerIndex
from metaq.timers.records import TIMER_TOPIC, TimerCancel, TimerEntry, encode_cancel, encode_entry
from tests.harness.store import NOW, open_store

TLEN = len(TIMER_TOPIC.encode())


def entry(i, body=b"body"):
    return encode_entry("test", 0, 0, 1, NOW + 1000 + i, NOW, body)


def put_mixed(s, n, body=b"body"):
    """``n`` timer entries, each between two records of another topic, flushed; their ``(msg_id, position)``."""
    out = []
    for i in range(n):
        s.put("test", 0, 0, b"other" * 10, NOW)
        r = s.put(TIMER_TOPIC, 0, 0, entry(i, body), NOW)
        out.append((r.msg_id, r.log_end - record_size(TLEN, len(entry(i, body)))))
    s.put("test", 1, 0, b"tail", NOW)
    s.mark_flushed(s.flush_log())
    return out


def subscriber(s, wakes=None, **bounds):
    sub = TimerFollow(s, TIMER_TOPIC, Handoff(TLEN), (lambda: wakes.append(1)) if wakes is not None else
                      (lambda: None), **bounds)
    sub.open(0, 0)
    s.follower.add(sub, s.written_position)
    return sub


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "data")
    yield s
    s.close(NOW)


def test_only_the_timer_records_are_read_found_through_their_partition_index(store, monkeypatch):
    timers = put_mixed(store, 5)
    decoded = []
    real = follow_mod.decode_record
    monkeypatch.setattr(follow_mod, "decode_record", lambda buf, at: decoded.append(at) or real(buf, at))
    wakes = []
    sub = subscriber(store, wakes)
    store.follow_log(None)
    batch = sub.take()
    assert [m for m, _rec in batch.records] == [m for m, _pos in timers]
    assert all(isinstance(rec, TimerEntry) for _m, rec in batch.records) and len(batch.entries) == 5
    assert len(decoded) == 5  # the other topic's records were never decoded
    assert (batch.next_offset, batch.position) == (5, store.flushed_position) and wakes == [1]


def test_a_record_this_master_handed_over_is_taken_as_it_is(store):
    sub = subscriber(store)
    r = store.put(TIMER_TOPIC, 0, 0, encode_cancel(7), NOW)
    sub.handoff.add(r.offset, r.msg_id, TimerCancel(7), r.log_end)
    sub.handoff.add(r.offset + 1, 12345, TimerCancel(8), r.log_end + 100)  # not the log's id there
    r2 = store.put(TIMER_TOPIC, 0, 0, encode_cancel(9), NOW)
    store.mark_flushed(store.flush_log())
    store.follow_log(None)
    assert [rec for _m, rec in sub.take().records] == [TimerCancel(7), TimerCancel(9)]
    assert sub.handoff.taken == 1 and r2.offset == r.offset + 1


@pytest.mark.parametrize("limit", [1, 3])
def test_the_batch_holds_its_limit_and_the_next_record_waits_for_the_service(store, limit):
    put_mixed(store, limit + 1)
    sub = subscriber(store, limit=limit)
    store.follow_log(None)
    assert sub.pending() == limit  # at the limit; one past waits in the log
    first = sub.take()
    assert first.next_offset == limit and first.position < store.flushed_position
    sub.applied(first)
    store.follow_log(None)
    second = sub.take()
    assert [m for m, _r in second.records] and second.next_offset == limit + 1
    assert second.position == store.flushed_position


def test_a_full_batch_does_not_hold_the_key_index_back(store):
    from metaq.keys.limits import KEY_INDEX_STEP_BYTES
    for i in range(3):
        store.put(TIMER_TOPIC, 0, 0, entry(i), NOW)
    while store.written_position < 2 * KEY_INDEX_STEP_BYTES:
        store.put("test", 0, 0, b"y" * 2000, NOW)
    store.mark_flushed(store.flush_log())
    sub = subscriber(store, limit=1)
    steps = 0
    while store.follow_log() and steps < 10_000:
        steps += 1
    assert sub.full and sub.pending() == 1
    assert store.keys.position == store.flushed_position  # the key index went on without it
    sub.take()
    assert not sub.full
    while store.follow_log():
        pass
    assert sub.pending() == 1 and sub.full  # the next one, once the service took the first


def test_the_batch_holds_its_bytes_and_one_record_at_least(store):
    put_mixed(store, 3, body=b"x" * 300)
    size = record_size(TLEN, len(entry(0, b"x" * 300)))
    sub = subscriber(store, max_bytes=2 * size)
    store.follow_log(None)
    assert sub.pending() == 2  # at the byte bound: a third is one record past it
    sub.take()
    small = subscriber(store, max_bytes=1)
    store.follow_log(None)
    assert small.pending() == 1  # one at least
    assert TIMER_INDEX_BATCH > 0 and TIMER_INDEX_BATCH_BYTES > 0


def test_retention_keeps_what_timers_db_has_not_committed(store):
    timers = put_mixed(store, 2)
    sub = subscriber(store)
    store.follow_log(None)
    assert sub.retention_floor() == timers[0][1] == store.follower.retention_floor()
    batch = sub.take()
    assert sub.retention_floor() == timers[0][1]  # taken, not committed yet
    sub.applied(batch)
    assert sub.retention_floor() is None and store.follower.retention_floor() is None


def test_a_cut_drops_the_batch_and_timers_db_goes_back_even_for_a_batch_being_applied(store):
    timers = put_mixed(store, 4)
    sub = subscriber(store)
    store.follow_log(None)
    batch = sub.take()  # the service applies it ...
    cut = timers[2][1]
    store.truncate_log(cut, NOW)  # ... when a handshake cuts the log at the third entry
    assert sub.position == cut and sub.rewind == (cut, 2) and sub.pending() == 0
    sub.applied(batch)
    assert (sub.committed, sub.committed_offset) == (cut, 2)  # not past the cut: the rewind comes first
    assert sub.rewind == (cut, 2)
    store.truncate_log(timers[1][1], NOW)  # a second cut while timers.db goes back to the first
    sub.rewound((cut, 2))
    assert sub.rewind == (timers[1][1], 1)  # kept: timers.db goes back to it too
    sub.rewound(sub.rewind)
    assert sub.rewind is None


def test_a_cut_behind_what_timers_db_holds_relearns_from_what_it_holds(store):
    timers = put_mixed(store, 3)
    sub = subscriber(store)
    store.follow_log(None)
    sub.applied(sub.take())
    put_mixed(store, 2)
    store.follow_log(None)
    assert sub.pending() == 2
    store.truncate_log(store.written_position - 10 - record_size(len("test"), 4) + 10, NOW)  # the last record
    assert sub.pending() == 0 and sub.position == sub.committed > timers[-1][1]
    store.follow_log(None)
    assert sub.pending() == 2  # learned again from the log


def test_an_index_without_a_position_resumes_from_its_offsets_record(store, tmp_path):
    timers = put_mixed(store, 3)
    old = TimerIndex(str(tmp_path))
    old.apply([], 2, NOW)  # a timers.db from before positions: indexed up to offset 2
    assert old.indexed_position is None
    sub = TimerFollow(store, TIMER_TOPIC, Handoff(TLEN), lambda: None)
    sub.open(old.indexed_position, old.indexed_offset)
    store.follower.add(sub, store.written_position)
    assert sub.position == timers[2][1]
    store.follow_log(None)
    batch = sub.take()
    assert [m for m, _r in batch.records] == [timers[2][0]]
    old.apply(batch.records, batch.next_offset, NOW, position=batch.position)
    old.close()
    assert TimerIndex(str(tmp_path)).indexed_position == store.flushed_position


def test_an_index_without_a_position_past_every_record_resumes_at_the_log_end(store):
    put_mixed(store, 2)
    sub = TimerFollow(store, TIMER_TOPIC, Handoff(TLEN), lambda: None)
    sub.open(None, 2)
    assert sub.load(0, store.written_position) == store.written_position


class _Gone:
    """A store whose %TIMER% partition starts at offset 5 now (retention deleted 0..4)."""

    def min_offset(self, topic, partition):
        return 5

    def max_offset(self, topic, partition):
        return 8

    def record_spans(self, topic, partition, position, end, most):
        return []


def test_records_deleted_before_they_were_learned_are_counted_once():
    sub = TimerFollow(_Gone(), TIMER_TOPIC, Handoff(TLEN), lambda: None)
    sub.open(None, 2)  # an old timers.db indexed up to offset 2
    assert sub.load(100, 900) == 100 and sub.dropped == 3
    assert sub.pending() == 3 and sub.take().next_offset == 5  # timers.db's offset moves past them
    sub.open(100, 3)
    sub.load(100, 900)
    assert sub.dropped == 5  # 3, 4 gone
    assert sub.drop_below(100) == [] and sub.dropped == 5  # once


def test_a_record_that_is_no_timer_record_is_passed_over_and_the_offset_moves(store):
    wakes = []
    sub = subscriber(store, wakes)
    store.put(TIMER_TOPIC, 0, 0, b"not a timer record", NOW)
    store.put(TIMER_TOPIC, 0, 0, encode_cancel(3), NOW)
    store.mark_flushed(store.flush_log())
    store.follow_log(None)
    batch = sub.take()
    assert [rec for _m, rec in batch.records] == [TimerCancel(3)] and batch.passed == 1 and sub.dropped == 1
    assert batch.next_offset == 2 and wakes == [1]
    store.put(TIMER_TOPIC, 0, 0, b"\xff" * 40, NOW)  # a bad one alone: the service is told all the same
    store.mark_flushed(store.flush_log())
    store.follow_log(None)
    assert sub.pending() == 1 and wakes == [1, 1] and sub.take().next_offset == 3
