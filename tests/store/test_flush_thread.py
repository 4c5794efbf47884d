"""The BLOCKING flush and checkpoint run in a worker thread while the loop thread appends,
rolls segments and index files, reads and deletes old segments (as the server does)."""

import threading

import pytest

from tests.harness.store import HOUR_MS, NOW, open_store, payload_of


def test_flush_and_checkpoint_in_a_thread_while_appending_and_retaining(data_dir):
    s = open_store(data_dir, flush="sync", retention_hours=1.0)
    flushed = []
    errors = []
    stop = threading.Event()

    def worker():
        try:
            while not stop.is_set():
                flushed.append(s.flush_log())
                s.checkpoint(NOW)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    deleted = 0
    later = NOW + 10 * HOUR_MS
    try:
        for i in range(4000):
            s.put("test", i % 4, 0, b"%06d" % i + b"w" * (i % 200), NOW)
            if flushed:
                s.mark_flushed(flushed[-1])
            if i % 500 == 499:
                deleted += len(s.retention(later).deleted_segments)
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    deleted += len(s.retention(later).deleted_segments)
    assert deleted > 50
    for p in range(4):
        low, high = s.min_offset("test", p), s.max_offset("test", p)
        assert high == 1000 and 0 < low < high
        r = s.read("test", p, low, 1 << 30)
        assert r.count == high - low
        assert [int(payload_of(bytes(v))[:6]) for v in r.views] == list(range(4 * low + p, 4000, 4))
    s.close(NOW)


def test_a_segment_created_on_the_put_path_gets_its_directory_fsynced_by_the_next_flush(data_dir, monkeypatch):
    """The roll's own directory fsync only logs a failure; the flush before any ack must not: F5 (fsync errors)."""
    from metaq.store import commitlog, mapped

    s = open_store(data_dir, flush="sync")
    s.put("test", 0, 0, b"x" * 100, NOW)
    s.mark_flushed(s.flush_log())
    dir_fsyncs = []

    def failing_fsync_dir(path):
        dir_fsyncs.append(path)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(mapped, "fsync_dir", failing_fsync_dir)  # MappedFile.create's
    monkeypatch.setattr(commitlog, "fsync_fd", failing_fsync_dir)  # flush_range's (on the dir fd it keeps)
    first = s._log.active
    while s._log.active is first:  # no prepare_ahead: the put path creates the next segment itself
        s.put("test", 0, 0, b"y" * 100, NOW)
    assert len(dir_fsyncs) == 1  # create's, failed and only logged
    with pytest.raises(OSError):
        s.flush_log()  # not "durable" while the new segment's name may not be
    assert len(dir_fsyncs) == 2
    monkeypatch.undo()
    s.abandon()  # the broker stops writing after a failed flush and never retries it
