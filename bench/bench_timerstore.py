"""Timer-store design choice, measured: an embedded SQLite index vs an in-memory heap vs a timer wheel.

    python -m bench.bench_timerstore [--n 1000000] [--runs 3] [--quick]

Conclusions (1,000,000 pending, median of 3 runs, 2 shared cores with a test suite running beside it, so
absolute figures are noisy): SQLite inserts ~50,000 entries/s in 1,000-row transactions, 14-40x slower than the
in-memory candidates, but that is far above what one broker's timer traffic needs and it runs on a worker
thread. What decides is memory and restart: SQLite's process grew 19 MB for 1M pending (its page cache; the
data is on disk) against 247 MB for the heap and 193 MB for the wheel, which both grow linearly with the
pending count (years of delays at ~1,000 msg/s would not fit), and SQLite reopens after a SIGKILL in ~3 ms
(WAL recovery + first due query) against a 0.9 s / 2.6 s rebuild per million for heap / wheel that also grows
with N. The per-entry insert cost does not depend on the delay for SQLite or the heap (1 s / 30 d / 1 y within
noise); the sparse wheel gets slower with longer delays (2.0M -> 1.0M -> 0.6M/s: more distinct seconds, more
slots), and a fixed ring would instead pay re-rolls. synchronous=NORMAL vs FULL showed no difference beyond
noise with WAL and 1,000-row batches. Taking due entries (21-45k/s) and cancels (17-35k/s) are slower in SQLite
but ample. Hence the SQLite index.

Each candidate holds ``--n`` pending entries (100-byte payloads, due at uniformly random times within 30 days),
measured in a fresh subprocess so that its resident memory is its own:

* **sqlite NORMAL / FULL**: stdlib ``sqlite3``, WAL, ``synchronous=NORMAL`` or ``FULL``; a table keyed by msg id
  with the payload and an index on the due time; inserts in transactions of 1,000 rows (how an indexer applies a
  batch of log records). The writer is a forked process killed with SIGKILL while its connection is open, so
  the reopen includes WAL recovery;
* **heap**: ``heapq`` of ``(due, id)`` plus a dict id -> payload for cancels (the naive in-memory design); it
  has nothing to reopen, so its "reopen" is a rebuild from a log file of the same records (payloads read back);
* **wheel**: RocketMQ 5's shape (TimerWheel + TimerLog): per-second slots holding ``(id, log position)`` pairs
  in arrays, the payloads in an append-only log file; a restart rebuilds the slots by scanning that log. The
  slots are a sparse dict keyed by second rather than a fixed ring that re-rolls far entries, which favours
  the wheel (no re-roll cost). A cancel appends a marker record to the log and a tombstone in memory; a take
  reads one second's entries from the log and orders them by due ms.

Measured: inserts per second (and the same at ``--n``/10 entries for delays of 1 s, 30 days and 1 year: does
the cost depend on the delay?), RSS growth, reopen time after a kill (sqlite: open + the first due query; heap
and wheel: rebuilding from the log file), taking the next 100,000 due entries in order and deleting them, and
10,000 cancels by id. The result table goes to the README's section on delivery at any time.
Not a test: nothing here asserts.
"""

import argparse
import array
import heapq
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import time

DAY_MS = 86_400_000
PAYLOAD = b"x" * 100
REC = struct.Struct(">qqi")  # id, due, length


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def entries(n, span_ms, seed=1):
    rnd = random.Random(seed)
    now = 1_700_000_000_000
    return [(i + 1, now + rnd.randrange(1, span_ms)) for i in range(n)]


# -- sqlite ---------------------------------------------------------------------------------------------


def sqlite_open(path, sync):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=%s" % sync)
    db.execute("PRAGMA cache_size=-16000")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, due INTEGER NOT NULL, data BLOB)")
    db.execute("CREATE INDEX IF NOT EXISTS t_due ON t (due)")
    return db


def sqlite_insert(db, rows):
    for start in range(0, len(rows), 1000):
        db.execute("BEGIN")
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", ((i, d, PAYLOAD) for i, d in rows[start:start + 1000]))
        db.execute("COMMIT")


def sqlite_case(work, n, span, sync):
    path = os.path.join(work, "timers.db")
    rows = entries(n, span)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer: inserts, reports, then is killed with its connection open (WAL not checkpointed)
        os.close(rfd)
        base = rss_mb()
        db = sqlite_open(path, sync)
        t = time.perf_counter()
        sqlite_insert(db, rows)
        ins = n / (time.perf_counter() - t)
        os.write(wfd, json.dumps([ins, rss_mb() - base]).encode())
        os.close(wfd)
        os.kill(os.getpid(), signal.SIGKILL)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        ins, grow = json.loads(r.read())
    os.waitpid(pid, 0)
    t = time.perf_counter()
    db = sqlite_open(path, sync)
    db.execute("SELECT id, due, data FROM t ORDER BY due LIMIT 1").fetchall()
    reopen = time.perf_counter() - t
    t = time.perf_counter()
    taken = 0
    want = min(100_000, n // 2)
    while taken < want:
        batch = db.execute("SELECT id, due, data FROM t ORDER BY due LIMIT 1000").fetchall()
        db.execute("BEGIN")
        db.executemany("DELETE FROM t WHERE id = ?", ((r[0],) for r in batch))
        db.execute("COMMIT")
        taken += len(batch)
    pop = taken / (time.perf_counter() - t)
    ids = random.Random(2).sample(range(1, n + 1), min(10_000, n // 4))
    t = time.perf_counter()
    db.execute("BEGIN")
    for i in ids:
        db.execute("DELETE FROM t WHERE id = ?", (i,))
    db.execute("COMMIT")
    cancel = len(ids) / (time.perf_counter() - t)
    db.close()
    return {"insert": ins, "rss": grow, "reopen": reopen, "pop": pop, "cancel": cancel}


# -- a log file for heap and wheel ---------------------------------------------------------------------


def log_append(f, rows):
    positions = []
    pos = f.tell()
    for i, d in rows:
        f.write(REC.pack(i, d, len(PAYLOAD)))
        f.write(PAYLOAD)
        positions.append(pos)
        pos += REC.size + len(PAYLOAD)
    return positions


def log_cancel(f, ids):
    """A cancel is a record of its own (length -1), as RocketMQ's timer log appends a delete marker."""
    for i in ids:
        f.write(REC.pack(i, 0, -1))


def log_scan(path, payloads=False):
    """(id, due, position[, payload]) of the pending records in log order; cancelled ids are left out."""
    with open(path, "rb") as f:
        data = f.read()
    pos, out, cancelled = 0, [], set()
    while pos < len(data):
        i, d, ln = REC.unpack_from(data, pos)
        if ln < 0:
            cancelled.add(i)
            pos += REC.size
            continue
        if payloads:
            out.append((i, d, pos, data[pos + REC.size:pos + REC.size + ln]))
        else:
            out.append((i, d, pos))
        pos += REC.size + ln
    if cancelled:
        out = [r for r in out if r[0] not in cancelled]
    return out


def heap_case(work, n, span):
    rows = entries(n, span)
    base = rss_mb()
    t = time.perf_counter()
    heap, data = [], {}
    for i, d in rows:
        heapq.heappush(heap, (d, i))
        data[i] = bytes(bytearray(PAYLOAD))  # each payload its own object, as records read from a log are
    ins = n / (time.perf_counter() - t)
    grow = rss_mb() - base
    path = os.path.join(work, "log")
    with open(path, "wb") as f:
        log_append(f, rows)
    t = time.perf_counter()
    rebuilt, rdata = [], {}
    for i, d, _pos, payload in log_scan(path, payloads=True):  # the heap keeps payloads in memory
        rebuilt.append((d, i))
        rdata[i] = payload
    heapq.heapify(rebuilt)
    reopen = time.perf_counter() - t
    t = time.perf_counter()
    want = min(100_000, n // 2)
    for _ in range(want):
        _d, i = heapq.heappop(heap)
        data.pop(i, None)
    pop = want / (time.perf_counter() - t)
    ids = random.Random(2).sample(range(1, n + 1), min(10_000, n // 4))
    t = time.perf_counter()
    cancelled = set()
    for i in ids:  # lazy: dropped from the dict, skipped when popped
        if data.pop(i, None) is not None:
            cancelled.add(i)
    cancel = len(ids) / (time.perf_counter() - t)
    return {"insert": ins, "rss": grow, "reopen": reopen, "pop": pop, "cancel": cancel}


def wheel_case(work, n, span):
    rows = entries(n, span)
    path = os.path.join(work, "log")
    base = rss_mb()
    t = time.perf_counter()
    slots = {}
    with open(path, "wb") as f:
        positions = log_append(f, rows)
        for (i, d), pos in zip(rows, positions, strict=True):
            slot = slots.get(d // 1000)
            if slot is None:
                slot = slots[d // 1000] = array.array("q")
            slot.append(i)
            slot.append(pos)
    ins = n / (time.perf_counter() - t)
    grow = rss_mb() - base
    t = time.perf_counter()
    rebuilt = {}
    for i, d, pos in log_scan(path):
        slot = rebuilt.get(d // 1000)
        if slot is None:
            slot = rebuilt[d // 1000] = array.array("q")
        slot.append(i)
        slot.append(pos)
    reopen = time.perf_counter() - t
    del rebuilt
    t = time.perf_counter()
    taken = 0
    cancelled = set()
    with open(path, "rb") as f:
        # the wheel ticks second by second; one second's entries are read from the log and ordered by due ms
        for sec in sorted(slots):
            slot = slots.pop(sec)
            due = []
            for k in range(0, len(slot), 2):
                if slot[k] in cancelled:
                    continue
                f.seek(slot[k + 1])
                rec = f.read(REC.size + len(PAYLOAD))
                i, d, _ln = REC.unpack_from(rec)
                due.append((d, i, rec[REC.size:]))
            due.sort()
            taken += len(due)
            if taken >= min(100_000, n // 2):
                break
    pop = taken / (time.perf_counter() - t)
    ids = random.Random(2).sample(range(1, n + 1), min(10_000, n // 4))
    t = time.perf_counter()
    with open(path, "ab") as f:  # a cancel: a marker in the log (for the rebuild) and a tombstone in memory
        for i in ids:
            log_cancel(f, (i,))
            cancelled.add(i)
    cancel = len(ids) / (time.perf_counter() - t)
    return {"insert": ins, "rss": grow, "reopen": reopen, "pop": pop, "cancel": cancel}


CASES = {"sqlite NORMAL": lambda w, n, s: sqlite_case(w, n, s, "NORMAL"),
         "sqlite FULL": lambda w, n, s: sqlite_case(w, n, s, "FULL"),
         "heap": heap_case, "wheel": wheel_case}


def child(name, n, span):
    work = tempfile.mkdtemp(prefix="metaq-bench-timerstore-")
    try:
        print(json.dumps(CASES[name](work, n, span)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(name, n, span):
    out = subprocess.run([sys.executable, "-m", "bench.bench_timerstore", "--child", name, "--n", str(n),
                          "--span-ms", str(span)], capture_output=True, check=True,
                         cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    return json.loads(out.stdout)


def run(args):
    res = {}
    for name in CASES:
        runs = [measure(name, args.n, 30 * DAY_MS) for _ in range(args.runs)]
        res[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        res[name]["by_delay"] = [statistics.median(measure(name, args.n // 10, span)["insert"]
                                                   for _ in range(args.runs))
                                 for span in (1000, 30 * DAY_MS, 365 * DAY_MS)]
    print("timer-store candidates, %d pending over 30 days, 100-byte payloads, median of %d runs"
          % (args.n, args.runs))
    print()
    print("| candidate | inserts/s | inserts/s at delays 1 s / 30 d / 1 y (%d entries) | RSS growth | "
          "reopen after a kill | next 100k due, in order | cancels/s |" % (args.n // 10))
    print("|---|---|---|---|---|---|---|")
    for name, r in res.items():
        print("| %s | %.0f | %s | %.0f MB | %.0f ms | %.0f/s | %s |" % (
            name, r["insert"], " / ".join("%.0f" % x for x in r["by_delay"]), r["rss"], r["reopen"] * 1e3, r["pop"],
            "%.0f" % r["cancel"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100,000 entries, 1 run")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--span-ms", type=int, default=30 * DAY_MS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.n, args.runs = 100_000, 1
    if args.child:
        child(args.child, args.n, args.span_ms)
    else:
        run(args)


if __name__ == "__main__":
    main()
