"""What checking every record's CRC on the read path costs (issue 15 point 6; prints figures, not a test).

    python -m bench.bench_verify [--runs 5] [--mib 64] [--sizes 100,1024,16384] [--dir DIR]

A store (in ``/dev/shm`` when there is one, so the disk is not measured) gets
``--mib`` MiB of records of each size in one partition; then the whole
partition is read back, alternately checked and unchecked, ``--runs`` times
each, and the medians are printed:

* ``get``: ``MessageStore.read_joined`` in 1 MiB reads (what a text ``get``
  does), with the C gather checking each record (``verify=True``, what the
  broker runs) and without (the gather's ``verify`` turned off for the
  unchecked runs: the read path before the check);
* ``get, pure Python``: the same with the gather's Python twin
  (``METAQ_PURE_PYTHON=1``, or a build without the helper);
* ``pull``: ``MessageStore.read_records`` (a RocketMQ pull: records decoded
  one by one, 32 at a time), with ``record.record_ok`` (one C call per
  record) and with the check replaced by a stub that accepts the record;
* ``crc32 alone``: the CRC over the same bytes in one call (the floor).

The cost per MiB is (checked − unchecked) / MiB read; the ratio is checked /
unchecked time, both from the same run.

    python -m bench.bench_verify --ab OLD_TREE [--runs 5] [--messages 200000]

compares, end to end, ``bench/run.py``'s "sequential read, 1 MiB gets" row
(1 KiB messages, a real broker, a raw client) between this tree and
``OLD_TREE`` (a checkout without the check, its C helper built in place),
brokers started alternately, a fresh one per run; medians and their ratio.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

from metaq.protocol import checksum
from metaq.store import gather, lookup
from metaq.store.config import StoreConfig, TopicSpec
from metaq.storestate import open_store

NOW = 1_609_459_200_000
READ = 1 << 20


def make_store(path, size, mib):
    cfg = StoreConfig(data_dir=path, segment_size=256 << 20, index_file_units=1 << 20, flush="async",
                      flush_every_messages=1 << 30, flush_interval_ms=1 << 30, topics=[TopicSpec("bench", 1)])
    s = open_store(cfg, NOW)
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    count = (mib << 20) // size
    for _ in range(count):
        s.put("bench", 0, 0, body, NOW)
    return s, count


def read_all_joined(s):
    offset, nbytes = 0, 0
    while True:
        r = s.read_joined("bench", 0, offset, READ)
        if not r.count:
            return nbytes
        nbytes += r.nbytes
        offset = r.next_offset


def read_all_records(s):
    offset, nbytes = 0, 0
    while True:
        records, nxt = s.read_records("bench", 0, offset, 32, READ)
        if not records:
            return nbytes
        nbytes += sum(r.total_size for r in records)
        offset = nxt


def timed(fn):
    t = time.perf_counter()
    n = fn()
    return time.perf_counter() - t, n


def alternate(runs, checked, unchecked, enter_unchecked, leave_unchecked):
    """Medians (checked s, unchecked s, bytes) over ``runs`` alternations, each a whole read."""
    a, b, nbytes = [], [], 0
    for _ in range(runs):
        t, nbytes = timed(checked)
        a.append(t)
        enter_unchecked()
        try:
            t, n = timed(unchecked)
        finally:
            leave_unchecked()
        assert n == nbytes, (n, nbytes)
        b.append(t)
    return statistics.median(a), statistics.median(b), nbytes


def row(name, size, checked_s, unchecked_s, nbytes):
    mib = nbytes / (1 << 20)
    cost_ms = (checked_s - unchecked_s) * 1000 / mib
    print("| %s | %s B | %.0f MiB/s | %.0f MiB/s | %.3f ms | %.2fx |" % (
        name, format(size, ","), mib / checked_s, mib / unchecked_s, cost_ms, checked_s / unchecked_s), flush=True)


def bench_size(base, size, mib, runs):
    path = tempfile.mkdtemp(prefix="metaq-bench-verify-", dir=base)
    try:
        s, count = make_store(path, size, mib)
        run = lambda: read_all_joined(s)  # noqa: E731

        c_gather = gather.gather_records
        state = {}

        def unchecked_c():
            gather.gather_records = lambda *args: c_gather(*args[:7], False)

        def restore():
            gather.gather_records = state.get("current", c_gather)

        if c_gather is not gather.gather_records_py:
            row("get (C gather)", size, *alternate(runs, run, run, unchecked_c, restore))
        state["current"] = gather.gather_records = gather.gather_records_py
        py_runs = max(1, runs // 2) if size < 1024 else runs

        def unchecked_py():
            gather.gather_records = lambda *args: gather.gather_records_py(*args[:7], False)

        row("get, pure Python", size, *alternate(py_runs, run, run, unchecked_py, restore))
        state["current"] = gather.gather_records = c_gather

        check = lookup.record_ok
        pull = lambda: read_all_records(s)  # noqa: E731

        def stub():
            lookup.record_ok = lambda buf, pos, size: True

        def unstub():
            lookup.record_ok = check

        row("pull (per record)", size, *alternate(py_runs, pull, pull, stub, unstub))

        seg_bytes = bytes(s.read_log(0, 256 << 20, upto="written")[0])
        crc_times = []
        for _ in range(runs):
            t = time.perf_counter()
            checksum.crc32(seg_bytes)
            crc_times.append(time.perf_counter() - t)
        t = statistics.median(crc_times)
        mib_log = len(seg_bytes) / (1 << 20)
        print("| crc32 alone (%s) | %s B | %.0f MiB/s | | %.3f ms | |" % (
            checksum.IMPLEMENTATION, format(size, ","), mib_log / t, t * 1000 / mib_log), flush=True)
        s.close(NOW)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def ab_reads(old_tree, runs, messages, base):
    """Median MB/s of sequential 1 MiB gets: (this tree, old_tree), alternating fresh brokers."""
    from bench import run as table

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"checked (this tree)": here, "unchecked (%s)" % old_tree: os.path.abspath(old_tree)}
    figures = {name: [] for name in trees}
    saved = os.environ.get("PYTHONPATH")
    root = tempfile.mkdtemp(prefix="metaq-bench-ab-", dir=base)
    try:
        for r in range(runs):
            for name, tree in trees.items():
                os.environ["PYTHONPATH"] = tree  # the broker process runs that tree's metaq
                b = table.start_broker(root, "async", "ab-%d-%d" % (r, len(figures[name])))
                try:
                    table.pipelined_puts(b.port, messages, depth=256)
                    figures[name].append(statistics.median(
                        table.sequential_reads(b.port, messages)[0] for _ in range(3)))
                finally:
                    b.stop()
                    shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        shutil.rmtree(root, ignore_errors=True)
    (a, fa), (b_, fb) = figures.items()
    ma, mb = statistics.median(fa), statistics.median(fb)
    print("sequential read, 1 MiB gets, 1 KiB messages, %d runs each (medians of 3 reads per run)" % runs)
    for name, fig in figures.items():
        print("  %s: median %.0f MB/s (runs: %s)" % (name, statistics.median(fig), ", ".join("%.0f" % x for x in fig)))
    print("  ratio checked/unchecked: %.3f; the check's cost per MiB read: %.3f ms" % (
        ma / mb, (1 / ma - 1 / mb) * 1000 * (1 << 20) / 1e6))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ab", metavar="OLD_TREE", help="compare end-to-end reads with the tree OLD_TREE")
    ap.add_argument("--messages", type=int, default=200_000, help="--ab: 1 KiB messages read per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mib", type=int, default=64, help="MiB of records per size")
    ap.add_argument("--sizes", default="100,1024,16384", help="message body sizes, bytes")
    ap.add_argument("--dir", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    args = ap.parse_args(argv)
    if args.ab:
        return ab_reads(args.ab, args.runs, args.messages, None)
    print("crc32: %s; %d runs each, medians; %d MiB per size" % (checksum.IMPLEMENTATION, args.runs, args.mib))
    print("| read | body | checked | unchecked | CRC check per MiB read | time ratio |")
    print("|---|---|---|---|---|---|")
    for size in (int(x) for x in args.sizes.split(",")):
        bench_size(args.dir, size, args.mib, args.runs)


if __name__ == "__main__":
    main()
