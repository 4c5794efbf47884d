"""Two live connections of one client id during a partition (docs/mqtt.md "A client id across the cluster", "During a
partition"): three masters of one ZooKeeper root, each in a network namespace of its own (tests/harness/netns.py),
ZooKeeper and the clients in theirs. Device X (its home broker 1) is connected to broker 0, which is then cut from
brokers 1 and 2 (not from ZooKeeper, not from its clients). X's new connection on broker 2 is accepted only once
broker 0 has closed the old one: broker 0 closes the connections of ids whose home it cannot reach for longer than
the lease (``mqtt.cluster_id_lease_s``), and the home accepts another holder only once that lease surely ran out."""

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.mqtt import wire
from metaq.mqttcluster.clientids.ids import home_of
from tests.harness import netns
from tests.harness.broker import wait_for
from tests.harness.mqtt import V5, Paho, Raw
from tests.harness.mqttcluster import cluster_config
from tests.harness.replication import stats
from tests.harness.zookeeper import ZooKeeperProcess

pytestmark = [pytest.mark.slow, pytest.mark.fault]

NODES = ("b0", "b1", "b2")
LEASE_S = 2.0


def _start(broker_factory, tmp_path, topo):
    zk = ZooKeeperProcess(tmp_path / "zk", host=topo.addresses["zk"], prefix=topo.prefix("zk")).start()
    brokers = []
    for i, node in enumerate(NODES):
        cfg = cluster_config(tmp_path / node, i, zk.connect, security={"insecure": True})
        cfg["mqtt"]["cluster_id_lease_s"] = LEASE_S
        b = broker_factory(cfg, workdir=tmp_path / node, start=False)
        address = topo.addresses[node]
        b.config["broker"]["host"] = b.host = address
        b.config["replication"]["advertised_address"] = "%s:%d" % (address, b.config["replication"]["port"])
        b.prefix = topo.prefix(node)
        brokers.append(b)
    for b in brokers:
        b.start()
    for b in brokers:
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_peers_up") == "2" and
                 stats(b).get("mqtt_cluster_members") == "3", 30, "every peer link up, every member known")
    return zk, brokers


def test_a_broker_cut_from_an_ids_home_closes_its_connection_before_another_broker_takes_it(broker_factory,
                                                                                           tmp_path):
    why = netns.unavailable()
    if why:
        pytest.skip("network namespaces unavailable: " + why)
    topo = netns.Topology(["zk", *NODES, "c"])
    topo.start()
    zk, brokers = None, []
    try:
        with topo.inside("c"):
            zk, brokers = _start(broker_factory, tmp_path, topo)
            b0, b2 = brokers[0], brokers[2]
            client_id = next("x-%d" % i for i in range(1000) if home_of("x-%d" % i, (0, 1, 2)) == 1)
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
            old = Paho(b0, client_id, V5, clean=False, properties=props)
            closed = []
            old.c.reconnect_delay_set(60, 120)  # closed by broker 0: it must not come back meanwhile
            old.c.on_disconnect = lambda *_a: closed.append(time.monotonic())
            assert old.subscribe("part/#", 1) == [1]
            cut = netns.Cut(topo, ["b0"], ["b1", "b2"])
            cut_at = cut.inject()
            refused, accepted_at = [], None
            while accepted_at is None and time.monotonic() - cut_at < 20:
                raw = Raw(b2, timeout=15)
                connack = raw.connect(client_id, clean_start=False,
                                      properties={"session_expiry_interval": 3600})
                if connack.reason_code == wire.SUCCESS:
                    accepted_at = time.monotonic()
                else:
                    refused.append(connack.reason_code)
                    raw.close()
                    time.sleep(0.2)
            assert accepted_at is not None, "X's new connection on broker 2 never accepted: %s" % refused
            assert closed, "broker 0 kept X's connection %.1f s after the cut, and broker 2 accepted X" % (
                time.monotonic() - cut_at)
            assert closed[0] <= accepted_at, "two live connections of X for %.1f s" % (accepted_at - closed[0])
            assert closed[0] - cut_at <= LEASE_S + 2.0, "closed %.1f s after the cut" % (closed[0] - cut_at)
            assert set(refused) <= {wire.SERVER_UNAVAILABLE}
            cut.heal()
            raw.close()
    finally:
        for b in brokers:
            b.kill()
        if zk is not None:
            zk.kill()
        topo.close()
