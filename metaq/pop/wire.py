"""The text commands of per-message acknowledgement (docs/text-protocol.md, docs/messaging.md "Per-message
acknowledgement (POP)"): their events, parsers, serializers and registration (``metaq.textcommands`` lists this
module, so the registry is complete), and the receive reply's body, sans-IO.

::

    receive <topic> <group> <max> <invisibleMs> normal|fifo [<maxWaitMs>] <opaque>
        -> result 200 <len> <opaque>, body = item*
    ack <topic> <group> <handle>[,<handle>...] <opaque>
        -> result 200 <len> <opaque>, body = one line per handle: "ok" or "error <reason>"
    change_invisible <topic> <group> <handle> <invisibleMs> <opaque>
        -> result 200 <len> <opaque>, body = the new handle

    item = ITEM (partition int32, offset int64, attempt int32, deadline ms int64, handle length int16), the handle,
           then the MetaQ form (msgLen int32, checksum int32, msgId int64, flag int32, data)

Big-endian, as every MetaQ form. Each needs the user to consume as the group and subscribe to the topic, as a
``get`` with a group does.
"""

import struct
from typing import NamedTuple

from metaq.pop import limits as pop_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.commands import NEEDS_GROUP_MEMBER, TextCommand, register, token
from metaq.protocol.integers import INT32_MAX, INT32_MIN, TokenError, parse_int
from metaq.protocol.message import HEADER

ITEM = struct.Struct(">iqiqh")
MODES = ("normal", "fifo")


class Receive(NamedTuple):
    topic: str
    group: str
    max_messages: int
    invisible_ms: int
    fifo: bool
    opaque: int
    max_wait_ms: int = 0


class Ack(NamedTuple):
    topic: str
    group: str
    handles: tuple
    opaque: int


class ChangeInvisible(NamedTuple):
    topic: str
    group: str
    handle: str
    invisible_ms: int
    opaque: int


class ReceivedItem(NamedTuple):
    partition: int
    offset: int
    attempt: int
    deadline_ms: int
    handle: str
    msg_id: int
    flag: int
    data: bytes
    checksum: int


EVENTS = (Receive, Ack, ChangeInvisible)


def encode_received(items):
    """``items``: ``(partition, offset, attempt, deadline_ms, handle, msg_id, flag, data, checksum)``."""
    out = []
    for part, off, attempt, deadline, handle, msg_id, flag, data, checksum in items:
        h = handle.encode("ascii")
        out.append(ITEM.pack(part, off, attempt, deadline, len(h)) + h + HEADER.pack(len(data), checksum, msg_id,
                                                                                     flag))
        out.append(data)
    return b"".join(out)


def decode_received(body):
    """The ``ReceivedItem`` list of a receive's reply body; RemoteProtocolError when it is not one."""
    body = bytes(body)
    items, pos = [], 0
    while pos < len(body):
        if len(body) - pos < ITEM.size:
            raise RemoteProtocolError("receive reply: a truncated item")
        part, off, attempt, deadline, hlen = ITEM.unpack_from(body, pos)
        pos += ITEM.size
        if hlen < 0 or len(body) - pos < hlen + HEADER.size:
            raise RemoteProtocolError("receive reply: a truncated item")
        handle = body[pos:pos + hlen].decode("ascii", "replace")
        pos += hlen
        n, chk, msg_id, flag = HEADER.unpack_from(body, pos)
        pos += HEADER.size
        if n < 0 or pos + n > len(body):
            raise RemoteProtocolError("receive reply: an item's data runs past the body")
        items.append(ReceivedItem(part, off, attempt, deadline, handle, msg_id, flag, body[pos:pos + n], chk))
        pos += n
    return items


def encode_ack_body(results):
    """``results``: per handle None (acknowledged) or the reason it was refused."""
    return b"".join(b"ok\n" if r is None else ("error %s\n" % str(r).replace("\n", " ")).encode("utf-8", "replace")
                    for r in results)


def decode_ack_body(body):
    """Per handle None or the reason it was refused."""
    out = []
    for line in bytes(body).decode("utf-8", "replace").splitlines():
        out.append(None if line == "ok" else line[len("error "):] if line.startswith("error ") else line)
    return out


def _opaque(text):
    return parse_int(text, "opaque", INT32_MIN, INT32_MAX)


def _parse_receive(t):
    if t[5] not in MODES:
        raise TokenError("receive: the mode is normal or fifo, not %r" % t[5][:20])
    wait = parse_int(t[6], "maxWaitMs", 0, INT32_MAX) if len(t) == 8 else 0
    return Receive(t[1], t[2], parse_int(t[3], "max", 1, pop_limits.POP_MAX_BATCH),
                   parse_int(t[4], "invisibleMs", pop_limits.POP_MIN_INVISIBLE_MS, pop_limits.POP_MAX_INVISIBLE_MS),
                   t[5] == "fifo", _opaque(t[-1]), wait)


def _parse_ack(t):
    handles = tuple(t[3].split(","))
    if not 1 <= len(handles) <= pop_limits.POP_MAX_ACK_HANDLES or not all(handles):
        raise TokenError("ack: 1..%d comma-separated receipt handles (limits.POP_MAX_ACK_HANDLES)"
                         % pop_limits.POP_MAX_ACK_HANDLES)
    return Ack(t[1], t[2], handles, _opaque(t[4]))


def _parse_change(t):
    return ChangeInvisible(t[1], t[2], t[3],
                           parse_int(t[4], "invisibleMs", pop_limits.POP_MIN_INVISIBLE_MS,
                                     pop_limits.POP_MAX_INVISIBLE_MS),
                           _opaque(t[5]))


def _serialize_receive(e):
    wait = " %d" % e.max_wait_ms if e.max_wait_ms else ""
    return ("receive %s %s %d %d %s%s %d\r\n" % (token(e.topic), token(e.group), e.max_messages, e.invisible_ms,
                                                 "fifo" if e.fifo else "normal", wait, e.opaque)).encode("utf-8")


def _serialize_ack(e):
    return ("ack %s %s %s %d\r\n" % (token(e.topic), token(e.group), token(",".join(e.handles)),
                                     e.opaque)).encode("utf-8")


def _serialize_change(e):
    return ("change_invisible %s %s %s %d %d\r\n" % (token(e.topic), token(e.group), token(e.handle),
                                                     e.invisible_ms, e.opaque)).encode("utf-8")


register(TextCommand(
    "receive", Receive, (7, 8), "7 or 8 tokens (receive <topic> <group> <max> <invisibleMs> normal|fifo "
    "[<maxWaitMs>] <opaque>)", _parse_receive, _serialize_receive, NEEDS_GROUP_MEMBER,
    examples=(b"receive t g 16 30000 normal 1\r\n", b"receive t g 1 100 fifo 2\r\n",
              b"receive t g 4 30000 normal 5000 3\r\n")))
register(TextCommand(
    "ack", Ack, (5,), "5 tokens (ack <topic> <group> <handle>[,<handle>...] <opaque>)",
    _parse_ack, _serialize_ack, NEEDS_GROUP_MEMBER,
    examples=(b"ack t g 0:5:1:1700000000000 1\r\n", b"ack t g 0:5:1:1700000000000,1:7:2:1700000000001 2\r\n")))
register(TextCommand(
    "change_invisible", ChangeInvisible, (6,), "6 tokens (change_invisible <topic> <group> <handle> <invisibleMs> "
    "<opaque>)", _parse_change, _serialize_change, NEEDS_GROUP_MEMBER,
    examples=(b"change_invisible t g 0:5:1:1700000000000 60000 1\r\n",)))
