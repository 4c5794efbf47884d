"""Retention with injected time, disk watermarks, failed preallocation and a real full tmpfs (F4)."""

import errno
import glob
import os
import subprocess

import pytest

from metaq import errors
from metaq.store import recovery
from metaq.store.files import DataDir, DiskUsage
from metaq.store.results import PRESSURE_FULL, PRESSURE_NONE, PRESSURE_WARN, DiskState
from metaq.store.retention import SegmentInfo, plan_deletion
from tests.harness.store import HOUR_MS, NOW, open_store, payload_of, read_all
from tests.harness.tmpfs import ext4_with_reserve, fill

MINUTE_MS = 60_000


def payload(i, size=100):
    head = b"r%05d-" % i
    return head + b"r" * (size - len(head))


def put_minutely(s, n, start=NOW):
    """One message a minute into test/0; returns the time of the last one."""
    for i in range(n):
        s.put("test", 0, 0, payload(i), start + i * MINUTE_MS)
    return start + (n - 1) * MINUTE_MS


def segment_files(data_dir):
    return sorted(glob.glob(os.path.join(str(data_dir), "commitlog", "*")))


def mtime_ms(path):
    return os.stat(path).st_mtime_ns // 1_000_000


def test_plan_deletes_a_prefix_of_old_or_pressured_deletable_segments():
    segs = [SegmentInfo("a", 100, 0, True), SegmentInfo("b", 100, 50, True),
            SegmentInfo("c", 100, 50, True), SegmentInfo("d", 100, 0, False)]
    assert plan_deletion(segs, 100, 60)[0] == 1  # "b" is young: only a prefix goes
    assert plan_deletion(segs, 200, 60)[0] == 3  # never "d" (active, unflushed or not checkpointed)
    assert plan_deletion(segs, 100, 60, usage_ratio=0.80, warn_ratio=0.75, disk_total_bytes=2000)[0] == 1
    count, why = plan_deletion(segs, 100, 60, usage_ratio=0.95, warn_ratio=0.75, disk_total_bytes=1000)
    assert count == 2 and "warn mark" in why  # 0.95 - 0.1 = 0.85 > 0.75, then 0.75 is not above it


def test_a_disk_without_room_for_the_next_segment_is_under_pressure_below_the_warn_mark():
    """At the mark (exactly one segment free) nothing goes; one byte less, the oldest young segment goes, and as many
    as bring the free bytes back to a segment; a warn mark of 1.0 deletes nothing early, whatever is free."""
    segs = [SegmentInfo("a", 100, 50, True), SegmentInfo("b", 100, 50, True), SegmentInfo("c", 100, 0, False)]
    young = dict(now_ms=60, retention_ms=60, usage_ratio=0.5, warn_ratio=0.75, disk_total_bytes=10_000,
                 segment_size=150)
    assert plan_deletion(segs, free_bytes=150, **young)[0] == 0
    count, why = plan_deletion(segs, free_bytes=149, **young)
    assert count == 1 and "room for the next 150-byte segment (149 bytes free)" in why
    assert plan_deletion(segs, free_bytes=0, **young)[0] == 2  # 0 + 100 < 150: the second goes too
    assert plan_deletion(segs, free_bytes=0, **dict(young, warn_ratio=1.0))[0] == 0


def test_disk_state_names_the_pressure_at_each_mark_and_one_past():
    """``stats`` ``disk_pressure``: none at the warn mark, warn one byte past it; warn at the danger mark, full one
    byte past it; warn one byte short of room for a segment (not with a warn mark of 1.0)."""
    def state(used, free, warn=0.5, segment=100):
        return DiskState.of(DiskUsage(used, free), 0.75, warn, segment)

    assert state(500, 500).pressure == PRESSURE_NONE  # 0.5: at the warn mark
    past = state(501, 499)
    assert past.pressure == PRESSURE_WARN and "above the warn mark 50%" in past.pressure_reason
    assert state(750, 250).pressure == PRESSURE_WARN and not state(750, 250).refusing_writes  # at the danger mark
    full = state(751, 249)
    assert full.pressure == PRESSURE_FULL and full.refusing_writes and full.pressure_reason == full.reason
    assert state(50, 100, segment=100).pressure == PRESSURE_NONE
    short = state(50, 99, segment=100)
    assert short.pressure == PRESSURE_WARN and "less than a 100-byte segment" in short.pressure_reason
    assert state(50, 99, warn=1.0, segment=100).pressure == PRESSURE_NONE


def test_retention_deletes_old_segments_and_index_files_and_raises_the_minimum(data_dir):
    s = open_store(data_dir, retention_hours=1.0)
    last = put_minutely(s, 300)
    s.mark_flushed(s.flush_log())
    s.checkpoint(last)
    segs = segment_files(data_dir)
    assert len(segs) > 10
    old = [p for p in segs[:-1] if last - mtime_ms(p) > HOUR_MS]
    assert 3 < len(old) < len(segs) - 1
    assert old == segs[:len(old)]  # sealed in order: the oldest come first
    index_before = sorted(os.listdir(os.path.join(str(data_dir), "index", "test", "0")))

    report = s.retention(last)
    assert report.deleted_segments == old and report.freed_bytes == 4096 * len(old)
    assert segment_files(data_dir) == segs[len(old):]
    low = s.min_offset("test", 0)
    assert low > 0 and report.raised_min_offsets == {("test", 0): low}
    with pytest.raises(errors.Moved) as exc:
        s.read("test", 0, low - 1, 1000)
    assert exc.value.offset == low and s.nearest_offset("test", 0, 0) == low
    assert [payload_of(m) for m in read_all(s, "test", 0)] == [payload(i) for i in range(low, 300)]
    index_after = sorted(os.listdir(os.path.join(str(data_dir), "index", "test", "0")))
    gone = sorted(set(index_before) - set(index_after))
    assert len(gone) == low // 64 and [os.path.basename(p) for p in report.deleted_index_files] == gone
    assert s.retention(last).deleted_segments == []  # nothing more is old enough
    s.close(last)
    s = open_store(data_dir, retention_hours=1.0)
    assert s.recovery.clean_shutdown and s.min_offset("test", 0) == low and s.max_offset("test", 0) == 300
    s.abandon()
    s = open_store(data_dir, retention_hours=1.0)
    assert s.min_offset("test", 0) == low and s.max_offset("test", 0) == 300
    assert s.put("test", 0, 0, b"new", last).offset == 300
    s.close(last)


def test_retention_never_deletes_unflushed_or_uncheckpointed_segments(data_dir):
    s = open_store(data_dir, retention_hours=1.0)
    last = put_minutely(s, 200)
    much_later = last + 1000 * HOUR_MS
    assert s.retention(much_later).deleted_segments == []  # nothing flushed yet
    s.mark_flushed(s.flush_log())
    assert s.retention(much_later).deleted_segments == []  # flushed but no checkpoint covers it
    s.checkpoint(much_later)
    n = len(segment_files(data_dir))
    assert len(s.retention(much_later).deleted_segments) == n - 1  # never the active segment
    assert s.min_offset("test", 0) == s.max_offset("test", 0) - s.read("test", 0, s.min_offset("test", 0),
                                                                         1 << 20).count
    s.close(much_later)


def test_disk_pressure_deletes_young_segments_above_the_warn_mark(data_dir):
    s = open_store(data_dir, retention_hours=1000.0, disk_warn_ratio=0.75)
    last = put_minutely(s, 100)
    s.mark_flushed(s.flush_log())
    s.checkpoint(last)
    n = len(segment_files(data_dir))
    assert s.retention(last, disk_usage_ratio=0.5).deleted_segments == []
    report = s.retention(last, disk_usage_ratio=0.99)
    assert len(report.deleted_segments) == n - 1 and "warn mark" in report.reason
    assert report.pressured_segments == n - 1  # all young: what stats counts as disk_pressure_deleted_segments
    s.close(last)


def test_above_the_danger_mark_puts_are_refused_until_usage_drops(data_dir):
    s = open_store(data_dir, disk_danger_ratio=1e-9)
    state = s.check_disk()
    assert state.refusing_writes and 0 < state.usage_ratio <= 1 and state.free_bytes > 0
    assert "above the danger mark" in state.reason and "writes are refused until space is freed" in state.reason
    with pytest.raises(errors.DiskFull, match="danger mark"):
        s.put("test", 0, 0, b"x", NOW)
    assert s.written_position == 0
    assert s.read("test", 0, 0, 100).count == 0  # reads keep working
    s.config.disk_danger_ratio = 1.0  # as if space had been freed
    assert s.put("test", 0, 0, b"x", NOW).offset == 0
    assert not s.check_disk().refusing_writes
    s.close(NOW)


def failing_fallocate(monkeypatch, match):
    real = os.posix_fallocate
    calls = []

    def fake(fd, offset, length):
        path = os.readlink("/proc/self/fd/%d" % fd)
        if match in path:
            calls.append(path)
            os.ftruncate(fd, length // 2)  # ext4 leaves a partly allocated file behind
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fake)
    return calls


def test_failed_segment_preallocation_is_disk_full_and_leaves_nothing_half_done(data_dir, monkeypatch):
    s = open_store(data_dir)
    while s.written_position < 4096 - 200:
        s.put("test", 0, 0, b"s" * 100, NOW)
    n, pos = s.max_offset("test", 0), s.written_position
    calls = failing_fallocate(monkeypatch, "commitlog")
    with pytest.raises(errors.DiskFull, match="disk full: no space left"):
        s.put("test", 0, 0, b"L" * 300, NOW)
    assert calls and segment_files(data_dir) == [os.path.join(str(data_dir), "commitlog", "%020d" % 0)]
    assert s.written_position == pos and s.max_offset("test", 0) == n
    with open(segment_files(data_dir)[0], "rb") as f:
        assert f.read()[pos:] == bytes(4096 - pos)  # no blank marker, no partial record
    assert s.put("test", 0, 0, b"small", NOW).offset == n  # what still fits is accepted
    monkeypatch.undo()
    assert s.put("test", 0, 0, b"L" * 300, NOW).offset == n + 1  # space is back: writes resume
    assert len(read_all(s, "test", 0)) == n + 2
    s.close(NOW)


def test_failed_index_preallocation_is_disk_full_before_the_record_is_written(data_dir, monkeypatch):
    s = open_store(data_dir, segment_size=64 * 1024)
    for _ in range(64):
        s.put("test", 1, 0, b"i", NOW)
    pos = s.written_position
    failing_fallocate(monkeypatch, "index")
    with pytest.raises(errors.DiskFull):
        s.put("test", 1, 0, b"unit 64", NOW)
    assert s.written_position == pos and s.max_offset("test", 1) == 64
    assert os.listdir(os.path.join(str(data_dir), "index", "test", "1")) == ["%020d" % 0]
    monkeypatch.undo()
    assert s.put("test", 1, 0, b"unit 64", NOW).offset == 64
    s.abandon()
    s = open_store(data_dir, segment_size=64 * 1024)
    assert s.recovery.truncated_bytes == 0 and s.max_offset("test", 1) == 65
    s.close(NOW)


@pytest.mark.root
@pytest.mark.fault
def test_full_tmpfs_refuses_writes_cleanly_and_resumes_after_remount(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % r.stderr.decode().strip())
    try:
        data = mnt / "data"
        s = open_store(data, segment_size=256 * 1024, index_file_units=256,
                       disk_warn_ratio=1.0, disk_danger_ratio=1.0)
        acked = []
        with pytest.raises(errors.DiskFull):
            for i in range(10_000):
                acked.append((i % 3, s.put("test", i % 3, 0, payload(i, 8000), NOW).offset))
        assert 100 < len(acked) < 300
        for _ in range(3):  # every retry gets the same clean refusal
            with pytest.raises(errors.DiskFull):
                s.put("test", 0, 0, payload(0, 8000), NOW)
        for p in range(3):
            got = [payload_of(m) for m in read_all(s, "test", p)]
            assert got == [payload(i, 8000) for i in range(p, len(acked), 3)]
        assert all(os.path.getsize(f) == 256 * 1024 for f in segment_files(data))
        for f in glob.glob(os.path.join(str(data), "index", "*", "*", "*")):
            assert os.path.getsize(f) == 256 * 16
        subprocess.run(["mount", "-o", "remount,size=8m", str(mnt)], check=True)
        r = s.put("test", 0, 0, b"after", NOW)
        assert r.offset == len([a for a in acked if a[0] == 0])
        s.close(NOW)
        s = open_store(data, segment_size=256 * 1024, index_file_units=256)
        assert s.recovery.clean_shutdown and s.max_offset("test", 0) == r.offset + 1
        s.close(NOW)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_store_that_crashed_with_its_disk_full_opens_on_the_full_disk_keeping_its_last_checkpoint(tmp_path):
    """The checkpoint after recovery meets ENOSPC: the store opens anyway (so that retention can free space), the
    last checkpoint stays as it was, and a second crash recovers from it again: every message is there each time."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % r.stderr.decode().strip())
    try:
        data = mnt / "data"
        opts = dict(segment_size=256 * 1024, index_file_units=256)
        s = open_store(data, **opts)
        for i in range(60):
            s.put("test", i % 2, 0, payload(i, 1000), NOW)
        s.mark_flushed(s.flush_log())
        s.checkpoint(NOW)
        checkpointed = recovery.read_checkpoint(DataDir(str(data))).position
        for i in range(60, 400):
            s.put("test", i % 2, 0, payload(i, 1000), NOW)
        s.mark_flushed(s.flush_log())
        s.abandon()  # a crash: no clean-shutdown marker, the checkpoint behind the log
        filler = fill(mnt)
        assert os.statvfs(str(mnt)).f_bavail == 0

        s = open_store(data, **opts)
        assert not s.recovery.clean_shutdown
        for p in range(2):
            assert [payload_of(m) for m in read_all(s, "test", p)] == [payload(i, 1000) for i in range(p, 400, 2)]
        assert recovery.read_checkpoint(DataDir(str(data))).position == checkpointed  # the last one, in place
        s.abandon()  # a second crash, before any checkpoint could be written

        os.unlink(filler)
        s = open_store(data, **opts)
        assert s.recovery.scanned_from == checkpointed
        for p in range(2):
            assert [payload_of(m) for m in read_all(s, "test", p)] == [payload(i, 1000) for i in range(p, 400, 2)]
        s.close(NOW)
        assert recovery.read_checkpoint(DataDir(str(data))).position > checkpointed
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def df_fraction(path):
    st = os.statvfs(str(path))
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return used / (used + st.f_bavail * st.f_frsize), used + st.f_bavail * st.f_frsize


@pytest.mark.fault
@pytest.mark.root
def test_disk_pressure_deletes_what_brings_df_below_the_warn_mark_on_a_filesystem_with_a_root_reserve(tmp_path):
    segment = 1 << 20
    with ext4_with_reserve(tmp_path / "mnt", 64, 50):  # half the blocks kept for root: size = 2 x (used + available)
        data_dir = tmp_path / "mnt" / "data"
        s = open_store(data_dir, segment_size=segment, retention_hours=1000.0)
        for i in range(12):  # 12 sealed segments of ~1 MiB
            s.put("test", 0, 0, payload(i, 1000 * 1000), NOW + i)
        s.mark_flushed(s.flush_log())
        s.checkpoint(NOW + 100)
        usage, room = df_fraction(tmp_path / "mnt")
        s.config.disk_warn_ratio = usage - 2.5 * segment / room  # three segments' worth above the mark
        report = s.retention(NOW + 100, disk_usage_ratio=usage)
        after, _room = df_fraction(tmp_path / "mnt")
        s.close(NOW + 100)
        assert len(report.deleted_segments) == 3, report  # the old estimate (over the whole size) took 7
        assert s.config.disk_warn_ratio - segment / room < after < s.config.disk_warn_ratio  # what df shows now


def test_retention_keeps_every_segment_from_the_floor(data_dir):
    """The timer service's floor (README "Any delivery time"): records not indexed yet keep their segments."""
    s = open_store(data_dir, retention_hours=1.0)
    last = put_minutely(s, 300)
    s.mark_flushed(s.flush_log())
    s.checkpoint(last)
    segs = segment_files(data_dir)
    old = [p for p in segs[:-1] if last - mtime_ms(p) > HOUR_MS]
    assert len(old) > 3
    floor = int(os.path.basename(old[2]))  # the third old segment holds the first record not indexed
    report = s.retention(last, floor=floor)
    assert report.deleted_segments == old[:2]  # never a segment reaching past the floor
    assert s.retention(last, floor=floor).deleted_segments == []
    assert s.retention(last, floor=None).deleted_segments == old[2:]  # no floor: the rest of the old ones
    s.close(last)
