"""Property tests of the text codec: round trips, chunking independence, fuzzing, resynchronisation."""

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.protocol.events import (TX_TYPES, Get, Offset, OffsetAt, Promote, Put, Quit, Result, Stats, Sync,
                                   Transaction, Value, Version)
from metaq.protocol.stream import CLOSED
from metaq.protocol.text import serialize
from tests.harness.text_parse import parse_bytewise, parse_chunks, parse_one, parse_whole

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
UINT31 = st.integers(0, 2**31 - 1)
PARTITIONS = st.integers(-1, 2**31 - 1)
CHECKSUMS = st.integers(-1, 2**31 - 1)
BODIES = st.binary(max_size=200)
TOKEN_CHARS = st.characters(blacklist_characters=" \r\n", blacklist_categories=("Cs",))


def tokens(min_size=0):
    """Text that travels as one token: no space, CR or LF (empty allowed where it is not last)."""
    return st.text(TOKEN_CHARS, min_size=min_size, max_size=20)


TX_KEYS = st.just("null") | tokens().map(lambda s: "TX:" + s) | tokens().map(lambda s: "XID:" + s)
# A qualifier of ASCII digits alone would read back as a timeout (MetaQ's grammar is ambiguous there).
QUALIFIERS = st.none() | tokens(1).filter(lambda s: not (s.isascii() and s.isdigit()))

EVENTS = {
    Put: st.builds(Put, tokens(), PARTITIONS, INT32, BODIES, INT32, CHECKSUMS, st.none() | TX_KEYS),
    Get: st.builds(Get, tokens(), tokens(), PARTITIONS, INT64, INT32, INT32, st.none() | UINT31, st.none())
    | st.builds(Get, tokens(), tokens(), PARTITIONS, INT64, INT32, INT32, UINT31,  # with an expect
                st.tuples(st.integers(0, 2**63 - 1), INT64)),
    Offset: st.builds(Offset, tokens(), tokens(), PARTITIONS, INT64, INT32),
    OffsetAt: st.builds(OffsetAt, tokens(), UINT31, st.integers(0, 2**63 - 1), INT32),
    Stats: st.builds(Stats, st.just("") | tokens(1), INT32),
    Version: st.builds(Version, INT32),
    Quit: st.just(Quit()),
    Transaction: st.builds(Transaction, TX_KEYS, tokens(), st.sampled_from(TX_TYPES), INT32, UINT31, QUALIFIERS),
    Sync: st.builds(Sync, tokens(), PARTITIONS, INT32, INT64, BODIES, INT32, CHECKSUMS),
    Promote: st.builds(Promote, st.booleans(), INT32),
    Value: st.builds(Value, BODIES, INT32),
    Result: st.builds(Result, st.integers(0, 999), BODIES, INT32),
}
ANY_EVENT = st.one_of(*EVENTS.values())


def check_round_trip(event):
    assert parse_one(serialize(event)) == event


@settings(max_examples=60)
@given(EVENTS[Put])
def test_put_round_trip(event):
    check_round_trip(event)


@settings(max_examples=40)
@given(EVENTS[Get])
def test_get_round_trip(event):
    check_round_trip(event)


@settings(max_examples=30)
@given(EVENTS[Offset])
def test_offset_round_trip(event):
    check_round_trip(event)


@settings(max_examples=30)
@given(EVENTS[OffsetAt])
def test_offset_at_round_trip(event):
    check_round_trip(event)


@settings(max_examples=30)
@given(EVENTS[Stats])
def test_stats_round_trip(event):
    check_round_trip(event)


@settings(max_examples=20)
@given(EVENTS[Version] | EVENTS[Quit])
def test_version_and_quit_round_trip(event):
    check_round_trip(event)


@settings(max_examples=50)
@given(EVENTS[Transaction])
def test_transaction_round_trip(event):
    check_round_trip(event)


@settings(max_examples=40)
@given(EVENTS[Sync])
def test_sync_round_trip(event):
    check_round_trip(event)


@settings(max_examples=40)
@given(EVENTS[Value] | EVENTS[Result])
def test_value_and_result_round_trip(event):
    check_round_trip(event)


@settings(max_examples=40)
@given(st.lists(ANY_EVENT, max_size=12), st.data())
def test_pipelined_events_parse_back_in_any_chunking(events, data):
    wire = b"".join(serialize(e) for e in events)
    assert parse_whole(wire, eof=True) == events + [CLOSED]
    cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(wire) - 1)), max_size=6, unique=True)))
    chunks = [wire[a:b] for a, b in zip([0] + cuts, cuts + [len(wire)], strict=True) if wire[a:b]]
    assert parse_chunks(chunks, eof=True) == events + [CLOSED]


# --- fuzzing: nothing but RemoteProtocolError, whatever the input --------------------------------

SMALL_LIMITS = {"max_line": 40, "max_body": 64}


def check_same_everywhere(data, eof, **limits):
    """Whole and byte-by-byte feeding agree (the helpers let only RemoteProtocolError through)."""
    assert parse_bytewise(data, eof, **limits) == parse_whole(data, eof, **limits)


@settings(max_examples=150)
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes(data, eof):
    check_same_everywhere(data, eof)
    check_same_everywhere(data, eof, **SMALL_LIMITS)


WORDS = ["put", "get", "offset", "stats", "version", "quit", "transaction", "sync", "value", "result"]
FUZZ_TOKENS = st.one_of(
    st.integers(-(2**64), 2**64).map(str),
    st.integers(-3, 70).map(str),
    st.sampled_from(["", "-", "+1", "1_0", "0x1", "null", "TX:a:1", "XID:1:a:b:q", "BEGIN", "RECOVER", "\xff"]),
    st.sampled_from(WORDS + list(TX_TYPES)),
    st.text(max_size=6),
)


@st.composite
def command_like_frames(draw):
    """A line from a real command word and mutated tokens, an ending, maybe a body; as bytes."""
    word = draw(st.sampled_from(WORDS + ["verison", "PUT", "s", ""]))
    fields = draw(st.lists(FUZZ_TOKENS, max_size=9))
    line = " ".join([word] + fields).encode("utf-8", "surrogatepass")
    ending = draw(st.sampled_from([b"\r\n", b"\n", b"\r\n", b"", b"\r"]))
    body = draw(st.binary(max_size=70) | st.just(b"hello") | st.just(b""))
    return line + ending + body


@st.composite
def mutated_valid_frames(draw):
    """A valid frame with one header token replaced, inserted or deleted."""
    wire = serialize(draw(ANY_EVENT))
    line, sep, body = wire.partition(b"\r\n")
    fields = line.split(b" ")
    where = draw(st.integers(0, len(fields)))
    new = draw(FUZZ_TOKENS).encode("utf-8", "surrogatepass")
    action = draw(st.sampled_from(["replace", "insert", "delete"]))
    if action == "insert" or where == len(fields):
        fields.insert(where, new)
    elif action == "replace":
        fields[where] = new
    else:
        del fields[where]
    return b" ".join(fields) + sep + body


@settings(max_examples=250)
@given(st.lists(command_like_frames() | mutated_valid_frames(), min_size=1, max_size=6), st.booleans())
def test_mutated_command_lines(frames, eof):
    data = b"".join(frames)
    check_same_everywhere(data, eof)
    check_same_everywhere(data, eof, **SMALL_LIMITS)


# --- resynchronisation after non-fatal errors, death after fatal ones ----------------------------

BAD_FRAMES = [
    # (frame builder from a random body, expected reason)
    (lambda b: b"put test x %d 0 7\r\n" % len(b) + b, "invalid partition 'x': not an integer"),
    (lambda b: b"put test 1 %d 0 1 2 3 7\r\n" % len(b) + b, "put needs 6, 7 or 8 tokens, got 9"),
    (lambda b: b"sync t 0 %d 0 x 7\r\n" % len(b) + b, "invalid msgId 'x': not an integer"),
    (lambda b: b"result 2000 %d 7\r\n" % len(b) + b, "invalid code '2000': must be 0..999"),
    (lambda b: b"put t\xff 0 %d 0 7\r\n" % len(b) + b, "line is not valid UTF-8"),
    (lambda b: b"bogus command 7\r\n", "unknown command 'bogus'"),
    (lambda b: b"get t g 0 0 1 -1 7\n", "invalid maxWaitMs '-1': must be 0..2147483647"),
]
FATAL_FRAMES = [
    b"put t 0 -1 0 7\r\n",
    b"put t 0 x 0 7\r\nhello",
    b"value 4194305 7\r\n",
    b"s" * 3000,
]


@st.composite
def good_or_bad(draw):
    if draw(st.booleans()):
        event = draw(ANY_EVENT)
        return serialize(event), event
    build, reason = draw(st.sampled_from(BAD_FRAMES))
    # Bodies full of line ends and command words: skipping them must not parse them.
    body = draw(st.binary(max_size=40) | st.sampled_from([b"quit\r\n", b"version 1\r\nstats\r\n", b"\n\n\r\n"]))
    return build(body), ("error", reason, 7 if b" 7\r" in build(b"") or b" 7\n" in build(b"") else 0, False)


@settings(max_examples=80)
@given(st.lists(good_or_bad(), max_size=10), st.none() | st.sampled_from(FATAL_FRAMES), st.lists(ANY_EVENT, max_size=3))
def test_parser_resynchronises_after_errors_and_dies_after_fatal_ones(items, fatal, after):
    wire = b"".join(frame for frame, _ in items)
    expected = [outcome for _, outcome in items]
    if fatal is not None:
        wire += fatal + b"".join(serialize(e) for e in after)
    whole = parse_whole(wire)
    assert parse_bytewise(wire) == whole
    assert whole[: len(expected)] == expected
    if fatal is None:
        assert len(whole) == len(expected)
    else:
        assert len(whole) == len(expected) + 1  # nothing after the fatal error
        assert whole[-1][0] == "error" and whole[-1][3] is True
