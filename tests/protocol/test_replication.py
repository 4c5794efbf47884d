"""The replication stream codec (metaq.protocol.replication): round trips, byte-at-a-time, garbage, limits."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.checksum import crc32
from metaq.protocol.replication import (
    FRAME_HEADER,
    Ack,
    Data,
    Epochs,
    ErrorFrame,
    Heartbeat,
    Hello,
    ReplicationParser,
    frame_parts,
    serialize,
)
from metaq.protocol.stream import CLOSED, NEED_DATA

pos64 = st.integers(0, 2**63 - 1)
i32 = st.integers(0, 2**31 - 1)


@st.composite
def histories(draw):
    """Valid epoch histories: strictly increasing epochs and starts."""
    steps = draw(st.lists(st.tuples(st.integers(1, 2**20), st.integers(1, 2**40)), max_size=6))
    out, epoch, start = [(0, 0)], 0, 0
    for de, ds in steps:
        epoch, start = epoch + de, start + ds
        out.append((epoch, start))
    return tuple(out)


events = st.one_of(
    st.builds(Hello, i32, st.integers(0, limits.MAX_BROKER_ID), st.integers(1, 2**63 - 1), pos64, histories()),
    st.builds(Epochs, pos64, pos64, histories()),
    st.builds(Data, pos64, st.binary(max_size=3000)),
    st.builds(lambda s, d, extra: Ack(s, d + extra, d), i32, st.integers(0, 2**62 - 1), st.integers(0, 2**62 - 1)),
    st.builds(Heartbeat, pos64, pos64, pos64),
    st.builds(ErrorFrame, st.integers(-2**31, 2**31 - 1), st.text(max_size=200)),
)


def drain(parser):
    out = []
    while True:
        ev = parser.next_event()
        if ev is NEED_DATA or ev is CLOSED:
            return out, ev
        out.append(ev)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=8))
def test_round_trip_whole_and_split(evs):
    wire = b"".join(serialize(e) for e in evs)
    p = ReplicationParser()
    p.receive_data(wire)
    p.receive_data(b"")
    got, end = drain(p)
    assert got == evs and end is CLOSED


@settings(max_examples=100, deadline=None)
@given(st.lists(events, min_size=1, max_size=4))
def test_byte_at_a_time(evs):
    wire = b"".join(serialize(e) for e in evs)
    p = ReplicationParser()
    got = []
    for i in range(len(wire)):
        p.receive_data(wire[i:i + 1])
        more, end = drain(p)
        assert end is NEED_DATA
        got += more
    p.receive_data(b"")
    assert drain(p) == ([], CLOSED)
    assert got == evs


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_only_raise_remote_protocol_error(data):
    p = ReplicationParser(max_data=1000)
    p.receive_data(data)
    p.receive_data(b"")
    try:
        drain(p)
    except RemoteProtocolError as exc:
        assert exc.fatal
        with pytest.raises(RemoteProtocolError):  # sticky
            p.next_event()


@settings(max_examples=300, deadline=None)
@given(events, st.data())
def test_any_bit_flip_is_detected(ev, data):
    wire = bytearray(serialize(ev))
    i = data.draw(st.integers(0, len(wire) - 1))
    wire[i] ^= 1 << data.draw(st.integers(0, 7))
    p = ReplicationParser()
    p.receive_data(bytes(wire))
    p.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        drain(p)


def test_data_parts_are_not_copied():
    payload = memoryview(b"x" * 100)
    parts = frame_parts(Data(7, payload))
    assert parts[-1] is payload
    assert b"".join(bytes(x) for x in parts) == serialize(Data(7, b"x" * 100))


def test_data_limit_at_and_past():
    p = ReplicationParser(max_data=100)
    p.receive_data(serialize(Data(0, b"a" * 100), max_data=100))
    assert p.next_event() == Data(0, b"a" * 100)
    with pytest.raises(ValueError):
        serialize(Data(0, b"a" * 101), max_data=100)
    big = serialize(Data(0, b"a" * 101), max_data=1000)
    p = ReplicationParser(max_data=100)
    p.receive_data(big[:FRAME_HEADER.size])  # refused from the header alone, before buffering the body
    with pytest.raises(RemoteProtocolError, match="MAX_REPLICATION_DATA_BYTES") as info:
        p.next_event()
    assert info.value.fatal


def test_default_limits_are_the_named_ones():
    p = ReplicationParser()
    assert p.max_data == limits.MAX_REPLICATION_DATA_BYTES
    assert p.max_error_text == limits.MAX_REPLICATION_ERROR_TEXT
    assert limits.MAX_REPLICATION_DATA_BYTES > limits.MAX_BODY_BYTES + limits.MAX_NAME_BYTES + 62


def test_error_text_limit_at_and_past():
    p = ReplicationParser(max_error_text=10)
    p.receive_data(serialize(ErrorFrame(500, "0123456789"), max_error_text=10))
    assert p.next_event() == ErrorFrame(500, "0123456789")
    assert serialize(ErrorFrame(1, "é" * 20), max_error_text=10) == serialize(ErrorFrame(1, "é" * 5))
    p = ReplicationParser(max_error_text=10)
    p.receive_data(serialize(ErrorFrame(500, "01234567890")))
    with pytest.raises(RemoteProtocolError, match="MAX_REPLICATION_ERROR_TEXT"):
        p.next_event()


def frame(ftype, payload, version=2, magic=b"MQRS", reserved=0):
    head = FRAME_HEADER.pack(magic, version, ftype, reserved, len(payload), 0)[:12]
    return head + struct.pack(">I", crc32(payload, crc32(head))) + payload


HELLO_HEAD = ">iiqqI"
ENTRY = struct.pack(">qq", 0, 0)


@pytest.mark.parametrize("wire, message", [
    (frame(9, b""), "unknown frame type 9"),
    (frame(1, b"\0" * 28), "must be 28 \\+ 16 x"),
    (frame(1, b"\0" * 45), "must be 28 \\+ 16 x"),
    (frame(6, b"\0" * 20), "must be 20 \\+ 16 x"),
    (frame(4, b"\0" * 9), "must carry 24 bytes"),
    (frame(4, b"\0" * 24, version=1), "version 1 .*speaks 2"),
    (frame(4, b"\0" * 24, reserved=1), "reserved"),
    (frame(4, b"\0" * 24, magic=b"MQRX"), "magic"),
    (b"GET / HTTP/1.1\r\n\r\n", "magic"),
    (frame(4, struct.pack(">qqq", -1, 0, 0)), "out of range"),
    (frame(4, struct.pack(">qqq", 0, 0, -3)), "out of range"),
    (frame(2, struct.pack(">q", -5) + b"x"), "out of range"),
    (frame(2, b"\0" * 7), "DATA frame of 7 bytes"),
    (frame(3, struct.pack(">iqq", 1, 5, 6)), "bad ACK"),
    (frame(1, struct.pack(HELLO_HEAD, 1, 1024, 4096, 0, 1) + ENTRY), "bad HELLO"),
    (frame(1, struct.pack(HELLO_HEAD, 1, 1, 0, 0, 1) + ENTRY), "bad HELLO"),
    (frame(1, struct.pack(HELLO_HEAD, 1, 1, 4096, 0, 2) + ENTRY), "count 2 does not match"),
    (frame(1, struct.pack(HELLO_HEAD, 1, 1, 4096, 0, 2) + ENTRY + ENTRY), "must increase"),
    (frame(1, struct.pack(HELLO_HEAD, 1, 1, 4096, 0, 2) + ENTRY + struct.pack(">qq", 1, 0)), "must increase"),
    (frame(1, struct.pack(HELLO_HEAD, 1, 1, 4096, 0, 1) + struct.pack(">qq", -1, 0)), "out of range"),
    (frame(6, struct.pack(">qqI", 5, 4, 1) + struct.pack(">qq", 0, -2)), "out of range"),
    (frame(6, struct.pack(">qqI", -5, 4, 1) + ENTRY), "out of range"),
    (frame(5, struct.pack(">i", 1) + b"\xff"), "UTF-8"),
])
def test_bad_frames(wire, message):
    p = ReplicationParser()
    p.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match=message) as info:
        p.next_event()
    assert info.value.fatal


def test_bad_magic_is_seen_before_a_whole_header():
    p = ReplicationParser()
    p.receive_data(b"HTTP")
    with pytest.raises(RemoteProtocolError, match="magic"):
        p.next_event()


@pytest.mark.parametrize("cut", [1, 15, 16, 20])
def test_eof_inside_a_frame(cut):
    wire = serialize(Data(3, b"abcdefgh"))
    p = ReplicationParser()
    p.receive_data(wire[:cut])
    assert p.next_event() is NEED_DATA
    p.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="stream closed inside"):
        p.next_event()


def test_receive_after_eof_is_a_bug():
    p = ReplicationParser()
    p.receive_data(b"")
    assert p.next_event() is CLOSED
    with pytest.raises(RuntimeError):
        p.receive_data(b"x")


def test_epoch_history_limit_at_and_past():
    at = tuple((i, i) for i in range(limits.MAX_REPLICATION_EPOCHS))
    p = ReplicationParser()
    p.receive_data(serialize(Hello(1, 2, 4096, 10, at)))
    assert p.next_event().epochs == at
    past = frame(1, struct.pack(HELLO_HEAD, 1, 2, 4096, 10, len(at) + 1)
                 + b"".join(struct.pack(">qq", i, i) for i in range(len(at) + 1)))
    p = ReplicationParser()
    p.receive_data(past[:FRAME_HEADER.size])  # refused from the header alone
    with pytest.raises(RemoteProtocolError, match="MAX_REPLICATION_EPOCHS"):
        p.next_event()
