"""Issue 15 point 3: flushing under file-descriptor exhaustion (a real EMFILE: the soft RLIMIT_NOFILE is
lowered to the descriptors in use, in this process, and restored after each test).

A flush round opens nothing (the store keeps the segment and directory fds it needs), and a round that
cannot run for want of a descriptor is a transient condition: never the sticky "fsync failed" state.
"""

import contextlib
import os
import resource

import gevent
import pytest

from metaq.server.flusher import Flusher
from metaq.storestate import open_store
from tests.harness.store import NOW, small_config


@contextlib.contextmanager
def no_free_descriptors():
    """Every further ``open`` in this process fails with EMFILE until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers = []
    fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(fds) + 1, hard))
    try:
        while True:  # fill the gaps below the limit
            try:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        with pytest.raises(OSError, match="Too many open files"):
            os.open(os.devnull, os.O_RDONLY)
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _store(tmp_path, **kw):
    return open_store(small_config(tmp_path / "data", segment_size=1 << 20, flush="sync", **kw), NOW)


def test_the_log_flushes_with_no_descriptor_left(tmp_path):
    """The store's own flush (its worker-thread path) and the flusher's plan open no file: both work at EMFILE."""
    s = _store(tmp_path, index_file_units=1 << 20)
    for p in range(4):
        s.put("test", p, 0, b"a" * 100, NOW)
    s.mark_flushed(s.flush_log())
    with no_free_descriptors():
        for i in range(50):
            s.put("test", i % 4, 0, b"b%d" % i, NOW)
        end = s.flush_log()
        s.mark_flushed(end)
        assert s.flushed_position == s.written_position
        plan = s.flush_plan()
        assert plan == (end, [])
    s.close(NOW)


def test_an_index_checkpoint_needs_no_descriptor_for_its_files(tmp_path):
    """Index files are made durable with msync on their maps: no descriptor per partition."""
    s = _store(tmp_path)
    for p in range(4):
        s.put("test", p, 0, b"x", NOW)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)  # creates the checkpoint file's temp once with descriptors to spare
    for p in range(4):
        s.put("test", p, 0, b"y", NOW)
    s.mark_flushed(s.flush_log())
    with no_free_descriptors():
        with pytest.raises(OSError) as failed:  # the checkpoint file needs one: a warning in the broker, no more
            s.checkpoint(NOW)
    assert failed.value.filename.endswith("checkpoint.tmp")  # the index files were synced without one
    s.checkpoint(NOW)  # the index files dirty before the failed checkpoint are flushed by this one
    s.close(NOW)
    s = _store(tmp_path)
    assert s.recovery.clean_shutdown
    assert [s.max_offset("test", p) for p in range(4)] == [2, 2, 2, 2]
    s.close(NOW)


def test_a_flush_round_short_of_descriptors_is_transient_not_a_failed_fsync(tmp_path):
    """A round that must open a file at EMFILE does not set the sticky failure; once descriptors are back the
    waiting put is flushed, and later ones too: no restart needed."""
    store = _store(tmp_path)
    failures = []
    flusher = Flusher(store, store.config, on_visible=lambda changed: None, on_failure=lambda: failures.append(1))
    flusher.start()
    try:
        store.put("test", 0, 0, b"first", NOW)
        flusher.wait_flushed(store.written_position)
        store.put("test", 0, 0, b"second", NOW)
        # as if the active segment had no kept descriptor: the round has to open one
        store._log.active.file.release_fd()
        pos = store.written_position
        with no_free_descriptors():
            waiter = gevent.spawn(flusher.wait_flushed, pos, 5.0)
            gevent.sleep(0.3)
            assert not waiter.ready() and flusher.failure is None
            assert flusher.transient is not None and "Too many open files" in flusher.transient
            assert flusher.transient_rounds >= 2  # retried, not given up
        waiter.get(timeout=5)
        assert store.flushed_position >= pos and flusher.failure is None and failures == []
        assert flusher.transient is None
        store.put("test", 0, 0, b"third", NOW)
        flusher.wait_flushed(store.written_position)
    finally:
        flusher.stop()
        store.close(NOW)


def test_the_log_keeps_a_handful_of_descriptors_however_long_it_is(tmp_path):
    """Flushed segments give their descriptor back: a long log holds the active segment's and the directory's."""
    s = open_store(small_config(tmp_path / "data", segment_size=4096, flush="sync"), NOW)
    before = len(os.listdir("/proc/self/fd"))
    for i in range(400):  # ~20 segments
        s.put("test", i % 4, 0, b"z" * 150, NOW)
        if i % 10 == 0:
            s.mark_flushed(s.flush_log())
    s.mark_flushed(s.flush_log())
    assert len(s._log.segments) >= 15
    assert len(os.listdir("/proc/self/fd")) - before <= 2
    s.close(NOW)
    assert len(os.listdir("/proc/self/fd")) < before  # the directory's and the active segment's are closed


def test_a_partition_costs_no_descriptor(tmp_path):
    """mmap.mmap keeps a dup of the fd per map unless told not to: 90 partitions must not hold 90 descriptors."""
    from metaq.store.config import TopicSpec

    s = open_store(small_config(tmp_path / "data", segment_size=1 << 20, flush="sync",
                                       topics=[TopicSpec("*", 3)]), NOW)
    before = len(os.listdir("/proc/self/fd"))
    for t in range(30):
        for p in range(3):
            s.put("topic-%d" % t, p, 0, b"x", NOW)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    assert len(os.listdir("/proc/self/fd")) - before <= 2
    s.close(NOW)
    s = open_store(small_config(tmp_path / "data", segment_size=1 << 20, flush="sync",
                                       topics=[TopicSpec("*", 3)]), NOW)
    assert len(os.listdir("/proc/self/fd")) - before <= 4  # reopened: still not one per partition
    assert s.max_offset("topic-29", 2) == 1
    s.close(NOW)


def test_a_new_topic_at_emfile_is_a_clear_503_for_that_put_only(tmp_path):
    """Creating a topic needs a descriptor for a moment: at EMFILE that put gets Unavailable (503, "try again
    later"), existing topics keep taking puts, and the same put succeeds once descriptors are back."""
    from metaq import errors

    s = _store(tmp_path)
    s.put("test", 0, 0, b"before", NOW)
    with no_free_descriptors():
        with pytest.raises(errors.Unavailable, match="out of file descriptors") as refused:
            s.put("brand-new", 0, 0, b"x", NOW)
        assert refused.value.code == 503 and not isinstance(refused.value, errors.DiskFull)
        s.put("test", 0, 0, b"still fine", NOW)
        s.mark_flushed(s.flush_log())
    s.put("brand-new", 0, 0, b"x", NOW)
    s.mark_flushed(s.flush_log())
    assert s.max_offset("brand-new", 0) == 1 and s.max_offset("test", 0) == 2
    s.close(NOW)
