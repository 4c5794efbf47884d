"""The open-files budget, against a real broker started under a lowered RLIMIT_NOFILE: a broker whose limit holds
what it keeps back (the store's part, the replication port's headroom and, in an MQTT cluster, its links to every
peer: ``ServerConfig.fd_reserve``) plus its connection cap starts; one descriptor fewer and it refuses to start with
one line naming the limit, the parts and what to change."""

import os

from metaq import limits
from metaq.client.local import small_config
from tests.harness.broker import child_nofile
from tests.harness.mqttcluster import cluster_config

CAP = 100


def start_under(broker, nofile):
    with child_nofile(nofile):
        broker.start(expect_ready=False)


def refused_under(broker, nofile):
    """The one line a broker started under ``nofile`` printed when it refused to start (exit 2)."""
    start_under(broker, nofile)
    assert broker.wait_exit() == 2, broker.log_text()
    lines = broker.log_text(since_start=True).strip().splitlines()
    assert len(lines) == 1 and "open-files limit (ulimit -n) is %d" % nofile in lines[0], lines
    return lines[0]


def started_under(broker, nofile):
    """Start ``broker`` under ``nofile`` and wait until it is ready; it holds fewer descriptors than that."""
    with child_nofile(nofile):
        broker.start()
    with broker.client() as c:
        c.put_ok("t", b"started", partition=0)
    assert len(os.listdir("/proc/%d/fd" % broker.proc.pid)) < nofile


def test_an_mqtt_cluster_broker_needs_room_for_its_peer_links_the_store_and_its_cap(broker_factory, tmp_path,
                                                                                  zk_connect):
    cfg = cluster_config(tmp_path / "b", 0, zk_connect, limits={"max_connections": CAP})
    b = broker_factory(cfg, start=False)
    reserve = limits.FD_RESERVE + limits.MQTT_CLUSTER_LINK_FDS
    assert reserve == limits.FD_STORE_RESERVE + limits.REPLICATION_HEADROOM + 5 * limits.MQTT_CLUSTER_MAX_PEERS
    line = refused_under(b, reserve + CAP - 1)
    for words in ("limits.FD_STORE_RESERVE", "limits.REPLICATION_HEADROOM", "limits.MQTT_CLUSTER_LINK_FDS",
                  "limits.max_connections is %d" % CAP, "at least %d" % (reserve + CAP)):
        assert words in line, line
    started_under(b, reserve + CAP)


def test_a_broker_whose_cap_follows_the_limit_needs_room_for_one_connection(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data"), start=False)
    line = refused_under(b, limits.FD_RESERVE)
    assert "MQTT_CLUSTER_LINK_FDS" not in line and "at least %d" % (limits.FD_RESERVE + 1) in line, line
    started_under(b, limits.FD_RESERVE + 1)
