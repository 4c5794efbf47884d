"""The takeover's end and the client ids' leases, their pure parts (docs/architecture.md "MQTT cluster: client ids"):
a route's version and its ROUTED ack, the filters a route keeps pinned, the wait for every linked peer's ack, the
handovers a broker keeps for their end (at their limit and one past), and the lease that closes a connection and that
a home waits out before it takes an id from a holder that does not answer."""

import json
import time
from types import SimpleNamespace

import gevent
import pytest
from gevent.event import Event
from pydantic import ValidationError


from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.errors import RemoteProtocolError
from metaq.mqtt import wire
from metaq.mqtt.port import MqttPort
from metaq.mqttcluster.clientids import handover, service
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.clientids.calls import PeerClient, PeerUnreachable
from metaq.mqttcluster.clientids.ids import home_of
from metaq.mqttcluster.following.link import ACK_EXPECTED_S, PeerLink
from metaq.mqttcluster.following.peers import MqttCluster
from metaq.mqttcluster.serve import FilterSet, PeerFollow
from metaq.mqttcluster.clientids.leases import LEASE_MARGIN_S
from metaq.mqttcluster.clientids.service import ClientIds
from metaq.protocol import replication as rp
from metaq.server.config import ServerConfig
from metaq.protocol.replication_mqtt import MESSAGE, POSITION, ROUTED, Entry, decode_routes, join_routes, split_routes
from tests.harness.mqttcluster import homed
from tests.mqttcluster.test_units import FakeStore, RecordsStore, _records_frame


def _parsed(event):
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(event))
    return p.next_event()


def test_a_route_names_its_version_and_the_master_acks_it_before_any_record_it_chose():
    routes = rp.Routes(1, ("t",), (("t", 0, 0),), version=7)
    assert _parsed(routes) == routes
    assert _parsed(rp.Records((Entry(ROUTED, "", 0, 7),))) == rp.Records((Entry(ROUTED, "", 0, 7),))
    parts = split_routes(rp.Routes(1, tuple("f%d/%s" % (i, "x" * 200) for i in range(40)), version=9), most=2000)
    assert len(parts) > 1 and {p.version for p in parts} == {9}
    joined = None
    for part in parts:
        joined = join_routes(joined, part)
    assert joined.version == 9
    older = json.dumps({"broker": 3, "filters": ["a"], "positions": [], "retained": -1}).encode()
    assert decode_routes(older).version == 0  # a peer of the version before: no ack asked
    with pytest.raises(RemoteProtocolError, match="route version"):
        decode_routes(json.dumps({"broker": 3, "filters": [], "version": -1}).encode())

    follow = PeerFollow(RecordsStore({"t": 1}), routes)
    kinds = [(e.kind, e.offset) for e in follow.batch(None)]
    assert kinds[:2] == [(POSITION, 0), (ROUTED, 7)]  # where the partition starts, then the ack, then its records
    assert [o for k, o in kinds if k == MESSAGE] == [0, 1, 2, 3, 4]
    follow.cursors[("t", 0)] = 3
    assert ROUTED not in [e.kind for e in follow.batch(None)]  # acked once
    follow.set_filters(("t", "u/#"), (), 8)
    follow.cursors[("t", 0)] = 3
    kinds = [(e.kind, e.offset) for e in follow.batch(None)]
    assert kinds[0] == (ROUTED, 8) and [o for k, o in kinds if k == MESSAGE] == [3, 4]
    follow = PeerFollow(RecordsStore({"t": 1}), rp.Routes(1, ("t",), (("t", 0, 0),)))
    assert ROUTED not in [e.kind for e in follow.batch(None)]  # no version, no ack (an older peer)


def test_a_routes_ack_waits_for_the_positions_of_its_partitions_when_its_rescan_yields(monkeypatch):
    """A batch sent while the route's rescan shares the loop does not ack it: the ack would reach the taker before the
    POSITIONs of the partitions the route reads, and the taker would name no position for them."""
    follow = PeerFollow(RecordsStore({"t": 1, "u": 1}), rp.Routes(1, ("t",), (("t", 0, 0),), version=7))
    follow.batch(None)
    looked = FilterSet.topics

    def topics(self, known):
        gevent.sleep(0)
        return looked(self, known)

    monkeypatch.setattr(FilterSet, "topics", topics)
    seen = []
    sender = gevent.spawn(lambda: seen.extend((e.kind, e.topic) for e in follow.batch(None)))
    follow.set_filters(("t", "u"), (), 8)
    sender.join()
    assert (ROUTED, "") not in seen  # sent during the rescan: no ack yet
    kinds = [(e.kind, e.topic, e.offset) for e in follow.batch(None)]
    assert kinds.index((POSITION, "u", 5)) < kinds.index((ROUTED, "", 8))


def _cluster(filters=()):
    port = SimpleNamespace(subscribed_filters=lambda: iter(filters), topics=SimpleNamespace(
        topics_for=lambda f: ((f.split("/", 1)[0],), f.startswith("#"))))
    return MqttCluster(0, None, None, port, None, lambda: True)


def test_pinned_filters_stay_in_the_route_and_the_takers_wait_ends_with_every_linked_peers_ack():
    """A peer whose link is down, or that never acked a route in ACK_EXPECTED_S (the version before the acks), is not
    waited for, and the wait says the end is short."""
    cluster = _cluster(["a/1"])
    cluster.routes_changed()
    cluster.pin("x", ["b/#"])
    assert cluster.route()[1] == ("a/1", "b/#")
    cluster.routes_changed()  # the periodic recomputation keeps a pinned filter no session holds
    assert cluster.route()[1] == ("a/1", "b/#")
    cluster.unpin("x")
    cluster.routes_changed()
    assert cluster.route()[1] == ("a/1",)
    up = PeerLink(cluster, 1, "127.0.0.1:1")
    down, older = PeerLink(cluster, 2, "127.0.0.1:2"), PeerLink(cluster, 3, "127.0.0.1:3")
    up.connected = older.connected = True
    older.asked_at = time.monotonic() - ACK_EXPECTED_S  # asked this long ago, never acked: the version before the acks
    cluster.links = {1: up, 2: down, 3: older}
    started = time.monotonic()
    assert not cluster.routed(["c/#"], started + 0.2)  # peer 1 does not ack: the wait ends at its bound
    assert time.monotonic() - started >= 0.2
    version = cluster.route()[0]

    def ack():
        gevent.sleep(0.05)
        up._acks([version])

    acker = gevent.spawn(ack)
    started = time.monotonic()
    assert not cluster.routed(["c/#"], started + 5)  # not waited for, but short: peers 2 and 3 did not act on it
    assert time.monotonic() - started < 1
    acker.join()
    cluster.links = {1: up}
    assert cluster.routed(["c/#"], time.monotonic() + 5)  # every member's link up and acked
    cluster.links = {1: up, 2: down, 3: older}
    cluster.positions.copied(1, "c", 0, 41)
    cluster.positions.copied(1, "d", 0, 9)
    cluster.positions.copied(2, "c", 1, 4)
    assert cluster.positions_for(["c/#"]) == {1: {("c", 0): 42}, 2: {("c", 1): 5}, 3: {}}


class FakeCluster:
    def __init__(self):
        self.pins = {}

    def pin(self, key, filters):
        self.pins[key] = filters

    def unpin(self, key):
        self.pins.pop(key, None)


def _ids(port=None, lease_s=4.0, client=None):
    ids = ClientIds(port or SimpleNamespace(), None, None, 3, client or SimpleNamespace(close=lambda: None), 100, 0,
                    lambda: True, lease_s)
    ids.cluster = FakeCluster()
    ids.members = {1: "h:1", 2: "h:2", 3: "h:3"}
    return ids


class ClaimingPort:
    """The port's side of a broker's CONNECTs of one id, in process: a CONNECT whose ``join`` lets it go on claims
    the id at once (``finished``, as ``claim`` and ``resume`` do); a give_up ends what claimed it. ``steps``: each
    claim and give_up in order; ``live``: the CONNECTs holding the id now."""

    def __init__(self, adopt_s=0.0):
        self.adopt_s, self.steps, self.live, self.ids = adopt_s, [], set(), None

    def connect(self, n, client_id):
        refusal = self.ids.join(client_id, False, None)
        if refusal is None:
            self.live.add(n)
            self.steps.append(("live", n))
            self.ids.finished(client_id)
        return refusal

    def adopt(self, _saved):
        gevent.sleep(self.adopt_s)  # the session's record waited for, as a PUBACK waits

    def give_up(self, _client_id, _clean, _user):
        self.steps.append(("given up", sorted(self.live)))
        self.live.clear()
        return None, None

    def holds(self, _client_id):
        return bool(self.live)

    def end_session(self, _client_id):
        pass


def _claiming(port, answers, asked=None):
    """Broker 3 of ``_ids`` on ``port``, no takeover's end, its registrations answered by ``answers(i)`` (the ``i``-th
    registration: a dict, once it may be answered), the requests in ``asked``."""
    ids = _ids(port, client=SimpleNamespace(close=lambda: None, timeout_s=5))
    ids.cluster = None
    port.ids = ids
    asked = [] if asked is None else asked

    def register(_home, request, _timeout_s):
        asked.append(request)
        return answers(len(asked) - 1)

    ids.registrations = SimpleNamespace(register=register)
    return ids


def _session(client_id):
    return {"c": client_id, "v": 5, "e": None, "subs": [], "q2": [], "sh": [], "inf": [], "queued": []}


def test_a_give_up_waits_for_every_connect_of_the_id_answered_here_together():
    """Two CONNECTs of one id on a broker answered at once (one batch: generation 5 with the session from another
    broker, then 6); the second claims the id while the first still writes the session it took. A later
    registration elsewhere asks this broker to give the id up (at generation 6): the give_up waits for the first
    too (or it is refused), so nothing of the id is live here after it. (One Event per id: the second's replaced the
    first's and its claim set it, the give_up ended the second alone, and the first went live after it: two live
    sessions, one here and the taker's.)"""
    client_id = homed(1, 1, [1, 2, 3], "twice")[0]
    together = Event()

    def answers(i):
        together.wait()
        return [{"gen": 5, "from": 2, "session": _session(client_id)}, {"gen": 6, "from": 3}][i]

    port = ClaimingPort(adopt_s=0.2)
    ids = _claiming(port, answers)
    connects = [gevent.spawn(port.connect, n, client_id) for n in (1, 2)]
    gevent.sleep(0.01)
    together.set()
    gevent.sleep(0.05)
    assert port.steps == [("live", 2)]  # the first still takes its session over
    give = gevent.spawn(ids._give_up, 1, {"c": client_id, "clean": False, "u": None, "to": 1, "gen": 6})
    gevent.joinall(connects + [give], timeout=5)
    assert give.value == {"from": 3}
    assert port.live == set(), port.steps  # nothing of the id live here once it is given up
    assert port.steps[-1][0] == "given up", port.steps
    assert ids._finishing == {} and ids._given == {}


def test_an_answer_that_arrives_after_its_id_was_given_up_is_refused(monkeypatch):
    """A CONNECT's registration (generation 5) is answered late (its batch held back); meanwhile a later
    registration elsewhere asked this broker to give the id up at generation 5, and the give_up, past its wait for
    that answer, gave up what was here. The answer, once it comes, is refused (0x88): the id is the other broker's.
    A registration answered after (generation 7) goes live."""
    monkeypatch.setattr(service, "HOLDER_TIMEOUT_S", 0.2)
    client_id = homed(1, 1, [1, 2, 3], "late")[0]
    late, asked = Event(), Event()

    def answers(i):
        if i == 0:
            asked.set()
            late.wait()
        return {"gen": 5 if i == 0 else 7, "from": 3}

    port = ClaimingPort()
    ids = _claiming(port, answers)
    first = gevent.spawn(port.connect, 1, client_id)
    assert asked.wait(5)  # its registration is in flight
    assert ids._give_up(1, {"c": client_id, "clean": False, "u": None, "to": 1, "gen": 5}) == {"from": 3}
    late.set()
    first.join(5)
    assert first.value is not None and first.value[0] == wire.SERVER_UNAVAILABLE, first.value
    assert port.live == set() and ids._given == {}
    assert port.connect(2, client_id) is None and port.live == {2}

def test_a_holder_keeps_at_most_max_lingering_handovers_the_oldest_forgotten():
    ids = _ids()
    ids.max_lingering = 2
    saved = SimpleNamespace(subscriptions=[("a/#", 1, False, ("a",), False, None)])
    ids._linger(("x", 1), saved)
    ids._linger(("y", 1), saved)  # at the limit: both kept, their filters pinned
    assert list(ids._lingering) == [("x", 1), ("y", 1)]
    assert ids.cluster.pins == {("given", "x", 1): ["a/#"], ("given", "y", 1): ["a/#"]}
    ids._linger(("z", 2), saved)  # one past: the oldest goes, its filters unpinned
    assert list(ids._lingering) == [("y", 1), ("z", 2)] and ("given", "x", 1) not in ids.cluster.pins
    assert "error" in ids._rest(1, {"c": "x", "upto": []})  # its taker's call for the rest: nothing kept
    bad = ids._rest(1, {"c": "y", "upto": [[2, "not positions"]]})  # a call that is not one: a clear error
    assert "nothing handed" in bad["error"] and ("given", "y", 1) not in ids.cluster.pins
    ids._linger(("w", 1), saved)
    ids._lingering[("z", 2)] = (time.monotonic() - 1, saved, {})  # past MQTT_HANDOVER_LINGER_S
    ids._expire_lingering()
    assert list(ids._lingering) == [("w", 1)] and list(ids.cluster.pins) == [("given", "w", 1)]


def test_the_lease_is_a_setting_within_its_bounds():
    assert ServerConfig().mqtt.cluster_id_lease_s == 4.0
    assert ServerConfig.model_validate({"mqtt": {"cluster_id_lease_s": 60}}).mqtt.cluster_id_lease_s == 60
    assert ServerConfig.model_validate({"mqtt": {"cluster_id_lease_s": 1}}).mqtt.cluster_id_lease_s == 1
    for bad in (0, -1, 0.99, 61):  # below 1 s the early count-out would leave no lease
        with pytest.raises(ValidationError, match="cluster_id_lease_s"):
            ServerConfig.model_validate({"mqtt": {"cluster_id_lease_s": bad}})


def test_a_broker_closes_the_connections_of_the_ids_whose_homes_lease_ran_out():
    homed = {h: [c for c in ("d-%d" % i for i in range(60)) if home_of(c, {1: 0, 2: 0, 3: 0}) == h][:2]
             for h in (1, 2, 3)}
    closed = []
    port = SimpleNamespace(connected_ids=lambda: sum(homed.values(), []),
                           lease_lost=lambda client_ids, why: closed.extend(client_ids))
    ids = _ids(port)
    ids._end_unleased()
    assert closed == []  # a home first seen: a lease's time from now
    now = time.monotonic()
    ids.leases.until = {1: now + 4 / 4 + LEASE_MARGIN_S - 0.01, 2: now + 4 / 4 + LEASE_MARGIN_S + 0.1}
    ids._end_unleased()  # out a look and a margin before its end: closed by then, a busy loop included
    assert sorted(closed) == sorted(homed[1]) and ids.lease_closed == 2  # its own ids (3) never
    ids.leases.renewed(1, time.monotonic())
    closed.clear()
    ids._end_unleased()
    assert closed == []


def test_a_home_takes_an_id_from_a_holder_that_does_not_answer_only_once_its_lease_surely_ran_out():
    def unreachable(address, request, timeout_s=None, exclusive=False, lease=False):
        raise PeerUnreachable("no answer")

    ids = _ids(lease_s=0.4, client=SimpleNamespace(call=unreachable, close=lambda: None))
    ask = {"c": "x", "clean": False}
    ids.leases.heard(1)
    gone = ids.leases.gone(1)
    assert gone == pytest.approx(ids.leases.heard_at[1] + 0.5 + LEASE_MARGIN_S)
    refused = ids._take_from(1, 2, ask, time.monotonic() + 0.1)  # it would run out past the caller's bound
    assert "lease" in refused["error"]
    assert ids._take_from(1, 2, ask, time.monotonic() + 5) == {"unreached": True}
    assert time.monotonic() >= gone
    ids.leases.heard_at.clear()
    assert ids.leases.gone(1) == pytest.approx(ids.leases.started + 0.5 + LEASE_MARGIN_S)  # not heard: the start


def test_a_takeover_that_passed_the_share_is_not_refused_by_it_after_the_handover():
    """The home checks the taker's share, then the old holder gives the session up (a network call) while other ids
    of the same taker fill its share: the handed-over session is registered, not thrown away."""
    def give_up(address, request, timeout_s=None, exclusive=False, lease=False):
        for i in range(2):  # the taker's other CONNECTs registered meanwhile: its share is full
            ids.registry.register("other-%d" % i, 2)
        return {"session": "handed"}

    ids = _ids(client=SimpleNamespace(close=lambda: None, call=give_up))
    share = ids.registry.share
    for i in range(share - 2):
        ids.registry.register("mine-%d" % i, 2)
    ids.registry.register("dev", 1)
    answer = ids._register_one(2, "dev", {"c": "dev", "clean": False, "u": None})
    assert answer.get("session") == "handed" and "error" not in answer
    assert ids.registry.holder("dev") == 2 and ids.registry.held_by(2) == share + 1
    assert "share" in ids._register_one(2, "new", {"c": "new", "clean": False, "u": None})["error"]  # still bounded


def test_the_records_before_a_malformed_entry_are_made_visible():
    """A RECORDS frame whose last bytes are malformed raises there; what was appended before it is made visible
    (its readers wake now, not at the next frame)."""
    data = b"\x00\x00\x00\x02ab-payload"
    good = rp.serialize(rp.Records((Entry(MESSAGE, "sensors", 1, 42, 1, 1700000000000, data),)))
    p = rp.ReplicationParser()
    p.receive_data(_records_frame(good[rp.FRAME_HEADER.size:] + b"x"))
    frame = p.next_event()
    cluster = _cluster()
    visible, appended = [], []
    cluster.put_path = SimpleNamespace(check_write=lambda *a, **k: None, append_burst=lambda frames, src, now: (0, []),
                                       append=lambda *a, **k: appended.append(a[4]) or SimpleNamespace(offset=0),
                                       burst_written=lambda keys, now, *_serve: visible.extend(keys))
    with pytest.raises(RemoteProtocolError, match="leaves 1 bytes over"):
        cluster.apply(2, frame.entries)
    assert visible == [(inbox.INBOX, inbox.partition_of(2, "sensors", 1))] and len(appended) == 1


def test_a_frame_that_names_an_offset_twice_is_copied_once():
    """A RECORDS frame whose run carries one partition's offset twice (or an earlier one after a later one): each
    offset is appended once, the positions not yet moved by the run notwithstanding."""
    data = b"\x00\x00\x00\x02ab-payload"
    entries = [Entry(MESSAGE, "sensors", 1, offset, 1, 1700000000000, data) for offset in (42, 43, 42, 41, 44)]
    cluster = _cluster()
    appended = []
    cluster.put_path = SimpleNamespace(check_write=lambda *a, **k: None, append_burst=lambda frames, src, now: (0, []),
                                       append=lambda *a, **k: appended.append(a[4]) or SimpleNamespace(offset=0),
                                       burst_written=lambda keys, now, *_serve: None)
    assert cluster.apply(2, entries) == 3
    assert len(appended) == 3


class EndCluster(FakeCluster):
    """What a takeover's end asks of the cluster: every peer acted on the route (``acted``); copies appended to the
    inbox up to offset 5, readable here up to ``visible``."""

    def __init__(self, acted=True, visible=5):
        super().__init__()
        self.acted, self.visible = acted, visible
        self.positions = Copies(3)

    def routed(self, filters, deadline):
        return self.acted

    def inbox_marks(self):
        return {0: 5}

    def inbox_visible(self, marks):
        return all(self.visible >= end for end in marks.values())

    def positions_for(self, filters):
        return {1: {("a", 0): 3}}

    def topics_read(self):
        return {"a"}, False


def test_a_takeovers_end_is_short_when_the_copies_the_positions_count_are_not_readable_in_time(monkeypatch):
    """The positions count the copies appended, the session reads from the readable end: when the copies did not
    become readable within MQTT_HANDOVER_END_S, the end is counted short (they may come twice), not complete."""
    monkeypatch.setattr(mqttcluster_limits, "MQTT_HANDOVER_END_S", 0.05)

    def call(address, request, timeout_s=None, exclusive=False, lease=False):
        return {"complete": True, "queued": []}

    state = {"subs": [["a/#", 1, False, ["a"]]], "inf": [], "queued": []}
    answer = {"rest": True, "from": 1}
    for visible, short in ((5, 0), (4, 1)):
        ids = _ids(SimpleNamespace(cluster_topics=set()), client=SimpleNamespace(call=call, close=lambda: None))
        ids.store, ids.cluster = RecordsStore({"a": 1}), EndCluster(visible=visible)
        assert ids._takeover_end("x", state, answer, ("taking", "x", 1)) == {("a", 0): 5}
        assert ids.ends_short == short


def test_lease_renewals_have_turns_of_their_own_that_other_calls_never_fill():
    """However many registrations wait for a peer, a lease renewal to it goes at once (MQTT_CLUSTER_LEASE_CONNECTIONS);
    the others share the rest of MQTT_CLUSTER_CALLS_IN_FLIGHT."""
    client, going = PeerClient(0, None), []

    def answer(address, request, deadline):
        going.append(request)
        gevent.sleep(0.2)
        return {}

    client._call = answer
    others = mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT - mqttcluster_limits.MQTT_CLUSTER_LEASE_CONNECTIONS
    storm = [gevent.spawn(client.call, "h:1", {"op": "register"}, 5) for _ in range(3 * others)]
    gevent.sleep(0.01)
    assert len(going) == others  # at their limit; the rest wait
    started = time.monotonic()
    assert client.call("h:1", {"op": "lease"}, 1, lease=True) == {}
    assert time.monotonic() - started < 0.3  # not behind the storm
    gevent.joinall(storm, timeout=5)
    assert all(g.value == {} for g in storm)


def test_a_lease_lost_closes_its_connections_sharing_the_loop():
    """Many connections closed at once (their home's lease out) let the other greenlets run between them."""
    ran, closed = [], []

    def move_away(client_id):
        time.sleep(0.002)  # a close's cost, without yielding
        closed.append(client_id)

    port = SimpleNamespace(_clients={"d-%d" % i: SimpleNamespace(move_away=lambda _new, _why, i=i: move_away(i))
                                     for i in range(30)})
    other = gevent.spawn(lambda: ran.append(len(closed)))
    MqttPort.lease_lost(port, list(port._clients), "its home is not reached")
    other.join()
    assert len(closed) == 30 and ran and ran[0] < 30


def test_the_connected_ids_a_lease_lapse_closes_leave_out_those_already_closing():
    """A lapse looked at again while its connections close (a loop busy with thousands) closes and counts each
    once: a closing connection is not one of the connected ids."""
    port = SimpleNamespace(_clients={"a": SimpleNamespace(closed=False), "b": SimpleNamespace(closed=True),
                                     "c": SimpleNamespace(closed=False)})
    assert MqttPort.connected_ids(port) == ["a", "c"]


class Copies:
    """A broker's copies of its peers' partitions: each at ``at``, a look costing ``cost`` seconds (no yield)."""

    def __init__(self, at, cost=0.0):
        self.at, self.cost = at, cost

    def get(self, origin, topic, partition):
        time.sleep(self.cost)
        return self.at


def test_a_call_for_the_rest_names_at_most_max_followed_positions_of_each_origin(monkeypatch):
    """The rest's positions at MQTT_CLUSTER_MAX_FOLLOWED of an origin (and MQTT_CLUSTER_MAX_PEERS origins and the
    taker) are looked at; one past is a clear error, nothing handed, the session's filters unpinned."""
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_FOLLOWED", 3)
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_PEERS", 1)
    monkeypatch.setattr(service.handover, "rest", lambda *_a: {"queued": [], "dropped": 0})
    saved = SimpleNamespace(subscriptions=[("a/#", 1, False, ("a",), False, None)])
    at_limit = [[2, [["a", p, 5] for p in range(3)]], [1, []]]
    for upto, ok in ((at_limit, True), ([[2, [["a", p, 5] for p in range(4)]]], False),
                     (at_limit + [[3, []]], False)):
        ids = _ids()
        ids.cluster = EndCluster()
        ids.cluster.positions = Copies(5)
        ids._linger(("x", 1), saved)
        answer = ids._rest(1, {"c": "x", "upto": upto, "wait": 0.1})
        assert answer.get("complete") is ok or ("MQTT_CLUSTER_MAX_FOLLOWED" in answer["error"] and not ok)
        assert ("given", "x", 1) not in ids.cluster.pins


def test_the_rests_look_at_the_copies_shares_the_loop():
    ids, ran = _ids(), []
    ids.cluster = EndCluster()
    ids.cluster.positions = Copies(5, cost=0.002)
    other = gevent.spawn(lambda: ran.append(True))
    assert ids._caught_up({2: {("a", p): 5 for p in range(30)}}, time.monotonic() + 1)
    assert ran  # it ran during the look
    other.join()


def test_the_old_broker_waits_for_a_copy_its_route_reads_that_has_no_position_yet():
    """A partition the taker names that this broker's route reads but whose copy has not begun here (no position yet)
    is behind, not caught up; one of a topic its route does not read is not waited for."""
    ids = _ids()
    ids.cluster = EndCluster()
    ids.cluster.positions = Copies(None)
    started = time.monotonic()
    assert not ids._caught_up({2: {("a", 0): 5}}, started + 0.05)
    assert time.monotonic() - started >= 0.05
    assert ids._caught_up({2: {("b", 0): 5}}, time.monotonic() + 0.05)
    assert ids._caught_up({ids.broker_id: {("a", 0): 5}}, time.monotonic() + 0.05)  # its own log: nothing to copy


def test_the_taker_starts_a_session_past_where_the_holders_handover_stopped(monkeypatch):
    """A taker that already copies for the session's filters may stand behind where the old holder's handover stopped
    (its ``stop``): it waits until its own copies reach it, then takes the session's read positions (each message once,
    by the handover or by its copies); past MQTT_HANDOVER_END_S, or a stop past MQTT_CLUSTER_MAX_FOLLOWED positions of
    one origin, it goes on, counted short (what is before may come twice, nothing is lost)."""
    monkeypatch.setattr(mqttcluster_limits, "MQTT_HANDOVER_END_S", 0.1)
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MAX_FOLLOWED", 2)
    state = {"subs": [["a/#", 1, False, ["a"]]], "inf": [], "queued": []}

    def taker():
        ids = _ids(SimpleNamespace(cluster_topics={"%MQTTIN%"}))
        ids.store, ids.cluster = RecordsStore({"a": 1}), EndCluster()
        return ids

    ids = taker()
    stop = {1: {("a", 0): 5}, 2: {("a", 0): 0}, ids.broker_id: {("a", 0): 9}}  # its own log: nothing to copy
    answer = {"from": 1, "stop": handover.positions_wire(stop)}
    started = time.monotonic()
    catching_up = gevent.spawn_later(0.03, setattr, ids.cluster.positions, "at", 5)
    assert ids._takeover_end("x", state, answer, ("taking", "x", 1)) == {("a", 0): 5}
    assert catching_up.ready() and ids.cluster.positions.at == 5  # it returned once its copies got there, not before
    assert time.monotonic() - started < 0.1 and ids.ends_short == 0
    catching_up.join()

    ids = taker()  # its copies never get there: it goes on at the end's bound
    assert ids._takeover_end("x", state, answer, ("taking", "x", 1)) == {("a", 0): 5}
    assert ids.ends_short == 1

    ids = taker()  # a stop of MQTT_CLUSTER_MAX_FOLLOWED positions of an origin is waited for, one past is not
    ids.cluster.positions.at = 5
    at_limit = {1: {("a", 0): 5, ("a", 1): 5}}
    assert ids._takeover_end("x", state, {"from": 1, "stop": handover.positions_wire(at_limit)}, ("t", "x", 1))
    assert ids.ends_short == 0
    past = {1: {("a", p): 5 for p in range(3)}}
    with pytest.raises(ValueError, match="MQTT_CLUSTER_MAX_FOLLOWED"):
        handover.positions_read(handover.positions_wire(past))
    assert ids._takeover_end("x", state, {"from": 1, "stop": handover.positions_wire(past)}, ("t", "x", 1))
    assert ids.ends_short == 1


def test_the_holder_names_where_its_handover_stopped_per_origin():
    """The holder's stop: its copies of each peer's partitions the session reads, and its own log where ``export``'s
    reads stopped (not its inbox: those are copies, named by their origins)."""
    ids = _ids(SimpleNamespace(cluster_topics={"%MQTTIN%"}))
    ids.cluster = EndCluster()
    saved = SimpleNamespace(subscriptions=[("a/#", 1, False, ("a",), False, None)])
    assert ids._stopped(saved, {("a", 0): 7, ("%MQTTIN%", 3): 40}) == {1: {("a", 0): 3}, 3: {("a", 0): 7}}


def test_a_topic_made_while_a_routes_rescan_shares_the_loop_stays_followed_from_its_start(monkeypatch):
    """A route's rescan that shares the loop (``FilterSet.topics``) while a topic its filters read is first written
    here, and the follow's own rescan (the store's new partition) starts that topic from its start: the route's rescan,
    resumed with the topics it knew before, does not drop it (the follow would not look again: the store's partitions
    did not change since), and a rescan that finds a newer one ran meanwhile leaves the decision to it."""
    store = FakeStore({"t": 1})
    follow = PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 0),), version=7))
    looked = FilterSet.topics
    entered = []

    def topics(self, known):
        entered.append(list(known))
        if len(entered) == 1:  # the route's: it resumes after the follow's own
            gevent.sleep(0.01)
        return looked(self, known)

    monkeypatch.setattr(FilterSet, "topics", topics)
    route = gevent.spawn(follow.set_filters, ("t", "ping/#"), (), 8)
    gevent.sleep(0.001)  # the route's rescan shares the loop
    store.topics["ping"] = 1  # the first message of ping: the follow's own rescan, on the store's new partition
    follow.rescan()
    route.join()
    assert follow.cursors.get(("ping", 0)) == 0  # from its start: it was made after the route came
    assert follow.made == store.partitions_made() and follow.routed == 8


def test_a_connect_whose_registration_fails_past_peer_unreachable_keeps_nothing_of_its_id(monkeypatch):
    """A registration that raises what no call raises (its greenlet killed) while a give_up recorded the generation
    it took the id at: nothing of the id stays (``_given``, ``_pending``, ``_finishing``: bounded by the CONNECTs under
    way)."""
    monkeypatch.setattr(service, "HOLDER_TIMEOUT_S", 0.2)
    client_id = homed(1, 1, [1, 2, 3], "killed")[0]
    killed = Event()

    def answers(_i):
        killed.wait()
        raise RuntimeError("killed")

    port = ClaimingPort()
    ids = _claiming(port, answers)
    first = gevent.spawn(port.connect, 1, client_id)
    gevent.sleep(0.01)
    ids._give_up(1, {"c": client_id, "clean": False, "u": None, "to": 1, "gen": 5})
    assert ids._given == {client_id: 5}
    killed.set()
    first.join(5)
    assert isinstance(first.exception, RuntimeError)
    assert ids._given == {} and ids._pending == {} and ids._finishing == {} and port.live == set()
