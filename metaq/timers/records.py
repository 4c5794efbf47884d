"""Any delivery time, the pure part: the ``when`` of ``put_at``, and the records of the timer topic.

**When.** ``put_at`` names its delivery time as ``@<epoch ms>`` (absolute) or
``+<ms>`` (after a delay, from the broker's clock). ``parse_when`` turns it into
a due time; a negative, unparseable or too distant one (beyond
``MAX_DELIVER_AHEAD_MS``) is a ClientError. A time in the past means now.

**Records.** A timer message first goes to the internal topic ``TIMER_TOPIC``,
partition 0. The topic's records are the timer store's log (the SQLite index,
``metaq.timers.index``, is derived from them); each record's data starts
with ``HEAD`` (magic ``b"MQTM"``, version 1, kind)::

    ENTRY  (kind 1), a message scheduled; its record's msg_id is the message's id
    offset size field
    0      4    magic      b"MQTM"
    4      1    version    1
    5      1    kind       1
    6      2    topic_len  bytes of the real topic that follow the header
    8      4    partition  the real partition (already chosen: never -1)
    12     4    flag       the real flag (bit 0: data starts with an attribute block)
    16     4    checksum   metaq_checksum of the original data
    20     8    due_ms     delivery time (ms since the epoch)
    28     8    born_ms    when the producer's put was stored
    36     -    topic (UTF-8), then the original data (attribute block + payload)

    OWNED  (kind 4), an ENTRY whose user is known (authentication on): the ENTRY layout, and after the topic the
           owner's length (1 byte, 1..MAX_TX_OWNER_BYTES) and its name (UTF-8), then the original data. The owner
           is what the ``timers`` quota counts (docs/security.md "Quotas"), on a slave and after a rebuild too.

    CANCEL (kind 2): HEAD, then msg_id (8 bytes, signed big-endian): the entry cancelled
    DONE   (kind 3): HEAD, count (4 bytes), then count msg_ids (8 bytes each): delivered in one batch

A delay level's schedule entry (``metaq.timers.levels``) has the ENTRY layout too, its own magic and the level in
the kind's byte: ``pack_entry`` and ``unpack_entry`` are the one codec of both.
"""

import struct
from typing import NamedTuple

from metaq.errors import ClientError, StoreError
from metaq.limits import MAX_NAME_BYTES, MAX_TX_OWNER_BYTES
from metaq.timers.limits import MAX_DELIVER_AHEAD_MS, MAX_TIMER_DONE_IDS
from metaq.protocol.journaltopic import TIMER_TOPIC

__all__ = ["TIMER_TOPIC", "KIND_ENTRY", "KIND_CANCEL", "KIND_DONE", "KIND_OWNED", "HEAD", "ENTRY", "TimerEntry",
           "TimerCancel", "TimerDone", "BadTimerRecord", "owner_field", "TIMER_PROPERTIES", "timer_property",
           "timer_due", "parse_when", "due_from", "pack_entry", "unpack_entry", "encode_entry", "encode_cancel",
           "encode_done", "decode"]

# TIMER_TOPIC: the internal topic of the timer store (one partition; journaltopic.py). Producers may not put to it.

MAGIC = b"MQTM"
VERSION = 1
KIND_ENTRY, KIND_CANCEL, KIND_DONE, KIND_OWNED = 1, 2, 3, 4

#: magic, version, kind.
HEAD = struct.Struct(">4sBB")
#: magic, version, kind (a schedule entry: its level), topic_len, partition, flag, checksum, due_ms, born_ms.
ENTRY = struct.Struct(">4sBBHiiiqq")
assert ENTRY.size == 36
_ID = struct.Struct(">q")
_COUNT = struct.Struct(">I")

#: Longest ``when`` token: ``@`` + 19 digits.
MAX_WHEN_CHARS = 20


class BadTimerRecord(StoreError):
    """A record of TIMER_TOPIC that is not a timer record (or not one this version reads)."""


class TimerEntry(NamedTuple):
    topic: str
    partition: int
    flag: int
    checksum: int
    due_ms: int
    born_ms: int
    data: bytes
    owner: str = None


class TimerCancel(NamedTuple):
    msg_id: int


class TimerDone(NamedTuple):
    msg_ids: tuple


def due_from(deliver_at_ms=None, delay_ms=None, now_ms=0):
    """The due time of a message asked for at ``deliver_at_ms`` (absolute) or after ``delay_ms``; ClientError for
    a negative value, both or neither, or a time more than MAX_DELIVER_AHEAD_MS ahead. Past: ``now_ms``."""
    if (deliver_at_ms is None) == (delay_ms is None):
        raise ClientError("give exactly one of a delivery time and a delay")
    value = deliver_at_ms if delay_ms is None else delay_ms
    what = "delivery time" if delay_ms is None else "delay"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClientError("invalid %s %r: expected a whole number of milliseconds" % (what, value))
    if value < 0:
        raise ClientError("invalid %s %d: must not be negative" % (what, value))
    due = value if delay_ms is None else now_ms + value
    if due - now_ms > MAX_DELIVER_AHEAD_MS:
        raise ClientError("%s %d is more than %d days ahead (the limit)" % (what, value,
                                                                          MAX_DELIVER_AHEAD_MS // 86_400_000))
    return max(due, now_ms)


def parse_when(token, now_ms):
    """``@<epoch ms>`` or ``+<ms>`` (str or bytes) → the due time in ms; ClientError with the reason otherwise."""
    if isinstance(token, (bytes, bytearray)):
        token = bytes(token).decode("ascii", "replace")
    if not isinstance(token, str) or not 2 <= len(token) <= MAX_WHEN_CHARS or token[0] not in "@+" \
            or not token[1:].isdigit() or not token[1:].isascii():
        raise ClientError("invalid delivery time %r: expected @<epoch ms> or +<delay ms>" % (token,))
    value = int(token[1:])
    if token[0] == "@":
        return due_from(deliver_at_ms=value, now_ms=now_ms)
    return due_from(delay_ms=value, now_ms=now_ms)


#: RocketMQ 5's message properties asking for a delivery time (absolute ms; a delay in seconds; in ms).
TIMER_PROPERTIES = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")


def timer_property(props):
    """``(name, value)`` of the one RocketMQ 5 timer property in ``props`` (a dict), or None; ClientError for two
    of them or a value that is not a whole number >= 0."""
    given = [(k, props[k]) for k in TIMER_PROPERTIES if props.get(k) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ClientError("a message may have one of %s, not %s" % (", ".join(TIMER_PROPERTIES),
                                                                   " and ".join(k for k, _v in given)))
    name, text = given[0]
    text = text.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 19):
        raise ClientError("property %s=%r is not a whole number >= 0" % (name, text[:32]))
    return name, int(text)


def timer_due(prop, now_ms):
    """The due time a ``timer_property`` result asks for; ClientError as ``due_from``."""
    name, value = prop
    if name == "TIMER_DELIVER_MS":
        return due_from(deliver_at_ms=value, now_ms=now_ms)
    return due_from(delay_ms=value * 1000 if name == "TIMER_DELAY_SEC" else value, now_ms=now_ms)


def pack_entry(magic, version, tag, topic, partition, flag, checksum, due_ms, born_ms, data):
    """An entry's record data, a timer's or a delay level's: the ``ENTRY`` header (``tag``: the kind, or the
    level), the real topic, the original data. ClientError for a topic of no or too many bytes."""
    topic_bytes = topic.encode("utf-8")
    if not 0 < len(topic_bytes) <= MAX_NAME_BYTES:
        raise ClientError("topic name must be 1..%d bytes, got %d" % (MAX_NAME_BYTES, len(topic_bytes)))
    head = ENTRY.pack(magic, version, tag, len(topic_bytes), partition, flag, checksum, due_ms, born_ms)
    return b"".join((head, topic_bytes, data))


def unpack_entry(data, magic, version, bad, what):
    """``(tag, topic, partition, flag, checksum, due_ms, born_ms, original data)`` of an entry's record data (bytes or
    memoryview); ``bad`` (an exception class) raised, its message naming ``what``, for data shorter than the header,
    another magic or version, or a topic length that does not fit."""
    if len(data) < ENTRY.size:
        raise bad("%s of %d bytes is shorter than its %d-byte header" % (what, len(data), ENTRY.size))
    m, v, tag, tlen, partition, flag, checksum, due_ms, born_ms = ENTRY.unpack_from(data, 0)
    if m != magic or v != version:
        raise bad("not a %s (magic %r, version %d)" % (what, bytes(m), v))
    end = ENTRY.size + tlen
    if tlen == 0 or end > len(data):
        raise bad("%s topic length %d does not fit in %d bytes" % (what, tlen, len(data)))
    topic = bytes(data[ENTRY.size:end]).decode("utf-8", "replace")
    return tag, topic, partition, flag, checksum, due_ms, born_ms, bytes(data[end:])


def owner_field(owner):
    """The bytes an OWNED entry holds after its topic for ``owner`` (a user name); ValueError past
    MAX_TX_OWNER_BYTES or for an empty one (the permissions file's names are shorter)."""
    raw = owner.encode("utf-8")
    if not 0 < len(raw) <= MAX_TX_OWNER_BYTES:
        raise ValueError("a timer's owner is 1..%d bytes, got %d" % (MAX_TX_OWNER_BYTES, len(raw)))
    return bytes((len(raw),)) + raw


def encode_entry(topic, partition, flag, checksum, due_ms, born_ms, data, owner=None):
    """An ENTRY record's data; with ``owner`` (a user name) an OWNED one."""
    if owner is None:
        return pack_entry(MAGIC, VERSION, KIND_ENTRY, topic, partition, flag, checksum, due_ms, born_ms, data)
    return pack_entry(MAGIC, VERSION, KIND_OWNED, topic, partition, flag, checksum, due_ms, born_ms,
                      owner_field(owner) + bytes(data))


def encode_cancel(msg_id):
    return HEAD.pack(MAGIC, VERSION, KIND_CANCEL) + _ID.pack(msg_id)


def encode_done(msg_ids):
    ids = list(msg_ids)
    if not 0 < len(ids) <= MAX_TIMER_DONE_IDS:
        raise ValueError("a DONE record lists 1..%d ids, got %d" % (MAX_TIMER_DONE_IDS, len(ids)))
    return b"".join([HEAD.pack(MAGIC, VERSION, KIND_DONE), _COUNT.pack(len(ids))] + [_ID.pack(i) for i in ids])


def decode(data):
    """A TIMER_TOPIC record's data (bytes or memoryview) → TimerEntry, TimerCancel or TimerDone; BadTimerRecord."""
    if len(data) < HEAD.size:
        raise BadTimerRecord("timer record of %d bytes is shorter than its header" % len(data))
    magic, version, kind = HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        raise BadTimerRecord("not a timer record (magic %r, version %d)" % (bytes(magic), version))
    if kind == KIND_ENTRY:
        return TimerEntry(*unpack_entry(data, MAGIC, VERSION, BadTimerRecord, "timer entry")[1:])
    if kind == KIND_OWNED:
        fields = unpack_entry(data, MAGIC, VERSION, BadTimerRecord, "timer entry")
        rest = fields[7]
        if not rest or not 0 < rest[0] <= min(MAX_TX_OWNER_BYTES, len(rest) - 1):
            raise BadTimerRecord("timer entry's owner length %d does not fit in %d bytes"
                                 % (rest[0] if rest else 0, len(rest)))
        owner = rest[1:1 + rest[0]].decode("utf-8", "replace")
        return TimerEntry(*fields[1:7], rest[1 + rest[0]:], owner)
    if kind == KIND_CANCEL:
        if len(data) != HEAD.size + _ID.size:
            raise BadTimerRecord("timer cancel record of %d bytes" % len(data))
        return TimerCancel(_ID.unpack_from(data, HEAD.size)[0])
    if kind == KIND_DONE:
        if len(data) < HEAD.size + _COUNT.size:
            raise BadTimerRecord("timer done record of %d bytes" % len(data))
        (count,) = _COUNT.unpack_from(data, HEAD.size)
        start = HEAD.size + _COUNT.size
        if count > MAX_TIMER_DONE_IDS or len(data) != start + count * _ID.size:
            raise BadTimerRecord("timer done record of %d bytes does not hold %d ids" % (len(data), count))
        return TimerDone(tuple(_ID.unpack_from(data, start + i * _ID.size)[0] for i in range(count)))
    raise BadTimerRecord("unknown timer record kind %d" % kind)
