"""The open-files budget, against a real broker started under a lowered RLIMIT_NOFILE: at start a broker raises its
soft limit (never lowering it, never past the hard one) to what it keeps back (the store's part, the replication
port's headroom and, in an MQTT cluster, its peers' links to it and its own to them: ``ServerConfig.fd_reserve``)
plus its connection cap, or DEFAULT_CONNECTION_ROOM when the cap follows the limit. A machine whose hard limit holds
that reserve plus its cap starts it; one descriptor fewer and it refuses to start with one line naming the limit,
the parts and what to change. And what that reserve is for: with clients filling the cap of a cluster's broker,
every link its peers may open still gets in."""

import functools
import os
import re
import resource
import socket
import subprocess
import sys

import gevent.socket
import pytest
import yaml

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.client.local import small_config
from metaq.mqttcluster.clientids.calls import PeerClient, PeerUnreachable
from tests.harness.broker import under_nofile, wait_for
from tests.harness.mqttcluster import Cluster, PaperMembers, cluster_config
from tests.harness.replication import stats

CAP = 100
#: RLIMIT_NOFILE's soft limit of a Debian or Ubuntu login and of a systemd service by default.
LOGIN_SOFT = 1024
CLUSTER_RESERVE = (limits.FD_RESERVE + mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM
                   + mqttcluster_limits.MQTT_CLUSTER_LINK_FDS)


def refused_under(broker, soft, hard=None):
    """The one line a broker started under ``soft`` (and ``hard``: None, the same, the machine allows no more)
    printed when it refused to start (exit 2)."""
    under_nofile(broker, soft, soft if hard is None else hard).start(expect_ready=False)
    assert broker.wait_exit() == 2, broker.log_text()
    lines = broker.log_text(since_start=True).strip().splitlines()
    assert len(lines) == 1 and "open-files limit (ulimit -n) is %d" % soft in lines[0], lines
    return lines[0]


def started_under(broker, soft, hard=None):
    """Start ``broker`` under ``soft`` and ``hard`` (None: the same) and wait until it is ready; it holds fewer
    descriptors than its soft limit then (``nofile_of``), which it returns."""
    under_nofile(broker, soft, soft if hard is None else hard).start()
    with broker.client() as c:
        c.put_ok("t", b"started", partition=0)
    nofile = nofile_of(broker)
    assert len(os.listdir("/proc/%d/fd" % broker.proc.pid)) < nofile[0]
    return nofile


def nofile_of(broker):
    """(soft, hard) open-files limit of the running broker, as the system shows it."""
    with open("/proc/%d/limits" % broker.proc.pid) as f:
        line = next(line for line in f if line.startswith("Max open files"))
    return tuple(int(n) for n in line.split()[3:5])


def cap_of(broker):
    """The connection cap the broker's ready line says it runs with."""
    return int(re.search(r"ready on .*max_connections=(\d+)", broker.log_text(since_start=True)).group(1))


def test_an_mqtt_cluster_broker_needs_room_for_its_peer_links_the_store_and_its_cap(broker_factory, tmp_path,
                                                                                  zk_connect):
    cfg = cluster_config(tmp_path / "b", 0, zk_connect, limits={"max_connections": CAP})
    b = broker_factory(cfg, start=False)
    reserve = CLUSTER_RESERVE
    assert (reserve
            == limits.FD_STORE_RESERVE + limits.REPLICATION_HEADROOM + 2 * 5
            * mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS)
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


def test_a_cluster_broker_under_a_login_soft_limit_raises_it_to_the_hard_one(broker_factory, tmp_path, zk_connect):
    """A login's ``ulimit -n`` of 1024 holds no MQTT cluster broker's reserve, its hard limit of 4096 does: the
    broker raises its soft limit to the hard one, says so, and its cap is the hard limit less its reserve."""
    b = broker_factory(cluster_config(tmp_path / "b", 0, zk_connect), start=False)
    assert started_under(b, LOGIN_SOFT, 4096) == (4096, 4096)
    assert cap_of(b) == 4096 - CLUSTER_RESERVE
    assert "raised the open-files limit (ulimit -n) from %d to 4096 (the hard limit)" % LOGIN_SOFT in b.log_text()


def test_a_cluster_broker_whose_hard_limit_is_its_soft_one_still_refuses_naming_each_part(broker_factory, tmp_path,
                                                                                        zk_connect):
    """soft = hard = 1024: nothing to raise to, and the refusal names each part and the hard limit to raise; a hard
    limit that holds the reserve and one connection, raised to from 1024, starts with a cap of one."""
    b = broker_factory(cluster_config(tmp_path / "b", 0, zk_connect), start=False)
    line = refused_under(b, LOGIN_SOFT)
    for words in ("limits.FD_STORE_RESERVE", "limits.REPLICATION_HEADROOM", "limits.MQTT_CLUSTER_PEER_HEADROOM",
                  "limits.MQTT_CLUSTER_LINK_FDS", "ulimit -Hn", "LimitNOFILE", "at least %d" % (CLUSTER_RESERVE + 1)):
        assert words in line, line
    under_nofile(b, LOGIN_SOFT, CLUSTER_RESERVE).start(expect_ready=False)  # raised to a hard limit one short
    assert b.wait_exit() == 2
    assert "open-files limit (ulimit -n) is %d" % CLUSTER_RESERVE in b.log_text(since_start=True)
    assert started_under(b, LOGIN_SOFT, CLUSTER_RESERVE + 1) == (CLUSTER_RESERVE + 1,) * 2
    assert cap_of(b) == 1


def test_a_plain_broker_under_a_login_soft_limit_makes_room_for_the_default_connections(broker_factory, tmp_path):
    """With the cap unset a broker raises its soft limit to its reserve plus DEFAULT_CONNECTION_ROOM when the hard
    limit allows it (not to the hard limit itself), with a cap set to its reserve plus that cap; one already
    higher is kept."""
    b = broker_factory(small_config(tmp_path / "data"), start=False)
    wanted = limits.FD_RESERVE + limits.DEFAULT_CONNECTION_ROOM
    assert started_under(b, LOGIN_SOFT, 20000) == (wanted, 20000)
    assert cap_of(b) == limits.DEFAULT_CONNECTION_ROOM
    assert "from %d to %d for" % (LOGIN_SOFT, wanted) in b.log_text(since_start=True)
    b.stop()
    assert started_under(b, wanted + 1, 20000) == (wanted + 1, 20000)  # never lowered
    assert cap_of(b) == limits.DEFAULT_CONNECTION_ROOM + 1
    assert "raised the open-files limit" not in b.log_text(since_start=True)
    b.stop()
    b.config["limits"]["max_connections"] = 2000
    assert started_under(b, LOGIN_SOFT, 20000) == (limits.FD_RESERVE + 2000, 20000)
    assert cap_of(b) == 2000


def test_check_config_judges_the_limit_a_start_would_raise_to(tmp_path):
    """``--check-config`` under a login's soft limit accepts a cluster broker's file its hard limit can hold (a
    start would raise to it) and refuses it when the hard limit cannot, as the start would."""
    cfg = cluster_config(tmp_path / "b", 0, "127.0.0.1:2181")
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(cfg))

    def check(hard):
        return subprocess.run([sys.executable, "-m", "metaq.server", "-c", str(path), "--check-config"],
                              capture_output=True, text=True, timeout=60,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (LOGIN_SOFT, hard)))

    assert check(CLUSTER_RESERVE + 1).returncode == 0
    refused = check(CLUSTER_RESERVE)
    assert refused.returncode == 2 and "at least %d" % (CLUSTER_RESERVE + 1) in refused.stderr, refused.stderr


#: The connection cap of the full broker below: its clients hold it all.
FULL_CAP = 8


def _peer_link(monkeypatch, broker_id, address, source):
    """A link of another master ``broker_id`` from the local address ``source`` to the replication port at
    ``address``, opened and proved by the cluster's own caller (one call answered); the client (its link kept
    open) and the answer, or the client and the PeerUnreachable that refused it."""
    with monkeypatch.context() as m:
        m.setattr(gevent.socket, "create_connection", functools.partial(gevent.socket.create_connection,
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
    are more than a test machine runs. The callers are members ZooKeeper names (``PaperMembers``, one per loopback
    address: a broker serves members only, ``mqttcluster.asks``)."""
    (b,) = Cluster(broker_factory, tmp_path, zk_connect, 1,
                   limits={"max_connections": FULL_CAP, "max_connections_per_address": FULL_CAP}).start().brokers
    address = "127.0.0.1:%d" % b.config["replication"]["port"]
    headroom = limits.REPLICATION_HEADROOM + mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM
    own_host = mqttcluster_limits.MQTT_CLUSTER_PEERS_PER_ADDRESS
    assert limits.REPLICATION_HEADROOM < own_host < headroom <= 2 * own_host  # what this test needs of the limits
    members = PaperMembers(zk_connect, [100, 500, 999])
    clients, held = [], []
    try:
        wait_for(lambda: stats(b).get("mqtt_cluster_members") == "4", 10, "the callers members")  # before the cap fills
        clients += [socket.create_connection(("127.0.0.1", b.port)) for _ in range(FULL_CAP)]
        with socket.create_connection(("127.0.0.1", b.port)) as extra:  # the cap is full
            assert b"too many connections: the limit is %d" % FULL_CAP in extra.recv(200)
        held = [_peer_link(monkeypatch, 100, address, "127.0.0.1") for _ in range(own_host)]
        held += [_peer_link(monkeypatch, 500, address, "127.0.0.2") for _ in range(headroom - own_host)]
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
        members.close()
