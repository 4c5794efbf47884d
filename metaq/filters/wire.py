"""Tag expressions, the get_tags reply body and the ``get_sql`` command's declaration (sans-IO).

A record's tags and the index unit's hash of them (``protocol.tags``: the attribute before its first ``\\x02``,
``tag_code``) are what a filter compares.

**A tag expression** (a RocketMQ ``TAG`` subscription, a text ``get_tags``)
names the tags wanted: ``A || B`` (RocketMQ's form) or ``A||B`` (the text
token); ``*`` or nothing wants every record. A record matches when its tags
equal one of the names exactly. ``TagFilter`` holds the names and their
codes: a unit whose hash is not among the codes is skipped without reading
its record; a unit whose hash is among them is read and its real tags
compared (two tags may share a hash), so a collision never serves a wrong
tag. ``TagFilter`` and ``parse_tag_expression`` live in ``protocol.tags`` (the text parser and the RocketMQ
mapping read them too).
"""

import struct

from metaq.filters import limits as filters_limits
from metaq.errors import BadFilterExpression, RemoteProtocolError
from metaq.filters.sql import compiled
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.commands import NEEDS_HANDLER, TextCommand, register, token
from metaq.protocol.events import GetSql
from metaq.protocol.integers import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, parse_int
from metaq.protocol.message import HEADER, Record
from metaq.protocol.tags import PASSED_SUFFIX, TAG_SEPARATOR, TagFilter, parse_tag_expression
from metaq.protocol.text import parse_expect, wait_and_expect

__all__ = ["TAG_SEPARATOR", "OFFSET_FIELD", "TagFilter", "parse_tag_expression", "tag_token", "decode_tagged_body",
           "decode_tagged_reply", "PASSED_SUFFIX"]

#: A queue offset in a ``get_tags`` reply body: the next offset first, then one before each record.
OFFSET_FIELD = struct.Struct(">q")

def tag_token(tags):
    """The text token of a ``get_tags`` asking for ``tags`` (strings), or None when one of them cannot be said
    in a token (empty, a space or control character, ``||``, a leading/trailing space): the caller then filters
    itself."""
    names = sorted(set(tags))
    if not names:
        return None
    for t in names:
        if (not t or t == "*" or TAG_SEPARATOR in t or "|" in (t[0], t[-1]) or t != t.strip()
                or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in t)):
            return None
    return TAG_SEPARATOR.join(names)


def decode_tagged_body(body, verify=True):
    """``(next_offset, [(offset, Record)])`` of a ``get_tags`` reply body (``events.GetTags``).

    RemoteProtocolError when the body is shorter than its next offset, a record is cut off or negative, an
    offset goes backwards or reaches the next offset, or (``verify``) a record's checksum is wrong.
    """
    nxt, _passed_id, out = decode_tagged_reply(body, False, verify)
    return nxt, out


def decode_tagged_reply(body, passed, verify=True):
    """``(next_offset, passed_id, [(offset, Record)])`` of a ``get_tags`` reply body; ``passed``: the request
    asked for the id of the record before the next offset (``PASSED_SUFFIX``), None otherwise. Errors as
    ``decode_tagged_body``'s, and a body too short for that id."""
    size = len(body)
    head = OFFSET_FIELD.size * (2 if passed else 1)
    if size < head:
        raise RemoteProtocolError("get_tags reply of %d bytes has no next offset%s"
                                  % (size, " and id before it" if passed else ""))
    (nxt,) = OFFSET_FIELD.unpack_from(body, 0)
    passed_id = OFFSET_FIELD.unpack_from(body, OFFSET_FIELD.size)[0] if passed else None
    out = []
    pos = head
    last = None
    with memoryview(body) as view:
        while pos < size:
            if size - pos < OFFSET_FIELD.size + HEADER.size:
                raise RemoteProtocolError("get_tags reply cut off at byte %d of %d" % (pos, size))
            (offset,) = OFFSET_FIELD.unpack_from(view, pos)
            msg_len, checksum, msg_id, flag = HEADER.unpack_from(view, pos + OFFSET_FIELD.size)
            start = pos + OFFSET_FIELD.size + HEADER.size
            end = start + msg_len
            if msg_len < 0 or end > size:
                raise RemoteProtocolError("get_tags reply: record at byte %d is cut off or negative" % pos)
            if (last is not None and offset <= last) or offset >= nxt:
                raise RemoteProtocolError("get_tags reply: offset %d out of order (next %d)" % (offset, nxt))
            data = bytes(view[start:end])
            if verify and metaq_checksum(data) != checksum:
                raise RemoteProtocolError("get_tags reply: checksum mismatch in the record at offset %d" % offset)
            out.append((offset, Record(msg_id, flag, data, checksum)))
            last = offset
            pos = end
    return nxt, passed_id, out


# -- get_sql: a get filtered by a SQL92 expression at the broker (the expression is the frame's body) ----------

def _parse_get_sql(t):
    """``get_sql``'s tokens -> ``make(body)``: the expression is the body, compiled (``filters.sql``) when it
    arrives."""
    partition = parse_int(t[3], "partition", -1, INT32_MAX)
    offset = parse_int(t[4], "offset", INT64_MIN, INT64_MAX)
    max_size = parse_int(t[5], "maxSize", INT32_MIN, INT32_MAX)
    length = parse_int(t[6], "exprBytes", 1, filters_limits.MAX_SQL_FILTER_BYTES)
    max_wait_ms = parse_int(t[7], "maxWaitMs", 0, INT32_MAX) if len(t) >= 9 else None
    token_ = t[8] if len(t) == 10 else ""
    passed = token_.endswith(PASSED_SUFFIX)
    token_ = token_[:-len(PASSED_SUFFIX)] if passed else token_
    expect = parse_expect(token_) if token_ else None
    opaque = parse_int(t[-1], "opaque", INT32_MIN, INT32_MAX)
    topic, group = t[1], t[2]

    def make(body):
        """The event, once the body (the expression) arrived; a bad expression is a 400 naming its position (the
        frame is whole: the connection goes on)."""
        try:
            expression = body.decode("utf-8")
            return GetSql(topic, group, partition, offset, max_size, expression, opaque, max_wait_ms,
                          compiled(expression), expect, passed)
        except UnicodeDecodeError:
            raise RemoteProtocolError("get_sql expression of %d bytes is not valid UTF-8" % length, opaque) from None
        except BadFilterExpression as exc:
            raise RemoteProtocolError(str(exc), opaque) from None
    return make


def _serialize_get_sql(e):
    wait = wait_and_expect(e)
    expression = e.expression.encode("utf-8")
    return ("get_sql %s %s %d %d %d %d%s %d\r\n" % (token(e.topic), token(e.group), e.partition, e.offset, e.max_size,
                                                   len(expression), wait, e.opaque)).encode("utf-8") + expression


register(TextCommand(
    "get_sql", GetSql, (8, 9, 10), "8, 9 or 10 tokens (get_sql <topic> <group> <partition> <offset> <maxSize> "
    "<exprBytes> [<maxWaitMs> [<offset>:<msgId>]] <opaque>, then the expression)", _parse_get_sql, _serialize_get_sql,
    NEEDS_HANDLER, 6,
    examples=(b"get_sql t g 0 0 1024 5 1\r\na > 1",
              b"get_sql t g 0 3 1024 21 10 2:9:passed 2\r\nTAGS IN ('a') AND b<2")))
