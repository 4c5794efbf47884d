"""The read path's send alone, no broker: records gathered into a buffer then sent, against sent from the maps.

    python -m bench.bench_sendpath [--runs 7] [--size 1000] [--mbytes 200]

A store in /dev/shm (else $TMPDIR) holds ``--mbytes`` of ``--size``-byte records of one partition; this process
reads them with 1 MiB gets and sends each reply over TCP on 127.0.0.1 to a child process that only receives:

* ``copying``: ``read_joined`` (each record checked, then copied into one buffer per segment) and one blocking
  ``sendmsg`` of the header and the buffers (what a TLS connection, or ``broker.zero_copy_reads: false``, does);
* ``zero-copy``: ``read_joined(..., mapped=True)`` (each record checked in place) and ``send_ranges`` (one
  iovec per record, from the map), as server/zerocopy.py does.

Each row: the sending thread's CPU milliseconds per GB (``time.thread_time``: the check, the copy if any, the
kernel's send) and the rate, medians of ``--runs``, the two interleaved. No gevent, no parsing, no event loop:
the difference the two paths make, without the rest of a broker. Not a test: nothing here asserts.
"""

import argparse
import os
import select
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from metaq.server.zerocopy import send_ranges  # noqa: E402
from metaq.store.config import StoreConfig, TopicSpec  # noqa: E402
from metaq.storestate import open_store  # noqa: E402

NOW = 1_609_459_200_000


def fill(root, size, total):
    cfg = StoreConfig(data_dir=root, segment_size=256 << 20, index_file_units=1 << 20, flush="async",
                      topics=[TopicSpec("bench", 1)])
    s = open_store(cfg, NOW)
    body = b"x" * size
    count = total // size
    for _ in range(count):
        s.put("bench", 0, 0, body, NOW)
    return s, count


def one_pass(s, count, port, mapped):
    """(CPU ms per GB, MB/s) of reading every record with 1 MiB gets and sending each reply."""
    c = socket.create_connection(("127.0.0.1", port))
    fd = c.fileno()
    t0, w0 = time.thread_time(), time.perf_counter()
    offset = total = 0
    while offset < count:
        r = s.read_joined("bench", 0, offset, 1 << 20, mapped=mapped)
        head = b"value %d 1\r\n" % r.nbytes
        if mapped:
            for part in r.views:
                pos, end = 0, len(head) + part.nbytes
                while pos < end:
                    try:
                        pos += send_ranges(fd, head, part.view, part.ranges, pos)
                    except BlockingIOError:
                        select.select([], [c], [])
                head = b""
        else:
            c.sendmsg([head] + r.views)
        offset, total = r.next_offset, total + r.nbytes
    cpu, wall = time.thread_time() - t0, time.perf_counter() - w0
    c.close()
    return cpu * 1e3 / (total / 1e9), total / wall / 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--size", type=int, default=1000, help="payload bytes per record")
    p.add_argument("--mbytes", type=int, default=200)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="metaq-sendpath-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    s, count = fill(root, args.size, args.mbytes << 20)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the receiver: takes everything, one connection after another
        try:
            buf = bytearray(1 << 20)
            while True:
                conn, _ = server.accept()
                while conn.recv_into(buf):
                    pass
                conn.close()
        finally:
            os._exit(0)
    rows = {"copying": [], "zero-copy": []}
    try:
        for _ in range(args.runs):
            rows["copying"].append(one_pass(s, count, port, False))
            rows["zero-copy"].append(one_pass(s, count, port, True))
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        s.close(NOW)
    print("%d-byte records, %d MiB, median of %d runs (load average %.1f)" % (args.size, args.mbytes, args.runs,
                                                                           os.getloadavg()[0]))
    for name, xs in rows.items():
        print("%-10s  CPU %5.0f ms/GB (%s)   %6.0f MB/s" % (name, statistics.median(x[0] for x in xs),
                                                          " ".join("%.0f" % x[0] for x in xs),
                                                          statistics.median(x[1] for x in xs)))


if __name__ == "__main__":
    main()
