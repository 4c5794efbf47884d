"""Failover benchmark (``replication.ha: auto``, issue 17 point 7): from the master's kill -9, and from its clean
stop (SIGTERM), to the first acknowledged write on the new master; a 2-member ``async`` group and a 3-member
``sync`` group.

    python -m bench.bench_failover [--rounds 5] [--session-ms 4000]

A real ZooKeeper (Debian's package, started by ``tests/harness/zookeeper.py``: the one exception to "bench/
imports nothing from tests/") and real brokers on 127.0.0.1, every member with ``ha: auto`` and the given
ZooKeeper session timeout (lease: half of it; election settle 500 ms: the defaults). One producer of the client
library (ZooKeeper mode, ``send_timeout`` 2 s, ``retry_deadline`` 30 s) sends a small message every 10 ms, one
at a time. Per round, on a healthy group (one elected master, every member following it, sync: all in its
in-sync set): 1 s of load, then the master is killed (or stopped), and the time of these events is recorded:

* ``leader gone``: ZooKeeper's ``leader`` node of the broker id disappears (a poll every 20 ms): the session
  expired (kill) or was closed (clean stop);
* ``elected``: the ``leader`` node exists again (the same poll): a member won the election (it then begins its
  epoch and switches to master; its registry then names it in MetaQ's master node, where the producer looks);
* ``first ack``: the first acknowledgement the producer got of a message **written by the new master**: the
  broker's message id carries the wall-clock millisecond of its write, and only the new master writes after
  the boundary: the kill's return (the old master is dead), or the leader node seen gone (a clean stop revokes
  the old master's lease before it closes its session). A reply read just after the fault, of a message the
  old master wrote before it, does not count.

The victim is restarted once the first acknowledgement is in (it rejoins as a slave by itself). p50 and max
over ``--rounds`` rounds per group and fault, printed as a markdown table. Not a test: nothing here asserts.
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

from kazoo.client import KazooClient  # noqa: E402

from metaq.client import Message, Producer  # noqa: E402
from metaq.client.local import BrokerProcess, free_port, small_config  # noqa: E402
from metaq.protocol.msgid import TIMESTAMP_SHIFT, TWEPOCH  # noqa: E402
from tests.harness.zookeeper import ZooKeeperProcess  # noqa: E402

TOPIC = "t-failover"
PACE_S = 0.01
LEADER = "/meta/brokers/ids/7/leader"
HEALTHY_S = 120.0


def stats(b):
    with b.client(timeout=2.0) as c:
        return c.stats_dict()


def wait(predicate, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value is not None and value is not False:
            return value
        time.sleep(interval)
    raise TimeoutError("not within %.0f s: %s" % (timeout, what))


class Group:
    def __init__(self, root, zk_connect, mode, n, session_ms):
        self.mode, self.n = mode, n
        self.members = []
        for i in range(n):
            wd = os.path.join(root, "%s-m%d" % (mode, i))
            os.makedirs(wd, exist_ok=True)
            cfg = small_config(os.path.join(wd, "data"),
                               replication={"ha": "auto", "port": free_port(), "slave_id": i, "mode": mode,
                                            "sync_timeout_ms": 3000},
                               zk={"connect": zk_connect, "session_timeout_ms": session_ms,
                                   "connection_timeout_ms": 5000})
            self.members.append(BrokerProcess(wd, cfg))
        for b in self.members:
            b.start(timeout=120)

    def leading(self, exclude=None):
        """The member that says it leads (None: none, or more than one)."""
        found = []
        for i, b in enumerate(self.members):
            if i == exclude or b.proc is None or b.proc.poll() is not None:
                continue
            try:
                st = stats(b)
            except OSError:
                continue
            if st["replication_role"] == "master" and st["replication_leading"] == "true":
                found.append(i)
        return found[0] if len(found) == 1 else None

    def healthy(self):
        def check():
            master = self.leading()
            if master is None:
                return None
            want = stats(self.members[master])
            for i, b in enumerate(self.members):
                if i != master:
                    st = stats(b)
                    if st["replication_role"] != "slave" or st.get("replication_link") != "connected":
                        return None
            if self.mode == "sync" and want["replication_insync"] != ",".join(map(str, range(self.n))):
                return None
            return master + 1  # not 0: wait() takes 0 for "not yet"
        return wait(check, HEALTHY_S, "a healthy %s group" % self.mode) - 1

    def close(self):
        for b in self.members:
            b.kill()


def written_at(msg_id):
    """The wall-clock time (s) at which a broker assigned ``msg_id`` (MetaQ's ids start with the millisecond)."""
    return ((msg_id >> TIMESTAMP_SHIFT) + TWEPOCH) / 1000.0


class Load:
    """One producer thread; ``acks``: (monotonic time received, wall-clock time the broker wrote the message)."""

    def __init__(self, zk_connect, session_ms):
        self.acks = []
        self.failures = 0
        self._stop = threading.Event()
        self.producer = Producer(zk_connect=zk_connect, send_timeout=2.0, retry_deadline=30.0,
                                 zk_session_timeout=session_ms / 1000.0)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        seq = 0
        while not self._stop.is_set():
            seq += 1
            result = self.producer.send(Message(TOPIC, b"m-%d" % seq))
            if result.success:
                self.acks.append((time.monotonic(), written_at(result.msg_id)))
            else:
                self.failures += 1
            self._stop.wait(PACE_S)

    def first_written_after(self, wall, timeout=HEALTHY_S):
        """When the first acknowledgement of a message written after wall-clock ``wall`` came (monotonic; ``acks``
        grows in the order received)."""
        return wait(lambda: next((got for got, written in self.acks if written > wall), None), timeout,
                    "an acknowledgement of a message written after the fault")

    def close(self):
        self._stop.set()
        self.thread.join(60)
        self.producer.close()


class LeaderWatch:
    """Polls the leader node every 20 ms; ``gone_after(t)``: when its owner was first seen gone after ``t``;
    ``back_after(t)``: when a (new) owner was first seen after ``t``."""

    def __init__(self, zk_connect):
        self.zk = KazooClient(hosts=zk_connect)
        self.zk.start(15)
        self.absent, self.present = [], []  # (monotonic, wall-clock) of each change seen
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        last = None  # the session that owned the leader node at the last poll
        while not self._stop.is_set():
            try:
                stat = self.zk.exists(LEADER)
            except Exception:  # noqa: BLE001 - a poll that failed is a poll missed
                time.sleep(0.02)
                continue
            owner = stat.ephemeralOwner if stat is not None else None
            if owner != last:  # another owner without a gap seen: the old node went between two polls
                now = (time.monotonic(), time.time())
                if last is not None:
                    self.absent.append(now)
                if owner is not None:
                    self.present.append(now)
            last = owner
            time.sleep(0.02)

    def gone_after(self, t):
        return next((a for a in self.absent if a[0] >= t), (None, None))

    def back_after(self, t):
        return next((a[0] for a in self.present if a[0] >= t), None)

    def close(self):
        self._stop.set()
        self.thread.join(5)
        self.zk.stop()
        self.zk.close()


def one_round(group, load, watch, kind):
    master = group.healthy()
    time.sleep(1.0)
    victim = group.members[master]
    if kind == "kill -9":
        victim.kill()
        t, boundary = time.monotonic(), time.time()
        first = load.first_written_after(boundary)
        gone, _wall = watch.gone_after(t)
    else:
        t = time.monotonic()
        victim.stop(timeout=60)
        gone, boundary = wait(lambda: watch.gone_after(t)[0] is not None and watch.gone_after(t), HEALTHY_S,
                              "the leader node gone")
        first = load.first_written_after(boundary)
    back = watch.back_after(gone) if gone is not None else None
    victim.start(timeout=120)
    return {"leader gone": None if gone is None else gone - t, "elected": None if back is None else back - t,
            "first ack": first - t}


def measure(root, zk, mode, n, rounds, session_ms):
    connect = zk.chroot()
    group = Group(root, connect, mode, n, session_ms)
    load = watch = None
    out = {"kill -9": [], "clean stop": []}
    try:
        group.healthy()
        load = Load(connect, session_ms)
        watch = LeaderWatch(connect)
        wait(lambda: len(load.acks) >= 50, HEALTHY_S, "first acknowledgements")
        for r in range(rounds):
            for kind in ("kill -9", "clean stop"):
                row = one_round(group, load, watch, kind)
                out[kind].append(row)
                print("  %s, %d members, round %d, %s: %s" % (mode, n, r + 1, kind, ", ".join(
                    "%s %s" % (k, "-" if v is None else "%.2f s" % v) for k, v in row.items())), flush=True)
    finally:
        if watch is not None:
            watch.close()
        if load is not None:
            load.close()
            out["failures"] = load.failures
        group.close()
    return out


def cell(rows, key):
    xs = [r[key] for r in rows if r[key] is not None]
    if not xs:
        return "-", "-"
    return "%.2f" % statistics.median(xs), "%.2f" % max(xs)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-failover-", dir=args.dir)
    zk = ZooKeeperProcess(os.path.join(root, "zk"))
    os.makedirs(zk.workdir, exist_ok=True)
    zk.start()
    results = []
    try:
        for mode, n in (("async", 2), ("sync", 3)):
            results.append((mode, n, measure(root, zk, mode, n, args.rounds, args.session_ms)))
    finally:
        zk.stop()
        shutil.rmtree(root, ignore_errors=True)
    print()
    print("failover benchmark: ha: auto, ZooKeeper session %d ms (lease %d ms, settle 500 ms), one producer "
          "(ZooKeeper mode) sending every %d ms; p50 / max seconds after the fault over %d rounds"
          % (args.session_ms, args.session_ms // 2, PACE_S * 1000, args.rounds))
    print()
    print("| group | fault | leader node gone | new master elected | first ack on the new master | failed sends |")
    print("|---|---|---:|---:|---:|---:|")
    for mode, n, out in results:
        for kind in ("kill -9", "clean stop"):
            rows = out[kind]
            print("| %s, %d members | %s | %s | %s | %s | %s |" % (
                mode, n, kind, " / ".join(cell(rows, "leader gone")), " / ".join(cell(rows, "elected")),
                " / ".join(cell(rows, "first ack")), out.get("failures", "-") if kind == "kill -9" else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="kills and clean stops per group (default 5 each)")
    p.add_argument("--session-ms", type=int, default=4000, help="zk.session_timeout_ms of the members")
    p.add_argument("--dir", default=None, help="where the data goes (default: the system temp dir)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
