"""Filtered reads: the records a tag filter wants, found by their index units (``MessageStore.read_tagged``).

As RocketMQ's ConsumeQueue does: each 16-byte index unit holds its record's
tag hash (``protocol.tags.tag_code``), so a unit whose hash the filter does
not want is passed over without touching the commit log. A unit whose hash
is wanted is read: the record is checked (``record_ok``, its CRC included, as
every read checks) and its real tags compared with the filter's
(``TagFilter.matches``), so two tags sharing a hash never serve a wrong one.

A scan looks at most ``max_units`` units past its offset (``limits.MAX_FILTER_SCAN_UNITS``),
up to the visible end, and stops early once it holds ``max_count`` records or the
next record it would read would take what it read past ``max_bytes`` -- every record
read counts, one whose hash matched but whose tags did not too (CRC-32 collisions
can be forged: a producer could otherwise make one read cover gigabytes); one record
is always read.
``next_offset`` is the offset after the last unit it looked at and decided on,
wanted or not: the next read starts there, so skipped units are never looked
at again and a wanted one is never passed over. No sockets, threads or clock.
"""

import struct
from typing import List, NamedTuple

from metaq.errors import CorruptRecord, Moved
from metaq.filters.sql import SqlFilter
from metaq.filters.wire import OFFSET_FIELD
from metaq.filters.limits import MAX_SQL_FILTER_SCAN
from metaq.protocol.properties import record_properties
from metaq.store.index import UNIT_SIZE
from metaq.store.record import ATTRIBUTE_FLAG, TOPIC_START, decode_record, record_is, record_ok, record_tags

_TLEN = struct.Struct(">h")
_FLAG = struct.Struct(">i")
_FLAG_AT = 16  # in the MetaQ form: msgLen, checksum, msgId, then flag
_DATA_AT = 20


class Hit(NamedTuple):
    """A wanted record: its queue offset, the segment's view, where it starts there, its size."""

    offset: int
    view: object
    rel: int
    size: int
    position: int


class TaggedRead(NamedTuple):
    """What a filtered read found: ``hits`` (in offset order), the offset to read from next, the units it
    passed over without reading their record, and the log bytes it read (wanted records and collisions)."""

    hits: List[Hit]
    next_offset: int
    skipped: int
    log_bytes: int

    def records(self):
        """The hits as ``LogRecord``s (with their positions): a RocketMQ pull's."""
        return [decode_record(h.view, h.rel, position=h.position) for h in self.hits]

    def joined(self):
        """``(body, nbytes)``: each hit's queue offset (8 bytes) then its MetaQ form, joined: a ``get_tags`` body."""
        parts = []
        for h in self.hits:
            (tlen,) = _TLEN.unpack_from(h.view, h.rel + TOPIC_START - 2)
            a = h.rel + TOPIC_START + tlen
            parts.append(OFFSET_FIELD.pack(h.offset))
            parts.append(h.view[a:h.rel + h.size])
        body = b"".join(parts)
        return body, len(body)


def index_ranges(p, offset, max_units):
    """``[(MappedFile, start, end)]``: the index bytes a scan from ``offset`` reads (to bring cold pages in first)."""
    if p is None or offset < p.min or offset >= p.visible:
        return []
    out = []
    n, hi = offset, min(p.visible, offset + max_units)
    while n < hi:
        f = p.file_for(n)
        if f is None:
            break
        top = min(hi, f.end)
        out.append((f.file, (n - f.start) * UNIT_SIZE, (top - f.start) * UNIT_SIZE))
        n = top
    return out


def tags_at(view, rel):
    """The tags of the (checked) record at ``rel`` of ``view``."""
    (tlen,) = _TLEN.unpack_from(view, rel + TOPIC_START - 2)
    form = rel + TOPIC_START + tlen
    (flag,) = _FLAG.unpack_from(view, form + _FLAG_AT)
    if not flag & ATTRIBUTE_FLAG:
        return b""
    (size,) = _FLAG.unpack_from(view, rel)
    return record_tags(flag, view[form + _DATA_AT:rel + size])


def properties_at(view, rel):
    """The properties of the (checked) record at ``rel`` of ``view`` as a RocketMQ consumer sees them (``TAGS``
    included): what a SQL92 filter evaluates. A malformed attribute block: none."""
    (tlen,) = _TLEN.unpack_from(view, rel + TOPIC_START - 2)
    form = rel + TOPIC_START + tlen
    (flag,) = _FLAG.unpack_from(view, form + _FLAG_AT)
    if not flag & ATTRIBUTE_FLAG:
        return {}
    (size,) = _FLAG.unpack_from(view, rel)
    end = rel + size
    start = form + _DATA_AT + _FLAG.size
    if start > end:
        return {}
    (alen,) = _FLAG.unpack_from(view, form + _DATA_AT)
    if alen < 0 or start + alen > end:
        return {}
    return record_properties(bytes(view[start:start + alen]).decode("utf-8", "replace"))


def read_tagged(log, p, offset, filt, max_count, max_bytes, max_units):
    """The ``TaggedRead`` of partition ``p`` (None: a legal one without data) of ``log`` from ``offset``.

    ``filt`` is a ``TagFilter`` (units whose tag hash it does not want are passed over unread) or a ``SqlFilter``
    (every record is read and its properties evaluated: at most ``MAX_SQL_FILTER_SCAN`` units are looked at).

    Bounds as ``lookup.read_records``: Moved below the minimum or past the visible maximum; nothing (and
    ``next_offset == offset``) at the visible end. A wanted record that fails its check ends the read before
    it, or raises CorruptRecord when it is the first wanted one (its next offset is the unit after it).
    """
    empty = _empty_read(p, offset)
    if empty is not None:
        return empty
    codes, wants, max_units = _wanting(filt, max_units)
    hits = []
    read = skipped = 0
    nxt = offset
    hi = min(p.visible, offset + max(1, max_units))
    want = max(1, max_count)
    for n, phys, size, tag in p.units(offset, hi):
        if tag not in codes:
            skipped += 1
            nxt = n + 1
            continue
        if read and read + size > max_bytes:  # every record read counts, a hash collision's too (forgeable)
            break
        seg = log.segment_at(phys)
        rel = phys - seg.start if seg is not None else 0
        view = seg.view if seg is not None else None
        read += size
        if (seg is None or size <= 0 or not record_ok(view, rel, size)
                or not record_is(view, rel, size, p.topic_bytes, p.partition, n)):
            if hits:  # never a corrupt record, nor one its (damaged) unit does not name
                break
            raise CorruptRecord(p.topic, p.partition, n, n + 1, phys)
        nxt = n + 1
        if wants(view, rel):
            hits.append(Hit(n, view, rel, size, phys))
            if len(hits) >= want:
                break
    return TaggedRead(hits, nxt, skipped, read)


def _empty_read(p, offset):
    """The empty ``TaggedRead`` at the visible end (or offset 0 of a legal partition without data), None for an
    offset inside the partition; Moved for one outside it."""
    if p is None:
        if offset == 0:
            return TaggedRead([], 0, 0, 0)
        raise _moved(0)
    vis = p.visible
    if offset >= vis:
        if offset == vis:
            return TaggedRead([], offset, 0, 0)
        raise _moved(vis)
    if offset < p.min:
        raise _moved(p.min)
    return None


def _wanting(filt, max_units):
    """``(tag hashes read, wants(view, rel), max_units)`` of a filter: a SqlFilter reads every unit and evaluates
    the record's properties (at most ``MAX_SQL_FILTER_SCAN`` units); a TagFilter matches the record's tags."""
    if isinstance(filt, SqlFilter):
        evaluate = filt.matches

        def wants(view, rel):
            return evaluate(properties_at(view, rel))
        return _EVERY, wants, min(max_units, MAX_SQL_FILTER_SCAN)
    matches = filt.matches

    def wants(view, rel):
        return matches(tags_at(view, rel))
    return filt.codes, wants, max_units


class _Every:
    """Every tag hash: a SQL92 filter passes no unit over unread."""

    def __contains__(self, code):
        return True


_EVERY = _Every()


def _moved(offset):
    return Moved(offset, "offset out of range: go to %d" % offset)
