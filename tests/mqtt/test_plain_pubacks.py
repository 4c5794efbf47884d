"""A subscriber's read of PUBACKs split and its messages in flight ended in one step (``wire.end_pubacks``, its split
``wire.plain_pubacks``, in C as ``metaq.native._bytes``'s ``mqtt_plain_pubacks``; ``MqttParser.end_acks``): the C split
and its twin give the same answers on every input, each PUBACK ends its message as ``MqttSession.acknowledged``
would (an OrderedDict's order kept whole), and the parser takes exactly the PUBACKs
``next_event`` would have returned, ending each as ``MqttSession.acknowledged`` would, leaving the rest (another
packet, a PUBACK the general decoder refuses, a part of one) to ``next_event``, whether the bytes come whole or split
at any byte."""

import random
from collections import OrderedDict

import pytest

from metaq.mqtt import wire
from metaq.mqtt.session import PUBLISH_SENT, PUBREL_SENT
from metaq.mqtt.wire import MQTT_5, MQTT_311, MqttError, MqttParser, PubAck, encode

try:
    from metaq.native._bytes import mqtt_plain_pubacks
except ImportError:  # the C helper was not built
    mqtt_plain_pubacks = None

needs_c = pytest.mark.skipif(mqtt_plain_pubacks is None, reason="metaq.native._bytes was not built")
TWINS = [pytest.param(wire.plain_pubacks_py, id="python"),
         pytest.param(mqtt_plain_pubacks, id="c", marks=needs_c)]

#: The packet ids PIECES' PUBACKs carry.
IDS = (1, 0xFFFF, 0x1234, 9, 7, 5, 3, 4)

#: PUBACKs and their neighbours as a client may send them: taken ones, refused ones and other packets.
PIECES = [
    bytes([0x40, 2, 0, 1]), bytes([0x40, 2, 0xFF, 0xFF]), bytes([0x40, 3, 0x12, 0x34, 0x00]),
    bytes([0x40, 3, 0, 9, 0x10]), bytes([0x40, 3, 0, 9, 0x80]), bytes([0x40, 4, 0, 7, 0x00, 0x00]),
    bytes([0x40, 2, 0, 0]),  # packet id 0
    bytes([0x40, 3, 0, 5, 0x05]),  # a reason code no PUBACK carries
    bytes([0x40, 4, 0, 5, 0x00, 0x01, 0x1F]),  # properties (a length no decoder takes as a whole PUBACK)
    bytes([0x40, 5, 0, 5, 0x00, 0x02, 0x1F]),
    bytes([0x41, 2, 0, 3]),  # flags
    bytes([0xC0, 0]),  # PINGREQ
    bytes([0x50, 2, 0, 4]),  # PUBREC
    bytes([0x40, 0x82, 0x00, 0, 1]),  # a remaining length not in its shortest encoding
]


def _stream(rng):
    return b"".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 8)))


def _session(rng):
    """A session's ``(inflight, where)``: some of ``IDS`` in flight, each as a PUBLISH or a PUBREL sent, in a random
    order, ``where`` holding some of them."""
    ids = list(IDS)
    rng.shuffle(ids)
    inflight = OrderedDict((i, rng.choice((PUBLISH_SENT, PUBREL_SENT))) for i in ids if rng.random() < 0.7)
    where = {i: (1, "t", 0, i) for i in inflight if rng.random() < 0.8}
    return inflight, where


@needs_c
def test_the_c_split_and_the_twin_answer_the_same():
    rng = random.Random(57)
    for _ in range(3000):
        buf = _stream(rng)
        cut = rng.randrange(0, len(buf) + 1)
        for v5 in (False, True):
            for max_packet in (3, 4, 5, 6, 1 << 20):
                for pos in (-1, 0, min(cut, len(buf)), len(buf) + 1):
                    for data in (buf, buf[:cut], bytearray(buf)):
                        assert mqtt_plain_pubacks(data, pos, v5, max_packet) == \
                            wire.plain_pubacks_py(data, pos, v5, max_packet), (data, pos, v5, max_packet)


@pytest.mark.parametrize("split", TWINS)
def test_each_pubacks_message_in_flight_is_ended_as_acknowledged_ends_it(monkeypatch, split):
    """``end_pubacks`` over seeded reads and sessions: each PUBACK the split takes ends its message when it is in
    flight as a PUBLISH sent (not a PUBREL), from ``inflight`` and ``where``, the others untouched, in order."""
    monkeypatch.setattr(wire, "plain_pubacks", split)
    rng = random.Random(58)
    for _ in range(1000):
        buf = _stream(rng)
        inflight, where = _session(rng)
        v5, max_packet = rng.random() < 0.5, rng.choice((4, 6, 1 << 20))
        ids, pos = wire.plain_pubacks_py(buf, 0, v5, max_packet)
        want = OrderedDict(inflight)
        gone = [i for i in ids if want.get(i) == PUBLISH_SENT and want.pop(i)]
        got = wire.end_pubacks(buf, 0, v5, max_packet, inflight, where, PUBLISH_SENT)
        assert got == (len(ids), len(gone), pos)
        assert list(inflight.items()) == list(want.items()) and not set(gone) & set(where)
        inflight[0x7777] = PUBLISH_SENT  # the OrderedDict still whole after deletions
        assert list(inflight)[-1] == 0x7777


def _ended(inflight, ids):
    """``inflight``'s items after ``MqttSession.acknowledged`` of each of ``ids``, in order."""
    for i in ids:
        if inflight.get(i) == PUBLISH_SENT:
            del inflight[i]
    return list(inflight.items())


def _general(data, version):
    """What ``next_event`` returns for ``data``: how many PUBACKs first, the session they leave (each acknowledged
    in turn), then the next event or the refusal."""
    parser = MqttParser(version, sender="client")
    parser.receive_data(data)
    ids, after = _rest(parser, [])
    return len(ids), _ended(OrderedDict((i, PUBLISH_SENT) for i in IDS), ids), after


def _taken(data, cut, version):
    """``end_acks`` of ``data`` in two reads cut at ``cut``, then ``next_event`` until it stops: as ``_general``.
    Each read's answer says whether bytes are left buffered as the parser's ``buffered`` does."""
    parser = MqttParser(version, sender="client")
    inflight, taken = OrderedDict((i, PUBLISH_SENT) for i in IDS), 0
    for read in (data[:cut], data[cut:]):
        if read:  # a read is never empty (b"": the end)
            before = len(inflight)
            got, ended, rest = parser.end_acks(read, inflight, {}, PUBLISH_SENT)
            assert rest == (parser.buffered > 0) and ended == before - len(inflight)
            taken += got
    ids, after = _rest(parser, [])
    return taken + len(ids), _ended(inflight, ids), after


def _rest(parser, ids):
    """``ids`` and the PUBACKs ``parser.next_event`` still gives, then the next other event or the refusal."""
    while True:
        try:
            p = parser.next_event()
        except MqttError as exc:
            return ids, ("refused", exc.reason_code)
        if type(p) is not PubAck:
            return ids, p
        ids.append(p.packet_id)


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("version", [MQTT_5, MQTT_311], ids=["v5", "v311"])
def test_the_parser_takes_what_next_event_would_split_at_every_byte(monkeypatch, twin, version):
    monkeypatch.setattr(wire, "plain_pubacks", twin)
    rng = random.Random(version)
    streams = [b"".join(PIECES[:6]) + PIECES[11] + PIECES[0], encode(PubAck(3), version) + PIECES[11]]
    streams += [s for s in (_stream(rng) for _ in range(200)) if s]  # a read is never empty
    for data in streams:
        want = _general(data, version)
        for cut in range(len(data) + 1):
            assert _taken(data, cut, version) == want, (data, cut)


@pytest.mark.parametrize("twin", TWINS)
def test_no_pubacks_before_the_version_is_known(monkeypatch, twin):
    monkeypatch.setattr(wire, "plain_pubacks", twin)
    parser = MqttParser(sender="client")
    inflight = OrderedDict([(1, PUBLISH_SENT)])
    assert parser.end_acks(bytes([0x40, 2, 0, 1]), inflight, {}, PUBLISH_SENT)[:2] == (0, 0) and 1 in inflight
    with pytest.raises(MqttError):
        parser.next_event()  # the first packet must be CONNECT
