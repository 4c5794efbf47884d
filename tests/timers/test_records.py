"""The timer topic's records and put_at's ``when`` (metaq.timers.records)."""

import pytest

from metaq.errors import ClientError
from metaq.timers.limits import MAX_DELIVER_AHEAD_MS, MAX_TIMER_DONE_IDS
from metaq.timers import records as timer
from metaq.timers.records import BadTimerRecord, TimerCancel, TimerDone, TimerEntry

NOW = 1_700_000_000_000


def test_entry_round_trip():
    data = timer.encode_entry("orders", 3, 1, 12345, NOW + 5, NOW, b"\x00body")
    assert timer.decode(memoryview(data)) == TimerEntry("orders", 3, 1, 12345, NOW + 5, NOW, b"\x00body")


def test_cancel_and_done_round_trip():
    assert timer.decode(timer.encode_cancel(-7)) == TimerCancel(-7)
    assert timer.decode(timer.encode_done([1, 2, 3])) == TimerDone((1, 2, 3))


def test_done_limit_and_one_past():
    ids = list(range(MAX_TIMER_DONE_IDS))
    assert timer.decode(timer.encode_done(ids)).msg_ids == tuple(ids)
    with pytest.raises(ValueError):
        timer.encode_done(ids + [MAX_TIMER_DONE_IDS])
    with pytest.raises(ValueError):
        timer.encode_done([])


@pytest.mark.parametrize("data", [b"", b"MQTM", b"XXXX\x01\x01" + bytes(40), b"MQTM\x02\x01" + bytes(40),
                                  b"MQTM\x01\x09", b"MQTM\x01\x02" + bytes(7),
                                  b"MQTM\x01\x03\x00\x00\x00\x02" + bytes(8),
                                  timer.encode_entry("t", 0, 0, 0, 1, 1, b"")[:36]])
def test_bad_records(data):
    with pytest.raises(BadTimerRecord):
        timer.decode(data)


def test_when_absolute_relative_and_past():
    assert timer.parse_when("@%d" % (NOW + 1000), NOW) == NOW + 1000
    assert timer.parse_when(b"+2500", NOW) == NOW + 2500
    assert timer.parse_when("+0", NOW) == NOW
    assert timer.parse_when("@1000", NOW) == NOW  # in the past: due now


def test_when_limit_and_one_past():
    assert timer.parse_when("+%d" % MAX_DELIVER_AHEAD_MS, NOW) == NOW + MAX_DELIVER_AHEAD_MS
    with pytest.raises(ClientError, match="days ahead"):
        timer.parse_when("+%d" % (MAX_DELIVER_AHEAD_MS + 1), NOW)
    with pytest.raises(ClientError, match="days ahead"):
        timer.parse_when("@%d" % (NOW + MAX_DELIVER_AHEAD_MS + 1), NOW)


@pytest.mark.parametrize("token", ["", "5", "@", "+", "-5", "@-5", "+-5", "+5s", "@1.5", "+٣", "@" + "9" * 20,
                                   "+ 5"])
def test_when_garbage(token):
    with pytest.raises(ClientError, match="invalid delivery time"):
        timer.parse_when(token, NOW)


def test_due_from_checks():
    assert timer.due_from(delay_ms=10, now_ms=NOW) == NOW + 10
    for kwargs in ({}, {"deliver_at_ms": 1, "delay_ms": 1}, {"delay_ms": -1}, {"deliver_at_ms": -1},
                   {"delay_ms": 1.5}, {"delay_ms": True}):
        with pytest.raises(ClientError):
            timer.due_from(now_ms=NOW, **kwargs)


def test_an_owned_entry_names_its_user_and_an_old_one_none():
    data = timer.encode_entry("orders", 2, 1, 99, 5_000, 4_000, b"\x00body", owner="alice")
    assert timer.decode(data) == TimerEntry("orders", 2, 1, 99, 5_000, 4_000, b"\x00body", "alice")
    assert timer.decode(timer.encode_entry("orders", 2, 1, 99, 5_000, 4_000, b"body")).owner is None
    longest = "u" * timer.MAX_TX_OWNER_BYTES
    assert timer.decode(timer.encode_entry("t", 0, 0, 1, 1, 1, b"", owner=longest)).owner == longest
    with pytest.raises(ValueError):
        timer.encode_entry("t", 0, 0, 1, 1, 1, b"", owner=longest + "u")  # one past
    with pytest.raises(ValueError):
        timer.encode_entry("t", 0, 0, 1, 1, 1, b"", owner="")


@pytest.mark.parametrize("cut", [0, 1, 3])
def test_an_owned_entry_whose_owner_does_not_fit_is_refused(cut):
    data = timer.encode_entry("t", 0, 0, 1, 1, 1, b"", owner="alice")
    head = timer.ENTRY.size + 1
    bad = data[:head] + (bytes([0]) if cut == 0 else data[head:len(data) - cut])
    with pytest.raises(BadTimerRecord):
        timer.decode(bad)
