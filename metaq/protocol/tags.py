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
paths, and their C twins in ``_speedups.c`` / ``_idemscan.c``), and recovery's
scan in C (``_recoveryscan.c``, twin ``store.recovery_scan``).

It is part of the log's index format, written whether or not anyone filters; the filters feature reads it
(``metaq.filters``: tag expressions, filtered reads).
"""

from metaq.protocol.checksum import metaq_checksum

__all__ = ["SEPARATOR", "tags_of_attribute", "tag_code"]

#: What ends the tags inside an attribute (the RocketMQ mapping's property separator).
SEPARATOR = b"\x02"


def tags_of_attribute(attribute):
    """The tags (bytes) of an attribute's bytes: everything before the first ``\\x02``."""
    i = attribute.find(SEPARATOR)
    return attribute if i < 0 else attribute[:i]


def tag_code(tags):
    """The index unit's tag hash of ``tags`` (bytes): their metaq checksum, 0 for empty tags."""
    return metaq_checksum(tags) if tags else 0
