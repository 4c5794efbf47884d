"""prepare_ahead: the next segment and index file built (and pages prefaulted) off the put path,
by a worker thread while the loop thread puts and reads; crashes and full disks around it;
puts that bring their own verified checksum."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from metaq import errors
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import HEADER
from metaq.store import ahead, record
from metaq.store.commitlog import CommitLog
from metaq.store.recovery import read_log
from tests.harness.store import HOUR_MS, NOW, open_store, payload_of, read_all
from tests.harness.store import fill_to_leave

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def payload(i, size=100):
    head = b"a%05d-" % i
    return head + bytes([97 + i % 26]) * (size - len(head))


def commitlog_names(data_dir):
    return sorted(os.listdir(os.path.join(str(data_dir), "commitlog")))


def seg_name(start):
    return "%020d" % start


def put_until_past_half(s, partition=0, size=100):
    """Put into the active segment until it is more than half full (no roll); returns the payloads."""
    sent = []
    while True:
        sent.append(payload(len(sent), size))
        s.put("test", partition, 0, sent[-1], NOW)
        seg = s._log.active
        if (s.written_position - seg.start) * 2 > seg.size:
            return sent


def forbid_fallocate(monkeypatch):
    def refuse(fd, offset, length):
        raise AssertionError("posix_fallocate on the put path")
    monkeypatch.setattr(os, "posix_fallocate", refuse)


def test_prepare_ahead_builds_the_next_segment_and_the_roll_takes_it(data_dir, monkeypatch):
    s = open_store(data_dir, index_file_units=1 << 12)
    assert s.wants_preparation()  # the active segment is not prefaulted yet
    sent = put_until_past_half(s)
    assert s.wants_preparation()
    assert s.prepare_ahead()
    assert not s.wants_preparation() and not s.prepare_ahead()
    prepared = os.path.join(str(data_dir), "commitlog", seg_name(4096) + ".prepared")
    assert commitlog_names(data_dir) == [seg_name(0), seg_name(4096) + ".prepared"]
    assert os.path.getsize(prepared) == 4096
    inode = os.stat(prepared).st_ino

    forbid_fallocate(monkeypatch)  # the roll must not allocate anything
    while s.written_position < 4096:
        sent.append(payload(len(sent)))
        s.put("test", 0, 0, sent[-1], NOW)
    monkeypatch.undo()
    assert commitlog_names(data_dir) == [seg_name(0), seg_name(4096)]
    assert os.stat(os.path.join(str(data_dir), "commitlog", seg_name(4096))).st_ino == inode
    assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
    s.close(NOW)
    assert commitlog_names(data_dir) == [seg_name(0), seg_name(4096)]
    s = open_store(data_dir, index_file_units=1 << 12)
    assert s.recovery.clean_shutdown
    assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
    s.close(NOW)


def test_prepare_ahead_builds_the_next_index_file(data_dir, monkeypatch):
    s = open_store(data_dir, segment_size=1 << 20)
    for i in range(32):
        s.put("test", 1, 0, payload(i, 10), NOW)
    s.prepare_ahead()
    assert not s.wants_preparation()
    s.put("test", 1, 0, payload(32, 10), NOW)  # unit 32 of 64: the second half of the tail file
    assert s.wants_preparation()
    assert s.prepare_ahead()
    assert not s.wants_preparation()
    idx = os.path.join(str(data_dir), "index", "test", "1")
    assert sorted(os.listdir(idx)) == ["%020d" % 0, "%020d.prepared" % (16 * 64)]
    forbid_fallocate(monkeypatch)
    for i in range(33, 70):
        s.put("test", 1, 0, payload(i, 10), NOW)
    monkeypatch.undo()
    assert sorted(os.listdir(idx)) == ["%020d" % 0, "%020d" % (16 * 64)]
    assert [payload_of(m) for m in read_all(s, "test", 1)] == [payload(i, 10) for i in range(70)]
    s.close(NOW)
    s = open_store(data_dir, segment_size=1 << 20)
    assert s.recovery.clean_shutdown and s.max_offset("test", 1) == 70
    s.close(NOW)


def test_recovery_removes_a_prepared_segment_left_by_a_crash(data_dir, scanner):
    s = open_store(data_dir)
    sent = put_until_past_half(s)
    assert s.prepare_ahead()
    end = s.written_position
    s.abandon()  # as a kill -9: the prepared file stays
    assert commitlog_names(data_dir) == [seg_name(0), seg_name(4096) + ".prepared"]
    s = open_store(data_dir)
    assert commitlog_names(data_dir) == [seg_name(0)]
    r = s.recovery
    assert r.log_end == end and r.truncated_bytes == 0 and r.corruption is None
    assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
    for i in range(len(sent), len(sent) + 60):  # rolls (synchronously) and goes on
        sent.append(payload(i))
        s.put("test", 0, 0, sent[-1], NOW)
    assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
    s.close(NOW)


def test_recovery_tolerates_an_all_zero_segment_renamed_just_before_a_crash(data_dir, scanner):
    s = open_store(data_dir)
    sent = put_until_past_half(s)
    assert s.prepare_ahead()
    s.abandon()
    log_dir = os.path.join(str(data_dir), "commitlog")
    # a kill -9 between the roll's rename and its first write: an all-zero segment after the log end
    os.rename(os.path.join(log_dir, seg_name(4096) + ".prepared"), os.path.join(log_dir, seg_name(4096)))
    s = open_store(data_dir)
    assert s.recovery.truncated_bytes == 0 and s.recovery.corruption is None
    assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
    for i in range(len(sent), len(sent) + 60):
        sent.append(payload(i))
        s.put("test", 0, 0, sent[-1], NOW)
    assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
    s.close(NOW)
    assert [r.data for r in read_log(str(data_dir)) if r.partition == 0] == sent


def test_a_segment_prepared_too_late_is_deleted_by_the_next_prepare_ahead(data_dir):
    s = open_store(data_dir)
    put_until_past_half(s)
    start = s._log.active.end
    while s.written_position < start:  # the worker did not keep up: the put path rolled by itself
        s.put("test", 0, 0, payload(0), NOW)
    s._log.prepare_next(start, 0)  # ... and publishes its segment only now
    assert commitlog_names(data_dir) == [seg_name(0), seg_name(start), seg_name(start) + ".prepared"]
    assert s.wants_preparation()
    assert s.prepare_ahead()
    assert s._log.next is None or s._log.next.start == s._log.active.end
    assert seg_name(start) + ".prepared" not in commitlog_names(data_dir)
    s.close(NOW)


def test_a_full_segment_at_restart_is_prepared_for_once_and_then_left_alone(data_dir, monkeypatch):
    s = open_store(data_dir)
    fill_to_leave(s, 0)
    end = s.written_position
    s.close(NOW)
    s = open_store(data_dir)
    assert s.written_position == end == s._log.active.end
    assert s.wants_preparation() and s.prepare_ahead()
    assert not s.wants_preparation() and not s.prepare_ahead()  # nothing left to prefault: no busy loop
    forbid_fallocate(monkeypatch)
    s.put("test", 0, 0, b"rolls", NOW)
    assert s._log.active.start == end
    s.close(NOW)


CHILD = textwrap.dedent("""
    import sys, threading
    from metaq.storestate import open_store
    from tests.harness.store import NOW, small_config
    s = open_store(small_config(sys.argv[1], segment_size=64 * 1024), NOW)
    s.put("test", 0, 0, b"k%05d" % 0 + b"k" * 200, NOW)
    n = 1
    while (s.written_position - s._log.active.start) * 2 <= s._log.active.size:
        s.put("test", 0, 0, b"k%05d" % n + b"k" * 200, NOW)
        n += 1
    t = threading.Thread(target=s.prepare_ahead)
    t.start()
    t.join()
    for i in range(20):
        s.put("test", 0, 0, b"k%05d" % n + b"k" * 200, NOW)
        n += 1
    print(n, flush=True)
    threading.Event().wait(60)
""")


@pytest.mark.integration
@pytest.mark.fault
def test_kill_9_with_a_prepared_segment_then_restart(data_dir, scanner):
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data_dir)], cwd=REPO, stdout=subprocess.PIPE)
    try:
        n = int(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
    assert commitlog_names(data_dir) == [seg_name(0), seg_name(64 * 1024) + ".prepared"]
    s = open_store(data_dir, segment_size=64 * 1024)
    assert commitlog_names(data_dir) == [seg_name(0)]
    assert s.recovery.truncated_bytes == 0 and s.max_offset("test", 0) == n
    got = [payload_of(m) for m in read_all(s, "test", 0)]
    assert got == [b"k%05d" % i + b"k" * 200 for i in range(n)]
    s.close(NOW)


def test_retention_never_deletes_the_prepared_segment(data_dir, monkeypatch):
    s = open_store(data_dir, retention_hours=1.0)
    for i in range(200):  # many sealed segments
        s.put("test", 0, 0, payload(i), NOW)
    put_until_past_half(s)
    assert s.prepare_ahead()
    prepared = os.path.join(str(data_dir), "commitlog", seg_name(s._log.active.end) + ".prepared")
    assert os.path.exists(prepared)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    report = s.retention(NOW + 10 * HOUR_MS)
    assert report.deleted_segments and prepared not in report.deleted_segments
    assert os.path.exists(prepared)
    forbid_fallocate(monkeypatch)
    start = s._log.active.end
    while s.written_position <= start:
        s.put("test", 0, 0, payload(0), NOW)
    assert os.path.exists(os.path.join(str(data_dir), "commitlog", seg_name(start)))
    s.close(NOW)


def test_put_with_a_given_checksum_does_not_compute_it_and_the_record_verifies(data_dir, monkeypatch):
    s = open_store(data_dir)
    data = b"given checksum" * 20
    checksum = metaq_checksum(data)

    def refuse(_data):
        raise AssertionError("metaq_checksum computed again")

    monkeypatch.setattr(record, "metaq_checksum", refuse)
    r = s.put("test", 0, 0, data, NOW, checksum=checksum)
    monkeypatch.undo()
    got = read_all(s, "test", 0)[0]
    assert got == HEADER.pack(len(data), checksum, r.msg_id, 0) + data
    r2 = s.put("test", 0, 0, data, NOW, checksum=-1)  # "unchecked": computed here
    assert read_all(s, "test", 0)[1] == HEADER.pack(len(data), checksum, r2.msg_id, 0) + data
    s.abandon()
    s = open_store(data_dir)  # the recovery scan checks every record's CRC
    assert s.recovery.records_scanned == 2 and s.recovery.truncated_bytes == 0
    assert [(x.data, x.msg_id) for x in read_log(str(data_dir))] == [(data, r.msg_id), (data, r2.msg_id)]
    s.close(NOW)


class Workers:
    """As the server: prepare_ahead in one thread when the loop says so, flush_log and checkpoint in another."""

    def __init__(self, s):
        self.s = s
        self.wake, self.stop = threading.Event(), threading.Event()
        self.failures, self.flushed = [], []
        self.threads = [threading.Thread(target=self._guard, args=(f,)) for f in (self._prepare, self._flush)]
        for t in self.threads:
            t.start()

    def _guard(self, work):
        try:
            while not self.stop.is_set():
                work()
        except Exception as exc:  # reported by the main thread
            self.failures.append(exc)

    def _prepare(self):
        if self.wake.wait(0.05):
            self.wake.clear()
            self.s.prepare_ahead()

    def _flush(self):
        self.flushed.append(self.s.flush_log())
        self.s.checkpoint(NOW)

    def after_put(self):
        if self.s.wants_preparation():
            self.wake.set()
            time.sleep(0.0005)  # a server's loop would serve other connections meanwhile
        if self.flushed:
            self.s.mark_flushed(self.flushed[-1])

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.failures, self.failures


def test_prepare_ahead_in_a_thread_while_putting_reading_flushing_and_retaining(data_dir, monkeypatch):
    s = open_store(data_dir, segment_size=16 * 1024, flush="sync", retention_hours=1.0)
    taken = []
    real_take = CommitLog._take_next

    def counting_take(self, start):
        seg = real_take(self, start)
        taken.append(seg is not None)
        return seg

    monkeypatch.setattr(CommitLog, "_take_next", counting_take)
    workers = Workers(s)
    sent = {p: [] for p in range(4)}
    try:
        for i in range(4000):
            p = i % 4
            sent[p].append(b"%06d" % i + b"c" * (i % 300))
            s.put("test", p, 0, sent[p][-1], NOW, checksum=metaq_checksum(sent[p][-1]) if i % 2 else None)
            workers.after_put()
            if i % 97 == 0:
                r = s.read("test", p, max(s.min_offset("test", p), s.max_offset("test", p) - 5), 1 << 20)
                assert all(payload_of(bytes(v)) in sent[p] for v in r.views)
            if i % 1000 == 999:
                s.retention(NOW + 10 * HOUR_MS)
    finally:
        workers.join()
    assert sum(taken) >= 5, taken  # most rolls used a prepared segment
    s.mark_flushed(s.flush_log())
    for p in range(4):
        low = s.min_offset("test", p)
        assert s.max_offset("test", p) == 1000
        assert [payload_of(m) for m in read_all(s, "test", p)] == sent[p][low:]
    s.close(NOW)
    s = open_store(data_dir, segment_size=16 * 1024)
    assert s.recovery.clean_shutdown
    assert not glob.glob(os.path.join(str(data_dir), "**", "*.prepared"), recursive=True)
    s.close(NOW)


@pytest.mark.root
@pytest.mark.fault
def test_prepare_ahead_on_a_full_tmpfs_leaves_no_partial_file(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % r.stderr.decode().strip())
    try:
        data = mnt / "data"
        kw = dict(segment_size=256 * 1024, index_file_units=256, disk_warn_ratio=1.0, disk_danger_ratio=1.0)
        s = open_store(data, **kw)
        sent = put_until_past_half(s, size=8000)
        st = os.statvfs(str(mnt))
        with open(str(mnt / "filler"), "wb") as f:  # leave ~100 KiB: less than a segment
            f.write(b"\1" * (st.f_bavail * st.f_frsize - 100 * 1024))
        calls = []
        real = os.posix_fallocate

        def counting(fd, offset, length):
            calls.append(length)
            return real(fd, offset, length)

        monkeypatch.setattr(os, "posix_fallocate", counting)
        s.prepare_ahead()  # the danger-mark check alone says no: nothing is tried
        assert calls == [] and commitlog_names(data) == [seg_name(0)]
        monkeypatch.setattr(ahead, "fits_below_danger", lambda root, size, ratio: True)
        s._log._retry_at = -1
        s.prepare_ahead()  # a real ENOSPC from posix_fallocate
        assert calls == [256 * 1024]
        assert commitlog_names(data) == [seg_name(0)] and s._log.next is None
        assert not s.wants_preparation()  # no retry before the log has grown
        with pytest.raises(errors.DiskFull):  # the roll on the put path: today's clean refusal
            while True:
                sent.append(payload(len(sent), 8000))
                s.put("test", 0, 0, sent[-1], NOW)
        assert commitlog_names(data) == [seg_name(0)]
        os.unlink(str(mnt / "filler"))
        s.put("test", 0, 0, sent[-1], NOW)  # space is back: the put path rolls as before
        assert commitlog_names(data) == [seg_name(0), seg_name(256 * 1024)]
        assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
        s.close(NOW)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
