"""Store micro-benchmarks (prints figures; not a test).

    python -m bench.bench_store [dir] [--runs 3] [--messages 600000] [--only-put]

``put`` figures: 1 KiB messages into one partition, ``flush=async`` with no
flushing, 256 MiB segments (so a run rolls the log twice). When the store has
``prepare_ahead`` it runs in a real thread alongside, as the server runs it in
gevent's pool: the put loop asks ``wants_preparation()`` after every put and
wakes the worker when it says so (one worker, one call at a time). The put
loop also reports its worst batch of 1000 puts, which is where a segment
created on the put path shows up. ``--checksum`` passes the MetaQ checksum the
way the server does after it verified the client's. ``--flush`` adds a thread
that runs ``flush_log`` back to back (fdatasync, as group commit does under
load); the figures then include what prefaulting costs the flushes.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time

from metaq.protocol.checksum import metaq_checksum
from metaq.store.config import StoreConfig, TopicSpec
from metaq.storestate import open_store

NOW = 1_609_459_200_000
BATCH = 1000


def config(path, **kw):
    base = dict(data_dir=path, segment_size=256 << 20, index_file_units=1 << 20, flush="async",
                flush_every_messages=1 << 30, flush_interval_ms=1 << 30, topics=[TopicSpec("bench", 1)])
    base.update(kw)
    return StoreConfig(**base)


class Preparer:
    """The server's side of prepare_ahead: one worker thread, woken when the store wants it."""

    def __init__(self, store):
        self.store = store
        self.wake = threading.Event()
        self.busy = False
        self.stop = False
        self.calls = self.worked = 0
        self.seconds = 0.0
        self.errors = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def poke(self):
        if not self.busy:
            self.busy = True
            self.wake.set()

    def _run(self):
        while True:
            self.wake.wait()
            self.wake.clear()
            if self.stop:
                return
            t = time.perf_counter()
            try:
                self.worked += bool(self.store.prepare_ahead())
            except Exception as exc:  # reported by the main thread
                self.errors.append(exc)
            self.seconds += time.perf_counter() - t
            self.calls += 1
            self.busy = False

    def close(self):
        self.stop = True
        self.wake.set()
        self.thread.join(30)
        assert not self.errors, self.errors


class Flusher:
    """flush_log back to back in a thread; the put loop marks what it flushed."""

    def __init__(self, store):
        self.store = store
        self.stop = False
        self.done = 0
        self.rounds = 0
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            t = time.perf_counter()
            self.done = self.store.flush_log()
            self.seconds += time.perf_counter() - t
            self.rounds += 1

    def close(self):
        self.stop = True
        self.thread.join(30)
        return "; %d flushes, %.2f s in fdatasync" % (self.rounds, self.seconds)


def put_run(root, n, size=1024, checksum=False, prepare=True, flush=False):
    """Puts/s and the worst 1000-put batch (ms) of one run into a fresh store."""
    path = tempfile.mkdtemp(prefix="metaq-bench-", dir=root)
    s = open_store(config(path), NOW)
    worker = Preparer(s) if prepare and hasattr(s, "prepare_ahead") else None
    flusher = Flusher(s) if flush else None
    try:
        if worker is not None:  # as the server would at start: prepare before the first put
            worker.poke()
            while worker.busy:
                time.sleep(0.001)
        data = b"x" * size
        kw = {"checksum": metaq_checksum(data)} if checksum else {}
        put = s.put
        wants = s.wants_preparation if worker is not None else None
        worst = 0.0
        t0 = time.perf_counter()
        c0 = time.thread_time()  # CPU time of this (the "loop") thread: less noisy than wall time on a VM
        for b in range(0, n, BATCH):
            tb = time.perf_counter()
            for _ in range(b, min(n, b + BATCH)):
                put("bench", 0, 0, data, NOW, **kw)
                if wants is not None and wants():
                    worker.poke()
            if flusher is not None:
                s.mark_flushed(flusher.done)
            worst = max(worst, time.perf_counter() - tb)
        dt = time.perf_counter() - t0
        cpu = (time.thread_time() - c0) / n * 1e6
        extra = flusher.close() if flusher is not None else ""
        if worker is not None:
            worker.close()
            extra += "; prepare_ahead: %d calls (%d did work), %.2f s in the worker" % (
                worker.calls, worker.worked, worker.seconds)
        return n / dt, worst * 1e3, cpu, extra
    finally:
        s.abandon()
        shutil.rmtree(path, ignore_errors=True)


def bench_put(root, runs, n, checksum=False, prepare=True, flush=False):
    rates, worsts, cpus = [], [], []
    for r in range(runs):
        rate, worst, cpu, extra = put_run(root, n, checksum=checksum, prepare=prepare, flush=flush)
        rates.append(rate)
        worsts.append(worst)
        cpus.append(cpu)
        print("  run %d: %.0f puts/s, %.2f us CPU/put in the put thread, worst 1000-put batch %.1f ms%s"
              % (r + 1, rate, cpu, worst, extra))
    label = "put   %d x 1 KiB, one partition%s%s%s" % (n, ", checksum given" if checksum else "",
                                                        "" if prepare else ", no prepare_ahead",
                                                        ", flushing" if flush else "")
    print("%s: median %.0f puts/s (%.2f us/put; %.2f us CPU/put in the put thread), median worst batch %.1f ms"
          % (label, statistics.median(rates), 1e6 / statistics.median(rates), statistics.median(cpus),
             statistics.median(worsts)))


def bench_read_recover(root, n=300_000, size=1024):
    path = tempfile.mkdtemp(prefix="metaq-bench-", dir=root)
    try:
        s = open_store(config(path), NOW)
        data = b"x" * size
        for i in range(n):
            s.put("bench", 0, 0, data, NOW + (i >> 10))
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
        s = open_store(config(path), NOW)
        dt = time.perf_counter() - t0
        r = s.recovery
        assert r.records_scanned == n and r.scanned_bytes == end
        print("recovery full scan (index intact): %.0f MB/s, %.0f records/s (open took %.2f s)"
              % (end / dt / 1e6, n / dt, dt))
        s.abandon()
        shutil.rmtree(os.path.join(path, "index"))
        t0 = time.perf_counter()
        s = open_store(config(path), NOW)
        dt = time.perf_counter() - t0
        assert s.recovery.index_units_rebuilt == n
        print("recovery full scan + index rebuild: %.0f MB/s, %.0f records/s" % (end / dt / 1e6, n / dt))
        s.close(NOW)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", nargs="?", default="/dev/shm")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=600_000)
    p.add_argument("--checksum", action="store_true", help="only the put figures with the checksum given")
    p.add_argument("--no-prepare", action="store_true", help="only the put figures without prepare_ahead")
    p.add_argument("--flush", action="store_true", help="only the put figures, with a thread flushing")
    p.add_argument("--only-put", action="store_true")
    a = p.parse_args()
    if a.checksum or a.no_prepare or a.flush:
        bench_put(a.dir, a.runs, a.messages, checksum=a.checksum, prepare=not a.no_prepare, flush=a.flush)
        return
    bench_put(a.dir, a.runs, a.messages)
    bench_put(a.dir, a.runs, a.messages, checksum=True)
    if not a.only_put:
        bench_read_recover(a.dir)


if __name__ == "__main__":
    main()
