"""Reads for the wire: the records of a get gathered into one buffer per segment (``MessageStore.read_joined``).

``MessageStore.read`` returns one memoryview per record, which the broker used
to send with ``sendmsg``; for small records the Python work per record (unit
decoding, a view, a buffer per iovec) cost more than the bytes. Here the
records' MetaQ forms are copied, in order, into one ``bytes`` per segment they
lie in: one memcpy each, in C when ``metaq.native._bytes`` was built
(``gather_records_py`` is its exact twin, and the tests hold them equal). The
copy is made on the loop thread before the reply is sent, so the reply never
depends on a map staying alive.

Every record is checked as it is gathered (``verify``: ``record.check_record``,
its CRC included, against the size its index unit gives): a corrupt record is
never served. The records before it are; the read that starts at it raises
``CorruptRecord`` naming the partition, the offset and the next offset.

The zero-copy read (``read_joined(..., mapped=True)``) checks the same records the same way, in place, and copies
nothing: ``check_ranges`` (C, with its twin ``check_ranges_py``) gives each record's MetaQ form as a byte range of
its segment's map, and ``MappedRecords`` holds those ranges with a view of the map (an export: the map cannot be
unmapped while it is held; a segment retention deletes stays readable). The server sends them from the map
(server/zerocopy.py) and bounds how long a reply may hold a map.
"""

import sys
from array import array

from metaq import speedups
from metaq.errors import CorruptRecord, StoreError
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.record import check_record, metaq_offset, record_is, record_ok

#: The MetaQ form's 20-byte header: a record's form is never shorter.
MIN_METAQ_FORM = 20
#: Why ``gather_records`` stopped: the units ran out (or the next is not a whole record of this segment), the
#: next record would pass the limit, or the next record fails its check.
END, FULL, CORRUPT = 0, 1, 2


def gather_records_py(units, skip, log, seg_start, seg_end, limit, nbytes, verify=False, topic=None, partition=0,
                      first=0):
    """The MetaQ forms of the records of ``units`` (16-byte index units) that lie in the segment ``log``, joined.

    ``log`` covers log positions ``[seg_start, seg_end)``; a record's form is
    its bytes past the first ``skip``. Stops before a record that would take
    the total (``nbytes`` already gathered + these) past ``limit`` unless
    nothing is gathered yet (``stop`` is then FULL), before a unit that is
    not a whole record of this segment (END) and, with ``verify``, before a record
    that fails ``check_record`` at its unit's size or, given ``topic`` (bytes), is not record ``first + k`` of
    that topic's ``partition`` (``record_is``) (CORRUPT). Returns ``(count, data, stop)``.
    """
    parts = []
    count = 0
    stop = END
    with memoryview(log) as seg, memoryview(units) as u:
        for phys, size, _tag in UNIT.iter_unpack(u[:len(u) - len(u) % UNIT_SIZE]):
            ln = size - skip
            if nbytes + ln > limit and nbytes:
                stop = FULL
                break
            if not seg_start <= phys < seg_end or ln < MIN_METAQ_FORM or phys - seg_start + size > len(seg):
                break
            rel = phys - seg_start
            if verify and (check_record(seg, rel, rel + size) != size
                           or topic is not None and not record_is(seg, rel, size, topic, partition, first + count)):
                stop = CORRUPT
                break
            a = rel + skip
            parts.append(seg[a:a + ln])
            nbytes += ln
            count += 1
        return count, b"".join(parts), stop


gather_records = speedups.load("gather_records", gather_records_py)  # the C twin when built


def check_ranges_py(units, skip, log, seg_start, seg_end, limit, nbytes, topic=None, partition=0, first=0):
    """As ``gather_records_py`` with ``verify``, but nothing copied: ``(count, ranges, their bytes, stop)`` where
    ``ranges`` holds each record's MetaQ form as a (start, end) pair of native int64 byte positions in ``log``."""
    pairs = array("q")
    count = total = 0
    stop = END
    with memoryview(log) as seg, memoryview(units) as u:
        for phys, size, _tag in UNIT.iter_unpack(u[:len(u) - len(u) % UNIT_SIZE]):
            ln = size - skip
            if nbytes + total + ln > limit and nbytes + total:
                stop = FULL
                break
            if not seg_start <= phys < seg_end or ln < MIN_METAQ_FORM or phys - seg_start + size > len(seg):
                break
            rel = phys - seg_start
            if (check_record(seg, rel, rel + size) != size
                    or topic is not None and not record_is(seg, rel, size, topic, partition, first + count)):
                stop = CORRUPT
                break
            pairs.extend((rel + skip, rel + size))
            total += ln
            count += 1
    return count, pairs.tobytes(), total, stop


check_ranges = speedups.load("check_ranges", check_ranges_py)  # the C twin when built


class MappedRecords:
    """Checked records left in a segment's map: ``ranges`` (native int64 start/end pairs) of ``view``, ``nbytes``
    in all, each a record's bytes past its first ``skip``; the map starts at position ``base`` of the commit log
    ``log``. ``view`` is this object's own view of the map (an export that keeps it mapped) until ``release``.
    ``born``: when the reply was read, on the clock of whoever sends it (the server stamps it; None: not stamped)."""

    __slots__ = ("view", "ranges", "nbytes", "skip", "log", "cuts", "base", "born")

    def __init__(self, view, ranges, nbytes, skip=0, log=None, base=0):
        self.view = memoryview(view)
        self.ranges = ranges
        self.nbytes = nbytes
        self.skip = skip
        self.log = log  # the commit log (its ``cuts`` and where they were), or None: check the records' CRCs again
        self.cuts = log.cuts if log is not None else None
        self.base = base
        self.born = None

    def intact(self, pos=0):
        """True when the records with bytes from ``pos`` on (of these ``nbytes``) are still what was checked at the
        read: for a send, whenever the loop may have run since. Records are written once; only a cut of the log (a
        slave's, before its epoch handshake) changes bytes: it zeroes the log from its position on, deletes the
        later segments, and the slave then writes other records there, maybe of the same sizes (a CRC check could
        pass on them, or on an old record's head sent before the cut spliced to a new tail). So it is decided by
        position: False when a cut made since the read reached below the end of these records (their last unsent
        one included), whatever the bytes hold now; with no cut since the read, nothing to do."""
        if pos >= self.nbytes:
            return True
        if self.log is None:
            return self._crc_ok(pos)
        low = self.log.lowest_cut_since(self.cuts)
        if low is None:
            return True
        end = self.base + int.from_bytes(self.ranges[-8:], sys.byteorder, signed=True)  # the last record's end
        if end > low:
            return False
        self.cuts = self.log.cuts  # those cuts all lie past these records: only later ones matter now
        return True

    def _crc_ok(self, pos):
        skip, view = self.skip, self.view
        for a, b in self.pairs():
            if pos >= b - a:
                pos -= b - a
                continue
            pos = 0
            if not record_ok(view, a - skip, b - a + skip):
                return False
        return True

    def __len__(self):
        return self.nbytes

    def pairs(self):
        r = array("q")
        r.frombytes(self.ranges)
        return zip(r[::2], r[1::2], strict=True)

    def joined(self, skip=0):
        """The records' bytes past the first ``skip``, copied into one ``bytes``."""
        view = self.view
        data = b"".join([view[a:b] for a, b in self.pairs()])
        return data[skip:] if skip else data

    def release(self):
        """Let the map go (a later ``joined`` or send fails)."""
        self.view.release()


def collect_joined(log, p, n, vis, limit, verify=True, mapped=False):
    """``(buffers, nbytes, count)``: records ``n…`` of ``p`` (in the commit log ``log``) below ``vis`` within
    ``limit`` (at least one). Stops before a corrupt record; raises ``CorruptRecord`` when the first is.
    ``mapped``: each buffer a ``MappedRecords`` (checked in place, nothing copied) instead of a ``bytes``."""
    skip = metaq_offset(len(p.topic_bytes))
    buffers = []
    nbytes = count = 0
    while n < vis:
        f = p.file_for(n)
        if f is None:
            raise StoreError("no index file holds offset %d of %s-%d" % (n, p.topic, p.partition))
        hi = min(vis, f.end)
        with f.view[(n - f.start) * UNIT_SIZE:(hi - f.start) * UNIT_SIZE] as units:
            phys = UNIT.unpack_from(units, 0)[0]
            seg = log.segment_at(phys)
            if seg is None:  # a damaged unit: served up to it, then refused as a corrupt record is
                if count:
                    break
                raise corrupt(p, n, phys)
            owner = (p.topic_bytes, p.partition, n) if verify else ()
            if mapped:
                k, ranges, size, stop = check_ranges(units, skip, seg.view, seg.start, seg.end, limit, nbytes, *owner)
                data = MappedRecords(seg.view, ranges, size, skip, log, seg.start) if k else None
            else:
                k, data, stop = gather_records(units, skip, seg.view, seg.start, seg.end, limit, nbytes, verify,
                                               *owner)
        if k:
            buffers.append(data)
            nbytes += len(data)
            count += k
            n += k
        if stop == CORRUPT or (not k and stop == END):  # END with nothing: the unit points at no whole record
            if count:
                break  # served up to the corrupt record; the next read starts at it and is refused
            raise corrupt(p, n, phys_of(p, n))
        if stop == FULL:
            break
    return buffers, nbytes, count


def collect_views(log, p, n, vis, limit):
    """``(views, nbytes)``: one memoryview per record (its MetaQ form) of records ``n…`` of ``p`` below ``vis``
    within ``limit`` (at least one), for ``MessageStore.read``; checked as ``collect_joined`` checks them."""
    topic = p.topic_bytes
    skip = metaq_offset(len(topic))
    views = []
    append = views.append
    nbytes = 0
    seg_start = seg_end = -1
    sview = None
    chunk = 32
    while n < vis:
        f = p.file_for(n)
        if f is None:
            raise StoreError("no index file holds offset %d of %s-%d" % (n, p.topic, p.partition))
        hi = min(vis, f.end, n + chunk)
        units = UNIT.iter_unpack(f.view[(n - f.start) * UNIT_SIZE:(hi - f.start) * UNIT_SIZE])
        for k, (phys, size, _tag) in enumerate(units, n):
            ln = size - skip
            if nbytes + ln > limit and views:
                return views, nbytes
            if not seg_start <= phys < seg_end:
                seg = log.segment_at(phys)
                if seg is None or ln < MIN_METAQ_FORM:  # a damaged unit: refused as a corrupt record is
                    if views:
                        return views, nbytes
                    raise corrupt(p, k, phys)
                seg_start, seg_end, sview = seg.start, seg.end, seg.view
            rel = phys - seg_start
            if not record_ok(sview, rel, size) or not record_is(sview, rel, size, topic, p.partition, k):
                if views:  # never serve a corrupt record, nor one its unit does not name
                    return views, nbytes
                raise corrupt(p, k, phys)
            append(sview[rel + skip:rel + size])
            nbytes += ln
        n = hi
        chunk = min(chunk * 4, 4096)
    return views, nbytes


def phys_of(p, n):
    """The commit-log position index unit ``n`` of ``p`` names (None when no index file holds it)."""
    unit = p.unit(n)
    return unit[0] if unit is not None else None


def corrupt(p, n, position):
    return CorruptRecord(p.topic, p.partition, n, n + 1, position)
