"""The byte-exact examples of reference metaq-protocol.md §1.4, decoded and (for encoder outputs) encoded."""

import pytest

from metaq.errors import RemoteProtocolError
from metaq.protocol.events import (
    Get,
    Offset,
    Put,
    Quit,
    Result,
    Stats,
    Sync,
    Transaction,
    Value,
    Version,
)
from metaq.protocol.message import encode_payload, encode_record, iter_records
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, encode_result, encode_value_header, serialize
from tests.harness.text_parse import parse_bytewise, parse_one, parse_whole

# (wire bytes, event): each pair is decoded AND encoded (these are MetaQ encoder outputs).
ENCODER_EXAMPLES = [
    (b"put test 1 5 0 -1 0\r\nhello", Put("test", 1, 0, b"hello", 0)),
    (b"put test 1 5 0 -1 TX:test:1 0\r\nhello", Put("test", 1, 0, b"hello", 0, tx_key="TX:test:1")),
    (b"get test boyan-group 1 1000 1048576 -3\r\n", Get("test", "boyan-group", 1, 1000, 1048576, -3)),
    (b"offset test boyan-test 1 1000 -1\r\n", Offset("test", "boyan-test", 1, 1000, -1)),
    (b"value 5 99\r\nhello", Value(b"hello", 99)),
    (b"result 404 9 99\r\nnot found", Result(404, b"not found", 99)),
    (b"result 404 0 99\r\n", Result(404, b"", 99)),
    (b"stats  -1000\r\n", Stats("", -1000)),
    (b"stats topics -1000\r\n", Stats("topics", -1000)),
    (b"version 999\r\n", Version(999)),
    (b"quit\r\n", Quit()),
    (b"sync test 1 5 0 9999 777 0\r\nhello", Sync("test", 1, 0, 9999, b"hello", 0, 777)),
    (
        b"transaction TX:sessionId:99 sessionId COMMIT_ONE_PHASE 100\r\n",
        Transaction("TX:sessionId:99", "sessionId", "COMMIT_ONE_PHASE", 100),
    ),
    (
        b"transaction TX:sessionId:99 sessionId BEGIN 3 100\r\n",
        Transaction("TX:sessionId:99", "sessionId", "BEGIN", 100, timeout=3),
    ),
    (
        b"transaction TX:sessionId:99 sessionId BEGIN unique-qualifier 100\r\n",
        Transaction("TX:sessionId:99", "sessionId", "BEGIN", 100, unique_qualifier="unique-qualifier"),
    ),
    (
        b"transaction TX:sessionId:99 sessionId BEGIN 3 unique-qualifier 100\r\n",
        Transaction("TX:sessionId:99", "sessionId", "BEGIN", 100, timeout=3, unique_qualifier="unique-qualifier"),
    ),
]

# Decoder-only examples: forms our encoder does not produce.
DECODER_EXAMPLES = [
    (b"put test 1 5 0 0\r\nhello", Put("test", 1, 0, b"hello", 0, checksum=-1)),
    (b"put test 1 5 0 100 0\r\nhello", Put("test", 1, 0, b"hello", 0, checksum=100)),
    (b"put test 1 5 0 TX:test:100 0\r\nhello", Put("test", 1, 0, b"hello", 0, checksum=-1, tx_key="TX:test:100")),
    (
        b"put test 1 5 0 9999 TX:test:100 0\r\nhello",
        Put("test", 1, 0, b"hello", 0, checksum=9999, tx_key="TX:test:100"),
    ),
    (b"version\r\n", Version(2147483647)),
    (b"version -1\r\n", Version(-1)),
    (b"stats\r\n", Stats(None, 2147483647)),
    (b"stats topics\r\n", Stats("topics", 2147483647)),
    (b"sync test 1 5 0 9999 0\r\nhello", Sync("test", 1, 0, 9999, b"hello", 0, -1)),
]


@pytest.mark.parametrize("wire, event", ENCODER_EXAMPLES + DECODER_EXAMPLES)
def test_decode_reference_example(wire, event):
    assert parse_one(wire) == event


@pytest.mark.parametrize("wire, event", ENCODER_EXAMPLES)
def test_encode_reference_example(wire, event):
    assert serialize(event) == wire


def test_blank_stats_item_none_is_written_with_two_spaces_like_java():
    assert serialize(Stats(None, -1000)) == b"stats  -1000\r\n"
    assert serialize(Stats()) == b"stats  2147483647\r\n"


def test_six_token_put_is_parsed_field_by_field():
    event = parse_one(b"put test 1 5 0 0\r\nhello")
    assert (event.topic, event.partition, len(event.body), event.flag, event.opaque) == ("test", 1, 5, 0, 0)
    assert event.checksum == -1 and event.tx_key is None


def test_incomplete_put_waits_for_the_body_then_yields_it():
    parser = TextParser()
    parser.receive_data(b"put test 1 5 0 10\r\nhel")
    assert parser.next_event() is NEED_DATA
    assert parser.in_frame
    assert parser.buffered == 3  # the header line is parsed; the partial body stays buffered
    parser.receive_data(b"lo")
    assert parser.next_event() == Put("test", 1, 0, b"hello", 10)
    assert parser.next_event() is NEED_DATA
    assert not parser.in_frame and parser.buffered == 0


def test_unknown_command_is_a_non_fatal_error_and_the_connection_stays_usable():
    parser = TextParser()
    parser.receive_data(b"just for test\r\nversion 5\r\n")
    with pytest.raises(RemoteProtocolError) as info:
        parser.next_event()
    assert info.value.reason == "unknown command 'just'"
    assert (info.value.opaque, info.value.fatal, info.value.code) == (0, False, 400)
    assert parser.next_event() == Version(5)


# Request/response pairs at the end of reference §1.4.
HELLO_CHECKSUM = 907060870
RECORD = encode_record(12345, *encode_payload(b"hello", None))


def test_put_request_and_result_reply():
    request = b"put test 0 5 0 907060870 -2147483648\r\nhello"
    put = Put("test", 0, 0, b"hello", -2147483648, HELLO_CHECKSUM)
    assert parse_one(request) == put
    assert serialize(put) == request
    reply = encode_result(200, b"12345 0 0", put.opaque)
    assert reply == b"result 200 9 -2147483648\r\n12345 0 0"
    assert parse_one(reply) == Result(200, b"12345 0 0", -2147483648)


def test_get_request_and_value_reply_with_one_record():
    request = b"get test grp 0 0 1048576 -2147483647\r\n"
    assert parse_one(request) == Get("test", "grp", 0, 0, 1048576, -2147483647)
    reply = encode_value_header(len(RECORD), -2147483647) + RECORD
    assert reply[:22] == b"value 25 -2147483647\r\n"
    value = parse_one(reply)
    assert value == Value(RECORD, -2147483647)
    ((record, end),) = list(iter_records(value.body))
    assert (record.msg_id, record.payload, end) == (12345, b"hello", 25)


def test_get_past_the_end_gets_404_with_the_reference_text():
    assert parse_one(b"get test grp 0 25 1048576 -2147483646\r\n") == Get("test", "grp", 0, 25, 1048576, -2147483646)
    reply = encode_result(404, b"Could not find message at position 25", -2147483646)
    assert reply == b"result 404 37 -2147483646\r\nCould not find message at position 25"
    assert parse_one(reply).body == b"Could not find message at position 25"


def test_offset_and_version_pairs():
    assert parse_one(b"offset test grp 0 7 5\r\n") == Offset("test", "grp", 0, 7, 5)
    assert encode_result(200, b"0", 5) == b"result 200 1 5\r\n0"
    assert parse_one(b"version 12\r\n") == Version(12)
    assert encode_result(200, b"1.4.6.2", 12) == b"result 200 7 12\r\n1.4.6.2"
    assert parse_one(b"result 200 7 12\r\n1.4.6.2") == Result(200, b"1.4.6.2", 12)


def test_pipelined_conversation_whole_and_byte_by_byte():
    requests = b"".join(wire for wire, _ in ENCODER_EXAMPLES + DECODER_EXAMPLES)
    expected = [event for _, event in ENCODER_EXAMPLES + DECODER_EXAMPLES]
    assert parse_whole(requests) == expected
    assert parse_bytewise(requests) == expected


def test_serialize_refuses_text_that_would_break_the_framing():
    with pytest.raises(ValueError):
        serialize(Put("a b", 0, 0, b"", 1))
    with pytest.raises(ValueError):
        serialize(Get("t", "g\r\nquit", 0, 0, 1, 1))
    with pytest.raises(TypeError):
        serialize("version 1")


def test_hot_path_helpers_accept_bytes_like_bodies():
    assert encode_result(500, memoryview(b"boom"), -7) == b"result 500 4 -7\r\nboom"
    assert encode_result(200, b"", 3) == b"result 200 0 3\r\n"
    assert encode_value_header(1048576, -2147483648) == b"value 1048576 -2147483648\r\n"


@pytest.mark.parametrize("wire, event", [
    (b"promote 0 5\r\n", "Promote(force=False, opaque=5)"),
    (b"promote 1 -7\r\n", "Promote(force=True, opaque=-7)"),
])
def test_promote_extension_round_trip(wire, event):
    from metaq.protocol.events import Promote

    parsed = parse_one(wire)
    assert isinstance(parsed, Promote) and repr(parsed) == event
    assert serialize(parsed) == wire


@pytest.mark.parametrize("wire, message", [
    (b"promote 2 5\r\n", "invalid force '2': must be 0..1"),
    (b"promote yes 5\r\n", "invalid force 'yes': not an integer"),
    (b"promote 1\r\n", "promote needs 3 tokens"),
])
def test_promote_bad_lines_are_answered_and_the_parser_goes_on(wire, message):
    p = TextParser()
    p.receive_data(wire + b"version 3\r\n")
    with pytest.raises(RemoteProtocolError, match=message) as info:
        p.next_event()
    assert not info.value.fatal
    assert p.next_event() == Version(3)
