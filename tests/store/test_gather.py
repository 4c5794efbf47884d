"""Reads for the wire: ``read_joined`` gives the bytes of ``read``'s views joined, and the C gather equals Python's."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq import errors
from metaq.store import gather
from metaq.store.gather import MappedRecords, check_ranges_py, gather_records_py
from metaq.store.index import UNIT
from tests.harness.store import NOW, open_store

try:
    from metaq.native._bytes import check_ranges as check_ranges_c, gather_records as gather_records_c
except ImportError:
    gather_records_c = check_ranges_c = None


@pytest.fixture(params=["built", "python"])
def gatherer(request, monkeypatch):
    """read_joined with the C gather (when built) and with its pure-Python twin."""
    if request.param == "python":
        monkeypatch.setattr(gather, "gather_records", gather_records_py)
        monkeypatch.setattr(gather, "check_ranges", check_ranges_py)
    return request.param


def wire_bytes(buffers):
    return b"".join(b.joined() if isinstance(b, MappedRecords) else bytes(b) for b in buffers)


def same_read(s, topic, partition, offset, max_size):
    """``read_joined``, copied and mapped (checked in place), gives the bytes of ``read``'s views."""
    plain = s.read(topic, partition, offset, max_size)
    joined = s.read_joined(topic, partition, offset, max_size)
    mapped = s.read_joined(topic, partition, offset, max_size, mapped=True)
    assert b"".join(joined.views) == b"".join(bytes(v) for v in plain.views) == wire_bytes(mapped.views)
    assert (joined.nbytes, joined.count, joined.next_offset) == (plain.nbytes, plain.count, plain.next_offset)
    assert (mapped.nbytes, mapped.count, mapped.next_offset) == (plain.nbytes, plain.count, plain.next_offset)
    assert len(mapped.views) == len(joined.views)
    return joined


def test_joined_reads_equal_plain_reads_across_segments_and_index_files(data_dir, gatherer):
    s = open_store(data_dir)  # 4 KiB segments, 64 units per index file
    for i in range(600):
        s.put("test", i % 2, 0, b"m%04d" % i * (1 + i % 40), NOW + i)
    for offset in (0, 1, 63, 64, 150, 299):
        for max_size in (1, 100, 1000, 5000, 1 << 20):
            same_read(s, "test", 0, offset, max_size)
    r = same_read(s, "test", 1, 0, 1 << 20)
    assert r.count == 300 and len(r.views) > 10  # one buffer per segment the records lie in
    s.close(NOW)


def test_joined_reads_answer_like_plain_reads_at_the_edges(data_dir, gatherer):
    s = open_store(data_dir)
    s.put("test", 0, 0, b"x" * 3000, NOW)
    assert same_read(s, "test", 0, 0, 10).count == 1  # one message even when larger than max_size
    assert same_read(s, "test", 0, 1, 10).count == 0  # at the end
    assert same_read(s, "test", 3, 0, 10).count == 0  # a partition without data
    for bad in ((0, 2), (7, 0)):
        partition, offset = bad
        with pytest.raises((errors.Moved, errors.NotFound)):
            s.read_joined("test", partition, offset, 10)
    s.close(NOW)


@pytest.mark.skipif(gather_records_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(-50, 5000), st.integers(-5, 400)), max_size=30), st.integers(0, 60),
       st.integers(0, 3000), st.integers(0, 400))
def test_c_gather_equals_the_python_reference(units, skip, limit, nbytes):
    log = bytes(range(256)) * 16
    raw = b"".join(UNIT.pack(1000 + phys, size, 0) for phys, size in units) + b"\x01\x02"  # and a partial unit
    args = (raw, skip, log, 1000, 1000 + len(log), limit, nbytes)
    assert gather_records_c(*args) == gather_records_py(*args)


@pytest.mark.skipif(check_ranges_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(-50, 5000), st.integers(-5, 400)), max_size=30), st.integers(0, 60),
       st.integers(0, 3000), st.integers(0, 400))
def test_c_range_check_equals_the_python_reference(units, skip, limit, nbytes):
    log = bytes(range(256)) * 16
    raw = b"".join(UNIT.pack(1000 + phys, size, 0) for phys, size in units) + b"\x01\x02"  # and a partial unit
    args = (raw, skip, log, 1000, 1000 + len(log), limit, nbytes)
    assert check_ranges_c(*args) == check_ranges_py(*args)


def test_c_range_check_equals_the_python_reference_on_real_records(data_dir):
    """Real records (the generated ones above never pass the record check): the same ranges, and a corrupt one
    stops both at the same place."""
    s = open_store(data_dir)
    for i in range(30):
        s.put("test", 0, 0, b"r%03d" % i * (1 + i), NOW + i)
    p = s._parts[("test", 0)]
    seg = s._log.segment_at(p.unit(0)[0])
    units = bytes(p.files[0].view[:30 * 16])
    skip = gather.metaq_offset(len(p.topic_bytes))
    for limit, nbytes in ((1 << 20, 0), (500, 0), (500, 400), (10, 0)):
        args = (units, skip, seg.view, seg.start, seg.end, limit, nbytes)
        count, ranges, size, stop = check_ranges_py(*args)
        assert count > 0 or nbytes
        if check_ranges_c is not None:
            assert check_ranges_c(*args) == (count, ranges, size, stop)
        gathered = gather_records_py(units, skip, seg.view, seg.start, seg.end, limit, nbytes, True)
        assert gathered[0] == count and gathered[2] == stop
        assert MappedRecords(seg.view, ranges, size).joined() == gathered[1] and len(gathered[1]) == size
    phys, size, _t = p.unit(7)
    seg.view[phys - seg.start + size - 1] ^= 0x01  # the last payload byte of record 7
    args = (units, skip, seg.view, seg.start, seg.end, 1 << 20, 0)
    assert check_ranges_py(*args)[0] == 7 and check_ranges_py(*args)[3] == gather.CORRUPT
    if check_ranges_c is not None:
        assert check_ranges_c(*args) == check_ranges_py(*args)
    s.close(NOW)


def test_a_unit_that_points_at_another_whole_record_stops_both_twins_there(data_dir):
    """A damaged index unit naming another topic's record, or another offset's of the same partition, passes the
    record check (the record is whole): the owner check (topic, partition, offset) stops the C helper and its
    Python twin at the same place."""
    s = open_store(data_dir)
    for i in range(20):
        s.put("test", 0, 0, b"a%03d" % i, NOW + i)
        s.put("test", 1, 0, b"b%03d" % i, NOW + i)
    p, other = s._parts[("test", 0)], s._parts[("test", 1)]
    seg = s._log.segment_at(p.unit(0)[0])
    skip = gather.metaq_offset(len(p.topic_bytes))
    good = bytes(p.files[0].view[:20 * 16])
    for swap, stopped_at in (
            (lambda u: u[:5 * 16] + bytes(other.files[0].view[5 * 16:6 * 16]) + u[6 * 16:], 5),  # partition 1's
            (lambda u: u[:9 * 16] + u[3 * 16:4 * 16] + u[10 * 16:], 9),  # its own record 3 again
            (lambda u: u, 20)):
        units = swap(good)
        for first, expect in ((0, stopped_at), (1, 0)):  # named as offsets 1..: the very first is not record 1
            args = (units, skip, seg.view, seg.start, seg.end, 1 << 20, 0, p.topic_bytes, 0, first)
            count, _ranges, _size, stop = check_ranges_py(*args)
            assert count == expect and stop == (gather.CORRUPT if expect < 20 else gather.END), (first, count)
            assert gather_records_py(units, skip, seg.view, seg.start, seg.end, 1 << 20, 0, True, p.topic_bytes, 0,
                                     first)[0] == expect
            if check_ranges_c is not None:
                assert check_ranges_c(*args) == check_ranges_py(*args)
                assert gather_records_c(units, skip, seg.view, seg.start, seg.end, 1 << 20, 0, True,
                                        p.topic_bytes, 0, first) == gather_records_py(
                    units, skip, seg.view, seg.start, seg.end, 1 << 20, 0, True, p.topic_bytes, 0, first)
        other_topic = (units, skip, seg.view, seg.start, seg.end, 1 << 20, 0, b"tesu", 0, 0)
        assert check_ranges_py(*other_topic)[0] == 0
        if check_ranges_c is not None:
            assert check_ranges_c(*other_topic) == check_ranges_py(*other_topic)
    s.close(NOW)
