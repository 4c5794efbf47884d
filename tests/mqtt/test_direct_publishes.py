"""A run of plain QoS 1 messages sent from a publisher's turn in one step (``direct.direct_publishes``, compiled where
built): compiled and run from its source it gives the same answers, writes the same bytes and leaves the same session
state (an OrderedDict's order included) on every input, and what it leaves is what the one-at-a-time send
(``direct._plain``: ``MqttSession.sent_next``, ``wire.publish_bytes``, ``dropped`` when nothing of a PUBLISH was
written or it is past the client's Maximum Packet Size) leaves for the same bytes taken by the socket: the packet ids
in flight and their ``where``, ``last_id``, the cursor, the rest of a PUBLISH begun."""

import errno
import importlib.util
import os
import random
import socket
from collections import OrderedDict
from types import SimpleNamespace

from metaq import native
from metaq.mqtt import direct, wire
from metaq.mqtt.records import stored_message
from metaq.mqtt.session import PUBLISH_SENT, PUBREL_SENT, MqttSession
from metaq.store.results import BurstRun



def source_module(name):
    """Module ``name`` run from its Python source, under a name of its own beside the one imported (compiled where
    built): the compiled module is held to its source on the same cases (under ``METAQ_PURE_PYTHON=1`` both are the
    source)."""
    spec = importlib.util.spec_from_file_location(name + "__source", native.source_path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = source_module("metaq.mqtt.direct")

NAMES = ("one/t", "one/u", "one/ü/x", "")


def _entry(rng, plain=0.85):
    """A staged entry as ``MqttPort.write_burst`` gets it: mostly a plain QoS 1 PUBLISH, else QoS 0 or one with
    properties."""
    name = rng.choice(NAMES[:3])
    payload = os.urandom(rng.choice((0, 1, 5, 100, 127, 128, 300, 3000, 20000)))
    if rng.random() < plain:
        qos, props = 1, {}
    else:
        qos, props = rng.choice(((0, {}), (1, {"content_type": "x"}), (1, None)))
    p = wire.Publish(name, payload, qos, False, False, 1 if qos else None, props or {})
    if props is None:
        object.__setattr__(p, "properties", None)
    return ("one", 0, 0, b"", p, name)


def _session(rng):
    """A session with some packet ids in flight (PUBLISHes and PUBRELs, in a random order) and ``last_id`` near them,
    across the wrap at 65535."""
    session = MqttSession("sub", wire.MQTT_5, 10)
    base = rng.choice((0, 1, 100, 65530, 65535))
    session.last_id = base
    for k in range(rng.randrange(0, 6)):
        pid = (base + rng.randrange(0, 8)) % 65535 + 1
        session.inflight[pid] = rng.choice((PUBLISH_SENT, PUBREL_SENT))
        session.where[pid] = (1, "one", 0, k)
    session.dirty = False
    return session


def _copy(session):
    other = MqttSession("sub", wire.MQTT_5, 10)
    other.inflight = OrderedDict(session.inflight)
    other.where = dict(session.where)
    other.last_id = session.last_id
    other.cursors = dict(session.cursors)
    other.dirty = session.dirty
    return other


def _state(session):
    return list(session.inflight.items()), session.where, session.last_id, session.dirty


def _pair(fill, sndbuf):
    """A connected pair, ours with a small send buffer and ``fill`` bytes in it already (none read)."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    ours.setblocking(False)
    left = fill
    while left > 0:
        try:
            left -= ours.send(b"\xEE" * min(left, 4096))
        except BlockingIOError:
            break
    theirs.setblocking(False)
    return ours, theirs


def _drain(theirs):
    got = bytearray()
    while True:
        try:
            chunk = theirs.recv(1 << 20)
        except BlockingIOError:
            return bytes(got)
        if not chunk:
            return bytes(got)
        got += chunk


def _case(rng):
    staged = [_entry(rng) for _ in range(rng.randrange(0, 16))]
    names = {n: True for n in NAMES if rng.random() < 0.8}
    i = rng.randrange(0, min(2, len(staged)) + 1)
    stop = len(staged) if rng.random() < 0.7 else rng.randrange(i, len(staged) + 1)
    return dict(staged=staged, i=i, stop=stop, names=names, window=rng.choice((1, 2, 3, 8, 65535)),
                v5=rng.random() < 0.5, max_packet=rng.choice((None, None, 200, 3000, 30000)),
                fill=rng.choice((0, 0, 0, 1000, 100_000, 10_000_000)), sndbuf=rng.choice((4096, 65536)),
                offset=rng.randrange(0, 1 << 40))


def _run(step, case, session):
    ours, theirs = _pair(case["fill"], case["sndbuf"])
    try:
        before = _drain(theirs)
        answer = step(ours.fileno(), case["staged"], case["i"], case["stop"], case["names"], session, "one", 0,
                      case["offset"], case["window"], case["v5"], case["max_packet"])
        return answer, _drain(theirs), len(before)
    finally:
        ours.close()
        theirs.close()


def test_the_step_compiled_and_its_source_answer_and_write_the_same():
    rng = random.Random(5857)
    for _ in range(1500):
        case = _case(rng)
        session = _session(rng)
        c_session, py_session = _copy(session), _copy(session)
        c = _run(direct.direct_publishes, case, c_session)
        py = _run(SOURCE.direct_publishes, case, py_session)
        assert c == py, case
        assert _state(c_session) == _state(py_session), case
        c_session.inflight[0x7777] = PUBLISH_SENT  # the OrderedDict still whole after its deletions
        assert list(c_session.inflight)[-1] == 0x7777


class _Socket:
    """``Connection.try_send`` as ``direct._plain`` meets it, the socket taking ``budget`` bytes in all."""

    def __init__(self, budget, version, max_packet, window):
        self.budget = budget
        self.version = version
        self.client_max_packet = max_packet
        self.inflight_window = window
        self.written = b""
        self.unsent = None

    def try_send(self, data):
        n = min(len(data), self.budget)
        self.budget -= n
        self.written += data[:n]
        if 0 < n < len(data):
            self.unsent = data[n:]
        return n


def test_the_one_step_leaves_what_the_one_at_a_time_send_leaves():
    """For the bytes the socket took, the session state, cursor and bytes are ``direct._plain``'s, one message at a
    time, stopping where it stops."""
    rng = random.Random(57)
    for _ in range(600):
        case = _case(rng)
        session = _session(rng)
        one_step = _copy(session)
        (went, state, rest, err), wrote, _before = _run(direct.direct_publishes, case, one_step)
        assert err == 0
        key = ("one", 0)
        conn = _Socket(len(wrote), wire.MQTT_5 if case["v5"] else wire.MQTT_311, case["max_packet"], case["window"])
        model = _copy(session)
        model.cursors[key] = case["offset"]
        decided = case["stop"]  # where the model met a record the one step does not take
        for k in range(case["i"], case["stop"]):
            p, name = case["staged"][k][4], case["staged"][k][5]
            if p.qos != 1 or p.properties or name not in case["names"]:
                decided = k
                break
            m = stored_message(name, p.payload, 1, "pub", None)
            if not direct._plain(conn, model, key, case["offset"] + k - case["i"], m, False):
                break
            model.cursors[key] = case["offset"] + k - case["i"] + 1
        assert wrote == conn.written, case
        assert case["offset"] + went == model.cursors[key], case
        assert rest == conn.unsent, case
        assert list(one_step.inflight.items()) == list(model.inflight.items()), case
        assert one_step.where == model.where and one_step.last_id == model.last_id, case
        if state == direct.DECIDE:
            assert case["i"] + went == decided < case["stop"]
        elif state == direct.DONE:
            assert case["i"] + went == case["stop"]


def test_a_failed_send_gives_every_id_back_and_says_why():
    session = MqttSession("sub", wire.MQTT_311, 10)
    staged = [("one", 0, 0, b"", wire.Publish("one/t", b"x", 1, packet_id=1), "one/t") for _ in range(3)]
    ours, theirs = socket.socketpair()
    theirs.close()
    try:
        went, state, rest, err = direct.direct_publishes(ours.fileno(), staged, 0, 3, {"one/t": True}, session,
                                                         "one", 0, 7, 10, False, None)
    finally:
        ours.close()
    assert (went, state, rest, err) == (0, direct.SHORT, None, errno.EPIPE)
    assert not session.inflight and not session.where and session.last_id == 1


def test_a_run_taken_whole_is_the_publishes_the_general_encoder_makes():
    session = MqttSession("sub", wire.MQTT_5, 10)
    session.inflight[2] = PUBREL_SENT
    staged = [("one", 0, 0, b"", wire.Publish("one/t", b"p%d" % k, 1, packet_id=9), "one/t") for k in range(3)]
    ours, theirs = socket.socketpair()
    try:
        answer = direct.direct_publishes(ours.fileno(), staged, 0, 3, {"one/t": True}, session, "one", 4, 10, 10, True,
                                         None)
        got = theirs.recv(1 << 16)
    finally:
        ours.close()
        theirs.close()
    assert answer == (3, direct.DONE, None, 0)
    assert got == b"".join(wire.encode(wire.Publish("one/t", b"p%d" % k, 1, False, False, pid, {}), wire.MQTT_5)
                           for k, pid in enumerate((1, 3, 4)))
    assert list(session.inflight.items()) == [(2, PUBREL_SENT), (1, PUBLISH_SENT), (3, PUBLISH_SENT),
                                              (4, PUBLISH_SENT)]
    assert session.where == {1: (1, "one", 4, 10), 3: (1, "one", 4, 11), 4: (1, "one", 4, 12)}
    assert session.last_id == 4 and session.dirty


def test_its_in_flight_state_is_the_sessions():
    """What the step writes in ``inflight`` is the session's ``PUBLISH_SENT`` (a PUBACK ends it)."""
    session = MqttSession("sub", wire.MQTT_311, 10)
    ours, theirs = socket.socketpair()
    try:
        direct.direct_publishes(ours.fileno(), [("one", 0, 0, b"", wire.Publish("one/t", b"x", 1, packet_id=1),
                                                 "one/t")], 0, 1, {"one/t": True}, session, "one", 0, 0, 10, False,
                                None)
    finally:
        ours.close()
        theirs.close()
    assert session.acknowledged(1, PUBLISH_SENT) and not session.inflight and not session.where



class _Guard:
    enabled = False

    def paced(self, session, kind):
        return False

    def allows(self, session, action, kind, name):
        return True


class _Conn:
    """A plain connection as ``direct.deliver_now`` meets it, taking every packet whole (``try_send``) or written by
    descriptor on ``sock`` (``fan_fd``)."""

    def __init__(self, session, sock=None):
        self.mqtt = session
        self.session = SimpleNamespace(user=None)
        self.closed = self.tls = False
        self.outbound_aliases = None
        self.inflight_window = 10
        self.version = wire.MQTT_311
        self.client_max_packet = None
        self.sock = sock
        self.written = []

    def try_send(self, data):
        self.written.append(data)
        return len(data)

    def fan_fd(self):
        return None if self.sock is None else self.sock.fileno()


def _delivery(log, cursor, sock=None):
    """An ``Outbound`` of a session reading ``one/#`` at QoS 1 with its cursor of ``("one", 0)`` at ``cursor``, over a
    log of ``log`` (queue offset -> payload) whose reads return at most 2 records (``MQTT_DELIVERY_BATCH``'s part)."""
    from metaq.mqtt.outbound import Outbound
    from metaq.mqtt.session import Subscribed
    session = MqttSession("sub", wire.MQTT_311, 10)
    session.subscriptions["one/#"] = Subscribed("one/#", 1, False, {"one"})
    session.cursors[("one", 0)] = cursor

    def read_records(topic, partition, offset, most, max_transfer):
        got = [SimpleNamespace(queue_offset=o, position=100 * o, msg_id=o, flag=0, data=log[o])
               for o in sorted(log) if o >= offset][:2]
        return got, offset + len(got)

    store = SimpleNamespace(read_records=read_records)
    decoded = SimpleNamespace(message=lambda dkey, topic, flag, data: stored_message("one/t", data, 1, "pub", None))
    port = SimpleNamespace(store=store, guard=_Guard(), decoded=decoded, max_transfer=1 << 20, cluster_topics=(),
                           put_path=SimpleNamespace(version=0))
    conn = _Conn(session, sock)
    return Outbound(conn, port), conn, session


def _burst(offsets):
    """A burst's staged entries and its one run (``BurstRun``'s fields) of plain QoS 1 messages at ``offsets``."""
    staged = [("one", 0, 0, b"m%d" % o, wire.Publish("one/t", b"m%d" % o, 1, packet_id=1), "one/t") for o in offsets]
    return staged, [BurstRun(("one", 0), len(offsets), 0, 0, offsets[0], 0, 10_000)]


def test_a_cursor_behind_the_burst_is_caught_up_only_once_it_reaches_the_partitions_end():
    """Another writer's record came between the delivery's last read and the burst (offsets 3 and 4 before the
    burst's 5 and 6): the delivery reads them from the log (two a read here) and is caught up only when its cursor
    reaches the burst's end, the partition's; left behind, its greenlet is woken to read on."""
    log = {o: b"m%d" % o for o in range(7)}
    staged, runs = _burst([5, 6])
    out, conn, session = _delivery(log, 3)
    assert direct.deliver_now(out, ("one", 0), runs, staged, "pub", 0, {}) is False
    assert session.cursors[("one", 0)] == 5 and len(conn.written) == 2  # the two the read gave, the rest left
    out, conn, session = _delivery(log, 5)
    assert direct.deliver_now(out, ("one", 0), runs, staged, "pub", 0, {}) is True  # at the burst: caught up
    assert session.cursors[("one", 0)] == 7 and len(conn.written) == 2


def test_a_delivery_written_by_descriptor_sends_the_run_in_one_step_and_stands_caught_up():
    ours, theirs = socket.socketpair()
    try:
        staged, runs = _burst([5, 6, 7])
        out, conn, session = _delivery({}, 5, ours)
        made = {}
        assert direct.deliver_now(out, ("one", 0), runs, staged, "pub", 0, made) is True  # the first by decision
        assert session.cursors[("one", 0)] == 8 and list(session.where.values()) == [(1, "one", 0, o)
                                                                                      for o in (5, 6, 7)]
        assert len(conn.written) == 1 and made  # the first of its name by the general path, then the one step
        got = theirs.recv(1 << 16)
        assert got == b"".join(wire.encode(wire.Publish("one/t", b"m%d" % o, 1, False, False, pid, {}),
                                           wire.MQTT_311) for o, pid in ((6, 2), (7, 3)))
    finally:
        ours.close()
        theirs.close()
