"""The official RocketMQ client (C++ core, PyPI ``rocketmq==0.4.4``) follows an elected master (issue 17, point 4):
given every member of an ``ha: auto`` group as its name servers, a producer that retries follows a kill -9 and a
clean stop of the master, and every acknowledged message is on the new master.

How long the client takes to follow is printed (``pytest -s``) and explained in the README's RocketMQ section:
the C++ client asks its name server for routes every 30 s and never on a failed send (``MQClientFactory::
updateTopicRouteInfo``, ``DefaultMQProducer::sendDefaultImpl``), so a switch costs the election plus up to 30 s.
"""

import time

import pytest

from tests.harness.broker import consume_all, wait_for
from tests.harness.ha import Group
from tests.harness.replication import stats
from tests.harness.rocketmq import received, require_official_client
from tests.remoting.test_ha_routes import ELECTION_S, route, rport

pytestmark = [pytest.mark.fault, pytest.mark.slow]

#: The C++ client's route refresh (MQClientFactory::startScheduledTask: first after 3 s, then every 30 s).
FIRST_REFRESH_S, ROUTE_REFRESH_S = 3.0, 30.0


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
