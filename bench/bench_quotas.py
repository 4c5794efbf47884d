"""What the quotas per user cost on pipelined puts: this checkout against a peer checkout, in alternation.

    python -m bench.bench_quotas --peer /path/to/other/checkout [--runs 6] [--messages 200000]

Each run starts one broker of each checkout (``PYTHONPATH``; which goes first alternates from run to run), with
authentication on (a permissions file with one user; the quotas at their defaults, no rate set) and
``flush=async``, and measures on each, as its user: pipelined plain puts (depth 64, 1 KiB) and pipelined
``put_idem`` of one producer (depth 64, 1 KiB, the burst path). The broker's CPU µs per message is read from
``/proc`` beside each rate (on a shared machine it moves less than the rates). Prints medians and the ratio
to the peer (this / peer: below 1 is slower). Not in ``make bench``; nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.configs import full_size_store  # noqa: E402
from bench.run import pipelined  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402
from metaq.idempotence.wire import IdempotentPut  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.checksum import metaq_checksum  # noqa: E402
from metaq.protocol.text import serialize  # noqa: E402

HERE = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
USER, SECRET = "bench", "bench-secret-0123456789"
TOPIC = "bench"
MSG = 1024


def start(root, name, code):
    """A broker of the checkout at ``code`` (its modules first on ``PYTHONPATH``), authentication on."""
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    acl = os.path.join(wd, "acl.yaml")
    with open(os.open(acl, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        yaml.safe_dump({"users": {USER: {"secret": SECRET, "topics": {TOPIC: "pub|sub"}}}}, f)
    cfg = small_config(os.path.join(wd, "data"), store=full_size_store(flush="async"),
                       topics=[{"name": "*", "partitions": 1}], security={"acl_file": acl})
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = code
    try:
        return BrokerProcess(wd, cfg).start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def frames(n, kind, pid):
    payload = b"p" * MSG
    crc = metaq_checksum(payload)
    if kind == "put":
        return [serialize(ev.Put(TOPIC, 0, 0, payload, i, crc)) for i in range(n)]
    return [serialize(IdempotentPut(TOPIC, 0, 0, payload, i, crc, pid, i)) for i in range(n)]


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(b, kind, n, pid):
    fs = frames(n, kind, pid)
    before = cpu_s(b.proc.pid)
    rate = pipelined(b.port, fs, 64, auth=(USER, SECRET))
    return rate, (cpu_s(b.proc.pid) - before) / n * 1e6


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-quotas-", dir=args.dir)
    checkouts = (("this", HERE), ("peer", os.path.abspath(args.peer)))
    results = {}  # (kind, checkout) -> [(rate, cpu µs)]
    try:
        for r in range(args.runs):
            order = checkouts if r % 2 == 0 else checkouts[::-1]
            for name, code in order:
                b = start(root, "%s-%d" % (name, r), code)
                try:
                    measure(b, "put", 5000, 1)  # warm: the partition made, the first segment mapped
                    for kind in ("put", "put_idem"):
                        value = measure(b, kind, args.messages, 2 + r)
                        results.setdefault((kind, name), []).append(value)
                        print("run %d %-4s %-8s %9.0f msgs/s %6.1f µs/msg" % (r + 1, name, kind, *value),
                              file=sys.stderr, flush=True)
                finally:
                    b.stop()
                    shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("Quotas on pipelined puts (depth 64, 1 KiB, flush=async, authentication on): medians of %d runs, "
          "alternating" % args.runs)
    head = "%-10s %12s %12s %7s %10s %10s %7s" % ("puts", "this msgs/s", "peer msgs/s", "ratio", "this µs",
                                                   "peer µs", "ratio")
    print(head)
    print("-" * len(head))
    for kind in ("put", "put_idem"):
        this, peer = results[(kind, "this")], results[(kind, "peer")]
        tr, pr = statistics.median(v[0] for v in this), statistics.median(v[0] for v in peer)
        tc, pc = statistics.median(v[1] for v in this), statistics.median(v[1] for v in peer)
        print("%-10s %12.0f %12.0f %6.3fx %10.1f %10.1f %6.3fx" % (kind, tr, pr, tr / pr, tc, pc, pc / tc))
    print("ratio: this / peer for rates, peer / this for CPU; below 1 means this checkout is slower")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", required=True, help="the other checkout (its C helper built in place)")
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--dir", default=None, help="where to put the data (default: $TMPDIR)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
