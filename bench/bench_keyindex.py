"""The key index: broker-side lookup time of one key among 10 million, beside a plain index-unit read.

    python -m bench.bench_keyindex [--runs 5] [--keys 10000000] [--lookups 2000]

In-process, one ``MessageStore`` per run in a temporary directory (``/dev/shm`` when there), the default key
index geometry (``key_index_slots`` 2^20, ``key_index_entries`` 2^21: 5 files for 10 million keys). The index
holds ``--keys`` entries: a real message with ``KEYS probe`` first, then the other keys (synthetic entries
appended as the index appends a record's keys: their hashes spread over the slots; their records are never read
since their hashes differ from the probe's), then a second real ``probe`` message, so a lookup of ``probe``
walks the chain of its slot in every file (about 2 colliding entries each) and reads and checks two records.

Rows, in the same run on the same store: ``lookup probe`` (``keyindex.run(store.key_search(...))``: one page, both
messages, records decoded and checked) and the peer ``read one message`` (``store.read_records`` of one offset: an
index-unit read and a record decode). Each figure is the median over ``--lookups`` calls of one run, then the
median over ``--runs`` runs (min and max beside it). Warm pages: the index stays mapped in memory, as on a
broker whose index fits its page cache (a cold page is brought in off the loop by ``coldpages.walk``).
Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from metaq.protocol.message import encode_payload  # noqa: E402
from metaq.protocol.rocketmq.mapping import encode_attribute  # noqa: E402
from metaq.keys import index as keyindex  # noqa: E402
from metaq.store.config import StoreConfig, TopicSpec  # noqa: E402
from metaq.storestate import open_store  # noqa: E402

NOW = 1_700_000_000_000


def flushed_and_indexed(s):
    """Flush, then index as the broker's flusher does: ``follow_log`` steps until it says it is done."""
    s.mark_flushed(s.flush_log())
    while s.follow_log():
        pass


#: The kinds of 1 KiB records the indexing rows measure: (name, attribute).
KINDS = (("no key (a text put, half with a tag)", None), ("a UNIQ_KEY (every official RocketMQ send)", "uniq"),
         ("KEYS and a UNIQ_KEY", "keys"))


def indexing_run(kind, n):
    """``(us per record, longest step in ms)`` to index ``n`` flushed 1 KiB records of ``kind``."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="metaq-bench-keys-", dir=base)
    try:
        s = open_store(StoreConfig(data_dir=d, segment_size=256 << 20, topics=[TopicSpec("bench", 1)],
                                          key_index_slots=1 << 16, key_index_entries=1 << 19), NOW)
        body = b"x" * 1000
        for i in range(n):
            if kind == "uniq":
                flag, data = encode_payload(body, encode_attribute("t", {"UNIQ_KEY": "0A0B%028d" % i}))
            elif kind == "keys":
                flag, data = encode_payload(body, encode_attribute("t", {"KEYS": "k%d" % i, "UNIQ_KEY": "U%d" % i}))
            else:
                flag, data = encode_payload(body, "tag") if i % 2 else (0, body)
            s.put("bench", 0, flag, data, NOW)
        s.mark_flushed(s.flush_log())
        started, longest = time.perf_counter(), 0.0
        while True:
            t = time.perf_counter()
            more = s.follow_log()
            longest = max(longest, time.perf_counter() - t)
            if not more:
                break
        total = time.perf_counter() - started
        s.close(NOW)
        return total / n * 1e6, longest * 1e3
    finally:
        shutil.rmtree(d, ignore_errors=True)


def one_run(keys, lookups):
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="metaq-bench-keys-", dir=base)
    try:
        s = open_store(StoreConfig(data_dir=d, segment_size=64 << 20, topics=[TopicSpec("bench", 1)]), NOW)
        flag, data = encode_payload(b"probe body", encode_attribute(None, {"KEYS": "probe"}))
        s.put("bench", 0, flag, data, NOW)
        flushed_and_indexed(s)
        pos = s.written_position
        t0 = time.perf_counter()
        for i in range(keys - 2):
            s.keys.append_entries(((i * 2654435761 + 12345) & 0xFFFFFFFF,), pos + i, 100, NOW)  # never read
        fill_s = time.perf_counter() - t0
        s.put("bench", 0, flag, data, NOW + 1)
        flushed_and_indexed(s)
        entries = sum(f.count for f in s.keys.files)
        look, peer = [], []
        for _ in range(lookups):
            t = time.perf_counter()
            page = keyindex.run(s.key_search("bench", "probe", 0, 1 << 62, 64))
            look.append(time.perf_counter() - t)
            t = time.perf_counter()
            s.read_records("bench", 0, 1, 1, 1 << 20)
            peer.append(time.perf_counter() - t)
        assert len(page.records) == 2
        s.close(NOW)
        return statistics.median(look) * 1e6, statistics.median(peer) * 1e6, entries, len(s.keys.files) or 0, fill_s
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--lookups", type=int, default=2000)
    ap.add_argument("--records", type=int, default=50_000, help="records of each kind for the indexing rows")
    args = ap.parse_args(argv)
    results = [one_run(args.keys, args.lookups) for _ in range(args.runs)]
    entries = results[0][2]
    print("key index: %d entries, %d runs, %d calls each (median of a run; median [min-max] over runs)"
          % (entries, args.runs, args.lookups))
    print("| operation | broker-side time (µs) |")
    print("|---|---|")
    for name, col in (("lookup of 1 key among %d (2 messages, 1 page)" % entries, 0),
                      ("peer: read one message by offset (index unit + record)", 1)):
        xs = [r[col] for r in results]
        print("| %s | %.1f [%.1f-%.1f] |" % (name, statistics.median(xs), min(xs), max(xs)))
    print()
    print("indexing %d flushed records of 1 KiB per kind, steps of KEY_INDEX_STEP_BYTES (median [min-max] over "
          "runs)" % args.records)
    print("| records | µs per record | longest step (ms) |")
    print("|---|---|---|")
    for name, kind in KINDS:
        rows = [indexing_run(kind, args.records) for _ in range(args.runs)]
        per, step = [r[0] for r in rows], [r[1] for r in rows]
        print("| %s | %.2f [%.2f-%.2f] | %.1f [%.1f-%.1f] |" % (name, statistics.median(per), min(per), max(per),
                                                                statistics.median(step), min(step), max(step)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
