"""Replication benchmark: put throughput without a slave, with an async and with a sync slave; slave lag under
the maximum put load; catch-up speed of a slave started far behind.

    python -m bench.bench_replication [--runs 3] [--messages 20000] [--catchup-mb 200]

Real broker processes on 127.0.0.1 (a master and one slave, ``sync`` flush on
both: the defaults), 1 KiB messages put with 64 requests in flight, medians of
``--runs`` runs. The peer row is the same master with no slave, measured in
the same run. Lag is the master's own figure (``stats``: its replicable end
minus what the slave acknowledged), sampled every 50 ms during the async run;
messages = bytes / record size. Catch-up: ``--catchup-mb`` MB are written to a
master with no slave, then a slave with an empty data dir is started; the time
from its "ready" to holding the master's whole log gives MB/s. Not a test:
nothing here asserts.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.run import MSG, pipelined_puts  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, free_port, small_config  # noqa: E402
from metaq.protocol.stats import parse_replica  # noqa: E402

RECORD = MSG + 74  # a 1 KiB put's record in the log (header + topic "bench")


def broker(root, name, replication=None, slave_of=None):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    cfg = small_config(os.path.join(wd, "data"), store=full_size_store(flush="sync"),
                       limits={"max_body_bytes": 1 << 20}, topics=[{"name": "*", "partitions": 4}])
    if replication:
        cfg["replication"] = replication
    args = ["--slave-of", slave_of, "--slave-id", "1"] if slave_of else []
    return BrokerProcess(wd, cfg, args).start(timeout=120)


def stats(b):
    with b.client() as c:
        return c.stats_dict()


def wait_caught_up(master, slave, timeout=600):
    end = int(stats(master)["log_end_position"])
    deadline = time.monotonic() + timeout
    while int(stats(slave)["log_end_position"]) < end:
        if time.monotonic() > deadline:
            raise TimeoutError("slave not caught up")
        time.sleep(0.05)


def lag_bytes(master):
    line = stats(master).get("replication_slave1")
    return parse_replica(line).lag_bytes if line else None


def pair(root, name, mode):
    rport = free_port()
    m = broker(root, name + "-m", {"port": rport, "mode": mode, "sync_timeout_ms": 10000})
    s = broker(root, name + "-s", slave_of="127.0.0.1:%d" % rport)
    while stats(m)["replication_slaves"] != "1":
        time.sleep(0.05)
    return m, s


def put_rate(root, name, mode, n, samples=None):
    """msgs/s of pipelined puts to a master (mode None: no slave); lag samples appended to ``samples``."""
    if mode is None:
        m, s = broker(root, name), None
    else:
        m, s = pair(root, name, mode)
    done = threading.Event()

    def sample():
        while not done.is_set():
            value = lag_bytes(m)
            if value is not None:
                samples.append(value)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True) if samples is not None else None
    try:
        pipelined_puts(m.port, 2000)  # warm up
        if sampler:
            sampler.start()
        rate = pipelined_puts(m.port, n)
        done.set()
        if sampler:
            sampler.join()
        if s is not None:
            wait_caught_up(m, s)
        return rate
    finally:
        done.set()
        for b in (s, m):
            if b is not None:
                b.stop()
                shutil.rmtree(b.workdir, ignore_errors=True)


def catch_up(root, name, mb):
    rport = free_port()
    m = broker(root, name + "-m", {"port": rport})
    s = None
    try:
        n = int(mb * (1 << 20) / RECORD)
        for start in range(0, n, 50_000):
            pipelined_puts(m.port, min(50_000, n - start), depth=256)
        size = int(stats(m)["log_end_position"])
        s = broker(root, name + "-s", slave_of="127.0.0.1:%d" % rport)
        t = time.perf_counter()
        wait_caught_up(m, s)
        return size / (1 << 20) / (time.perf_counter() - t)
    finally:
        for b in (s, m):
            if b is not None:
                b.stop()
                shutil.rmtree(b.workdir, ignore_errors=True)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-repl-", dir=args.dir)
    rates = {"none": [], "async": [], "sync": []}
    lags, catchups = [], []
    try:
        for i in range(args.runs):
            rates["none"].append(put_rate(root, "p%d" % i, None, args.messages))
            rates["async"].append(put_rate(root, "a%d" % i, "async", args.messages, lags))
            rates["sync"].append(put_rate(root, "s%d" % i, "sync", args.messages))
            catchups.append(catch_up(root, "c%d" % i, args.catchup_mb))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    peer = statistics.median(rates["none"])
    print("replication benchmark: 1 KiB puts, 64 in flight, flush sync on master and slave, medians of %d runs"
          % args.runs)
    print("%-38s %12s %10s" % ("put throughput", "msgs/s", "vs none"))
    for key, label in (("none", "master without slave (peer)"), ("async", "async replication, 1 slave"),
                       ("sync", "sync replication, 1 slave")):
        rate = statistics.median(rates[key])
        print("%-38s %12.0f %9.2fx" % (label, rate, rate / peer))
    lags.sort()
    if lags:
        p50, p99, top = lags[len(lags) // 2], lags[min(len(lags) - 1, int(0.99 * len(lags)))], lags[-1]
        print("%-38s %12s %10s %10s" % ("async slave lag under that load", "p50", "p99", "max"))
        print("%-38s %12d %10d %10d" % ("  bytes (master's figure)", p50, p99, top))
        print("%-38s %12d %10d %10d" % ("  messages (bytes / record size)", p50 // RECORD, p99 // RECORD,
                                        top // RECORD))
    print("%-38s %12.1f MB/s" % ("catch-up from %d MB behind" % args.catchup_mb, statistics.median(catchups)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--catchup-mb", type=int, default=200)
    p.add_argument("--dir", default=None, help="where the brokers' data goes (default: the system temp dir)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
