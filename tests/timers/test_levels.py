"""Delay levels (RocketMQ's messageDelayLevel syntax), the schedule entry codec and the put_delayed frame."""

import pytest

from metaq.errors import ClientError, RemoteProtocolError
from metaq.protocol import events as ev
from metaq.protocol.message import encode_payload
from metaq.protocol.text import TextParser, serialize
from metaq.timers.levels import (DEFAULT_LEVELS, ENTRY, MAX_LEVELS, BadScheduleEntry, ScheduleEntry, decode_entry,
                                 effective_level, encode_entry, format_levels, parse_levels)
from metaq.timers.scheduler import DELAY_LEVELS_MS


def test_rocketmq_default_levels():
    assert DELAY_LEVELS_MS == (1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000, 360000, 420000,
                               480000, 540000, 600000, 1200000, 1800000, 3600000, 7200000)
    assert len(DELAY_LEVELS_MS) == 18
    assert format_levels(DELAY_LEVELS_MS) == DEFAULT_LEVELS


def test_units_and_spacing():
    assert parse_levels("1s 2m 3h 1d") == (1000, 120000, 3 * 3600_000, 86_400_000)
    assert parse_levels("  90s\t5s ") == (90_000, 5000)  # any whitespace; order is the operator's
    assert format_levels((90_000, 7_200_000, 86_400_000)) == "90s 2h 1d"


@pytest.mark.parametrize("text, words", [
    ("", "at least one"),
    ("   ", "at least one"),
    ("1s 5x", "level 2 '5x'"),
    ("1.5s", "level 1 '1.5s'"),
    ("10", "one unit of s, m, h, d"),
    ("s", "level 1 's'"),
    ("-1s", "level 1 '-1s'"),
    ("0s", "more than 0"),
    ("1001d", "at most 1000d"),
    ("1S", "level 1 '1S'"),
    (" ".join(["1s"] * (MAX_LEVELS + 1)), "at most %d delay levels" % MAX_LEVELS),
])
def test_bad_levels_say_which_item_and_why(text, words):
    with pytest.raises(ValueError) as info:
        parse_levels(text)
    assert words in str(info.value)


def test_effective_level_follows_rocketmq_and_refuses_negative():
    assert effective_level(0, 3) == 0  # no delay
    assert effective_level(1, 3) == 1
    assert effective_level(3, 3) == 3
    assert effective_level(99, 3) == 3  # above the last: the last (RocketMQ clamps)
    for bad in (-1, -2**31, True, "2", None):
        with pytest.raises(ClientError) as info:
            effective_level(bad, 3)
        assert "delay level" in str(info.value)


def test_entry_round_trip_keeps_everything_of_the_original():
    flag, data = encode_payload(b"payload", "tag-a")
    raw = encode_entry("orders", 3, flag, 12345, 1_700_000_005_000, 1_700_000_000_000, 2, data)
    assert raw[:4] == b"MQDE" and len(raw) == ENTRY.size + len("orders") + len(data)
    e = decode_entry(memoryview(raw))
    assert e == ScheduleEntry("orders", 3, flag, 12345, 1_700_000_005_000, 1_700_000_000_000, 2, data)
    empty = decode_entry(encode_entry("t", 0, 0, 0, 1, 0, 1, b""))
    assert empty.data == b"" and empty.topic == "t"


@pytest.mark.parametrize("raw, words", [
    (b"", "shorter"),
    (b"XXXX" + bytes(ENTRY.size), "not a schedule entry"),
    (ENTRY.pack(b"MQDE", 2, 1, 1, 0, 0, 0, 0, 0) + b"t", "version 2"),
    (ENTRY.pack(b"MQDE", 1, 1, 9, 0, 0, 0, 0, 0) + b"t", "topic length 9"),
    (ENTRY.pack(b"MQDE", 1, 1, 0, 0, 0, 0, 0, 0) + b"t", "topic length 0"),
])
def test_bad_entries_are_refused(raw, words):
    with pytest.raises(BadScheduleEntry) as info:
        decode_entry(raw)
    assert words in str(info.value)


def test_entry_encoding_checks_its_fields():
    with pytest.raises(ClientError):
        encode_entry("x" * 201, 0, 0, 0, 0, 0, 1, b"")
    with pytest.raises(ClientError):
        encode_entry("t", 0, 0, 0, 0, 0, 0, b"")


def test_put_delayed_frame_round_trip_and_errors():
    e = ev.DelayedPut("t", -1, 1, b"\x00\x00\x00\x00hello", 7, -1, 4)
    wire = serialize(e)
    assert wire == b"put_delayed t -1 9 1 -1 4 7\r\n\x00\x00\x00\x00hello"
    p = TextParser()
    p.receive_data(wire + b"put_delayed t 0 2 0 -1 -3 8\r\nhi")
    assert p.next_event() == e
    assert p.next_event() == ev.DelayedPut("t", 0, 0, b"hi", 8, -1, -3)  # the broker answers a negative level
    # a bad level is a 400 for that frame only: its body is skipped and the stream stays usable
    p.receive_data(b"put_delayed t 0 2 0 -1 soon 9\r\nhiversion 10\r\n")
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert "invalid delay level 'soon'" in info.value.reason and info.value.opaque == 9 and not info.value.fatal
    assert p.next_event() == ev.Version(10)
    p.receive_data(b"put_delayed t 0 2 0 3 9\r\nhi")  # the checksum is not optional here
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert "put_delayed needs 8 tokens, got 7" in info.value.reason
