"""The log follower (store/follower.py): one rule per test, with a recording subscriber beside the key index."""

import pytest

from metaq.store.follower import FLUSHED, WRITTEN
from metaq.store.record import MARKER, MESSAGE_MAGIC
from tests.harness.store import NOW, open_store


class Recorder:
    """A subscriber that records the log position of every record it learns; its "saved state" is ``saved``
    (a position, or None: damaged or missing)."""

    def __init__(self, saved=0, follows=FLUSHED):
        self.follows = follows
        self.saved = saved
        self.position = 0
        self.learned = []  # record positions, in the order learned
        self.calls = []  # ("load" | "rebuild" | "cut" | "drop_below" | "checkpoint", argument)
        self.spans = []  # (first position, end position) each learn call walked

    def load(self, log_start, log_end):
        self.calls.append(("load", log_end))
        if self.saved is not None:
            self.position = self.saved
        return self.saved

    def rebuild(self, position):
        self.calls.append(("rebuild", position))
        self.learned, self.position = [], position

    def learn(self, buf, base, rel, stop, end):
        first = rel
        while rel < stop and end - rel >= MARKER.size:
            total, magic = MARKER.unpack_from(buf, rel)
            if magic != MESSAGE_MAGIC or total <= 0 or total > end - rel:
                break
            self.learned.append(base + rel)
            rel += total
        self.spans.append((base + first, base + rel))
        return rel

    def advance(self, position):
        self.position = max(self.position, position)

    def cut(self, position):
        self.calls.append(("cut", position))
        self.learned = [p for p in self.learned if p < position]
        self.position = min(self.position, position)

    def drop_below(self, log_start):
        self.calls.append(("drop_below", log_start))
        return []

    def checkpoint(self, if_changed=False):
        self.calls.append(("checkpoint", self.position))

    def close(self):
        pass

    def of(self, name):
        return [arg for what, arg in self.calls if what == name]


def fill(s, n, body=b"x" * 100):
    """``n`` flushed records in ``test`` (the store's segments are 4 KiB: several, each with a blank tail)."""
    for i in range(n):
        s.put("test", i % 4, 0, body, NOW)
    s.mark_flushed(s.flush_log())


def record_positions(s):
    """Every record's log position, from a subscriber that learned the whole log at once."""
    whole = Recorder()
    s.follower.add(whole, s.written_position)
    s.follow_log(None)
    return list(whole.learned)


def follow(s, max_bytes=None):
    steps = 0
    while s.follow_log(max_bytes):
        steps += 1
        assert steps < 10_000
    return steps


@pytest.fixture
def store(data_dir):
    s = open_store(data_dir)
    yield s
    s.close(NOW)


def test_a_subscriber_behind_catches_up_from_its_saved_position(store):
    fill(store, 60)
    every = record_positions(store)
    assert len(every) == 60 and every[-1] > 2 * 4096  # several segments
    behind = Recorder(saved=every[25])
    store.follower.add(behind, store.written_position)
    assert behind.of("rebuild") == [] and behind.of("cut") == []
    follow(store, 512)
    assert behind.learned == every[25:] and behind.position == store.flushed_position


def test_a_subscriber_follows_its_end_flushed_or_written(store):
    fill(store, 10)
    durable, written = Recorder(), Recorder(follows=WRITTEN)
    store.follower.add(durable, store.written_position)
    store.follower.add(written, store.written_position)
    for _ in range(5):
        store.put("test", 0, 0, b"y" * 50, NOW)  # written, not flushed
    follow(store)
    assert len(durable.learned) == 10 and durable.position == store.flushed_position
    assert len(written.learned) == 15 and written.position == store.written_position
    store.mark_flushed(store.flush_log())
    follow(store)
    assert durable.learned == written.learned


class Passive(Recorder):
    """A subscriber with nothing to learn while ``passive`` (a master's transaction journal: its own records)."""

    passive = True


def test_a_passive_subscriber_keeps_up_with_its_end_without_a_step_or_a_walk(store):
    fill(store, 10)
    quiet = Passive(follows=WRITTEN)
    store.follower.add(quiet, store.written_position)
    for _ in range(5):
        store.put("test", 0, 0, b"y" * 50, NOW)
    assert store.follow_log() is False  # nothing moved that has more to learn: the steps stop at once
    assert quiet.position == store.written_position and quiet.learned == [] and quiet.spans == []
    quiet.passive = False  # a slave's: it learns the records from where it is
    store.put("test", 1, 0, b"z" * 50, NOW)
    follow(store)
    assert len(quiet.learned) == 1 and quiet.position == store.written_position


def test_a_cut_rewinds_every_subscriber_past_it_exactly_once(store):
    fill(store, 40)
    every = record_positions(store)
    a, b = Recorder(), Recorder()
    for sub in (a, b):
        store.follower.add(sub, store.written_position)
    follow(store)
    early = Recorder(saved=every[5])  # behind the cut: added, not stepped yet
    store.follower.add(early, store.written_position)
    at = every[20]
    store.truncate_log(at, NOW)
    assert a.of("cut") == [at] and b.of("cut") == [at]  # once each
    assert early.of("cut") == []  # not past the cut: nothing to forget
    assert a.learned == every[:20] and a.position == at
    fill(store, 3)
    follow(store)
    assert a.learned == b.learned and len(a.learned) == 23 and a.learned[20] == at  # the new records, once
    assert a.of("cut") == [at] and early.learned == a.learned[5:]


def test_a_damaged_saved_state_is_rebuilt_from_the_log(store):
    fill(store, 30)
    every = record_positions(store)
    damaged = Recorder(saved=None)
    damaged.learned = [123456]  # what it held before: dropped by the rebuild
    store.follower.add(damaged, store.written_position)
    assert damaged.of("rebuild") == [every[0]]  # the log start
    follow(store)
    assert damaged.learned == every


def test_a_saved_state_past_the_log_end_is_cut_to_it(store):
    fill(store, 10)
    ahead = Recorder(saved=store.written_position + 4096)
    store.follower.add(ahead, store.written_position)
    assert ahead.of("cut") == [store.written_position] and ahead.position == store.written_position


def test_a_second_subscriber_added_later_catches_up_without_disturbing_the_first(store):
    fill(store, 50)
    first = Recorder()
    store.follower.add(first, store.written_position)
    follow(store)
    learned, spans, calls = list(first.learned), list(first.spans), list(first.calls)
    second = Recorder()
    store.follower.add(second, store.written_position)
    follow(store, 1024)
    assert second.learned == learned
    assert first.learned == learned and first.spans == spans and first.calls == calls  # never handed anything again
    fill(store, 5)
    follow(store, 1024)
    assert first.learned == second.learned and len(first.learned) == 55


def test_a_step_is_bounded_by_bytes_and_a_record_larger_than_it_is_taken_whole(data_dir):
    s = open_store(data_dir, segment_size=1 << 20)
    try:
        for i in range(40):
            s.put("test", 0, 0, b"x" * (3000 if i % 10 == 3 else 100), NOW)
        s.mark_flushed(s.flush_log())
        sub = Recorder()
        s.follower.add(sub, s.written_position)
        step = 1024
        steps = follow(s, step)
        assert len(sub.learned) == 40 and sub.position == s.flushed_position
        assert steps >= s.flushed_position // (step + 3100)
        for first, end in sub.spans:  # every walk: records that start within a step of where it began
            assert sub.learned and [p for p in sub.learned if first <= p < end][-1] < first + step
    finally:
        s.close(NOW)


def test_the_lowest_subscriber_moves_first_and_the_others_wait_within_the_step(store):
    fill(store, 60)
    every = record_positions(store)
    ahead, behind = Recorder(saved=every[50]), Recorder(saved=every[0])
    store.follower.add(ahead, store.written_position)
    store.follower.add(behind, store.written_position)
    store.follow_log(256)
    assert ahead.learned == [] and 0 < len(behind.learned) < 10
    follow(store, 256)
    assert ahead.learned == every[50:] and behind.learned == every


def test_retention_and_checkpoints_reach_every_subscriber_once(store):
    fill(store, 200)
    sub = Recorder()
    store.follower.add(sub, store.written_position)
    follow(store)
    store.checkpoint(NOW)
    assert sub.of("checkpoint") == [store.flushed_position]
    report = store.retention(NOW + 10 ** 12, floor=store.flushed_position)
    (start,) = sub.of("drop_below")
    assert report.deleted_segments and start > 0 and store.read_log(start, 1 << 20)[1] > start  # the new log start
