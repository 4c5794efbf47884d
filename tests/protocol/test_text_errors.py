"""Error handling, limits, resynchronisation and end of stream of the text parser."""

import pytest

from metaq import limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.events import Get, Put, Quit, Stats, Sync, Transaction, Version
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser
from tests.harness.text_parse import parse_bytewise, parse_chunks, parse_whole


def both(data, eof=False, **kw):
    """Outcomes of ``data`` fed whole; asserts byte-by-byte feeding says the same."""
    whole = parse_whole(data, eof, **kw)
    assert parse_bytewise(data, eof, **kw) == whole
    return whole


def error(reason, opaque=0, fatal=False):
    return ("error", reason, opaque, fatal)


# --- line endings, blank lines, exact command words -----------------------------------------------


def test_bare_lf_line_ends_are_accepted():
    assert both(b"version 1\nquit\nput t 0 2 0 3\nhi") == [Version(1), Quit(), Put("t", 0, 0, b"hi", 3)]


def test_empty_and_blank_lines_are_ignored():
    assert both(b"\r\n\n   \r\nversion 1\r\n\r\n") == [Version(1)]


def test_trailing_spaces_are_dropped_like_java_split():
    assert both(b"version 7  \r\nstats topics \r\n") == [Version(7), Stats("topics", 2147483647)]


@pytest.mark.parametrize(
    "line, shown, opaque",
    [
        (b"verison 1", "'verison'", 1),
        (b"PUT t 0 0 0 5", "'PUT'", 5),
        (b"v 3", "'v'", 3),
        (b"s", "'s'", 0),
        (b"values 1 2", "'values'", 2),
        (b"q", "'q'", 0),
        (b" version 4", "''", 4),
        (b"foo", "'foo'", 0),
    ],
)
def test_command_word_must_match_exactly(line, shown, opaque):
    assert both(line + b"\r\nversion 9\r\n") == [error("unknown command " + shown, opaque), Version(9)]


# --- non-fatal errors: the line is consumed, a known body skipped -----------------------------------


@pytest.mark.parametrize(
    "line, reason, opaque",
    [
        (b"get test g 1 0 100", "get needs 7, 8 or 9 tokens (get <topic> <group> <partition> <offset> <maxSize> "
                                "[<maxWaitMs> [<offset>:<msgId>]] <opaque>), got 6", 100),
        (b"offset t g 0 0", "offset needs 6 tokens, got 5", 0),
        (b"stats a b c", "stats needs 1, 2 or 3 tokens, got 4", 0),
        (b"version 1 2", "version needs 1 or 2 tokens, got 3", 2),
        (b"quit now", "quit needs 1 token, got 2", 0),
        (b"transaction TX:a:1 s BEGIN", "transaction needs 5, 6 or 7 tokens, got 4", 0),
        (b"get t g x 0 100 7", "invalid partition 'x': not an integer", 7),
        (b"get t g +1 0 100 7", "invalid partition '+1': not an integer", 7),
        (b"get t g 1_0 0 100 7", "invalid partition '1_0': not an integer", 7),
        ("get t g \u0661 0 100 7".encode(), "invalid partition '\u0661': not an integer", 7),
        (b"get t g 0x1 0 100 7", "invalid partition '0x1': not an integer", 7),
        (b"get t g  0 100 7", "invalid partition '': not an integer", 7),
        (b"get t g -2 0 100 7", "invalid partition '-2': must be -1..2147483647", 7),
        (b"get t g 0 0 2147483648 7", "invalid maxSize '2147483648': must be -2147483648..2147483647", 7),
        (b"get t g 0 0 10 -1 7", "invalid maxWaitMs '-1': must be 0..2147483647", 7),
        (b"get t g 0 9223372036854775808 10 7", "invalid offset '9223372036854775808': must be "
         "-9223372036854775808..9223372036854775807", 7),
        (b"version 2147483648", "invalid opaque '2147483648': must be -2147483648..2147483647", 0),
        (b"version -2147483649", "invalid opaque '-2147483649': must be -2147483648..2147483647", 0),
        (b"version abc", "invalid opaque 'abc': not an integer", 0),
        (b"stats topics x", "invalid opaque 'x': not an integer", 0),
        (b"transaction TX:a:1 s begin 5", "invalid transaction type 'begin': expected one of BEGIN END "
         "PREPARE COMMIT_ONE_PHASE COMMIT_TWO_PHASE ROLLBACK FORGET RECOVER "
                "HEURISTIC_COMMIT HEURISTIC_ROLLBACK", 5),
        (b"transaction foo s BEGIN 5", "invalid transaction key 'foo': expected null, TX:... or XID:...", 5),
        (b"transaction TX:a:1 s BEGIN x q 5", "invalid timeout 'x': not an integer", 5),
    ],
)
def test_bad_line_without_body_is_reported_and_parsing_continues(line, reason, opaque):
    assert both(line + b"\r\nversion 9\r\n") == [error(reason, opaque), Version(9)]


@pytest.mark.parametrize(
    "frame, reason, opaque",
    [
        (b"put test 1 5\r\nhello", "put needs 6, 7 or 8 tokens, got 4", 5),
        (b"put test x 5 0 1\r\nhello", "invalid partition 'x': not an integer", 1),
        (b"put test 1 5 0 -2 1\r\nhello", "invalid checksum '-2': must be -1..2147483647", 1),
        (b"put test 1 5 0 -x 1\r\nhello", "invalid checksum '-x': not an integer", 1),
        (b"put test 1 5 0 abc 1\r\nhello", "invalid transaction key 'abc': expected null, TX:... or XID:...", 1),
        (b"put test 1 5 0 1 TX:1 x\r\nhello", "invalid opaque 'x': not an integer", 0),
        (b"put test 1 5 2147483648 1\r\nhello", "invalid flag '2147483648': must be -2147483648..2147483647", 1),
        (b"put t\xff 1 5 0 1\r\nhello", "line is not valid UTF-8", 1),
        (b"sync test 1 5 0 x 1\r\nhello", "invalid msgId 'x': not an integer", 1),
        (b"value 5\r\nhello", "value needs 3 tokens, got 2", 5),
        (b"result 1000 5 3\r\nhello", "invalid code '1000': must be 0..999", 3),
    ],
)
def test_bad_frame_with_known_body_length_skips_the_body(frame, reason, opaque):
    assert both(frame + b"version 9\r\n") == [error(reason, opaque), Version(9)]


def test_skipped_body_that_looks_like_commands_is_not_parsed():
    bad = b"put test x 12 0 1\r\nquit\r\nstats\r\n"
    assert both(bad + b"version 9\r\n") == [error("invalid partition 'x': not an integer", 1), Version(9)]


def test_body_of_a_bad_frame_is_skipped_as_it_arrives():
    parser = TextParser()
    parser.receive_data(b"put test x 5 0 1\r\nhe")
    with pytest.raises(RemoteProtocolError) as info:
        parser.next_event()
    assert not info.value.fatal
    assert parser.next_event() is NEED_DATA
    assert parser.in_frame  # three body bytes still to come
    parser.receive_data(b"llo")
    assert parser.next_event() is NEED_DATA
    assert not parser.in_frame
    parser.receive_data(b"version 9\r\n")
    assert parser.next_event() == Version(9)


def test_non_utf8_line_is_not_fatal():
    assert both(b"version \xff\xfe\r\nversion 2\r\n") == [error("line is not valid UTF-8"), Version(2)]


def test_utf8_topic_and_group_are_decoded():
    assert both("get caf\u00e9 gr\u00fcn 0 0 10 1\r\n".encode()) == [Get("caf\u00e9", "gr\u00fcn", 0, 0, 10, 1)]


# --- integer edge values that are valid ---------------------------------------------------------


def test_extreme_valid_integers():
    frames = (
        b"get t g -1 -9223372036854775808 2147483647 2147483647 -2147483648\r\n"
        b"get t g 2147483647 9223372036854775807 1 0 2147483647\r\n"
        b"put t 0 0 -2147483648 2147483647 0\r\n"
        b"sync t 0 0 0 -9223372036854775808 0 0\r\n"
        b"transaction null s RECOVER 007 1\r\n"
        b"transaction XID:1:ab:cd:q s PREPARE 0 q 1\r\n"
    )
    assert both(frames) == [
        Get("t", "g", -1, -(2**63), 2**31 - 1, -(2**31), 2**31 - 1),
        Get("t", "g", 2**31 - 1, 2**63 - 1, 1, 2**31 - 1, 0),
        Put("t", 0, -(2**31), b"", 0, 2**31 - 1),
        Sync("t", 0, 0, -(2**63), b"", 0, 0),
        Transaction("null", "s", "RECOVER", 1, timeout=7),
        Transaction("XID:1:ab:cd:q", "s", "PREPARE", 1, timeout=0, unique_qualifier="q"),
    ]


def test_non_positive_max_size_reaches_the_broker_which_answers_it_like_metaq():
    assert both(b"get t g 0 0 0 7\r\nget t g 0 0 -5 8\r\n") == [Get("t", "g", 0, 0, 0, 7), Get("t", "g", 0, 0, -5, 8)]


def test_seven_token_put_rule():
    assert both(b"put t 0 1 0 -1 5\r\nxput t 0 1 0 TX:s:1 5\r\nxput t 0 1 0 null 5\r\nx") == [
        Put("t", 0, 0, b"x", 5, -1),
        Put("t", 0, 0, b"x", 5, -1, "TX:s:1"),
        Put("t", 0, 0, b"x", 5, -1, "null"),
    ]


# --- fatal errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, reason, opaque",
    [
        (b"put test", "put needs 6, 7 or 8 tokens, got 2; no body length", 0),
        (b"put test 1 x 0 7", "invalid body length 'x': not an integer", 7),
        (b"put test 1 x", "put needs 6, 7 or 8 tokens, got 4; invalid body length 'x': not an integer", 0),
        (b"put test 1 -1 0 7", "invalid body length -1: negative", 7),
        (b"put test 1 5000000 0 7", "body length 5000000 exceeds the limit of 4194304 bytes", 7),
        (b"put test 1 +5 0 7", "invalid body length '+5': not an integer", 7),
        (b"sync test 1 -5 0 1 7", "invalid body length -5: negative", 7),
        (b"value x 7", "invalid body length 'x': not an integer", 7),
        (b"value", "value needs 3 tokens, got 1; no body length", 0),
        (b"result 200 -1 7", "invalid body length -1: negative", 7),
        (b"result 200", "result needs 4 tokens, got 2; no body length", 200),
        (b"put t\xff 1 x 0 7", "line is not valid UTF-8; invalid body length 'x': not an integer", 7),
    ],
)
def test_unknown_or_bad_body_length_is_fatal(line, reason, opaque):
    assert both(line + b"\r\nversion 9\r\n") == [error(reason, opaque, fatal=True)]


def test_after_a_fatal_error_the_same_error_is_raised_forever():
    parser = TextParser()
    parser.receive_data(b"put test 1 -1 0 7\r\n")
    with pytest.raises(RemoteProtocolError) as first:
        parser.next_event()
    assert first.value.fatal and first.value.code == 400
    parser.receive_data(b"version 1\r\n")
    for _ in range(3):
        with pytest.raises(RemoteProtocolError) as again:
            parser.next_event()
        assert again.value is first.value
    parser.receive_data(b"")
    with pytest.raises(RemoteProtocolError):
        parser.next_event()


# --- limits ---------------------------------------------------------------------------------------


def stats_line(length):
    """A valid ``stats <item>`` line of exactly ``length`` bytes (no line end)."""
    return b"stats " + b"i" * (length - 6)


@pytest.mark.parametrize("max_line", [64, limits.MAX_LINE_BYTES])
@pytest.mark.parametrize("eol", [b"\r\n", b"\n"])
def test_line_of_exactly_max_line_bytes_parses(max_line, eol):
    line = stats_line(max_line)
    assert len(line) == max_line
    assert both(line + eol, max_line=max_line) == [Stats("i" * (max_line - 6), 2147483647)]


def test_line_of_max_line_bytes_and_cr_waits_for_the_lf():
    parser = TextParser(max_line=64)
    parser.receive_data(stats_line(64) + b"\r")
    assert parser.next_event() is NEED_DATA
    parser.receive_data(b"\n")
    assert parser.next_event() == Stats("i" * 58, 2147483647)


@pytest.mark.parametrize("max_line", [64, limits.MAX_LINE_BYTES])
def test_more_than_max_line_bytes_without_line_end_is_fatal_before_the_line_ends(max_line):
    parser = TextParser(max_line=max_line)
    parser.receive_data(stats_line(max_line))
    assert parser.next_event() is NEED_DATA
    parser.receive_data(b"i")
    with pytest.raises(RemoteProtocolError) as info:
        parser.next_event()
    assert info.value.reason == "line longer than %d bytes" % max_line
    assert info.value.fatal


@pytest.mark.parametrize("eol", [b"\r\n", b"\n"])
def test_complete_line_over_max_line_is_fatal(eol):
    assert both(stats_line(65) + eol + b"version 1\r\n", max_line=64) == [
        error("line longer than 64 bytes", fatal=True)
    ]


def test_endless_line_is_refused_without_buffering_it():
    parser = TextParser()
    chunk = b"a" * 65536
    parser.receive_data(chunk)
    with pytest.raises(RemoteProtocolError, match="line longer than 2048 bytes"):
        parser.next_event()
    for _ in range(10):
        parser.receive_data(chunk)  # ignored after the fatal error
    assert parser.buffered <= len(chunk)


def put_frame(length):
    return b"put t 0 %d 0 1\r\n" % length + b"b" * length


@pytest.mark.parametrize("max_body", [1000, limits.MAX_BODY_BYTES])
def test_body_of_exactly_max_body_parses(max_body):
    parser = TextParser(max_body=max_body)
    parser.receive_data(put_frame(max_body))
    event = parser.next_event()
    assert isinstance(event, Put) and len(event.body) == max_body


@pytest.mark.parametrize("max_body", [1000, limits.MAX_BODY_BYTES])
@pytest.mark.parametrize("command", [b"put t 0 %d 0 1", b"sync t 0 %d 0 5 1", b"value %d 1", b"result 200 %d 1"])
def test_body_over_max_body_is_fatal_before_the_body_arrives(max_body, command):
    parser = TextParser(max_body=max_body)
    parser.receive_data(command % (max_body + 1) + b"\r\n")  # no body bytes sent at all
    with pytest.raises(RemoteProtocolError) as info:
        parser.next_event()
    assert info.value.reason == "body length %d exceeds the limit of %d bytes" % (max_body + 1, max_body)
    assert (info.value.fatal, info.value.opaque) == (True, 1)


# --- end of stream --------------------------------------------------------------------------------


def test_eof_on_an_empty_stream_is_closed_and_stays_closed():
    parser = TextParser()
    parser.receive_data(b"")
    assert parser.next_event() is CLOSED
    assert parser.next_event() is CLOSED
    assert repr(CLOSED) == "CLOSED" and repr(NEED_DATA) == "NEED_DATA"


def test_eof_after_whole_frames_yields_them_then_closed():
    assert both(b"version 1\r\nput t 0 2 0 2\r\nhi\r\n", eof=True) == [Version(1), Put("t", 0, 0, b"hi", 2), CLOSED]


@pytest.mark.parametrize(
    "data",
    [
        b"vers",  # inside a line
        b"version 1\r",  # before the LF
        b"put t 0 5 0 1\r\nhel",  # inside a body
        b"put t x 5 0 1\r\nhel",  # inside the body of a rejected frame
    ],
)
def test_eof_inside_a_frame_is_fatal(data):
    outcomes = both(data, eof=True)
    assert outcomes[-1] == error("connection closed inside a frame", fatal=True)


def test_data_after_eof_is_a_protocol_error():
    parser = TextParser()
    parser.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        parser.receive_data(b"version 1\r\n")
    assert info.value.fatal


def test_in_frame_and_buffered_follow_the_stream():
    parser = TextParser()
    assert not parser.in_frame and parser.buffered == 0
    parser.receive_data(b"versi")
    assert parser.next_event() is NEED_DATA
    assert parser.in_frame and parser.buffered == 5
    parser.receive_data(b"on 1\r\nput t 0 4 0 2\r\nab")
    assert parser.next_event() == Version(1)
    assert parser.next_event() is NEED_DATA
    assert parser.in_frame and parser.buffered == 2
    parser.receive_data(b"cd")
    assert parser.next_event() == Put("t", 0, 0, b"abcd", 2)
    assert parser.next_event() is NEED_DATA
    assert not parser.in_frame and parser.buffered == 0


def test_frames_split_at_every_position_give_the_same_events():
    data = b"put t 0 5 0 -1 3\r\nhellostats  -4\nget t g 0 1 2 3 4\r\nresult 200 2 5\r\nok"
    expected = parse_whole(data)
    assert len(expected) == 4
    for cut in range(1, len(data)):  # an empty chunk would mean EOF
        assert parse_chunks([data[:cut], data[cut:]]) == expected
