"""``$share`` groups across the cluster, the pure parts: who takes what (``Shares``: the rendezvous assignment, its
history of membership changes and its limits), the SHARED entry and the ROUTES groups, the inbox copy's groups."""

import pytest

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.errors import RemoteProtocolError
from metaq.mqtt.follow import SessionTable, encode_share_history, encode_share_history_end
from metaq.mqtt.records import record_data
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.sharing.share import Shares, owner_of, unit
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import SHARED, Entry, join_routes, shared_data, split_routes, split_shared
from metaq.protocol.stream import NEED_DATA

G = ("g", "jobs/#")


def ones(*brokers):
    """A change's brokers each of weight 1 (one member each)."""
    return tuple((b, 1) for b in brokers)


class Log:
    """The sessions' log as ``Shares`` sees it: its end (the position its next record gets) and start, the histories
    its table holds (each record written through the real codec and applied at its own position as a slave's table
    applies it; each record 100 bytes), a write that a slave (``writable`` False) refuses."""

    def __init__(self):
        self.end = 1000
        self.begin = 0
        self.table = SessionTable()
        self.writable = True
        self.writes = 0

    def position(self):
        return self.end

    def start(self):
        return self.begin

    def histories(self):
        return self.table.shares

    def record(self, key, changes):
        if not self.writable:
            return None
        self.table.apply(self.end, encode_share_history_end(key) if changes is None
                         else encode_share_history(key, changes))
        self.end += 100
        self.writes += 1
        return self.end

    def shares(self, **bounds):
        return Shares(0, self.position, self.start, self.histories, self.record, **bounds)


def round_trip(event):
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(event))
    got = p.next_event()
    assert got is not NEED_DATA
    return got


def test_the_origin_assigns_each_message_to_one_broker_and_spreads_them():
    """Per message, not per partition: one partition's 10,000 offsets spread evenly over two brokers, alike
    whatever the order the brokers are given in and at each call; a broker that joins takes only its own share."""
    owners = [owner_of(G, 2, "jobs", 0, offset, (0, 1)) for offset in range(10000)]
    assert 4800 <= owners.count(0) <= 5200 and owners.count(0) + owners.count(1) == 10000
    assert owners == [owner_of(G, 2, "jobs", 0, offset, (1, 0)) for offset in range(10000)]
    assert owners == [owner_of(G, 2, "jobs", 0, offset, (0, 1), {0: 1, 1: 1}) for offset in range(10000)]
    three = [owner_of(G, 2, "jobs", 0, offset, (0, 1, 2)) for offset in range(10000)]
    moved = [o for o, was in zip(three, owners, strict=True) if o != was]
    assert set(moved) == {2} and 3000 <= len(moved) <= 3700  # a third, all to the broker that joins
    assert owner_of(G, 2, "jobs", 0, 7, ()) is None


def test_a_weighted_share_follows_the_weights():
    """Weights 2:1 give two thirds and one third of 10,000 offsets; a weight that changes moves messages only to or
    from its broker."""
    owners = [owner_of(G, 2, "jobs", 0, offset, (0, 1), {0: 2, 1: 1}) for offset in range(10000)]
    assert 6400 <= owners.count(0) <= 6950, owners.count(0)
    more = [owner_of(G, 2, "jobs", 0, offset, (0, 1), {0: 3, 1: 1}) for offset in range(10000)]
    assert all(now == 0 for now, was in zip(more, owners, strict=True) if now != was)
    assert 0 < unit(0) < unit(2**64 - 1) < 1.0 and unit(2**64 - 1024) < 1.0  # no hash scores a division by zero


def test_a_membership_change_moves_only_what_is_stored_after_its_record():
    """One partition: what was stored before a change keeps its owner, offset by offset; from the change's own
    record on, the new brokers share it."""
    log = Log()
    shares = log.shares()
    shares.set_local([G])
    shares.set_peer(1, "link-1", [G])
    before = [shares.owner(G, 0, "jobs", 0, at) for at in range(1000, 3000)]
    assert 800 <= before.count(0) <= 1200
    log.end = 3000
    shares.set_peer(2, "link-2", [G])
    assert [shares.owner(G, 0, "jobs", 0, at) for at in range(1000, 3000)] == before
    after = [shares.owner(G, 0, "jobs", 0, at) for at in range(3000, 6000)]
    assert all(600 <= after.count(b) <= 1400 for b in (0, 1, 2)), [after.count(b) for b in (0, 1, 2)]


def test_a_change_applies_to_what_is_stored_after_it():
    log = Log()
    shares = log.shares()
    shares.set_local([G])
    shares.set_peer(1, "link-1", [G])
    both = {p: shares.owner(G, 0, "jobs", p, 1500) for p in range(32)}
    assert set(both.values()) == {0, 1}
    log.end = 2000  # messages stored meanwhile
    shares.set_peer(1, "link-1", [])
    assert {p: shares.owner(G, 0, "jobs", p, 1500) for p in range(32)} == both  # stored before: as decided
    assert all(shares.owner(G, 0, "jobs", p, 1999) == owner_of(G, 0, "jobs", p, 1999, (0, 1)) for p in range(32))
    assert {shares.owner(G, 0, "jobs", p, 2000) for p in range(32)} == {0}  # the next record on: the new brokers
    assert all(shares.takes(G, "jobs", p, 2001) for p in range(32))
    shares.drop_peer(1, "an older link")  # an ended link that is not the peer's current one changes nothing
    assert shares.brokers(G) == ones(0)
    shares.set_local([])  # no member anywhere: each broker's own members take its messages from here on
    assert shares.owner(G, 0, "jobs", 0, log.end) is None and shares.takes(G, "jobs", 0, log.end)
    assert {p: shares.owner(G, 0, "jobs", p, 1500) for p in range(32)} == both  # what came before keeps its owner


def test_a_promoted_slave_assigns_by_the_history_its_master_wrote():
    """The history is the log's: a slave's table holds its master's as copied, so a slave promoted (a new view of
    its own, its peers not all linked yet) assigns what was stored before as its master did, its own changes apply
    after them, and a peer not linked yet keeps its share; a change the log does not take (a slave) is not made, and
    ``refresh`` makes it once it may write."""
    log = Log()
    master = log.shares()
    master.set_local([G])
    master.set_peer(1, "link-1", [G])
    master.set_peer(2, "link-2", [G])
    log.end = 5000
    decided = {p: master.owner(G, 0, "jobs", p, 4999) for p in range(64)}
    assert set(decided.values()) == {0, 1, 2}
    log.writable = False
    promoted = log.shares()  # the slave: nothing of its own written
    promoted.set_peer(1, "link-1b", [])
    assert log.table.shares[G].changes[-1][1] == ones(0, 1, 2)  # not made
    log.writable = True  # promoted
    list(promoted.refresh())
    assert log.table.shares[G].changes[-1] == (5000, ones(2))  # 2 not linked yet: as its master last knew it
    log.end += 10  # messages stored meanwhile
    promoted.set_peer(1, "link-1b", [G])
    log.end += 10
    promoted.set_local([G])
    assert {p: promoted.owner(G, 0, "jobs", p, 4999) for p in range(64)} == decided  # what the master stored
    assert {promoted.owner(G, 0, "jobs", p, 5000) for p in range(64)} == {2}  # stored when only 2 had members
    assert {p: promoted.owner(G, 0, "jobs", p, log.end) for p in range(64)} == \
        {p: owner_of(G, 0, "jobs", p, log.end, (0, 1, 2)) for p in range(64)}  # the same brokers again


def test_a_link_that_ends_keeps_its_peers_share_until_its_routes_drop_the_group():
    """A cut link (or one not back yet) moves nothing: the peer's records stay its own, for its link to copy when
    it resumes; only its ROUTES without the group make a change (no broker: its members left)."""
    log = Log()
    shares = log.shares()
    shares.set_peer(1, "link-1", [G])
    log.end = 2000
    writes = log.writes
    shares.drop_peer(1, "link-1")
    list(shares.refresh())
    assert log.writes == writes and shares.brokers(G) == ones(1)
    assert {shares.owner(G, 0, "jobs", p, log.end) for p in range(8)} == {1}
    assert not shares.takes(G, "jobs", 0, log.end)
    shares.set_peer(1, "link-1b", [G])  # back with its members: nothing changes
    assert log.writes == writes
    log.end = 3000
    shares.set_peer(1, "link-1b", [])  # its members left
    assert log.table.shares[G].changes[-1] == (3000, ())
    assert shares.owner(G, 0, "jobs", 0, 3000) is None and shares.owner(G, 0, "jobs", 0, 2999) == 1


def test_a_change_starts_at_its_own_record():
    """The position a change starts at is its record's, not the log's end read before the write (another write may
    come between)."""
    log = Log()
    shares = Shares(0, lambda: log.end - 40, log.start, log.histories, log.record)
    shares.set_peer(1, "link-1", [G])
    assert log.table.shares[G].changes == ((1000, ones(1)),)


def test_flaps_with_nothing_written_between_leave_the_history_as_it_was():
    log = Log()
    shares = log.shares()
    shares.set_local([G])
    shares.set_peer(1, "link-1", [G])
    log.end = 2000
    before = log.table.shares[G].changes
    for _ in range(mqttcluster_limits.MQTT_CLUSTER_SHARE_HISTORY + 1):
        shares.set_peer(1, "link-1", [])
        shares.set_peer(1, "link-1", [G])
    assert log.table.shares[G].changes == before
    shares.set_local([])
    shares.set_local([G])
    assert log.table.shares[G].changes == before
    shares.set_local([])
    log.end += 1  # a message
    shares.set_local([G])
    assert [b for _since, b in log.table.shares[G].changes] == [ones(0), ones(0, 1), ones(1), ones(0, 1)]


def test_a_change_is_kept_while_the_log_holds_what_it_assigns():
    """Members that leave and come back with messages between: each change is kept while a reader behind (a
    group's old cursor, a peer's link catching up) can read a record it assigns, so those records keep their
    broker; dropped once the log's start passes the change after it; past the hard bound counted."""
    log = Log()
    shares = log.shares()
    shares.set_local([G])
    log.end = 2000
    decided = {p: shares.owner(G, 0, "jobs", p, 1999) for p in range(32)}
    assert set(decided.values()) == {0}
    for i in range(20):  # twenty changes (a device that reconnects, a member that comes and goes)
        shares.set_peer(1, "link-1", [G] if i % 2 == 0 else [])
        log.end += 10  # messages
    shares.set_peer(1, "link-1", [G])
    log.end += 10
    shares.set_local([])
    log.end += 10
    assert {p: shares.owner(G, 0, "jobs", p, 1999) for p in range(32)} == decided  # still as decided
    assert shares.forgotten == 0
    log.begin = log.table.shares[G].changes[-1][0]  # retention: the log starts at the last change
    list(shares.refresh())
    assert log.table.shares[G].changes == ((log.begin, ones(1)),)
    bounded = log.shares(history=3)
    for i in range(2):
        bounded.set_peer(2, "link-2", [G] if i % 2 == 0 else [])
        log.end += 10
    assert len(log.table.shares[G].changes) == 3 and bounded.forgotten == 0  # at the bound
    bounded.set_peer(2, "link-2", [G])
    assert len(log.table.shares[G].changes) == 3 and bounded.forgotten == 1  # one past it


def test_a_history_with_no_member_anywhere_ends_once_the_log_starts_past_it():
    log = Log()
    shares = log.shares()
    shares.set_peer(1, "link-1", [G])
    log.end = 2000
    shares.set_peer(1, "link-1", [])
    log.end = 3000
    list(shares.refresh())
    assert G in log.table.shares
    log.begin = 2500
    list(shares.refresh())
    assert G not in log.table.shares
    writes = log.writes
    list(shares.refresh())
    assert log.writes == writes


class Counted(dict):
    def __init__(self):
        super().__init__()
        self.walks = 0

    def items(self):
        self.walks += 1
        return super().items()


def test_the_history_and_the_groups_kept_at_and_past_their_limits():
    log = Log()
    shares = log.shares(most=2)
    shares.set_local([("a", "x"), G])
    assert len(shares) == 2 and shares.refused == 0
    shares.set_local([("a", "x"), ("b", "y"), G])
    assert len(shares) == 2 and shares.refused == 1
    list(shares.refresh())
    assert shares.refused == 1  # looked at again, not counted again
    assert shares.owner(("b", "y"), 0, "y", 0, log.end) is None  # not shared: its local members take it
    log.end += 10
    shares.set_local([G])  # ("a", "x") has no member anywhere: its history stays, and gives way to a new group
    list(shares.refresh())
    assert set(log.table.shares) == {("a", "x"), G} and log.table.shares[("a", "x")].changes[-1][1] == ()
    shares.set_local([("b", "y"), G])
    assert set(log.table.shares) == {("b", "y"), G} and shares.refused == 1
    defaults = log.shares()
    assert (defaults.most == mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS
            and defaults.history == mqttcluster_limits.MQTT_CLUSTER_SHARE_HISTORY)


def test_the_group_whose_last_change_is_oldest_gives_way_first():
    log = Log()
    shares = log.shares(most=2)
    a, b = ("a", "x"), ("b", "y")
    shares.set_local([a, b])
    log.end += 10
    shares.set_local([b])
    log.end += 10
    shares.set_local([a])
    log.end += 10
    shares.set_local([])  # a's last change is now newer than b's
    log.end += 10
    shares.set_local([G])
    assert set(log.table.shares) == {a, G}


def test_a_full_table_with_nothing_to_evict_walks_no_history_and_pauses_between_groups():
    log = Log()
    log.table.shares = Counted()
    pauses = []
    shares = Shares(0, log.position, log.start, log.histories, log.record, most=3,
                    pause=lambda turn: pauses.append(turn) or turn)
    shares.set_local([("a", "x"), ("b", "y"), G])
    assert len(pauses) == 3
    new = [("n%d" % i, "f") for i in range(50)]
    shares.set_local([("a", "x"), ("b", "y"), G] + new)
    assert shares.refused == 50 and log.table.shares.walks == 0
    assert len(pauses) == 53


def test_an_assignment_historys_record_round_trips_ends_holds_retention_and_a_bad_one_is_passed_over():
    table = SessionTable()
    table.apply(10, encode_share_history(G, [(5, ones(0, 2)), (9, ones(2))]))
    assert table.shares[G].changes == ((5, ones(0, 2)), (9, ones(2))) and table.floor() == 10
    table.apply(20, b'{"k":"b","n":"g"}')  # passed over, logged
    table.apply(21, b'{"k":"b","n":"g","f":"jobs/#","h":[]}')
    assert table.shares[G].position == 10
    table.apply(30, encode_share_history_end(G))
    assert G not in table.shares and table.floor() is None
    table.apply(40, encode_share_history(G, [(5, ones(0)), (None, ones(1))]))  # a change that starts at its own record
    assert table.shares[G].changes == ((5, ones(0)), (40, ones(1)))
    table.apply(50, encode_share_history(G, [(None, ones(0)), (45, ones(1))]))  # only the last may: passed over, logged
    assert table.shares[G].position == 40


def test_shared_entries_and_route_groups_round_trip_and_are_bounded():
    data = shared_data([G, ("h", "+/x")], b"record")
    assert split_shared(data) == ((G, ("h", "+/x")), b"record")
    records = rp.Records((Entry(SHARED, "jobs", 1, 7, 0, 5, data),))
    assert round_trip(records) == records
    routes = rp.Routes(1, ("a/#",), (), -1, (G,))
    assert round_trip(routes) == routes
    at_limit = rp.Routes(1, (), (), -1,
                         tuple(("g", "f%d" % i) for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS)))
    assert round_trip(at_limit) == at_limit
    past = rp.Routes(1, (), (), -1,
                     tuple(("g", "f%d" % i) for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS + 1)))
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

    from metaq.mqttcluster.following.peers import MqttCluster
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_GROUPS", 2)
    log = Log()
    port = SimpleNamespace(share_histories=log.histories, record_share_history=log.record)
    cluster = MqttCluster(0, SimpleNamespace(written_position=0, log_start=0), None, port, None, lambda: True)
    event = cluster.route_changed
    cluster.groups_changed({G: 1, ("a", "x"): 1})  # at the limit: both
    assert cluster.groups() == (("a", "x"), G) and event.is_set() and cluster.route()[0] == 1
    cluster.groups_changed({G: 1, ("a", "x"): 1, ("b", "y"): 1})  # past it: the first two in order
    assert cluster.groups() == (("a", "x"), ("b", "y"))
    assert cluster.shares.brokers(("b", "y")) == ones(0) and cluster.shares.brokers(G) == ()
    version = cluster.route()[0]
    cluster.groups_changed({("b", "y"): 1, ("a", "x"): 1})  # the same groups: no new route
    assert cluster.route()[0] == version


def test_a_change_of_members_only_goes_into_the_weights_once_settled(monkeypatch):
    """A group's first member here goes into the route at once; a burst of members joining after it makes one
    change, MQTT_CLUSTER_SHARE_SETTLE_S later, with the count then (capped at MQTT_CLUSTER_SHARE_WEIGHT_MAX); a count
    within MQTT_CLUSTER_SHARE_WEIGHT_STEP_PERCENT of the route's changes nothing, one past it does."""
    import gevent
    from types import SimpleNamespace

    from metaq.mqttcluster.following.peers import MqttCluster
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_SHARE_SETTLE_S", 0.05)
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_SHARE_WEIGHT_MAX", 8)
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_SHARE_WEIGHT_STEP_PERCENT", 25)
    log = Log()
    port = SimpleNamespace(share_histories=log.histories, record_share_history=log.record)
    cluster = MqttCluster(0, SimpleNamespace(written_position=0, log_start=0), None, port, None, lambda: True)
    cluster.groups_changed({G: 1})
    assert cluster.weights() == (1,) and cluster.route()[0] == 1 and log.table.shares[G].changes[-1][1] == ones(0)
    for members in range(2, 5):
        cluster.groups_changed({G: members})
    assert cluster.weights() == (1,) and cluster.route()[0] == 1  # settling
    gevent.sleep(0.1)
    assert cluster.weights() == (4,) and cluster.route()[0] == 2 and log.table.shares[G].changes[-1][1] == ((0, 4),)
    cluster.groups_changed({G: 5})  # a quarter more: at the step, nothing
    gevent.sleep(0.1)
    assert cluster.weights() == (4,) and cluster.route()[0] == 2
    cluster.groups_changed({G: 20})  # past the largest weight: counted up to it
    gevent.sleep(0.1)
    assert cluster.weights() == (8,) and cluster.route()[0] == 3
    cluster.groups_changed({G: 4, ("a", "x"): 1})  # a group's first member: at once, with the counts now
    assert cluster.weights() == (1, 4) and cluster.route()[0] == 4
    cluster.stop()


def test_brokers_are_weighted_by_their_members_and_the_weights_are_kept_in_the_history():
    """Three members here and one on a peer: this broker takes about three quarters of one partition's messages;
    the history records the weights (a reader of an older version, which knows no weights, reads each as 1)."""
    log = Log()
    shares = log.shares()
    shares.set_local({G: 3})
    shares.set_peer(1, "link-1", {G: 1})
    owners = [shares.owner(G, 0, "jobs", 0, at) for at in range(1000, 9000)]
    assert 0.7 * 8000 <= owners.count(0) <= 0.8 * 8000, owners.count(0)
    assert log.table.shares[G].changes[-1][1] == ((0, 3), (1, 1))
    data = encode_share_history(G, log.table.shares[G].changes)
    assert b'"w":[[3],[3,1]]' in data
    assert encode_share_history(G, [(5, ones(0, 1))]) == b'{"k":"b","n":"g","f":"jobs/#","h":[[5,[0,1]]]}'
    table = SessionTable()
    table.apply(10, b'{"k":"b","n":"g","f":"jobs/#","h":[[5,[0,1]]]}')  # as an older broker wrote it
    assert table.shares[G].changes == ((5, ones(0, 1)),)
    for bad in (b'"w":[[-1,1]]', b'"w":[[1]]', b'"w":[[1,1],[1,1]]', b'"w":[[1,65536]]'):
        table.apply(20, b'{"k":"b","n":"g","f":"jobs/#","h":[[5,[0,1]]],' + bad + b"}")  # passed over, logged
        assert table.shares[G].position == 10
    shares.set_local({G: 1})  # the same brokers, another weight: a change
    assert log.table.shares[G].changes[-1][1] == ones(0, 1)


def test_route_weights_round_trip_split_over_parts_and_are_bounded():
    weighted = rp.Routes(1, ("a/#",), (), -1, (G, ("h", "x")), weights=(3, 1))
    assert round_trip(weighted) == weighted
    assert round_trip(rp.Routes(1, (), (), -1, (G,))).weights == ()  # none sent: each 1 (an older broker's)
    many = rp.Routes(1, (), (), -1, tuple(("g", "f%d" % i) for i in range(3000)), weights=tuple(range(1, 3001)))
    parts = split_routes(many, most=4096)
    assert len(parts) > 1
    joined = None
    for part in parts:
        joined = join_routes(joined, round_trip(part))
    assert joined.groups == many.groups and joined.weights == many.weights
    at = rp.Routes(1, (), (), -1, (G,), weights=(mqttcluster_limits.MQTT_CLUSTER_SHARE_WEIGHT_MAX,))
    assert round_trip(at) == at
    for bad in ((-1,), (mqttcluster_limits.MQTT_CLUSTER_SHARE_WEIGHT_MAX + 1,), (1, 1)):
        with pytest.raises(RemoteProtocolError, match="weight"):
            round_trip(rp.Routes(1, (), (), -1, (G,), weights=bad))


def test_groups_kept_with_no_member_connected_never_keep_a_live_group_out():
    """A table of MQTT_CLUSTER_MAX_GROUPS groups all kept for members away (weight 0): a group with a member connected
    takes the place of one of them; a kept group past the table takes no place (refused, counted)."""
    log = Log()
    shares = log.shares(most=2)
    a, b = ("a", "x"), ("b", "y")
    shares.set_local({a: 0, b: 0})
    assert set(log.table.shares) == {a, b}
    shares.set_peer(1, "link-1", {G: 1})
    assert shares.refused == 0 and G in log.table.shares and len(log.table.shares) == 2
    shares.set_peer(2, "link-2", {("c", "z"): 0})
    assert shares.refused == 1 and ("c", "z") not in log.table.shares and G in log.table.shares
