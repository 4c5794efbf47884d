"""Idempotent puts benchmark: the cost of ``put_idem`` beside plain puts, in the same run (not in ``make bench``).

    python -m bench.bench_idempotence [--runs 3] [--messages 20000]

Against a real broker process on 127.0.0.1 (``sync`` flush), 1 KiB messages,
one partition, medians of ``--runs`` runs (a fresh broker each run) of three rounds each, the kinds
alternated within a round:

* wire level, ``--messages`` pipelined requests on one connection (64 in flight):
  plain ``put`` without and with an attribute, and ``put_idem`` with the same
  attribute (all three on the broker's put-burst fast path, C: for ``put_idem``
  the identity is added by the scan, and a run of one producer's next sequences
  is decided and recorded in one step);
* client level: ``Producer.send_async`` of ``--messages`` messages, then
  ``flush``: without and with ``idempotent=True``;
* client level, batches: ``Producer.send_many`` of ``--messages`` payloads, 1,000 a call (``putb`` /
  ``putb_idem`` frames): plain, idempotent, and idempotent with the client's pure-Python encoder of
  ``putb_idem`` bodies (``encode_idem_sub_records_py``, what ran before its C twin), alternated in one run.

Each row gives the rate and the broker's CPU time per message (``/proc/<pid>/stat``: less sensitive
than the rate to other work on the machine). The ratios are idempotent / plain (rate: 1.00 = no cost;
CPU: 1.00 = no cost). Not a test: nothing here asserts.
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
from metaq.client import Message, Producer  # noqa: E402
from metaq.client import batching  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402
from metaq.idempotence.wire import encode_idem_sub_records_py  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.message import encode_payload  # noqa: E402
from metaq.protocol.text import serialize  # noqa: E402

TOPIC = "bench"


def start(root, name):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    cfg = small_config(os.path.join(wd, "data"), store=full_size_store(), topics=[{"name": "*", "partitions": 1}])
    return BrokerProcess(wd, cfg).start()


def frames(n, kind, pid=1):
    payload = b"p" * MSG
    if kind == "plain":
        crc = metaq_checksum(payload)
        return [serialize(ev.Put(TOPIC, 0, 0, payload, i, crc)) for i in range(n)]
    flag, data = encode_payload(payload, "k=v")
    crc = metaq_checksum(data)
    if kind == "attribute":
        return [serialize(ev.Put(TOPIC, 0, flag, data, i, crc)) for i in range(n)]
    return [serialize(IdempotentPut(TOPIC, 0, flag, data, i, crc, pid, i)) for i in range(n)]


def cpu_s(pid):
    """The process's user + system CPU seconds (``/proc/<pid>/stat``)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(b, n, fn):
    """``(rate, broker CPU µs per message)`` of ``fn()`` (which returns the rate)."""
    before = cpu_s(b.proc.pid)
    rate = fn()
    return rate, (cpu_s(b.proc.pid) - before) / n * 1e6


def client_rate(port, n, idempotent):
    body = b"c" * MSG
    with Producer(brokers=["meta://127.0.0.1:%d" % port], idempotent=idempotent) as p:
        p.send(Message(TOPIC, body))  # connection and partitions ready
        t = time.perf_counter()
        for _ in range(n):
            p.send_async(Message(TOPIC, body, attribute="k=v"))
        p.flush()
        return n / (time.perf_counter() - t)


def many_rate(port, n, idempotent, python_encoder=False):
    body = b"m" * MSG
    encoder = batching.encode_idem_sub_records
    if python_encoder:
        batching.encode_idem_sub_records = encode_idem_sub_records_py
    try:
        with Producer(brokers=["meta://127.0.0.1:%d" % port], idempotent=idempotent) as p:
            p.send(Message(TOPIC, body))
            t = time.perf_counter()
            futures = [p.send_many(TOPIC, [body] * 1000, partition=0) for _ in range(n // 1000)]
            assert all(f.result(120).success for f in futures)
            return n // 1000 * 1000 / (time.perf_counter() - t)
    finally:
        batching.encode_idem_sub_records = encoder


def workloads(port, n, pid):
    """Each kind's measured run against the broker at ``port`` (``n`` messages; ``pid``: the idempotent frames')."""
    return {"plain": lambda: pipelined(port, frames(n, "plain")),
            "attribute": lambda: pipelined(port, frames(n, "attribute")),
            "idem": lambda: pipelined(port, frames(n, "idem", pid=pid)),
            "client": lambda: client_rate(port, n, False),
            "client_idem": lambda: client_rate(port, n, True),
            "many": lambda: many_rate(port, n, False),
            "many_idem": lambda: many_rate(port, n, True),
            "many_idem_py": lambda: many_rate(port, n, True, python_encoder=True)}


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-idem-", dir=args.dir)
    kinds = ("plain", "attribute", "idem", "client", "client_idem", "many", "many_idem", "many_idem_py")
    rows = {k: [] for k in kinds}
    cpu = {k: [] for k in kinds}
    n = args.messages
    try:
        for run_no in range(args.runs):
            b = start(root, "r%d" % run_no)
            for rnd in range(3):  # alternated, so that a change of the machine's load hits both sides
                work = workloads(b.port, n, 3 * run_no + rnd + 1)
                for kind in kinds:
                    rate, us = measured(b, n, work[kind])
                    rows[kind].append(rate)
                    cpu[kind].append(us)
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    print("idempotent puts, %d x 1 KiB messages, sync flush, one partition, median of %d runs" % (n, args.runs))
    print("%-52s %12s %14s" % ("measure", "rate", "broker CPU"))
    names = {"plain": "wire: plain put, pipelined",
             "attribute": "wire: put with an attribute",
             "idem": "wire: put_idem with the same attribute",
             "client": "client: Producer.send_async + flush",
             "client_idem": "client: the same, idempotent=True",
             "many": "client: Producer.send_many, 1,000 a call",
             "many_idem": "client: the same, idempotent=True",
             "many_idem_py": "client: the same, Python putb_idem encoder"}
    for kind in kinds:
        print("%-52s %10.0f/s %9.1f us/msg" % (names[kind], med[kind], mcpu[kind]))
    for a, b, what in (("idem", "attribute", "put_idem / put with an attribute"),
                       ("idem", "plain", "put_idem / plain put"),
                       ("client_idem", "client", "idempotent / plain Producer"),
                       ("many_idem", "many", "idempotent / plain send_many"),
                       ("many_idem_py", "many", "idem. (Python encoder) / plain send_many"),
                       ("many_idem", "many_idem_py", "idem. send_many C / Python encoder")):
        print("%-52s %12.2f %14.2f" % ("ratio " + what + " (rate, CPU)", med[a] / med[b], mcpu[a] / mcpu[b]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: the temp dir)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
