"""The idempotent producers' window (idempotence/window.py): decisions, bounds, TTL, snapshots, memory."""

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.idempotence import limits as idempotence_limits
from metaq.idempotence.window import OLDER, ProducerTable, SnapshotError

NOW = 1_609_459_200_000


def test_unknown_producer_and_new_sequences_are_stored():
    t = ProducerTable(window=8)
    assert t.decide(1, "t", 0, 0) is None
    t.record(1, "t", 0, 0, 100, NOW)
    assert t.decide(1, "t", 0, 1) is None
    assert t.decide(2, "t", 0, 0) is None  # another producer
    assert t.decide(1, "t", 1, 0) is None  # another partition: its own sequence


def test_duplicate_answers_the_original_offset():
    t = ProducerTable(window=8)
    for seq in range(5):
        t.record(7, "t", 0, seq, 40 + seq, NOW)
    assert [t.decide(7, "t", 0, s) for s in range(5)] == [40, 41, 42, 43, 44]


def test_gap_inside_the_window_is_stored_then_a_duplicate():
    t = ProducerTable(window=8)
    t.record(7, "t", 0, 0, 10, NOW)
    t.record(7, "t", 0, 2, 11, NOW)  # seq 1 never arrived; 2 did
    assert t.decide(7, "t", 0, 1) is None  # the retry of 1 must be stored
    t.record(7, "t", 0, 1, 12, NOW)
    assert [t.decide(7, "t", 0, s) for s in range(3)] == [10, 12, 11]
    assert t.highest(7, "t", 0) == 2


def test_below_the_window_is_a_duplicate_whose_offset_is_no_longer_known():
    t = ProducerTable(window=4)
    for seq in range(10):
        t.record(7, "t", 0, seq, seq, NOW)
    assert t.decide(7, "t", 0, 6) == 6  # the oldest in the window: highest 9 - window 4 + 1
    assert t.decide(7, "t", 0, 5) == OLDER  # one past it: stored (nothing older can be missing), offset unknown
    assert t.decide(7, "t", 0, 0) == OLDER
    assert t.decide(7, "t", 0, 10) is None


def test_interleaved_producers_keep_every_offset_of_the_window():
    t = ProducerTable(window=16)
    for seq in range(40):
        t.record(1, "t", 0, seq, 2 * seq, NOW)
        t.record(2, "t", 0, seq, 2 * seq + 1, NOW)
    assert [t.decide(1, "t", 0, s) for s in range(24, 40)] == [2 * s for s in range(24, 40)]
    assert [t.decide(2, "t", 0, s) for s in range(24, 40)] == [2 * s + 1 for s in range(24, 40)]


def test_eviction_at_the_limit_and_one_past():
    t = ProducerTable(window=8, max_producers=3)
    for pid in (1, 2, 3):
        t.record(pid, "t", 0, 0, pid, NOW + pid)
    assert len(t) == 3 and t.evicted == 0  # at the limit: all kept
    t.record(1, "t", 0, 1, 10, NOW + 10)  # 1 is now the most recently written
    t.record(4, "t", 0, 0, 11, NOW + 11)  # one past: the least recently written (2) goes
    assert len(t) == 3 and t.evicted == 1
    assert [k[0] for k in t.keys()] == [3, 1, 4]
    assert t.decide(2, "t", 0, 0) is None  # forgotten: a resend would be stored again


def test_ttl_by_record_time():
    t = ProducerTable(window=8, ttl_ms=1000)
    t.record(1, "t", 0, 0, 0, NOW)
    t.record(2, "t", 0, 0, 1, NOW + 500)
    t.record(3, "t", 0, 0, 2, NOW + 1000)  # 1 is exactly ttl old: kept
    assert len(t) == 3 and t.expired == 0
    t.record(3, "t", 0, 1, 3, NOW + 1001)  # 1 is now older than the ttl
    assert [k[0] for k in t.keys()] == [2, 3] and t.expired == 1
    assert t.decide(1, "t", 0, 0) is None


def test_snapshot_round_trip():
    t = ProducerTable(window=8, max_producers=10)
    for seq in range(20):
        t.record(1, "tö", 3, seq, 100 + seq, NOW + seq)
        if seq % 3:
            t.record(2**63 - 1, "t", 0, seq, 200 + seq, NOW + seq)
    data, position = t.snapshot(lambda: 12345)
    assert position == 12345
    u = ProducerTable(window=8, max_producers=10)
    assert u.load(data) == 12345
    assert u.equal_to(t) and u.keys() == t.keys()
    assert u.decide(1, "tö", 3, 15) == 115


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "empty", "trailing"])
def test_corrupt_snapshot_is_refused_and_leaves_the_table_empty(damage):
    t = ProducerTable(window=8)
    for seq in range(5):
        t.record(1, "t", 0, seq, seq, NOW)
    data = bytearray(t.snapshot(lambda: 99)[0])
    if damage == "flip":
        data[-3] ^= 0x40
    elif damage == "truncate":
        del data[-5:]
    elif damage == "magic":
        data[0:4] = b"XXXX"
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"\0"
    u = ProducerTable(window=8)
    u.record(9, "x", 0, 0, 0, NOW)
    with pytest.raises(SnapshotError):
        u.load(bytes(data))
    assert len(u) == 0


def test_snapshot_waits_for_a_change_under_way():
    t = ProducerTable(window=8)
    t.record(1, "t", 0, 0, 0, NOW)
    t.begin()
    assert t.snapshot(lambda: 1) is None  # a change is under way: no snapshot of a half-made table
    t.begin()
    t.end()  # nested: still under way
    assert t.snapshot(lambda: 1) is None
    t.end()
    assert t.snapshot(lambda: 1) is not None


def _bytes_of(build):
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    keep = build()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return size, keep


def test_memory_per_producer_partition():
    """The figures the module docstring and the README give (alone: ~0.5 KiB; interleaved: ~25 KiB)."""
    n = 100

    def alone():
        t = ProducerTable()
        for pid in range(1, n + 1):
            for seq in range(idempotence_limits.IDEMPOTENCE_WINDOW + 10):
                t.record(pid, "topic-%d" % pid, 0, seq, seq, NOW)
        return t

    def interleaved():
        t = ProducerTable()
        for seq in range(idempotence_limits.IDEMPOTENCE_WINDOW):
            for pid in range(1, 21):
                t.record(pid, "topic", 0, seq, 20 * seq + pid, NOW)
        return t

    size_alone, _t = _bytes_of(alone)
    size_mixed, _u = _bytes_of(interleaved)
    per_alone, per_mixed = size_alone / n, size_mixed / 20
    print("bytes per producer-partition: alone %.0f, interleaved %.0f" % (per_alone, per_mixed))
    assert per_alone < 1024
    assert per_mixed < 24 * idempotence_limits.IDEMPOTENCE_WINDOW * 1.2


@st.composite
def record_histories(draw):
    """Records of 3 producer-partitions as a log holds them: runs of next sequences (sometimes at a non-adjacent
    offset), gaps, fills of gaps; each step either one ``record`` per sequence or one ``record_run``."""
    steps = []
    high = {}
    offset = 0
    for _ in range(draw(st.integers(1, 30))):
        key = draw(st.sampled_from([(1, "t", 0), (2, "t", 0), (1, "u", 3)]))
        first = high.get(key, -1) + 1 + draw(st.sampled_from([0, 0, 0, 1, 5, 40]))  # sometimes skips ahead
        count = draw(st.integers(1, 30))
        offset += draw(st.sampled_from([0, 0, 1, 7]))  # another writer's records in between, sometimes
        fill = None
        if first - high.get(key, -1) > 1 and draw(st.booleans()):
            fill = first - 1  # the resend of a sequence that never arrived, after later ones
        steps.append((key, first, offset, count, draw(st.integers(0, 20_000)), fill))
        offset += count + 1
        high[key] = first + count - 1
    return steps


@settings(max_examples=300, deadline=None)
@given(record_histories(), st.sampled_from([1, 4, 16]), st.sampled_from([2, 3, 10]))
def test_record_run_leaves_the_table_as_one_record_per_sequence(steps, window, max_producers):
    """The burst path records a run in one step; a rebuild from the log records each message: both must agree."""
    one, runs = (ProducerTable(window=window, max_producers=max_producers, ttl_ms=10_000) for _ in range(2))
    for (pid, topic, partition), first, offset, count, ms, fill in steps:
        t = NOW + ms
        for k in range(count):
            one.record(pid, topic, partition, first + k, offset + k, t)
        runs.record_run(pid, topic, partition, first, offset, count, t)
        if fill is not None:
            for table in (one, runs):
                table.record(pid, topic, partition, fill, offset + count, t)
        assert runs.contents() == one.contents()
        assert (runs.evicted, runs.expired) == (one.evicted, one.expired)


def test_record_run_takes_only_sequences_above_the_highest():
    t = ProducerTable(window=8)
    t.record_run(1, "t", 0, 0, 100, 5, NOW)
    assert [t.decide(1, "t", 0, s) for s in range(5)] == [100, 101, 102, 103, 104] and t.fresh(1, "t", 0, 5)
    assert not t.fresh(1, "t", 0, 4)
    for first, count in ((4, 1), (5, 0)):
        with pytest.raises(ValueError):
            t.record_run(1, "t", 0, first, 200, count, NOW)
    assert t.contents() == [((1, "t", 0), 4, NOW, [0, 100, 5], None)]  # a refused run changes nothing


# -- owners and quotas (docs/security.md "Quotas") ----------------------------------------------------------------


def _owned_table(quotas, max_producers=idempotence_limits.MAX_IDEMPOTENT_PRODUCERS):
    return ProducerTable(window=8, max_producers=max_producers, quota_of=lambda owner: quotas.get(owner, 1000))


def test_a_users_new_producers_evict_only_its_own_windows_at_the_quota_and_one_past():
    t = _owned_table({"alice": 3, "bob": 3})
    t.record(100, "t", 0, 0, 0, NOW, "bob")
    for pid in (1, 2, 3):  # at the quota: every window kept
        t.record(pid, "t", 0, 0, pid, NOW + pid, "alice")
    assert t.owners() == {"bob": 1, "alice": 3} and t.evicted == 0
    assert t.refusal(1, "t", 0, "alice") is None
    t.record(4, "t", 0, 0, 4, NOW + 4, "alice")  # one past: alice's least recently written goes, not bob's older one
    assert t.owners() == {"bob": 1, "alice": 3} and t.evicted == 1
    assert [k[0] for k in t.keys()] == [100, 2, 3, 4]
    assert t.decide(100, "t", 0, 0) == 0  # bob's resend is still a duplicate
    assert t.evicted_owner(1, "t", 0) == (True, "alice")
    assert t.refusal(1, "t", 0, "alice") == ("evicted", "alice")  # a clear answer, not a second copy
    assert t.refusal(100, "t", 0, "alice") == ("other", "bob")  # bob's producer id is not alice's to write


def test_a_full_table_refuses_a_new_window_within_the_quota_instead_of_evicting_another_users():
    t = _owned_table({"alice": 3, "bob": 3}, max_producers=4)
    for pid in (1, 2, 3):
        t.record(pid, "t", 0, 0, pid, NOW, "alice")
    t.record(100, "t", 0, 0, 9, NOW, "bob")
    assert t.refusal(101, "t", 0, "bob") == ("full", 4)  # bob within its quota, the table full of alice's
    assert t.refusal(5, "t", 0, "alice") is None  # alice at her quota: her own oldest makes room
    assert _owned_table({"carol": 0}).refusal(1, "t", 0, "carol") == ("quota", 0)


def test_a_window_without_an_owner_is_taken_by_its_first_writer():
    t = _owned_table({"alice": 2})
    t.record(1, "t", 0, 0, 0, NOW)  # a record from before quotas
    assert t.owner(1, "t", 0) == (True, None) and t.refusal(1, "t", 0, "alice") is None
    t.record(1, "t", 0, 1, 1, NOW, "alice")
    assert t.owner(1, "t", 0) == (True, "alice") and t.owners() == {"alice": 1}


def test_owners_and_evicted_windows_survive_a_snapshot():
    t = _owned_table({"alice": 2})
    for pid in (1, 2, 3):
        t.record(pid, "t", 0, 0, pid, NOW, "alice")
    t.record(9, "t", 1, 0, 0, NOW)
    data, _position = t.snapshot(lambda: 77)
    u = _owned_table({"alice": 2})
    assert u.load(data) == 77
    assert u.equal_to(t) and u.owners() == {"alice": 2, None: 1}
    assert u.refusal(1, "t", 0, "alice") == ("evicted", "alice")


def test_a_snapshot_from_before_owners_is_read():
    """Version 1 (no owners, no evicted windows), as a broker from before quotas wrote it."""
    import struct
    import zlib

    runs = struct.pack(">qqq", 0, 5, 3)
    body = struct.pack(">qiqqHI", 7, 0, 2, NOW, 1, 1) + b"t" + runs
    rest = struct.pack(">qIqIqqI", 123, 8, idempotence_limits.IDEMPOTENT_PRODUCER_TTL_MS, 4096, 0, 0, 1) + body
    data = b"MQPW" + struct.pack(">HI", 1, zlib.crc32(rest)) + rest
    t = _owned_table({})
    assert t.load(data) == 123
    assert t.contents() == [((7, "t", 0), 2, NOW, [0, 5, 3], None)] and t.decide(7, "t", 0, 1) == 6
