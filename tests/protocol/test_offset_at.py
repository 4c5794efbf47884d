"""``offset_at <topic> <partition> <timestampMs> <opaque>`` (our extension): parsed, written, refused."""

import pytest

from metaq.protocol.events import OffsetAt, Version
from metaq.protocol.text import serialize
from tests.harness.text_parse import parse_bytewise, parse_whole


def both(data):
    whole = parse_whole(data, False)
    assert parse_bytewise(data, False) == whole
    return whole


def error(reason, opaque=0):
    return ("error", reason, opaque, False)


@pytest.mark.parametrize("line, event", [
    (b"offset_at orders 0 1700000000000 7", OffsetAt("orders", 0, 1700000000000, 7)),
    (b"offset_at orders 3 0 -5", OffsetAt("orders", 3, 0, -5)),  # the epoch itself is a time like any other
    (b"offset_at t 2147483647 9223372036854775807 2147483647", OffsetAt("t", 2147483647, 2**63 - 1, 2**31 - 1)),
    ("offset_at caf\u00e9 1 5 1".encode(), OffsetAt("caf\u00e9", 1, 5, 1)),
])
def test_good_lines_parse_and_write_back_the_same(line, event):
    assert both(line + b"\r\n") == [event]
    assert serialize(event) == line + b"\r\n"


@pytest.mark.parametrize("line, reason, opaque", [
    (b"offset_at orders 0 1700000000000", "offset_at needs 5 tokens (offset_at <topic> <partition> <timestampMs> "
     "<opaque>), got 4", 0),
    (b"offset_at orders 0", "offset_at needs 5 tokens (offset_at <topic> <partition> <timestampMs> <opaque>), got 3",
     0),
    (b"offset_at", "offset_at needs 5 tokens (offset_at <topic> <partition> <timestampMs> <opaque>), got 1", 0),
    (b"offset_at orders 0 5 6 7", "offset_at needs 5 tokens (offset_at <topic> <partition> <timestampMs> <opaque>), "
     "got 6", 7),
    (b"offset_at orders 0 -1 7", "invalid timestamp '-1': must be 0..9223372036854775807", 7),
    (b"offset_at orders 0 1.5e12 7", "invalid timestamp '1.5e12': not an integer", 7),
    (b"offset_at orders 0 2026-11-23T09:00:00Z 7", "invalid timestamp '2026-11-23T09:00:00Z': not an integer", 7),
    (b"offset_at orders 0 9223372036854775808 7", "invalid timestamp '9223372036854775808': must be "
     "0..9223372036854775807", 7),
    (b"offset_at orders -1 5 7", "invalid partition '-1': must be 0..2147483647", 7),
    (b"offset_at orders x 5 7", "invalid partition 'x': not an integer", 7),
    (b"offset_at orders 0 5 x", "invalid opaque 'x': not an integer", 0),
])
def test_bad_lines_are_refused_and_parsing_goes_on(line, reason, opaque):
    assert both(line + b"\r\nversion 9\r\n") == [error(reason, opaque), Version(9)]


def test_empty_topic_token():
    """Two spaces make an empty topic token: the line parses; the broker refuses the topic name (400)."""
    assert both(b"offset_at  0 5 7\r\n") == [OffsetAt("", 0, 5, 7)]


def test_a_topic_that_cannot_be_one_token_is_not_written():
    with pytest.raises(ValueError):
        serialize(OffsetAt("two words", 0, 5, 1))
