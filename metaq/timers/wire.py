"""The text protocol's timer commands (docs/messaging.md "Any delivery time", "Cancel"), sans-IO::

    put_at <topic> <partition> <len> <flag> <checksum> <when> <opaque>\\r\\n<body>
        when: @<epoch ms> (absolute) or +<ms> (after a delay, from the broker's clock);
        answered like put_delayed: 200 "<msgId> <partition> -1" (the offset is known at delivery)
    cancel <msgId> <opaque>
        200 "cancelled"; 404 "delivered", "cancelled" (before) or "unknown"
    timers <topic|*> <limit> <opaque>
        200, a line per pending timer: "<msgId> <topic> <partition> <due ms> <size>" (at most MAX_TIMER_LIST)

``when`` is kept as text here: the broker reads it with its clock (``metaq.timers.records.parse_when``).
"""

from typing import NamedTuple

from metaq.timers.limits import MAX_TIMER_LIST
from metaq.protocol.commands import NEEDS_ADMIN, NEEDS_HANDLER, TextCommand, register, token
from metaq.protocol.integers import parse_int
from metaq.timers.burst import scan_put_ats

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class TimerPut(NamedTuple):
    topic: str
    partition: int
    flag: int
    body: bytes
    opaque: int
    checksum: int
    when: str


class TimerCancelCommand(NamedTuple):
    msg_id: int
    opaque: int


class TimerList(NamedTuple):
    topic: str  # "*": every topic
    limit: int
    opaque: int


def _parse_put_at(t):
    topic, when = t[1], t[6]
    partition = parse_int(t[2], "partition", -1, _INT32[1])
    flag = parse_int(t[4], "flag", *_INT32)
    checksum = parse_int(t[5], "checksum", -1, _INT32[1])
    opaque = parse_int(t[7], "opaque", *_INT32)
    return lambda body: TimerPut(topic, partition, flag, body, opaque, checksum, when)


def _parse_cancel(t):
    return TimerCancelCommand(parse_int(t[1], "message id", *_INT64), parse_int(t[2], "opaque", *_INT32))


def _parse_timers(t):
    return TimerList(t[1], parse_int(t[2], "limit", 1, MAX_TIMER_LIST), parse_int(t[3], "opaque", *_INT32))



def _serialize_put_at(e):
    head = "put_at %s %d %d %d %d %s %d\r\n" % (token(e.topic), e.partition, len(e.body), e.flag, e.checksum,
                                                token(e.when), e.opaque)
    return head.encode("utf-8") + e.body


register(TextCommand(
    "put_at", TimerPut, (8,), "8 tokens (put_at <topic> <partition> <len> <flag> <checksum> @<epoch ms>|+<delay ms> "
    "<opaque>)", _parse_put_at, _serialize_put_at, NEEDS_HANDLER, body=3, burst=scan_put_ats,
    examples=(b"put_at t 0 2 0 -1 +1000 1\r\nhi", b"put_at t -1 2 0 -1 @1800000000000 2\r\nhi")))
register(TextCommand(
    "cancel", TimerCancelCommand, (3,), "3 tokens (cancel <msgId> <opaque>)", _parse_cancel,
    lambda e: b"cancel %d %d\r\n" % (e.msg_id, e.opaque), NEEDS_ADMIN, examples=(b"cancel 12345 1\r\n",)))
register(TextCommand(
    "timers", TimerList, (4,), "4 tokens (timers <topic|*> <limit 1..%d> <opaque>)" % MAX_TIMER_LIST, _parse_timers,
    lambda e: ("timers %s %d %d\r\n" % (token(e.topic), e.limit, e.opaque)).encode("utf-8"), NEEDS_ADMIN,
    examples=(b"timers * 10 1\r\n", b"timers orders 5 2\r\n")))


def format_rows(rows):
    """The ``timers`` reply body from ``(msg_id, due_ms, topic, partition, size)`` rows."""
    return "".join("%d %s %d %d %d\n" % (i, topic, p, due, size) for i, due, topic, p, size in rows).encode("utf-8")


def parse_rows(body):
    """The inverse of ``format_rows``: ``[(msg_id, topic, partition, due_ms, size)]``."""
    out = []
    for line in body.decode("utf-8").splitlines():
        i, topic, p, due, size = line.split(" ")
        out.append((int(i), topic, int(p), int(due), int(size)))
    return out
