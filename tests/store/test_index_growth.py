"""Issue 15 point 5: index files start at one page and grow on demand (no 16 MiB file per new partition).

What a user would check: the bytes the data dir takes for new partitions, that every message reads back
after a restart (clean or not, including a crash between growing a file and writing into it), that the
worker grows files ahead of the writer, and that a full disk during growth is the normal refusal.
"""

import os
import subprocess

import pytest

from metaq import errors
from metaq.store.config import TopicSpec
from metaq.store.index import INITIAL_UNITS, UNIT_SIZE
from tests.harness.store import NOW, open_store, payload_of, read_all


def index_files(data_dir, topic, partition):
    d = os.path.join(str(data_dir), "index", topic, str(partition))
    return sorted((name, os.path.getsize(os.path.join(d, name))) for name in os.listdir(d))


def allocated_bytes(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def test_a_new_partition_takes_one_page_of_index_not_a_whole_file(data_dir):
    s = open_store(data_dir, index_file_units=1 << 20, segment_size=1 << 20, topics=[TopicSpec("*", 4)])
    for t in range(50):
        for p in range(4):
            s.put("topic-%d" % t, p, 0, b"x", NOW)
    s.close(NOW)
    assert index_files(data_dir, "topic-7", 3) == [("%020d" % 0, INITIAL_UNITS * UNIT_SIZE)]
    used = allocated_bytes(os.path.join(str(data_dir), "index"))
    assert used <= 200 * 2 * INITIAL_UNITS * UNIT_SIZE  # 200 partitions: ~800 KiB, not 200 x 16 MiB = 3.2 GiB


def test_a_file_doubles_up_to_its_span_then_the_next_one_starts_small(data_dir):
    units = 1024
    s = open_store(data_dir, index_file_units=units, segment_size=1 << 20)
    sizes = []
    for i in range(units + 10):
        s.put("test", 0, 0, b"m%d" % i, NOW)
        size = index_files(data_dir, "test", 0)[0][1]
        if not sizes or sizes[-1] != size:
            sizes.append(size)
    assert sizes == [4096, 8192, 16384]  # 256, 512, 1024 units
    assert index_files(data_dir, "test", 0) == [("%020d" % 0, units * UNIT_SIZE),
                                                 ("%020d" % (units * UNIT_SIZE), INITIAL_UNITS * UNIT_SIZE)]
    assert [payload_of(m) for m in read_all(s, "test", 0)] == [b"m%d" % i for i in range(units + 10)]
    s.close(NOW)


def test_the_worker_grows_the_tail_ahead_of_the_writer(data_dir, monkeypatch):
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20)
    for _ in range(INITIAL_UNITS // 2 + 1):  # past the middle of the first page
        s.put("test", 0, 0, b"a", NOW)
    assert s.wants_preparation()
    s.prepare_ahead()
    assert index_files(data_dir, "test", 0)[0][1] == 2 * INITIAL_UNITS * UNIT_SIZE  # grown, not yet adopted
    real = os.posix_fallocate

    def refuse(*args):
        raise AssertionError("posix_fallocate on the put path")

    monkeypatch.setattr(os, "posix_fallocate", refuse)  # the put path adopts the grown map, allocates nothing
    for _ in range(INITIAL_UNITS):
        s.put("test", 0, 0, b"b", NOW)
    monkeypatch.setattr(os, "posix_fallocate", real)
    assert s.max_offset("test", 0) == INITIAL_UNITS // 2 + 1 + INITIAL_UNITS
    s.close(NOW)


@pytest.mark.parametrize("clean", [True, False])
def test_partial_files_survive_a_restart_and_grow_on(data_dir, clean):
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20)
    sent = [b"p%d" % i for i in range(300)]  # 300 units: the file is 512 units long
    for m in sent:
        s.put("test", 1, 0, m, NOW)
    s.mark_flushed(s.flush_log())
    if clean:
        s.close(NOW)
    else:
        s.abandon()  # kill -9
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20)
    assert s.recovery.clean_shutdown is clean
    assert [payload_of(m) for m in read_all(s, "test", 1)] == sent
    more = [b"q%d" % i for i in range(700)]
    for m in more:
        s.put("test", 1, 0, m, NOW)
    assert index_files(data_dir, "test", 1)[0][1] == 1024 * UNIT_SIZE
    s.close(NOW)
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20)
    assert [payload_of(m) for m in read_all(s, "test", 1)] == sent + more
    s.close(NOW)


def test_a_crash_between_growing_a_file_and_writing_into_it(data_dir):
    """The file on disk is longer than its units (grown, zeros after them; or a growth cut short at any block):
    the restart reads every message and goes on from the right offset."""
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20)
    for i in range(INITIAL_UNITS):
        s.put("test", 0, 0, b"c%d" % i, NOW)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    s.abandon()
    (name, size), = index_files(data_dir, "test", 0)
    path = os.path.join(str(data_dir), "index", "test", "0", name)
    with open(path, "r+b") as f:  # as a posix_fallocate the crash cut short leaves it: 3 pages, zeros after
        os.posix_fallocate(f.fileno(), 0, 3 * 4096)
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20)
    assert s.max_offset("test", 0) == INITIAL_UNITS
    s.put("test", 0, 0, b"after", NOW)
    for i in range(600):  # grows from 3 pages on: 4096 bytes x 3 -> 6 -> ...
        s.put("test", 0, 0, b"d%d" % i, NOW)
    got = [payload_of(m) for m in read_all(s, "test", 0)]
    assert got == [b"c%d" % i for i in range(INITIAL_UNITS)] + [b"after"] + [b"d%d" % i for i in range(600)]
    assert index_files(data_dir, "test", 0)[0][1] == 6 * 4096
    s.close(NOW)


def test_retention_deletes_whole_grown_files_and_keeps_the_growing_one(data_dir):
    from tests.harness.store import HOUR_MS

    s = open_store(data_dir, index_file_units=1024, segment_size=4096, retention_hours=1)
    for i in range(2200):
        s.put("test", 0, 0, b"r%04d" % i, NOW)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    s.retention(NOW + 2 * HOUR_MS)
    files = index_files(data_dir, "test", 0)
    assert files[-1] == ("%020d" % (2048 * UNIT_SIZE), INITIAL_UNITS * UNIT_SIZE) and len(files) <= 2
    low = s.min_offset("test", 0)
    assert low > 1024
    assert [payload_of(m) for m in read_all(s, "test", 0)] == [b"r%04d" % i for i in range(low, 2200)]
    for i in range(2200, 2500):  # the partial tail grows on after retention
        s.put("test", 0, 0, b"r%04d" % i, NOW)
    assert index_files(data_dir, "test", 0)[-1][1] == 2 * INITIAL_UNITS * UNIT_SIZE
    s.close(NOW)


@pytest.mark.root
@pytest.mark.fault
def test_a_full_disk_while_growing_an_index_file_is_the_normal_refusal(tmp_path):
    """On a full tmpfs a write into an unallocated page of a map is SIGBUS: growth allocates first, so the put
    gets DiskFull; the process lives on and, once space is back, the same partition grows and takes puts."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs: %s" % r.stderr.decode().strip())
    try:
        data = mnt / "data"
        kw = dict(segment_size=256 * 1024, index_file_units=1 << 16, disk_warn_ratio=1.0, disk_danger_ratio=1.0)
        s = open_store(data, **kw)
        sent = []
        for i in range(INITIAL_UNITS):  # the first page is full: the next put grows the file
            sent.append(b"g%d" % i)
            s.put("test", 0, 0, sent[-1], NOW)
        st = os.statvfs(str(mnt))
        with open(str(mnt / "filler"), "wb") as f:  # leave nothing
            f.write(b"\1" * (st.f_bavail * st.f_frsize))
        with pytest.raises(errors.DiskFull):
            s.put("test", 0, 0, b"refused", NOW)
        assert index_files(data, "test", 0)[0][1] >= INITIAL_UNITS * UNIT_SIZE
        os.unlink(str(mnt / "filler"))
        for i in range(300):
            sent.append(b"h%d" % i)
            s.put("test", 0, 0, sent[-1], NOW)
        assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
        s.close(NOW)
        s = open_store(data, **kw)
        assert [payload_of(m) for m in read_all(s, "test", 0)] == sent
        s.close(NOW)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_new_topic_costs_no_directory_fsync_until_the_checkpoint(data_dir, monkeypatch):
    """A directory fsync is a journal commit (ms on ext4): creating a topic on the event loop must not pay it;
    the next checkpoint (a worker thread) makes the new names durable before it claims the units."""
    from metaq.store import files, index, mapped

    synced = []
    real = files.fsync_dir

    def counting(path):
        synced.append(path)
        real(path)

    for module in (files, index, mapped):
        monkeypatch.setattr(module, "fsync_dir", counting)
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20, topics=[TopicSpec("*", 1)])
    synced.clear()
    for t in range(10):
        s.put("new-%d" % t, 0, 0, b"x", NOW)
    assert [p for p in synced if "index" in p] == []  # (the first segment's own is the commit log's)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    partition_dirs = {os.path.join(str(data_dir), "index", "new-%d" % t, "0") for t in range(10)}
    assert partition_dirs <= set(synced)
    assert os.path.join(str(data_dir), "index") in synced
    s.abandon()
    s = open_store(data_dir, index_file_units=4096, segment_size=1 << 20, topics=[TopicSpec("*", 1)])
    assert [s.max_offset("new-%d" % t, 0) for t in range(10)] == [1] * 10
    s.close(NOW)
