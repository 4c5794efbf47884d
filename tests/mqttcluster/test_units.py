"""The MQTT cluster's pure parts: the ROUTES and RECORDS frames (whole and byte by byte), the route's aggregation,
the inbox copy and its origin, the resume positions."""

import json
import time
from types import SimpleNamespace

import gevent
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.errors import RemoteProtocolError
from metaq.mqtt.records import message_of, record_data
from metaq.mqtt.seam import Alone
from metaq.mqttcluster.clientids import calls, handover
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.asks import Asks
from metaq.mqttcluster.clientids.ids import home_of
from metaq.mqttcluster.following.routes import aggregate
from metaq.mqttcluster.following.peers import MqttCluster
from metaq.mqttcluster.members import Members
from metaq.mqttcluster.serve import FilterSet, PeerFollow, PeerServer
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import (MESSAGE, POSITION, RESUMED, RETAINED, Entry, _json, _json_size,
                                             decode_routes, join_routes, record_check, split_routes)
from metaq.protocol.stream import NEED_DATA
from metaq.store.config import TopicSpec
from tests.harness.store import NOW, open_store

ROUTES = rp.Routes(3, ("sensors/#", "+/alarm", "a/b"), (("sensors", 0, 17), ("a", 1, 0)), 5)
RECORDS = rp.Records((Entry(MESSAGE, "sensors", 1, 42, 1, 1700000000000, b"\x00\x00\x00\x02ab-payload"),
                      Entry(POSITION, "sensors", 1, 43),
                      Entry(RETAINED, "%MQTT%", 0, 9, 0, 1700000000001, b"U{\"t\":\"x\"}")))


@pytest.mark.parametrize("event", [ROUTES, RECORDS, rp.Records(())])
def test_frames_round_trip_whole_and_byte_by_byte(event):
    data = rp.serialize(event)
    whole = rp.ReplicationParser()
    whole.receive_data(data)
    assert whole.next_event() == event
    slow = rp.ReplicationParser()
    got = NEED_DATA
    for i in range(len(data)):
        assert got is NEED_DATA
        slow.receive_data(data[i:i + 1])
        got = slow.next_event()
    assert got == event
    assert rp.joined(event) == data  # as a sender writes it in one buffer: the same bytes


def _records_frame(payload):
    """A RECORDS frame around ``payload`` as it is, its CRC right."""
    head = rp.FRAME_HEADER.pack(rp.MAGIC, rp.VERSION, rp.T_RECORDS, 0, len(payload), 0)[:12]
    return head + rp.crc32(payload, rp.crc32(head)).to_bytes(4, "big") + payload


@pytest.mark.parametrize("payload, error", [
    (b"\x00\x00\x00\x01", "runs past the frame"),  # count 1 with no entry
    (rp.serialize(RECORDS)[rp.FRAME_HEADER.size:] + b"x", "leaves 1 bytes over"),
    (b"\x00\x00\x00\x04" + rp.serialize(RECORDS)[rp.FRAME_HEADER.size + 4:], "runs past the frame")])
def test_a_records_frame_that_does_not_fill_itself_is_refused_as_its_entries_are_read(payload, error):
    """Only the content is wrong: the frame is read, and its entries are decoded one at a time as they are copied
    (``RecordEntries``), the first that does not fit (or the bytes left over) a fatal error there."""
    p = rp.ReplicationParser()
    p.receive_data(_records_frame(payload))
    records = p.next_event()
    with pytest.raises(RemoteProtocolError, match=error):
        list(records.entries)


def test_routes_bounds():
    too_many = rp.Routes(1, tuple("f%d" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS + 1)))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(too_many))
    with pytest.raises(RemoteProtocolError, match="MQTT_CLUSTER_MAX_FILTERS"):
        p.next_event()
    at_limit = rp.Routes(1, tuple("f%d" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS)))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(at_limit))
    assert p.next_event() == at_limit


def _joined(parts):
    """The route a receiver joins of ``parts`` sent as frames (each parsed back)."""
    p, route = rp.ReplicationParser(), None
    for part in parts:
        p.receive_data(rp.serialize(part))
        route = join_routes(route, p.next_event())
    assert not route.more
    return route


def test_a_route_at_every_limit_goes_in_parts_that_join_to_it():
    """A route holding MQTT_CLUSTER_MAX_POSITIONS positions of the longest topic names with their checks, as many
    filters and groups as a route may hold, is far past one ROUTES frame: it goes in parts within
    MQTT_CLUSTER_ROUTES_BYTES each, and the receiver joins them to the same route."""
    topic = "t" * limits.MAX_NAME_BYTES
    n = mqttcluster_limits.MQTT_CLUSTER_MAX_POSITIONS
    route = rp.Routes(4, tuple("f/%d" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS)),
                      tuple((topic, i % limits.MAX_PARTITIONS, 2**62 + i) for i in range(n)), 9,
                      tuple(("g", "s/%d" % i) for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS)),
                      tuple((1 << 32) | i for i in range(n)))
    with pytest.raises(ValueError, match="MQTT_CLUSTER_ROUTES_BYTES"):
        rp.serialize(route)  # one frame cannot hold it
    parts = split_routes(route)
    assert len(parts) > 1 and all(p.more for p in parts[:-1]) and not parts[-1].more
    assert all(len(rp.serialize(p)) <= mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES + rp.FRAME_HEADER.size for p
               in parts)
    assert _joined(parts) == route
    small = rp.Routes(4, ("a/#",), (("a", 0, 3),), 1, (), (7,))
    assert split_routes(small) == [small] and _joined([small]) == small


@settings(max_examples=300)
@given(st.recursive(st.integers(-2**63, 2**63 - 1) | st.booleans() | st.none()
                    | st.text(st.characters(blacklist_categories=("Cs",)) | st.sampled_from('\\"/\x00\n\x7f\u2028')),
                    lambda inner: st.lists(inner, max_size=4).map(tuple) | st.lists(inner, max_size=4), max_leaves=12))
def test_a_routes_field_is_measured_as_long_as_its_json(value):
    """``split_routes`` measures each item without writing it (``_json_size``): the length is the JSON's, for any
    ints, strings (escapes and UTF-8 of any code point), and tuples or lists of them; measured again with the
    strings it has seen, the same."""
    names = {}
    assert _json_size(value, names) == len(_json(value)) == _json_size(value, names)


def test_a_route_in_parts_past_a_limit_is_refused():
    """Parts that join to more than a route may hold (one position past MQTT_CLUSTER_MAX_POSITIONS, one filter past
    MQTT_CLUSTER_MAX_FILTERS) are a fatal protocol error, as one frame holding as many is; so is a part of another
    broker."""
    n = mqttcluster_limits.MQTT_CLUSTER_MAX_POSITIONS
    parts = split_routes(rp.Routes(1, (), tuple(("t", 0, i) for i in range(n))), most=1 << 20)
    assert len(_joined(parts).positions) == n
    one_more = parts[:-1] + [parts[-1]._replace(more=True), rp.Routes(1, (), (("t", 1, 0),))]
    with pytest.raises(RemoteProtocolError, match="MQTT_CLUSTER_MAX_POSITIONS"):
        _joined(one_more)
    filters = tuple("f%d" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS + 1))
    with pytest.raises(RemoteProtocolError, match="MQTT_CLUSTER_MAX_FILTERS"):
        _joined(split_routes(rp.Routes(1, filters), most=20_000))
    with pytest.raises(RemoteProtocolError, match="broker 2"):
        join_routes(rp.Routes(1, ("a",), more=True), rp.Routes(2, ("b",)))


def test_calls_to_a_peer_take_turns_in_order_up_to_their_limit():
    """``calls.Turns``: up to its limit at once, one past waits; an exclusive call waits for every call before it and
    holds back every call after it (a call never passes one waiting); one that waits past its timeout takes
    nothing and lets the calls behind it go."""
    turns, order = calls.Turns(2), []

    def call(name, exclusive=False, hold=0.05, timeout=5.0):
        if turns.take(exclusive, timeout):
            order.append(name)
            gevent.sleep(hold)
            turns.give()
        else:
            order.append(name + " gave up")

    first = [gevent.spawn(call, n) for n in ("a", "b")]  # at the limit: both go at once
    gevent.sleep(0)
    assert order == ["a", "b"] and turns.going == 2
    rest = [gevent.spawn(call, "c"), gevent.spawn(call, "x", True), gevent.spawn(call, "d")]  # one past: waits
    gevent.sleep(0)
    assert order == ["a", "b"]
    gevent.joinall(first + rest, timeout=5)
    assert order == ["a", "b", "c", "x", "d"] and turns.going == 0
    del order[:]
    busy = gevent.spawn(call, "long", hold=0.3)
    gevent.sleep(0)
    waits = [gevent.spawn(call, "x", True, timeout=0.05), gevent.spawn(call, "e"), gevent.spawn(call, "f", timeout=1)]
    gevent.joinall([busy] + waits, timeout=5)
    assert order == ["long", "x gave up", "e", "f"], order  # e and f waited behind x (not past it) until it gave up


def test_route_aggregation_at_and_past_its_limit():
    filters = ["devices/%d/cmd" % i for i in range(5)] * 3 + ["alerts/#"]
    assert aggregate(filters, most=6) == tuple(sorted(set(filters)))
    assert aggregate(filters, most=5) == ("alerts/#", "devices/#")
    assert aggregate(filters + ["+/x"], most=5) == ("#",)
    assert aggregate(["a%d/x" % i for i in range(4)], most=3) == ("#",)  # whole topics past it too: everything


def test_filter_set_matches_as_mqtt_does():
    fs = FilterSet(["sensors/#", "+/alarm"])
    assert fs.match("sensors") and fs.match("sensors/a/b") and fs.match("door/alarm")
    assert not fs.match("door/open") and not fs.match("$SYS/alarm")
    assert fs.topics(["sensors", "door", "%MQTTIN%", "other"]) == {"sensors", "door", "other"}


def test_inbox_copy_keeps_the_message_and_names_its_origin():
    flag, data = record_data("sensors/r1", b"21.5", 2, "dev-1", {"user_property": [("k", "v")]}, True)
    copy = inbox.copy_of(2, "sensors", 1, 77, flag, data, 1_000)
    m = message_of(inbox.INBOX, *copy)
    assert (m.topic, m.payload, m.qos, m.client_id, m.retain) == ("sensors/r1", b"21.5", 2, "dev-1", True)
    assert m.properties["user_property"] == (("k", "v"),)
    assert inbox.origin_of(*copy) == (2, "sensors", 1, 77)
    plain = inbox.copy_of(1, "sensors", 0, 3, 0, b"from-text", 1_000)  # a text put: topic name = its topic
    m = message_of(inbox.INBOX, *plain)
    assert (m.topic, m.payload, m.qos) == ("sensors", b"from-text", 1)
    expired = record_data("s/x", b"p", 1, None, {"message_expiry_interval": 1}, False, 0)
    assert inbox.copy_of(1, "s", 0, 0, *expired, 5_000) is None


def test_resume_positions_at_and_past_their_limit():
    pos = inbox.Positions(most=2)
    assert pos.copied(1, "t", 0, 5) and pos.copied(1, "t", 0, 3)
    assert pos.get(1, "t", 0) == 6 and pos.is_copied(1, "t", 0, 5) and not pos.is_copied(1, "t", 0, 6)
    assert pos.copied(2, "t", 0, 0)
    assert not pos.copied(3, "t", 0, 0) and pos.refused == 1  # past it: not remembered, said
    assert pos.of(1) == (("t", 0, 6),)
    assert inbox.partition_of(1, "t", 0) == inbox.partition_of(1, "t", 0)


class FakeStore:
    """What a PeerFollow reads of a store: its topics, their partitions and ends."""

    def __init__(self, topics):
        self.topics = topics  # name -> partitions

    def known_topics(self):
        return sorted(self.topics)

    def partitions_of(self, topic):
        return self.topics[topic]

    def max_offset(self, topic, partition):
        return 10

    def min_offset(self, topic, partition):
        return 0

    def partitions_made(self):
        return sum(self.topics.values())

    written_position = 0

    def record_position(self, topic, partition, offset):
        return None


def test_a_peer_follows_at_most_max_followed_partitions(monkeypatch):
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_FOLLOWED", 4)
    store = FakeStore({"a": 2, "b": 2})
    follow = PeerFollow(store, rp.Routes(1, ("#",), (("a", 0, 3),)))
    assert follow.cursors == {("a", 0): 3, ("a", 1): 10, ("b", 0): 10, ("b", 1): 10}  # at it: all
    store.topics["c"] = 1  # one past it: not followed, said once
    follow.rescan()
    assert ("c", 0) not in follow.cursors and follow.refused_logged
    follow.set_filters(("c/#",))  # the others dropped: room again; a topic known when the route came starts at its end
    assert follow.cursors == {("c", 0): 10}


class MadeStore(FakeStore):
    """A FakeStore whose partitions end at ``ends`` (else 10), their first records at log positions ``firsts``."""

    def __init__(self, topics, firsts):
        super().__init__(topics)
        self.firsts, self.ends, self.written_position = firsts, {}, 1000

    def max_offset(self, topic, partition):
        return self.ends.get((topic, partition), 10)

    def record_position(self, topic, partition, offset):
        return self.firsts.get((topic, partition))


def test_a_follow_resumed_starts_a_partition_without_a_position_where_the_earlier_follow_left_it(monkeypatch):
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_PEERS", 2)
    store = MadeStore({"a": 1, "c": 1}, {("a", 0): 0, ("c", 0): 500})
    server = PeerServer(store, None)
    assert server.since(1) is None  # never followed since this broker's start: as before, from the end
    first = PeerFollow(store, rp.Routes(1, ("a/#", "b/#")), since=server.since(1))
    assert first.cursors == {("a", 0): 10} and first.started == {("a", 0): 10} and first.scanned_at == 1000
    server.follows[id(first)] = first
    store.ends[("a", 0)] = 20  # the link cut, unseen here: messages of a, and topic b made (its first record at 1500)
    store.topics["b"], store.firsts[("b", 0)], store.written_position = 1, 1500, 2000
    again = PeerFollow(store, rp.Routes(1, ("a/#", "b/#", "c/#")), since=server.since(1))
    # a: where the first follow left it (the peer never said it got it); b: all of it (made since the first follow
    # looked); c: made before and not read by the earlier route: a new subscription's, from now on
    assert again.cursors == {("a", 0): 10, ("b", 0): 0, ("c", 0): 10}
    assert again.since is None  # for the first route only
    del server.follows[id(first)]
    server.follow_ended(first)
    server.follow_ended(again)  # the newer follow ended too; the older, ended later, does not set it back
    server.follow_ended(first)
    assert server.since(1) == (2000, {("a", 0): 10, ("b", 0): 0, ("c", 0): 10})
    later = PeerFollow(store, rp.Routes(1, ("a/#", "b/#", "c/#"), (("a", 0, 15),)), since=server.since(1))
    assert later.cursors == {("a", 0): 15, ("b", 0): 0, ("c", 0): 10}  # a position the peer sent wins
    two, three = (PeerFollow(store, rp.Routes(b, ("a/#",))) for b in (2, 3))
    server.follow_ended(two)  # at MQTT_CLUSTER_MAX_PEERS peers: all kept
    assert sorted(server.ended) == [1, 2]
    server.follow_ended(three)  # one past it: the oldest forgotten (its next follow starts as before)
    assert sorted(server.ended) == [2, 3] and server.since(1) is None


def test_peers_retained_messages_newest_wins_within_their_limit(monkeypatch):
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_RETAINED", 2)
    retained = MqttCluster(0, None, None, None, None, lambda: True).retained
    retained.keep("x", 100, 2, "x@100")
    retained.keep("x", 100, 1, "older broker id")  # same time: the higher broker id stays
    retained.keep("x", 99, 5, "older")
    assert retained.names["x"] == (100, 2, "x@100")
    retained.keep("x", 101, 1, None)  # a clear, newer: it wins
    assert retained.names["x"] == (101, 1, None) and not retained.knows("x")
    retained.keep("y", 1, 1, "y")  # at the limit: kept
    retained.keep("z", 1, 1, "z")  # past it: not kept
    assert set(retained.names) == {"x", "y"}


class FakeZk:
    """The members' nodes as the registry writes them: ``<root>/brokers/ids/<id>/{master,replication}``."""

    connected = True

    def __init__(self, ids):
        self.ids = ids
        self.watched = set()

    def get_children(self, path, watch=None):
        self.watched.add(path)
        return [str(i) for i in self.ids]

    def get(self, path, watch=None):
        self.watched.add(path)
        bid = int(path.split("/")[-2])
        return json.dumps({"address": "127.0.0.1:%d" % (20000 + bid)}).encode(), SimpleNamespace(ephemeralOwner=bid)


def test_the_members_are_read_once_with_a_watch_on_each_node():
    zk = FakeZk([0, 2])
    assert Members(zk, "/meta").read() == {0: ("127.0.0.1:20000", 0), 2: ("127.0.0.1:20002", 2)}
    assert zk.watched == {"/meta/brokers/ids", "/meta/brokers/ids/0/replication", "/meta/brokers/ids/2/replication"}


def test_the_members_reader_wakes_its_listeners_when_the_members_change_only():
    zk = FakeZk([1])
    members = Members(zk, "/meta", poll_s=0.01)
    seen = []
    members.on_change(lambda: seen.append(None if members.current is None else sorted(members.current)))
    members.start()
    gevent.sleep(0.1)
    zk.ids = [1, 2]
    gevent.sleep(0.1)
    zk.connected = False  # ZooKeeper cannot be read: None (those who use it keep what they had)
    gevent.sleep(0.1)
    members.stop()
    assert seen == [[1], [1, 2], None] and members.readings > 3


def test_a_broker_follows_at_most_max_peers_the_lowest_ids_first(monkeypatch):
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_PEERS", 2)
    zk = FakeZk([0, 1, 2])
    cluster = MqttCluster(0, None, None, None, Members(zk, "/meta"), lambda: True)
    read = cluster.members.read
    assert cluster.peers_of(read()) == {1: "127.0.0.1:20001", 2: "127.0.0.1:20002"}  # at it: both
    assert cluster.peers_refused == 0
    zk.ids = [0, 1, 2, 3]
    assert sorted(cluster.peers_of(read())) == [1, 2] and cluster.peers_refused == 1  # one past it: said in stats
    assert cluster.peers_of(None) is None  # ZooKeeper unread: the links stay as they are


def test_a_subscription_adds_its_filter_to_the_route_at_once_and_a_covered_one_changes_nothing(monkeypatch):
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_FILTERS", 2)
    port = SimpleNamespace(subscribed_filters=lambda: iter(["a/1"]))
    cluster = MqttCluster(0, None, None, port, None, lambda: True)
    cluster.routes_changed()
    assert cluster.route() == (1, ("a/1",))
    woken = cluster.route_changed
    cluster.routes_changed("a/2")
    assert cluster.route() == (2, ("a/1", "a/2")) and woken.is_set() and not cluster.route_changed.is_set()
    cluster.routes_changed("a/2")  # held: no new version
    cluster.routes_changed("a/3")  # past the limit (2 here): the whole topic a
    assert cluster.route() == (3, ("a/#",))
    cluster.routes_changed("a/4")  # covered
    assert cluster.route() == (3, ("a/#",))
    cluster.routes_changed()  # the periodic recomputation: only what sessions hold
    assert cluster.route() == (4, ("a/1",))


def test_a_marker_keeps_a_partitions_position_and_is_no_message():
    flag, data = inbox.marker(2, "sensors", 1, 0, 1_000)
    assert inbox.origin_of(flag, data) == (2, "sensors", 1, -1)  # resumes at 0
    pos = inbox.Positions()
    pos.copied(*inbox.origin_of(flag, data))
    assert pos.get(2, "sensors", 1) == 0
    assert message_of(inbox.INBOX, flag, data).topic.startswith("$")  # delivery sends no $ name of the inbox
    assert inbox.origin_of(*inbox.marker(2, "sensors", 1, 9, 1_000)) == (2, "sensors", 1, 8)


class RecordsStore(FakeStore):
    """A FakeStore whose partition ``t``-0 holds five records of 100 log bytes each, at log positions 0, 100, ..."""

    def max_offset(self, topic, partition):
        return 5

    def read_records(self, topic, partition, offset, max_count, max_bytes):
        recs = [SimpleNamespace(position=100 * n, total_size=100, queue_offset=n, flag=0, store_ts_ms=1,
                                data=b"m%d" % n) for n in range(offset, 5)][:max_count]
        return recs, offset + len(recs)


def test_a_peer_is_sent_nothing_past_the_confirmed_end():
    """``sync``: a record ending past the master's confirmed log position waits (``held``), and goes once confirmed."""
    follow = PeerFollow(RecordsStore({"t": 1}), rp.Routes(1, ("t",), (("t", 0, 0),)))
    assert [e.kind for e in follow.batch(0)] == [POSITION] and follow.held  # announced, no record confirmed yet
    got = follow.batch(250)
    assert [e.offset for e in got if e.kind == MESSAGE] == [0, 1] and follow.held  # 2 ends at 300 > 250
    assert POSITION not in [e.kind for e in got]  # the copies of 0 and 1 are the peer's position: 2, none past it
    assert follow.batch(250) == [] and follow.held  # nothing more until the slaves confirm
    got = follow.batch(500)
    assert [e.offset for e in got if e.kind == MESSAGE] == [2, 3, 4] and not follow.held
    follow.cursors[("t", 0)] = 0
    assert [e.offset for e in follow.batch(None) if e.kind == MESSAGE] == [0, 1, 2, 3, 4]  # async: no bound


def test_routes_carry_a_check_per_position_and_an_older_peers_routes_none():
    check = record_check(1_700_000_000_000, b"m")
    assert check >> 32 == 1 and check != record_check(1_700_000_000_001, b"m") != record_check(1_700_000_000_000, b"n")
    checked = ROUTES._replace(checks=(check, 0))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(checked))
    assert p.next_event() == checked
    older = json.dumps({"broker": 3, "filters": ["a"], "positions": [["a", 0, 4]], "retained": -1}).encode()
    assert decode_routes(older).checks == ()  # a peer of the version before: resumed unchecked
    with pytest.raises(RemoteProtocolError, match="one check per position"):
        decode_routes(json.dumps({"broker": 3, "filters": [], "positions": [["a", 0, 4]], "checks": [1, 2]}).encode())
    resumed = rp.Records((Entry(POSITION, "a", 0, 4, RESUMED, check),))
    p.receive_data(rp.serialize(resumed))
    assert p.next_event() == resumed


def test_a_resume_position_keeps_its_check_and_a_marker_sets_it_back():
    c4, c9 = record_check(1, b"4"), record_check(1, b"9")
    pos = inbox.Positions()
    pos.copied(1, "t", 0, 9, c9)
    pos.copied(1, "t", 0, 4, c4)  # behind it: nothing changes
    assert pos.get(1, "t", 0) == 10 and pos.checks(1, pos.of(1)) == (c9,)
    pos.copied(1, "t", 0, 4, c4, rewound=True)  # the origin resumed the copy there
    assert pos.get(1, "t", 0) == 5 and pos.checks(1, pos.of(1)) == (c4,)
    copy = inbox.copy_of(1, "t", 0, 9, 0, b"x", 1_000, check=c9)
    mark = inbox.marker(1, "t", 0, 5, 1_000, c4)
    assert inbox.place_of(*copy) == ((1, "t", 0, 9), c9, False, (0, 0))
    assert inbox.place_of(*mark) == ((1, "t", 0, 4), c4, True, (0, 0))
    recovered = inbox.Positions()
    assert inbox.recover(InboxStore([copy, mark]), recovered) == 2  # in the inbox's order: the marker last
    assert recovered.get(1, "t", 0) == 5 and recovered.checks(1, recovered.of(1)) == (c4,)


class InboxStore:
    """An inbox of one partition holding ``records`` ((flag, data), ...)."""

    def __init__(self, records):
        self.records = records

    def partitions_of(self, topic):
        return 1

    def min_offset(self, topic, partition):
        return 0

    def max_offset(self, topic, partition):
        return len(self.records)

    def read_records(self, topic, partition, offset, max_count, max_bytes):
        recs = [SimpleNamespace(queue_offset=n, flag=f, data=d) for n, (f, d) in enumerate(self.records)][offset:]
        return recs[:max_count], offset + len(recs[:max_count])


class ForkedStore(RecordsStore):
    """A RecordsStore whose epoch 2 begins at log position 300 (offset 3): a failover's new master."""

    epochs = SimpleNamespace(entries=[(1, 0, 11), (2, 300, 22)])

    def record_position(self, topic, partition, offset):
        return 100 * offset if offset < 5 else None

    def record_spans(self, topic, partition, position, end, most):
        return [(n, 100 * n, 100) for n in range(5) if 100 * n >= position][:most]


def test_a_resume_position_is_proved_by_its_check_else_resumed_at_the_epoch_of_the_record_there():
    store = ForkedStore({"t": 1})
    ours = record_check(1, b"m3")  # what this store holds at offset 3
    follow = PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 4),), checks=(ours,)))
    assert follow.cursors[("t", 0)] == 4 and not follow.rewound  # the same record: resumed where it was
    theirs = record_check(1, b"lost")  # another record at offset 3: the peer copied a tail this log cut
    follow = PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 4),), checks=(theirs,)))
    assert follow.cursors[("t", 0)] == 3  # the first record of the epoch holding offset 3
    announced = follow.batch()[0]
    assert (announced.kind, announced.offset, announced.flag) == (POSITION, 3, RESUMED)
    assert announced.ts == record_check(1, b"m2")  # the check of the record before it, for the next resume
    past = PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 7),), checks=(theirs,)))  # past this log's end
    assert past.cursors[("t", 0)] == 3  # from the latest epoch
    unchecked = PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 4),)))  # an older peer: as it says
    assert unchecked.cursors[("t", 0)] == 4


def test_a_retained_offset_is_proved_by_its_check_as_a_position_is():
    """The retained offset a peer resumes from comes with the check of the retained record before it as the peer
    copied it: kept when this broker's record there is that one; after an async failover that cut it, resumed at
    the epoch holding it, so the retained records the new master wrote at offsets the peer saw others at are sent
    too. A peer's RETAINED copies give it the offset and the check it sends next."""
    store = ForkedStore({"t": 1})
    ours, theirs = record_check(1, b"m3"), record_check(1, b"lost")
    kept = PeerFollow(store, rp.Routes(1, (), (), 4, retained_check=ours))
    assert kept.retained == 4
    cut = PeerFollow(store, rp.Routes(1, (), (), 4, retained_check=theirs))
    assert cut.retained == 3
    assert PeerFollow(store, rp.Routes(1, (), (), 4)).retained == 4  # an older peer: as it says
    assert PeerFollow(store, rp.Routes(1, (), (), -1, retained_check=theirs)).retained == -1  # none asked
    routes = rp.Routes(1, ("a/#",), (), 4, retained_check=theirs)
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(routes))
    assert p.next_event() == routes


class Ticker:
    """A greenlet that counts its turns of the loop: how often others ran while the current greenlet worked."""

    def __enter__(self):
        self.turns = 0
        self._g = gevent.spawn(self._run)
        gevent.sleep(0)
        return self

    def _run(self):
        while True:
            self.turns += 1
            gevent.sleep(0.001)

    def __exit__(self, *exc):
        self._g.kill()

    def during(self, fn, *args):
        """``(fn(*args), the ticker's turns meanwhile)``."""
        before = self.turns
        value = fn(*args)
        return value, self.turns - before


def test_a_handovers_json_is_built_and_parsed_in_turns_of_the_loop():
    """A handover's answer (a session of MQTT_HANDOVER_MAX_MESSAGES queued messages, about
    MQTT_HANDOVER_MAX_BYTES) is encoded and parsed an item at a time: the loop's other greenlets run meanwhile."""
    answer = {"session": {"c": "big", "inf": [], "dropped": 0,
                          "queued": [[1, "t", 0, "x" * 2200] for _
                                     in range(mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES)]},
              "from": 1}
    with Ticker() as ticker:
        body, encoding = ticker.during(calls._encode, answer)
        parsed, parsing = ticker.during(calls._decode, body)
    assert body == json.dumps(answer, separators=(",", ":")).encode() and parsed == answer  # the same JSON
    assert encoding > 0 and parsing > 0


def test_a_call_at_the_one_step_decode_bound_and_one_past_it_reads_the_same():
    """A call of at most DECODE_WHOLE_BYTES is decoded in one step, a longer one in turns: the same value either way,
    and what is not a JSON object refused as a protocol error on both sides of the bound."""
    for size in (calls.DECODE_WHOLE_BYTES, calls.DECODE_WHOLE_BYTES + 1):
        request = {"op": "registers", "id": 3, "r": [{"c": "d1", "clean": False}], "pad": ""}
        request["pad"] = "p" * (size - len(calls._encode(request)))
        body = calls._encode(request)
        assert len(body) == size and calls._decode(body) == request == json.loads(body)
        for bad in (b"[" + body[1:-1] + b"]", body[:-1], b"{" + b" " * (size - 2) + b"}x"):
            with pytest.raises(RemoteProtocolError):
                calls._decode(bad)


def test_a_call_holding_what_orjson_will_not_write_is_sent_as_the_json_module_writes_it():
    """A lone surrogate in a client id, an int key in a dict (in a list's item or not), a non-ASCII name: encoded
    (the json module's way where orjson refuses) and read back."""
    request = {"op": "register", "id": 1, "r": [{"c": "dev-\ud800", "k": {1: "x"}, "n": "capteur-é"}],
               "stop": {2: {"a": 1}}}
    body = calls._encode(request)
    assert json.loads(body) == {"op": "register", "id": 1, "r": [{"c": "dev-\ud800", "k": {"1": "x"},
                                                                  "n": "capteur-é"}], "stop": {"2": {"a": 1}}}
    assert calls._decode(body) == json.loads(body)


def test_a_handover_is_adopted_in_turns_of_the_loop():
    """Each message a session brings is written on its own turn: the loop's other greenlets run between them."""
    written = []

    def carry(client_id, topic, flag, data):
        time.sleep(0.0001)  # a write's cost, without yielding
        written.append(data)
        return len(written) - 1

    port = SimpleNamespace(carry=carry, adopt=lambda saved: None)
    state = {"c": "big", "u": None, "v": 5, "e": 600, "subs": [], "q2": [], "sh": [], "inf": [],
             "queued": [[1, "t", 0, "eA=="] for _ in range(2000)], "dropped": 0}
    with Ticker() as ticker:
        saved, adopting = ticker.during(handover.adopt, port, FakeStore({}), state, None)
    assert len(saved.carried) == 2000 and written[0] == b"x" and adopting > 0


def _port_state():
    """The parts of an MqttPort that ``claim``, ``release`` and ``end_session`` keep ``began_clean`` with."""
    from metaq.mqtt.port import MqttPort
    port = SimpleNamespace(_clients={}, _recovered=set(), _began_clean=set(), cluster=Alone(),
                           table=SimpleNamespace(sessions={}, wills={}),
                           _held_by_another=lambda user, client_id: None, _take_from=lambda *a: None,
                           _write=lambda *a: None)
    for name in ("claim", "release", "end_session", "holds_any", "began_clean"):
        setattr(port, name, getattr(MqttPort, name).__get__(port))
    return port


def test_a_port_knows_which_copies_a_clean_start_1_connect_began_while_it_holds_them():
    """``MqttPort.began_clean``: set by a Clean Start 1 CONNECT, kept by a Clean Start 0 one that continues the
    copy, gone with the last thing holding the id (so bounded by the ids held); a Clean Start 0 CONNECT holding
    nothing here begins a copy that is not."""
    port = _port_state()
    conn = SimpleNamespace(session=SimpleNamespace(user=None))
    assert port.claim(conn, "a", True) is None and port.began_clean("a")
    again = SimpleNamespace(session=SimpleNamespace(user=None))
    port.claim(again, "a", False)  # continues it
    assert port.began_clean("a")
    port.table.sessions["a"] = object()  # its session kept offline once the connection ends
    port.release(again, "a")
    assert port.began_clean("a")
    port.end_session("a")  # the session ends (expiry, a takeover): nothing holds the id
    del port.table.sessions["a"]
    assert not port.began_clean("a") and port._began_clean == set()
    port.claim(conn, "b", False)
    assert not port.began_clean("b")
    port.claim(conn, "c", True)
    port.release(conn, "c")  # no session kept: gone with the connection
    assert not port.began_clean("c") and port._began_clean == set()


def test_a_copy_that_gives_way_ends_as_the_connect_that_made_the_standing_one(monkeypatch):
    """The home answers a hold with the ids to end and, of them, those whose standing copy a Clean Start 0 CONNECT
    made (``cont``); a drop carries it per id; the holder ends its copy with ``give_up(id, not continued)``: Clean
    Start 0 drops a delayed will, 1 (or not known) publishes it."""
    from metaq.mqttcluster.clientids.service import ClientIds
    ended = []
    port = SimpleNamespace(give_up=lambda c, clean, user: ended.append((c, clean)) or (None, None),
                           holds_any=lambda c: True)
    ids = ClientIds(port, None, None, 3, SimpleNamespace(close=lambda: None), 100, 0, lambda: True)
    ids.members = {1: "h:1", 2: "h:2", 3: "h:3"}
    ids._register_one(2, "kept", {"c": "kept", "clean": False})
    ids._register_one(2, "ended", {"c": "ended", "clean": True})
    ids._hold(2, {"ids": ["live-clean", "live"], "rec": [], "clean": ["live-clean"]})
    ids._hold(2, {"ids": ["older"]})  # a peer that does not say how its copies began
    answer = ids._hold(1, {"ids": ["rec-kept", "rec-ended"], "rec": ["rec-kept", "rec-ended"], "clean": []})
    assert answer == {"drop": [], "cont": []}  # new ids: registered
    answer = ids._hold(1, {"ids": ["kept", "ended", "live-clean", "live", "older"],
                           "rec": ["kept", "ended", "live-clean", "live", "older"], "clean": []})
    assert answer == {"drop": ["kept", "ended", "live-clean", "live", "older"], "cont": ["kept", "live"]}
    ids._hold(2, {"ids": ["rec-kept", "rec-ended"], "rec": [], "clean": ["rec-ended"]})
    # broker 1's recovered copies end once it is told (``_settle_owed``)
    assert ids._owed == {1: {"rec-kept": (0, True), "rec-ended": (0, False)}}
    ids._drop(1, {"ids": [["rec-kept", 0, True], ["x", 0, False], ["y", 0]]})  # and an older home's entry
    assert ended == [("rec-kept", False), ("x", True), ("y", True)]
    ids._owed.clear()
    ids._hold(3, {"ids": ["local"], "rec": ["local"], "clean": []})
    ids._hold(2, {"ids": ["local"], "rec": [], "clean": []})  # this broker's own recovered copy gives way at once
    assert ended[-1] == ("local", False)


def test_a_drop_waits_for_a_connect_here_whose_registration_is_on_its_way():
    """A drop (the id registered elsewhere while this broker held a copy) that comes while a CONNECT here waits for
    its home's answer waits for it: a later registration answered here keeps the copy the CONNECT goes on with; a
    CONNECT refused (no later answer) leaves the drop to end the copy."""
    from metaq.mqttcluster.clientids.service import ClientIds
    ended = []
    port = SimpleNamespace(give_up=lambda c, clean, user: ended.append((c, clean)) or (None, None),
                           holds_any=lambda c: True)
    ids = ClientIds(port, None, None, 3, SimpleNamespace(close=lambda: None), 100, 0, lambda: True)

    def answered(client_id, generation):
        gevent.sleep(0.05)
        if generation:
            ids._answered[client_id] = generation
        del ids._pending[client_id]

    for client_id, generation in (("registered-here", 7), ("refused", 0)):
        ids._pending[client_id] = 1
        waiter = gevent.spawn(answered, client_id, generation)
        ids._drop(1, {"ids": [[client_id, 3, True]]})
        waiter.join()
    assert ended == [("refused", False)]


def test_a_master_holds_its_mqtt_traffic_until_every_peer_follows_it_at_most_its_bound():
    """``MqttCluster.hold``: ``wait_followed`` (before a CONNACK, a will) returns once each other member follows this
    broker (its follow's route in), within the bound; at the bound it returns without the peers still away, and no
    sooner while one is."""
    members = Members(FakeZk([0, 1, 2]), "/meta")
    members.current = members.read()
    cluster = MqttCluster(0, None, None, None, members, lambda: True, hold_s=0.5)
    waiter = gevent.spawn(cluster.wait_followed)
    cluster.hold()
    cluster.followed(1, True)
    gevent.sleep(0.05)
    assert not waiter.dead  # broker 2 does not follow yet
    cluster.followed(2, True)
    waiter.join(0.2)
    assert waiter.dead  # both follow, well within the bound: at once
    cluster.followed(2, False)  # broker 2's follow ends, and a promotion holds again: until it follows, at most 0.5 s
    started = time.monotonic()
    cluster.hold()
    waiter = gevent.spawn(cluster.wait_followed)
    waiter.join(0.4)
    assert not waiter.dead  # within the bound
    waiter.join(1.0)
    assert waiter.dead and time.monotonic() - started < 1.0  # past it: goes on without broker 2
    cluster.followed(1, False)
    cluster.hold()
    cluster.hold()  # a hold already running goes on (its bound from the first)
    members.current = {0: members.current[0]}  # alone: nobody to wait for
    cluster._members_changed()  # (its listener of the members)
    waiter = gevent.spawn(cluster.wait_followed)
    waiter.join(0.2)
    assert waiter.dead


def test_a_start_hold_of_0_holds_nothing():
    members = Members(FakeZk([0, 1]), "/meta")
    members.current = members.read()
    cluster = MqttCluster(0, None, None, None, members, lambda: True, hold_s=0)
    cluster.hold()
    waiter = gevent.spawn(cluster.wait_followed)
    waiter.join(0.05)
    assert waiter.dead


def test_asks_hold_each_call_to_its_member():
    """``asks.Asks``: a peer that is no member (or this broker) is refused, unless its follow of this broker is still
    open (``linked``: a member ZooKeeper dropped, cut off from it only); ``give_up`` only from the id's home;
    ``register`` only of an id homed here; ``hold`` and ``release`` keep only the ids homed here, ``drop`` only
    those homed on the caller; at most
    MQTT_CLUSTER_ID_BATCH ids a call (at the limit served, one past refused); a malformed call refused, not raised."""
    members = {1: ("a", 0), 2: ("b", 0), 3: ("c", 0)}
    asks = Asks(1, lambda: members)
    assert asks.stranger(2) is None
    assert "no member" in asks.stranger(9) and "this broker" in asks.stranger(1)
    homed = {h: [c for c in ("id-%d" % i for i in range(200)) if home_of(c, members) == h][:5] for h in (1, 2, 3)}
    assert asks.admit(2, {"op": "give_up", "c": homed[2][0], "to": 3})[0] is None
    refusal, _ = asks.admit(2, {"op": "give_up", "c": homed[1][0], "to": 2})
    assert "only its home may" in refusal
    assert "no member" in asks.admit(2, {"op": "give_up", "c": homed[2][0], "to": 9})[0]
    refusal, served = asks.admit(2, {"op": "hold", "ids": homed[1] + homed[2], "rec": [homed[1][0]]})
    assert refusal is None and served["ids"] == homed[1] and served["rec"] == [homed[1][0]]
    assert asks.admit(3, {"op": "release", "ids": homed[3] + homed[1]})[1]["ids"] == homed[1]
    refusal, served = asks.admit(2, {"op": "drop", "ids": [[c, 1, False] for c in homed[1] + homed[2]]})
    assert refusal is None and [e[0] for e in served["ids"]] == homed[2]
    batch = ["x-%d" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_ID_BATCH)]
    assert asks.admit(2, {"op": "hold", "ids": batch})[0] is None
    assert "MQTT_CLUSTER_ID_BATCH" in asks.admit(2, {"op": "hold", "ids": batch + ["one-more"]})[0]
    for bad in ({"op": "hold"}, {"op": "hold", "ids": "abc"}, {"op": "hold", "ids": [1]},
                {"op": "drop", "ids": [["c"]]}, {"op": "give_up"}, {"op": "give_up", "c": 7}):
        assert "malformed" in asks.admit(2, bad)[0], bad
    assert asks.admit(2, {"op": "register", "c": homed[1][0], "clean": True})[0] is None  # homed here
    refusal, _ = asks.admit(2, {"op": "register", "c": homed[3][0], "clean": True})
    assert "whose home is broker 3: only its home registers it" in refusal, refusal
    assert "malformed" in asks.admit(2, {"op": "register", "c": 7})[0]
    assert Asks(1, lambda: None).stranger(2) is not None  # no reading yet: nobody
    kept = Asks(1, lambda: members)
    kept.members()
    kept._members = lambda: None  # ZooKeeper unreadable now: the last reading stands
    assert kept.stranger(2) is None
    follows = set()  # the peers whose follow of broker 1 is live (``MqttCluster.follows_here``)
    dropped = Asks(1, lambda: {1: ("a", 0)}, follows.__contains__)  # ZooKeeper dropped broker 2 (cut off from it)
    assert "no member" in dropped.stranger(2)
    follows.add(2)  # its follow of broker 1, admitted as a member, still open
    assert dropped.stranger(2) is None and "no member" in dropped.stranger(9)
    assert "this broker" in dropped.stranger(1)


def test_asks_hold_a_batch_of_registrations_to_its_bound_each_entry_refused_on_its_own():
    """``registers``: at most MQTT_CLUSTER_ID_BATCH entries (at the limit served, one past refused whole), each of a
    ``register``'s shape (else refused whole, as malformed); an entry whose id is homed elsewhere is refused on its own
    (``refused``), the others served."""
    members = {1: ("a", 0), 2: ("b", 0), 3: ("c", 0)}
    asks = Asks(1, lambda: members)
    ids = [c for c in ("id-%d" % i for i in range(5000)) if home_of(c, members) == 1]
    elsewhere = next(c for c in ("id-%d" % i for i in range(200)) if home_of(c, members) == 3)
    entries = [{"c": c, "clean": False} for c in ids[:mqttcluster_limits.MQTT_CLUSTER_ID_BATCH]]
    refusal, served = asks.admit(2, {"op": "registers", "r": entries})
    assert refusal is None and served["refused"] == [None] * mqttcluster_limits.MQTT_CLUSTER_ID_BATCH
    refusal, _ = asks.admit(2, {"op": "registers", "r": entries + [{"c": ids[0], "clean": True}]})
    assert "MQTT_CLUSTER_ID_BATCH" in refusal
    refusal, served = asks.admit(2, {"op": "registers", "r": entries[:2] + [{"c": elsewhere, "clean": True}]})
    assert refusal is None and served["refused"][:2] == [None, None]
    assert "only its home registers it" in served["refused"][2]
    for bad in ({"op": "registers", "r": [{"c": ids[0]}]}, {"op": "registers", "r": [7]},
                {"op": "registers", "r": [{"c": 7, "clean": True}]}, {"op": "registers"}):
        assert "malformed" in asks.admit(2, bad)[0], bad


def test_a_handover_is_checked_whole_before_it_is_adopted():
    """``handover.problem``: ``export``'s shape passes; another client id, a missing field, a bad message, base64
    that is not, and one message past MQTT_HANDOVER_MAX_MESSAGES are each a clear problem, never a KeyError."""
    message = ["t", 0, "aGVsbG8="]
    good = {"c": "dev", "u": None, "v": 5, "e": 60, "subs": [["a/#", 1, False, ["a"], False, None]], "q2": [3],
            "sh": [], "inf": [[1, "publish", 1] + message, [2, "pubrel", 2]], "queued": [[1] + message],
            "dropped": 0}
    assert handover.problem(good, "dev") is None
    most = mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES
    at_limit = dict(good, inf=[], queued=[[1] + message] * most)
    assert handover.problem(at_limit, "dev") is None
    past = dict(good, inf=[[1, "publish", 1] + message], queued=[[1] + message] * most)
    assert "MQTT_HANDOVER_MAX_MESSAGES" in handover.problem(past, "dev")
    assert "not of 'dev'" in handover.problem(good, "other") or "'other'" in handover.problem(good, "other")
    for bad in ([], {k: v for k, v in good.items() if k != "inf"}, dict(good, queued=[[1, "t", 0]]),
                dict(good, inf=[[1, "publish", 1, "t", 0, "!!not base64!!"]]), dict(good, inf=[[1, "publish", 1]]),
                dict(good, inf=[[1, 0, 1] + message]), dict(good, subs=[["a/#", 1]]),
                dict(good, v="5"), dict(good, q2="x")):
        problem = handover.problem(bad, "dev")
        assert problem is not None and problem.startswith("a malformed handover"), bad


def test_the_end_of_a_handover_is_checked_whole_before_any_of_it_is_taken():
    """``handover.rest_problem``: ``rest``'s answer passes, at MQTT_HANDOVER_MAX_MESSAGES too; one message past it, a
    message that is not one, base64 that is not, or another shape are each a clear problem, never a KeyError."""
    message = ["t", 0, "aGVsbG8="]
    assert handover.rest_problem({"queued": [[1] + message], "dropped": 0}) is None
    assert handover.rest_problem({"queued": [[1] + message] * mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES}) is None
    past = {"queued": [[1] + message] * (mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES + 1), "dropped": 0}
    assert "MQTT_HANDOVER_MAX_MESSAGES" in handover.rest_problem(past)
    for bad in ([], {"queued": "x"}, {"queued": [], "dropped": "2"}, {"queued": [[1, "t", 0]]},
                {"queued": [[1, "t", 0, "!!not base64!!"]]}, {"queued": [["1"] + message]}):
        problem = handover.rest_problem(bad)
        assert problem is not None and problem.startswith("a malformed end of a handover"), bad


def test_a_route_of_many_filters_finds_its_topics_sharing_the_loop():
    """``FilterSet.topics`` of MQTT_CLUSTER_MAX_FILTERS filters: one filter that reads every topic ends the look at
    once (all of them); else the loop is shared between filters (``share_loop``): another greenlet runs meanwhile."""
    known = ["t%d" % i for i in range(4000)] + ["%MQTT%"]
    every = FilterSet(["t%d/#" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS - 1)] + ["#"])
    assert every.topics(known) == set(known) - {"%MQTT%"}
    ticks = []

    def tick():
        while True:
            ticks.append(1)
            gevent.sleep(0)

    many = FilterSet(["t%d/x/#" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_MAX_FILTERS)])
    ticker = gevent.spawn(tick)
    gevent.sleep(0)
    ticks.clear()
    started = time.monotonic()
    found = many.topics(known)
    took, ran = time.monotonic() - started, len(ticks)
    ticker.kill()
    assert found == set(known[:4000])
    # a look longer than a turn lets the ticker run; one more turn's margin for the machine preempting the test
    assert took < 2 * limits.MAX_TURN_MS / 1000.0 or ran, took


def test_a_peer_keeps_at_most_max_followed_resume_positions(monkeypatch):
    """A route's resume positions are kept up to MQTT_CLUSTER_MAX_FOLLOWED (the partitions a peer may follow here):
    at the limit all, one past it the first ones (the rest start as new partitions do)."""
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_FOLLOWED", 4)
    store = FakeStore({})
    at = PeerFollow(store, rp.Routes(1, (), tuple(("t%d" % i, 0, i) for i in range(4))))
    assert len(at.resume) == 4
    past = PeerFollow(store, rp.Routes(1, (), tuple(("t%d" % i, 0, i) for i in range(5))))
    assert sorted(past.resume) == [("t%d" % i, 0) for i in range(4)]


def test_a_partition_read_gets_a_position_only_when_its_last_record_went_to_the_peer_as_no_entry(tmp_path):
    """The peer's copy of a record moves its position past it: a lone message's frame holds that message alone; a
    partition whose last record read matches no filter of the peer gets a POSITION past it, with that record's check."""
    store = open_store(tmp_path, topics=[TopicSpec("*", 1)])
    for name in ("lat/x", "lat/y", "lat/x"):
        store.put("lat", 0, *record_data(name, b"p", 1, "pub", None), NOW)
    follow = PeerFollow(store, rp.Routes(1, ("lat/x",), (("lat", 0, 0),)))
    follow.batch()
    assert [(e.kind, e.offset) for e in follow.batch()] == []
    store.put("lat", 0, *record_data("lat/x", b"p", 1, "pub", None), NOW)
    assert [(e.kind, e.offset) for e in follow.batch()] == [(MESSAGE, 3)]  # the copy of 3 is the peer's position 4
    store.put("lat", 0, *record_data("lat/y", b"p", 1, "pub", None), NOW)
    got = follow.batch()
    assert [(e.kind, e.offset) for e in got] == [(POSITION, 5)]  # 4 is no message for the peer: how far it was read
    (rec,), _ = store.read_records("lat", 0, 4, 1, 1 << 20)
    assert got[0].ts == record_check(rec.store_ts_ms, rec.data)
