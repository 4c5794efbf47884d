"""The body of a text ``lookup`` reply (our extension; docs/messaging.md "Key index"), sans-IO.

::

    body  = "<cursor or -> <indexed_to>\\n" item*
    item  = ITEM (partition int32, offset int64, position int64, store time int64) + MetaQ form
    MetaQ form = msgLen int32, checksum int32, msgId int64, flag int32, data (attribute block + payload)

Big-endian, as every MetaQ form. The cursor is ``-`` on the last page.
"""

import struct
from typing import NamedTuple, Optional

from metaq.errors import RemoteProtocolError
from metaq.protocol.message import HEADER

ITEM = struct.Struct(">iqqq")


class LookupItem(NamedTuple):
    partition: int
    offset: int
    position: int
    store_ms: int
    msg_id: int
    flag: int
    data: bytes
    checksum: int


class LookupPage(NamedTuple):
    cursor: Optional[str]
    indexed_to: int
    items: list


def encode_lookup_body(cursor, indexed_to, items):
    """``items``: ``(partition, offset, position, store_ms, msg_id, flag, data, checksum)``."""
    out = [b"%s %d\n" % ((cursor or "-").encode("ascii"), indexed_to)]
    for part, off, pos, ts, msg_id, flag, data, checksum in items:
        out.append(ITEM.pack(part, off, pos, ts) + HEADER.pack(len(data), checksum, msg_id, flag))
        out.append(data)
    return b"".join(out)


def decode_lookup_body(body):
    """A ``LookupPage``; RemoteProtocolError when the body is not one."""
    head, sep, rest = bytes(body).partition(b"\n")
    try:
        cursor, indexed_to = head.decode("ascii").split(" ")
        indexed_to = int(indexed_to)
    except ValueError:
        raise RemoteProtocolError("lookup reply: bad first line %r" % head[:80]) from None
    items, pos = [], 0
    while pos < len(rest):
        if len(rest) - pos < ITEM.size + HEADER.size:
            raise RemoteProtocolError("lookup reply: a truncated item")
        part, off, position, ts = ITEM.unpack_from(rest, pos)
        n, chk, msg_id, flag = HEADER.unpack_from(rest, pos + ITEM.size)
        start = pos + ITEM.size + HEADER.size
        if n < 0 or start + n > len(rest):
            raise RemoteProtocolError("lookup reply: an item's data runs past the body")
        items.append(LookupItem(part, off, position, ts, msg_id, flag, rest[start:start + n], chk))
        pos = start + n
    return LookupPage(None if cursor == "-" else cursor, indexed_to, items)
