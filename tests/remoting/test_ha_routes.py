"""RocketMQ clients follow an elected master (issue 17, point 4): every member of an ``ha: auto`` group is a name
server whose routes name the elected master as broker 0; a member that is not master refuses sends with
SERVICE_NOT_AVAILABLE (14), RocketMQ's answer from a slave. With the official client (C++ core, PyPI
``rocketmq==0.4.4``) given every member as its name servers, a producer that retries follows a kill -9 and a
clean stop of the master, and every acknowledged message is on the new master.

How long the client takes to follow is printed (``pytest -s``) and explained in the README's RocketMQ section:
the C++ client asks its name server for routes every 30 s and never on a failed send (``MQClientFactory::
updateTopicRouteInfo``, ``DefaultMQProducer::sendDefaultImpl``), so a switch costs the election plus up to 30 s.
"""

import json
import time

import pytest

from metaq.client.local import free_port, rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode as C
from tests.harness.broker import consume_all, wait_for
from tests.harness.ha import SESSION_MS, Group
from tests.harness.replication import stats
from tests.harness.rocketmq import pull, received, require_official_client, send_v1

pytestmark = [pytest.mark.fault, pytest.mark.slow]

#: The C++ client's route refresh (MQClientFactory::startScheduledTask: first after 3 s, then every 30 s).
FIRST_REFRESH_S, ROUTE_REFRESH_S = 3.0, 30.0
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


# -- the official client -----------------------------------------------------------------------------------


def _producer(tmp_path, ns, count, interval=0.1):
    from bench.rocketmq_peer import start_peer
    return start_peer(tmp_path / "producer", "produce", "--ns", ns, "--topic", "tF", "--count", count,
                      "--interval", interval, "--retry-for", 90, "--retry-pause", 0.2)


def _started_sending(b, launched):
    """Wait for the producer's first messages, then until its first route refresh (3 s after its start) is
    past: the fault then comes early in the 30 s between two refreshes, the worst case for the switch."""
    wait_for(lambda: int(stats(b)["log_end_position"]) > 0, 30, "the producer's first messages on the master")
    time.sleep(max(0.0, launched + FIRST_REFRESH_S + 2.0 - time.time()))


def _held(b, topic="tF", partitions=4):
    with b.client() as c:
        return {m.payload.decode() for p in range(partitions) for m in consume_all(c, topic, p)}


def _follow(lines, stopped_at, elected_at, what):
    """Check the run and print how long the client took to follow; returns the acknowledged bodies."""
    acked = [line for line in lines if "msg_id" in line]
    given_up = [line for line in lines if "error" in line]
    assert given_up == [], given_up
    after = [line for line in acked if line["t"] > stopped_at]
    assert after, "nothing was acknowledged after the master %s" % what
    stalled = max(line["t"] - line["first_t"] for line in acked)
    first_after = min(line["t"] for line in after)
    print("\nRocketMQ C++ producer, master %s: elected %.1f s after, first acknowledged send %.1f s after "
          "(%.1f s after the election); longest send (with its retries) %.1f s, %d sends failed at least once "
          "(first error: %s)" % (what, elected_at - stopped_at, first_after - stopped_at, first_after - elected_at,
                                 stalled, sum(1 for line in acked if line["failures"]),
                                 next((line["first_error"] for line in acked if line["failures"]), None)))
    # the client follows at its next route refresh after the election, never later
    assert first_after - elected_at <= ROUTE_REFRESH_S + 5, (first_after - elected_at)
    return {line["body"] for line in acked}


def test_the_official_producer_follows_a_killed_master(broker_factory, tmp_path, zk_connect):
    require_official_client()
    from bench.rocketmq_peer import finish_peer, start_peer
    g = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync", remoting=True)
    first = g.master()
    g.following(first, [i for i in range(3) if i != first])
    # the master first in the list: the name server the client uses dies with it
    ns = ";".join([g.remoting(first)] + [g.remoting(i) for i in range(3) if i != first])
    count = 150
    launched = time.time()
    consumer = start_peer(tmp_path / "consumer", "consume", "--ns", ns, "--topic", "tF", "--group", "CGF",
                          "--expect", count, "--timeout", 150, "--distinct")  # redeliveries after the kill
    proc = _producer(tmp_path, ns, count)
    _started_sending(g.members[first], launched)
    killed_at = time.time()
    g.members[first].kill()
    second = g.master(timeout=ELECTION_S, exclude=(first,))
    elected_at = time.time()
    lines = finish_peer(proc, timeout=count * 0.1 + ELECTION_S + ROUTE_REFRESH_S + 60)
    acked = _follow(lines, killed_at, elected_at, "killed (kill -9)")
    assert len(acked) == count  # every message acknowledged in the end (none given up)
    got = received(finish_peer(consumer, timeout=180))
    assert {m["body"] for m in got} >= acked  # the push consumer followed too: every acknowledged message came
    resumed = min(m["t"] for m in got if m["body"] not in {m2["body"] for m2 in got if m2["t"] < killed_at})
    print("RocketMQ C++ push consumer: first message received after the kill %.1f s after it" % (resumed - killed_at))
    missing = acked - _held(g.members[second])
    assert missing == set(), "%d acknowledged messages are not on the new master: %s" % (len(missing),
                                                                                          sorted(missing)[:10])


def test_the_official_producer_follows_a_cleanly_stopped_master(broker_factory, tmp_path, zk_connect):
    require_official_client()
    from bench.rocketmq_peer import finish_peer
    # three members: sync mode acknowledges nothing while the new master has no slave
    g = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync", remoting=True)
    first = g.master()
    g.following(first, [i for i in range(3) if i != first])
    ns = ";".join([g.remoting(first)] + [g.remoting(i) for i in range(3) if i != first])
    count = 150
    launched = time.time()
    proc = _producer(tmp_path, ns, count)
    _started_sending(g.members[first], launched)
    stopped_at = time.time()
    assert g.members[first].stop() == 0
    second = g.master(timeout=10, exclude=(first,))
    elected_at = time.time()
    assert elected_at - stopped_at < 5.0  # a clean stop hands over without waiting for a session to expire
    lines = finish_peer(proc, timeout=count * 0.1 + ROUTE_REFRESH_S + 60)
    acked = _follow(lines, stopped_at, elected_at, "stopped cleanly (SIGTERM)")
    assert len(acked) == count
    missing = acked - _held(g.members[second])
    assert missing == set(), "%d acknowledged messages are not on the new master: %s" % (len(missing),
                                                                                          sorted(missing)[:10])


def test_a_producer_that_found_no_master_follows_without_waiting_for_its_refresh(broker_factory, tmp_path,
                                                                                 zk_connect):
    """While no member may be elected (sync mode: the one in-sync member is down), routes name no master. The
    client then has no writable queue and asks its name server again at every send (C++ ``MQClientFactory::
    tryToFindTopicPublishInfo``), so it reaches the master as soon as one is elected, not at its next 30 s
    refresh."""
    require_official_client()
    from bench.rocketmq_peer import finish_peer
    g = Group(broker_factory, tmp_path, zk_connect, n=2, mode="sync", remoting=True)
    first = g.master()
    other = 1 - first
    g.following(first, [other])
    g.members[other].stop()
    wait_for(lambda: g.insync(first) == str(first), 15, "the stopped member left the in-sync set")
    g.members[first].kill()
    g.members[other].start()  # not in sync: it may not be elected, and nobody else is there
    wait_for(lambda: route(rport(g.members[other])) == {}, 15, "its routes name no master")
    launched = time.time()
    count = 60
    proc = _producer(tmp_path, g.remoting(other), count)
    time.sleep(max(0.0, launched + FIRST_REFRESH_S + 3.0 - time.time()))  # far from its next refresh (33 s)
    assert route(rport(g.members[other])) == {} and proc.poll() is None
    g.members[first].start()
    assert g.master(timeout=30) == first
    elected_at = time.time()
    assert elected_at < launched + FIRST_REFRESH_S + ROUTE_REFRESH_S - 10
    lines = finish_peer(proc, timeout=count * 0.1 + 90)
    acked = [line for line in lines if "msg_id" in line]
    assert len(acked) == count, [line for line in lines if "error" in line]
    first_ack = min(line["t"] for line in acked)
    print("\nRocketMQ C++ producer that found no master: first acknowledged send %.1f s after the election"
          % (first_ack - elected_at))
    assert first_ack - elected_at < 8.0  # the next route refresh would only come at launched + 33 s
