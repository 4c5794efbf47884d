"""Brokers of one MQTT cluster on one host: each master takes two replication connections from that host per other
master (its follow link and its call link: ``limits.HEADROOM_PER_ADDRESS``), besides its slaves'. Four masters
are 6 connections from 127.0.0.1 on each replication port, past what a port admitted from one address before."""

import pytest

from metaq import limits
from metaq.mqttcluster.ids import home_of
from tests.harness.broker import wait_for
from tests.harness.mqtt import Raw
from tests.harness.mqttcluster import Cluster

N = 4


def _homed_on(home, members, prefix):
    i = 0
    while home_of("%s-%d" % (prefix, i), members) != home:
        i += 1
    return "%s-%d" % (prefix, i)


@pytest.mark.slow
def test_four_masters_on_one_host_keep_every_follow_and_call_link(broker_factory, tmp_path, zk_connect):
    assert 2 * (N - 1) <= limits.HEADROOM_PER_ADDRESS  # what this test needs of the limit
    cluster = Cluster(broker_factory, tmp_path, zk_connect, N).start()  # every follow link up
    members = list(range(N))
    for b in members:
        wait_for(lambda b=b: cluster.stats(cluster[b]).get("mqtt_cluster_members") == str(N), 30, "the members")
    for b in members:  # a CONNECT on each broker of an id homed on each other one: a call link to every other master
        for home in members:
            if home != b:
                ack = Raw(cluster[b]).connect(_homed_on(home, members, "dev-%d-%d" % (b, home)))
                assert ack.reason_code == 0, (b, home, ack)
    cluster.wait_linked()  # and the follow links are still all up
    for b in members:
        log = cluster[b].log_text()
        assert "too many connections from" not in log, log[-3000:]
