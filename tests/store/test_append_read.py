"""Appends and reads: segment and index rolls, blank tails, whole records, offsets, visibility."""

import os
import struct
from itertools import pairwise

import pytest

from metaq import errors
from metaq.store import limits as store_limits
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import HEADER, encode_payload
from metaq.store.record import BLANK_MAGIC, FIXED_OVERHEAD, MARKER, RecordTooLarge
from tests.harness.store import NOW, open_store, payload_of, read_all
from tests.harness.store import fill_to_leave


def body(i, size=100):
    head = b"m%05d:" % i
    return head + bytes([65 + i % 26]) * (size - len(head))


def test_round_trip_across_many_segment_and_index_rolls(data_dir):
    s = open_store(data_dir)
    sent = {p: [] for p in range(4)}
    for i in range(1500):
        p = i % 4
        data = body(i, 20 + (i * 37) % 300)
        r = s.put("test", p, 0, data, NOW + i)
        assert (r.partition, r.offset) == (p, len(sent[p]))
        sent[p].append(data)
    assert len(os.listdir(os.path.join(str(data_dir), "commitlog"))) > 50
    assert len(os.listdir(os.path.join(str(data_dir), "index", "test", "0"))) == 6  # 375 units / 64 per file
    for p in range(4):
        got = read_all(s, "test", p)
        assert [payload_of(g) for g in got] == sent[p]
        assert s.max_offset("test", p) == len(sent[p])
    s.close(NOW + 2000)
    s = open_store(data_dir, now=NOW + 3000)
    assert s.recovery.clean_shutdown
    for p in range(4):
        assert [payload_of(g) for g in read_all(s, "test", p)] == sent[p]
    s.close(NOW + 4000)


def test_metaq_form_is_header_plus_data_with_the_metaq_checksum(data_dir):
    s = open_store(data_dir)
    flag, data = encode_payload(b"hello", "tag1")
    r = s.put("test", 0, flag, data, NOW)
    got = read_all(s, "test", 0)[0]
    assert got == HEADER.pack(len(data), metaq_checksum(data), r.msg_id, flag) + data
    s.close(NOW)


def test_record_exactly_filling_the_segment_then_the_next_one_rolls(data_dir):
    s = open_store(data_dir)
    fill_to_leave(s, 1000)
    exact = 1000 - FIXED_OVERHEAD - 4
    r = s.put("test", 0, 0, b"e" * exact, NOW)
    assert r.log_end == 4096 and s.written_position == 4096
    r = s.put("test", 0, 0, b"next", NOW)
    assert r.log_end == 4096 + FIXED_OVERHEAD + 4 + 4
    assert payload_of(read_all(s, "test", 0)[-2]) == b"e" * exact
    s.close(NOW)


@pytest.mark.parametrize("left", [7, 8, 60, 265])
def test_blank_tail_when_a_record_does_not_fit(data_dir, left):
    s = open_store(data_dir)
    fill_to_leave(s, left)
    before = s.written_position
    r = s.put("test", 1, 0, b"y" * 200, NOW)
    assert before + left == 4096 and r.log_end == 4096 + FIXED_OVERHEAD + 4 + 200
    seg0 = open(os.path.join(str(data_dir), "commitlog", "%020d" % 0), "rb").read()
    if left >= MARKER.size:
        assert MARKER.unpack_from(seg0, before) == (left, BLANK_MAGIC)
    else:
        assert seg0[before:] == b"\0" * left
    assert payload_of(read_all(s, "test", 1)[0]) == b"y" * 200
    s.abandon()  # the blank tail must also survive recovery
    s = open_store(data_dir)
    assert s.recovery.truncated_bytes == 0 and s.recovery.corruption is None
    assert payload_of(read_all(s, "test", 1)[0]) == b"y" * 200
    s.close(NOW)


def test_record_larger_than_a_segment_is_refused_and_nothing_is_written(data_dir):
    s = open_store(data_dir)
    s.put("test", 0, 0, b"a", NOW)
    pos = s.written_position
    with pytest.raises(RecordTooLarge) as exc:
        s.put("test", 0, 0, b"z" * 4096, NOW)
    assert isinstance(exc.value, errors.ClientError) and "4096-byte segment" in str(exc.value)
    assert s.written_position == pos and s.max_offset("test", 0) == 1
    assert s.put("test", 0, 0, b"b", NOW).offset == 1
    s.close(NOW)


def test_reads_return_whole_records_within_max_size_but_at_least_one(data_dir):
    s = open_store(data_dir, segment_size=64 * 1024)
    for i in range(10):
        s.put("test", 0, 0, body(i, 80), NOW)
    one = 20 + 80
    assert s.read("test", 0, 0, 3 * one).count == 3
    assert s.read("test", 0, 0, 3 * one - 1).count == 2
    r = s.read("test", 0, 4, 1)
    assert (r.count, r.nbytes, r.next_offset) == (1, one, 5)
    assert payload_of(bytes(r.views[0])) == body(4, 80)
    r = s.read("test", 0, 7, 1 << 20)
    assert (r.count, r.next_offset) == (3, 10)
    assert all(len(v) == one for v in r.views)
    s.close(NOW)


def test_a_single_message_larger_than_max_size_and_max_transfer_is_still_returned(data_dir):
    s = open_store(data_dir, segment_size=64 * 1024, max_transfer_size=1000)
    s.put("test", 0, 0, b"s" * 10, NOW)
    s.put("test", 0, 0, b"B" * 5000, NOW)
    s.put("test", 0, 0, b"s" * 10, NOW)
    assert s.read("test", 0, 0, 1 << 20).count == 1  # capped by max_transfer_size
    r = s.read("test", 0, 1, 100)
    assert r.count == 1 and r.nbytes == 5020
    s.close(NOW)


def test_offsets_out_of_range_are_moved_and_max_gives_nothing_yet(data_dir):
    s = open_store(data_dir)
    for i in range(5):
        s.put("test", 2, 0, body(i), NOW)
    r = s.read("test", 2, 5, 1000)
    assert (r.count, r.nbytes, r.views, r.next_offset) == (0, 0, [], 5)
    with pytest.raises(errors.Moved) as exc:
        s.read("test", 2, 6, 1000)
    assert exc.value.offset == 5
    with pytest.raises(errors.Moved) as exc:
        s.read("test", 2, -1, 1000)
    assert exc.value.offset == 0
    assert [s.nearest_offset("test", 2, o) for o in (-5, 0, 3, 5, 99)] == [0, 0, 3, 5, 5]
    # a legal partition without data is empty; an unknown topic is not found
    assert s.read("test", 3, 0, 100).count == 0
    assert (s.min_offset("test", 3), s.max_offset("test", 3)) == (0, 0)
    with pytest.raises(errors.Moved) as exc:
        s.read("test", 3, 1, 100)
    assert exc.value.offset == 0
    with pytest.raises(errors.NotFound):
        s.read("test", 4, 0, 100)
    s.close(NOW)


def test_unknown_topic_is_not_found(data_dir):
    s = open_store(data_dir, topics=[("only", 1)])
    with pytest.raises(errors.NotFound):
        s.read("other", 0, 0, 100)
    with pytest.raises(errors.NotFound):
        s.max_offset("other", 0)
    with pytest.raises(errors.UnknownTopic, match="does not accept topic other"):
        s.put("other", 0, 0, b"x", NOW)
    s.close(NOW)


def test_message_ids_are_unique_and_strictly_increasing_even_when_time_goes_back(data_dir):
    s = open_store(data_dir, segment_size=1 << 20, index_file_units=8192)
    times = [NOW + 5] * 5000 + [NOW - 1000] * 10 + [NOW + 6] * 3
    ids = [s.put("test", i % 4, 0, b"i", t).msg_id for i, t in enumerate(times)]
    assert all(a < b for a, b in pairwise(ids))
    last = ids[-1]
    s.close(NOW)
    s = open_store(data_dir, now=NOW - 10 * 3600_000)  # the clock went back across the restart
    assert s.put("test", 0, 0, b"j", NOW - 10 * 3600_000).msg_id > last
    s.abandon()
    s = open_store(data_dir)  # after a crash the id comes from the scanned log
    assert s.put("test", 0, 0, b"k", NOW - 20 * 3600_000).msg_id > last
    s.close(NOW)


def test_random_partition_when_minus_one(data_dir):
    s = open_store(data_dir)
    parts = {s.put("test", -1, 0, b"r", NOW).partition for _ in range(60)}
    assert parts <= {0, 1, 2, 3} and len(parts) > 1
    s.close(NOW)


def test_sync_mode_messages_become_visible_only_after_mark_flushed(data_dir):
    s = open_store(data_dir, flush="sync")
    r1 = s.put("test", 0, 0, b"one", NOW)
    r2 = s.put("test", 1, 0, b"two", NOW)
    assert s.max_offset("test", 0) == 0 and s.read("test", 0, 0, 100).count == 0
    with pytest.raises(errors.Moved):
        s.read("test", 0, 1, 100)
    assert s.should_flush(NOW)
    pos = s.flush_log()
    assert pos == r2.log_end == s.written_position and s.flushed_position < pos
    s.put("test", 0, 0, b"three", NOW)  # written while the flush ran: not covered by it
    assert s.mark_flushed(pos) == {("test", 0), ("test", 1)}
    assert s.flushed_position == pos >= r1.log_end
    assert s.max_offset("test", 0) == 1 and s.read("test", 0, 0, 100).count == 1
    assert s.mark_flushed(s.flush_log()) == {("test", 0)}
    assert s.max_offset("test", 0) == 2
    s.close(NOW)


def test_async_flush_policy_every_n_messages_or_t_ms(data_dir):
    s = open_store(data_dir, flush_every_messages=3, flush_interval_ms=100)
    assert not s.should_flush(NOW)  # nothing written
    s.put("test", 0, 0, b"a", NOW)
    assert s.max_offset("test", 0) == 1  # visible at once in async mode
    assert not s.should_flush(NOW + 10)
    s.put("test", 0, 0, b"b", NOW)
    s.put("test", 0, 0, b"c", NOW)
    assert s.should_flush(NOW + 20)  # 3 messages
    s.mark_flushed(s.flush_log())
    s.put("test", 0, 0, b"d", NOW)
    assert not s.should_flush(NOW + 50)
    assert s.should_flush(NOW + 121)  # 100 ms since the last flush
    s.close(NOW)


def test_async_policy_counts_puts_written_while_a_flush_ran(data_dir):
    """A flush covers what was written when it began: the records appended during its fdatasync stay counted,
    so the next flush comes after ``flush_every_messages`` *unflushed* records, not that many more (it was reset
    to 0, and a power cut could lose the puts of one fdatasync plus ``flush_every_messages``)."""
    s = open_store(data_dir, flush_every_messages=3, flush_interval_ms=100_000)
    for body in (b"a", b"b", b"c"):
        s.put("test", 0, 0, body, NOW)
    assert s.should_flush(NOW)
    s.flush_plan()  # a round begins (the flusher calls it on the loop)
    pos = s.flush_log()
    for body in (b"d", b"e"):  # acknowledged while the fdatasync runs
        s.put("test", 0, 0, body, NOW)
    s.mark_flushed(pos)
    assert not s.should_flush(NOW)  # 2 unflushed
    s.put("test", 0, 0, b"f", NOW)
    assert s.should_flush(NOW)  # 3 unflushed: d, e, f (was: only f counted)
    s.flush_plan()  # a round begins (the flusher calls it on the loop)
    s.mark_flushed(s.flush_log())
    assert not s.should_flush(NOW) and s.flushed_position == s.written_position
    s.put("test", 0, 0, b"g", NOW)
    s.mark_flushed(s.flush_log())  # no mark (tests, start-up): a flush up to the end resets the count
    assert not s.should_flush(NOW)
    for body in (b"h", b"i"):
        s.put("test", 0, 0, body, NOW)
    assert not s.should_flush(NOW)
    s.close(NOW)


def test_stats_helpers(data_dir):
    s = open_store(data_dir)
    for i in range(30):
        s.put("test", i % 2, 0, b"x" * 10, NOW)
        s.put("tx", 0, 0, b"y" * 10, NOW)
    st = s.partition_stats("test", 0)
    assert (st.min_offset, st.max_offset, st.messages) == (0, 15, 15)
    assert st.log_bytes == 15 * (FIXED_OVERHEAD + 4 + 10) and st.index_bytes == 64 * 16
    assert s.topic_bytes("tx") == 30 * (FIXED_OVERHEAD + 2 + 10)
    assert s.total_messages() == 60
    assert s.partition_keys() == [("test", 0), ("test", 1), ("tx", 0)]
    assert s.known_topics() == ["test", "tx"]
    s.close(NOW)


def test_a_bad_flag_stores_nothing(data_dir):
    s = open_store(data_dir)
    s.put("test", 0, 0, b"a", NOW)
    pos = s.written_position
    with pytest.raises(errors.ClientError):
        s.put("test", 0, 1 << 40, b"b", NOW)
    assert s.written_position == pos
    assert s.put("test", 0, 0, b"c", NOW).offset == 1
    s.abandon()
    s = open_store(data_dir)
    assert s.recovery.truncated_bytes == 0 and s.max_offset("test", 0) == 2
    s.close(NOW)


def test_two_stores_cannot_open_one_data_dir(data_dir):
    s = open_store(data_dir)
    with pytest.raises(errors.StoreError, match="in use by another broker") as exc:
        open_store(data_dir)
    assert str(data_dir) in str(exc.value)
    s.close(NOW)
    open_store(data_dir).close(NOW)


def test_header_struct_is_metaq_header():
    assert HEADER.size == 20 and struct.calcsize(">iiqi") == 20


def test_preassigned_ids_and_ids_since_a_position_across_segments(data_dir):
    store = open_store(data_dir)
    early = [store.put("t1", i % 2, 0, b"e" * 300, NOW + i).msg_id for i in range(40)]  # several 4 KiB segments
    mark = store.written_position
    ids = [store.new_msg_id(NOW + 100) for _ in range(3)]
    for i, msg_id in enumerate(ids):
        assert store.put("t1", i % 2, 0, b"tx", NOW + 100, msg_id=msg_id).msg_id == msg_id
    assert store.msg_ids_since(mark) == set(ids)
    assert store.msg_ids_since(0) == set(early) | set(ids)
    assert store.msg_ids_since(store.written_position) == set()
    # stepwise (an event loop yields between steps): the same ids, each step within ID_SCAN_STEP_BYTES and
    # naming the bytes it reads first
    for position, among in ((0, None), (mark, None), (0, set(early[5:9]) | {ids[1], 12345})):
        scan, steps = store.msg_ids_since(position, among=among, stepwise=True), 0
        while not scan.done:
            mf, start, end = scan.need()
            before = scan.pos
            scan.step()
            steps += 1
            assert 0 < scan.pos - before <= max(end - start, store_limits.ID_SCAN_STEP_BYTES)
        assert scan.need() is None and scan.found == store.msg_ids_since(position, among=among)
        assert steps >= 2 if position == 0 else steps >= 1  # several segments: a step each at least
    store.close(NOW + 200)
    reopened = open_store(data_dir)
    assert reopened.msg_ids_since(mark) == set(ids)
    reopened.close(NOW + 300)
