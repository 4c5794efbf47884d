"""Store micro-benchmarks (prints figures; not a test): python -m bench.bench_store [dir]."""

import os
import shutil
import sys
import tempfile
import time

from metaq.store.config import StoreConfig, TopicSpec
from metaq.store.store import MessageStore

NOW = 1_609_459_200_000


def config(path, **kw):
    base = dict(data_dir=path, segment_size=256 << 20, index_file_units=1 << 20, flush="async",
                topics=[TopicSpec("bench", 1)])
    base.update(kw)
    return StoreConfig(**base)


def bench(root, n=300_000, size=1024):
    path = tempfile.mkdtemp(prefix="metaq-bench-", dir=root)
    try:
        s = MessageStore.open(config(path), NOW)
        data = b"x" * size
        put = s.put
        t0 = time.perf_counter()
        for i in range(n):
            put("bench", 0, 0, data, NOW + (i >> 10))
        dt = time.perf_counter() - t0
        print("put   %d x %d B: %.0f puts/s (%.1f MB/s)" % (n, size, n / dt, n * size / dt / 1e6))

        t0 = time.perf_counter()
        off = total = 0
        while True:
            r = s.read("bench", 0, off, 1 << 20)
            if not r.count:
                break
            total += r.nbytes
            off = r.next_offset
        dt = time.perf_counter() - t0
        print("read  1 MiB max_size: %.0f MB/s (%.0f records/s), views only" % (total / dt / 1e6, off / dt))
        t0 = time.perf_counter()
        off = 0
        while True:
            r = s.read("bench", 0, off, 1 << 20)
            if not r.count:
                break
            b"".join(r.views)
            off = r.next_offset
        dt = time.perf_counter() - t0
        print("read  1 MiB max_size + join into one buffer: %.0f MB/s" % (total / dt / 1e6))
        end = s.written_position
        s.abandon()

        os.unlink(os.path.join(path, "checkpoint"))  # force a full scan (units already right)
        t0 = time.perf_counter()
        s = MessageStore.open(config(path), NOW)
        dt = time.perf_counter() - t0
        r = s.recovery
        assert r.records_scanned == n and r.scanned_bytes == end
        print("recovery full scan (index intact): %.0f MB/s, %.0f records/s (open took %.2f s)"
              % (end / dt / 1e6, n / dt, dt))
        s.abandon()
        shutil.rmtree(os.path.join(path, "index"))
        t0 = time.perf_counter()
        s = MessageStore.open(config(path), NOW)
        dt = time.perf_counter() - t0
        assert s.recovery.index_units_rebuilt == n
        print("recovery full scan + index rebuild: %.0f MB/s, %.0f records/s" % (end / dt / 1e6, n / dt))
        s.close(NOW)
    finally:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    bench(sys.argv[1] if len(sys.argv) > 1 else "/dev/shm")
