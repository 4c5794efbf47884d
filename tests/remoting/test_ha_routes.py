"""RocketMQ clients follow an elected master (issue 17, point 4): every member of an ``ha: auto`` group is a name
server whose routes name the elected master as broker 0; a member that is not master refuses sends with
SERVICE_NOT_AVAILABLE (14), RocketMQ's answer from a slave. The official client following a killed or stopped
master: test_ha_routes_official.py.
"""

import json
import time

import pytest

from metaq.client.local import free_port, rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode as C
from tests.harness.broker import wait_for
from tests.harness.ha import SESSION_MS, Group
from tests.harness.replication import stats
from tests.harness.rocketmq import pull, send_v1

pytestmark = [pytest.mark.fault, pytest.mark.slow]

#: Kill -9 to elected: the dead master's session must expire first (test_election.py's bound).
ELECTION_S = SESSION_MS / 1000.0 * 3 + 10


def route(port, topic="tR"):
    """The master in ``topic``'s route as the name server on ``port`` gives it: ``{"0": address}`` or ``{}`` (its
    slaves, listed after it, are test_cluster_routes.py's)."""
    with RemotingClient(port) as rc:
        r = rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert r.code == C.SUCCESS, r
        [broker] = json.loads(r.body)["brokerDatas"]
        return {k: v for k, v in broker["brokerAddrs"].items() if k == "0"}


def cluster_master(port):
    with RemotingClient(port) as rc:
        info = json.loads(rc.call(R.GET_BROKER_CLUSTER_INFO).body)
        return info["brokerAddrTable"]["metaq-7"]["brokerAddrs"].get("0")


def rport(b):
    return b.config["remoting"]["port"]


def send(b, body):
    with RemotingClient(rport(b)) as rc:
        return send_v1(rc, "tR", body)


def test_every_member_names_the_elected_master_and_others_refuse_sends(broker_factory, tmp_path, zk_connect):
    g = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync", remoting=True)
    first = g.master()
    others = [i for i in range(3) if i != first]
    g.following(first, others)
    want = {"0": g.remoting(first)}
    wait_for(lambda: all(route(rport(b)) == want for b in g.members), 10, "every member's route names the master")
    assert all(cluster_master(rport(b)) == g.remoting(first) for b in g.members)
    assert all(stats(b)["remoting_route_master"] == g.remoting(first) for b in g.members)
    assert send(g.members[first], b"to-master").code == C.SUCCESS
    refused = send(g.members[others[0]], b"to-slave")
    assert refused.code == C.SERVICE_NOT_AVAILABLE and "slave" in refused.remark, refused

    g.members[first].kill()
    seen = set()  # what the survivors' routes said while the election ran
    deadline = time.monotonic() + ELECTION_S
    second = None
    while second is None:
        assert time.monotonic() < deadline, "no new master; roles %s" % g.roles()
        seen.update(tuple(sorted(route(rport(g.members[i])).items())) for i in others)
        second = _leading(g, others)
        time.sleep(0.05)
    third = [i for i in others if i != second][0]
    want = {"0": g.remoting(second)}
    wait_for(lambda: all(route(rport(g.members[i])) == want for i in others), 10, "the survivors name the new master")
    # never anyone but the old master (until its session expired), nobody, or the new master
    assert seen <= {(("0", g.remoting(first)),), (), (("0", g.remoting(second)),)}, seen
    g.following(second, [third])  # sync mode: a put waits for a slave in the new master's in-sync set
    wait_for(lambda: str(third) in stats(g.members[second])["replication_insync"].split(","), 10,
             "member %d in the new master's in-sync set" % third)
    assert send(g.members[second], b"to-new-master").code == C.SUCCESS
    assert send(g.members[third], b"to-slave").code == C.SERVICE_NOT_AVAILABLE

    g.members[first].start()  # the old master returns as a slave and names the new master too
    g.following(second, [first, third])
    wait_for(lambda: route(rport(g.members[first])) == want, 10, "the old master names the new one")
    assert send(g.members[first], b"to-old-master").code == C.SERVICE_NOT_AVAILABLE


def _leading(g, members):
    """The one of ``members`` that leads now, or None (no waiting)."""
    for i in members:
        st = stats(g.members[i])
        if st["replication_role"] == "master" and st["replication_leading"] == "true":
            return i
    return None


def test_routes_keep_the_last_master_while_zookeeper_is_out_of_reach(broker_factory, tmp_path, own_zk):
    """As RocketMQ's name servers keep the routes brokers last registered: consumers go on reading from the master,
    whose lease refuses sends (14) until ZooKeeper confirms it again."""
    g = Group(broker_factory, tmp_path, own_zk.connect, n=2, mode="async", remoting=True)
    first = g.master()
    want = {"0": g.remoting(first)}
    wait_for(lambda: all(route(rport(b)) == want for b in g.members), 10, "routes name the master")
    assert send(g.members[first], b"before").code == C.SUCCESS
    own_zk.stop()
    wait_for(lambda: send(g.members[first], b"during").code == C.SERVICE_NOT_AVAILABLE, 10, "the lease runs out")
    assert all(route(rport(b)) == want for b in g.members)
    with RemotingClient(rport(g.members[first])) as rc:
        assert any(pull(rc, "tR", q, 0).code == C.SUCCESS for q in range(4))  # reads go on
    own_zk.start()
    master = g.master(timeout=30)
    want = {"0": g.remoting(master)}
    wait_for(lambda: all(route(rport(b)) == want for b in g.members), 15,
             lambda: "routes name the master: %s" % [route(rport(b)) for b in g.members])
    wait_for(lambda: send(g.members[master], b"after").code == C.SUCCESS, 10, "sends taken again")


def test_manual_mode_keeps_naming_each_broker_itself(broker_factory, tmp_path):
    rep = free_port()
    master = broker_factory(rmq_config(tmp_path / "m" / "data", replication={"port": rep}), workdir=tmp_path / "m")
    slave = broker_factory(rmq_config(tmp_path / "s" / "data", replication={
        "role": "slave", "slave_of": "127.0.0.1:%d" % rep, "slave_id": 1}), workdir=tmp_path / "s")
    assert route(rport(master)) == {"0": "127.0.0.1:%d" % rport(master)}
    assert route(rport(slave)) == {"0": "127.0.0.1:%d" % rport(slave)}  # as before: a manual slave names itself
    assert stats(slave)["remoting_route_master"] == "127.0.0.1:%d" % rport(slave)
    refused = send(slave, b"x")
    assert refused.code == C.SERVICE_NOT_AVAILABLE and "replication slave" in refused.remark, refused
    assert send(master, b"y").code == C.SUCCESS
