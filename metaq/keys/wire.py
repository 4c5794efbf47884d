"""The text ``lookup`` command (our extension; docs/messaging.md "Key index"): its parser, serializer and
registration (``metaq.textcommands`` lists this module, so the registry is complete), and its reply's body, sans-IO.

::

    body  = "<cursor or -> <indexed_to>\\n" item*
    item  = ITEM (partition int32, offset int64, position int64, store time int64) + MetaQ form
    MetaQ form = msgLen int32, checksum int32, msgId int64, flag int32, data (attribute block + payload)

Big-endian, as every MetaQ form. The cursor is ``-`` on the last page.
"""

import struct
from typing import NamedTuple, Optional

from metaq.keys import limits as keys_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.commands import NEEDS_SUBSCRIBER, TextCommand, register, token
from metaq.protocol.events import Lookup
from metaq.protocol.integers import INT32_MAX, INT32_MIN, INT64_MAX, TokenError, parse_int
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


def _parse_lookup(t):
    if len(t[2].encode("utf-8")) > keys_limits.MAX_KEY_BYTES or len(t[6]) > keys_limits.MAX_KEY_CURSOR_BYTES:
        raise TokenError("lookup: a key is 1..%d bytes, a cursor at most %d" % (keys_limits.MAX_KEY_BYTES,
                                                                               keys_limits.MAX_KEY_CURSOR_BYTES))
    return Lookup(t[1], t[2], parse_int(t[3], "since", 0, INT64_MAX), parse_int(t[4], "until", 0, INT64_MAX),
                  parse_int(t[5], "max", 1, INT32_MAX), "" if t[6] == "-" else t[6],
                  parse_int(t[7], "opaque", INT32_MIN, INT32_MAX))


def _serialize_lookup(e):
    return ("lookup %s %s %d %d %d %s %d\r\n" % (token(e.topic), token(e.key), e.since_ms, e.until_ms, e.max_count,
                                                 token(e.cursor or "-"), e.opaque)).encode("utf-8")


register(TextCommand(
    "lookup", Lookup, (8,), "8 tokens (lookup <topic> <key> <sinceMs> <untilMs> <max> <cursor|-> <opaque>)",
    _parse_lookup, _serialize_lookup, NEEDS_SUBSCRIBER,
    examples=(b"lookup t k1 0 99 10 - 1\r\n", b"lookup t k1 0 99 10 3:4 1\r\n")))
