"""The MQTT wire's per-packet steps in C (``metaq.native._bytes``: ``mqtt_split``, ``mqtt_publish_bytes``,
``mqtt_pubacks``) and their Python twins (``wire.split_py``, ``publish_bytes_py``, ``encode_pubacks_py``): the same
answers on every input, and the parser with either gives the same packets and the same refusals at each bound, at
it and one past, whether a packet comes whole or split across two reads at any byte."""

import random

import pytest

from metaq.mqtt.limits import MQTT_MAX_PACKET_BYTES
from metaq.mqtt import wire
from metaq.mqtt.wire import MQTT_5, MQTT_311, MqttError, MqttParser, PubAck, Publish, encode, encode_varint
from metaq.protocol.stream import CLOSED, NEED_DATA

try:
    from metaq.native._bytes import mqtt_pubacks, mqtt_publish_bytes, mqtt_split
except ImportError:  # the C helper was not built
    mqtt_split = mqtt_publish_bytes = mqtt_pubacks = None

needs_c = pytest.mark.skipif(mqtt_split is None, reason="metaq.native._bytes was not built")
SPLITS = [pytest.param(wire.split_py, id="python"),
          pytest.param(mqtt_split, id="c", marks=needs_c)]
KNOWN = "sensors/room1/temp"


@pytest.fixture(params=SPLITS)
def split(request, monkeypatch):
    """The parser on one implementation of the split, with ``KNOWN`` a name already checked (its fast path)."""
    monkeypatch.setattr(wire, "split", request.param)
    p = MqttParser(MQTT_5)
    p.receive_data(encode(Publish(KNOWN, b"x", 1, packet_id=1), MQTT_5))
    assert p.next_event() == Publish(KNOWN, b"x", 1, packet_id=1)
    assert KNOWN.encode() in wire._known_names
    return request.param


def _events(data, version, max_packet=MQTT_MAX_PACKET_BYTES, cut=None):
    """The parser's packets of ``data`` (fed at once, or in two reads split at byte ``cut``), then its refusal (as
    ``(reason code, reason)``) or the clean end."""
    p = MqttParser(version, max_packet)
    out = []
    try:
        for part in ((data,) if cut is None else (data[:cut], data[cut:])):
            p.receive_data(part)
            while (e := p.next_event()) is not NEED_DATA:
                out.append(e)
        p.receive_data(b"")
        out.append(p.next_event())
    except MqttError as exc:
        out.append((exc.reason_code, exc.reason))
    return out


def _s(raw):
    return len(raw).to_bytes(2, "big") + raw


def _packet(first, body):
    return bytes((first,)) + encode_varint(len(body)) + body


def _random_packet(rng, v5):
    """A packet the fast path decodes, one it leaves to the general decoder, or one to refuse."""
    name = rng.choice([KNOWN, KNOWN, "unknown/t", "a/+", "", "é/ü"]).encode("utf-8")
    payload = rng.randbytes(rng.choice([0, 1, 5, 128]))
    props = b"\x00" if v5 else b""
    kind = rng.random()
    if kind < 0.5:
        qos = rng.choice([0, 1, 2])
        first = 0x30 | (qos << 1) | (0x08 if qos and rng.random() < 0.2 else 0) | (rng.random() < 0.2)
        body = _s(name) + (rng.randrange(0, 65536).to_bytes(2, "big") if qos else b"") + props
        return _packet(first, body + payload)
    if kind < 0.65:  # odd PUBLISHes: flags, properties, short bodies, a name past the packet
        first = rng.choice([0x31, 0x36, 0x38, 0x3C, 0x32, 0x30])
        body = rng.choice([_s(name) + b"\x00\x00" + payload, _s(name) + b"\x03\x01\x00\x00" + payload, b"\x00",
                           b"\x00\x09a/b", _s(name), b""])
        return _packet(first, body)
    if kind < 0.9:  # PUBACKs: plain, with a reason code, with properties, packet id 0, too long
        pid = rng.choice([0, 1, 65535, 300]).to_bytes(2, "big")
        tail = rng.choice([b"", b"", b"\x00", b"\x10", b"\x05", b"\x00\x00", b"\x97\x00", b"\x00\x01",
                           b"\x00\x03\x1f\x00\x00", b"\x00\x00\x00"])
        return _packet(rng.choice([0x40, 0x40, 0x40, 0x41]), pid + tail)
    if kind < 0.95:  # a Remaining Length not minimal, or longer than 4 bytes
        return rng.choice([b"\x30\x80\x00", b"\x40\x82\x00\x00\x01", b"\x30\xff\xff\xff\xff\x01", b"\x30\xff\xff"])
    return rng.choice([b"\xc0\x00", b"\xe0\x00", b"\x50\x02\x00\x01", b"\x00\x00"])


def _same(a, b):
    """Two answers of the split alike: the same plain values, a packet's fields of the same types."""
    assert a == b and [type(f) for f in a[0] or ()] == [type(f) for f in b[0] or ()], (a, b)


@needs_c
@pytest.mark.parametrize("version", [None, MQTT_311, MQTT_5], ids=["unknown", "v311", "v5"])
def test_the_c_split_and_its_python_twin_answer_the_same(version):
    rng = random.Random(57 + (version or 0))
    names = {KNOWN.encode(): KNOWN, "é/ü".encode(): "é/ü"}
    for _ in range(300):
        buf = b"".join(_random_packet(rng, version == MQTT_5) for _ in range(rng.randrange(1, 5)))
        max_packet = rng.choice([MQTT_MAX_PACKET_BYTES, 2, 5, 30, 140])
        pos = 0
        while pos <= len(buf):
            for cut in sorted({len(buf), rng.randrange(pos, len(buf) + 1)}):
                view = bytearray(buf[:cut])
                _same(wire.split_py(view, pos, max_packet, version, names),
                      mqtt_split(view, pos, max_packet, version, names))
            answer = wire.split_py(buf, pos, max_packet, version, names)
            if answer[1] < 0:
                break
            pos = answer[2]


@needs_c
def test_the_c_split_refuses_a_position_outside_the_buffer():
    with pytest.raises(ValueError):
        mqtt_split(b"\x30\x00", 3, 100, MQTT_5, {})


def test_a_remaining_length_of_five_bytes_is_malformed_and_of_four_is_read(split):
    assert _events(b"\x30\xff\xff\xff\xff\x01", MQTT_5)[-1] == (
        wire.MALFORMED_PACKET, "remaining length is longer than 4 bytes")
    assert _events(b"\x30\xff\xff\xff\xff", MQTT_5)[-1] == (  # refused before its fifth byte comes
        wire.MALFORMED_PACKET, "remaining length is longer than 4 bytes")
    p = MqttParser(MQTT_5, max_packet=268_435_460)  # four bytes, the largest: waits for its body
    p.receive_data(b"\x30\xff\xff\xff\x7f" + _s(KNOWN.encode()))
    assert p.next_event() is NEED_DATA
    assert _events(b"\x30\x80\x00", MQTT_5)[-1] == (
        wire.MALFORMED_PACKET, "remaining length is not in its shortest encoding")
    assert _events(b"\x40\x82\x00\x00\x01", MQTT_5)[-1] == (
        wire.MALFORMED_PACKET, "remaining length is not in its shortest encoding")


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5], ids=["v311", "v5"])
def test_a_known_name_at_the_packet_limit_is_read_and_one_past_is_too_large(split, version):
    at = Publish(KNOWN, b"", 1, packet_id=9)
    at = Publish(KNOWN, b"p" * (100 - len(encode(at, version))), 1, packet_id=9)
    data = encode(at, version)
    assert len(data) == 100
    assert _events(data, version, max_packet=100) == [at, CLOSED]
    past = encode(Publish(KNOWN, at.payload + b"p", 1, packet_id=9), version)
    assert _events(past, version, max_packet=100) == [
        (wire.PACKET_TOO_LARGE, "packet of 101 bytes is past the limit of 100 bytes")]
    assert _events(past[:4], version, max_packet=100) == [  # refused once its length is known, before its body
        (wire.PACKET_TOO_LARGE, "packet of 101 bytes is past the limit of 100 bytes")]


def test_a_topic_length_past_the_packet_is_malformed(split):
    body = len(KNOWN).to_bytes(2, "big") + KNOWN.encode()
    assert _events(_packet(0x30, body[:-1]), MQTT_311)[-1] == (
        wire.MALFORMED_PACKET, "packet ends inside its topic name")
    assert _events(_packet(0x30, body), MQTT_311) == [Publish(KNOWN, b""), CLOSED]  # at the packet's end: read
    assert _events(_packet(0x30, body), MQTT_5)[-1] == (
        wire.MALFORMED_PACKET, "packet ends inside its property length")  # MQTT 5: no room for the properties


def test_a_zero_length_topic_without_an_alias_is_refused(split):
    assert _events(_packet(0x30, b"\x00\x00\x00x"), MQTT_5)[-1] == (
        wire.PROTOCOL_ERROR, "an empty topic name without a topic alias")
    assert _events(_packet(0x30, b"\x00\x00\x03\x23\x00\x01x"), MQTT_5)[0] == Publish(
        "", b"x", properties={"topic_alias": 1})
    assert _events(_packet(0x30, b"\x00\x00x"), MQTT_311)[-1][0] == wire.TOPIC_NAME_INVALID


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5], ids=["v311", "v5"])
def test_a_packet_id_0_at_qos_1_is_a_protocol_error(split, version):
    body = _s(KNOWN.encode()) + b"\x00\x00" + (b"\x00" if version == MQTT_5 else b"") + b"x"
    assert _events(_packet(0x32, body), version)[-1] == (wire.PROTOCOL_ERROR, "packet identifier 0")
    assert _events(b"\x40\x02\x00\x00", version)[-1] == (wire.PROTOCOL_ERROR, "packet identifier 0")


def test_invalid_utf8_in_a_plain_topic_is_malformed(split):
    for raw in (b"a/\xff\xfe", b"a/\xed\xa0\x80", b"\xc0\xaf"):  # not UTF-8, a surrogate, an overlong "/"
        assert _events(_packet(0x30, _s(raw) + b"x"), MQTT_311)[-1] == (
            wire.MALFORMED_PACKET, "topic name is not well-formed UTF-8")
        assert raw not in wire._known_names


def test_pubacks_are_decoded_as_the_general_decoder_does(split):
    assert _events(b"\x40\x02\x01\x02", MQTT_311) == [PubAck(0x102), CLOSED]
    assert _events(b"\x40\x03\x01\x02\x00", MQTT_311)[-1] == (
        wire.MALFORMED_PACKET, "1 bytes past the end of the PUBACK")
    assert _events(b"\x40\x03\x01\x02\x10", MQTT_5) == [PubAck(0x102, 0x10), CLOSED]
    assert _events(b"\x40\x04\x01\x02\x97\x00", MQTT_5) == [PubAck(0x102, 0x97), CLOSED]
    assert _events(b"\x40\x03\x01\x02\x05", MQTT_5)[-1] == (
        wire.PROTOCOL_ERROR, "reason code 0x05 is not defined for PUBACK")
    assert _events(b"\x40\x07\x01\x02\x00\x03\x1f\x00\x00", MQTT_5) == [
        PubAck(0x102, 0, {"reason_string": ""}), CLOSED]
    assert _events(b"\x41\x02\x01\x02", MQTT_5)[-1] == (wire.MALFORMED_PACKET, "PUBACK with fixed-header flags 0b0001")
    server = MqttParser()  # before the CONNECT: only a CONNECT
    server.receive_data(b"\x40\x02\x00\x01")
    with pytest.raises(MqttError, match="the first packet must be CONNECT, not PUBACK"):
        server.next_event()


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5], ids=["v311", "v5"])
def test_a_stream_split_across_two_reads_at_every_byte_gives_the_same_packets(split, version):
    packets = [Publish(KNOWN, b"a" * 130, 1, packet_id=7), PubAck(7), Publish("other/name", b"b", 0),
               Publish(KNOWN, b"", 0, retain=True), wire.PingReq(), Publish(KNOWN, b"c", 2, dup=True, packet_id=8)]
    data = b"".join(encode(p, version) for p in packets)
    whole = _events(data, version)
    assert whole == packets + [CLOSED]
    for cut in range(1, len(data)):
        assert _events(data, version, cut=cut) == whole, cut
    bad = data + _packet(0x32, _s(KNOWN.encode()) + b"\x00\x00" + (b"\x00" if version == MQTT_5 else b""))
    refused = packets + [(wire.PROTOCOL_ERROR, "packet identifier 0")]
    for cut in range(1, len(bad)):
        assert _events(bad, version, cut=cut) == refused, cut


PUBLISH_BYTES = [pytest.param(wire.publish_bytes_py, id="python"),
                 pytest.param(mqtt_publish_bytes, id="c", marks=needs_c)]


@needs_c
def test_the_c_publish_bytes_and_its_twin_write_the_same():
    rng = random.Random(5)
    for _ in range(500):
        topic = rng.choice(["a/b", KNOWN, "é/ü/€", "", "x" * rng.choice([127, 128, 16383, 16384, 65535])])
        payload = rng.randbytes(rng.choice([0, 1, 100, 200, 16_500, 2_100_000 if rng.random() < 0.02 else 3]))
        first = rng.choice([0x30, 0x31, 0x32, 0x3B, 0x34])
        pid = rng.choice([0, 1, 0xFFFF])
        props = rng.choice([None, b"\x00", b"\x03\x01\x00\x00"])
        assert mqtt_publish_bytes(first, topic, pid, props, payload) == wire.publish_bytes_py(
            first, topic, pid, props, payload)
        assert mqtt_publish_bytes(first, topic, pid, props, memoryview(payload)) == wire.publish_bytes_py(
            first, topic, pid, props, payload)


@pytest.mark.parametrize("publish_bytes", PUBLISH_BYTES)
def test_publish_bytes_refuses_what_encode_refuses(publish_bytes):
    with pytest.raises(ValueError, match="must not contain U\\+0000"):
        publish_bytes(0x30, "a/\x00", 0, None, b"")
    with pytest.raises(ValueError, match="binary data of 65536 bytes is past 65,535"):
        publish_bytes(0x30, "é" * 32768, 0, None, b"")
    with pytest.raises(UnicodeEncodeError):
        publish_bytes(0x30, "a/\ud800", 0, None, b"")
    assert publish_bytes(0x30, "x" * 65535, 0, None, b"")[:6] == b"\x30\x81\x80\x04\xff\xff"  # at the bound


@pytest.mark.parametrize("publish_bytes", PUBLISH_BYTES)
def test_encode_writes_each_publish_as_it_did(publish_bytes, monkeypatch):
    monkeypatch.setattr(wire, "publish_bytes", publish_bytes)
    assert encode(Publish("a/b", b"hi", 1, packet_id=0x102), MQTT_311) == b"\x32\x09\x00\x03a/b\x01\x02hi"
    assert encode(Publish("a/b", b"hi", 0, retain=True), MQTT_5) == b"\x31\x08\x00\x03a/b\x00hi"
    assert encode(Publish("a/b", b"", 2, dup=True, packet_id=1, properties={"content_type": "t"}), MQTT_5) == (
        b"\x3c\x0c\x00\x03a/b\x00\x01\x04\x03\x00\x01t")
    for bad, why in ((Publish("a/b", b"", 1), "packet identifier None"), (Publish("a/b", b"", 0, dup=True), "DUP"),
                     (Publish("a/b", b"", 1, packet_id=65536), "packet identifier 65536"),
                     (Publish("a", qos=3), "QoS")):
        with pytest.raises(ValueError, match=why):
            encode(bad, MQTT_5)
    for p in (Publish("a/b", b"hi", 1, packet_id=5), Publish("é", b"x" * 200, 0, properties={"topic_alias": 3})):
        for version in (MQTT_311, MQTT_5):
            if version == MQTT_311 and p.properties:
                continue
            assert _events(encode(p, version), version) == [p, CLOSED]


@needs_c
def test_the_c_pubacks_and_the_twin_write_the_same():
    for ids in ([], [1], [1, 2, 65535, 0x1234], list(range(1, 2000))):
        assert mqtt_pubacks(ids) == wire.encode_pubacks_py(ids) == b"".join(encode(PubAck(i), MQTT_5) for i in ids)
        assert mqtt_pubacks(tuple(ids)) == wire.encode_pubacks_py(tuple(ids))
    with pytest.raises(ValueError):
        mqtt_pubacks([65536])
