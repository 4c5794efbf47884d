"""store/coldmaps.py: at a checkpoint the maps of cold files give their pages back; nothing read changes.

Resident memory per map is read from /proc/self/smaps (``Rss:`` of the mapping of that file), the figure ``top``
and container limits add up: after a checkpoint the maps of the log below the flushed position less
``HOT_MAP_BYTES`` and of the index files before each partition's last hold none, the log above keeps its pages,
and every record reads back as written.
"""

import os

from metaq.store import coldmaps
from tests.harness.store import NOW, open_store, payload_of, read_all


def mapped_kb():
    """``{path: resident KiB}`` of this process's file maps (/proc/self/smaps)."""
    out, path = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
                path = head[5] if len(head) >= 6 and head[5].startswith("/") else None
            elif head and head[0] == "Rss:" and path is not None:
                out[path] = out.get(path, 0) + int(head[1])
    return out


def test_a_checkpoint_drops_the_pages_of_cold_maps_and_every_record_reads_back(tmp_path, monkeypatch):
    hot = 128 << 10
    monkeypatch.setattr(coldmaps, "HOT_MAP_BYTES", hot)  # two of these 64 KiB segments (the real one: 64 MiB)
    s = open_store(tmp_path, segment_size=1 << 16, index_file_units=256, flush="async")
    bodies = [b"%05d" % i + b"c" * 1000 for i in range(400)]  # ~400 KiB: several 64 KiB segments
    for i, body in enumerate(bodies):
        s.put("test", 0, 0, body, NOW + i)
    s.mark_flushed(s.flush_log())
    segments = sorted(os.path.join(s.dirs.commitlog, n) for n in os.listdir(s.dirs.commitlog))
    assert len(segments) >= 6
    before = mapped_kb()
    assert all(before.get(p, 0) > 0 for p in segments)  # written through the maps: every page resident
    s.checkpoint(NOW + 1000)
    after = mapped_kb()
    cold_end = s.flushed_position - hot
    starts = [int(os.path.basename(p)) for p in segments]
    cold = [p for p, start in zip(segments, starts, strict=True) if start + (1 << 16) <= cold_end]
    warm = [p for p, start in zip(segments, starts, strict=True) if start >= cold_end]
    assert len(cold) >= 3 and len(warm) >= 1
    assert all(after.get(p, 0) == 0 for p in cold), {p: after.get(p) for p in cold}
    assert all(after.get(p, 0) > 0 for p in warm)
    index_dir = os.path.dirname(s._parts[("test", 0)].files[0].file.path)
    index_files = sorted(os.path.join(index_dir, n) for n in os.listdir(index_dir))
    assert len(index_files) >= 2 and all(after.get(p, 0) == 0 for p in index_files[:-1])
    # nothing lost: the page cache still has the pages (and the disk, flushed); reads map them again
    assert [payload_of(m) for m in read_all(s, "test", 0)] == bodies
    s.close(NOW + 2000)
    s = open_store(tmp_path, segment_size=1 << 16, index_file_units=256, flush="async")
    assert [payload_of(m) for m in read_all(s, "test", 0)] == bodies
    s.close(NOW + 3000)


def test_reads_past_the_limit_ask_for_the_cold_maps_to_give_their_pages_back(tmp_path, monkeypatch):
    """``cold_reads_due``: false until reads took ``COLD_READ_DROP_BYTES`` of records since the last drop, true at
    the limit, false again once the maps gave their pages back; what is read is unchanged."""
    s = open_store(tmp_path, segment_size=1 << 16, index_file_units=256, flush="async")
    bodies = [b"%05d" % i + b"r" * 1000 for i in range(200)]
    for i, body in enumerate(bodies):
        s.put("test", 0, 0, body, NOW + i)
    s.mark_flushed(s.flush_log())
    s.drop_cold_pages()
    s.read("test", 0, 0, 1)  # one record: learn what a record counts
    one = s.reads.log_read_bytes - s.cold_maps.read_at_drop
    monkeypatch.setattr(coldmaps, "COLD_READ_DROP_BYTES", one * 10)
    s.drop_cold_pages()
    for k in range(9):
        s.read("test", 0, k, 1)
        assert not s.cold_reads_due()  # below the limit
    s.read("test", 0, 9, 1)
    assert s.cold_reads_due()  # at the limit
    s.read("test", 0, 10, 1)
    assert s.cold_reads_due()  # past it
    s.drop_cold_pages()
    assert not s.cold_reads_due()
    assert [payload_of(m) for m in read_all(s, "test", 0)] == bodies
    s.close(NOW + 1000)
