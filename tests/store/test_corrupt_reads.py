"""Issue 15 point 6: a corrupt record is never served, whichever read serves it, and the C checks equal Python's."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq import errors
from metaq.store import gather, record
from metaq.store.gather import gather_records_py
from metaq.store.index import UNIT
from metaq.store.record import encode_record, record_ok_py, scan_records_py
from tests.harness.native import both
from tests.harness.store import NOW, open_store

try:
    from metaq.native._bytes import gather_records as gather_records_c, record_ok as record_ok_c
    from metaq.native._bytes import scan_records as scan_records_c
except ImportError:
    gather_records_c = scan_records_c = record_ok_c = None


@pytest.fixture(params=["built", "python"])
def gatherer(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(gather, "gather_records", gather_records_py)
    return request.param


def flip_payload_byte(s, topic, partition, offset, delta=1):
    """Flip one byte of the payload of a stored record in its mapped segment, as a bad disk sector would."""
    position, size, _tag = s._parts[(topic, partition)].unit(offset)
    seg = s._log.segment_at(position)
    at = position - seg.start + size - 1  # the last payload byte
    seg.view[at] = (seg.view[at] + delta) % 256
    return position


def put_ten(s, partition=0):
    return [s.put("test", partition, 0, b"message-%02d" % i * 3, NOW + i).offset for i in range(10)]


def test_a_get_serves_the_records_before_a_corrupt_one_then_names_it(data_dir, gatherer):
    s = open_store(data_dir)
    put_ten(s)
    position = flip_payload_byte(s, "test", 0, 4)
    for mapped in (False, True):  # gathered into buffers, and checked in place for a zero-copy send
        r = s.read_joined("test", 0, 0, 1 << 20, mapped=mapped)
        assert r.count == 4 and r.next_offset == 4  # offsets 0..3 served, nothing of 4 on
        with pytest.raises(errors.CorruptRecord) as info:
            s.read_joined("test", 0, 4, 1 << 20, mapped=mapped)
        exc = info.value
        assert (exc.topic, exc.partition, exc.offset, exc.next_offset, exc.position) == ("test", 0, 4, 5, position)
        assert exc.code == 512 and "topic test partition 0 offset 4" in str(exc) and "next offset 5" in str(exc)
        assert s.read_joined("test", 0, 5, 1 << 20, mapped=mapped).count == 5  # past it, everything reads
    assert s.reads.corrupt_reads == 2
    s.close(NOW)


def test_plain_reads_and_record_reads_refuse_it_too(data_dir):
    s = open_store(data_dir)
    put_ten(s)
    flip_payload_byte(s, "test", 0, 0)
    with pytest.raises(errors.CorruptRecord):
        s.read("test", 0, 0, 1 << 20)
    with pytest.raises(errors.CorruptRecord) as info:
        s.read_records("test", 0, 0, 32, 1 << 20)
    assert info.value.offset == 0 and info.value.next_offset == 1
    flip_payload_byte(s, "test", 0, 0, delta=-1)  # repaired: served again
    assert s.read("test", 0, 0, 1 << 20).count == 10
    flip_payload_byte(s, "test", 0, 7)
    records, nxt = s.read_records("test", 0, 2, 32, 1 << 20)
    assert [r.queue_offset for r in records] == [2, 3, 4, 5, 6] and nxt == 7
    assert s.read("test", 0, 2, 1 << 20).count == 5
    assert s.reads.corrupt_reads == 2
    s.close(NOW)


def test_a_flipped_header_byte_is_caught_as_well(data_dir, gatherer):
    s = open_store(data_dir)
    put_ten(s)
    position, size, _t = s._parts[("test", 0)].unit(3)
    seg = s._log.segment_at(position)
    seg.view[position - seg.start + 30] ^= 0x10  # the store timestamp: not sent by a get, still corrupt
    assert s.read_joined("test", 0, 0, 1 << 20).count == 3
    with pytest.raises(errors.CorruptRecord):
        s.read_joined("test", 0, 3, 1 << 20)
    s.close(NOW)


def test_the_replication_master_ships_up_to_a_corrupt_record_and_no_further(data_dir):
    s = open_store(data_dir)
    put_ten(s)
    s.flush_log()
    position = flip_payload_byte(s, "test", 0, 6)
    start = s._parts[("test", 0)].unit(0)[0]
    view, nxt = s.read_log(start, 1 << 20, upto="written")
    assert nxt == position and len(view) == position - start
    with pytest.raises(errors.CorruptRecord) as info:
        s.read_log(position, 1 << 20, upto="written")
    assert (info.value.topic, info.value.partition, info.value.offset, info.value.position) == ("test", 0, 6, position)
    s.close(NOW)


def test_a_chunk_that_ends_in_a_blank_tail_stops_before_a_corrupt_record_too(data_dir):
    s = open_store(data_dir)  # 4 KiB segments
    for i in range(40):
        s.put("test", 0, 0, b"r%02d" % i * 40, NOW + i)
    s.flush_log()
    first = s._log.segments[0]
    units = [s._parts[("test", 0)].unit(n) for n in range(40)]
    in_first = [n for n, u in enumerate(units) if u[0] < first.end]
    bad = in_first[-2]  # the first segment ends in a blank tail after the record following this one
    position = flip_payload_byte(s, "test", 0, bad)
    view, nxt = s.read_log(first.start, 1 << 20, upto="written")
    assert nxt == position and len(view) == position - first.start
    with pytest.raises(errors.CorruptRecord):
        s.read_log(position, 1 << 20, upto="written")
    s.close(NOW)


@pytest.mark.parametrize("scan_records", both(scan_records_py, "scan_records"))
def test_scan_records_finds_the_first_bad_record(scan_records):
    recs = [encode_record("t", 0, i, NOW, NOW, i, 0, b"payload %d" % i) for i in range(5)]
    buf = bytearray(b"".join(recs))
    assert scan_records(buf, 0, len(buf)) == (len(buf), 5)
    bad = sum(len(r) for r in recs[:3])
    buf[bad + len(recs[3]) - 2] ^= 1
    assert scan_records(buf, 0, len(buf)) == (bad, 3)
    assert scan_records(buf, bad + len(recs[3]), len(buf)) == (len(buf), 1)


@pytest.mark.skipif(scan_records_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=80), min_size=0, max_size=8), st.integers(-1, 2000), st.integers(0, 3),
       st.integers(-5, 2000), st.integers(-5, 2000))
def test_c_scan_equals_the_python_reference(payloads, flip_at, junk, pos, end):
    buf = bytearray(b"".join(encode_record("topic", 1, i, NOW, NOW, i, 0, p) for i, p in enumerate(payloads)))
    buf += b"\x00" * junk
    if 0 <= flip_at < len(buf):
        buf[flip_at] ^= 0x41
    assert scan_records_c(buf, pos, end) == scan_records_py(buf, pos, end)


@pytest.mark.skipif(record_ok_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80), st.integers(-1, 200), st.integers(-3, 200), st.integers(-3, 200), st.integers(0, 8))
def test_c_record_ok_equals_the_python_reference(payload, flip_at, pos, size, lead):
    buf = bytearray(bytes(lead) + encode_record("tp", 3, 9, NOW, NOW, 1, 1, payload) + b"\x00\x01")
    if 0 <= flip_at < len(buf):
        buf[flip_at] ^= 0x20
    assert record_ok_c(buf, pos, size) == record_ok_py(buf, pos, size)
    assert record_ok_c(buf, lead, len(buf) - lead - 2) == record_ok_py(buf, lead, len(buf) - lead - 2)


@pytest.mark.skipif(gather_records_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=60), min_size=1, max_size=8), st.integers(-1, 1000), st.integers(0, 3000))
def test_c_verifying_gather_equals_the_python_reference(payloads, flip_at, limit):
    recs = [encode_record("topic", 0, i, NOW, NOW, i, 0, p) for i, p in enumerate(payloads)]
    log = bytearray(b"".join(recs))
    if 0 <= flip_at < len(log):
        log[flip_at] ^= 0x08
    units, at = b"", 0
    for r in recs:
        units += UNIT.pack(1000 + at, len(r), 0)
        at += len(r)
    skip = record.metaq_offset(5)
    args = (units, skip, bytes(log), 1000, 1000 + len(log), limit, 0, True)
    assert gather_records_c(*args) == gather_records_py(*args)


# -- metaq-server --verify's scan (metaq/store/verify.py) ------------------------------------------------


def test_verify_finds_a_flipped_payload_byte_in_an_old_segment_and_nothing_in_a_clean_log(data_dir):
    from metaq.store.verify import verify_log

    s = open_store(data_dir)
    for i in range(300):  # 4 KiB segments: many of them
        s.put("test", i % 2, 0, b"payload %04d " % i * 4, NOW + i)
    s.close(NOW)
    clean = verify_log(str(data_dir))
    assert clean.records == 300 and clean.segments > 5 and not clean.corrupt and clean.torn_tail is None

    s = open_store(data_dir)
    position = flip_payload_byte(s, "test", 1, 20)  # in the second segment or so: long before the checkpoint
    s.close(NOW)
    found = []
    report = verify_log(str(data_dir), on_finding=found.append)
    assert [(f.topic, f.partition, f.offset, f.position) for f in report.corrupt] == [("test", 1, 20, position)]
    assert found == report.corrupt and "CRC mismatch" in found[0].reason
    assert report.records == 299  # every other record checked and valid
    assert "topic test partition 1 offset 20" in found[0].line() and "1 corrupt" in report.summary()


def test_verify_resyncs_after_a_damaged_header_and_refuses_a_locked_data_dir(data_dir):
    from metaq.store.verify import verify_log

    s = open_store(data_dir)
    for i in range(40):
        s.put("test", 0, 0, b"x%02d" % i * 10, NOW + i)
    position, size, _t = s._parts[("test", 0)].unit(5)
    seg = s._log.segment_at(position)
    seg.view[position - seg.start] ^= 0x7F  # the record's size field: its end is unknown
    with pytest.raises(errors.StoreError, match="in use"):
        verify_log(str(data_dir))  # the store holds the lock
    s.close(NOW)
    report = verify_log(str(data_dir))
    assert len(report.corrupt) == 1 and report.corrupt[0].position == position
    assert report.corrupt[0].length == size and report.records == 39


def test_verify_reports_a_torn_tail_after_the_checkpoint_apart_from_corruption(data_dir):
    from metaq.store.verify import verify_log

    s = open_store(data_dir)
    for i in range(10):
        s.put("test", 0, 0, b"kept %d " % i * 20, NOW + i)
    s.checkpoint(NOW + 10)
    s.put("test", 0, 0, b"torn " * 40, NOW + 11)
    position, size, _t = s._parts[("test", 0)].unit(10)
    seg = s._log.segment_at(position)
    rel = position - seg.start
    seg.view[rel + size - 100:rel + size] = bytes(100)  # its last 100 bytes never reached the disk
    s.abandon()  # as after kill -9
    report = verify_log(str(data_dir))
    assert not report.corrupt and report.records == 10
    assert report.torn_tail is not None and report.torn_tail.position == position
    assert "torn tail" in report.summary() and "0 corrupt" in report.summary()


def test_the_first_max_corrupt_logged_corrupt_records_are_logged_once_each_and_no_more(data_dir, caplog):
    """README "Operations", corrupt records: one ERROR line per corrupt record, the first time it is read, for
    the first ``MAX_CORRUPT_LOGGED`` of them; past that a read is still refused and counted, never logged."""
    import logging

    from metaq.store.limits import MAX_CORRUPT_LOGGED

    s = open_store(data_dir)
    n = MAX_CORRUPT_LOGGED + 2  # the limit and past it
    for i in range(n):
        s.put("test", 0, 0, b"record-%05d" % i, NOW + i)
    for i in range(n):
        flip_payload_byte(s, "test", 0, i)

    def read_every_one():
        for i in range(n):
            with pytest.raises(errors.CorruptRecord):
                s.read_joined("test", 0, i, 1 << 20)

    with caplog.at_level(logging.ERROR, logger="metaq.store.store"):
        read_every_one()
        read_every_one()  # the same records again: nothing more logged
    lines = [r for r in caplog.records if r.name == "metaq.store.store" and r.levelno == logging.ERROR]
    assert len(lines) == MAX_CORRUPT_LOGGED
    assert [r.getMessage().split(" offset ")[1].split()[0] for r in lines] == [str(i)
                                                                                 for i in range(MAX_CORRUPT_LOGGED)]
    assert s.reads.corrupt_reads == 2 * n  # every refused read is counted
    s.close(NOW)
