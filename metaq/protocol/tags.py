"""A record's tags and their hash in the index unit (sans-IO).

**A record's tags** are the bytes of its attribute before the first ``\\x02``
(``metaq.protocol.rocketmq.mapping``: ``attribute = TAGS "\\x02" properties``);
a plain MetaQ attribute (no ``\\x02``) is its own tags, whole. A record
without an attribute has empty tags. So a RocketMQ message's ``TAGS``, a
text put's attribute and an idempotent put's user attribute (the broker adds
its identity after a ``\\x02``) are each the tags, and nothing else is.

**The index unit's tag hash** (the third field of the 16-byte unit,
``store.index``) is ``tag_code(tags)``: the metaq checksum (CRC-32 masked to
31 bits) of the tags' bytes; 0 for empty tags (CRC-32 of nothing is 0). Every
writer computes it the same way: ``store.record.tag_hash`` (a put, recovery,
a slave's apply), ``protocol.burst`` and ``idempotence.burst`` (the fast
paths, and their C twins in ``native/textburst.c`` / ``native/idemburst.c``), and recovery's
scan in C (``native/recovery.c``, twin ``store.recovery_scan``).

It is part of the log's index format, written whether or not anyone filters; the filters feature reads it
(``metaq.filters``: tag expressions, filtered reads).
"""

import functools
from typing import FrozenSet, NamedTuple

from metaq.filters import limits as filters_limits
from metaq.errors import ClientError
from metaq.protocol.checksum import metaq_checksum

__all__ = ["SEPARATOR", "tags_of_attribute", "tag_code", "TAG_SEPARATOR", "PASSED_SUFFIX", "TagFilter",
           "parse_tag_expression"]

#: What ends the tags inside an attribute (the RocketMQ mapping's property separator).
SEPARATOR = b"\x02"


def tags_of_attribute(attribute):
    """The tags (bytes) of an attribute's bytes: everything before the first ``\\x02``."""
    i = attribute.find(SEPARATOR)
    return attribute if i < 0 else attribute[:i]


def tag_code(tags):
    """The index unit's tag hash of ``tags`` (bytes): their metaq checksum, 0 for empty tags."""
    return metaq_checksum(tags) if tags else 0


#: What separates the names of a tag expression.
TAG_SEPARATOR = "||"
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


@functools.lru_cache(maxsize=filters_limits.TAG_FILTER_CACHE)
def parse_tag_expression(expression, max_bytes=filters_limits.MAX_TAG_EXPRESSION_BYTES,
                         max_tags=filters_limits.MAX_FILTER_TAGS):
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
