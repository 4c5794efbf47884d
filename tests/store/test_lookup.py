"""Record-level reads for RocketMQ pulls: records with positions, lookups by position and by store time."""

import pytest

from metaq import errors
from metaq.store.record import record_size
from tests.harness.store import NOW, open_store


def fill(s, n, topic="test", partition=0, step_ms=10):
    results = []
    for i in range(n):
        data = b"msg-%d" % i
        r = s.put(topic, partition, 0, data, NOW + i * step_ms, born_ms=NOW - 5)
        results.append((r, r.log_end - record_size(len(topic), len(data))))
    return results


def test_read_records_gives_positions_times_and_honours_counts_and_bytes(data_dir):
    s = open_store(data_dir, flush="async")
    put = fill(s, 10)
    recs, nxt = s.read_records("test", 0, 2, 3, 1 << 20)
    assert [r.data for r in recs] == [b"msg-2", b"msg-3", b"msg-4"] and nxt == 5
    assert [r.position for r in recs] == [p for _r, p in put[2:5]]
    assert (recs[0].queue_offset, recs[0].store_ts_ms, recs[0].born_ts_ms) == (2, NOW + 20, NOW - 5)
    one, nxt = s.read_records("test", 0, 0, 10, 1)  # at least one record, however small max_bytes is
    assert len(one) == 1 and nxt == 1
    assert s.read_records("test", 0, 10, 5, 1 << 20) == ([], 10)
    with pytest.raises(errors.Moved) as past:
        s.read_records("test", 0, 12, 5, 1 << 20)
    assert past.value.offset == 10
    assert s.read_records("test", 1, 0, 5, 1 << 20) == ([], 0)
    with pytest.raises(errors.NotFound):
        s.read_records("test", 9, 0, 5, 1 << 20)
    s.close(NOW + 1000)


def test_record_at_finds_records_by_position_only_at_their_start(data_dir):
    s = open_store(data_dir, flush="async")
    put = fill(s, 3)
    assert s.record_at(put[1][1]).data == b"msg-1"
    for bad in (put[1][1] + 1, -1, put[2][0].log_end, 1 << 40):
        with pytest.raises(errors.NotFound):
            s.record_at(bad)
    s.close(NOW + 1000)


def test_offset_by_time_lower_and_upper(data_dir):
    s = open_store(data_dir, flush="async")
    fill(s, 10, step_ms=10)  # stored at NOW, NOW+10, ... NOW+90
    assert s.offset_by_time("test", 0, NOW + 25) == 3
    assert s.offset_by_time("test", 0, NOW + 30) == 3
    assert s.offset_by_time("test", 0, NOW + 25, upper=True) == 2
    assert s.offset_by_time("test", 0, NOW - 100) == 0
    assert s.offset_by_time("test", 0, NOW + 1000) == 10
    assert s.offset_by_time("test", 0, NOW - 100, upper=True) == 0
    assert s.offset_by_time("test", 1, NOW) == 0  # no data yet
    s.close(NOW + 1000)
