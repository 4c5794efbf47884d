"""SQL92 filter evaluation against the tag filter's check: the cost per message of deciding whether it is wanted.

    python -m bench.bench_sqlfilter [--runs 5] [--messages 100000]

Pure CPU, one process, no broker: ``--messages`` property dicts (TAGS ``T<i % 100>``, KEYS, a numeric ``price``,
a ``region`` string, as a RocketMQ pull's decoded message has them) are checked by

* the tag filter (``TagFilter.matches`` on the record's tags: what a ``TAG`` subscription costs per record read
  once its index hash matched);
* SQL92 expressions of growing shape, each compiled once (``compile_sql``) and evaluated per message
  (``SqlFilter.matches``).

Each row: nanoseconds per message (median of ``--runs`` runs; every run measures each check in turn, so a busy
moment hits them alike), the share of messages matched, and the ratio to the tag check. The compile time of each
expression is shown once. Not a test: nothing here asserts.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from metaq.filters.sql import compile_sql  # noqa: E402
from metaq.filters.wire import parse_tag_expression  # noqa: E402

EXPRESSIONS = [
    "TAGS = 'T7'",
    "TAGS IN ('T7', 'T8', 'T9')",
    "price > 500",
    "price BETWEEN 100 AND 200",
    "region = 'eu' AND price > 500.5",
    "(TAGS IN ('T7', 'T8') OR region STARTSWITH 'us') AND price BETWEEN 10 AND 900 AND flag IS NULL",
]


def messages(n):
    regions = ("eu", "us-east", "us-west", "ap")
    return [{"TAGS": "T%d" % (i % 100), "KEYS": "k%d" % i, "price": str(i % 1000), "region": regions[i % 4]}
            for i in range(n)]


def per_message_ns(check, msgs):
    t0 = time.perf_counter_ns()
    hits = 0
    for m in msgs:
        if check(m):
            hits += 1
    return (time.perf_counter_ns() - t0) / len(msgs), hits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--messages", type=int, default=100000)
    args = ap.parse_args()
    msgs = messages(args.messages)
    tagged = [(m["TAGS"].encode(), m) for m in msgs]
    tag_filter = parse_tag_expression("T7")

    compiled = []
    for text in EXPRESSIONS:
        t0 = time.perf_counter_ns()
        compiled.append((text, compile_sql(text), (time.perf_counter_ns() - t0) / 1000.0))
    tag_runs, sql_runs, hits = [], [[] for _ in compiled], {}
    for _ in range(args.runs):  # each run measures every check in turn, so a busy moment hits them alike
        t0 = time.perf_counter_ns()
        n = 0
        for tags, _m in tagged:
            if tag_filter.matches(tags):
                n += 1
        tag_runs.append((time.perf_counter_ns() - t0) / len(tagged))
        hits["tag"] = n
        for k, (text, f, _us) in enumerate(compiled):
            ns, hits[text] = per_message_ns(f.matches, msgs)
            sql_runs[k].append(ns)
    tag_ns = statistics.median(tag_runs)
    rows = [("tag filter T7 (TagFilter.matches)", "-", tag_ns, hits["tag"] / len(msgs))]
    for (text, _f, us), runs in zip(compiled, sql_runs, strict=True):
        rows.append(("sql: " + text, "%.0f" % us, statistics.median(runs), hits[text] / len(msgs)))

    print("%d messages, median of %d runs, Python %s" % (len(msgs), args.runs, sys.version.split()[0]))
    print("| %-100s | %10s | %9s | %7s | %8s |" % ("check", "compile us", "ns/msg", "matched", "x tag"))
    print("|%s|%s|%s|%s|%s|" % ("-" * 102, "-" * 12, "-" * 11, "-" * 9, "-" * 10))
    for name, compile_us, ns, share in rows:
        print("| %-100s | %10s | %9.0f | %6.1f%% | %8.1f |" % (name, compile_us, ns, share * 100, ns / tag_ns))


if __name__ == "__main__":
    main()
