"""Replay from a time: a time turned into an offset with the broker's ``offset_at`` (docs/python-client.md "Replay from
a time").

Times are milliseconds since the Unix epoch, or datetimes: an aware datetime is taken in its own zone; a naive one
is local time, as Python's own ``datetime.timestamp()`` takes it (so ``datetime.now() - timedelta(hours=1)``
means an hour ago). ``offset_at`` answers the first offset whose message the broker *stored* at or after that
time (the broker's clock: the ``timestamp`` column of the Spark source, the time inside a message id); a time
after the last message answers the partition's end, one before the first kept message the first kept offset.
"""

import threading
from datetime import datetime

from metaq import errors
from metaq.client.replies import reply_error
from metaq.protocol import events as ev

__all__ = ["to_timestamp_ms", "check_offset", "start_from_time", "offset_at", "ReplayStart", "START_WORDS"]

#: ``start_from`` values that name an end of the partition (used only when no offset is stored).
START_WORDS = ("earliest", "latest")
#: ms since the epoch must fit the protocol's timestamp field (a signed 64-bit integer, >= 0).
MAX_TIMESTAMP_MS = 2**63 - 1


def to_timestamp_ms(when):
    """``when`` (a datetime, or an int of ms since the Unix epoch) as ms since the Unix epoch; ValueError for
    anything else, a negative time or one past the protocol's range. A naive datetime is local time."""
    if isinstance(when, datetime):
        try:
            ms = int(round(when.timestamp() * 1000))
        except (OverflowError, OSError, ValueError) as exc:
            raise ValueError("cannot turn %r into a time: %s" % (when, exc)) from None
    elif isinstance(when, int) and not isinstance(when, bool):
        ms = when
    else:
        raise ValueError("a time must be a datetime or an int of milliseconds since the Unix epoch, got %r"
                         % (when,))
    if not 0 <= ms <= MAX_TIMESTAMP_MS:
        raise ValueError("a time must be at or after the Unix epoch (1970-01-01T00:00:00Z), got %r" % (when,))
    return ms


def check_offset(offset):
    """``offset`` if it is an int >= 0 (an offset to seek to), else ValueError."""
    if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
        return offset
    raise ValueError("seek: give an offset (an int >= 0) or a time (a datetime), got %r" % (offset,))


def start_from_time(start_from):
    """A consumer's ``start_from``: None for ``"earliest"``/``"latest"``, else the time in ms (ValueError)."""
    if isinstance(start_from, str):
        if start_from in START_WORDS:
            return None
        raise ValueError("start_from must be 'earliest', 'latest', a datetime or ms since the Unix epoch, got %r"
                         % (start_from,))
    return to_timestamp_ms(start_from)


def offset_at(conn, topic, partition, timestamp_ms, timeout=10.0):
    """The first offset of ``partition`` (its number on the broker of ``conn``, a ``BrokerConnection``) stored at or
    after ``timestamp_ms``; the broker's refusal as its error (``metaq.client.replies``)."""
    reply = conn.call(ev.OffsetAt(topic, partition, timestamp_ms, 0), timeout=timeout)
    if not isinstance(reply, ev.Result) or reply.code != 200:
        raise reply_error(reply, "offset_at %s %d %d" % (topic, partition, timestamp_ms))
    try:
        return int(reply.body)
    except ValueError:
        raise errors.BrokerError("offset_at %s %d: not an offset: %r" % (topic, partition, reply.body)) from None


class ReplayStart:
    """A consumer's ``start_from`` time: each partition it is given, the first time in its life, starts at the
    first offset stored at or after that time, whatever the group committed; later assignments of the same
    partition (after a rebalance took it away and gave it back) start from the committed offset as usual."""

    def __init__(self, timestamp_ms):
        self.timestamp_ms = timestamp_ms
        self._done = set()  # (topic, Partition) already positioned at the time
        self._lock = threading.Lock()

    def wanted(self, key):
        """True while ``key`` has not been positioned at the time yet."""
        with self._lock:
            return key not in self._done

    def done(self, key):
        with self._lock:
            self._done.add(key)
