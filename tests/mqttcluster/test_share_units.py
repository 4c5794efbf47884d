"""``$share`` groups across the cluster, the pure parts: who takes what (``Shares``: the rendezvous assignment, its
history of membership changes and its limits), the SHARED entry and the ROUTES groups, the inbox copy's groups."""

import pytest

from metaq import limits
from metaq.errors import RemoteProtocolError
from metaq.mqtt.records import record_data
from metaq.mqttcluster import inbox
from metaq.mqttcluster.share import Shares, owner_of
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import SHARED, Entry, shared_data, split_shared
from metaq.protocol.stream import NEED_DATA

G = ("g", "jobs/#")


class Clock:
    def __init__(self):
        self.now = 1000

    def __call__(self):
        return self.now


def round_trip(event):
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(event))
    got = p.next_event()
    assert got is not NEED_DATA
    return got


def test_the_origin_assigns_each_partition_to_one_broker_and_spreads_them():
    owners = [owner_of(G, 2, "jobs", p, (0, 1)) for p in range(64)]
    assert set(owners) == {0, 1}
    assert owners == [owner_of(G, 2, "jobs", p, (1, 0)) for p in range(64)]  # the order of the brokers is no matter
    moved = [p for p in range(64) if owner_of(G, 2, "jobs", p, (0, 1, 2)) != owners[p]]
    assert all(owner_of(G, 2, "jobs", p, (0, 1, 2)) == 2 for p in moved)  # a broker that joins takes only its own


def test_a_change_applies_to_what_is_stored_after_it():
    clock = Clock()
    shares = Shares(0, clock)
    shares.set_local([G])
    shares.set_peer(1, "link-1", [G])
    both = {p: shares.owner(G, 0, "jobs", p, 1500) for p in range(32)}
    assert set(both.values()) == {0, 1}
    clock.now = 2000
    shares.set_peer(1, "link-1", [])
    assert {p: shares.owner(G, 0, "jobs", p, 1500) for p in range(32)} == both  # stored before: as decided
    assert {shares.owner(G, 0, "jobs", p, 2001) for p in range(32)} == {0}
    assert all(shares.takes(G, "jobs", p, 2001) for p in range(32))
    shares.drop_peer(1, "an older link")  # an ended link that is not the peer's current one changes nothing
    assert shares.brokers(G) == (0,)
    shares.set_local([])
    assert len(shares) == 0 and shares.owner(G, 0, "jobs", 0, 3000) is None  # no member anywhere: not tracked
    assert shares.takes(G, "jobs", 0, 3000)


def test_the_history_and_the_groups_kept_at_and_past_their_limits():
    clock = Clock()
    shares = Shares(0, clock, most=2, history=3)
    for i in range(5):
        clock.now += 10
        shares.set_peer(1 + i % 2, "l", [G])
        shares.set_peer(2 - i % 2, "l", [])
    assert len(shares._changes[G]) == 3  # noqa: SLF001 - the bound itself is what is tested
    shares.set_local([("a", "x"), G])
    assert len(shares) == 2 and shares.refused == 0
    shares.set_local([("a", "x"), ("b", "y"), G])
    assert len(shares) == 2 and shares.refused == 1
    assert shares.owner(("b", "y"), 0, "y", 0, clock.now + 5) is None  # not shared: its local members take it
    defaults = Shares(0, clock)
    assert defaults.most == limits.MQTT_CLUSTER_MAX_GROUPS and defaults.history == limits.MQTT_CLUSTER_SHARE_HISTORY


def test_shared_entries_and_route_groups_round_trip_and_are_bounded():
    data = shared_data([G, ("h", "+/x")], b"record")
    assert split_shared(data) == ((G, ("h", "+/x")), b"record")
    records = rp.Records((Entry(SHARED, "jobs", 1, 7, 0, 5, data),))
    assert round_trip(records) == records
    routes = rp.Routes(1, ("a/#",), (), -1, (G,))
    assert round_trip(routes) == routes
    at_limit = rp.Routes(1, (), (), -1, tuple(("g", "f%d" % i) for i in range(limits.MQTT_CLUSTER_MAX_GROUPS)))
    assert round_trip(at_limit) == at_limit
    past = rp.Routes(1, (), (), -1, tuple(("g", "f%d" % i) for i in range(limits.MQTT_CLUSTER_MAX_GROUPS + 1)))
    with pytest.raises(RemoteProtocolError, match="MQTT_CLUSTER_MAX_GROUPS"):
        round_trip(past)
    with pytest.raises(RemoteProtocolError, match="groups"):
        split_shared(b"\x00")


def test_an_inbox_copy_names_the_groups_it_was_assigned_to():
    flag, data = record_data("jobs/1", b"x", 1, "c", {}, False, 1000)
    made = inbox.copy_of(2, "jobs", 0, 5, flag, data, 1000, groups=(G,))
    assert inbox.groups_of(*made) == (G,)
    assert inbox.origin_of(*made) == (2, "jobs", 0, 5)
    plain = inbox.copy_of(2, "jobs", 0, 6, flag, data, 1000)
    assert inbox.groups_of(*plain) == ()


def test_a_brokers_route_carries_its_groups_with_members_at_most_max_groups(monkeypatch):
    from types import SimpleNamespace

    from metaq.mqttcluster.peers import MqttCluster
    monkeypatch.setattr(limits, "MQTT_CLUSTER_MAX_GROUPS", 2)
    config = SimpleNamespace(broker=SimpleNamespace(id=0), zk=SimpleNamespace(root="/meta"))
    cluster = MqttCluster(config, None, None, None, None, lambda: True)
    event = cluster.route_changed
    cluster.groups_changed([G, ("a", "x")])  # at the limit: both
    assert cluster.groups() == (("a", "x"), G) and event.is_set() and cluster.route()[0] == 1
    cluster.groups_changed([G, ("a", "x"), ("b", "y")])  # past it: the first two in order
    assert cluster.groups() == (("a", "x"), ("b", "y"))
    assert cluster.shares.brokers(("b", "y")) == (0,) and cluster.shares.brokers(G) == ()
    version = cluster.route()[0]
    cluster.groups_changed([("b", "y"), ("a", "x")])  # the same groups: no new route
    assert cluster.route()[0] == version
