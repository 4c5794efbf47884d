"""Consumer priorities benchmark: put_prio beside plain puts, and a mixed backlog drained by get_prio beside the
same backlog drained by plain gets.

    python -m bench.bench_priorities [--runs 3] [--messages 20000]

Against a real broker process on 127.0.0.1 (``sync`` flush), 1 KiB messages, medians of ``--runs`` runs:

* put rate: ``--messages`` pipelined ``put_prio`` (levels 0, 1, 2 in turn, a 3-level topic) on one connection;
  the peer rows are the same number of plain ``put`` frames (which take the put-burst fast path) and of
  ``put_delayed`` level 0 frames (a plain put through the general path, as ``put_prio`` goes) in the same run;
* drain: one raw client reads the whole backlog, one request at a time, 256 KiB per request: ``get_prio``
  (one offset per level; every request with more than one level backlogged also reads each such level's head
  record for its store time) beside ``get`` over the plain topic's same number of messages.

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

from bench.run import MSG, pipelined  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.message import iter_records  # noqa: E402
from metaq.protocol.priority import PriorityPut  # noqa: E402
from metaq.protocol.text import serialize  # noqa: E402
from metaq.topics.wire import TopicCommand  # noqa: E402

LEVELS = 3
MAX_SIZE = 256 * 1024


def start(root, name):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    cfg = small_config(os.path.join(wd, "data"), store=full_size_store(), topics=[{"name": "*", "partitions": 1}])
    b = BrokerProcess(wd, cfg).start()
    with b.client() as c:
        r = c.call(TopicCommand("create", "prio", (("priorities", str(LEVELS)),), c.opaque()))
        assert r.code == 200, r
    return b


def put_rates(port, n):
    payload = b"p" * MSG
    crc = metaq_checksum(payload)
    plain = pipelined(port, [serialize(ev.Put("plain", 0, 0, payload, i, crc)) for i in range(n)])
    general = pipelined(port, [serialize(ev.DelayedPut("general", 0, 0, payload, i, crc, 0)) for i in range(n)])
    prio = pipelined(port, [serialize(PriorityPut("prio", 0, 0, payload, i, crc, i % LEVELS)) for i in range(n)])
    return plain, general, prio


def drain_plain(b, n):
    with b.client() as c:
        offset, t = 0, time.perf_counter()
        while offset < n:
            r = c.get("plain", 0, offset, MAX_SIZE)
            offset += sum(1 for _ in iter_records(r.body))
        return n / (time.perf_counter() - t)


def drain_prio(b, n):
    with b.client() as c:
        offsets, t = [0] * LEVELS, time.perf_counter()
        while sum(offsets) < n:
            level, records = c.get_prio("prio", 0, offsets, MAX_SIZE)
            offsets[level] += len(records)
        return n / (time.perf_counter() - t)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-prio-", dir=args.dir)
    rows = {"put": [], "general": [], "put_prio": [], "get": [], "get_prio": []}
    try:
        for run_no in range(args.runs):
            b = start(root, "r%d" % run_no)
            plain, general, prio = put_rates(b.port, args.messages)
            rows["put"].append(plain)
            rows["general"].append(general)
            rows["put_prio"].append(prio)
            rows["get"].append(drain_plain(b, args.messages))
            rows["get_prio"].append(drain_prio(b, args.messages))
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print("priorities, %d x 1 KiB messages, %d levels, sync flush, median of %d runs" % (args.messages, LEVELS,
                                                                                       args.runs))
    print("%-52s %14s" % ("measure", "value"))
    print("%-52s %11.0f/s" % ("plain put, pipelined (peer)", med["put"]))
    print("%-52s %11.0f/s" % ("put_delayed level 0 (a put on the general path; peer)", med["general"]))
    print("%-52s %11.0f/s" % ("put_prio, levels in turn, pipelined", med["put_prio"]))
    print("%-52s %11.0f/s" % ("plain get drain, 256 KiB per request (peer)", med["get"]))
    print("%-52s %11.0f/s" % ("get_prio drain of the mixed backlog, 256 KiB", med["get_prio"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: the temp dir)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
