"""A backlog of 100 million messages (issue 22 point 4): one broker, its whole life with the backlog.

    python -m bench.bench_backlog                          # 100,000,000 messages of 100 bytes (~20 GB of disk)
    python -m bench.bench_backlog --messages 2000000       # a quick look at the same figures

Against a real broker process on 127.0.0.1 (``async`` flush, the real segment sizes), in a temporary directory
(``--dir`` to choose the disk; it needs about 200 bytes a message):

* **fill**: ``--messages`` puts of ``--size`` bytes over ``--partitions`` partitions, pipelined (depth 64) by
  ``--producers`` processes; the put rate of each tenth of the fill, so that decay shows (first tenth vs last);
* **RSS**: the broker's resident memory sampled every half second throughout, its peak per phase, split into
  anonymous memory (the heap: what the broker holds) and file pages (the maps of the log and index: the kernel
  may drop them at will, they are page cache);
* **read**: the page cache dropped first (``/proc/sys/vm/drop_caches``, or ``posix_fadvise(DONTNEED)`` on every
  file of the data dir when that is refused), then one consumer connection reading every partition from offset 0
  with 1 MiB gets (the next get sent as soon as a reply's header arrives): messages/s;
* **restarts** with the full backlog: a clean stop and start, then kill -9 and start: the time from the new
  process's start until it answers.

Targets (issue 22): no put decay beyond 10 %, read >= 500k msgs/s, clean restart < 2 s, restart after kill -9
< 30 s, RSS < 1 GiB throughout. Not a test: nothing here asserts; a markdown table.
"""

import argparse
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import wire  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402

TOPIC = "backlog"
DEPTH = 64
TENTHS = 10


def rss(pid):
    """``(anonymous MB, file-backed MB)`` of process ``pid`` (``/proc/<pid>/status``)."""
    anon = files = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) / 1024.0
            elif line.startswith("RssFile:"):
                files = int(line.split()[1]) / 1024.0
    return anon, files


class RssSampler:
    """The peak RSS of a broker per named phase, sampled every half second in a thread."""

    def __init__(self):
        self.pid = None
        self.phase = "start"
        self.peaks = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, pid):
        self.pid = pid
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.5):
            try:
                anon, files = rss(self.pid)
            except (OSError, ValueError, TypeError):
                continue  # between a kill and the next start (no pid yet)
            peak = self.peaks.get(self.phase, (0.0, 0.0))
            self.peaks[self.phase] = (max(peak[0], anon), max(peak[1], files))

    def stop(self):
        self._stop.set()
        self._thread.join()


def produce(port, partitions, count, size, marks):
    """One producer process: ``count`` puts cycling over ``partitions``, a time put on ``marks`` per tenth."""
    payload = b"b" * size
    frames = []
    for p in partitions:
        frames.extend(wire.put_block(TOPIC, payload, DEPTH, p))
    sock = wire.connect(port)
    replies = wire.ResultReplies(sock)
    step = count // TENTHS
    for k in range(TENTHS):
        n = step if k < TENTHS - 1 else count - step * (TENTHS - 1)
        wire.pipeline(sock, replies, frames, n, DEPTH)
        marks.put((k, n, time.perf_counter()))
    sock.close()


def fill(port, messages, partitions, producers, size):
    """``[(tenth, msgs/s)]`` across all producers (a tenth ends when every producer finished its tenth)."""
    marks = multiprocessing.Queue()
    shares = [list(range(partitions))[i::producers] for i in range(producers)]
    counts = [messages // producers + (1 if i < messages % producers else 0) for i in range(producers)]
    procs = [multiprocessing.Process(target=produce, args=(port, shares[i], counts[i], size, marks))
             for i in range(producers)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    ends, done = {}, {}
    for _ in range(producers * TENTHS):
        k, n, t = marks.get()
        ends[k] = max(ends.get(k, 0.0), t)
        done[k] = done.get(k, 0) + n
    for p in procs:
        p.join()
    rates, previous = [], started
    for k in range(TENTHS):
        rates.append((k + 1, done[k] / (ends[k] - previous)))
        previous = ends[k]
    return rates, time.perf_counter() - started


def drop_page_cache(data_dir):
    """Drop the page cache: the kernel's whole cache when allowed, else every file of ``data_dir``. Says which."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        for root, _dirs, files in os.walk(data_dir):
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        return "posix_fadvise(DONTNEED) of the data dir"


def read_partition(sock, buf, partition, max_size=1 << 20):
    """Read ``partition`` from 0 to its end with 1 MiB gets, one ahead; returns the messages read."""
    view = memoryview(buf)
    topic = TOPIC.encode()
    offset, have, count = 0, 0, 0
    sock.sendall(b"get %s g %d 0 %d 1\r\n" % (topic, partition, max_size))
    while True:
        line_end = buf.find(b"\r\n", 0, have)
        while line_end < 0:
            have += sock.recv_into(view[have:])
            line_end = buf.find(b"\r\n", 0, have)
        head = bytes(buf[:line_end]).split(b" ")
        if head[0] != b"value":  # 404: the end (a result line and its body)
            body = int(head[2])
            end = line_end + 2 + body
            while have < end:
                have += sock.recv_into(view[have:end])
            return count
        n = int(head[1])
        end = line_end + 2 + n
        while have < end:
            have += sock.recv_into(view[have:end])
        records, pos = 0, line_end + 2
        while pos < end:  # a record: msgLen, checksum, msgId, flag (20 bytes), then msgLen bytes
            pos += 20 + int.from_bytes(buf[pos:pos + 4], "big")
            records += 1
        count += records
        offset += records
        sock.sendall(b"get %s g %d %d %d 1\r\n" % (topic, partition, offset, max_size))
        have = 0


def read_backlog(port, partitions):
    sock = wire.connect(port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    buf = bytearray((1 << 20) + (64 << 10))
    started = time.perf_counter()
    total = sum(read_partition(sock, buf, p) for p in range(partitions))
    elapsed = time.perf_counter() - started
    sock.close()
    return total, elapsed


def timed_start(b, timeout):
    started = time.perf_counter()
    b.start(timeout=timeout)
    return time.perf_counter() - started


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where the data dir goes (default: the temporary directory)")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="metaq-backlog-", dir=args.dir)
    store = full_size_store(flush="async")
    cfg = small_config(os.path.join(root, "data"), store=store,
                       topics=[{"name": TOPIC, "partitions": args.partitions}])
    b = BrokerProcess(root, cfg)
    sampler = RssSampler()
    try:
        b.start(timeout=60)
        sampler.start(b.proc.pid)
        sampler.phase = "fill"
        rates, fill_s = fill(b.port, args.messages, args.partitions, args.producers, args.size)
        sampler.phase = "read"
        how = drop_page_cache(b.data_dir)
        read, read_s = read_backlog(b.port, args.partitions)
        sampler.phase = "clean restart"
        b.stop(timeout=600)
        sampler.pid = None
        clean_s = timed_start(b, 600)
        sampler.pid = b.proc.pid
        sampler.phase = "restart after kill -9"
        b.kill()
        kill_s = timed_start(b, 600)
        sampler.pid = b.proc.pid
        time.sleep(1.0)
    finally:
        sampler.stop()
        b.stop(timeout=600)
        disk = sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(root) for f in fs)
        shutil.rmtree(root, ignore_errors=True)
    first, last = rates[0][1], rates[-1][1]
    print("\n%d messages of %d bytes over %d partitions, %d producer processes (depth %d), async flush; %.1f GB "
          "on disk\n" % (args.messages, args.size, args.partitions, args.producers, DEPTH, disk / 1e9))
    print("| figure | value | target |")
    print("|---|---:|---|")
    print("| fill, whole | %.0f msgs/s (%.0f s) | |" % (args.messages / fill_s, fill_s))
    for k, rate in rates:
        print("| fill, tenth %d | %.0f msgs/s | |" % (k, rate))
    print("| last tenth / first tenth | %.2f | >= 0.90 |" % (last / first))
    print("| read from offset 0, cache dropped (%s) | %.0f msgs/s (%d messages, %.1f s) | >= 500k msgs/s |"
          % (how, read / read_s, read, read_s))
    print("| clean restart | %.2f s | < 2 s |" % clean_s)
    print("| restart after kill -9 | %.2f s | < 30 s |" % kill_s)
    for phase, (anon, files) in sampler.peaks.items():
        print("| peak RSS, %s | %.0f MB anonymous + %.0f MB file pages | < 1 GiB |" % (phase, anon, files))


if __name__ == "__main__":
    main()
