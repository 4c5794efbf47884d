"""The plain PUBLISHes a reader's buffer holds, split and staged in one step (``wire.plain_publishes``, in C as
``metaq._bytes.mqtt_plain_publishes``): the C function and its Python twin give the same plain values and stop at
the same byte, refusals included; the parser with the split gives the packets and refusals it gives without it; each
entry's record is ``record_data``'s, byte for byte, in the partition ``partition_for`` names."""

import random

import pytest

from metaq.mqtt.limits import MQTT_MAX_PACKET_BYTES
from metaq.mqtt import port, publishes, wire
from metaq.mqtt.acks import PubAckRun
from metaq.mqtt.plainturn import entries_of
from metaq.mqtt.records import partition_for, placement, plain_plan, record_data
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.mqtt.wire import MQTT_5, MQTT_311, MqttError, MqttParser, Publish, encode, encode_varint
from metaq.protocol.stream import CLOSED, NEED_DATA

try:
    from metaq.native._bytes import mqtt_burst_frames as burst_frames_c
    from metaq.native._bytes import mqtt_plain_publishes as plain_publishes_c
    from metaq.native._bytes import mqtt_read_publishes as read_publishes_c
except ImportError:  # the C helper was not built
    plain_publishes_c = burst_frames_c = read_publishes_c = None

needs_c = pytest.mark.skipif(plain_publishes_c is None, reason="metaq.native._bytes was not built")

NAMES = ["a/b", "sensors/room1/temp", "é/ü", "x"]
CLIENT = "dev-1"
PARTITIONS = {"a": 3, "sensors": 8, "mqtt": 2, "x": 1}


def _plans(names=NAMES, client_id=CLIENT):
    return {n.encode("utf-8"): plain_plan(DEFAULT_MAP, n, client_id) for n in names if placeable(n)}


def placeable(name):
    try:
        placement(DEFAULT_MAP, name)
    except ValueError:
        return False
    return True


def _packet(first, body):
    return bytes((first,)) + encode_varint(len(body)) + body


def _s(raw):
    return len(raw).to_bytes(2, "big") + raw


def _random_packet(rng, v5):
    """A PUBLISH most often plain, sometimes one the split must leave to the general path, or another packet."""
    name = rng.choice(NAMES + ["unknown/t", "a/+", ""]).encode("utf-8")
    payload = rng.randbytes(rng.choice([0, 1, 5, 128, 200]))
    kind = rng.random()
    if kind < 0.7:
        qos = rng.choice([0, 1])
        first = 0x30 | (qos << 1) | (0x08 if qos and rng.random() < 0.2 else 0)
        body = _s(name) + (rng.randrange(1, 65536).to_bytes(2, "big") if qos else b"") + (b"\x00" if v5 else b"")
        return _packet(first, body + payload)
    if kind < 0.95:  # an odd one: flags, a packet id 0, properties, a short body, a long varint
        first = rng.choice([0x31, 0x34, 0x36, 0x38, 0x3C, 0x32, 0x30])
        body = rng.choice([_s(name) + b"\x00\x00" + payload, _s(name) + b"\x03\x01\x00\x00" + payload, b"\x00",
                           b"\x00\x09a/b", _s(name)])
        if rng.random() < 0.2:
            return bytes((first, 0x80 | len(body), 0x00)) + body  # not in its shortest encoding
        return _packet(first, body)
    return rng.choice([b"\xc0\x00", b"\x40\x02\x00\x01", b"\xe0\x00"])  # PINGREQ, PUBACK, DISCONNECT


def _both(buf, pos, v5, max_packet, plans, decided, room, count, nbytes):
    py = wire.plain_publishes_py(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
    c = plain_publishes_c(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
    return py, c


@needs_c
@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_the_c_split_and_its_python_twin_give_the_same_entries_and_stop_at_the_same_byte(v5):
    rng = random.Random(43 + v5)
    plans = _plans()
    for _ in range(600):
        data = b"".join(_random_packet(rng, v5) for _ in range(rng.randrange(1, 12)))
        buf = bytearray(rng.randbytes(rng.randrange(3)) + data)
        cut = rng.randrange(len(buf) + 1) if rng.random() < 0.3 else len(buf)
        buf = buf[:cut]
        pos = rng.randrange(min(3, len(buf) + 1))
        decided = {t: n for t, n in PARTITIONS.items() if rng.random() < 0.9}
        args = (buf, pos, v5, rng.choice([MQTT_MAX_PACKET_BYTES, 40, 150]), plans, decided, rng.randrange(-1, 6),
                rng.randrange(1, 10), rng.choice([1, 100, 1 << 20]))
        py, c = _both(*args)
        assert c == py
        assert [[type(f) for f in e] for e in c[0]] == [[type(f) for f in e] for e in py[0]]  # plain values alike


@needs_c
@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_the_c_read_split_and_its_python_twin_give_the_same_entries_and_the_pubacks_of_the_qos1_ones(v5):
    """``mqtt_read_publishes`` (the publisher's read in one C call) and ``wire.read_publishes_py``: the same entries,
    stop and counts as the split, and the PUBACKs of the QoS 1 PUBLISHes it took, in their order."""
    rng = random.Random(57 + v5)
    plans = _plans()
    for _ in range(600):
        data = b"".join(_random_packet(rng, v5) for _ in range(rng.randrange(1, 12)))
        buf = bytearray(rng.randbytes(rng.randrange(3)) + data)
        buf = buf[:rng.randrange(len(buf) + 1)] if rng.random() < 0.3 else buf
        if rng.random() < 0.5:
            buf = bytes(buf)  # a read's bytes, as the reader gives them
        pos = rng.randrange(min(3, len(buf) + 1))
        decided = {t: n for t, n in PARTITIONS.items() if rng.random() < 0.9}
        args = (buf, pos, v5, rng.choice([MQTT_MAX_PACKET_BYTES, 40, 150]), plans, decided, rng.randrange(-1, 6),
                rng.randrange(1, 10), rng.choice([1, 100, 1 << 20]))
        py, c = wire.read_publishes_py(*args), read_publishes_c(*args)
        assert c == py
        assert c[:4] == tuple(plain_publishes_c(*args))
        assert c[4] == wire.encode_pubacks_py([e[4].packet_id for e in entries_of(c[0]) if e[4].qos])


def test_a_pubacks_run_made_from_its_bytes_reads_back_its_ids():
    ids = [1, 255, 256, 65535, 7]
    run = PubAckRun(encoded=wire.encode_pubacks_py(ids))
    assert (run.count, run.ids, run.encoded()) == (5, ids, PubAckRun(ids).encoded())
    assert PubAckRun(ids).count == 5


def _reads(data, version, cuts, plans, decided):
    """Every packet of ``data`` given to a parser in reads cut at ``cuts``, each through ``plain_read`` (the
    publisher's turn), then as the reader goes on: the split of the buffer, ``next_event``."""
    p = MqttParser(version, sender="client")
    out = []
    bounds = [0, *cuts, len(data)]
    for k in range(len(bounds) - 1):
        if bounds[k] == bounds[k + 1]:
            continue  # (an empty read is the end of the stream)
        got = p.plain_read(data[bounds[k]:bounds[k + 1]], plans, decided, 1 << 20, 1 << 20, 1 << 40)
        out += [e[4] for e in entries_of(got[0])]
        assert got[3] == wire.encode_pubacks_py([e[4].packet_id for e in entries_of(got[0]) if e[4].qos])
        assert got[4] == (p.buffered > 0)  # whether bytes are left buffered
        while True:
            got = p.plain_publishes(plans, decided, 1 << 20, 1 << 20, 1 << 40)[0]
            if got:
                out += [e[4] for e in entries_of(got)]
                continue
            event = p.next_event()
            assert event is not CLOSED
            if event is NEED_DATA:
                break
            out.append(event)
    p.receive_data(b"")
    assert p.next_event() is CLOSED
    return out, p.completed


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_reads_given_to_plain_read_cut_at_every_byte_give_the_packets_the_buffer_gives(version):
    """Three PUBLISHes with a PINGREQ between, in two reads cut at every byte (a partial packet at the end of a
    read, its rest at the start of the next): the reader's one-step split of a read gives the packets, in order,
    and the count of completed packets, that the buffer and ``next_event`` give."""
    v5 = version == MQTT_5
    sent = [Publish("a/b", b"one", 1, packet_id=1), Publish("sensors/room1/temp", b"two"), wire.PingReq(),
            Publish("a/b", b"three", 1, True, True, 2), Publish("a/b", b"props", 1, packet_id=3,
                                                                properties={"content_type": "x"} if v5 else {})]
    data = b"".join(encode(p, version) for p in sent)
    expected = _parse(data, version, False)
    assert expected[0] == sent
    plans, decided = _plans(), dict(PARTITIONS)
    for cut in range(len(data) + 1):
        assert _reads(data, version, [cut], plans, decided) == expected, cut
    rng = random.Random(version)
    for _ in range(200):
        data = b"".join(_random_packet(rng, v5) for _ in range(rng.randrange(1, 10)))
        try:
            expected = _parse(data, version, False)
        except MqttError:
            continue
        cuts = sorted(rng.sample(range(len(data) + 1), min(3, len(data) + 1)))
        assert _reads(data, version, cuts, plans, decided) == expected


@needs_c
def test_the_c_split_refuses_what_is_not_a_plan_or_a_buffer_as_its_caller_would_see():
    buf = _packet(0x30, _s(b"a/b") + b"x")
    with pytest.raises(TypeError):
        plain_publishes_c(buf, 0, False, 1000, {b"a/b": ("a/b",)}, {"a": 1}, 0, 1, 100)
    with pytest.raises(ValueError):
        plain_publishes_c(buf, len(buf) + 1, False, 1000, _plans(), {"a": 1}, 0, 1, 100)


def _parse(data, version, split, plans=None, decided=None, room=1 << 20, count=1 << 20, nbytes=1 << 40):
    """Every packet of ``data`` (after a CONNECT's version), taking the split where it applies when ``split``."""
    p = MqttParser(version, sender="client")
    p.receive_data(data)
    p.receive_data(b"")
    out = []
    while True:
        if split:
            got = p.plain_publishes(plans, decided, room, count, nbytes)[0]
            if got:
                out += [e[4] for e in entries_of(got)]
                continue
        event = p.next_event()
        if event is NEED_DATA or event is CLOSED:
            return out, p.completed
        out.append(event)


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
def test_the_parser_with_the_split_gives_the_packets_and_refusals_it_gives_without_it(version):
    rng = random.Random(version)
    plans, decided = _plans(), dict(PARTITIONS)
    for _ in range(300):
        data = b"".join(_random_packet(rng, version == MQTT_5) for _ in range(rng.randrange(1, 10)))
        try:
            expected = _parse(data, version, False)
        except MqttError as exc:
            with pytest.raises(MqttError) as info:
                _parse(data, version, True, plans, decided)
            assert (info.value.reason_code, info.value.version) == (exc.reason_code, exc.version)
            continue
        assert _parse(data, version, True, plans, decided) == expected


def test_the_split_takes_nothing_before_a_connect_or_after_a_refusal():
    data = _packet(0x30, _s(b"a/b") + b"x")
    p = MqttParser(None, sender="client")
    p.receive_data(data)
    assert p.plain_publishes(_plans(), dict(PARTITIONS), 10, 10, 1000) == ((), 0, 0)
    with pytest.raises(MqttError):
        p.next_event()  # the first packet must be CONNECT
    p.version = MQTT_311
    assert p.plain_publishes(_plans(), dict(PARTITIONS), 10, 10, 1000) == ((), 0, 0)


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_each_entry_is_what_stage_gives_its_record_record_datas_byte_for_byte(v5):
    rng = random.Random(7)
    plans = _plans()
    version = MQTT_5 if v5 else MQTT_311
    sent = [Publish(rng.choice([n for n in NAMES if placeable(n)]), rng.randbytes(rng.randrange(300)), qos,
                    False, bool(qos and rng.random() < 0.3), rng.randrange(1, 65536) if qos else None)
            for qos in [rng.choice([0, 1]) for _ in range(200)]]
    buf = bytearray(b"".join(encode(p, version) for p in sent))
    for split in (wire.plain_publishes_py, wire.plain_publishes):
        split_, pos, qos1, nbytes = split(buf, 0, v5, MQTT_MAX_PACKET_BYTES, plans, PARTITIONS, 1 << 20, 1 << 20,
                                          1 << 40)
        entries = entries_of(split_)
        assert pos == len(buf) and [e[4] for e in entries] == sent
        assert (qos1, nbytes) == (sum(p.qos for p in sent), sum(len(e[3]) for e in entries))
        for (topic, partition, flag, data, _p, name), want in zip(entries, sent, strict=True):
            assert name == want.topic and topic == placement(DEFAULT_MAP, name)[0]
            assert partition == partition_for(name, PARTITIONS[topic])
            assert (flag, data) == record_data(name, want.payload, want.qos, CLIENT, {}, False, 12345)


@pytest.mark.parametrize("split", [wire.plain_publishes_py, wire.plain_publishes], ids=["python", "loaded"])
def test_the_split_stops_at_its_count_its_bytes_and_the_qos1_room_at_and_one_past(split):
    v = MQTT_311
    plans = _plans()
    qos1 = b"".join(encode(Publish("a/b", b"p%d" % k, 1, packet_id=k + 1), v) for k in range(5))
    one = len(plan_data := plans[b"a/b"][5] + b"p0")

    def taken(buf, room=100, count=100, nbytes=1 << 20):
        return len(split(bytearray(buf), 0, False, MQTT_MAX_PACKET_BYTES, plans, PARTITIONS, room, count, nbytes)[0])

    assert plan_data.endswith(b"p0")
    assert taken(qos1, count=4) == 4 and taken(qos1, count=5) == 5
    assert taken(qos1, room=4) == 4 and taken(qos1, room=5) == 5
    assert taken(qos1, nbytes=2 * one) == 2 and taken(qos1, nbytes=2 * one + 1) == 3  # stops once reached
    qos0 = b"".join(encode(Publish("a/b", b"q"), v) for _ in range(3))
    assert taken(qos0, room=0) == 3  # QoS 0 takes no room
    assert taken(encode(Publish("a/b", b"q"), v), count=0) == 0


def test_a_publish_at_the_packet_limit_is_taken_and_one_past_is_left_to_the_general_path():
    data = encode(Publish("a/b", b"x" * 10), MQTT_311)
    for split in (wire.plain_publishes_py, wire.plain_publishes):
        at = split(bytearray(data), 0, False, len(data), _plans(), PARTITIONS, 1, 1, 1000)
        past = split(bytearray(data), 0, False, len(data) - 1, _plans(), PARTITIONS, 1, 1, 1000)
        assert (len(at[0]), at[1]) == (1, len(data)) and past == ([], 0, 0, 0)


@pytest.mark.parametrize("extra", [0, 1], ids=["at", "past"])
def test_a_connection_keeps_at_most_mqtt_plain_plans_names_at_and_one_past(extra):
    plans = {}
    names = ["t/%d" % k for k in range(publishes.MQTT_PLAIN_PLANS + extra)]
    for name in names:
        publishes.remember_plan(plans, DEFAULT_MAP, name, CLIENT)
    assert len(plans) == (publishes.MQTT_PLAIN_PLANS if not extra else 1)
    assert plans[names[-1].encode()] == plain_plan(DEFAULT_MAP, names[-1], CLIENT)


@needs_c
def test_the_c_burst_frames_and_their_python_twin_are_equal_byte_for_byte():
    rng = random.Random(5)
    for _ in range(300):
        staged = [(rng.choice(["a", "sensors", "bench"]), rng.randrange(8), rng.choice([0, 1]),
                   rng.randbytes(rng.choice([0, 3, 128, 700])), "extra")[:rng.choice([4, 5])]
                  for _ in range(rng.randrange(0, 20))]
        largest = rng.choice([10, 130, 1 << 30])
        c = burst_frames_c(staged, largest)
        assert c == port.burst_frames_py(staged, largest)
        frames, src, general, names = c
        assert [src[f[4]:f[4] + f[5]] for f in frames] == [e[3] for e in staged]


def test_burst_frames_refuse_a_topic_that_is_not_ascii_as_the_twin_does():
    for frames in filter(None, (port.burst_frames_py, burst_frames_c)):
        with pytest.raises(UnicodeEncodeError):
            frames([("é", 0, 1, b"x")], 100)
        with pytest.raises(TypeError, match="not str"):
            frames([("a", 0, 1, b"x"), (b"a", 0, 1, b"x")], 100)


def test_burst_frames_refuse_a_topic_that_is_not_a_str_as_the_twin_does():
    for frames in filter(None, (port.burst_frames_py, burst_frames_c)):
        with pytest.raises(TypeError, match="entry 1's topic is bytes, not str"):
            frames([("a", 0, 1, b"x"), (b"a", 0, 1, b"y")], 100)


@pytest.mark.parametrize("extra", [0, 1], ids=["at", "past"])
def test_a_record_at_the_largest_a_burst_takes_is_framed_and_one_past_left_to_the_general_path(extra):
    staged = [("ab", 0, 1, b"x" * 8), ("ab", 1, 1, b"y" * (8 + extra))]
    for frames in filter(None, (port.burst_frames_py, burst_frames_c)):
        assert frames(staged, 10)[2] == ([1] if extra else [])
