"""Transaction benchmark: messages/s in transactions of 1, 10 and 100 messages, and commit latency.

    python -m bench.bench_tx [--runs 3] [--messages 3000]

Against a real broker process on 127.0.0.1 (``sync`` flush, journal fsynced at
commit: the defaults), 1 KiB messages, medians of ``--runs`` runs. Each row
sends ``--messages`` messages through ``Producer.transaction()`` (local
transactions, one commit per N messages) and through ``XAResource`` (two-phase:
prepare + commit per N messages); the peer row is the same producer without
transactions, one ``send`` at a time, measured in the same run. Commit latency
is the time of the commit call alone (local: COMMIT_ONE_PHASE; XA: PREPARE +
COMMIT_TWO_PHASE). Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.run import start_broker  # noqa: E402
from metaq.client import Message, Producer  # noqa: E402
from metaq.client import XAResource  # noqa: E402

BODY = b"t" * 1024


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def plain(url, n):
    with Producer(brokers=[url]) as p:
        p.send(Message("bench", BODY))
        t = time.perf_counter()
        for _ in range(n):
            assert p.send(Message("bench", BODY)).success
        return n / (time.perf_counter() - t), None, None


def local(url, n, size):
    commits = []
    with Producer(brokers=[url]) as p:
        p.send(Message("bench", BODY))
        t = time.perf_counter()
        for _ in range(n // size):
            tx = p.transaction()
            for _ in range(size):
                p.send(Message("bench", BODY))
            c = time.perf_counter()
            tx.commit()
            commits.append((time.perf_counter() - c) * 1000)
        rate = (n // size) * size / (time.perf_counter() - t)
    return rate, pct(commits, 0.5), pct(commits, 0.99)


def two_phase(url, n, size):
    commits = []
    with XAResource(brokers=[url], unique_qualifier="bench-rm") as rm:
        t = time.perf_counter()
        for i in range(n // size):
            rm.tpc_begin(rm.xid(1, "bench-%d-%d-%d" % (os.getpid(), size, i), "b"))
            for _ in range(size):
                rm.send(Message("bench", BODY))
            c = time.perf_counter()
            rm.tpc_prepare()
            rm.tpc_commit()
            commits.append((time.perf_counter() - c) * 1000)
        rate = (n // size) * size / (time.perf_counter() - t)
    return rate, pct(commits, 0.5), pct(commits, 0.99)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-tx-", dir=args.dir)
    rows = {}
    cases = [("no transaction, send one at a time (peer)", lambda u: plain(u, args.messages))]
    for size in (1, 10, 100):
        cases.append(("local, %d per transaction" % size, lambda u, s=size: local(u, args.messages, s)))
    for size in (1, 10, 100):
        cases.append(("XA two-phase, %d per transaction" % size, lambda u, s=size: two_phase(u, args.messages, s)))
    try:
        for r in range(args.runs):
            b = start_broker(root, "sync", "tx-%d" % r)
            url = "meta://127.0.0.1:%d" % b.port
            for name, fn in cases:
                rows.setdefault(name, []).append(fn(url))
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = statistics.median
    print("\nmetaq transactions, 1 KiB messages, flush=sync, journal fsync at commit, median of %d runs\n" % args.runs)
    print("| case | msgs/s | commit p50 | commit p99 |")
    print("|---|---|---|---|")
    for name, _fn in cases:
        got = rows[name]
        rate = med(g[0] for g in got)
        if got[0][1] is None:
            print("| %s | %s | | |" % (name, f"{rate:,.0f}"))
        else:
            print("| %s | %s | %.2f ms | %.2f ms |" % (name, f"{rate:,.0f}", med(g[1] for g in got),
                                                      med(g[2] for g in got)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--dir", default=None)
    run(p.parse_args())


if __name__ == "__main__":
    main()
