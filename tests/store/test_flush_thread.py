"""The BLOCKING flush and checkpoint run in a worker thread while the loop thread appends,
rolls segments and index files, reads and deletes old segments (as the server does)."""

import threading

from tests.store.conftest import HOUR_MS, NOW, open_store, payload_of


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
