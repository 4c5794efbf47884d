"""Tag expressions and the get_tags reply body (sans-IO).

A record's tags and the index unit's hash of them (``protocol.tags``: the attribute before its first ``\\x02``,
``tag_code``) are what a filter compares.

**A tag expression** (a RocketMQ ``TAG`` subscription, a text ``get_tags``)
names the tags wanted: ``A || B`` (RocketMQ's form) or ``A||B`` (the text
token); ``*`` or nothing wants every record. A record matches when its tags
equal one of the names exactly. ``TagFilter`` holds the names and their
codes: a unit whose hash is not among the codes is skipped without reading
its record; a unit whose hash is among them is read and its real tags
compared (two tags may share a hash), so a collision never serves a wrong
tag.
"""

import functools
import struct
from typing import FrozenSet, NamedTuple

from metaq import limits
from metaq.errors import ClientError, RemoteProtocolError
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import HEADER, Record
from metaq.protocol.tags import SEPARATOR, tag_code

__all__ = ["TAG_SEPARATOR", "OFFSET_FIELD", "TagFilter", "parse_tag_expression", "tag_token", "decode_tagged_body",
           "decode_tagged_reply", "PASSED_SUFFIX"]

#: What separates the names of a tag expression.
TAG_SEPARATOR = "||"
#: A queue offset in a ``get_tags`` reply body: the next offset first, then one before each record.
OFFSET_FIELD = struct.Struct(">q")

#: A get_tags expect's suffix (``<offset>:<msgId>:passed``, or ``:passed`` alone before any record was read;
#: events.GetTags ``passed``): the reply's next offset is followed by the id of the record before it (an
#: ``OFFSET_FIELD``-sized int64, -1 when none is held).
PASSED_SUFFIX = ":passed"


class TagFilter(NamedTuple):
    """The tags a consumer wants (UTF-8 bytes) and their codes (``tag_code``)."""

    tags: FrozenSet[bytes]
    codes: FrozenSet[int]

    def matches(self, tags):
        """Whether a record with ``tags`` (bytes) is wanted."""
        return tags in self.tags


@functools.lru_cache(maxsize=limits.TAG_FILTER_CACHE)
def parse_tag_expression(expression, max_bytes=limits.MAX_TAG_EXPRESSION_BYTES, max_tags=limits.MAX_FILTER_TAGS):
    """The ``TagFilter`` of ``expression`` (str), or None when it wants every record (``*``, empty, None); kept for
    the ``limits.TAG_FILTER_CACHE`` expressions parsed last (a ``TagFilter`` is immutable: any request may share
    it), errors raised, never kept.

    Names are split on ``||`` and stripped of spaces; empty names are ignored (RocketMQ does the same). A name
    holding ``\\x01`` or ``\\x02`` can never be a record's tags and is refused, as is an expression longer than
    ``max_bytes`` UTF-8 bytes or naming more than ``max_tags`` tags: ClientError saying which.
    """
    if expression is None:
        return None
    raw = expression.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise ClientError("tag expression of %d bytes is too long: the limit is %d" % (len(raw), max_bytes))
    names = [t.strip() for t in expression.split(TAG_SEPARATOR)]
    names = [t for t in names if t]
    if not names or "*" in names:
        return None
    tags = frozenset(t.encode("utf-8", "surrogatepass") for t in names)
    if len(tags) > max_tags:
        raise ClientError("tag expression names %d tags: the limit is %d" % (len(tags), max_tags))
    for t in tags:
        if b"\x01" in t or SEPARATOR in t:
            raise ClientError("tag %r holds a separator (\\x01 or \\x02): no record can carry it" % t[:64])
    return TagFilter(tags, frozenset(tag_code(t) for t in tags))


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
