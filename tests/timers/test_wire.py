"""The text protocol's put_at, cancel and timers frames (metaq.timers.wire)."""

import pytest

from metaq.errors import RemoteProtocolError
from metaq.timers.limits import MAX_TIMER_LIST
from metaq.protocol.text import TextParser, serialize
from metaq.timers.wire import TimerCancelCommand, TimerList, TimerPut, format_rows, parse_rows


def test_round_trips():
    events = [TimerPut("t", -1, 1, b"\x00\x00\x00\x00hello", 7, -1, "@1700000000000"),
              TimerPut("t", 0, 0, b"hi", 8, 5, "+250"),
              TimerCancelCommand(123456789012345, 9), TimerList("*", MAX_TIMER_LIST, 10), TimerList("orders", 1, 11)]
    p = TextParser()
    p.receive_data(b"".join(serialize(e) for e in events))
    assert [p.next_event() for _ in events] == events
    assert serialize(events[1]) == b"put_at t 0 2 0 5 +250 8\r\nhi"


def test_the_when_is_the_brokers_to_judge_and_the_stream_stays_usable():
    p = TextParser()
    p.receive_data(b"put_at t 0 2 0 -1 soon 9\r\nhiversion 10\r\n")
    assert p.next_event() == TimerPut("t", 0, 0, b"hi", 9, -1, "soon")  # parse_when answers it with a 400


@pytest.mark.parametrize("line, why", [
    (b"timers * %d 3\r\n" % (MAX_TIMER_LIST + 1), "limit"),
    (b"timers * 0 3\r\n", "limit"),
    (b"cancel abc 3\r\n", "message id"),
    (b"cancel 1 2 3\r\n", "3 tokens"),
])
def test_bad_frames(line, why):
    p = TextParser()
    p.receive_data(line)
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert why in info.value.reason


def test_rows():
    rows = [(5, 1700, "orders", 1, 42), (6, 1800, "t", 0, 0)]
    assert parse_rows(format_rows(rows)) == [(5, "orders", 1, 1700, 42), (6, "t", 0, 1800, 0)]
