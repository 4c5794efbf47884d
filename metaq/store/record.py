"""The commit-log record: self-describing, big-endian, with MetaQ's record as its suffix.

Layout (``PREFIX`` then topic then MetaQ's 20-byte ``HEADER`` and data)::

    offset size  field
    0      4     total_size    whole record, bytes
    4      4     magic         MESSAGE_MAGIC (BLANK_MAGIC: blank segment tail, total_size = bytes left)
    8      4     crc           CRC-32 (unsigned) of bytes [12, total_size)
    12     4     partition
    16     8     queue_offset  the partition's sequence number
    24     8     store_ts_ms
    32     8     born_ts_ms
    40     2     topic_len
    42     n     topic         UTF-8
    --- MetaQ form (what a get sends, straight from the map) ---
    42+n   4     msgLen
    46+n   4     checksum      metaq_checksum(data)
    50+n   8     msgId
    58+n   4     flag
    62+n   m     data          attribute block (if flag & 1) + payload, exactly as put

A record never straddles two segments. A blank marker is ``total_size, BLANK_MAGIC``
(8 bytes) and fills the rest of its segment; fewer than 8 bytes left are left zero.
"""

import struct
from dataclasses import dataclass

from metaq import speedups
from metaq.errors import ClientError
from metaq.protocol.checksum import crc32, metaq_checksum
from metaq.protocol.message import HEADER
from metaq.protocol.tags import SEPARATOR, tag_code

#: total_size, magic, crc, partition, queue_offset, store_ts_ms, born_ts_ms, topic_len.
PREFIX = struct.Struct(">iIIiqqqh")
assert PREFIX.size == 42

#: total_size, magic: the start of every record and of a blank marker.
MARKER = struct.Struct(">iI")
assert MARKER.size == 8

#: the crc field alone, written after the rest of the record is in place.
CRC_FIELD = struct.Struct(">I")
assert CRC_FIELD.size == 4

#: attribute length at the start of data when flag & 1.
ATTR_LEN = struct.Struct(">i")
assert ATTR_LEN.size == 4

assert HEADER.size == 20

MESSAGE_MAGIC = 0xDA7A4D51
BLANK_MAGIC = 0xB1A4C0DE
MAGIC_BYTES = MARKER.pack(0, MESSAGE_MAGIC)[4:]
CRC_START = 12
TOPIC_START = PREFIX.size
#: bytes of a record besides topic and data.
FIXED_OVERHEAD = PREFIX.size + HEADER.size
#: smallest possible record: a 1-byte topic and empty data.
MIN_RECORD = FIXED_OVERHEAD + 1
ATTRIBUTE_FLAG = 1


class RecordTooLarge(ClientError):
    """The record cannot fit in one commit-log segment."""


def record_size(topic_len, data_len):
    return FIXED_OVERHEAD + topic_len + data_len


def metaq_offset(topic_len):
    """Where the MetaQ form starts inside a record with a ``topic_len``-byte topic."""
    return PREFIX.size + topic_len


def record_tags(flag, data):
    """The tags of a record's data (``protocol.tags``: its attribute before the first ``\\x02``) as bytes;
    ``b""`` when there is no (well-formed) attribute."""
    if not flag & ATTRIBUTE_FLAG or len(data) < 4:
        return b""
    (n,) = ATTR_LEN.unpack_from(data, 0)
    if n < 0 or n + 4 > len(data):
        return b""
    if not isinstance(data, bytes):
        data = bytes(data[:4 + n])
    i = data.find(SEPARATOR, 4, 4 + n)
    return data[4:4 + n if i < 0 else i]


def tag_hash(flag, data):
    """The index unit's tag hash of a record's data: ``protocol.tags.tag_code`` of its tags (0 without)."""
    return tag_code(record_tags(flag, data))


_HEADS = {}


def head_struct(topic_len):
    """The whole record head (PREFIX, topic, HEADER) as one Struct, cached per topic length."""
    st = _HEADS.get(topic_len)
    if st is None:
        st = _HEADS[topic_len] = struct.Struct(">iIIiqqqh%dsiiqi" % topic_len)
        assert st.size == FIXED_OVERHEAD + topic_len
    return st


def write_record(buf, pos, topic_bytes, partition, queue_offset, store_ms, born_ms, msg_id, flag, data,
                 head=None, checksum=None):
    """Write a whole record into ``buf`` (a writable memoryview of a map) at ``pos``; returns its size.

    ``head`` is ``head_struct(len(topic_bytes))`` (callers on the hot path pass it).
    ``checksum`` is ``metaq_checksum(data)`` if the caller already has it (None or negative: computed).
    """
    if head is None:
        head = head_struct(len(topic_bytes))
    if checksum is None or checksum < 0:
        checksum = metaq_checksum(data)
    n = len(data)
    start = pos + head.size
    end = start + n
    head.pack_into(buf, pos, end - pos, MESSAGE_MAGIC, 0, partition, queue_offset, store_ms, born_ms,
                   len(topic_bytes), topic_bytes, n, checksum, msg_id, flag)
    buf[start:end] = data
    CRC_FIELD.pack_into(buf, pos + 8, crc32(buf[pos + CRC_START:end]))
    return end - pos


def encode_record(topic, partition, queue_offset, store_ms, born_ms, msg_id, flag, data):
    """The record as bytes (for tests and tools)."""
    topic_bytes = topic.encode("utf-8")
    buf = bytearray(record_size(len(topic_bytes), len(data)))
    write_record(memoryview(buf), 0, topic_bytes, partition, queue_offset, store_ms, born_ms, msg_id, flag, data)
    return bytes(buf)


@dataclass(frozen=True)
class LogRecord:
    """One decoded commit-log record (``data`` = attribute block + payload)."""

    position: int
    total_size: int
    topic: str
    partition: int
    queue_offset: int
    store_ts_ms: int
    born_ts_ms: int
    msg_id: int
    flag: int
    data: bytes

    @property
    def tag_hash(self):
        return tag_hash(self.flag, self.data)


def check_record(buf, pos, limit):
    """Total size of a valid record at ``pos`` (ending by ``limit``), else 0.

    Valid = MESSAGE_MAGIC, a size within bounds, a consistent topic length and
    msgLen, and a matching CRC.
    """
    if limit - pos < MIN_RECORD:
        return 0
    total, magic = MARKER.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC or total < MIN_RECORD or total > limit - pos:
        return 0
    (tlen,) = struct.unpack_from(">h", buf, pos + 40)
    if tlen < 1 or FIXED_OVERHEAD + tlen > total:
        return 0
    (msg_len,) = struct.unpack_from(">i", buf, pos + TOPIC_START + tlen)
    if FIXED_OVERHEAD + tlen + msg_len != total:
        return 0
    (crc,) = CRC_FIELD.unpack_from(buf, pos + 8)
    if crc32(memoryview(buf)[pos + CRC_START:pos + total]) != crc:
        return 0
    return total


def record_ok_py(buf, pos, size):
    """True when a valid record (``check_record``) of exactly ``size`` bytes starts at ``pos`` of ``buf``."""
    if pos < 0 or size <= 0 or pos > len(buf) or size > len(buf) - pos:
        return False
    return check_record(buf, pos, pos + size) == size


record_ok = speedups.load("record_ok", record_ok_py)  # the C twin when built: one call per record

_OWNER = struct.Struct(">iq")  # partition, queue_offset at byte 12 of a record


def record_is(buf, pos, size, topic_bytes, partition, offset):
    """True when the record at ``pos`` (``size`` bytes, checked by ``record_ok``) is record ``offset`` of
    ``partition`` of the topic ``topic_bytes``: what the index unit that led there says. A damaged unit that points
    at another whole record (another topic's, another offset's) passes ``record_ok``; this refuses it."""
    tlen = len(topic_bytes)
    if TOPIC_START + tlen > size:
        return False
    if _OWNER.unpack_from(buf, pos + 12) != (partition, offset):
        return False
    (have,) = struct.unpack_from(">h", buf, pos + 40)
    return have == tlen and buf[pos + TOPIC_START:pos + TOPIC_START + tlen] == topic_bytes


def scan_records_py(buf, pos, end):
    """``(stop, count)``: where the run of valid records (``check_record``) from ``pos`` stops — ``end`` when
    every record up to it is valid, else the position of the first that is not (or of what follows the last
    whole one) — and how many records the run holds."""
    end = min(end, len(buf))
    if pos < 0:
        return end, 0
    count = 0
    while end - pos >= MIN_RECORD:
        total = check_record(buf, pos, end)
        if not total:
            break
        pos += total
        count += 1
    return pos, count


scan_records = speedups.load("scan_records", scan_records_py)  # the C twin when built: the run in one call


def decode_record(buf, pos, position=None):
    """Decode the (already checked) record at ``pos`` of ``buf``."""
    total, _m, _c, part, qoff, sts, bts, tlen = PREFIX.unpack_from(buf, pos)
    p = pos + TOPIC_START
    topic = bytes(buf[p:p + tlen]).decode("utf-8", "replace")
    msg_len, _chk, msg_id, flag = HEADER.unpack_from(buf, p + tlen)
    d = p + tlen + HEADER.size
    return LogRecord(pos if position is None else position, total, topic, part, qoff, sts, bts,
                     msg_id, flag, bytes(buf[d:d + msg_len]))
