"""Delay levels, the pure part: the levels and the schedule entry a delayed put (``put_delayed``) stores.

**Levels** follow RocketMQ's ``messageDelayLevel``: a space-separated list such
as ``"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"``; each item
is a positive integer followed by one unit, ``s`` (seconds), ``m`` (minutes),
``h`` (hours) or ``d`` (days). Level 1 is the first item. A put asks for a
level: 0 means no delay (as in RocketMQ, where only a level > 0 delays), a level
above the last one counts as the last one (RocketMQ clamps the same way), and a
negative level is refused (RocketMQ silently sends such a message at once; a
negative level is always a mistake, so we say so).

**Schedule entry.** A delayed message first goes to the internal topic
``SCHEDULE_TOPIC`` (RocketMQ's name), partition ``level - 1``, as a record whose
flag is 0 and whose data is ``ENTRY`` + the real topic (UTF-8) + the original
data (attribute block + payload, exactly as put). ``ENTRY`` is the timer ENTRY's
layout (``metaq.timers.records``: ``pack_entry``, ``unpack_entry``) with its own
magic and the level in the kind's byte::

    offset size field
    0      4    magic      ENTRY_MAGIC b"MQDE"
    4      1    version    ENTRY_VERSION (1)
    5      1    level      the level it was scheduled at (1..MAX_LEVELS)
    6      2    topic_len  bytes of the real topic that follow the header
    8      4    partition  the real partition (already chosen: never -1)
    12     4    flag       the real flag (bit 0: data starts with an attribute block)
    16     4    checksum   metaq_checksum of the original data
    20     8    due_ms     delivery time: store time + the level's delay (ms since the epoch)
    28     8    born_ms    when the producer's put was stored (the delivered record's born time)

The delivery time is fixed when the entry is stored, so changing the levels in
the configuration never moves an entry already scheduled.
"""

import re
from typing import NamedTuple

from metaq.errors import ClientError, StoreError
from metaq.protocol.journaltopic import SCHEDULE_TOPIC
from metaq.timers.records import ENTRY, pack_entry, unpack_entry

__all__ = [
    "SCHEDULE_TOPIC",
    "DEFAULT_LEVELS",
    "MAX_LEVELS",
    "UNIT_MS",
    "ENTRY",
    "ScheduleEntry",
    "BadScheduleEntry",
    "parse_levels",
    "format_levels",
    "effective_level",
    "encode_entry",
    "decode_entry",
]

#: The internal topic that holds scheduled messages (one partition per level; ``protocol.journaltopic`` names it
#: beside the broker's other own topics). Producers may not put to it.

#: RocketMQ's default ``messageDelayLevel``.
DEFAULT_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

#: Most levels a configuration may list (each is a partition of SCHEDULE_TOPIC and a greenlet).
MAX_LEVELS = 64

#: Milliseconds per unit letter, as RocketMQ's ``parseDelayLevel`` reads them.
UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

#: Longest delay one level may have (about 1000 days): due times stay far inside int64.
MAX_DELAY_MS = 1000 * 86_400_000

_ITEM = re.compile(r"([0-9]{1,9})([smhd])")

# ENTRY (timers/records.py): magic, version, level, topic_len, partition, flag, checksum, due_ms, born_ms.
ENTRY_MAGIC = b"MQDE"
ENTRY_VERSION = 1


class BadScheduleEntry(StoreError):
    """A record of SCHEDULE_TOPIC that is not a schedule entry (or not one this version reads)."""


class ScheduleEntry(NamedTuple):
    """A decoded schedule entry; ``data`` is the original attribute block + payload."""

    topic: str
    partition: int
    flag: int
    checksum: int
    due_ms: int
    born_ms: int
    level: int
    data: bytes


def parse_levels(text):
    """``"1s 5s 2m"`` → ``(1000, 5000, 120000)``; ValueError with a clear reason for anything else."""
    if not isinstance(text, str):
        raise ValueError("delay levels must be a string such as %r, got %r" % (DEFAULT_LEVELS, text))
    items = text.split()
    if not items:
        raise ValueError("at least one delay level is needed, e.g. %r" % DEFAULT_LEVELS)
    if len(items) > MAX_LEVELS:
        raise ValueError("at most %d delay levels, got %d" % (MAX_LEVELS, len(items)))
    levels = []
    for n, item in enumerate(items, 1):
        m = _ITEM.fullmatch(item)
        if m is None:
            raise ValueError("delay level %d %r: expected a positive number and one unit of s, m, h, d "
                             "(e.g. 10s, 5m, 2h, 1d)" % (n, item))
        ms = int(m.group(1)) * UNIT_MS[m.group(2)]
        if not 0 < ms <= MAX_DELAY_MS:
            raise ValueError("delay level %d %r: must be more than 0 and at most 1000d" % (n, item))
        levels.append(ms)
    return tuple(levels)


def format_levels(levels_ms):
    """The inverse of ``parse_levels`` (largest exact unit per level): ``(1000, 120000)`` → ``"1s 2m"``."""
    out = []
    for ms in levels_ms:
        for unit in ("d", "h", "m", "s"):
            if ms % UNIT_MS[unit] == 0:
                out.append("%d%s" % (ms // UNIT_MS[unit], unit))
                break
        else:
            raise ValueError("%d ms is not a whole number of seconds" % ms)
    return " ".join(out)


def effective_level(level, count):
    """The level a put gets: 0 = no delay, ``count`` for anything above; ClientError when negative."""
    if isinstance(level, bool) or not isinstance(level, int):
        raise ClientError("invalid delay level %r: expected an integer 0..%d" % (level, count))
    if level < 0:
        raise ClientError("invalid delay level %d: use 0 (no delay) or 1..%d (levels above %d count as %d)"
                          % (level, count, count, count))
    return min(level, count)


def encode_entry(topic, partition, flag, checksum, due_ms, born_ms, level, data):
    """The schedule entry's record data: ENTRY, the real topic, the original data."""
    if not 1 <= level <= MAX_LEVELS:
        raise ClientError("delay level %d is outside 1..%d" % (level, MAX_LEVELS))
    return pack_entry(ENTRY_MAGIC, ENTRY_VERSION, level, topic, partition, flag, checksum, due_ms, born_ms, data)


def decode_entry(data):
    """Decode a schedule entry's record data (bytes or memoryview); BadScheduleEntry if it is not one."""
    level, topic, partition, flag, checksum, due_ms, born_ms, body = unpack_entry(
        data, ENTRY_MAGIC, ENTRY_VERSION, BadScheduleEntry, "schedule entry")
    return ScheduleEntry(topic, partition, flag, checksum, due_ms, born_ms, level, body)
