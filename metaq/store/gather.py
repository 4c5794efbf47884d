"""Reads for the wire: the records of a get gathered into one buffer per segment (``MessageStore.read_joined``).

``MessageStore.read`` returns one memoryview per record, which the broker used
to send with ``sendmsg``; for small records the Python work per record (unit
decoding, a view, a buffer per iovec) cost more than the bytes. Here the
records' MetaQ forms are copied, in order, into one ``bytes`` per segment they
lie in: one memcpy each, in C when ``metaq._speedups`` was built
(``gather_records_py`` is its exact twin, and the tests hold them equal). The
copy is made on the loop thread before the reply is sent, so the reply never
depends on a map staying alive.
"""

from metaq import speedups
from metaq.errors import StoreError
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.record import metaq_offset

#: The MetaQ form's 20-byte header: a record's form is never shorter.
MIN_METAQ_FORM = 20


def gather_records_py(units, skip, log, seg_start, seg_end, limit, nbytes):
    """The MetaQ forms of the records of ``units`` (16-byte index units) that lie in the segment ``log``, joined.

    ``log`` covers log positions ``[seg_start, seg_end)``; a record's form is
    its bytes past the first ``skip``. Stops before a record that would take
    the total (``nbytes`` already gathered + these) past ``limit`` unless
    nothing is gathered yet (``full`` is then True), and before a unit that is
    not a whole record of this segment. Returns ``(count, data, full)``.
    """
    parts = []
    count = 0
    full = False
    with memoryview(log) as seg, memoryview(units) as u:
        for phys, size, _tag in UNIT.iter_unpack(u[:len(u) - len(u) % UNIT_SIZE]):
            ln = size - skip
            if nbytes + ln > limit and nbytes:
                full = True
                break
            if not seg_start <= phys < seg_end or ln < MIN_METAQ_FORM or phys - seg_start + size > len(seg):
                break
            a = phys - seg_start + skip
            parts.append(seg[a:a + ln])
            nbytes += ln
            count += 1
        return count, b"".join(parts), full


gather_records = speedups.load("gather_records", gather_records_py)  # the C twin when built


def collect_joined(log, p, n, vis, limit):
    """``(buffers, nbytes, count)``: records ``n…`` of ``p`` (in the commit log ``log``) below ``vis`` within
    ``limit`` (at least one)."""
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
            if seg is None:
                raise _outside(p, phys)
            k, data, full = gather_records(units, skip, seg.view, seg.start, seg.end, limit, nbytes)
        if not k and not full:
            raise _outside(p, phys)
        if k:
            buffers.append(data)
            nbytes += len(data)
            count += k
            n += k
        if full:
            break
    return buffers, nbytes, count


def _outside(p, phys):
    return StoreError("index unit of %s-%d points at %d, outside the log" % (p.topic, p.partition, phys))
