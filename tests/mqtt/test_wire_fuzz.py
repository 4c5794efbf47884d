"""The C helper's MQTT wire steps (``mqtt_split``, ``mqtt_plain_publishes``, ``mqtt_publish_bytes``,
``mqtt_pubacks``) against their Python twins in ``metaq.mqtt.wire`` on what a client may send: random packet
streams, bit-flipped and cut at any byte, read from any position, with Remaining Lengths and topic lengths past the
buffer. Both give the same answer or the same error. Seeded and bounded; the streams are handed over in buffers of
their exact size, so a read past one is a read past the allocation (a sanitizer build reports it)."""

import ctypes
import random

import pytest

from metaq.mqtt.limits import MQTT_MAX_PACKET_BYTES
from metaq.mqtt import wire
from metaq.mqtt.wire import PubAck, Publish, encode_varint

_bytes = pytest.importorskip("metaq.native._bytes")

NAMES = {b"a/b": "a/b", b"": "", b"x" * 300: "x" * 300}
PLANS = {b"a/b": ("a/b", "t1", 12345, 1, b"P0", b"P1"), b"c": ("c", "t2", 2 ** 32 - 1, 0, b"", b"Q"),
         b"z": ("z", "t3", 7, 0, b"", b"")}
DECIDED = {"t1": 4, "t2": 1, "t3": 0}
FIRSTS = [0x30, 0x32, 0x3A, 0x40, 0x30, 0x32, 0x40, 0x34, 0x31, 0x38, 0x36, 0x41, 0x10, 0xE0]


def exact(data):
    """``data`` in a buffer of exactly its size (ctypes keeps up to 16 bytes inside its object)."""
    return (ctypes.c_char * len(data)).from_buffer_copy(data) if len(data) > 16 else data


def plain(answer):
    """An answer with its packets as their types and fields (the dataclasses made without __init__ compare so)."""
    if isinstance(answer, (tuple, list)):
        return type(answer)(plain(a) for a in answer)
    if isinstance(answer, (Publish, PubAck)):
        return type(answer).__name__, sorted(answer.__dict__.items())
    return answer


def answer(f, *args):
    try:
        return plain(f(*args))
    except Exception as exc:  # noqa: BLE001 - the two must fail alike
        return type(exc)


def random_packet(rng):
    first = rng.choice(FIRSTS + [rng.randrange(256)])
    topic = rng.choice([b"a/b", b"c", b"z", b"", b"nope", b"x" * 300])
    size = len(topic) if rng.random() < 0.9 else rng.randrange(65536)
    body = size.to_bytes(2, "big") + topic
    if rng.random() < 0.7:
        body += rng.choice([b"\x00\x01", b"\x00\x00", b"\xff\xff", b"\x01"])
    if rng.random() < 0.5:
        body += rng.choice([b"\x00", b"\x01"])
    body += rng.randbytes(rng.randrange(0, 40))
    if first == 0x40 and rng.random() < 0.7:
        body = rng.randbytes(rng.randrange(0, 6))
    length = encode_varint(len(body))
    if rng.random() < 0.05:
        length = rng.choice([b"\x80\x00", b"\xff\xff\xff\xff\x7f", b"\xff\xff\xff\x7f", b"\x80", b"\x81\x80\x00"])
    return bytes((first,)) + length + body


def random_stream(rng):
    data = b"".join(random_packet(rng) for _ in range(rng.randrange(1, 5)))
    if rng.random() < 0.15:
        flipped = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        data = bytes(flipped)
    if rng.random() < 0.15:
        data = data[:rng.randrange(len(data) + 1)]
    return data


def test_the_split_twins_agree_on_random_bit_flipped_and_cut_streams():
    rng = random.Random(5602)
    packets = 0
    for _ in range(6000):
        data = random_stream(rng)
        pos = rng.randrange(len(data) + 1) if rng.random() < 0.2 else 0
        max_packet = rng.choice([MQTT_MAX_PACKET_BYTES] * 6 + [50, 10, 2, 0, -1])
        version = rng.choice([4, 5, 3, None])
        args = (pos, max_packet, version, NAMES)
        got = answer(_bytes.mqtt_split, exact(data), *args)
        assert got == answer(wire.split_py, data, *args), (data, args)
        packets += isinstance(got, tuple) and got[0] is not None
    assert packets > 100  # the fast paths were exercised, not only their refusals


def test_the_plain_publishes_twins_agree_on_random_bit_flipped_and_cut_streams():
    rng = random.Random(5603)
    entries = 0
    for _ in range(6000):
        data = random_stream(rng)
        pos = rng.randrange(len(data) + 1) if rng.random() < 0.2 else 0
        args = (pos, rng.random() < 0.5, rng.choice([MQTT_MAX_PACKET_BYTES] * 6 + [50, 10, 2, 0, -1]), PLANS,
                DECIDED, rng.choice([0, 1, 5, 100]), rng.choice([0, 1, 3, 100]), rng.choice([0, 1, 10, 10 ** 9]))
        got = answer(_bytes.mqtt_plain_publishes, exact(data), *args)
        assert got == answer(wire.plain_publishes_py, data, *args), (data, args)
        entries += len(got[0]) if isinstance(got, tuple) else 0
    assert entries > 40  # the staging was exercised, not only its refusals


@pytest.mark.parametrize("first, packet_id", [
    (0x32, 0xFFFF), (0x32, 0x10000), (0x32, 0x10001), (0x32, -1), (0x32, 2 ** 40),  # at the bound and past it
    (0xFF, 1), (0x100, 1), (0x132, 1), (-1, 1), (0x100, 0x10000)])
def test_the_publish_bytes_twins_refuse_alike_a_packet_id_or_first_byte_that_does_not_fit(first, packet_id):
    args = (first, "a/b", packet_id, None, b"p")
    got = answer(_bytes.mqtt_publish_bytes, *args)
    assert got == answer(wire.publish_bytes_py, *args)
    assert isinstance(got, bytes) == (0 <= first <= 0xFF and 0 <= packet_id <= 0xFFFF)


@pytest.mark.parametrize("ids", [[0xFFFF], [0x10000], [1, 0x10000, 2], [-1], [2 ** 40], [0], []])
def test_the_pubacks_twins_refuse_alike_an_id_that_does_not_fit(ids):
    got = answer(_bytes.mqtt_pubacks, ids)
    assert got == answer(wire.encode_pubacks_py, ids)
    assert isinstance(got, bytes) == all(0 <= i <= 0xFFFF for i in ids)
