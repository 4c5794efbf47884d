"""``$share/<group>/<filter>`` across a cluster of three brokers (docs/mqtt.md "Shared subscriptions"): each message
published on any broker goes to one member of the group in the cluster, the members on every broker get some, and
a broker whose last member leaves hands its share to the others with nothing lost."""

import time

import pytest

from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho, mosquitto_pub

pytestmark = pytest.mark.slow

GROUP = "$share/g/jobs/#"
SHARE_MESSAGES = 2000  # a one-partition topic shared by two brokers' members


def peer_groups(cluster, b):
    return int(cluster.stats(cluster[b]).get("mqtt_cluster_peer_groups", "0"))


def wait_groups(cluster, want):
    """Each broker ``b`` sees ``want[b]`` groups in its peers' routes."""
    for b, n in want.items():
        wait_for(lambda b=b, n=n: peer_groups(cluster, b) == n, 20,
                 lambda b=b: "broker %d's view of the peers' groups: %s" % (b, cluster.stats(cluster[b])))


def wait_members(cluster, want):
    """Each broker ``b`` sees ``want[b]`` members of groups in its peers' routes (a group kept with none: 0)."""
    for b, n in want.items():
        wait_for(lambda b=b, n=n: int(cluster.stats(cluster[b]).get("mqtt_cluster_peer_group_members", "0")) == n, 20,
                 lambda b=b: "broker %d's view of the peers' members: %s" % (b, cluster.stats(cluster[b])))


def drain(members, want, timeout=30):
    """The payloads each member received once ``want`` messages came in all (and a second more)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sum(len(m.messages) for m in members) < want:
        time.sleep(0.1)
    time.sleep(1.0)
    for m in members:
        m.settle()
    return [[x.payload for x in m.messages] for m in members]


def taken(member):
    """The payloads ``member`` received so far, removed from its list."""
    with member.got:
        out = [x.payload for x in member.messages]
        del member.messages[:]
    return out


def publish(broker, prefix, n):
    pub = Paho(broker, "pub-%s" % prefix)
    for i in range(n):
        pub.publish("jobs/%d" % i, b"%s-%d" % (prefix.encode(), i), 1)
    pub.close()


def test_each_message_goes_to_one_member_in_the_cluster(cluster):
    a = Paho(cluster[0], "member-a")
    b = Paho(cluster[1], "member-b")
    assert a.subscribe(GROUP, 1) == [1] and b.subscribe(GROUP, 1) == [1]
    wait_groups(cluster, {0: 1, 1: 1, 2: 2})
    publish(cluster[2], "two", 100)
    publish(cluster[0], "zero", 100)
    got = drain([a, b], 200)
    every = got[0] + got[1]
    assert sorted(every) == sorted([b"two-%d" % i for i in range(100)] + [b"zero-%d" % i for i in range(100)]), \
        (len(got[0]), len(got[1]))
    assert got[0] and got[1], "both brokers' members receive some"
    r = mosquitto_pub(cluster[2], "jobs/x", "mosq", 1)
    assert r.returncode == 0, r.stderr
    got = drain([a, b], 201)
    assert sum(p == b"mosq" for m in got for p in m) == 1


def test_a_brokers_last_member_leaving_moves_its_share(cluster):
    a = Paho(cluster[0], "member-a")
    b = Paho(cluster[1], "member-b")
    assert a.subscribe(GROUP, 1) == [1] and b.subscribe(GROUP, 1) == [1]
    wait_groups(cluster, {0: 1, 1: 1, 2: 2})
    b.close()
    wait_groups(cluster, {0: 0, 2: 1})
    publish(cluster[2], "two", 50)
    publish(cluster[1], "one", 50)
    got = drain([a], 100)
    assert sorted(got[0]) == sorted([b"two-%d" % i for i in range(50)] + [b"one-%d" % i for i in range(50)]), \
        len(got[0])


def test_a_persistent_member_that_comes_back_takes_its_share_again_with_nothing_lost_or_twice(cluster):
    """A broker's only member is a persistent session (MQTT 3.1.1) that goes away: the others take everything
    published meanwhile; once it is back, its broker's share goes to it again. Every message once over the group."""
    a = Paho(cluster[0], "member-a")
    b = Paho(cluster[1], client_id="member-b", version=V311, clean=False)
    assert a.subscribe(GROUP, 1) == [1] and b.subscribe(GROUP, 1) == [1]
    wait_groups(cluster, {0: 1, 1: 1, 2: 2})
    publish(cluster[2], "before", 40)
    drain([a, b], 40)
    every = taken(a) + taken(b)
    b.close()
    wait_members(cluster, {0: 0, 2: 1})  # broker 1 keeps the group for b, with no member connected
    publish(cluster[2], "away", 40)
    drain([a], 40)
    every += taken(a)
    b = Paho(cluster[1], client_id="member-b", version=V311, clean=False)
    assert b.session_present
    wait_members(cluster, {0: 1, 2: 2})
    publish(cluster[2], "back", 100)
    publish(cluster[0], "back0", 100)
    back = drain([a, b], 200)
    every += back[0] + back[1]
    want = [b"%s-%d" % (p, i) for p, n in ((b"before", 40), (b"away", 40), (b"back", 100), (b"back0", 100))
            for i in range(n)]
    assert sorted(every) == sorted(want), (len(every), len(want))
    assert not any(p.startswith(b"away") for p in back[1])
    assert back[0] and back[1], "both brokers' members receive some again"


def test_a_group_on_two_brokers_shares_one_partition_published_on_a_third(cluster):
    """Every publisher on broker 2, one topic (one partition), one member on each of brokers 0 and 1: the group is
    assigned per message, so each broker's member gets 40-60 % of them, each once, none lost."""
    n = SHARE_MESSAGES
    a = Paho(cluster[0], "member-a")
    b = Paho(cluster[1], "member-b")
    assert a.subscribe(GROUP, 1) == [1] and b.subscribe(GROUP, 1) == [1]
    wait_groups(cluster, {0: 1, 1: 1, 2: 2})
    pub = Paho(cluster[2], "pub-one")
    for i in range(n):
        pub.publish("jobs/one", b"%d" % i, 1)
    pub.close()
    got = drain([a, b], n, timeout=60)
    assert sorted(got[0] + got[1]) == sorted(b"%d" % i for i in range(n)), (len(got[0]), len(got[1]))
    for share in got:
        assert 0.4 * n <= len(share) <= 0.6 * n, (len(got[0]), len(got[1]))


def test_each_member_gets_its_share_whichever_broker_it_is_on(cluster):
    """One member on broker 0, three on broker 1, every publisher on broker 2: a broker's share is weighted by its
    members, so each of the four members gets about a quarter (not broker 0's one member half), each once, none
    lost."""
    n = SHARE_MESSAGES
    members = [Paho(cluster[0], "member-a")] + [Paho(cluster[1], "member-b%d" % i) for i in range(3)]
    for m in members:
        assert m.subscribe(GROUP, 1) == [1]
    wait_for(lambda: int(cluster.stats(cluster[2]).get("mqtt_cluster_peer_group_members", "0")) == 4, 20,
             lambda: "broker 2's view of the peers' members: %s" % cluster.stats(cluster[2]))
    pub = Paho(cluster[2], "pub-one")
    for i in range(n):
        pub.publish("jobs/one", b"%d" % i, 1)
    pub.close()
    got = drain(members, n, timeout=60)
    assert sorted(p for share in got for p in share) == sorted(b"%d" % i for i in range(n)), [len(g) for g in got]
    for share in got:
        assert 0.18 * n <= len(share) <= 0.32 * n, [len(g) for g in got]


def test_a_group_kept_with_no_member_anywhere_keeps_every_brokers_messages_for_the_member_that_returns(cluster):
    """The group's only member is a persistent session on broker 1; it goes away. What brokers 0 and 2 publish
    meanwhile is kept for the group (broker 1 keeps it, weighing 0), and the member that comes back gets all of it,
    once, with what broker 1 published."""
    b = Paho(cluster[1], client_id="member-b", version=V311, clean=False)
    assert b.subscribe(GROUP, 1) == [1]
    wait_members(cluster, {0: 1, 2: 1})
    publish(cluster[2], "before", 10)
    assert len(b.wait_messages(10, 20)) == 10
    b.close()
    wait_members(cluster, {0: 0, 2: 0})
    for k in (0, 1, 2):
        publish(cluster[k], "away%d" % k, 30)
    b = Paho(cluster[1], client_id="member-b", version=V311, clean=False)
    assert b.session_present
    got = drain([b], 90)[0]
    assert sorted(got) == sorted(b"away%d-%d" % (k, i) for k in (0, 1, 2) for i in range(30)), len(got)
