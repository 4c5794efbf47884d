"""What TLS and authentication cost on the text port, beside plaintext measured in the same runs.

    python -m bench.bench_tls [--runs 5] [--messages 100000] [--latency-n 2000]

Three brokers per run (``flush=async``, the real store layout, 1 KiB messages), started in turn
and measured alike with the clients of ``bench/run.py``:

* ``plaintext``: no TLS, authentication off (the peer);
* ``TLS``: ``security.tls.mode: on`` (an ECDSA P-256 certificate made here with ``openssl``; TLS 1.3);
* ``auth``: plaintext with authentication on (a permissions file; each connection proves its user
  with the ``auth`` handshake first, then every put and get passes the permission check).

Rows: pipelined puts (depth 64), one put at a time (p50/p99), sequential reads with 1 MiB gets, and
new connections per second (connect, handshake, one ``version``). Medians of ``--runs``; the ratio is
against plaintext. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import wire  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from bench.run import fmt, pipelined_puts, sequential_put_latencies, sequential_reads  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402

USER, SECRET = "bench", "bench-secret-0123456789"
KINDS = ("plaintext", "TLS", "auth")


def make_certificate(root):
    """A self-signed ECDSA P-256 certificate for 127.0.0.1 (it is its own CA): (cert path, key path)."""
    cert, key = os.path.join(root, "server.pem"), os.path.join(root, "server.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return cert, key


def start(root, kind, name, cert, key):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    security = {}
    if kind == "TLS":
        security = {"tls": {"mode": "on", "cert": cert, "key": key}}
    elif kind == "auth":
        acl = os.path.join(wd, "acl.yaml")
        with open(os.open(acl, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # others may not read it
            yaml.safe_dump({"users": {USER: {"secret": SECRET, "topics": {"bench": "pub|sub"},
                                             "groups": {"g": "sub"}}}}, f)
        security = {"acl_file": acl}
    cfg = small_config(os.path.join(wd, "data"), store=full_size_store(flush="async"),
                       limits={"max_body_bytes": 1 << 20}, topics=[{"name": "*", "partitions": 4}],
                       security=security)
    return BrokerProcess(wd, cfg).start()


def connections_per_second(port, n, **conn):
    """Open ``n`` connections one after another, each answering one ``version``: connections/s."""
    started = time.perf_counter()
    for _ in range(n):
        sock = wire.connect(port, **conn)
        sock.sendall(b"version 1\r\n")
        wire.ResultReplies(sock, 4096).wait(1)
        sock.close()
    return n / (time.perf_counter() - started)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-tls-", dir=args.dir)
    cert, key = make_certificate(root)
    ctx = ssl.create_default_context(cafile=cert)
    conns = {"plaintext": {}, "TLS": {"ssl_context": ctx}, "auth": {"auth": (USER, SECRET)}}
    rows = {}  # (row, unit) -> kind -> [values]
    try:
        for r in range(args.runs):
            order = KINDS[r % 3:] + KINDS[:r % 3]  # each kind goes first in turn
            for kind in order:
                b = start(root, kind, "%s-%d" % (kind, r), cert, key)
                conn = conns[kind]
                put = pipelined_puts(b.port, args.messages, **conn)
                p50, p99 = sequential_put_latencies(b.port, args.latency_n, **conn)
                mbs, _msgs = sequential_reads(b.port, args.messages, **conn)
                cps = connections_per_second(b.port, args.connections, **conn)
                b.stop()
                shutil.rmtree(b.workdir, ignore_errors=True)
                for row, unit, value in (("pipelined put, depth 64", "msgs/s", put),
                                         ("single put p50", "ms", p50), ("single put p99", "ms", p99),
                                         ("sequential read, 1 MiB gets", "MB/s", mbs),
                                         ("new connection + one request", "conn/s", cps)):
                    rows.setdefault((row, unit), {}).setdefault(kind, []).append(value)
                print("run %d %-9s put %.0f/s p50 %.3f p99 %.3f read %.0f MB/s conn %.0f/s"
                      % (r + 1, kind, put, p50, p99, mbs, cps), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(rows, args)


def print_table(rows, args):
    print()
    print("TLS and authentication on the text port: 1 KiB messages, flush=async, median of %d runs" % args.runs)
    head = "%-32s %-7s %12s %12s %7s %12s %7s" % ("measurement", "unit", "plaintext", "TLS", "ratio", "auth",
                                                  "ratio")
    print(head)
    print("-" * len(head))
    for (row, unit), by_kind in rows.items():
        plain = statistics.median(by_kind["plaintext"])
        line = "%-32s %-7s %12s" % (row, unit, fmt(plain))
        for kind in ("TLS", "auth"):
            v = statistics.median(by_kind[kind])
            ratio = plain / v if unit == "ms" else v / plain
            line += " %12s %6.2fx" % (fmt(v), ratio)
        print(line)
    print("ratio: against plaintext in the same runs; < 1 means slower (a higher latency or a lower rate)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--latency-n", type=int, default=2000)
    p.add_argument("--connections", type=int, default=300)
    p.add_argument("--dir", default=None, help="where to put the data (default: $TMPDIR)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
