"""Recovery per fault-catalogue F3: torn tails, bit flips, garbage, zeroed pages, mid-log
corruption, lost or zeroed index files, corrupt checkpoints, clean restarts."""

import os
import random
import shutil

import pytest

from metaq import errors
from metaq.protocol.message import encode_payload
from metaq.store.index import UNIT
from metaq.store.record import MAGIC_BYTES
from metaq.store.recovery import read_log
from tests.harness.store import NOW, open_store, payload_of, read_all

pytestmark = pytest.mark.usefixtures("scanner")  # each test with the C scan and with its Python twin


def payload(i, size):
    head = b"p%04d-" % i
    return head + bytes([97 + i % 26]) * (size - len(head))


def write_log(data_dir, sizes, partition=0, **overrides):
    """Put one message per size into test/partition, then drop the store as a kill -9 would."""
    s = open_store(data_dir, **overrides)
    results = [s.put("test", partition, 0, payload(i, n), NOW + i) for i, n in enumerate(sizes)]
    s.abandon()
    return results


def seg_path(data_dir, position, segment_size=4096):
    return os.path.join(str(data_dir), "commitlog", "%020d" % (position // segment_size * segment_size))


def patch(path, at, data):
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def fresh_copy(base, work):
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    return work


def assert_index_within_log(s):
    end = s.written_position
    for p in s._parts.values():
        for f in p.files:
            for phys, size, _tag in UNIT.iter_unpack(f.view):
                assert size == 0 or phys + size <= end


def test_cut_last_record_at_every_byte_offset(fast_dir):
    base = os.path.join(fast_dir, "base")
    res = write_log(base, [10] * 5)
    start, end = res[3].log_end, res[4].log_end
    seg = seg_path(base, start)
    pristine = file_bytes(seg)
    work = os.path.join(fast_dir, "work")
    for k in range(end - start):
        fresh_copy(base, work)
        patch(seg_path(work, start), start + k, b"\0" * (end - start - k))
        s = open_store(work)
        damaged = len(pristine[start:start + k].rstrip(b"\0"))
        r = s.recovery
        assert (r.truncated_bytes, r.truncated_records) == (damaged, 1 if damaged else 0), k
        assert r.log_end == start and s.written_position == start
        assert [payload_of(m) for m in read_all(s, "test", 0)] == [payload(i, 10) for i in range(4)]
        nxt = s.put("test", 0, 0, b"again", NOW)
        assert (nxt.offset, nxt.log_end) == (4, start + 62 + 4 + 5)
        assert_index_within_log(s)
        s.abandon()


def test_cut_by_truncating_the_file(fast_dir):
    base = os.path.join(fast_dir, "base")
    res = write_log(base, [10] * 5)
    start, end = res[3].log_end, res[4].log_end
    pristine = file_bytes(seg_path(base, start))
    work = os.path.join(fast_dir, "work")
    for k in (1, 4, 13, 40, end - start - 1):
        fresh_copy(base, work)
        os.truncate(seg_path(work, start), start + k)
        s = open_store(work)
        damaged = len(pristine[start:start + k].rstrip(b"\0"))
        assert s.recovery.truncated_bytes == damaged and s.recovery.truncated_records == (1 if damaged else 0)
        assert s.max_offset("test", 0) == 4
        assert s.put("test", 0, 0, b"x" * 100, NOW).offset == 4  # rolls past the shortened segment
        assert [payload_of(m) for m in read_all(s, "test", 0)] == [payload(i, 10) for i in range(4)] + [b"x" * 100]
        s.close(NOW)
        s = open_store(work)
        assert s.max_offset("test", 0) == 5
        s.close(NOW)


def test_random_cuts_of_a_large_last_record(fast_dir):
    base = os.path.join(fast_dir, "base")
    res = write_log(base, [50, 3000], segment_size=64 * 1024)
    start, end = res[0].log_end, res[1].log_end
    work = os.path.join(fast_dir, "work")
    rnd = random.Random(7)
    for k in rnd.sample(range(1, end - start), 25):
        fresh_copy(base, work)
        patch(seg_path(work, start, 64 * 1024), start + k, b"\0" * (end - start - k))
        s = open_store(work, segment_size=64 * 1024)
        assert s.recovery.truncated_records == 1 and s.max_offset("test", 0) == 1
        s.abandon()


def test_torn_tail_after_a_checkpoint_is_found_by_the_partial_scan(fast_dir):
    data = os.path.join(fast_dir, "d")
    s = open_store(data)
    for i in range(6):
        s.put("test", 1, 0, payload(i, 30), NOW)
    s.mark_flushed(s.flush_log())
    cp = s.checkpoint(NOW)
    last = s.put("test", 1, 0, payload(6, 30), NOW)
    s.abandon()
    patch(seg_path(data, cp), last.log_end - 5, b"\0" * 5)
    s = open_store(data)
    r = s.recovery
    assert not r.full_scan and r.scanned_from == cp and r.truncated_records == 1
    assert r.index_units_dropped == 1 and s.max_offset("test", 1) == 6
    s.close(NOW)


def test_every_single_bit_flip_in_the_last_record_is_detected(fast_dir):
    base = os.path.join(fast_dir, "base")
    res = write_log(base, [20] * 4)
    start, end = res[2].log_end, res[3].log_end
    seg = seg_path(base, start)
    pristine = file_bytes(seg)
    work = os.path.join(fast_dir, "work")
    rnd = random.Random(1234)
    for _ in range(1000):
        bit = rnd.randrange((end - start) * 8)
        at = start + bit // 8
        flipped = bytes([pristine[at] ^ (1 << bit % 8)])
        fresh_copy(base, work)
        patch(seg_path(work, start), at, flipped)
        s = open_store(work)
        r = s.recovery
        assert r.truncated_records == 1 and r.corruption is None, bit
        damaged = (pristine[start:at] + flipped + pristine[at + 1:end]).rstrip(b"\0")
        assert r.truncated_bytes == len(damaged)
        assert s.max_offset("test", 0) == 3 and s.written_position == start
        s.abandon()


def test_random_garbage_after_the_last_record_is_cut(fast_dir):
    base = os.path.join(fast_dir, "base")
    res = write_log(base, [40] * 5)
    end = res[-1].log_end
    work = os.path.join(fast_dir, "work")
    rnd = random.Random(99)
    for n in [1, 7, 8, 9, 100, 1024] + [rnd.randrange(1, 1025) for _ in range(30)]:
        garbage = bytes(rnd.randrange(256) for _ in range(n))
        fresh_copy(base, work)
        patch(seg_path(work, end), end, garbage)
        s = open_store(work)
        r = s.recovery
        assert r.truncated_bytes == len(garbage.rstrip(b"\0")) and r.corruption is None
        # the cut counts the record headers it drops: each magic in the garbage (overlapping), at least one
        cut = garbage.rstrip(b"\0")
        magics = sum(1 for i in range(len(cut)) if cut.startswith(MAGIC_BYTES, i))
        assert r.truncated_records == (max(1, magics) if cut else 0)
        assert s.max_offset("test", 0) == 5
        assert s.put("test", 0, 0, b"after", NOW).offset == 5
        s.abandon()


def test_zeroed_last_page_keeps_exactly_the_records_before_it(fast_dir):
    data = os.path.join(fast_dir, "d")
    seg_size = 64 * 1024
    res = write_log(data, [300] * 40, segment_size=seg_size)
    end = res[-1].log_end
    page = (end - 1) // 4096 * 4096
    kept = [r for r in res if r.log_end <= page]
    cut = kept[-1].log_end
    seg = seg_path(data, 0, seg_size)
    before = file_bytes(seg)
    patch(seg, page, b"\0" * 4096)
    s = open_store(data, segment_size=seg_size)
    assert s.recovery.truncated_bytes == len(before[cut:page].rstrip(b"\0"))
    assert s.recovery.truncated_records == (1 if cut < page else 0)
    assert [payload_of(m) for m in read_all(s, "test", 0)] == [payload(i, 300) for i in range(len(kept))]
    assert s.put("test", 0, 0, b"next", NOW).offset == len(kept)
    assert_index_within_log(s)
    s.close(NOW)


@pytest.mark.parametrize("victim", [5, 21])
def test_a_flipped_bit_mid_log_refuses_to_start_unless_forced(fast_dir, victim):
    data = os.path.join(fast_dir, "d")
    res = write_log(data, [150] * 40)  # 216-byte records, 18 per 4 KiB segment
    start = res[victim - 1].log_end
    if start % 4096 + 216 > 4096:  # the record went to the next segment
        start = (start // 4096 + 1) * 4096
    assert res[victim].log_end == start + 216
    seg = seg_path(data, start)
    patch(seg, start % 4096 + 100, bytes([file_bytes(seg)[start % 4096 + 100] ^ 0x10]))
    with pytest.raises(errors.CorruptLog) as exc:
        open_store(data)
    err = exc.value
    assert err.path == seg and err.position == start
    assert os.path.basename(seg) in str(err) and "force_recovery" in str(err) and str(start) in str(err)
    s = open_store(data, force_recovery=True)
    r = s.recovery
    assert r.corruption is not None and r.truncated_records >= 40 - victim
    assert [payload_of(m) for m in read_all(s, "test", 0)] == [payload(i, 150) for i in range(victim)]
    assert s.put("test", 0, 0, b"resumed", NOW).offset == victim
    assert_index_within_log(s)
    s.close(NOW)
    s = open_store(data)
    assert s.recovery.clean_shutdown and s.max_offset("test", 0) == victim + 1
    s.close(NOW)


def build_rich_log(data_dir, clean=True):
    """Several topics and partitions, attributes, many index files; returns the index files' bytes."""
    s = open_store(data_dir)
    rnd = random.Random(5)
    for i in range(900):
        topic, part = rnd.choice([("test", 0), ("test", 3), ("tq", 1), ("other", 0)])
        flag, data = encode_payload(payload(i, rnd.randrange(1, 120)), "tag%d" % (i % 3) if i % 2 else None)
        s.put(topic, part, flag, data, NOW + i)
    if clean:
        s.close(NOW + 1000)
    else:
        s.abandon()
    return index_snapshot(data_dir)


def index_snapshot(data_dir):
    root = os.path.join(str(data_dir), "index")
    snap = {}
    for d, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            snap[os.path.relpath(path, root)] = file_bytes(path)
    return snap


def messages(s):
    return {k: read_all(s, *k) for k in s.partition_keys()}


@pytest.mark.parametrize("damage", ["delete all", "zero all", "delete one", "zero one"])
@pytest.mark.parametrize("clean", [True, False])
def test_lost_or_zeroed_index_files_are_rebuilt_byte_identical(fast_dir, damage, clean):
    data = os.path.join(fast_dir, "d")
    snap = build_rich_log(data, clean)
    assert len(snap) > 8
    s = open_store(data)
    expected = messages(s)
    s.close(NOW)
    root = os.path.join(data, "index")
    victims = sorted(snap) if "all" in damage else [sorted(snap)[1]]
    for rel in victims:
        path = os.path.join(root, rel)
        if damage.startswith("delete"):
            os.unlink(path)
        else:
            patch(path, 0, b"\0" * os.path.getsize(path))
    if damage == "delete all":
        shutil.rmtree(root)
    s = open_store(data)
    r = s.recovery
    assert r.full_scan and not r.clean_shutdown and r.untrusted_index
    assert r.index_units_rebuilt > 0
    assert index_snapshot(data) == snap
    assert messages(s) == expected
    s.close(NOW)


def test_stale_units_past_the_log_end_are_dropped(fast_dir):
    data = os.path.join(fast_dir, "d")
    s = open_store(data)
    for i in range(10):
        s.put("test", 2, 0, payload(i, 30), NOW)
    s.mark_flushed(s.flush_log())
    cp = s.checkpoint(NOW)
    for i in range(10, 15):
        s.put("test", 2, 0, payload(i, 30), NOW)
    end = s.written_position
    s.abandon()
    patch(seg_path(data, cp), cp, b"\0" * (end - cp))  # the log pages were lost, the index pages were not
    s = open_store(data)
    r = s.recovery
    assert (r.truncated_bytes, r.index_units_dropped) == (0, 5)
    assert s.max_offset("test", 2) == 10 and s.put("test", 2, 0, b"n", NOW).offset == 10
    s.close(NOW)


@pytest.mark.parametrize("how", ["flip", "delete", "truncate"])
def test_corrupt_checkpoint_falls_back_to_a_full_scan(fast_dir, how):
    data = os.path.join(fast_dir, "d")
    snap = build_rich_log(data, clean=True)
    s = open_store(data)
    expected = messages(s)
    s.close(NOW)
    cp = os.path.join(data, "checkpoint")
    if how == "flip":
        raw = file_bytes(cp)
        patch(cp, len(raw) // 2, bytes([raw[len(raw) // 2] ^ 1]))
    elif how == "delete":
        os.unlink(cp)
    else:
        os.truncate(cp, 5)
    s = open_store(data)
    r = s.recovery
    assert r.full_scan and not r.clean_shutdown and r.scanned_from == 0
    assert r.scanned_bytes == s.written_position and r.records_scanned == 900
    assert (r.truncated_bytes, r.index_units_rebuilt, r.index_units_dropped) == (0, 0, 0)
    assert messages(s) == expected and index_snapshot(data) == snap
    s.close(NOW)


def test_clean_shutdown_marker_skips_the_scan_and_is_removed_at_open(data_dir):
    s = open_store(data_dir)
    for i in range(50):
        s.put("test", i % 4, 0, payload(i, 50), NOW)
    end = s.written_position
    s.close(NOW)
    marker = os.path.join(str(data_dir), "clean_shutdown")
    assert os.path.exists(marker)
    s = open_store(data_dir)
    r = s.recovery
    assert r.clean_shutdown and (r.scanned_bytes, r.records_scanned) == (0, 0) and r.log_end == end
    assert not os.path.exists(marker)
    assert s.put("test", 0, 0, b"z", NOW).offset == 13
    s.abandon()
    s = open_store(data_dir)  # no marker after a crash: the tail after the checkpoint is scanned
    assert not s.recovery.clean_shutdown and s.recovery.records_scanned == 1
    s.close(NOW)


def test_a_marker_from_another_run_is_not_trusted(data_dir):
    s = open_store(data_dir)
    s.put("test", 0, 0, b"a", NOW)
    s.close(NOW)
    marker = file_bytes(os.path.join(str(data_dir), "clean_shutdown"))
    s = open_store(data_dir)
    s.put("test", 0, 0, b"b", NOW)
    s.abandon()
    with open(os.path.join(str(data_dir), "clean_shutdown"), "wb") as f:  # stale: the log moved on
        f.write(marker)
    s = open_store(data_dir)
    assert not s.recovery.clean_shutdown and s.max_offset("test", 0) == 2
    s.close(NOW)


def test_empty_trailing_segment_and_blank_tail_survive_a_crash(fast_dir):
    data = os.path.join(fast_dir, "d")
    s = open_store(data)
    while s.written_position < 4096 - 300:
        s.put("test", 0, 0, b"q" * 200, NOW)
    n = s.max_offset("test", 0)
    s.put("test", 0, 0, b"big" * 100, NOW)  # does not fit: blank tail + new segment
    s.abandon()
    s = open_store(data)
    assert s.recovery.truncated_bytes == 0 and s.max_offset("test", 0) == n + 1
    s.close(NOW)


def test_read_log_lists_every_record_offline(data_dir):
    res = write_log(data_dir, [10, 20, 30] * 50)
    recs = list(read_log(str(data_dir)))
    assert [r.queue_offset for r in recs] == list(range(150))
    assert [r.position + r.total_size for r in recs] == [r.log_end for r in res]
    assert recs[-1].data == payload(149, 30)


def test_an_empty_segment_after_the_end_is_removed_and_the_log_rolls_normally(fast_dir):
    data = os.path.join(fast_dir, "d")
    write_log(data, [100] * 5)
    with open(os.path.join(data, "commitlog", "%020d" % 4096), "wb") as f:
        f.write(bytes(4096))  # created by a roll just before a crash, never written
    s = open_store(data)
    assert s.recovery.truncated_bytes == 0 and len(s.recovery.deleted_segments) == 1
    for i in range(60):  # rolls into 4096 again
        s.put("test", 0, 0, payload(i, 100), NOW)
    assert s.max_offset("test", 0) == 65 and s.written_position > 8192
    s.close(NOW)


def test_every_empty_segment_at_the_end_is_removed_even_the_first(fast_dir):
    """A power cut can leave a segment created and preallocated but never fsynced at size 0, and the next one
    prepared ahead at size 0 too (tests/integration/test_power_cut.py found it on an async slave): the broker
    refused to start ("cannot map the empty file"). Every empty segment at the end goes; the log starts over."""
    data = os.path.join(fast_dir, "d")
    os.makedirs(os.path.join(data, "commitlog"))
    for start in (0, 4096):
        open(os.path.join(data, "commitlog", "%020d" % start), "wb").close()
    s = open_store(data)
    assert s.written_position == 0 and os.listdir(os.path.join(data, "commitlog")) == []
    s.put("test", 0, 0, payload(0, 100), NOW)
    assert s.max_offset("test", 0) == 1
    s.close(NOW)


# -- damage below the checkpoint is not a torn tail (found by a disk review: a flipped bit in the last record, fsynced
# and checkpointed, was cut as a crash's torn tail and its offset given out again; a lost last segment started an
# empty-handed broker that reused 72 offsets a group had already committed past) ---------------------------------


def checkpointed_log(data_dir, n=10, size=80):
    """``n`` puts to test-0, flushed and checkpointed (on disk: no crash can tear them), then dropped as a kill -9
    would; returns the put results."""
    s = open_store(data_dir, segment_size=1 << 16)
    results = [s.put("test", 0, 0, payload(i, size), NOW + i) for i in range(n)]
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    s.abandon()
    return results


def test_a_flipped_bit_in_the_last_checkpointed_record_refuses_to_start_and_forced_reuses_no_offset(fast_dir):
    data = os.path.join(fast_dir, "d")
    res = checkpointed_log(data)
    at = res[9].log_end - 3  # a payload byte of record 9, the last
    path = seg_path(data, at, 1 << 16)
    patch(path, at, bytes([file_bytes(path)[at] ^ 0x10]))
    with pytest.raises(errors.CorruptLog, match="below the checkpoint position %d" % res[9].log_end):
        open_store(data, segment_size=1 << 16)
    s = open_store(data, segment_size=1 << 16, force_recovery=True)
    assert s.recovery.corruption and s.written_position == res[8].log_end  # cut there, and said so
    assert s.put("test", 0, 0, b"after", NOW).offset == 10  # offset 9 is never given to another message
    with pytest.raises(errors.CorruptRecord):
        s.read("test", 0, 9, 1 << 20)  # what was there is reported lost, not silently absent
    s.close(NOW)


@pytest.mark.parametrize("how", ["emptied", "removed"])
def test_a_lost_last_segment_below_the_checkpoint_refuses_to_start_and_forced_reuses_no_offset(fast_dir, how):
    data = os.path.join(fast_dir, "d")
    res = checkpointed_log(data, n=200, size=400)  # 80 KiB: two segments
    last = sorted(os.listdir(os.path.join(data, "commitlog")))[-1]
    path = os.path.join(data, "commitlog", last)
    assert int(last) > 0
    if how == "emptied":
        open(path, "wb").close()
    else:
        os.unlink(path)
    with pytest.raises(errors.CorruptLog, match="below the checkpoint position %d" % res[-1].log_end):
        open_store(data, segment_size=1 << 16)
    s = open_store(data, segment_size=1 << 16, force_recovery=True)
    kept = s.max_offset("test", 0)
    assert s.written_position <= int(last) and kept == 200  # the counted offsets stay counted
    assert s.put("test", 0, 0, b"after", NOW).offset == 200
    s.close(NOW)


@pytest.mark.parametrize("sizes", [[2163] * 3, [2163] * 7, [100] * 90, [4000, 100, 4000, 100], [1500] * 11])
def test_the_room_a_commit_asks_for_is_never_less_than_the_segments_its_records_take(fast_dir, sizes):
    # a review: records never straddle two segments, so each roll may waste up to a record: counted per segment
    from metaq.store.record import record_size
    s = open_store(os.path.join(fast_dir, "d"))  # 4 KiB segments
    s.put("test", 0, 0, payload(0, 700), NOW)  # part of the first segment used
    records = [record_size(4, n) for n in sizes]  # topic "test"
    estimate = s._log.bytes_to_allocate(s.written_position, sum(records), max(records))
    segments_before = len(s._log.segments)
    for i, n in enumerate(sizes):
        s.put("test", 0, 0, payload(i, n), NOW)
    allocated = (len(s._log.segments) - segments_before) * 4096
    assert estimate >= allocated, (estimate, allocated)
    s.close(NOW)
