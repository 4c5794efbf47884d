"""A peer's failover: broker 0 follows broker 1, whose master is killed and whose slave is promoted; broker 0 resumes
at the new master from the same positions (the slave's offsets are the master's): nothing lost, nothing twice."""

import pytest

from metaq.admin import cli as admin
from metaq.client.local import free_port
from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho
from tests.harness.mqttcluster import cluster_config, wait_routed
from tests.harness.replication import caught_up, stats

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def test_after_a_peers_failover_its_new_master_is_followed_from_the_same_positions(broker_factory, tmp_path,
                                                                                     zk_connect, capsys):
    b0 = broker_factory(cluster_config(tmp_path / "b0", 0, zk_connect), workdir=tmp_path / "b0")
    m1cfg = cluster_config(tmp_path / "m1", 1, zk_connect)
    m1 = broker_factory(m1cfg, workdir=tmp_path / "m1")
    s1cfg = cluster_config(tmp_path / "s1", 1, zk_connect)
    s1cfg["replication"] = {}
    srport = free_port()
    s1 = broker_factory(s1cfg, workdir=tmp_path / "s1", extra_args=[
        "--slave-of", "127.0.0.1:%d" % m1cfg["replication"]["port"], "--slave-id", "1",
        "--replication-port", str(srport)])
    wait_for(lambda: stats(b0).get("mqtt_cluster_peers_up") == "1", 30, "0 follows 1")
    sub = Paho(b0, client_id="keeper", version=V311, clean=False)
    assert sub.subscribe("sensors/#", qos=1) == [1]
    wait_routed(sub, lambda i: Paho(m1, "probe-%d" % i).publish("sensors/probe", b"p", 1))
    pub = Paho(m1, "pub")
    for i in range(10):
        pub.publish("sensors/seq", b"%d" % i, 1)
    assert len(sub.wait_messages(10, 15)) == 10
    caught_up(m1, s1)
    m1.kill()
    wait_for(lambda: stats(s1)["replication_link"] == "down", 15, "the slave sees its master gone")
    code = admin.main(["promote", "127.0.0.1:%d" % s1.port, "--force"])
    assert code == 0, capsys.readouterr()
    wait_for(lambda: stats(b0).get("mqtt_cluster_peer_1", "").startswith("up 127.0.0.1:%d" % srport), 30,
             "0 follows the new master of broker 1")
    pub = Paho(s1, "pub2")
    for i in range(10, 20):
        pub.publish("sensors/seq", b"%d" % i, 1)
    sub.wait_messages(20, 20)
    sub.settle()
    got = [m.payload for m in sub.wait_messages(21, 1.0)]
    assert got == [b"%d" % i for i in range(20)], got
