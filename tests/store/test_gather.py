"""Reads for the wire: ``read_joined`` gives the bytes of ``read``'s views joined, and the C gather equals Python's."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq import errors
from metaq.store import gather
from metaq.store.gather import gather_records_py
from metaq.store.index import UNIT
from tests.harness.store import NOW, open_store

try:
    from metaq._speedups import gather_records as gather_records_c
except ImportError:
    gather_records_c = None


@pytest.fixture(params=["built", "python"])
def gatherer(request, monkeypatch):
    """read_joined with the C gather (when built) and with its pure-Python twin."""
    if request.param == "python":
        monkeypatch.setattr(gather, "gather_records", gather_records_py)
    return request.param


def same_read(s, topic, partition, offset, max_size):
    plain = s.read(topic, partition, offset, max_size)
    joined = s.read_joined(topic, partition, offset, max_size)
    assert b"".join(joined.views) == b"".join(bytes(v) for v in plain.views)
    assert (joined.nbytes, joined.count, joined.next_offset) == (plain.nbytes, plain.count, plain.next_offset)
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


@pytest.mark.skipif(gather_records_c is None, reason="metaq._speedups was not built")
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(-50, 5000), st.integers(-5, 400)), max_size=30), st.integers(0, 60),
       st.integers(0, 3000), st.integers(0, 400))
def test_c_gather_equals_the_python_reference(units, skip, limit, nbytes):
    log = bytes(range(256)) * 16
    raw = b"".join(UNIT.pack(1000 + phys, size, 0) for phys, size in units) + b"\x01\x02"  # and a partial unit
    args = (raw, skip, log, 1000, 1000 + len(log), limit, nbytes)
    assert gather_records_c(*args) == gather_records_py(*args)
