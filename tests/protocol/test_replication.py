"""The replication stream codec (metaq.protocol.replication): round trips, byte-at-a-time, garbage, limits."""

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import limits
from metaq.offsets import limits as offsets_limits
from metaq.server.replication import limits as replication_limits
from metaq.topics import limits as topics_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.checksum import crc32
from metaq.protocol.replication import (
    FRAME_HEADER,
    VERSION,
    Ack,
    Challenge,
    Data,
    Epochs,
    ErrorFrame,
    Heartbeat,
    Hello,
    Offsets,
    Proof,
    ReplicationParser,
    frame_parts,
    serialize,
)
from metaq.protocol import replication_topics as rt
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.topics.table import TopicSettings, TopicTableFile

pos64 = st.integers(0, 2**63 - 1)
i32 = st.integers(0, 2**31 - 1)


@st.composite
def histories(draw):
    """Valid epoch histories: strictly increasing epochs and starts."""
    steps = draw(st.lists(st.tuples(st.integers(1, 2**20), st.integers(1, 2**40), pos64), max_size=6))
    out, epoch, start = [(0, 0, 0)], 0, 0
    for de, ds, origin in steps:
        epoch, start = epoch + de, start + ds
        out.append((epoch, start, origin))
    return tuple(out)


names = st.text("abcXYZ019_.%-", min_size=1, max_size=limits.MAX_NAME_BYTES).filter(lambda n: n not in (".", ".."))
offset_entries = st.tuples(names, names, st.integers(0, limits.MAX_PARTITIONS - 1), pos64, pos64)


@st.composite
def offsets_events(draw):
    """Valid OFFSETS: distinct keys; a snapshot's last frame may be empty, any other frame has entries."""
    snapshot = draw(st.booleans())
    end = snapshot and draw(st.booleans())
    rows = draw(st.lists(offset_entries, min_size=0 if end else 1, max_size=8, unique_by=lambda e: e[:3]))
    return Offsets(tuple(rows), snapshot, end)


users = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=32).filter(
    lambda u: len(u.encode("utf-8")) <= limits.MAX_TX_OWNER_BYTES)
topic_owners = st.lists(st.tuples(names, users, st.integers(1, limits.MAX_PARTITIONS)), max_size=8,
                        unique_by=lambda o: o[0])
TABLE = {"format": 1, "version": 3, "topics": {}, "deleted": {}}
topics_events = st.builds(lambda owners: rt.encode(TABLE, owners), topic_owners)

nonces = st.text("0123456789abcdef", min_size=replication_limits.MIN_REPLICATION_NONCE_CHARS,
                 max_size=replication_limits.MAX_REPLICATION_NONCE_CHARS)
events = st.one_of(
    st.builds(Challenge, st.booleans(), nonces),
    st.builds(Proof, st.one_of(st.just(""), nonces),
              st.text("0123456789abcdef", max_size=replication_limits.MAX_REPLICATION_PROOF_CHARS)),
    st.builds(Hello, i32, st.integers(0, limits.MAX_BROKER_ID), st.integers(1, 2**63 - 1), pos64, histories()),
    st.builds(Epochs, pos64, pos64, histories()),
    st.builds(Data, pos64, st.binary(max_size=3000)),
    st.builds(lambda s, d, extra: Ack(s, d + extra, d), i32, st.integers(0, 2**62 - 1), st.integers(0, 2**62 - 1)),
    st.builds(Heartbeat, pos64, pos64, pos64),
    st.builds(ErrorFrame, st.integers(-2**31, 2**31 - 1), st.text(max_size=200)),
    offsets_events(),
    topics_events,
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
    assert p.max_data == replication_limits.MAX_REPLICATION_DATA_BYTES
    assert p.max_error_text == replication_limits.MAX_REPLICATION_ERROR_TEXT
    assert replication_limits.MAX_REPLICATION_DATA_BYTES > limits.MAX_BODY_BYTES + limits.MAX_NAME_BYTES + 62


def test_error_text_limit_at_and_past():
    p = ReplicationParser(max_error_text=10)
    p.receive_data(serialize(ErrorFrame(500, "0123456789"), max_error_text=10))
    assert p.next_event() == ErrorFrame(500, "0123456789")
    assert serialize(ErrorFrame(1, "é" * 20), max_error_text=10) == serialize(ErrorFrame(1, "é" * 5))
    p = ReplicationParser(max_error_text=10)
    p.receive_data(serialize(ErrorFrame(500, "01234567890")))
    with pytest.raises(RemoteProtocolError, match="MAX_REPLICATION_ERROR_TEXT"):
        p.next_event()


def frame(ftype, payload, version=VERSION, magic=b"MQRS", reserved=0):
    head = FRAME_HEADER.pack(magic, version, ftype, reserved, len(payload), 0)[:12]
    return head + struct.pack(">I", crc32(payload, crc32(head))) + payload


HELLO_HEAD = ">iiqqI"
ENTRY = struct.pack(">qqq", 0, 0, 0)


@pytest.mark.parametrize("wire, message", [
    (frame(99, b""), "unknown frame type 99"),
    (frame(10, b""), "TOPICS frame of 0 bytes"),  # the topic table (topics/table.py): 1..MAX_TOPIC_TABLE_BYTES
    (frame(4, b"\0" * 24, version=2), "unsupported replication stream version 2 \\(this side speaks 4\\)"),
    (frame(1, b"\0" * 28), "must be 28 \\+ 24 x"),
    (frame(1, b"\0" * 61), "must be 28 \\+ 24 x"),
    (frame(6, b"\0" * 20), "must be 20 \\+ 24 x"),
    (frame(4, b"\0" * 9), "must carry 24 bytes"),
    (frame(4, b"\0" * 24, version=1), "version 1 .*speaks 4"),
    (frame(4, b"\0" * 24, version=3), "version 3 .*speaks 4"),  # epoch entries without origins
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
    (frame(1, struct.pack(HELLO_HEAD, 1, 1, 4096, 0, 2) + ENTRY + struct.pack(">qqq", 1, 0, 5)), "must increase"),
    (frame(1, struct.pack(HELLO_HEAD, 1, 1, 4096, 0, 1) + struct.pack(">qqq", -1, 0, 0)), "out of range"),
    (frame(6, struct.pack(">qqI", 5, 4, 1) + struct.pack(">qqq", 0, -2, 0)), "out of range"),
    (frame(6, struct.pack(">qqI", -5, 4, 1) + ENTRY), "out of range"),
    (frame(6, struct.pack(">qqI", 5, 4, 1) + struct.pack(">qqq", 0, 0, -7)), "out of range"),  # origin
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
    at = tuple((i, i, i * 7) for i in range(replication_limits.MAX_REPLICATION_EPOCHS))
    p = ReplicationParser()
    p.receive_data(serialize(Hello(1, 2, 4096, 10, at)))
    assert p.next_event().epochs == at
    past = frame(1, struct.pack(HELLO_HEAD, 1, 2, 4096, 10, len(at) + 1)
                 + b"".join(struct.pack(">qqq", i, i, i) for i in range(len(at) + 1)))
    p = ReplicationParser()
    p.receive_data(past[:FRAME_HEADER.size])  # refused from the header alone
    with pytest.raises(RemoteProtocolError, match="MAX_REPLICATION_EPOCHS"):
        p.next_event()


# -- the handshake frames (CHALLENGE, PROOF) ----------------------------------------------------------

NONCE = "0123456789abcdef" * 2  # 32 hex characters: the shortest nonce
PROOF_HEX = "ab" * 32  # 64: an HMAC-SHA256 in hex, the longest proof


def challenge_frame(flags, nonce):
    return frame(7, struct.pack(">B", flags) + nonce)


def proof_frame(nonce, proof, nonce_len=None, proof_len=None):
    return frame(8, struct.pack(">BB", len(nonce) if nonce_len is None else nonce_len,
                                len(proof) if proof_len is None else proof_len) + nonce + proof)


@pytest.mark.parametrize("event", [
    Challenge(True, NONCE), Challenge(False, "f" * replication_limits.MAX_REPLICATION_NONCE_CHARS),
    Proof(NONCE, PROOF_HEX), Proof(NONCE, ""), Proof("", PROOF_HEX), Proof("", ""),
])
def test_handshake_frames_round_trip(event):
    p = ReplicationParser()
    p.receive_data(serialize(event))
    assert p.next_event() == event


@pytest.mark.parametrize("wire, message", [
    (challenge_frame(1, b"a" * 31), "CHALLENGE frame of 32 bytes: must be 33..65"),
    (challenge_frame(1, b"a" * 65), "CHALLENGE frame of 66 bytes: must be 33..65"),  # an oversize nonce
    (challenge_frame(1, b""), "CHALLENGE frame of 1 bytes"),
    (challenge_frame(2, NONCE.encode()), "unknown flags 0x02"),
    (challenge_frame(1, b"ABCDEF" + b"0" * 26), "lowercase hex"),
    (challenge_frame(1, b"a b" + b"0" * 29), "lowercase hex"),  # a space would shift the proof's words
    (challenge_frame(1, b"\xff" * 32), "lowercase hex"),
    (proof_frame(b"", b"", nonce_len=1), "do not fill"),
    (proof_frame(NONCE.encode(), b"ab", proof_len=1), "do not fill"),
    (proof_frame(b"a" * 31, b""), "a nonce has 32..64 characters, not 31"),
    (proof_frame(b"a" * 65, b""), "a nonce has 32..64 characters, not 65"),  # an oversize nonce in a short frame
    (proof_frame(b"a" * 64, b"a" * 65), "PROOF frame of 131 bytes: must be 2..130"),
    (proof_frame(b"a" * 40, b"b" * 65), "at most 64 characters, not 65"),  # fits the frame, not the proof limit
    (proof_frame(NONCE.encode(), b"G" * 64), "a proof is lowercase hex"),
    (proof_frame(b"", b"\x00" * 64), "a proof is lowercase hex"),
    (frame(8, b"\0"), "PROOF frame of 1 bytes"),
])
def test_bad_handshake_frames(wire, message):
    p = ReplicationParser()
    p.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match=message) as info:
        p.next_event()
    assert info.value.fatal


def test_oversize_handshake_frames_are_refused_from_the_header_alone():
    for wire in (challenge_frame(1, b"a" * 1000), proof_frame(b"a" * 200, b"b" * 200, 200, 200)):
        p = ReplicationParser()
        p.receive_data(wire[:FRAME_HEADER.size])
        with pytest.raises(RemoteProtocolError, match="MAX_REPLICATION_NONCE_CHARS"):
            p.next_event()


@pytest.mark.parametrize("event, message", [
    (Challenge(True, "a" * 31), "32..64 characters, not 31"),
    (Challenge(True, "a" * 65), "32..64 characters, not 65"),
    (Challenge(True, "Z" * 32), "lowercase hex"),
    (Proof("a" * 65, ""), "32..64 characters"),
    (Proof(NONCE, "a" * 65), "at most 64 characters"),
    (Proof(NONCE, "not hex"), "lowercase hex"),
    (Proof("é" * 32, ""), "lowercase hex"),
])
def test_bad_handshake_frames_are_not_sent(event, message):
    with pytest.raises(ValueError, match=message):
        serialize(event)


# -- OFFSETS: the master's committed consumer offsets (metaq.protocol.replication_offsets) ----------------------------

from metaq.protocol import replication_offsets as ro  # noqa: E402


def offsets_frame(flags, entries, count=None):
    """An OFFSETS frame (type 9) from raw entries ``(group bytes, topic bytes, partition, offset, commit_ms)``."""
    body = b"".join(struct.pack(">BBiqq", len(g), len(t), p, o, ms) + g + t for g, t, p, o, ms in entries)
    return frame(9, struct.pack(">BI", flags, len(entries) if count is None else count) + body)


GOOD = (b"g", b"t", 0, 5, 1000)


@pytest.mark.parametrize("wire, message", [
    (offsets_frame(8, [GOOD]), "bad OFFSETS: unknown flags 0x08"),
    (offsets_frame(2, [GOOD]), "END without SNAPSHOT"),
    (offsets_frame(0, []), "0 entries: a frame carries 1..1000"),
    (offsets_frame(1, []), "0 entries: a frame carries 1..1000"),  # only a snapshot's last frame may be empty
    (offsets_frame(0, [GOOD], count=2), "entry 2 of 2 does not fit"),
    (offsets_frame(0, [GOOD], count=0), "0 entries leave 24 of the frame's 29 bytes unused"),
    (offsets_frame(0, [GOOD], count=1001), "1001 entries: a frame carries at most 1000"),
    (offsets_frame(0, [GOOD, GOOD]), "entry 2 of 2 names g/t-0 a second time"),
    (offsets_frame(0, [(b"", b"t", 0, 5, 1)]), "entry 1 of 1: group name must be 1..200 bytes, got 0"),
    (offsets_frame(0, [(b"g", b"", 0, 5, 1)]), "topic name must be 1..200 bytes"),
    (offsets_frame(0, [(b"a b", b"t", 0, 5, 1)]), "illegal group name 'a b'"),
    (offsets_frame(0, [(b"g", b"..", 0, 5, 1)]), "illegal topic name '..'"),
    (offsets_frame(0, [(b"g", b"t\xff", 0, 5, 1)]), "illegal topic name"),
    (offsets_frame(0, [(b"g", b"t", -1, 5, 1)]), "partition -1 of t is out of range 0..1023"),
    (offsets_frame(0, [(b"g", b"t", limits.MAX_PARTITIONS, 5, 1)]), "out of range 0..1023 \\(limit MAX_PARTITIONS"),
    (offsets_frame(0, [(b"g", b"t", 0, -5, 1)]), "offset -5 of g/t-0 is out of range"),
    (offsets_frame(0, [(b"g", b"t", 0, 5, -1)]), "commit time -1 of g/t-0 is out of range"),
    (frame(9, b"\0" * 4), "bad OFFSETS: a frame of 4 bytes: must be 5..262149"),
    (frame(9, struct.pack(">BI", 0, 1) + struct.pack(">BBiqq", 200, 200, 0, 0, 0)), "names of entry 1 of 1"),
])
def test_bad_offsets_frames(wire, message):
    p = ReplicationParser()
    p.receive_data(wire)
    with pytest.raises(RemoteProtocolError, match=message) as info:
        p.next_event()
    assert info.value.fatal


def test_an_oversize_offsets_frame_is_refused_from_the_header_alone():
    head = FRAME_HEADER.pack(b"MQRS", VERSION, 9, 0, 5 + offsets_limits.MAX_REPLICATION_OFFSETS_BYTES + 1, 0)
    p = ReplicationParser()
    p.receive_data(head)
    with pytest.raises(RemoteProtocolError, match="MAX_REPLICATION_OFFSETS_BYTES"):
        p.next_event()


@pytest.mark.parametrize("event, message", [
    (Offsets((), False), "0 entries"),
    (Offsets((("g", "t", 0, 1, 1),), False, True), "END without SNAPSHOT"),
    (Offsets((("g", "t", 0, 1, 1),) * 2, False), "twice"),
    (Offsets((("g g", "t", 0, 1, 1),), False), "illegal group name"),
    (Offsets((("g", "t", 0, -1, 1),), False), "offset -1"),
    (Offsets((("g", "t", 0, 1),), False), "an entry is"),
    (Offsets(tuple(("g%d" % i, "t", 0, 1, 1) for i in range(offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME + 1)),
             True),
     "1001 entries"),
    (Offsets(tuple(("g%d" % i + "x" * 190, "t" * 200, 0, 1, 1) for i in range(1000)), True),
     "exceed the 262144-byte limit"),
])
def test_bad_offsets_are_not_sent(event, message):
    with pytest.raises(ValueError, match=message):
        serialize(event)


def test_offsets_at_the_entry_limit_round_trip():
    rows = tuple(("group-%d" % i, "topic", i % limits.MAX_PARTITIONS, i, 2**63 - 1)
                 for i in range(offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME))
    p = ReplicationParser()
    p.receive_data(serialize(Offsets(rows, True, True)))
    assert p.next_event() == Offsets(rows, True, True)


@settings(max_examples=50, deadline=None)
@given(st.lists(offset_entries, max_size=2500, unique_by=lambda e: e[:3]), st.booleans())
def test_frames_split_any_table_within_both_limits(rows, snapshot):
    events = ro.frames(rows, snapshot)
    assert [e for ev in events for e in ev.entries] == rows
    for ev in events:
        assert len(ev.entries) <= offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME
        assert (len(serialize(ev))
                <= FRAME_HEADER.size + ro.OFFSETS_HEAD.size + offsets_limits.MAX_REPLICATION_OFFSETS_BYTES)
        assert ev.snapshot is snapshot
    if snapshot:  # a snapshot always ends, even an empty one
        assert [ev.end for ev in events] == [False] * (len(events) - 1) + [True]
    else:
        assert not any(ev.end for ev in events) and (events or not rows)
    p = ReplicationParser()
    p.receive_data(b"".join(serialize(ev) for ev in events) + serialize(Heartbeat(1)))
    assert drain(p) == (events + [Heartbeat(1)], NEED_DATA)


def test_long_names_make_more_frames_than_the_entry_limit_alone():
    rows = [("g%04d" % i + "x" * 195, "t" * 200, 0, i, i) for i in range(1000)]  # 422 bytes each
    events = ro.frames(rows, snapshot=True)
    per = offsets_limits.MAX_REPLICATION_OFFSETS_BYTES // 422
    assert per < 1000 and [len(ev.entries) for ev in events] == [per, 1000 - per]


def test_topics_frame_round_trip_and_bound():
    from metaq.protocol import replication as rp

    table = b'{"format": 1, "topics": {}, "deleted": {}, "version": 3}'
    p = ReplicationParser()
    p.receive_data(serialize(rp.Topics(table)))
    assert p.next_event() == rp.Topics(table)
    with pytest.raises(ValueError,
                       match="must be 1..%d \\(limit MAX_TOPIC_TABLE_BYTES" % topics_limits.MAX_TOPIC_TABLE_BYTES):
        serialize(rp.Topics(b"x" * (topics_limits.MAX_TOPIC_TABLE_BYTES + 1)))


# -- OFFSETS with owners (the OWNERS flag: each entry's owner follows it) ----------------------------------------------

owners = st.one_of(st.none(), st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=32)
                   .filter(lambda o: len(o.encode("utf-8")) <= limits.MAX_TX_OWNER_BYTES))
owned_entries = st.tuples(names, names, st.integers(0, limits.MAX_PARTITIONS - 1), pos64, pos64, owners)


def owned_frame(flags, entries, count=None):
    """An OFFSETS frame from raw entries ``(group, topic, partition, offset, commit_ms, owner bytes)`` whose owner
    length byte is the owner's length, or ``(..., owner bytes, length byte)`` to lie about it, or
    ``(..., None)``: no owner field at all."""
    body = b""
    for e in entries:
        g, t, p_, o, ms, owner = e[:6]
        body += struct.pack(">BBiqq", len(g), len(t), p_, o, ms) + g + t
        if owner is not None:
            body += struct.pack(">B", e[6] if len(e) == 7 else len(owner)) + owner
    return frame(9, struct.pack(">BI", flags, len(entries) if count is None else count) + body)


def parse_one(wire):
    p = ReplicationParser()
    p.receive_data(wire)
    return p.next_event()


@settings(max_examples=50, deadline=None)
@given(st.lists(owned_entries, min_size=1, max_size=8, unique_by=lambda e: e[:3]), st.booleans())
def test_offsets_with_owners_round_trip(rows, end):
    event = Offsets(tuple(rows), True, end, owners=True)
    assert parse_one(serialize(event)) == event


def test_offsets_without_owners_keep_the_old_form():
    """A frame with no owned entry has no OWNERS flag: its bytes are those a slave from before owners reads."""
    rows = [("g", "t", 0, 5, 1000, None), ("h", "t", 1, 6, 1001, None)]
    (event,) = ro.frames(rows, snapshot=True)
    assert event == Offsets((("g", "t", 0, 5, 1000), ("h", "t", 1, 6, 1001)), True, True)
    wire = serialize(event)
    assert wire == offsets_frame(ro.SNAPSHOT | ro.END, [(b"g", b"t", 0, 5, 1000), (b"h", b"t", 1, 6, 1001)])
    assert parse_one(wire) == event


def test_a_frame_with_one_owned_entry_carries_every_owner():
    rows = [("g", "t", 0, 5, 1000), ("h", "t", 1, 6, 1001, "alice"), ("i", "t", 2, 7, 1002, None)]
    (event,) = ro.frames(rows, snapshot=False)
    assert event == Offsets((("g", "t", 0, 5, 1000, None), ("h", "t", 1, 6, 1001, "alice"),
                             ("i", "t", 2, 7, 1002, None)), False, False, owners=True)
    wire = serialize(event)
    assert wire[FRAME_HEADER.size] == ro.OWNERS
    assert wire == owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1000, b""), (b"h", b"t", 1, 6, 1001, b"alice"),
                                           (b"i", b"t", 2, 7, 1002, b"")])
    assert parse_one(wire) == event


@settings(max_examples=30, deadline=None)
@given(st.lists(owned_entries, max_size=2500, unique_by=lambda e: e[:3]), st.booleans())
def test_frames_split_an_owned_table_within_both_limits(rows, snapshot):
    events = ro.frames(rows, snapshot)
    assert [e if ev.owners else e + (None,) for ev in events for e in ev.entries] == rows
    for ev in events:
        assert ev.owners == any(e[5] is not None for e in ev.entries if len(e) == 6)
        assert len(ev.entries) <= offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME
        assert (len(serialize(ev))
                <= FRAME_HEADER.size + ro.OFFSETS_HEAD.size + offsets_limits.MAX_REPLICATION_OFFSETS_BYTES)
    p = ReplicationParser()
    p.receive_data(b"".join(serialize(ev) for ev in events) + serialize(Heartbeat(1)))
    assert drain(p) == (events + [Heartbeat(1)], NEED_DATA)


def test_long_owners_make_more_frames():
    owner = "u" * limits.MAX_TX_OWNER_BYTES
    rows = [("g%04d" % i + "x" * 195, "t" * 200, 0, i, i, owner) for i in range(1000)]  # 422 + 1 + 128 bytes each
    events = ro.frames(rows, snapshot=True)
    per = offsets_limits.MAX_REPLICATION_OFFSETS_BYTES // 551
    assert [len(ev.entries) for ev in events] == [per] * (1000 // per) + [1000 % per]
    for ev in events:
        assert (len(b"".join(ro.payload_parts(ev)))
                <= ro.OFFSETS_HEAD.size + offsets_limits.MAX_REPLICATION_OFFSETS_BYTES)


def test_an_owner_at_the_limit_is_carried_and_one_past_it_is_not():
    most = limits.MAX_TX_OWNER_BYTES
    for owner in ("u" * most, "\u00e9" * (most // 2)):  # bytes, not characters, count
        event = Offsets((("g", "t", 0, 1, 1, owner),), False, owners=True)
        assert parse_one(serialize(event)) == event
    for owner in ("u" * (most + 1), "\u00e9" * (most // 2) + "u"):
        with pytest.raises(ValueError, match="an owner of %d bytes: a user name has 1..%d \\(limit MAX_TX_OWNER_BYTES"
                           % (most + 1, most)):
            serialize(Offsets((("g", "t", 0, 1, 1, owner),), False, owners=True))
    wire = owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1, b"u" * (most + 1))])
    with pytest.raises(RemoteProtocolError, match="the owner of entry 1 of 1 is %d bytes: at most %d \\(limit "
                       "MAX_TX_OWNER_BYTES\\)" % (most + 1, most)) as info:
        parse_one(wire)
    assert info.value.fatal


@pytest.mark.parametrize("wire, message", [
    (owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1, None)]), "the owner of entry 1 of 1 does not fit the frame's 29"),
    (owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1, b"al", 5)]), "the owner of entry 1 of 1 \\(5 bytes\\) does not fit"),
    (owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1, b"alice"), (b"h", b"t", 0, 5, 1, None)]),
     "the owner of entry 2 of 2 does not fit"),
    (owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1, b"al\xffce")]), "the owner of entry 1 of 1 is not UTF-8"),
    (owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1, b"alice", 2)]), "1 entries leave 3 of the frame's 35 bytes unused"),
    (owned_frame(0, [(b"g", b"t", 0, 5, 1, b"alice")]), "1 entries leave 6 of the frame's 35 bytes unused"),
    (owned_frame(ro.OWNERS, [(b"g", b"t", 0, 5, 1, b"alice"), (b"g", b"t", 0, 6, 1, b"bob")]),
     "entry 2 of 2 names g/t-0 a second time"),
    (owned_frame(ro.OWNERS | 8, [(b"g", b"t", 0, 5, 1, b"alice")]), "unknown flags 0x0c"),
])
def test_lying_owned_offsets_frames_are_fatal(wire, message):
    with pytest.raises(RemoteProtocolError, match="bad OFFSETS: .*" + message) as info:
        parse_one(wire)
    assert info.value.fatal


@pytest.mark.parametrize("event, message", [
    (Offsets((("g", "t", 0, 1, 1, ""),), False, owners=True), "an owner of 0 bytes"),
    (Offsets((("g", "t", 0, 1, 1, b"alice"),), False, owners=True), "an owner is a user name or None"),
    (Offsets((("g", "t", 0, 1, 1, "\ud800"),), False, owners=True), "an owner is UTF-8 text"),
    (Offsets((("g", "t", 0, 1, 1),), False, owners=True), "an entry is \\(group, topic, partition, offset, "
                                                          "commit_ms, owner\\)"),
    (Offsets((("g", "t", 0, 1, 1, "alice"),), False), "an entry is \\(group, topic, partition, offset, commit_ms\\)"),
])
def test_bad_owners_are_not_sent(event, message):
    with pytest.raises(ValueError, match=message):
        serialize(event)


# -- TOPICS with owners (the "owners" key of the table's JSON: who created each topic) ---------------------------------


def topics_frame(doc):
    """A TOPICS frame whose payload is ``doc`` (bytes as they are, anything else as JSON)."""
    return frame(10, doc if isinstance(doc, bytes) else json.dumps(doc).encode())


@settings(max_examples=50, deadline=None)
@given(topic_owners)
def test_topics_with_owners_round_trip(owners):
    event = rt.encode(TABLE, owners)
    assert event.owners == tuple(owners)
    assert (rt.OWNERS_KEY in json.loads(event.table)) == bool(owners)
    assert parse_one(serialize(event)) == event


def test_topics_without_owners_keep_the_old_form_and_older_slaves_ignore_owners(tmp_path):
    """Without owners the payload is the table's file byte for byte (what a master sent before owners); with them a
    slave from before owners still takes the table (``apply_json`` reads the keys it knows)."""
    table = TopicTableFile(str(tmp_path))
    table.entries["orders"] = TopicSettings("orders", 3)
    table.version = 4
    event = rt.encode(table.to_json(), [])
    assert event == rt.Topics(table.encode())
    assert serialize(event) == frame(10, table.encode())
    assert parse_one(serialize(event)) == event
    owned = rt.encode(table.to_json(), [("orders-x", "alice", 2)])
    assert parse_one(serialize(owned)).owners == (("orders-x", "alice", 2),)
    older = TopicTableFile(str(tmp_path))
    older.apply_json(json.loads(owned.table))
    assert older.to_json() == table.to_json()


def test_topic_owners_at_their_limits_are_carried_and_one_past_them_are_not():
    most = limits.MAX_TX_OWNER_BYTES
    at = [("t", "u" * most, 1), ("t2", "\u00e9" * (most // 2), limits.MAX_PARTITIONS)]  # bytes, not characters
    assert parse_one(serialize(rt.encode(TABLE, at))).owners == tuple(at)
    for owner, message in ((("t", "u" * (most + 1), 1), "has %d bytes: a user name has 1..%d \\(limit "
                            "MAX_TX_OWNER_BYTES" % (most + 1, most)),
                           (("t", "\u00e9" * (most // 2) + "u", 1), "has %d bytes" % (most + 1)),
                           (("t", "alice", limits.MAX_PARTITIONS + 1), "topic t owned with %d partitions: 1..%d "
                            "\\(limit MAX_PARTITIONS" % (limits.MAX_PARTITIONS + 1, limits.MAX_PARTITIONS))):
        with pytest.raises(ValueError, match=message):
            rt.encode(TABLE, [owner])
        with pytest.raises(RemoteProtocolError, match="bad TOPICS: owner 1 of 1: .*" + message) as info:
            parse_one(topics_frame(dict(TABLE, owners=[list(owner)])))
        assert info.value.fatal
    many = [("t%d" % i, "alice", 1) for i in range(topics_limits.MAX_TOPICS * 4)]  # no count of its own: the bytes
    assert len(parse_one(serialize(rt.encode(TABLE, many))).owners) == topics_limits.MAX_TOPICS * 4


def test_owners_that_would_pass_the_table_size_are_not_sent():
    """The owners count in MAX_TOPIC_TABLE_BYTES (the only bound of how many a frame carries): a table near it
    with owners is refused (the master then sends the table alone); a payload of exactly the limit is carried,
    one byte past it is not, and one announced past it is refused from the frame header alone."""
    pad = topics_limits.MAX_TOPIC_TABLE_BYTES - len(rt.encode(dict(TABLE, pad=""), []).table)
    event = rt.encode(dict(TABLE, pad="x" * pad), [])
    assert len(event.table) == topics_limits.MAX_TOPIC_TABLE_BYTES and parse_one(serialize(event)) == event
    with pytest.raises(ValueError, match="TOPICS frame of %d bytes: must be 1..%d \\(limit MAX_TOPIC_TABLE_BYTES"
                       % (topics_limits.MAX_TOPIC_TABLE_BYTES + 1, topics_limits.MAX_TOPIC_TABLE_BYTES)):
        rt.encode(dict(TABLE, pad="x" * (pad + 1)), [])
    with pytest.raises(ValueError, match="must be 1..%d" % topics_limits.MAX_TOPIC_TABLE_BYTES):
        rt.encode(dict(TABLE, pad="x" * pad), [("t", "alice", 1)])
    head = FRAME_HEADER.pack(b"MQRS", VERSION, 10, 0, topics_limits.MAX_TOPIC_TABLE_BYTES + 1, 0)
    with pytest.raises(RemoteProtocolError, match="TOPICS frame of %d bytes: must be 1..%d" % (
            topics_limits.MAX_TOPIC_TABLE_BYTES + 1, topics_limits.MAX_TOPIC_TABLE_BYTES)) as info:
        parse_one(head)
    assert info.value.fatal


@pytest.mark.parametrize("doc, message", [
    (b"\xff{}", "the table is not UTF-8"),
    (b"{nope", "the table is not JSON"),
    (b"[" * 100000, "the table is not JSON"),
    ([TABLE], "the table is a JSON object, not list"),
    (dict(TABLE, owners={"t": "alice"}), "'owners' is a list of \\[topic, user, partitions\\], not dict"),
    (dict(TABLE, owners=[["t", "alice"]]), "owner 1 of 1: an owner is \\[topic, user, partitions\\]"),
    (dict(TABLE, owners=["t"]), "owner 1 of 1: an owner is \\[topic, user, partitions\\]"),
    (dict(TABLE, owners=[[5, "alice", 1]]), "owner 1 of 1: a topic is a name, not 5"),
    (dict(TABLE, owners=[["../x", "alice", 1]]), "owner 1 of 1: illegal topic name '../x'"),
    (dict(TABLE, owners=[["t", "", 1]]), "owner 1 of 1: the owner of topic t has 0 bytes"),
    (dict(TABLE, owners=[["t", 7, 1]]), "owner 1 of 1: the owner of topic t is a user name, not 7"),
    (dict(TABLE, owners=[["t", "alice", 0]]), "owner 1 of 1: topic t owned with 0 partitions"),
    (dict(TABLE, owners=[["t", "alice", True]]), "owner 1 of 1: topic t owned with True partitions"),
    (dict(TABLE, owners=[["t", "alice", 1.0]]), "owner 1 of 1: topic t owned with 1.0 partitions"),
    (dict(TABLE, owners=[["t", "alice", 1], ["t", "bob", 2]]), "owner 2 of 2 names topic t a second time"),
])
def test_lying_topics_frames_are_fatal(doc, message):
    with pytest.raises(RemoteProtocolError, match="bad TOPICS: " + message) as info:
        parse_one(topics_frame(doc))
    assert info.value.fatal


@pytest.mark.parametrize("table, owners, message", [
    (dict(TABLE, owners=[]), [("t", "alice", 1)], "a topic table has no 'owners' key of its own"),
    (TABLE, [("t", b"alice", 1)], "the owner of topic t is a user name"),
    (TABLE, [("t", "\ud800", 1)], "the owner of topic t is UTF-8 text"),
    (TABLE, [("t", "alice", 1), ("t", "bob", 1)], "owner 2 of 2 names topic t a second time"),
    (TABLE, [("t", "alice")], "an owner is \\[topic, user, partitions\\]"),
])
def test_bad_topic_owners_are_not_sent(table, owners, message):
    with pytest.raises(ValueError, match=message):
        rt.encode(table, owners)
    if owners and len(owners[0]) == 3 and "key" not in message:
        with pytest.raises(ValueError, match=message):
            serialize(rt.Topics(b"{}", tuple(owners)))
