"""Brokers of one MQTT cluster on one host: each master takes two replication connections from that host per other
master (its follow link and its call link), besides its slaves'. Once proved, they count apart from the host's
strangers (``limits.HEADROOM_PER_ADDRESS``), up to ``limits.MQTT_CLUSTER_PEERS_PER_ADDRESS``."""

import json
import socket
import subprocess
import sys
import time

import pytest

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.clientids.calls import PeerClient, PeerUnreachable
from metaq.mqttcluster.clientids.ids import home_of
from tests.harness.broker import wait_for
from tests.harness.mqtt import Raw
from tests.harness.mqttcluster import Cluster, PaperMembers
from tests.harness.replication import stats

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


def _peer_call(broker_id, address):
    """One call from a master ``broker_id`` over a link of its own; the client (its link kept open) and the answer,
    or the client and the PeerUnreachable that refused it."""
    client = PeerClient(broker_id, None, timeout_s=10)
    try:
        return client, client.call(address, {"op": "none"})
    except PeerUnreachable as exc:
        return client, exc


def test_proved_peers_of_one_host_count_apart_from_its_strangers_up_to_their_own_limit(broker_factory, tmp_path,
                                                                                        zk_connect):
    (b,) = Cluster(broker_factory, tmp_path, zk_connect, 1).start().brokers
    address = "127.0.0.1:%d" % b.config["replication"]["port"]
    limit = mqttcluster_limits.MQTT_CLUSTER_PEERS_PER_ADDRESS
    assert limit > 4 * limits.HEADROOM_PER_ADDRESS  # a host of many cores' brokers, far past the strangers' share
    members = PaperMembers(zk_connect, [2])  # (the calls' links all broker 2's: a broker serves members only)
    wait_for(lambda: stats(b).get("mqtt_cluster_members") == "2", 10, "broker 2 a member")
    held = [_peer_call(2, address) for i in range(limit)]  # at the limit: every link kept
    try:
        assert [i for i, (_c, answer) in enumerate(held) if isinstance(answer, PeerUnreachable)] == [], \
            [a for _c, a in held if isinstance(a, PeerUnreachable)][:3]
        strangers = [socket.create_connection(("127.0.0.1", b.config["replication"]["port"]))
                     for _ in range(limits.HEADROOM_PER_ADDRESS)]  # the strangers' share is still whole
        try:
            time.sleep(0.5)
            assert "too many connections from" not in b.log_text()
        finally:
            for s in strangers:
                s.close()
        extra, answer = _peer_call(2, address)  # one past: refused, saying why
        assert isinstance(answer, PeerUnreachable) and "too many peer brokers" in str(answer), answer
        held.pop()[0].close()  # one leaves: its place is taken again
        wait_for(lambda: not isinstance(_peer_call(2, address)[1], PeerUnreachable), 10, "a place freed")
    finally:
        for client, _a in held:
            client.close()
        members.close()


#: A caller of its own (a broker's loop: gevent sockets): twice the calls that go at once (MQTT_CLUSTER_CALLS_IN_FLIGHT
#: but the lease renewals' turns) begun at once,
#: the one at the limit exclusive; prints the answers, then the links kept after them and after one more call.
CALLS = """
import json, sys
from gevent import monkey
monkey.patch_all()
import gevent

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.clientids.calls import PeerClient
address = sys.argv[1]
most = mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT - mqttcluster_limits.MQTT_CLUSTER_LEASE_CONNECTIONS
client = PeerClient(7, None, timeout_s=10)
calls = [gevent.spawn(client.call, address, {"op": "none"}, None, i == most) for i in range(2 * most)]
gevent.joinall(calls, timeout=30)
kept = client.kept(address)
last = client.call(address, {"op": "none"})
print(json.dumps({"answers": [c.value for c in calls], "kept": kept, "last": last, "after": client.kept(address)}))
"""


def test_calls_to_one_peer_go_at_once_up_to_their_limit_then_in_turn(broker_factory, tmp_path, zk_connect):
    """Twice the calls that go at once (MQTT_CLUSTER_CALLS_IN_FLIGHT but MQTT_CLUSTER_LEASE_CONNECTIONS) to one real
    broker begun at once by another process: as many as the limit go at once (pipelined on one link), the others
    wait their turn: every call is answered (an exclusive one among them too), on the one link, kept for the next
    call."""
    (b,) = Cluster(broker_factory, tmp_path, zk_connect, 1).start().brokers
    address = "127.0.0.1:%d" % b.config["replication"]["port"]
    # the others: the leases'
    most = mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT - mqttcluster_limits.MQTT_CLUSTER_LEASE_CONNECTIONS
    assert most > 1
    members = PaperMembers(zk_connect, [7])  # the caller's id: a broker serves members only
    wait_for(lambda: stats(b).get("mqtt_cluster_members") == "2", 10, "broker 7 a member")
    try:
        out = subprocess.run([sys.executable, "-c", CALLS, address], capture_output=True, text=True, timeout=60)
    finally:
        members.close()
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert len(got["answers"]) == 2 * most
    assert all(a is not None and "unknown call" in a.get("error", "") for a in got["answers"]), got
    assert "unknown call" in got["last"]["error"]
    assert got["kept"] == 1 and got["after"] == 1, got
