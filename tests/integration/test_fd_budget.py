"""The open-files budget, against a real broker started under a lowered RLIMIT_NOFILE: a broker whose limit holds
what it keeps back (the store's part, the replication port's headroom and, in an MQTT cluster, its peers' links to
it and its own to them: ``ServerConfig.fd_reserve``) plus its connection cap starts; one descriptor fewer and it
refuses to start with one line naming the limit, the parts and what to change. And what that reserve is for: with
clients filling the cap of a cluster's broker, every link its peers may open still gets in."""

import functools
import os
import socket

import pytest

from metaq import limits
from metaq.client.local import small_config
from metaq.mqttcluster.calls import PeerClient, PeerUnreachable
from tests.harness.broker import child_nofile, wait_for
from tests.harness.mqttcluster import Cluster, cluster_config

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
    reserve = limits.FD_RESERVE + limits.MQTT_CLUSTER_PEER_HEADROOM + limits.MQTT_CLUSTER_LINK_FDS
    assert reserve == limits.FD_STORE_RESERVE + limits.REPLICATION_HEADROOM + 2 * 5 * limits.MQTT_CLUSTER_MAX_PEERS
    line = refused_under(b, reserve + CAP - 1)
    for words in ("limits.FD_STORE_RESERVE", "limits.REPLICATION_HEADROOM", "limits.MQTT_CLUSTER_PEER_HEADROOM",
                  "limits.MQTT_CLUSTER_LINK_FDS", "limits.max_connections is %d" % CAP,
                  "at least %d" % (reserve + CAP)):
        assert words in line, line
    started_under(b, reserve + CAP)


def test_a_broker_whose_cap_follows_the_limit_needs_room_for_one_connection(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data"), start=False)
    line = refused_under(b, limits.FD_RESERVE)
    assert "MQTT_CLUSTER" not in line and "at least %d" % (limits.FD_RESERVE + 1) in line, line
    started_under(b, limits.FD_RESERVE + 1)


#: The connection cap of the full broker below: its clients hold it all.
FULL_CAP = 8


def _peer_link(monkeypatch, broker_id, address, source):
    """A link of another master ``broker_id`` from the local address ``source`` to the replication port at
    ``address``, opened and proved by the cluster's own caller (one call answered); the client (its link kept
    open) and the answer, or the client and the PeerUnreachable that refused it."""
    with monkeypatch.context() as m:
        m.setattr(socket, "create_connection", functools.partial(socket.create_connection,
                                                                 source_address=(source, 0)))
        client = PeerClient(broker_id, None, timeout_s=10)
        try:
            return client, client.call(address, {"op": "none"})
        except PeerUnreachable as exc:
            return client, exc


@pytest.mark.fault
def test_clients_filling_the_cap_of_a_cluster_broker_keep_none_of_its_peers_links_out(broker_factory, tmp_path,
                                                                                     zk_connect, monkeypatch):
    """Clients hold the whole connection cap of an MQTT cluster's broker; then every link its peers may open
    (MQTT_CLUSTER_PEER_HEADROOM, besides REPLICATION_HEADROOM's) still gets in, one past them is refused saying
    why. The links are opened and proved as the cluster's brokers open them (``PeerClient``, from two loopback
    addresses: one host holds at most MQTT_CLUSTER_PEERS_PER_ADDRESS), not by that many real brokers: the
    limits behind them (MQTT_CLUSTER_MAX_PEERS, MQTT_CLUSTER_PEER_CONNECTIONS) are not settings, and 64 brokers
    are more than a test machine runs."""
    (b,) = Cluster(broker_factory, tmp_path, zk_connect, 1,
                   limits={"max_connections": FULL_CAP, "max_connections_per_address": FULL_CAP}).start().brokers
    address = "127.0.0.1:%d" % b.config["replication"]["port"]
    headroom = limits.REPLICATION_HEADROOM + limits.MQTT_CLUSTER_PEER_HEADROOM
    own_host = limits.MQTT_CLUSTER_PEERS_PER_ADDRESS
    assert limits.REPLICATION_HEADROOM < own_host < headroom <= 2 * own_host  # what this test needs of the limits
    clients = [socket.create_connection(("127.0.0.1", b.port)) for _ in range(FULL_CAP)]
    held = []
    try:
        with socket.create_connection(("127.0.0.1", b.port)) as extra:  # the cap is full
            assert b"too many connections: the limit is %d" % FULL_CAP in extra.recv(200)
        held = [_peer_link(monkeypatch, 100 + i, address, "127.0.0.1") for i in range(own_host)]
        held += [_peer_link(monkeypatch, 500 + i, address, "127.0.0.2") for i in range(headroom - own_host)]
        refused = [(i, a) for i, (_c, a) in enumerate(held) if isinstance(a, PeerUnreachable)]
        assert refused == [], (len(refused), refused[:3], b.log_text()[-2000:])
        past, answer = _peer_link(monkeypatch, 999, address, "127.0.0.3")  # one past the headroom
        held.append((past, answer))
        assert isinstance(answer, PeerUnreachable), answer
        wait_for(lambda: "on the replication port: too many connections: the limit is %d" % (FULL_CAP + headroom)
                 in b.log_text(), 10, "the refusal logged")
    finally:
        for client, _a in held:
            client.close()
        for s in clients:
            s.close()
