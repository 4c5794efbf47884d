"""MetaQ's message record: the unit of a ``value`` reply body and of MetaQ's log.

A record is a 20-byte header followed by ``data``; every integer is big-endian::

    int32  msgLen     length of data (attribute block, if any, + payload)
    int32  checksum   metaq_checksum(data): CRC-32 of data only, & 0x7FFFFFFF
    int64  msgId
    int32  flag       bit 0 = data starts with an attribute block; other bits preserved
    byte[msgLen] data if flag & 1: int32 attrLen, attrLen bytes of UTF-8, then payload

The attribute block is built by the client (``encode_payload``); the broker
stores a put body as it is and never builds ``data`` itself.
"""

import struct
from array import array
from dataclasses import dataclass

from metaq import speedups
from metaq.errors import RemoteProtocolError
from metaq.protocol.checksum import metaq_checksum

__all__ = [
    "HEADER",
    "ATTRIBUTE_FLAG",
    "Record",
    "encode_payload",
    "decode_payload",
    "decode_attribute",
    "with_attribute",
    "encode_record",
    "iter_records",
]

#: Record header: msgLen (int32), checksum (int32), msgId (int64), flag (int32).
HEADER = struct.Struct(">iiqi")
assert HEADER.size == 20

#: Attribute length prefix inside data: attrLen (int32).
_ATTR_LEN = struct.Struct(">i")
assert _ATTR_LEN.size == 4

#: Flag bit 0: data starts with an attribute block.
ATTRIBUTE_FLAG = 1


def encode_payload(payload, attribute):
    """Build ``(flag, data)`` from a payload and an optional attribute (MetaQ's encodePayload).

    ``attribute`` None gives flag 0 and ``data = payload``; any string, even
    ``""``, sets flag bit 0 and prefixes ``int32 len`` + its UTF-8 bytes.
    """
    if attribute is None:
        return 0, bytes(payload)
    attr = attribute.encode("utf-8")
    return ATTRIBUTE_FLAG, b"".join((_ATTR_LEN.pack(len(attr)), attr, payload))


def decode_payload(flag, data):
    """Split ``data`` into ``(attribute or None, payload)`` according to ``flag``.

    Raises RemoteProtocolError when the attribute block is malformed (its
    length is negative or runs past the end of data). Undecodable attribute
    bytes are replaced with U+FFFD, as Java's ``new String(bytes, "utf-8")`` does.
    """
    attribute, end = decode_attribute(flag, data)
    return attribute, bytes(data[end:])


def decode_attribute(flag, data):
    """``(attribute or None, where the payload starts in data)``: ``decode_payload``'s attribute, read without
    copying the payload; raises as ``decode_payload`` does."""
    if not flag & ATTRIBUTE_FLAG:
        return None, 0
    if len(data) < _ATTR_LEN.size:
        raise RemoteProtocolError("attribute block truncated: data has only %d bytes" % len(data))
    (attr_len,) = _ATTR_LEN.unpack_from(data, 0)
    end = _ATTR_LEN.size + attr_len
    if attr_len < 0 or end > len(data):
        raise RemoteProtocolError(
            "invalid attribute length %d: data holds %d bytes after the length" % (attr_len, len(data) - 4)
        )
    return bytes(data[_ATTR_LEN.size : end]).decode("utf-8", "replace"), end


def with_attribute(data, end, attribute):
    """The pieces of a record's data (with the attribute flag) whose attribute block is ``attribute`` (bytes) and
    whose payload is ``data[end:]``, not copied: ``b"".join`` of them is the data ``encode_payload`` would make."""
    return _ATTR_LEN.pack(len(attribute)), attribute, memoryview(data)[end:]


def encode_record(msg_id, flag, data):
    """The record bytes: 20-byte header (checksum = metaq_checksum(data)) + data."""
    return HEADER.pack(len(data), metaq_checksum(data), msg_id, flag) + bytes(data)


@dataclass(frozen=True)
class Record:
    """One decoded record; ``data`` is the attribute block (if any) + payload."""

    msg_id: int
    flag: int
    data: bytes
    checksum: int

    @property
    def attribute(self):
        """The attribute string, or None when flag bit 0 is clear."""
        return decode_payload(self.flag, self.data)[0]

    @property
    def payload(self):
        """The user data, without the attribute block."""
        return decode_payload(self.flag, self.data)[1]


def iter_records(buf, verify=True):
    """Yield ``(Record, end_position)`` for every whole record in ``buf``.

    Stops silently at a partial final record (fewer than 20 bytes left, or
    fewer than msgLen bytes after the header), as MetaQ's MessageIterator does:
    a ``value`` reply may end in a cut-off record. Raises RemoteProtocolError
    on a negative msgLen and, when ``verify``, on a checksum mismatch.
    While the generator is suspended it holds a view of ``buf``: do not resize
    a bytearray ``buf`` until the iteration has finished or been closed.
    """
    with memoryview(buf) as view:
        size = len(view)
        pos = 0
        while size - pos >= HEADER.size:
            msg_len, checksum, msg_id, flag = HEADER.unpack_from(view, pos)
            if msg_len < 0:
                raise RemoteProtocolError("record at position %d has a negative length %d" % (pos, msg_len))
            start = pos + HEADER.size
            end = start + msg_len
            if end > size:
                return
            data = bytes(view[start:end])
            if verify:
                actual = metaq_checksum(data)
                if actual != checksum:
                    raise RemoteProtocolError(
                        "checksum mismatch in record at position %d: header says %d, data gives %d"
                        % (pos, checksum, actual)
                    )
            yield Record(msg_id, flag, data, checksum), end
            pos = end


def scan_reply_py(buf, verify=True):
    """A ``get`` reply's records in one pass, without a Python object per record: ``(index, count, stop, fault)``.

    ``index`` packs six native int64s per whole record: msg id, flag, the attribute's start and end (-1, -1
    without the attribute flag; -2, -2 for a block ``decode_payload`` refuses) and the payload's start and end,
    all positions in ``buf``. The walk stops where ``iter_records`` stops: at a cut-off final record (``stop`` is
    where it begins), or at a fault it raises for (``fault``: ``("length", pos, msg_len)`` or ``("checksum", pos,
    header's, data's)``; else None). The reference of the C helper's ``scan_reply`` (``raise_fault`` words it)."""
    view = memoryview(buf)
    size, pos, out = len(view), 0, array("q")
    fault = None
    while size - pos >= HEADER.size:
        msg_len, checksum, msg_id, flag = HEADER.unpack_from(view, pos)
        if msg_len < 0:
            fault = ("length", pos, msg_len)
            break
        start = pos + HEADER.size
        end = start + msg_len
        if end > size:
            break
        if verify:
            actual = metaq_checksum(view[start:end])
            if actual != checksum:
                fault = ("checksum", pos, checksum, actual)
                break
        attr_start = attr_end = -1
        payload_start = start
        if flag & ATTRIBUTE_FLAG:
            attr_start = attr_end = -2
            if msg_len >= _ATTR_LEN.size:
                (attr_len,) = _ATTR_LEN.unpack_from(view, start)
                if 0 <= attr_len and attr_len + _ATTR_LEN.size <= msg_len:
                    attr_start, attr_end = start + _ATTR_LEN.size, start + _ATTR_LEN.size + attr_len
                    payload_start = attr_end
        out.extend((msg_id, flag, attr_start, attr_end, payload_start, end))
        pos = end
    return out.tobytes(), len(out) // 6, pos, fault


scan_reply = speedups.load("scan_reply", scan_reply_py)  # the C twin when built


def gather_payloads_py(buf, index, count, base=0):
    """The payloads a ``scan_reply`` index of ``count`` records names, as an Arrow binary column's buffers:
    ``(offsets, data)``, ``offsets`` ``count + 1`` native int32s from ``base`` (each payload's running end), ``data``
    the payloads back to back. ValueError for an index that does not fit ``buf`` or a column past 2 GiB (int32
    offsets). The reference of the C helper's ``gather_payloads`` (the Spark source's value column)."""
    view, q = memoryview(buf), memoryview(index).cast("q")
    if count < 0 or len(q) < 6 * count:
        raise ValueError("gather_payloads: the index holds fewer records than count")
    spans = [(q[6 * k + 4], q[6 * k + 5]) for k in range(count)]
    for k, (s, e) in enumerate(spans):
        if s < 0 or e < s or e > len(view):
            raise ValueError("gather_payloads: record %d's payload %d..%d is outside the %d-byte reply"
                             % (k, s, e, len(view)))
    total = sum(e - s for s, e in spans)
    if base < 0 or base + total > 2**31 - 1:
        raise ValueError("gather_payloads: the column would pass 2 GiB (int32 offsets)")
    offsets, at = array("i", [base]), base
    for s, e in spans:
        at += e - s
        offsets.append(at)
    return offsets.tobytes(), b"".join(view[s:e] for s, e in spans)


gather_payloads = speedups.load("gather_payloads", gather_payloads_py)  # the C twin when built


def raise_fault(fault):
    """Raise for a ``scan_reply`` fault the RemoteProtocolError ``iter_records`` raises there."""
    if fault[0] == "length":
        raise RemoteProtocolError("record at position %d has a negative length %d" % (fault[1], fault[2]))
    raise RemoteProtocolError("checksum mismatch in record at position %d: header says %d, data gives %d"
                              % fault[1:])
