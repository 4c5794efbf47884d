"""Replication primitives: read_log on a master, append_replicated on a slave, truncate_log (replica.py)."""

import os
import random
import struct

import pytest

from metaq.errors import Moved
from metaq.store.record import BLANK_MAGIC, MARKER, encode_record
from metaq.store.replica import NotABoundary, ReplicationRefused

from tests.harness.store import NOW, open_store, read_all

SEG = 4096
TOPICS = [("test", 4), ("tx", 2), ("other", 1), ("a.b-c_d", 1)]


def attr_data(attr, payload):
    a = attr.encode()
    return struct.pack(">i", len(a)) + a + payload


def mixed_load(store, rng, count, now=NOW):
    """Puts of many sizes over several topics and partitions, some with attributes; returns the PutResults."""
    results = []
    for i in range(count):
        topic, parts = rng.choice(TOPICS)
        size = rng.choice([0, 1, 10, 100, 500, 1000, rng.randint(0, 2500)])
        payload = rng.randbytes(size)
        if rng.random() < 0.4:
            results.append(store.put(topic, rng.randrange(parts), 1, attr_data("tag%d" % (i % 5), payload),
                                     now + i))
        else:
            results.append(store.put(topic, rng.randrange(parts), 0, payload, now + i))
    return results


def flush(store):
    store.mark_flushed(store.flush_log())


def replicate(master, slave, rng, upto="flushed", now=NOW, max_chunk=3000):
    """Copy the master's log to the slave in random-sized chunks; returns the number of chunks."""
    pos = slave.written_position
    chunks = 0
    while True:
        data, nxt = master.read_log(pos, rng.randint(1, max_chunk), upto=upto)
        if not len(data):
            assert nxt == pos
            return chunks
        end = slave.append_replicated(pos, bytes(data), now, master_segment_size=SEG)
        assert end == nxt
        pos = nxt
        chunks += 1


def segment_files(store):
    out = {}
    for _start, path in store.dirs.list_segments():
        with open(path, "rb") as f:
            out[os.path.basename(path)] = f.read()
    return out


def index_files(store):
    out = {}
    for topic, partition in store.dirs.list_partitions():
        for start, path in store.dirs.list_index_files(topic, partition):
            with open(path, "rb") as f:
                out[(topic, partition, start)] = f.read()
    return out


def assert_same(master, slave):
    assert master.written_position == slave.written_position
    m, s = segment_files(master), segment_files(slave)
    assert sorted(m) == sorted(s)
    for name in m:
        assert m[name] == s[name], "segment %s differs" % name
    assert index_files(master) == index_files(slave)
    assert master.partition_keys() == slave.partition_keys()
    for topic, part in master.partition_keys():
        lo, hi = master.min_offset(topic, part), master.max_offset(topic, part)
        assert (slave.min_offset(topic, part), slave.max_offset(topic, part)) == (lo, hi)
        for off in (lo, (lo + hi) // 2, hi, hi + 5):
            assert slave.nearest_offset(topic, part, off) == master.nearest_offset(topic, part, off)
        assert read_all(slave, topic, part) == read_all(master, topic, part)
        assert read_all(slave, topic, part, max_size=300) == read_all(master, topic, part)
        assert slave.partition_stats(topic, part) == master.partition_stats(topic, part)


@pytest.fixture
def pair(tmp_path):
    master = open_store(tmp_path / "master")
    slave = open_store(tmp_path / "slave")
    yield master, slave
    for s in (master, slave):
        s.close(NOW)


# -- copying ---------------------------------------------------------------------


def test_mixed_load_copies_byte_identical(pair):
    master, slave = pair
    rng = random.Random(1)
    mixed_load(master, rng, 600)
    flush(master)
    assert len(master.dirs.list_segments()) > 20  # many rolls, many blank tails
    chunks = replicate(master, slave, rng)
    assert chunks > 50
    assert_same(master, slave)


def test_slave_ids_stay_above_the_masters(pair):
    master, slave = pair
    results = mixed_load(master, random.Random(3), 50, now=NOW + 10_000)
    flush(master)
    replicate(master, slave, random.Random(4))
    assert slave.new_msg_id(NOW) > max(r.msg_id for r in results)


def test_copy_interleaved_with_load_and_flushes(pair):
    master, slave = pair
    rng = random.Random(5)
    for _round in range(15):
        mixed_load(master, rng, rng.randint(0, 40))
        if rng.random() < 0.7:
            flush(master)
        replicate(master, slave, rng, upto=rng.choice(["flushed", "written"]))
        if rng.random() < 0.5:
            flush(slave)
    flush(master)
    replicate(master, slave, rng)
    assert_same(master, slave)


def test_flushed_is_the_default_limit(pair):
    master, slave = pair
    master.put("test", 0, 0, b"x" * 100, NOW)
    flush(master)
    r = master.put("test", 0, 0, b"y" * 100, NOW)
    data, nxt = master.read_log(0, 1 << 20)
    assert nxt == master.flushed_position < r.log_end
    data, nxt = master.read_log(0, 1 << 20, upto="written")
    assert nxt == r.log_end == len(data)
    with pytest.raises(ValueError):
        master.read_log(0, 10, upto="visible")


def test_read_log_returns_at_least_one_whole_record(pair):
    master, _slave = pair
    a = master.put("test", 0, 0, b"a" * 300, NOW)
    master.put("test", 0, 0, b"b" * 300, NOW)
    flush(master)
    data, nxt = master.read_log(0, 1)
    assert nxt == a.log_end == len(data)


def test_read_log_ends_a_segment_with_its_blank_tail(pair):
    master, slave = pair
    first = master.put("test", 0, 0, b"a" * 3000, NOW)
    second = master.put("test", 0, 0, b"b" * 3000, NOW)  # does not fit: a blank tail, then segment 2
    flush(master)
    data, nxt = master.read_log(first.log_end, 1 << 20)
    assert nxt == SEG and len(data) == SEG - first.log_end
    assert MARKER.unpack_from(data) == (SEG - first.log_end, BLANK_MAGIC)
    data, nxt = master.read_log(SEG, 1 << 20)
    assert nxt == second.log_end
    replicate(master, slave, random.Random(6))
    assert_same(master, slave)


@pytest.mark.parametrize("left", [0, 1, 5, 7, 8, 9])
def test_segment_ends_exactly_or_with_a_short_tail(pair, left):
    master, slave = pair
    master.put("test", 1, 0, b"p" * (SEG - 66 - left), NOW)  # a 4-byte topic: 66 bytes of record overhead
    master.put("test", 1, 0, b"q" * 50, NOW)
    master.put("other", 0, 0, b"r" * (SEG - 67), NOW)  # fills the second segment exactly
    master.put("other", 0, 0, b"s", NOW)
    flush(master)
    assert len(master.dirs.list_segments()) >= 3
    replicate(master, slave, random.Random(left), max_chunk=10)
    assert_same(master, slave)


def test_read_log_refuses_a_position_inside_a_record(pair):
    master, _slave = pair
    r = master.put("test", 0, 0, encode_record("test", 0, 0, NOW, NOW, 1, 0, b"inner"), NOW)
    flush(master)
    with pytest.raises(NotABoundary, match="not a record boundary"):
        master.read_log(10, 100)
    inner = r.log_end - len(encode_record("test", 0, 0, NOW, NOW, 1, 0, b"inner"))
    with pytest.raises(NotABoundary):  # a valid record embedded in a payload is not a boundary
        master.read_log(inner, 100)
    with pytest.raises(NotABoundary, match="past the end"):
        master.read_log(r.log_end + 66, 100)
    assert master.read_log(r.log_end, 100) == (b"", r.log_end)


def test_sync_slave_shows_records_only_after_its_flush(tmp_path):
    master = open_store(tmp_path / "m", flush="sync")
    slave = open_store(tmp_path / "s", flush="sync")
    try:
        master.put("test", 2, 0, b"hello", NOW)
        flush(master)
        replicate(master, slave, random.Random(7))
        assert slave.max_offset("test", 2) == 0
        assert slave.mark_flushed(slave.flush_log()) == {("test", 2)}
        assert read_all(slave, "test", 2) == read_all(master, "test", 2)
    finally:
        master.close(NOW)
        slave.close(NOW)


# -- restarts ---------------------------------------------------------------------


def test_slave_killed_mid_copy_recovers_and_resumes(tmp_path):
    rng = random.Random(8)
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    mixed_load(master, rng, 400)
    flush(master)
    pos = 0
    for _ in range(60):  # part of the log, unflushed on the slave
        data, _nxt = master.read_log(pos, rng.randint(1, 2000))
        pos = slave.append_replicated(pos, data, NOW)
    slave.abandon()  # kill -9
    slave = open_store(tmp_path / "s")
    assert slave.recovery.truncated_bytes == 0
    assert slave.written_position == pos
    replicate(master, slave, rng)
    assert_same(master, slave)
    slave.close(NOW)
    slave = open_store(tmp_path / "s")  # clean restart too
    assert slave.recovery.clean_shutdown
    mixed_load(master, rng, 100)
    flush(master)
    replicate(master, slave, rng)
    assert_same(master, slave)
    master.close(NOW)
    slave.close(NOW)


def test_slave_killed_right_after_a_blank_tail_resumes(tmp_path):
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    first = master.put("test", 0, 0, b"a" * 3000, NOW)
    master.put("test", 0, 0, b"b" * 3000, NOW)
    flush(master)
    data, _ = master.read_log(0, 1)
    slave.append_replicated(0, data, NOW)
    data, nxt = master.read_log(first.log_end, 1 << 20)
    assert slave.append_replicated(first.log_end, data, NOW) == nxt == SEG
    slave.abandon()
    slave = open_store(tmp_path / "s")
    assert slave.written_position == SEG
    replicate(master, slave, random.Random(9))
    assert_same(master, slave)
    master.close(NOW)
    slave.close(NOW)


def test_empty_slave_may_start_at_a_later_segment(tmp_path):
    rng = random.Random(10)
    master = open_store(tmp_path / "m")
    mixed_load(master, rng, 300)
    flush(master)
    start = 5 * SEG
    slave = open_store(tmp_path / "s2")  # empty: it may start at any segment start
    pos = start
    while True:
        data, nxt = master.read_log(pos, rng.randint(1, 3000))
        if not len(data):
            break
        pos = slave.append_replicated(pos, data, NOW)
    for topic, part in slave.partition_keys():
        lo = slave.min_offset(topic, part)
        assert slave.max_offset(topic, part) == master.max_offset(topic, part)
        assert read_all(slave, topic, part) == read_all(master, topic, part, start=lo)
    slave.abandon()
    slave = open_store(tmp_path / "s2")
    for topic, part in slave.partition_keys():
        lo = slave.min_offset(topic, part)
        assert lo > 0 or master.max_offset(topic, part) == slave.max_offset(topic, part)
        assert read_all(slave, topic, part) == read_all(master, topic, part, start=lo)
    m, s = segment_files(master), segment_files(slave)
    assert sorted(s) == sorted(m)[5:] and all(s[k] == m[k] for k in s)
    master.close(NOW)
    slave.close(NOW)


# -- refusals ----------------------------------------------------------------------


def copy_some(master, slave, rng, chunks):
    pos = slave.written_position
    for _ in range(chunks):
        data, nxt = master.read_log(pos, rng.randint(100, 2000))
        pos = slave.append_replicated(pos, data, NOW)
    return pos


def state_of(store):
    return store.written_position, segment_files(store), index_files(store), [
        (k, store.max_offset(*k)) for k in store.partition_keys()]


def test_wrong_start_position_is_refused(pair):
    master, slave = pair
    rng = random.Random(11)
    mixed_load(master, rng, 100)
    flush(master)
    pos = copy_some(master, slave, rng, 5)
    before = state_of(slave)
    data, nxt = master.read_log(pos, 1000)
    later, _ = master.read_log(nxt, 1000)
    with pytest.raises(ReplicationRefused, match="ends at %d: resume from %d" % (pos, pos)):
        slave.append_replicated(nxt, later, NOW)
    assert state_of(slave) == before


def test_bit_flips_anywhere_are_refused_and_nothing_is_written(pair):
    master, slave = pair
    rng = random.Random(12)
    mixed_load(master, rng, 200)
    flush(master)
    pos = copy_some(master, slave, rng, 10)
    before = state_of(slave)
    for _ in range(200):
        data, nxt = master.read_log(pos, rng.randint(1000, 8000))
        bad = bytearray(data)
        i = rng.randrange(len(bad))
        bad[i] ^= 1 << rng.randrange(8)
        with pytest.raises(ReplicationRefused):
            slave.append_replicated(pos, bytes(bad), NOW)
        assert slave.written_position == pos
    assert state_of(slave) == before
    replicate(master, slave, rng)
    assert_same(master, slave)


def test_truncated_chunk_is_refused(pair):
    master, slave = pair
    master.put("test", 0, 0, b"x" * 500, NOW)
    master.put("test", 0, 0, b"x" * 500, NOW)
    flush(master)
    data, nxt = master.read_log(0, 1 << 20)
    with pytest.raises(ReplicationRefused, match="chunk ends inside the record"):
        slave.append_replicated(0, data[:-1], NOW)
    assert slave.written_position == 0 and slave.partition_keys() == []


def test_segment_size_mismatch_is_refused(tmp_path):
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s", segment_size=8192)
    try:
        mixed_load(master, random.Random(13), 100)
        flush(master)
        with pytest.raises(ReplicationRefused, match="master uses 4096-byte segments, this store 8192"):
            slave.append_replicated(0, master.read_log(0, 100)[0], NOW, master_segment_size=SEG)
        pos = 0  # without being told, the first blank tail gives it away
        with pytest.raises(ReplicationRefused, match="segment size differs"):
            while True:
                data, nxt = master.read_log(pos, 100000)
                pos = slave.append_replicated(pos, data, NOW)
        assert slave.written_position == pos < SEG
    finally:
        master.close(NOW)
        slave.close(NOW)


def test_smaller_slave_segments_refuse_a_crossing_record(tmp_path):
    master = open_store(tmp_path / "m", segment_size=8192)
    slave = open_store(tmp_path / "s")
    try:
        for _ in range(5):
            master.put("test", 0, 0, b"z" * 1500, NOW)
        flush(master)
        with pytest.raises(ReplicationRefused, match="cross this store's segment end"):
            slave.append_replicated(0, master.read_log(0, 1 << 20)[0], NOW)
        assert slave.written_position == 0
    finally:
        master.close(NOW)
        slave.close(NOW)


def test_partition_offset_gap_or_mismatch_is_refused(pair):
    _master, slave = pair
    r0 = encode_record("test", 0, 0, NOW, NOW, 1, 0, b"zero")
    r2 = encode_record("test", 0, 2, NOW, NOW, 2, 0, b"two")
    with pytest.raises(ReplicationRefused, match="offset 2 of test-0 but this store expects offset 1"):
        slave.append_replicated(0, r0 + r2, NOW)
    assert slave.written_position == 0 and slave.partition_keys() == []
    with pytest.raises(ReplicationRefused, match="expects offset 0"):
        slave.append_replicated(0, r2, NOW)
    assert slave.append_replicated(0, r0, NOW) == len(r0)
    with pytest.raises(ReplicationRefused, match="offset 0 of test-0 but this store expects offset 1"):
        slave.append_replicated(len(r0), r0, NOW)
    assert slave.max_offset("test", 0) == 1


def test_illegal_topic_is_refused(pair):
    _master, slave = pair
    with pytest.raises(ReplicationRefused, match="illegal topic"):
        slave.append_replicated(0, encode_record("../x", 0, 0, NOW, NOW, 1, 0, b""), NOW)


def test_empty_slave_refuses_a_start_inside_a_segment(pair):
    _master, slave = pair
    with pytest.raises(ReplicationRefused, match="only start at a segment start"):
        slave.append_replicated(100, encode_record("test", 0, 0, NOW, NOW, 1, 0, b""), NOW)


# -- truncation --------------------------------------------------------------------


def boundaries(store):
    """Every record boundary of the store's log (from read_log with the smallest chunks)."""
    out, pos = [0], 0
    while True:
        data, nxt = store.read_log(pos, 1, upto="written")
        if not len(data):
            return out
        out.append(nxt)
        pos = nxt


def test_truncate_then_reappend_is_identical(pair):
    master, slave = pair
    rng = random.Random(14)
    mixed_load(master, rng, 300)
    flush(master)
    replicate(master, slave, rng)
    cut_at = rng.choice(boundaries(slave)[len(boundaries(slave)) // 3:-5])
    before = {k: slave.max_offset(*k) for k in slave.partition_keys()}
    report = slave.truncate_log(cut_at, NOW)
    assert report.bytes == master.written_position - cut_at
    assert report.records == sum(v[0] for v in report.partitions.values()) > 0
    for key, (records, nbytes) in report.partitions.items():
        assert slave.max_offset(*key) == before[key] - records == report.new_max_offsets[key]
        assert nbytes > 0
    assert slave.written_position == cut_at
    assert all(os.path.basename(p) not in segment_files(slave) for p in report.deleted_segments)
    replicate(master, slave, rng)
    assert_same(master, slave)


def test_truncate_survives_a_kill(tmp_path):
    rng = random.Random(15)
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    mixed_load(master, rng, 200)
    flush(master)
    replicate(master, slave, rng)
    flush(slave)
    slave.checkpoint(NOW)
    cut_at = boundaries(slave)[40]
    slave.truncate_log(cut_at, NOW)
    slave.abandon()
    slave = open_store(tmp_path / "s")
    assert slave.written_position == cut_at
    replicate(master, slave, rng)
    assert_same(master, slave)
    master.close(NOW)
    slave.close(NOW)


def test_divergent_old_master_rejoins_after_truncation(tmp_path):
    rng = random.Random(16)
    old = open_store(tmp_path / "old")
    new = open_store(tmp_path / "new")
    mixed_load(old, rng, 150)
    flush(old)
    replicate(old, new, rng)
    agreed = new.written_position
    mixed_load(old, rng, 60)  # acknowledged by the old master, never replicated
    flush(old)
    mixed_load(new, rng, 80)  # the promoted slave takes writes
    flush(new)
    report = old.truncate_log(agreed, NOW)
    assert report.records == 60
    replicate(new, old, rng)
    assert_same(new, old)
    old.close(NOW)
    new.close(NOW)


def test_truncate_refuses_a_non_boundary_and_below_the_start(pair):
    master, _slave = pair
    master.put("test", 0, 0, b"x" * 100, NOW)
    with pytest.raises(NotABoundary):
        master.truncate_log(7, NOW)
    assert master.truncate_log(master.written_position, NOW).records == 0
    report = master.truncate_log(0, NOW)
    assert report.records == 1 and report.partitions == {("test", 0): [1, 166]}
    assert master.max_offset("test", 0) == 0 and master.written_position == 0
    r = master.put("test", 0, 0, b"again", NOW)
    assert (r.offset, r.log_end) == (0, 71)


def test_read_log_below_the_log_start_says_where_it_starts(tmp_path):
    master = open_store(tmp_path / "m")
    try:
        mixed_load(master, random.Random(17), 200)
        flush(master)
        master.checkpoint(NOW)
        report = master.retention(NOW + 400 * 3600_000)
        assert report.deleted_segments
        start = master._log.start
        with pytest.raises(Moved) as info:
            master.read_log(0, 100)
        assert info.value.offset == start
        assert len(master.read_log(start, 100)[0]) > 0
    finally:
        master.close(NOW)
