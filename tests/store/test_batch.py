"""Bursts of puts appended in one pass: the same log, index and answers as one put at a time."""

from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.errors import TopicForbidden
from metaq.protocol import events as ev
from metaq.protocol.burst import encode_put_acks, scan_puts_py
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.msgid import SEQUENCE_MASK, TWEPOCH, compose
from metaq.protocol.text import serialize
from metaq.store.batch import write_run_py
from metaq.store.index import INITIAL_UNITS
from metaq.store.msgid import IdGenerator
from metaq.store.positions import LogPositions
from metaq.store.record import FIXED_OVERHEAD, scan_records_py
from tests.harness.store import NOW, files_of, open_store, payload_of, read_all

try:
    from metaq.native._bytes import write_run as write_run_c
except ImportError:
    write_run_c = None


def burst(messages):
    """``(buffer, frames)`` for ``[(topic, partition, data[, flag])]`` sent as plain puts (opaque = index)."""
    buf = bytearray(b"".join(serialize(ev.Put(m[0], m[1], m[3] if len(m) > 3 else 0, m[2], i, metaq_checksum(m[2])))
                             for i, m in enumerate(messages)))
    frames, stop = scan_puts_py(buf, 0, len(buf), 1 << 20, 1024)
    assert stop == len(buf)
    return buf, frames


def replies_of(results):
    """The replies the general path gives for PutResults, opaques 0…"""
    out = []
    for i, r in enumerate(results):
        body = b"%d %d %d" % (r.msg_id, r.partition, r.offset)
        out.append(b"result 200 %d %d\r\n%s" % (len(body), i, body))
    return b"".join(out)


def put_like_the_server(store, buf, frames, now):
    """What the broker does: bursts through put_burst, the frame it stops at through put; returns the replies."""
    replies, i = [], 0
    while i < len(frames):
        taken, runs = store.put_burst(frames[i:], buf, now)
        replies.extend(encode_put_acks(frames[i:], r.first_frame, r.count, r.first_id, r.key[1], r.first_offset)
                       for r in runs)
        i += taken
        if i < len(frames):
            topic, partition, flag, opaque, start, n, crc = frames[i][:7]
            r = store.put(topic.decode(), partition, flag, bytes(buf[start:start + n]), now,
                          checksum=crc & 0x7FFFFFFF)
            body = b"%d %d %d" % (r.msg_id, r.partition, r.offset)
            replies.append(b"result 200 %d %d\r\n%s" % (len(body), opaque, body))
            i += 1
    return b"".join(replies)


messages_st = st.lists(st.tuples(st.sampled_from(["test", "tb", "other"]), st.integers(0, 3), st.binary(max_size=700),
                                 st.one_of(st.none(), st.text(max_size=30))),
                       min_size=1, max_size=120)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(messages_st)
def test_burst_writes_the_same_bytes_as_one_put_at_a_time(tmp_path_factory, writer, messages):
    """Puts with and without an attribute: the same segments and index units (their tag hashes included)."""
    messages = [(t, p % {"test": 4, "tb": 2, "other": 1}[t]) + encode_payload(b, a)[::-1] for t, p, b, a in messages]
    base = tmp_path_factory.mktemp("burst")
    one, many = open_store(base / "one"), open_store(base / "many")
    buf, frames = burst(messages)
    expected = replies_of([one.put(t, p, f, d, NOW, checksum=metaq_checksum(d)) for t, p, d, f in messages])
    assert put_like_the_server(many, buf, frames, NOW) == expected
    for s in (one, many):
        s.close(NOW)
    assert files_of(base / "many") == files_of(base / "one")  # segments, blank tails, index units


def test_a_long_burst_takes_most_frames_and_is_read_back(data_dir, writer):
    s = open_store(data_dir, segment_size=1 << 20, index_file_units=4096)
    messages = [("test", i % 2, b"msg-%05d" % i) for i in range(2000)]
    s.put("test", 0, 0, b"first", NOW)
    s.put("test", 1, 0, b"first", NOW)
    buf, frames = burst(messages)
    taken, runs = s.put_burst(frames, buf, NOW)
    # up to the middle of each partition's first index file (INITIAL_UNITS, then it grows: a put does that)
    assert taken >= 2 * (INITIAL_UNITS // 2 - 1) and sum(r[1] for r in runs) == taken
    put_like_the_server(s, buf, frames[taken:], NOW)
    for p in (0, 1):
        got = [payload_of(m) for m in read_all(s, "test", p)]
        assert got == [b"first"] + [b for _t, q, b in messages if q == p]
    s.close(NOW)


def test_nothing_is_taken_for_a_partition_never_put_to(data_dir):
    s = open_store(data_dir)
    buf, frames = burst([("test", 0, b"x")])
    assert s.put_burst(frames, buf, NOW) == (0, [])
    s.close(NOW)


@pytest.mark.skipif(write_run_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20), st.integers(0, 9000), st.integers(-2, 2**40),
       st.integers(0, 2**62), st.sampled_from([b"t", b"topic-with-a-longer-name"]), st.integers(0, 2**31 - 1))
def test_c_writer_equals_the_python_reference(bodies, ready, offset, first_id, topic, partition):
    buf, frames = burst([(topic.decode(), partition, b) for b in bodies])
    outputs = []
    for write in (write_run_py, write_run_c):
        log, index = bytearray(10000), bytearray(16 * 32)
        result = write(log, 1 << 33, 7, ready, buf, frames, 0, len(frames), topic, partition, offset, NOW + 5,
                       first_id, index, 16)
        outputs.append((result, bytes(log), bytes(index)))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("split", [0, 3, 8])
def test_a_body_in_two_places_is_written_as_the_joined_one(split):
    """A frame's ninth field holds the body's last bytes (a peer's copy: its payload a view of the frame it came in),
    its first ones in ``src``: the record written is the joined body's, by both writers; a tail longer than the
    body is refused."""
    bodies = [b"head-and-payload", b"01234567"]
    buf, frames = burst([("t", 1, b) for b in bodies])
    split_frames = [f[:7] + (0, memoryview(bytes(buf[f[4]:f[4] + f[5]]))[split:]) for f in frames]
    for write in filter(None, (write_run_py, write_run_c)):
        outputs = []
        for fs in (frames, split_frames):
            log, index = bytearray(1000), bytearray(16 * 4)
            outputs.append((write(log, 0, 0, 1000, buf, fs, 0, 2, b"t", 1, 5, NOW, 9, index, 0), bytes(log),
                            bytes(index)))
        assert outputs[0] == outputs[1]
        over = [frames[0][:7] + (0, b"x" * (frames[0][5] + 1))]
        with pytest.raises(ValueError, match="out of range"):
            write(bytearray(1000), 0, 0, 1000, buf, over, 0, 1, b"t", 1, 5, NOW, 9, bytearray(64), 0)


def test_a_topic_made_read_only_between_two_bursts_is_not_taken_by_the_next(data_dir):
    """The burst writer finds a partition's writer in the store's table of checked partitions (``Partitions
    .writer``): a topic altered after one burst is no longer there, so the next burst takes nothing and the general
    put refuses it."""
    s = open_store(data_dir)
    s.topics.create("jobs", {"partitions": "1"})
    s.put("jobs", 0, 0, b"first", NOW)
    buf, frames = burst([("jobs", 0, b"x")])
    assert s.put_burst(frames, buf, NOW)[0] == 1
    s.topics.alter("jobs", {"perm": "-"})
    assert s.put_burst(frames, buf, NOW) == (0, [])
    with pytest.raises(TopicForbidden, match="not writable"):
        s.put("jobs", 0, 0, b"x", NOW)
    s.close(NOW)


def run_state(ids, positions, p):
    """What ``append_run`` leaves behind besides the bytes: the ids' state, the positions', the partition's."""
    return ((ids._ts, ids._seq), (positions.written, positions.unflushed_msgs, positions.appended,
                                  [(e[0], e[2]) for e in positions.pending]),
            (p.max, p.dirty, p.visible, p.log_bytes))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=20), st.integers(0, 9000), st.integers(1, 25),
       st.sampled_from([None, -5, 0, 5]), st.integers(0, SEQUENCE_MASK), st.booleans(), st.sampled_from([None, 100]),
       st.integers(0, 2**40), st.integers(0, 1023))
def test_append_run_takes_consecutive_ids_writes_the_run_and_advances_the_positions(bodies, ready, room, seeded_at,
                                                                                     seq, async_visible, log_bytes,
                                                                                     offset, broker):
    """One run through ``append_run`` against the steps it strings together, taken one by one: its ids are those
    ``next_id`` hands out one at a time, as many as fit the run (``room``), the millisecond's sequence and the
    ready bytes (a fresh generator, the clock ahead, behind, a sequence overflow); the same log and index bytes as
    ``write_run_py`` of those records; the positions advanced as ``LogPositions.advance`` does (async visible, or
    queued until flushed); its BurstRun."""
    from metaq.store.batch import BurstRun, append_run

    topic = b"topic"
    buf, frames = burst([(topic.decode(), 3, b) for b in bodies])
    outputs = []
    for reference in (False, True):
        ids = IdGenerator(broker)
        if seeded_at is not None:
            ids.seed(compose(NOW + 5 - TWEPOCH + seeded_at, broker, seq))
        positions = LogPositions(async_visible)
        positions.written = (1 << 33) + 7
        p = SimpleNamespace(key=("topic", 3), max=offset, dirty=False, visible=offset, log_bytes=log_bytes)
        log, index, runs = bytearray(10000), bytearray(16 * 32), []
        overhead = FIXED_OVERHEAD + len(topic)
        if reference:
            first = ids.next_id(NOW + 5)
            fits = min(len(frames), room, SEQUENCE_MASK - (first & SEQUENCE_MASK) + 1)
            count, rel_after = write_run_py(log, 1 << 33, 7, ready, buf, frames, 0, fits, topic, 3, offset, NOW + 5,
                                            first, index, 16)
            if count == 0:
                ids.give_back(1)
            for k in range(1, count):
                assert ids.next_id(NOW + 5) == first + k
            end = positions.advance(p, offset, (1 << 33) + rel_after, rel_after - 7, count)
            runs.append(BurstRun(p.key, count, rel_after - 7 - count * overhead, first, offset, 0, end))
        else:
            count = append_run(runs, BurstRun, log, 1 << 33, 7, ready, buf, frames, 0, len(frames), room, topic, 3, p,
                               offset, NOW + 5, ids, positions, index, 16, overhead)
        assert all(type(r) is BurstRun for r in runs)
        outputs.append((count, runs, bytes(log), bytes(index), run_state(ids, positions, p)))
    assert outputs[0] == outputs[1]


def test_the_c_clock_reads_the_wall_clock_as_its_twin_does():
    """``clock.now_ms`` (the C helper's when built) between two readings of its twin, in milliseconds."""
    from metaq.clock import now_ms, now_ms_py

    for _ in range(1000):
        before = now_ms_py()
        now = now_ms()
        assert type(now) is int and before - 1 <= now <= now_ms_py() + 1


def test_a_disk_check_refusing_between_two_bursts_stops_the_next_and_one_taking_again_resumes(data_dir):
    """The burst writer reads the store's refusal, which the disk check sets at each measurement
    (``BurstWriter.refusal``): a burst after a measurement above the danger mark takes nothing (the general put
    then refuses it), and one after a measurement below it takes the burst again."""
    s = open_store(data_dir)
    s.put("test", 0, 0, b"first", NOW)
    buf, frames = burst([("test", 0, b"x")])
    assert s.put_burst(frames, buf, NOW)[0] == 1
    s.config.disk_danger_ratio = 1e-9
    assert s.check_disk().refusing_writes
    assert s.put_burst(frames, buf, NOW) == (0, [])
    s.config.disk_danger_ratio = 1.0  # as if space had been freed
    assert not s.check_disk().refusing_writes
    assert s.put_burst(frames, buf, NOW)[0] == 1
    assert s.max_offset("test", 0) == 3
    s.close(NOW)


def test_one_record_bursts_of_lengths_that_come_back_each_carry_their_crc(data_dir, writer):
    """A record's CRC is its header's combined with its body's through an operator that depends on the body's
    length, which the C writer keeps from one call to the next: one-record bursts whose lengths come back after
    others (more lengths than it keeps) still leave every record on disk with the CRC of its bytes."""
    s = open_store(data_dir, segment_size=1 << 20, index_file_units=4096)
    s.put("test", 0, 0, b"first", NOW)
    lengths = [(k * 37) % 41 * 13 for k in range(120)]  # 41 lengths, 0 among them, each back after the others
    for k, n in enumerate(lengths):
        buf, frames = burst([("test", 0, bytes([k % 251]) * n)])
        assert s.put_burst(frames, buf, NOW)[0] == 1
    assert [payload_of(m) for m in read_all(s, "test", 0)][1:] == [bytes([k % 251]) * n for k, n in enumerate(lengths)]
    s.close(NOW)
    logs = [b for name, b in files_of(data_dir).items() if name.startswith("commitlog")]
    assert len(logs) == 1
    stop, count = scan_records_py(logs[0], 0, len(logs[0]))
    assert count == 1 + len(lengths) and not any(logs[0][stop:])
