"""Recovery after kill -9 (full scan): this checkout against a peer checkout, on the same log, in the same run.

    python bench/bench_recovery.py --peer /path/to/other/checkout [--gib 0.5] [--runs 3]

One broker (this checkout) writes ``--gib`` GiB of 1 KiB messages (``run.py``'s pipelined puts) and is killed
with SIGKILL; its checkpoint is removed so the restart scans the whole log. Each run then restarts a fresh copy
of that data directory once with each checkout (``PYTHONPATH``; the order alternates), and takes two figures:
the store's open (the broker's "recovery scanned ... in X s" line: the scan, the index rebuild, the idempotent
producers' replay) and the restart until "ready" (which includes the broker's fixed start, measured on an empty
data directory in each run too). Prints GiB/s, medians of ``--runs`` runs, and the ratio to the peer.
``--pure`` runs this checkout's pure-Python twins (METAQ_PURE_PYTHON=1) as a third column.
Not a test: nothing here asserts.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.configs import full_size_store  # noqa: E402
from bench.run import MSG, pipelined_puts  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = re.compile(r"recovery scanned (\d+) bytes, \d+ records from position \d+ in ([0-9.]+) s")


def config(data_dir):
    return small_config(data_dir, store=full_size_store(flush="async"), limits={"max_body_bytes": 1 << 20},
                        topics=[{"name": "*", "partitions": 4}])


def write_log(root, gib):
    """The data directory of a broker killed after writing ``gib`` GiB, checkpoint removed."""
    wd = os.path.join(root, "writer")
    os.makedirs(wd)
    b = BrokerProcess(wd, config(os.path.join(wd, "data"))).start()
    n = int(gib * (1 << 30) / (MSG + 80))
    for start in range(0, n, 50_000):
        pipelined_puts(b.port, min(50_000, n - start), depth=256)
    b.kill()
    os.unlink(os.path.join(b.data_dir, "checkpoint"))
    return b.data_dir


def restart(root, pristine, name, code, pure):
    """(scan GiB/s, restart-to-ready GiB/s) of the checkout ``code`` recovering a copy of ``pristine``."""
    wd = os.path.join(root, name)
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    # the written pages written back before the restart
    subprocess.run(["cp", "-a", "--sparse=always", pristine, os.path.join(wd, "data")], check=True)
    logdir = os.path.join(wd, "data", "commitlog")
    for name in os.listdir(logdir):  # preallocated as the broker's segments are (the holes: unwritten extents)
        fd = os.open(os.path.join(logdir, name), os.O_RDWR)
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        os.close(fd)
    os.sync()
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH"), "METAQ_PURE_PYTHON": os.environ.get("METAQ_PURE_PYTHON")}
    os.environ["PYTHONPATH"] = code
    os.environ["METAQ_PURE_PYTHON"] = "1" if pure else "0"
    try:
        b = BrokerProcess(wd, config(os.path.join(wd, "data")))
        t = time.perf_counter()
        b.start(timeout=600)
        elapsed = time.perf_counter() - t
        b.stop()
    finally:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    m = SCANNED.search(b.log_text())
    shutil.rmtree(wd, ignore_errors=True)
    gib = int(m.group(1)) / (1 << 30)
    return gib / float(m.group(2)), gib / elapsed


def empty_start(root):
    """Seconds from launch to "ready" of this checkout's broker on an empty data directory (the fixed cost)."""
    wd = os.path.join(root, "empty")
    shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd)
    b = BrokerProcess(wd, config(os.path.join(wd, "data")))
    t = time.perf_counter()
    b.start(timeout=60)
    elapsed = time.perf_counter() - t
    b.stop()
    shutil.rmtree(wd, ignore_errors=True)
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", required=True, help="the other checkout (its C helper built in place)")
    p.add_argument("--gib", type=float, default=0.5)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pure", action="store_true", help="also this checkout's pure-Python twins")
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="metaq-bench-recovery-", dir=args.dir)
    variants = [("this", HERE, False), ("peer", os.path.abspath(args.peer), False)]
    if args.pure:
        variants.append(("this, pure Python", HERE, True))
    results = {name: [] for name, _c, _p in variants}
    empty = []
    try:
        pristine = write_log(root, args.gib)
        for r in range(args.runs):
            order = variants if r % 2 == 0 else variants[::-1]
            for name, code, pure in order:
                results[name].append(restart(root, pristine, "run", code, pure))
                print("run %d %-18s scan %.3f GiB/s, restart %.3f GiB/s" % ((r, name) + results[name][-1]),
                      file=sys.stderr)
            empty.append(empty_start(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nrecovery after kill -9, full scan of %.2f GiB, median of %d runs (GiB/s, higher is better)"
          % (args.gib, args.runs))
    print("%-20s %10s %10s %14s" % ("checkout", "store open", "restart", "open vs peer"))
    peer_scan = statistics.median(x[0] for x in results["peer"])
    for name, _c, _p in variants:
        scan = statistics.median(x[0] for x in results[name])
        rest = statistics.median(x[1] for x in results[name])
        print("%-20s %10.3f %10.3f %13.2fx" % (name, scan, rest, scan / peer_scan))
    print("this checkout's broker on an empty data directory: %.2f s from launch to ready (median), in every"
          " restart above" % statistics.median(empty))


if __name__ == "__main__":
    main()
