"""``TimeSearch``: the store's time lookup one map read at a time (the text port's ``offset_at``), and
``MappedFile.resident``; files only."""

import struct

import pytest

from metaq.store.index import UNIT_SIZE
from tests.harness.store import HOUR_MS, NOW, open_store


def fill(s, times, topic="test", partition=0):
    for i, t in enumerate(times):
        s.put(topic, partition, 0, b"m%04d" % i, t)


def brute_force(times, t):
    """The first offset stored at or after ``t``: the answer by looking at every message."""
    return next((n for n, stored in enumerate(times) if stored >= t), len(times))


def run(search, check=None):
    while not search.done:
        page = search.need()
        if check is not None:
            check(search, page)
        search.step()
    return search.result


def test_every_time_gets_the_brute_force_answer_across_segments_and_index_files(data_dir):
    s = open_store(data_dir, flush="async")  # 4 KiB segments, 64-unit index files: many of each
    times = [NOW + 10 * (i // 3) for i in range(700)]  # three messages per store time
    fill(s, times)
    for t in range(NOW - 5, times[-1] + 15, 5):
        assert run(s.time_search("test", 0, t)) == brute_force(times, t) == s.offset_by_time("test", 0, t)
    assert run(s.time_search("test", 1, NOW)) == 0  # a partition without messages: its end
    s.close(NOW + 1)


def test_need_names_the_bytes_the_next_step_reads(data_dir):
    s = open_store(data_dir, flush="async")
    times = [NOW + i for i in range(300)]
    fill(s, times)
    seen = []

    def check(search, page):
        f, start, end = page
        assert 0 <= start < end <= f.size
        if end - start == UNIT_SIZE:  # an index unit: the record's commit-log position comes first
            seen.append("unit")
        else:  # the record's store time, 8 bytes: one of the times stored
            assert end - start == 8 and struct.unpack(">q", f.view[start:end])[0] in times
            seen.append("time")

    assert run(s.time_search("test", 0, NOW + 123), check) == 123
    assert seen[:2] == ["unit", "time"] and seen.count("unit") == seen.count("time") >= 8  # log2(300)
    s.close(NOW + 1)


def test_retention_between_steps_keeps_the_answer_within_the_partition(data_dir):
    s = open_store(data_dir, flush="async", retention_hours=1)
    times = [NOW + i for i in range(2000)]
    fill(s, times)
    search = s.time_search("test", 0, NOW - 1)  # before everything: the first kept offset
    search.step()
    search.step()
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW + 3000)
    assert s.retention(NOW + 2 * HOUR_MS).deleted_segments
    low = s.min_offset("test", 0)
    assert 0 < low < 1999
    assert run(search) == low
    assert [run(s.time_search("test", 0, t)) for t in (NOW + low - 1, NOW + low + 1)] == [low, low + 1]
    s.close(NOW + 3 * HOUR_MS)


def test_resident_tells_a_page_in_memory(data_dir):
    s = open_store(data_dir, flush="async")
    fill(s, [NOW])
    page = s.time_search("test", 0, NOW).need()
    f = page[0]
    assert f.resident(page[1])  # just written: in the page cache
    assert not f.resident(-1) and not f.resident(f.size)  # outside the map
    s.close(NOW + 1)
    assert not f.resident(page[1])  # a closed map is not asked


def filesystem_of(path):
    """The type of the filesystem holding ``path`` (the longest mount point above it in /proc/mounts)."""
    import os

    path, best, kind = os.path.realpath(str(path)), "", None
    with open("/proc/mounts") as f:
        for line in f:
            point, fs = line.split()[1:3]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best, kind = point, fs
    return kind


MADV_PAGEOUT = 21  # Linux >= 5.4 (Python's mmap module may not name it)


def page_out(f):
    """Drop the pages of a mapped file ``f`` from memory now (the store has it open and mapped: evicting the files
    before opening it is undone by recovery, which reads them back). False when the kernel cannot."""
    try:
        f.mm.madvise(MADV_PAGEOUT)
    except OSError:
        return False
    return True


def test_a_cold_page_is_found_cold_and_populate_brings_it_in(data_dir):
    if filesystem_of(data_dir) == "tmpfs":
        pytest.skip("tmpfs pages are the files themselves: they cannot be evicted")
    s = open_store(data_dir, flush="async", segment_size=1 << 20, index_file_units=1 << 16)
    times = [NOW + i for i in range(20000)]
    fill(s, times)
    s.close(NOW + 1)
    s = open_store(data_dir, now=NOW + 2, flush="async", segment_size=1 << 20, index_file_units=1 << 16)
    search = s.time_search("test", 0, NOW + 7000)
    seen, cold = set(), 0
    while not search.done:
        f, start, end = search.need()
        if id(f) not in seen:  # each file the probes read: out of memory before its first probe
            seen.add(id(f))
            if not page_out(f):
                pytest.skip("this kernel has no MADV_PAGEOUT")
            assert not f.resident(start)
        if not f.resident(start):
            cold += 1
            assert f.populate(start, end)
            assert f.resident(start)  # in memory now: the read that follows takes no disk read
        search.step()
    assert search.result == 7000 and cold >= len(seen) >= 1
    s.close(NOW + 3)


def test_without_madv_populate_populate_falls_back_to_willneed_and_still_brings_pages_in(data_dir, monkeypatch):
    """Kernels before 5.14 lack MADV_POPULATE_*: ``populate`` then advises MADV_WILLNEED. It advised 4 — which is
    MADV_DONTNEED — so on those kernels a cold page was never brought in off the loop (the loop then took the disk
    read itself)."""
    import mmap
    import time

    from metaq.store import mapped

    assert mapped.MADV_WILLNEED == mmap.MADV_WILLNEED
    if filesystem_of(data_dir) == "tmpfs":
        pytest.skip("tmpfs pages are the files themselves: they cannot be evicted")
    monkeypatch.setattr(mapped._Madvise, "populate_supported", False)
    s = open_store(data_dir, flush="async", segment_size=1 << 20, index_file_units=1 << 16)
    fill(s, [NOW + i for i in range(20000)])
    s.close(NOW + 1)
    s = open_store(data_dir, now=NOW + 2, flush="async", segment_size=1 << 20, index_file_units=1 << 16)
    f, start, end = s.time_search("test", 0, NOW + 7000).need()
    if not page_out(f):
        pytest.skip("this kernel has no MADV_PAGEOUT")
    assert not f.resident(start)
    assert f.populate(start, end)
    deadline = time.monotonic() + 10  # WILLNEED starts the read and returns: wait for the page to arrive
    while not f.resident(start) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert f.resident(start)
    s.close(NOW + 3)


def test_a_records_store_time_from_its_header_and_none_where_nothing_is_held(data_dir):
    # a get_prio compares its levels' heads by it (priorities/text.py); the level may be deleted, cut or
    # retained while its cold pages are brought in: then nothing is held there, and the answer is None
    s = open_store(data_dir, flush="async")
    times = [NOW + 7 * i for i in range(300)]
    fill(s, times)
    assert [s.msg_id_at("test", 0, n, stored_at=True) for n in (0, 150, 299)] == [times[0], times[150], times[299]]
    assert s.msg_id_at("test", 0, 300, stored_at=True) is None  # the end: not held yet
    assert s.msg_id_at("test", 3, 0, stored_at=True) is None  # a partition without messages
    assert s.msg_id_at("gone", 0, 5, stored_at=True) is None  # no such topic (deleted meanwhile)
    s.close(NOW + 1)
