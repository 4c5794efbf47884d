"""fdatasync in the C helper's own thread (metaq.native._bytes.SyncWorker, server/flusher.NativeSync)."""

import errno
import os

import gevent
import pytest

from metaq.server.flusher import NativeSync

try:
    from metaq.native._bytes import SyncWorker
except ImportError:  # not built: the flusher uses its Python thread
    SyncWorker = None

pytestmark = pytest.mark.skipif(SyncWorker is None, reason="metaq.native._bytes was not built")


def result_of(r):
    return int.from_bytes(os.read(r, 4), "little", signed=True)


def test_worker_syncs_files_and_writes_0_then_the_errno_of_a_failure(tmp_path):
    r, w = os.pipe()
    worker = SyncWorker(w)
    paths = [tmp_path / "a", tmp_path / "b"]
    for p in paths:
        p.write_bytes(b"x" * 5000)
    fds = [os.open(p, os.O_RDWR) for p in paths]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    bad = os.open(fifo, os.O_RDWR)  # fdatasync on a FIFO fails with EINVAL
    try:
        worker.submit(fds)
        assert result_of(r) == 0
        worker.submit([fds[0], bad, fds[1]])  # stops at the first failure
        assert result_of(r) == errno.EINVAL
        worker.submit(tuple(fds))
        assert result_of(r) == 0
    finally:
        worker.close()
        for fd in fds + [bad, r, w]:
            os.close(fd)


def test_worker_refuses_bad_jobs_and_work_after_close():
    r, w = os.pipe()
    worker = SyncWorker(w)
    try:
        with pytest.raises(ValueError):
            worker.submit([])
        with pytest.raises(ValueError):
            worker.submit(list(range(17)))
        with pytest.raises(ValueError):
            worker.submit([-1])
        with pytest.raises(TypeError):
            worker.submit(["3"])
        with pytest.raises(TypeError):
            worker.submit(5)
        worker.close()
        worker.close()  # twice is fine
        with pytest.raises(RuntimeError):
            worker.submit([w])
    finally:
        os.close(r)
        os.close(w)


def test_native_sync_from_greenlets_and_its_errors(tmp_path):
    sync = NativeSync(SyncWorker)  # (create() gives None under METAQ_PURE_PYTHON)
    files = []
    for i in range(3):
        p = tmp_path / ("f%d" % i)
        p.write_bytes(b"y" * 100)
        files.append(str(p))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    open_before = len(os.listdir("/proc/self/fd"))
    try:
        # several greenlets at once: each sync runs alone, every one returns
        jobs = [gevent.spawn(sync.sync_paths, files[i:]) for i in range(3)]
        gevent.joinall(jobs, timeout=10, raise_error=True)
        assert all(j.successful() for j in jobs)
        with pytest.raises(OSError) as exc:
            sync.sync_paths([files[0], str(fifo)])
        assert exc.value.errno == errno.EINVAL and "fdatasync failed" in str(exc.value)
        with pytest.raises(FileNotFoundError):
            sync.sync_paths([str(tmp_path / "missing")])
        # a waiter killed mid-sync leaves its result to the next sync, which still works
        g = gevent.spawn(sync.sync_paths, files)
        gevent.sleep(0)
        g.kill()
        sync.sync_paths(files)
        assert len(os.listdir("/proc/self/fd")) == open_before  # every file it opened is closed
    finally:
        sync.close()
