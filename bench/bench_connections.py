"""19,000 idle connections beside a working load (issue 22 point 5).

    python -m bench.bench_connections [--idle 19000] [--seconds 20] [--runs 3]

Against a real broker process on 127.0.0.1 (``sync`` flush, the real segment sizes):

* the **load**: 16 producer connections, each sending 1 KiB puts one at a time (each timed), and 4 consumer
  connections long-polling gets of the same topic, for ``--seconds``;
* measured first with those 20 connections alone, then with ``--idle`` more connections open and idle (spread over
  the source addresses 127.0.0.2-127.0.0.9, as clients of many hosts are: the broker caps connections per address),
  in the same run; put p50 and p99 of each, and their ratio (target: p99 within 2x);
* **memory per idle connection**: the broker's resident memory (anonymous: its heap) before the idle connections
  and with all of them open, divided by their number.

The machine's descriptor limit is 20,000 per process: this process holds the idle sockets, the broker its side of
them. Not a test: nothing here asserts; medians of ``--runs`` runs, a markdown table.
"""

import argparse
import os
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import wire  # noqa: E402
from bench.bench_backlog import rss  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402

TOPIC = "conns"
PRODUCERS, CONSUMERS, PARTITIONS = 16, 4, 4
SOURCES = ["127.0.0.%d" % i for i in range(2, 10)]


def producer(port, topic, partition, stop, latencies):
    frames = wire.put_block(topic, b"c" * 1024, 1, partition)
    sock = wire.connect(port)
    replies = wire.ResultReplies(sock)
    own = []
    while not stop.is_set():
        started = time.perf_counter()
        sock.sendall(frames[0])
        replies.wait(1)
        own.append(time.perf_counter() - started)
    sock.close()
    latencies.extend(own)


def consumer(port, topic, partition, stop, counts):
    sock = wire.connect(port)
    sock.settimeout(5.0)
    buf = bytearray(2 << 20)
    offset, got = 0, 0
    while not stop.is_set():
        sock.sendall(b"get %s g %d %d %d 500 1\r\n" % (topic.encode(), partition, offset, 1 << 20))
        have = 0
        line_end = -1
        while line_end < 0:
            have += sock.recv_into(memoryview(buf)[have:])
            line_end = buf.find(b"\r\n", 0, have)
        head = bytes(buf[:line_end]).split(b" ")
        n = int(head[1] if head[0] == b"value" else head[2])
        end = line_end + 2 + n
        while have < end:
            have += sock.recv_into(memoryview(buf)[have:end])
        if head[0] == b"value":
            pos, records = line_end + 2, 0
            while pos < end:
                pos += 20 + int.from_bytes(buf[pos:pos + 4], "big")
                records += 1
            offset += records
            got += records
        elif head[1] == b"301":
            offset = int(bytes(buf[line_end + 2:end]))
    sock.close()
    counts.append(got)


def load(port, topic, seconds):
    """``(p50 ms, p99 ms, puts, messages consumed)`` of the 20-connection load on ``topic`` for ``seconds``."""
    stop, latencies, counts = threading.Event(), [], []
    threads = [threading.Thread(target=producer, args=(port, topic, i % PARTITIONS, stop, latencies))
               for i in range(PRODUCERS)]
    threads += [threading.Thread(target=consumer, args=(port, topic, i % PARTITIONS, stop, counts))
                for i in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    ms = sorted(x * 1000 for x in latencies)
    return ms[len(ms) // 2], ms[int(len(ms) * 0.99)], len(ms), sum(counts)


def open_idle(port, count):
    """``count`` connected, idle sockets, spread over SOURCES."""
    socks = []
    for i in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((SOURCES[i % len(SOURCES)], 0))
        s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def wait_connections(b, want, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with b.client() as c:
            have = int(c.stats_dict()["curr_connections"])
        if have >= want:
            return have
        time.sleep(0.2)
    return have


def one_run(root, idle, seconds):
    cfg = small_config(os.path.join(root, "data"), store=full_size_store(),
                       topics=[{"name": TOPIC + "*", "partitions": PARTITIONS}])
    b = BrokerProcess(root, cfg)
    b.start(timeout=60)
    socks = []
    try:
        alone = load(b.port, TOPIC + "-alone", seconds)
        before = rss(b.proc.pid)[0]
        socks = open_idle(b.port, idle)
        seen = wait_connections(b, idle)
        with_idle = load(b.port, TOPIC + "-idle", seconds)
        after = rss(b.proc.pid)[0]
    finally:
        for s in socks:
            s.close()
        b.stop(timeout=120)
        shutil.rmtree(root, ignore_errors=True)
    return alone, with_idle, (after - before) * 1024 * 1024 / max(1, idle), seen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=19_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.idle + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.idle + 200), hard))
    runs = [one_run(tempfile.mkdtemp(prefix="metaq-conns-"), args.idle, args.seconds) for _ in range(args.runs)]
    med = statistics.median
    a50, a99 = med(r[0][0] for r in runs), med(r[0][1] for r in runs)
    i50, i99 = med(r[1][0] for r in runs), med(r[1][1] for r in runs)
    print("\n%d producers (1 KiB puts one at a time, sync flush) and %d long-polling consumers, %.0f s each; medians "
          "of %d runs; idle connections seen by the broker: %s\n" % (PRODUCERS, CONSUMERS, args.seconds, args.runs,
                                                                    ", ".join(str(r[3]) for r in runs)))
    print("| load | put p50 ms | put p99 ms | puts | consumed |")
    print("|---|---:|---:|---:|---:|")
    print("| 20 connections | %.3f | %.3f | %d | %d |" % (a50, a99, med(r[0][2] for r in runs),
                                                       med(r[0][3] for r in runs)))
    print("| 20 + %d idle | %.3f | %.3f | %d | %d |" % (args.idle, i50, i99, med(r[1][2] for r in runs),
                                                       med(r[1][3] for r in runs)))
    print("| ratio (target p99 <= 2x) | %.2fx | %.2fx | | |" % (i50 / a50, i99 / a99))
    print("\nbroker memory per idle connection (anonymous RSS growth / connections): %.1f KiB"
          % (med(r[2] for r in runs) / 1024))


if __name__ == "__main__":
    main()
