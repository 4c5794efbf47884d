"""A receive buffer's run of plain ``put_at`` frames found, checked and encoded in one pass (the burst path of
docs/messaging.md "Any delivery time"; the server's part is ``metaq.timers.fasttext``).

``scan_put_ats`` takes the ``put_at`` frames at the head of a buffer that the burst path may store without the
general path: ``put_at <topic> <partition> <len> 0 <checksum> @<epoch ms>|+<delay ms> <opaque>\\r\\n<body>`` with
flag 0, a checksum that is ``-1`` or the body's, a topic of at most ``MAX_NAME_BYTES`` and a delivery time the general
path accepts (``timers.records.due_from``: at most ``MAX_DELIVER_AHEAD_MS`` ahead; a past time is now). It stops at
the first frame that is anything else (that frame and the rest go to the general path, which answers them as always)
and encodes each frame taken as its ENTRY record (``encode_entry``), all of them end to end in one buffer, with the
frame ``MessageStore.put_burst`` takes for it. The C helper's ``scan_put_ats`` is its twin (tested equal); pure:
the time comes in as ``now_ms``.
"""

import re

from metaq import speedups
from metaq.limits import MAX_NAME_BYTES
from metaq.timers.limits import MAX_DELIVER_AHEAD_MS
from metaq.protocol.checksum import crc32
from metaq.timers.records import ENTRY, KIND_ENTRY, KIND_OWNED, MAGIC, VERSION, owner_field

#: One plain ``put_at`` line: topic, partition, length, flag 0, checksum, when, opaque.
_LINE = re.compile(rb"put_at ([\x21-\x7e]{1,255}) (\d{1,10}) (\d{1,10}) 0 (-1|\d{1,10}) ([@+]\d{1,19}) "
                   rb"(-?\d{1,10})\r\n")
_INT32 = 2 ** 31
_new_tuple = tuple.__new__


def scan_put_ats_py(buf, pos, end, max_body, max_frames, now_ms, timer_topic, entry_type, owner=None):
    """``(items, src, next_pos)`` for the plain ``put_at`` frames at ``buf[pos:end]`` (at most ``max_frames``);
    ``owner`` (the connection's user, or None): each record an OWNED entry naming it.

    Each item is ``(topic, partition, opaque, frame end, body length, burst frame, entry)``: ``topic`` a str, the
    burst frame ``(timer_topic, 0, 0, opaque, start in src, ENTRY record data length, its CRC-32)`` as
    ``put_burst`` takes it, ``entry`` the record's ``(topic, partition, 0, checksum, due_ms, now_ms, body, owner)``
    as ``tuple.__new__(entry_type, ...)`` makes it: ``entry_type`` is tuple or a NamedTuple of those eight fields
    (TimerEntry), whose instances the C twin makes without calling anything of it (TypeError for any other type).
    ``src``: the ENTRY records' data, end to end.
    """
    items, src, at = [], [], 0
    kind, ofield = (KIND_ENTRY, b"") if owner is None else (KIND_OWNED, owner_field(owner))
    while pos < end and len(items) < max_frames:
        m = _LINE.match(buf, pos, end)
        if m is None:
            break
        topic_b, part_b, len_b, checksum_b, when_b, opaque_b = m.groups()
        partition, length, checksum, opaque = int(part_b), int(len_b), int(checksum_b), int(opaque_b)
        body_start = m.end()
        body_end = body_start + length
        if partition >= _INT32 or checksum >= _INT32 or not -_INT32 <= opaque < _INT32 or length > max_body \
                or body_end > end or len(topic_b) > MAX_NAME_BYTES:
            break
        body = bytes(buf[body_start:body_end])
        computed = crc32(body) & 0x7FFFFFFF
        if checksum != -1 and checksum != computed:
            break
        value = int(when_b[1:])
        due = value if when_b[:1] == b"@" else now_ms + value
        if due - now_ms > MAX_DELIVER_AHEAD_MS:
            break
        due = max(due, now_ms)
        topic = topic_b.decode("ascii")
        entry = b"".join((ENTRY.pack(MAGIC, VERSION, kind, len(topic_b), partition, 0, computed, due, now_ms),
                          topic_b, ofield, body))
        items.append((topic, partition, opaque, body_end, length, (timer_topic, 0, 0, opaque, at, len(entry),
                                                                   crc32(entry)),
                       _new_tuple(entry_type, (topic, partition, 0, computed, due, now_ms, body, owner))))
        src.append(entry)
        at += len(entry)
        pos = body_end
    return items, b"".join(src), pos


def _c_twin():
    fn = speedups.load("scan_put_ats", None)
    if fn is None:
        return scan_put_ats_py

    def scan_put_ats_c(buf, pos, end, max_body, max_frames, now_ms, timer_topic, entry_type, owner=None):
        return fn(buf, pos, end, max_body, max_frames, now_ms, timer_topic, entry_type, MAX_NAME_BYTES,
                  MAX_DELIVER_AHEAD_MS, b"" if owner is None else owner_field(owner), owner)
    return scan_put_ats_c


scan_put_ats = _c_twin()  # the C twin when built


def encode_timer_acks_py(items, start, count, first_id):
    """The ``result 200`` replies, joined, of ``items[start:start + count]`` (``scan_put_ats``'s) stored as
    consecutive messages from ``first_id`` on: ``result 200 <len> <opaque>\\r\\n<msgId> <partition> -1`` each, byte
    for byte the general path's answer to a put_at. Its domain is ``scan_put_ats``'s items (partition and opaque
    ints) and ids within int64; the C twin refuses anything else (TypeError, IndexError, OverflowError)."""
    out = []
    for k in range(count):
        item = items[start + k]
        body = b"%d %d -1" % (first_id + k, item[1])
        out.append(b"result 200 %d %d\r\n%s" % (len(body), item[2], body))
    return b"".join(out)


encode_timer_acks = speedups.load("encode_timer_acks", encode_timer_acks_py)  # the C twin when built
