"""README "Replication › Limits": "Probing a dead master costs one connection attempt per fetch after each
backoff". A consumer in ZooKeeper mode reads from the slave while its killed master is still registered (its
session not expired yet); every connection attempt the consumer's process makes to the dead master's port is
seen by a `socket.connect` audit hook (the real attempts, against a port that refuses)."""

import sys
import threading
import time
from itertools import pairwise

from metaq.client import Consumer
from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.replication import caught_up, master_config, stats

TOPIC = "t-probe"
ATTEMPTS = []  # (time.monotonic(), port) of each socket.connect of this process
WATCHING = threading.Event()


def _audit(event, args):
    if event == "socket.connect" and WATCHING.is_set():
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2:
            ATTEMPTS.append((time.monotonic(), address[1]))


HOOKED = []


def watch_connects():
    """Install the hook once (an audit hook cannot be removed; it records only while WATCHING is set)."""
    if not HOOKED:
        sys.addaudithook(_audit)
        HOOKED.append(True)


def test_a_dead_but_registered_master_is_probed_once_per_backoff_not_per_fetch(broker_factory, tmp_path,
                                                                               zk_connect):
    watch_connects()
    rport = free_port()
    mcfg = master_config(tmp_path / "m", rport)
    mcfg["zk"] = {"connect": zk_connect, "session_timeout_ms": 40000}  # stays registered long after a kill -9
    master = broker_factory(mcfg, workdir=tmp_path / "m")
    slave = broker_factory(small_config(str(tmp_path / "s" / "data"), zk={"connect": zk_connect}),
                           workdir=tmp_path / "s", extra_args=["--slave-of", "127.0.0.1:%d" % rport,
                                                               "--slave-id", "1"])
    with master.client() as c:
        for i in range(20):
            c.put_ok(TOPIC, b"m%02d" % i, i % 2)
    caught_up(master, slave)
    got = []
    consumer = Consumer("g-probe", zk_connect=zk_connect, long_poll_ms=200, commit_interval=0.3)
    consumer.subscribe(TOPIC, lambda m: got.append(m.body))
    consumer.start()
    try:
        wait_for(lambda: len(got) >= 20, 30, "the consumer reads everything from the master")
        master.kill()
        WATCHING.set()
        gets_before = int(stats(slave)["cmd_get"])
        start = time.monotonic()
        # fetches go to the slave meanwhile (long polls of 200 ms that find nothing new): wait for many
        wait_for(lambda: int(stats(slave)["cmd_get"]) - gets_before >= 60, 60, "60 fetches from the slave")
        WATCHING.clear()
        took = time.monotonic() - start
        fetches = int(stats(slave)["cmd_get"]) - gets_before
    finally:
        WATCHING.clear()
        consumer.close()
    probes = [t for t, port in ATTEMPTS if port == master.port]
    gaps = [b - a for a, b in pairwise(probes)]
    print("\n%d fetches from the slave in %.1f s; %d connection attempts to the dead master, gaps %s"
          % (fetches, took, len(probes), ["%.2f" % g for g in gaps]))
    assert probes, "the dead master was never probed: the consumer would never return to it"
    assert len(probes) < fetches / 4, (len(probes), fetches)  # not one per fetch
    # each after its backoff, which doubles while the master stays dead (0.1 s, 0.2 s, ... up to 2 s); a probe rides
    # on the next fetch once its backoff has passed, so a gap may be longer (a busy machine), never shorter
    assert all(g >= min(0.1 * 2 ** k, 2.0) * 0.9 for k, g in enumerate(gaps)), gaps
