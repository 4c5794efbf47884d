"""Sequential 1 MiB reads against the machine's loopback ceiling, measured in the same run (issue 22 point 2).

    python -m bench.bench_reads [--runs 3] [--messages 100000] [--copying]

Rows, each the median of ``--runs``, the runs of every row interleaved (this is a busy shared machine: a slow
minute slows every row alike):

* ``loopback ceiling``: a plain Python sender process writing 1 MiB buffers to a TCP socket on 127.0.0.1 with
  ``sendall``, received as the read row receives (``recv_into`` into one buffer, 4 MiB SO_RCVBUF): what this
  machine's loopback moves between two processes when neither does anything else;
* ``sequential read, 1 MiB gets, zero-copy``: ``bench/run.py``'s read row (one connection reads partition 0 from
  offset 0) against a broker with ``broker.zero_copy_reads: true``, set (the default is ``false``);
* with ``--copying``, the same against a second broker with ``broker.zero_copy_reads: false`` (every reply
  gathered into one buffer per segment, as before the zero-copy path).

The ratio column is each row against the loopback ceiling. ``CPU ms/GB`` is the broker's own CPU time (user +
system, from /proc) per GB it served, and for the ceiling the sender's: on a busy machine the rates swing with
the neighbours' load while the CPU a gigabyte costs barely moves. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.configs import full_size_store  # noqa: E402
from bench.run import cpu_seconds, pipelined_puts, sequential_reads  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402

CHUNK = 1 << 20


def loopback_ceiling(total_bytes):
    """(MB/s, the sender's CPU ms per GB) of ``total_bytes`` moved over a TCP connection on 127.0.0.1 from a child
    process writing 1 MiB buffers (``sendall``) to this one receiving them with ``recv_into``."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the sender
        try:
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = os.urandom(CHUNK)
            left = total_bytes
            while left > 0:
                s.sendall(data if left >= CHUNK else data[:left])
                left -= CHUNK
            s.close()
        finally:
            os._exit(0)
    conn, _ = lsock.accept()
    lsock.close()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    view = memoryview(bytearray(CHUNK + (64 << 10)))
    got = 0
    started = time.perf_counter()
    while got < total_bytes:
        n = conn.recv_into(view)
        if not n:
            break
        got += n
    elapsed = time.perf_counter() - started
    conn.close()
    _pid, _status, usage = os.wait4(pid, 0)
    return got / elapsed / 1e6, (usage.ru_utime + usage.ru_stime) * 1e3 / (got / 1e9)


def read_row(b, messages):
    """(MB/s, the broker's CPU ms per GB) of one sequential read of ``messages`` from broker ``b``."""
    before = cpu_seconds(b.proc.pid)
    mbs, _msgs = sequential_reads(b.port, messages)
    cpu = cpu_seconds(b.proc.pid) - before
    return mbs, cpu * 1e3 / (messages * 1044 / 1e9)


def start(root, name, zero_copy):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    broker = {} if zero_copy is None else {"zero_copy_reads": zero_copy}
    cfg = small_config(os.path.join(wd, "data"), broker=broker, store=full_size_store(flush="async"),
                       limits={"max_body_bytes": 1 << 20}, topics=[{"name": "*", "partitions": 4}])
    b = BrokerProcess(wd, cfg).start()
    return b


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--copying", action="store_true", help="also a broker with broker.zero_copy_reads: false")
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="metaq-bench-reads-", dir=args.dir)
    brokers = {}
    try:
        # named and set, whatever the default
        brokers["sequential read, 1 MiB gets, zero-copy"] = start(root, "zc", True)
        if args.copying:
            brokers["sequential read, 1 MiB gets, copying"] = start(root, "copy", False)
        for b in brokers.values():
            pipelined_puts(b.port, args.messages, depth=256)
        rows = {"loopback ceiling (Python socket pair, 1 MiB)": []}
        rows.update({name: [] for name in brokers})
        volume = args.messages * 1044
        load = []
        for _ in range(args.runs):
            load.append(os.getloadavg()[0])
            rows["loopback ceiling (Python socket pair, 1 MiB)"].append(loopback_ceiling(volume))
            for name, b in brokers.items():
                rows[name].append(read_row(b, args.messages))
        for b in brokers.values():
            b.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ceiling = statistics.median([r[0] for r in rows["loopback ceiling (Python socket pair, 1 MiB)"]])
    print()
    print("1 KiB messages, %d messages per run, median of %d runs (load average %s at each run's start)"
          % (args.messages, args.runs, ", ".join("%.1f" % x for x in load)))
    head = "%-46s %8s  %-34s %8s %11s" % ("measurement", "MB/s", "runs", "ceiling", "CPU ms/GB")
    print(head)
    print("-" * len(head))
    for name, xs in rows.items():
        med = statistics.median([x[0] for x in xs])
        print("%-46s %8s  %-34s %7.2fx %11.0f" % (name, "{:,.0f}".format(med),
                                                   " ".join("{:,.0f}".format(x[0]) for x in xs), med / ceiling,
                                                   statistics.median([x[1] for x in xs])))
    names = list(rows)
    if len(names) == 3:  # zero-copy against copying, run by run (each pair measured in the same minute)
        paired = [z[1] / c[1] for z, c in zip(rows[names[1]], rows[names[2]], strict=True)]
        rates = [z[0] / c[0] for z, c in zip(rows[names[1]], rows[names[2]], strict=True)]
        print("zero-copy / copying, run by run: CPU per GB median %.2fx (%s); MB/s median %.2fx"
              % (statistics.median(paired), " ".join("%.2f" % x for x in paired), statistics.median(rates)))


if __name__ == "__main__":
    main()
