"""The hand-off of a file built ahead (a segment, an index file) from the worker to the loop, with the worker's next
step run while the loop renames it (issue 53 point 9).

The worker thread builds the next segment or index file under a ``.prepared`` name and publishes it; the loop
renames it when it needs it. A worker step that runs during that rename (the loop gives up the GIL in the rename's
system calls) must neither build another file under the same ``.prepared`` name nor take the one being renamed:
the rename would then give the final name to the other, empty, file, while the loop writes into the one it took,
whose name is gone. What is written must read back from the files by their names: live once the file is mapped
again (an index file growing), and after a restart.
"""

import os

from tests.harness.store import NOW, open_store, payload_of, read_all


def payload(i, size=10):
    head = b"a%05d-" % i
    return head + bytes([97 + i % 26]) * (size - len(head))


def worker_step_inside_the_first_rename(monkeypatch, store):
    """The loop's next rename runs one ``prepare_ahead`` (the worker's step) before it renames; the later ones
    rename only. Returns the list of what each such step did (True: it built something)."""
    real = os.rename
    steps = []

    def rename(src, dst, *args, **kwargs):
        if not steps and src.endswith(".prepared"):
            steps.append(store.prepare_ahead())
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    return steps


def test_a_worker_step_while_the_loop_renames_the_next_index_file_loses_no_unit(data_dir, monkeypatch):
    cfg = dict(segment_size=1 << 20, index_file_units=1024)
    s = open_store(data_dir, **cfg)
    n = 0
    while n < 700:  # the first file grown to its span (1024 units) and past its middle
        s.put("test", 1, 0, payload(n), NOW)
        n += 1
        s.prepare_ahead()
    idx = os.path.join(str(data_dir), "index", "test", "1")
    assert "%020d.prepared" % (16 * 1024) in os.listdir(idx), "the worker built the next index file"
    steps = worker_step_inside_the_first_rename(monkeypatch, s)
    while n < 2000:  # into the next file, which grows from 256 units (mapped again by its name)
        s.put("test", 1, 0, payload(n), NOW)
        n += 1
    assert steps, "the loop renamed the prepared index file"
    monkeypatch.undo()
    assert [payload_of(m) for m in read_all(s, "test", 1)] == [payload(i) for i in range(n)]
    s.abandon()  # as kill -9 leaves it
    s = open_store(data_dir, **cfg)
    assert [payload_of(m) for m in read_all(s, "test", 1)] == [payload(i) for i in range(n)]
    s.close(NOW)


def test_a_worker_step_while_the_loop_renames_the_next_segment_loses_no_record(data_dir, monkeypatch):
    cfg = dict(segment_size=64 << 10, index_file_units=1 << 12)
    s = open_store(data_dir, **cfg)
    s.put("test", 0, 0, payload(0, 100), NOW)
    n = 1
    while (s.written_position - s._log.active.start) * 2 <= s._log.active.size:
        s.put("test", 0, 0, payload(n, 100), NOW)
        n += 1
    s.prepare_ahead()
    assert "%020d.prepared" % (64 << 10) in os.listdir(os.path.join(str(data_dir), "commitlog"))
    steps = worker_step_inside_the_first_rename(monkeypatch, s)
    while s.written_position < (64 << 10) + 8192:  # into the next segment
        s.put("test", 0, 0, payload(n, 100), NOW)
        n += 1
    assert steps, "the roll renamed the prepared segment"
    monkeypatch.undo()
    s.close(NOW)
    s = open_store(data_dir, **cfg)
    assert [payload_of(m) for m in read_all(s, "test", 0)] == [payload(i, 100) for i in range(n)]
    s.close(NOW)
