"""RocketMQ remoting benchmark: send and pull rates with the official client beside the text protocol.

    python -m bench.bench_remoting [--runs 3] [--messages 5000]

One real broker process per run on 127.0.0.1 (``async`` flush, so the figures
are protocol and broker costs, not fsync latency), topic with 4 partitions,
1 KiB messages, medians of ``--runs`` runs:

* send: the official client (PyPI ``rocketmq==0.4.4``, C++ core, in a
  subprocess) sends ``--messages`` with ``send_sync``, one at a time; the peer
  row is the same number of text ``put``s, one at a time, on one connection;
* pull: a push consumer of the official client receives them all (rate from
  its first to its last message, so start-up and rebalancing are left out);
  peers: our own codec pulling over remoting (32 messages per PULL, the
  client's default batch) and text ``get``s of 32 KiB (about 32 messages),
  both one request at a time over the 4 partitions.

Not a test: nothing here asserts. Without the official client installed its rows are skipped.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.rocketmq_peer import run_peer  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, ns_of, rmq_config  # noqa: E402
from metaq.client.raw import RemotingClient, TextClient, pull_fields  # noqa: E402
from metaq.protocol import events as ev  # noqa: E402
from metaq.protocol.rocketmq.remoting import RequestCode  # noqa: E402

MSG = 1024
PARTS = 4


def have_official_client():
    try:
        import rocketmq  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def start(root, name):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    cfg = rmq_config(os.path.join(wd, "data"), store=full_size_store(flush="async"),
                     topics=[{"name": "*", "partitions": PARTS}])
    return BrokerProcess(wd, cfg).start()


def official_send(b, home, n):
    lines = run_peer(home, "produce", "--ns", ns_of(b), "--topic", "rq", "--count", n, "--size", MSG, "--quiet",
                     timeout=600)
    return n / lines[-1]["seconds"]


def official_pull(b, home, n):
    lines = run_peer(home, "consume", "--ns", ns_of(b), "--topic", "rq", "--group", "bench", "--expect", n,
                     "--quiet", "--timeout", 300, timeout=600)
    summary = [line for line in lines if "received" in line][0]
    return summary["received"] / max(1e-6, summary["last_t"] - summary["first_t"])


def text_send(b, topic, n):
    payload = b"t" * MSG
    with TextClient("127.0.0.1", b.port) as c:
        t = time.perf_counter()
        for i in range(n):
            r = c.put(topic, payload, partition=i % PARTS)
            assert r.code == 200, r
        return n / (time.perf_counter() - t)


def text_pull(b, topic, n):
    got = 0
    with TextClient("127.0.0.1", b.port) as c:
        t = time.perf_counter()
        for part in range(PARTS):
            offset = 0
            while True:
                r = c.get(topic, part, offset, max_size=32 * (MSG + 20))
                if not isinstance(r, ev.Value):
                    break
                count = _records(r.body)
                got += count
                offset += count
        return got / (time.perf_counter() - t)


def _records(body):
    from metaq.protocol.message import iter_records

    return sum(1 for _ in iter_records(body, verify=False))


def codec_pull(b, topic):
    got = 0
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        t = time.perf_counter()
        for part in range(PARTS):
            offset = 0
            while True:
                r = rc.call(RequestCode.PULL_MESSAGE, pull_fields(topic, part, offset, group="codec", sys_flag=4))
                if r.code != 0:
                    break
                nxt = int(r.ext_fields["nextBeginOffset"])
                got += nxt - offset
                offset = nxt
        return got / (time.perf_counter() - t)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-remoting-", dir=args.dir)
    official = have_official_client()
    rows = {k: [] for k in ("osend", "tsend", "opull", "cpull", "tpull")}
    try:
        for run_no in range(args.runs):
            b = start(root, "r%d" % run_no)
            home = os.path.join(root, "home%d" % run_no)
            if official:
                rows["osend"].append(official_send(b, home, args.messages))
            rows["tsend"].append(text_send(b, "tq", args.messages))
            if official:
                rows["opull"].append(official_pull(b, home, args.messages))
            rows["cpull"].append(codec_pull(b, "tq"))
            rows["tpull"].append(text_pull(b, "tq", args.messages))
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) if v else None for k, v in rows.items()}
    print("RocketMQ remoting vs text protocol, %d x 1 KiB messages, 4 partitions, async flush, median of %d runs"
          % (args.messages, args.runs))
    print("%-58s %12s" % ("measure", "msgs/s"))
    for key, label in (("osend", "send: official client send_sync, one at a time"),
                       ("tsend", "send: text put, one at a time (peer)"),
                       ("opull", "pull: official client push consumer"),
                       ("cpull", "pull: remoting PULL of 32, our codec, one at a time"),
                       ("tpull", "pull: text get of 32 KiB, one at a time (peer)")):
        value = med[key]
        print("%-58s %12s" % (label, "%.0f" % value if value is not None else "n/a (client missing)"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--dir", default=None, help="where the data dirs go (default: the temp dir)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
