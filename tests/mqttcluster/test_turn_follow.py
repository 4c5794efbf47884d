"""A peer's follow served from the publisher's turn (metaq/mqttcluster/direct.py): while the follow waits caught
up, the turn that writes a record sends the peer the very RECORDS frame the follow would have read back and sent,
without waiting; anything else is left to the follow."""

import time

import gevent
from gevent import socket as gsocket
from gevent.event import Event

from metaq.mqtt.port import burst_frames
from metaq.mqtt.records import record_data
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.serve import FilterSet, PeerFollow
from metaq.mqttcluster.direct import TurnFollows, send_now
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import MESSAGE, POSITION, Records
from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import Cluster, wait_routed
from tests.harness.store import NOW, open_store


def _publish(store, messages, now):
    """``messages`` ((MQTT topic name, payload), ...) of metaq topic ``lat`` appended as a publisher's burst is:
    ``(keys, staged, runs)`` as the turn hands them on."""
    staged = []
    for name, payload in messages:
        flag, data = record_data(name, payload, 1, "dev", {})
        staged.append(("lat", 0, flag, data, None, name))
    frames, src, general, _names = burst_frames(staged, 1 << 20)
    assert not general
    taken, runs = store.put_burst(frames, src, now)
    assert taken == len(staged)
    return {r.key for r in runs}, staged, runs


def _caught_up(store, filters=("lat/x",)):
    """A follow of ``filters`` that sent its first batch (its announcements): caught up."""
    follow = PeerFollow(store, rp.Routes(1, filters))
    follow.batch(None)
    assert follow.batch(None) == []
    return follow


def _received(sock):
    sock.setblocking(False)
    out = b""
    while True:
        try:
            part = sock.recv(1 << 20)
        except BlockingIOError:
            return out
        if not part:
            return out
        out += part


def test_the_turn_sends_the_frame_the_follow_would_send_and_moves_its_cursor(tmp_path):
    store = open_store(tmp_path)
    store.put("lat", 0, 0, b"first", NOW)  # the partition exists, and the topic when the route comes
    turn, ours, theirs = TurnFollows(), _caught_up(store), _caught_up(store)
    a, b = gsocket.socketpair()
    wake = Event()
    turn.waiting(ours, a, wake)
    # two records the filter matches and a last one it does not: MESSAGE, MESSAGE, then the POSITION past the third
    keys, staged, runs = _publish(store, [("lat/x", b"one"), ("lat/x", b"two"), ("lat/y", b"three")], NOW + 5)
    quiet = {}
    turn.serve(keys, staged, runs, NOW + 5, quiet)
    expected_entries = theirs.batch(None)
    assert [e.kind for e in expected_entries] == [MESSAGE, MESSAGE, POSITION]
    assert _received(b) == bytes(rp.joined(Records(tuple(expected_entries))))
    assert ours.cursors == theirs.cursors == {("lat", 0): 4}
    assert quiet == {("lat", 0): {wake}}  # the append's wake passes it over: nothing for it to do
    assert ours.batch(None) == [] and turn.sent_records == 2 and turn.frames == 1
    turn.busy(ours)  # its greenlet runs again: nothing more from a turn
    keys, staged, runs = _publish(store, [("lat/x", b"four")], NOW + 6)
    turn.serve(keys, staged, runs, NOW + 6, quiet)
    assert _received(b) == b"" and ours.cursors == {("lat", 0): 4}


def test_a_follow_with_anything_of_its_own_first_is_left_to_its_greenlet(tmp_path):
    store = open_store(tmp_path)
    store.put("lat", 0, 0, b"first", NOW)
    a, b = gsocket.socketpair()
    cases = {
        "woken already": lambda f, wake, turn: wake.set(),
        "a route to ack": lambda f, wake, turn: setattr(f, "routed", 3),
        "a route being acted on": lambda f, wake, turn: setattr(f, "routing", 1),
        "a partition to announce": lambda f, wake, turn: f.announce.append(("lat", 0)),
        "a frame's rest unsent": lambda f, wake, turn: setattr(f, "unsent", b"rest"),
        "sync: past the confirmed end": lambda f, wake, turn: setattr(turn, "confirmed_end", lambda: 0),
        "a shared group may take it": lambda f, wake, turn: setattr(f, "groups", (("g", "lat/#"),)),
        "behind": lambda f, wake, turn: f.cursors.__setitem__(("lat", 0), 0),
    }
    for i, (why, make) in enumerate(cases.items()):
        turn, follow, wake = TurnFollows(), _caught_up(store), Event()
        before = dict(follow.cursors)
        turn.waiting(follow, a, wake)
        make(follow, wake, turn)
        keys, staged, runs = _publish(store, [("lat/x", b"m%d" % i)], NOW + i)
        quiet = {}
        turn.serve(keys, staged, runs, NOW + i, quiet)
        assert quiet == {} and _received(b) == b"" and turn.frames == 0, why
        assert follow.cursors == before or why == "behind", why


def test_a_peer_that_does_not_read_never_blocks_the_turn_and_its_frames_stay_whole(tmp_path):
    store = open_store(tmp_path, segment_size=1 << 22)
    store.put("lat", 0, 0, b"first", NOW)
    turn, follow, wake = TurnFollows(), _caught_up(store), Event()
    a, b = gsocket.socketpair()
    a.setsockopt(gsocket.SOL_SOCKET, gsocket.SO_SNDBUF, 4096)
    turn.waiting(follow, a, wake)
    frames = []
    for i in range(40):  # the peer reads nothing: its buffer fills
        keys, staged, runs = _publish(store, [("lat/x", bytes([i]) * 60_000)], NOW + i)
        before = follow.cursors[("lat", 0)]
        started = time.monotonic()
        quiet = {}
        turn.serve(keys, staged, runs, NOW + i, quiet)
        assert time.monotonic() - started < 0.5
        if follow.cursors[("lat", 0)] == before:
            break  # nothing went: the follow's greenlet reads it back and sends it, as before
        frames.append(i)
        if follow.unsent:  # a frame went in part: the greenlet, woken, sends its rest before anything else
            assert quiet == {}
            turn.busy(follow)
            break
        assert quiet == {("lat", 0): {wake}}
    assert frames and follow.unsent
    rest, follow.unsent = follow.unsent, b""
    reader = gevent.spawn(_read_all, b, sum(len(rp.joined(Records(tuple(_entries(store, i))))) for i in frames))
    a.sendall(rest)
    got = reader.get(timeout=10)
    parser = rp.ReplicationParser()
    parser.receive_data(got)
    offsets = []
    for _ in frames:
        event = parser.next_event()
        assert isinstance(event, Records)
        offsets.extend(e.offset for e in event.entries)
    assert offsets == [1 + i for i in frames]  # every frame whole, in order


def _entries(store, i):
    """The entries of record ``1 + i`` of ``lat``-0, as a follow at it would send them."""
    follow = PeerFollow(store, rp.Routes(1, ("lat/x",), (("lat", 0, 1 + i),)))
    follow.batch(None)  # (its announcement)
    follow.cursors[("lat", 0)] = 1 + i
    return follow.batch(None)[:1]


def _read_all(sock, n):
    sock.setblocking(True)
    out = b""
    while len(out) < n:
        out += sock.recv(1 << 20)
    return out


def test_a_link_not_written_by_descriptor_gets_nothing_from_a_turn():
    """TLS (a socket wrapping the descriptor's bytes) or anything but a plain socket: the follow sends."""
    class Wrapped(gsocket.socket):
        pass

    a, b = gsocket.socketpair()
    wrapped = Wrapped(fileno=a.detach())
    assert send_now(wrapped, b"frame") == 0 and _received(b) == b""
    wrapped.close()
    assert send_now(a, b"frame") == 0  # closed: nothing written, the follow's own send ends the link


def test_a_filter_sets_matches_are_kept_up_to_their_limit(monkeypatch):
    monkeypatch.setattr(mqttcluster_limits, "MQTT_CLUSTER_MATCHES_KEPT_CHARS", 8)
    filters = FilterSet(("a/#",))
    assert filters.match("a/1") and not filters.match("b/1")  # 6 characters kept
    assert filters._matched == {"a/1": True, "b/1": False}
    assert filters.match("a/22")  # 10: one past it, the kept answers dropped
    assert filters._matched == {"a/22": True}
    assert filters.match("a/1") and filters._matched == {"a/22": True, "a/1": True}  # 7: at most 8


def test_a_lone_message_across_brokers_goes_from_the_publishers_turn(broker_factory, tmp_path, zk_connect):
    """``flush: async`` (a record is visible once written, as a subscriber here is served from the turn)."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2, store={"flush": "async"}).start()
    sub = Paho(cluster[1], "turn-follow-sub")
    assert sub.subscribe("tf/#", 1) == [1]
    pub = Paho(cluster[0], "turn-follow-pub")
    probes = wait_routed(sub, lambda i: pub.publish("tf/probe", b"probe", 1))
    before = int(cluster.stats(cluster[0])["mqtt_cluster_sent_from_turn"])
    for i in range(30):
        pub.publish("tf/a", b"m%d" % i, 1)
        time.sleep(0.01)
    assert [m.payload for m in sub.wait_messages(30, 10)] == [b"m%d" % i for i in range(30)], probes
    assert int(cluster.stats(cluster[0])["mqtt_cluster_sent_from_turn"]) - before >= 20
