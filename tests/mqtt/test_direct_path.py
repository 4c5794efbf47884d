"""A waiting subscriber's two per-message steps: its share of a publisher's burst (``Delivery.path``: a
``direct.DirectPath``, compiled where built) and its read of PUBACKs (``Subscriptions.read_pubacks``). The path
compiled and run from its source gives the same answers, writes the same bytes and leaves the same state on seeded
inputs; the read of PUBACKs leaves what the general path leaves handling them one at a time (``next_event``,
``Subscriptions.acknowledged``); what the path keeps (the plain names
``Outbound.plain_names`` answered) is asked again whenever its stamp moves or the outbound drops its own; and on a
real broker (``flush: async``, where the publisher's turn sends to a subscriber waiting caught up) a subscription
changed between two messages, or a publisher whose own messages its No Local filters out, is decided by the general
path: what only that path makes (a QoS 0 PUBLISH, a Subscription Identifier, a message passed over) shows it ran."""

import os
import random
import socket
import time
from collections import OrderedDict
from types import SimpleNamespace

import pytest

from metaq.client.local import small_config
from metaq.mqtt import direct, wire
from metaq.mqtt.session import PUBLISH_SENT, PUBREL_SENT, MqttSession
from metaq.mqtt.subscriptions import Subscriptions
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.store.results import BurstRun
from tests.harness.mqtt import Raw, next_publish, with_mqtt
from tests.mqtt.test_direct_publishes import SOURCE, _drain

# -- the delivery's path: compiled against its source ----------------------------------------------------------------

class _Out:
    """What a path reads of its ``Outbound``: ``plain_names`` answered from a table, counting the questions."""

    def __init__(self, conn, session, put_path, table):
        self.conn, self.session = conn, session
        self.port = SimpleNamespace(put_path=put_path)
        self.table = table
        self.asked = []

    def plain_names(self, topic, own):
        self.asked.append((topic, own))
        return self.table.get((topic, own))


class _Conn:
    """What a path reads and calls of its connection."""

    def __init__(self, fd, v5, max_packet, window, tls=False, aliases=None):
        self.direct_fd = fd
        self.closed = False
        self.tls = tls
        self.outbound_aliases = aliases
        self.version = wire.MQTT_5 if v5 else wire.MQTT_311
        self.client_max_packet = max_packet
        self.inflight_window = window
        self.session = SimpleNamespace(user="u")
        self.calls = []

    def keep_unsent(self, rest):
        self.calls.append(("keep_unsent", rest))

    def send_failed(self, err):
        self.calls.append(("send_failed", err))


NAMES = ("one/t", "one/u", "one/v")


def _entry(rng, topic, partition):
    name = rng.choice(NAMES)
    payload = os.urandom(rng.choice((0, 1, 100, 300, 5000)))
    if rng.random() < 0.9:
        qos, props = 1, {}
    else:
        qos, props = rng.choice(((0, {}), (1, {"content_type": "x"})))
    return (topic, partition, 0, b"", wire.Publish(name, payload, qos, False, False, 1 if qos else None, props), name)


def _burst(rng, key, cursor):
    """``(runs, staged)``: one to three runs of partition ``key`` from about ``cursor``, among other entries."""
    staged, runs = [], []
    offset = cursor + rng.choice((0, 0, 0, -1, -3, 1))
    for _ in range(rng.randrange(1, 4)):
        staged += [_entry(rng, "other", 0) for _ in range(rng.randrange(0, 2))]
        count = rng.randrange(1, 6)
        first = len(staged)
        staged += [_entry(rng, key[0], key[1]) for _ in range(count)]
        runs.append(BurstRun(key, count, 0, 0, offset, first, 0))
        offset += count
    return runs, staged


def _world(rng, fd):
    session = MqttSession("sub", wire.MQTT_5, 10)
    session.last_id = rng.choice((0, 5, 65534))
    for k in range(rng.randrange(0, 4)):
        pid = (session.last_id + rng.randrange(0, 6)) % 65535 + 1
        session.inflight[pid] = rng.choice((PUBLISH_SENT, PUBREL_SENT))
        session.where[pid] = (1, "one", 0, k)
    conn = _Conn(fd, rng.random() < 0.5, rng.choice((None, None, 400, 6000)), rng.choice((2, 5, 100)),
                 tls=rng.random() < 0.05, aliases=object() if rng.random() < 0.05 else None)
    put_path = SimpleNamespace(version=0)
    table = {("one", False): {n: True for n in NAMES if rng.random() < 0.8},
             ("one", True): {n: True for n in NAMES if rng.random() < 0.5}}
    return session, conn, put_path, table


def _copy_world(world, fd):
    session, conn, put_path, table = world
    s = MqttSession("sub", wire.MQTT_5, 10)
    s.inflight, s.where, s.last_id = OrderedDict(session.inflight), dict(session.where), session.last_id
    c = _Conn(fd, conn.version == wire.MQTT_5, conn.client_max_packet, conn.inflight_window, conn.tls,
              conn.outbound_aliases)
    return s, c, SimpleNamespace(version=put_path.version), {k: dict(v) for k, v in table.items()}


def _pair():
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ours.setblocking(False)
    theirs.setblocking(False)
    return ours, theirs


def _play(make, world, steps):
    """Each step of ``steps`` played on a path ``make`` makes: its answers, the bytes the peer got, the state left."""
    ours, theirs = _pair()
    try:
        session, conn, put_path, table = _copy_world(world, ours.fileno())
        out = _Out(conn, session, put_path, table)
        path = make(out)
        seen = []
        for step in steps:
            kind = step[0]
            if kind == "burst":
                _, key, cursor, runs, staged, client_id, fd_free, closed, shared = step
                if cursor is None:
                    session.cursors.pop(key, None)
                else:
                    session.cursors[key] = cursor
                conn.direct_fd = ours.fileno() if fd_free else -1
                conn.closed = closed
                session.shared = {"$share/g/one/#": (SimpleNamespace(cursors={}), 1, None)} if shared else {}
                answer = path.send(key, runs, staged, client_id)
                seen.append((answer, session.cursors.get(key), _drain(theirs) if rng_drain(step) else b""))
            elif kind == "version":
                put_path.version += 1
            elif kind == "user":
                conn.session = SimpleNamespace(user=step[1])
            elif kind == "changes":
                session.changes += 1
            elif kind == "names":
                table[step[1]] = step[2]
            elif kind == "drop":
                path.drop()
        seen.append(_drain(theirs))
        return (seen, list(session.inflight.items()), session.where, session.last_id, conn.calls, out.asked)
    finally:
        ours.close()
        theirs.close()


def rng_drain(step):
    return step[2] is not None and step[2] % 2 == 0  # the peer reads after some bursts only: the socket fills


def _steps(rng):
    steps = []
    cursors = {("one", 0): rng.randrange(0, 50), ("one", 1): rng.randrange(0, 50)}
    for _ in range(rng.randrange(1, 25)):
        r = rng.random()
        if r < 0.7:
            key = rng.choice(list(cursors))
            cursor = cursors[key] if rng.random() < 0.95 else None
            runs, staged = _burst(rng, key, cursors[key])
            cursors[key] = runs[-1][4] + runs[-1][1]
            steps.append(("burst", key, cursor, runs, staged, rng.choice(("pub", "sub", "", None)),
                          rng.random() < 0.9, rng.random() < 0.03, rng.random() < 0.05))
        elif r < 0.76:
            steps.append(("version",))
        elif r < 0.82:
            steps.append(("user", rng.choice(("u", "v"))))
        elif r < 0.88:
            steps.append(("changes",))
        elif r < 0.94:
            steps.append(("names", ("one", rng.random() < 0.5),
                          None if rng.random() < 0.2 else {n: True for n in NAMES if rng.random() < 0.6}))
        else:
            steps.append(("drop",))
    return steps


@pytest.mark.parametrize("cls", [pytest.param(direct.DirectPath, id="module"),
                                 pytest.param(SOURCE.DirectPath, id="source")])
def test_the_publishers_turn_calls_the_path_by_its_name(cls):
    """A path is not a callable: ``serve_waiting`` calls its method ``send`` (a C method where compiled), so the call
    site names what runs and no call goes through the type's ``tp_call`` with its arguments packed in a tuple."""
    assert "__call__" not in vars(cls) and callable(cls.send)


def test_the_path_compiled_and_its_source_answer_write_and_leave_the_same():
    rng = random.Random(5859)
    for _ in range(400):
        world = _world(rng, -1)
        steps = _steps(rng)
        assert _play(direct.DirectPath, world, steps) == _play(SOURCE.DirectPath, world, steps), steps


@pytest.mark.parametrize("make", [pytest.param(direct.DirectPath, id="module"),
                                  pytest.param(SOURCE.DirectPath, id="source")])
def test_the_plain_names_are_asked_again_when_the_stamp_moves_or_the_outbound_drops_them(make):
    """The path keeps ``plain_names``' answer while the put path's version, the user and the subscriptions' changes
    stand: a moved one, or the outbound's ``drop``, has the next burst ask again and use the new answer."""
    ours, theirs = _pair()
    try:
        session = MqttSession("sub", wire.MQTT_5, 10)
        conn = _Conn(ours.fileno(), True, None, 100)
        put_path = SimpleNamespace(version=0)
        table = {("one", False): {"one/t": True}}
        out = _Out(conn, session, put_path, table)
        path = make(out)
        key = ("one", 0)

        def burst(offset):
            session.cursors[key] = offset
            staged = [("one", 0, 0, b"", wire.Publish("one/t", b"x", 1, packet_id=1), "one/t")]
            return path.send(key, [BurstRun(key, 1, 0, 0, offset, 0, 0)], staged, "pub")

        assert burst(0) is True and len(out.asked) == 1
        assert burst(1) is True and len(out.asked) == 1  # kept
        for move in (lambda: setattr(put_path, "version", 1), lambda: setattr(conn, "session",
                                                                              SimpleNamespace(user="v")),
                     lambda: setattr(session, "changes", session.changes + 1), path.drop):
            table[("one", False)] = {}  # the new answer: not plain any more
            move()
            assert burst(2) is None  # asked again: the general path decides it
            table[("one", False)] = {"one/t": True}
            path.drop()
            assert burst(2) is True
        assert len(out.asked) == 9
        table[("one", False)] = None  # not sendable: the general path says so, nothing kept
        path.drop()
        assert burst(3) is None and burst(3) is None and len(out.asked) == 11
    finally:
        ours.close()
        theirs.close()


# -- the subscriber's read of PUBACKs against the general path ------------------------------------------------------

class _Delivery:
    def __init__(self):
        self.woken = 0

    def wake(self):
        self.woken += 1


def _ack_world(rng):
    session = MqttSession("sub", wire.MQTT_5, 10)
    for pid in rng.sample(range(1, 40), rng.randrange(0, 20)):
        session.inflight[pid] = rng.choice((PUBLISH_SENT, PUBLISH_SENT, PUBREL_SENT))
        session.where[pid] = (1, "one", 0, pid)
    session.shared = {"$share/g/x": None} if rng.random() < 0.1 else {}
    return session


def _ack_bytes(rng, v5):
    out = b""
    for _ in range(rng.randrange(0, 6)):
        r = rng.random()
        pid = rng.randrange(0, 45)
        if r < 0.7:
            out += wire.encode(wire.PubAck(pid or 1), wire.MQTT_5 if v5 else wire.MQTT_311)
        elif r < 0.8 and v5:
            out += bytes((0x40, 3, pid >> 8, pid & 0xFF, rng.choice((0x00, 0x10, 0x80, 0x42))))
        elif r < 0.9:
            out += wire.encode(wire.PingReq(), wire.MQTT_311)
        else:
            out += bytes((0x40, 2, 0, 0))  # packet id 0: refused by the general path
    if rng.random() < 0.15:
        out += bytes((0x40, 2, 0))  # part of one
    return out


def _events(parser):
    """What the parser hands the general path next, up to the end of what it holds (a refusal: its reason code)."""
    events = []
    while True:
        try:
            event = parser.next_event()
        except wire.MqttError as exc:
            events.append(("refused", exc.reason_code))
            return events
        if event is NEED_DATA or event is CLOSED:
            return events
        events.append(event)


def _one_at_a_time(subs, parser, data):
    """The general path's handling of a read's leading PUBACKs: each by ``Subscriptions.acknowledged``; what follows
    the first other packet is left. ``(PUBACKs taken, events left)``."""
    parser.receive_data(data)
    events = _events(parser)
    taken = 0
    while taken < len(events) and isinstance(events[taken], wire.PubAck):
        subs.acknowledged(events[taken].packet_id, PUBLISH_SENT)
        taken += 1
    return taken, events[taken:]


def _ack_play(seed, general):
    """A seeded subscriber's read of PUBACKs handled by its turn (or, ``general``, one at a time): the answer, what
    is left for the general path, and the state left."""
    rng = random.Random(seed)
    v5 = rng.random() < 0.5
    parser = wire.MqttParser(version=wire.MQTT_5 if v5 else wire.MQTT_311, sender="client")
    if rng.random() < 0.1:
        parser.receive_data(bytes((0x40,)))  # a byte buffered before the read
    session = _ack_world(rng)
    conn = SimpleNamespace(mqtt=session, closed=rng.random() < 0.05, inflight_window=rng.choice((1, 3, 10, 100)))
    subs = Subscriptions(conn, None, None)
    subs.delivery = _Delivery() if rng.random() < 0.9 else None
    data = _ack_bytes(rng, v5) or wire.encode(wire.PubAck(1), wire.MQTT_311)
    data = data if data[0] == 0x40 else bytes((0x40, 2, 0, 7)) + data
    if general:
        answer, events = _one_at_a_time(subs, parser, data)
    else:
        answer = subs.read_pubacks(parser, data)
        events = _events(parser)
    return (answer, events, parser.completed, list(session.inflight.items()), session.where, session.dirty,
            bool(subs.delivery.woken) if subs.delivery is not None else None, conn.closed)


def test_the_ack_turn_leaves_what_the_general_path_leaves_one_at_a_time():
    """The messages ended, the packets left in their order (a refusal where the general path meets it), the packets
    counted, the session's state and whether the delivery was woken, on 3,000 seeded reads; the turn's answer says
    whether it took any (None: none), whether the connection must close (False) and whether anything is left."""
    for seed in range(3000):
        answer, *turn = _ack_play(seed, False)
        taken, *general = _ack_play(seed, True)
        assert turn == general, seed
        events, closed = turn[0], turn[-1]
        if not taken:
            assert answer is None, seed
        elif closed:
            assert answer is False, seed
        elif events:
            assert answer is None, seed
        else:
            assert answer in (True, None), seed  # None: part of a packet is buffered


# -- on a real broker: what the path must not keep ------------------------------------------------------------------

def _config(tmp_path):
    return with_mqtt(small_config(tmp_path / "data", store={"flush": "async"}))


def _subscriber(b, client_id, *subscriptions, ids=None):
    s = Raw(b, wire.MQTT_5, timeout=10)
    assert s.connect(client_id).reason_code == 0
    _subscribe(s, *subscriptions, ids=ids)
    return s


def _subscribe(s, *subscriptions, ids=None, packet_id=1):
    s.send(wire.Subscribe(packet_id, tuple(subscriptions), {"subscription_identifier": ids} if ids else {}))
    while True:
        p = s.read()
        if isinstance(p, wire.Suback):
            time.sleep(0.5)  # its delivery caught up, waiting again: the next message is the publisher's turn's
            return p
        assert isinstance(p, wire.Publish), p  # (nothing retained here)


def _publish(pub, name, payload, packet_id):
    pub.send(wire.Publish(name, payload, 1, packet_id=packet_id))
    ack = pub.read()
    assert isinstance(ack, wire.PubAck) and ack.reason_code == 0, ack


def _got(sub):
    p = next_publish(sub)
    if p.qos:
        sub.send(wire.PubAck(p.packet_id))
    return p


def test_a_subscription_changed_between_two_messages_is_decided_again(broker_factory, tmp_path):
    """Between two messages the path sent in one step, the filter that matched them is replaced by one that does
    not match their name: the next message of that name is passed over and one of the new filter's name comes; a
    filter with a Subscription Identifier, then one at QoS 0, apply at the next message too (each a PUBLISH only the
    general path makes); a plain filter again is sent plainly."""
    b = broker_factory(_config(tmp_path))
    sub = _subscriber(b, "sub", wire.Subscription("one/#", 1))
    pub = Raw(b, wire.MQTT_5, timeout=10)
    assert pub.connect("pub").reason_code == 0
    _publish(pub, "one/t", b"a", 1)
    _publish(pub, "one/t", b"b", 2)
    assert [(p.payload, p.qos) for p in (_got(sub), _got(sub))] == [(b"a", 1), (b"b", 1)]
    sub.send(wire.Unsubscribe(2, ("one/#",)))
    assert isinstance(sub.read(), wire.Unsuback)
    _subscribe(sub, wire.Subscription("one/u", 1), packet_id=3)
    _publish(pub, "one/t", b"c", 3)  # no filter matches it now
    _publish(pub, "one/u", b"d", 4)
    p = _got(sub)
    assert (p.topic, p.payload, p.qos) == ("one/u", b"d", 1)
    _subscribe(sub, wire.Subscription("one/#", 1, retain_handling=2), ids=7, packet_id=4)
    _publish(pub, "one/t", b"e", 5)
    p = _got(sub)
    assert (p.payload, p.qos, p.properties.get("subscription_identifier")) == (b"e", 1, (7,))
    _subscribe(sub, wire.Subscription("one/#", 0, retain_handling=2), packet_id=5)
    _publish(pub, "one/t", b"f", 6)
    p = _got(sub)
    assert (p.payload, p.qos) == (b"f", 0)
    _subscribe(sub, wire.Subscription("one/#", 1, retain_handling=2), packet_id=6)
    _publish(pub, "one/t", b"g", 7)
    p = _got(sub)
    assert (p.payload, p.qos, p.properties.get("subscription_identifier")) == (b"g", 1, None)
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)  # nothing more


def test_no_local_holds_for_a_client_publishing_between_anothers_messages(broker_factory, tmp_path):
    """The names the path keeps are per publisher: its own (No Local: none) and another's. A subscriber publishing
    to its own No Local filter between another client's messages never gets its own back, and gets every other."""
    b = broker_factory(_config(tmp_path))
    sub = _subscriber(b, "sub", wire.Subscription("one/#", 1, no_local=True))
    pub = Raw(b, wire.MQTT_5, timeout=10)
    assert pub.connect("pub").reason_code == 0
    for k in range(4):
        _publish(pub, "one/t", b"other-%d" % k, 1 + k)
        assert _got(sub).payload == b"other-%d" % k
        sub.send(wire.Publish("one/t", b"own-%d" % k, 1, packet_id=100 + k))
        while True:
            p = sub.read()
            if isinstance(p, wire.PubAck):
                break
            assert not isinstance(p, wire.Publish), p  # its own never comes back
    sub.send(wire.PingReq())
    assert isinstance(sub.read(), wire.PingResp)


# -- the connection's descriptor kept for the path --------------------------------------------------------------------

def test_the_descriptor_kept_for_the_path_is_fan_fds_answer_at_every_step():
    """``Connection.direct_fd``, kept as writes begin and end, equals ``fan_fd``'s answer (-1 for None) at each step:
    a packet left partly unsent, a writer inside a packet (the write lock held across its wait), what a write by
    descriptor left (``keep_unsent``), the close."""
    import gevent

    from metaq.mqtt.fanout import send_each
    from tests.mqtt.test_partial_sends import _connection, _read_all

    conn, peer = _connection()

    def agrees():
        fd = conn.fan_fd()
        return conn.direct_fd == (-1 if fd is None else fd)

    assert agrees() and conn.direct_fd >= 0
    first = b"E" * 200_000
    assert 0 < conn.try_send(first) < len(first)
    assert agrees() and conn.direct_fd == -1
    reader = gevent.spawn(_read_all, peer, len(first))
    assert conn.flush_unsent() is True and reader.get(timeout=10) == first
    assert agrees() and conn.direct_fd >= 0
    big = b"F" * 300_000
    writer = gevent.spawn(conn.send_bytes, big)
    gevent.sleep(0.05)
    assert not writer.ready() and agrees() and conn.direct_fd == -1
    reader = gevent.spawn(_read_all, peer, len(big))
    assert writer.get(timeout=10) is True and reader.get(timeout=10) == big
    assert agrees() and conn.direct_fd >= 0
    writer = gevent.spawn(conn.send_made, lambda: big)
    gevent.sleep(0.05)
    assert not writer.ready() and agrees() and conn.direct_fd == -1
    reader = gevent.spawn(_read_all, peer, len(big))
    assert writer.get(timeout=10) is True and reader.get(timeout=10) == big
    assert agrees() and conn.direct_fd >= 0
    packet = b"H" * 150_000
    took = dict(send_each([packet], [conn.direct_fd])).get(0, len(packet))
    assert 0 < took < len(packet)
    conn.keep_unsent(packet[took:])
    assert agrees() and conn.direct_fd == -1
    assert conn.try_send(b"x") == 0 and agrees()  # the rest still not all taken
    reader = gevent.spawn(_read_all, peer, len(packet) - took + 1)
    while conn.unsent:
        gevent.sleep(0.01)
        conn.try_send(b"")
    assert agrees() and conn.direct_fd >= 0
    reader.kill()
    conn.close()
    assert agrees() and conn.direct_fd == -1
    peer.close()
