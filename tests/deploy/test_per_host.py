"""fab over real SSH with ``per_host:``: one broker per core of 127.0.0.1 and 127.0.0.2, a master and a slave per
group, each slave on the other "host" than its master. Both hosts are this machine (Debian's sshd on both
addresses); the brokers register in a real ZooKeeper."""

import os
import signal
import subprocess

import pytest

from metaq.client import Message, Producer
from metaq.client.raw import TextClient
from metaq.deploy import agent
from metaq.deploy.layout import Layout
from tests.deploy.test_cluster import listening, status_table
from tests.harness.broker import wait_for
from tests.harness.devcluster import free_base
from tests.harness.fab import host_python, run_fab, write_inventory

pytestmark = pytest.mark.slow
pytest.importorskip("fabric")

HOSTS = ["127.0.0.1", "127.0.0.2"]


def inventory(root, sshd, zk_connect):
    return {
        "cluster": "percore",
        "defaults": {
            "ssh_user": "root", "ssh_port": sshd.port, "ssh_key": sshd.key, "python": host_python(),
            "zk_connect": zk_connect, "start_timeout_s": 60, "stop_timeout_s": 30, "port": free_base(2),
            "install_dir": "%s/opt/metaq" % root, "data_dir": "%s/var/metaq" % root,
            "server": {
                "store": {"segment_size": 1 << 20, "index_file_units": 4096, "flush": "sync",
                          "checkpoint_interval_ms": 200},
                "limits": {"max_body_bytes": 256 * 1024},
                "zk": {"session_timeout_ms": 6000, "connection_timeout_ms": 5000},
                "topics": [{"name": "*", "partitions": 2}],
            },
        },
        "per_host": {"hosts": HOSTS, "slaves": 1},
    }


def stats(b):
    with TextClient(b["host"], b["port"]) as c:
        return c.stats_dict()


def test_fab_deploys_a_broker_per_core_with_each_slave_on_another_host(sshd, zk_server, tmp_path):
    cores = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    zk = zk_server.chroot()
    path = write_inventory(tmp_path / "cluster.yaml", inventory(tmp_path, sshd, zk))
    from metaq.deploy.inventory import load_inventory

    cluster = load_inventory(path, cores=lambda host, ssh: cores)
    brokers = {b.name: b for b in cluster.brokers}
    try:
        r = run_fab(path, "check")
        assert r.code == 0, r
        groups = cores * len(HOSTS) // 2
        assert r.line("note: per_host:") == ("note: per_host: %d brokers on 127.0.0.1, 127.0.0.2 (%d, %d); %d groups "
                                             "of a master and 1 slaves" % (2 * groups, cores, cores, groups)), r
        assert len(brokers) == 2 * groups
        for b in brokers.values():
            if b.role == "slave":
                assert b.host != brokers[b.master].host  # never on its master's host
        r = run_fab(path, "deploy", "start", "status", timeout=900)
        assert r.code == 0, r
        rows = status_table(r)
        assert {name: row["ROLE"] for name, row in rows.items()} == {n: b.role for n, b in brokers.items()}, r
        masters = [b for b in brokers.values() if b.role == "master"]
        for m in masters:
            wait_for(lambda m=m: stats({"host": m.host, "port": m.port}).get("replication_slaves") == "1", 30,
                     "%s's slave linked" % m.name)
        with Producer(zk_connect=zk) as producer:
            wait_for(lambda: len(producer.discovery.broker_urls()) == groups, 20, "every master registered")
            sent = [producer.send(Message("percore", b"m%d" % i), timeout=30) for i in range(20 * groups)]
        assert all(x.success for x in sent)
        assert {x.partition.broker_id for x in sent} == {m.broker_id for m in masters}  # spread over every master
        for s in (b for b in brokers.values() if b.role == "slave"):
            master = brokers[s.master]
            wait_for(lambda s=s, master=master: stats({"host": s.host, "port": s.port})["total_messages"] ==
                     stats({"host": master.host, "port": master.port})["total_messages"], 30, "%s caught up" % s.name)
        r = run_fab(path, "stop", timeout=300)
        assert r.code == 0, r
        for b in brokers.values():
            assert not listening(b.host, b.port)
    finally:
        for b in brokers.values():
            try:
                with open(os.path.join(b.install_dir, "run", "metaq.pid")) as f:
                    pid = int(f.read())
            except (OSError, ValueError):
                continue
            if agent.is_ours(pid, Layout(b.install_dir)):
                os.kill(pid, signal.SIGKILL)
