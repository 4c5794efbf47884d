"""Index units checked against the log, and those that do not name their record rebuilt from it.

The log is the truth; a partition's units are derived from it. A unit below the partition's maximum that is
empty, or names a place where its record (whole, its CRC passing, of its topic, partition and offset) does not
start, is served as a corrupt record (512) although the record may be intact in the log. A lost write leaves
whole pages of units so, and a file's first page is where one shows: ``check_units`` looks at the first and the
last unit of each index file (within the partition's offsets) and, where one is bad, at the bad run around it.
Each run is rebuilt from the log: its records lie between the end of the record before the run and the start of
the one after it (by their units, when those are good), and recovery's scan of that stretch
(``recovery_scan.scan_log``) gives their units. A record the log does not hold stays a corrupt record (logged).

``check_units`` is BLOCKING (it reads the maps, cold pages included): recovery runs it, and a slave before each
catch-up, in a worker thread. ``repair_resident`` is a read's (on the event loop): one unit, rebuilt only when what
it reads is in memory already and within ``limits.UNIT_REPAIR_READ_BYTES``. No sockets, threads or clock.
"""

import logging
import mmap

from metaq.store import limits as store_limits
from metaq.store.index import UNIT_SIZE
from metaq.store.record import record_is, record_ok
from metaq.store.recovery_scan import scan_log

log = logging.getLogger(__name__)


def unit_names_its_record(log_, p, n):
    """True when unit ``n`` of partition ``p`` names record ``n`` of ``p`` in ``log_``, whole and passing its CRC."""
    u = p.unit(n)
    if u is None or u[1] <= 0:
        return False
    seg = log_.segment_at(u[0])
    if seg is None:
        return False
    rel = u[0] - seg.start
    return record_ok(seg.view, rel, u[1]) and record_is(seg.view, rel, u[1], p.topic_bytes, p.partition, n)


def check_units(log_, partitions, written):
    """Check the units of ``partitions`` most at risk (see the module doc) against ``log_`` (written up to
    ``written``) and rebuild the bad runs from it; returns how many units were rewritten (each logged).

    An empty run right below a partition's first offset that a unit naming its record precedes is a hole too: the
    first offset was found by a binary search over the units, which takes empty ones for records gone from the log.
    It is checked with the rest, and the first offset found again once the units are rebuilt."""
    repaired = 0
    for p in partitions:
        floor = _hole_below_min(log_, p)
        done = floor if floor is not None else p.min  # units below this are checked already (a run's end)
        fixed = 0
        for f in p.files:
            for n in (f.start, f.end - 1):
                if n < done or n >= p.max or unit_names_its_record(log_, p, n):
                    continue
                lo, hi = _bad_run(log_, p, n, done)
                fixed += _rebuild(log_, p, lo, hi, done, written)
                done = hi
        if fixed and floor is not None:
            log_start = log_.start if log_.start is not None else written
            p.min = min(p.min, p.first_at_or_after(log_start, p.first_start, p.max))
        repaired += fixed
    return repaired


def _hole_below_min(log_, p):
    """The first offset of the empty units right below ``p.min`` when a unit naming its record precedes them (the
    offset after it), else None (none empty there, or nothing before them: a partition that starts there)."""
    m = p.min
    if m <= p.first_start or p.file_for(m - 1) is None or p.unit(m - 1)[1] != 0:
        return None
    for f in reversed(p.files):
        if f.start >= m:
            continue
        end = f.file.nonzero_end(0, (min(f.end, m) - f.start) * UNIT_SIZE)  # the data's end: the C helper
        if end:
            k = f.start + (end - 1) // UNIT_SIZE
            return k + 1 if unit_names_its_record(log_, p, k) else None
    return None


def _bad_run(log_, p, n, floor):
    """``(lo, hi)``: the offsets around ``n`` (bad), from ``floor`` on, whose units do not name their records."""
    lo = n
    while lo > floor and not unit_names_its_record(log_, p, lo - 1):
        lo -= 1
    hi = n + 1
    while hi < p.max and not unit_names_its_record(log_, p, hi):
        hi += 1
    return lo, hi


def _rebuild(log_, p, lo, hi, floor, written):
    """Rewrite units ``[lo, hi)`` of ``p`` from the log: scan from the end of record ``lo - 1`` (the log start
    without it) to the start of record ``hi`` (the written end without it). Returns how many were rewritten."""
    start = log_.start if log_.start is not None else written
    if lo > floor:
        phys, size, _tag = p.unit(lo - 1)
        start = phys + size
    stop = written
    if hi < p.max:
        stop = p.unit(hi)[0]
    found = _units_between(log_, p, lo, hi, start, stop)
    for n, unit in sorted(found.items()):
        f = p.file_for(n)  # held: lo..hi lie within the partition's files (a unit of none is not rebuilt)
        if f is None:
            del found[n]
            continue
        f.mm[(n - f.start) * UNIT_SIZE:(n - f.start + 1) * UNIT_SIZE] = unit
    if found:
        p.dirty = True
        log.warning("index units %d..%d of %s-%d did not name their records: %d rebuilt from the commit log",
                    lo, hi - 1, p.topic, p.partition, len(found))
    missing = hi - lo - len(found)
    if missing:
        log.error("index units %d..%d of %s-%d do not name their records and the commit log between positions %d "
                  "and %d holds %d of them: the others are served as corrupt records", lo, hi - 1, p.topic,
                  p.partition, start, stop, len(found))
    return len(found)


def _units_between(log_, p, lo, hi, start, stop):
    """``{offset: unit bytes}`` of ``p``'s records with offsets in ``[lo, hi)`` found in the log's valid records from
    position ``start`` to ``stop`` (a segment's scan goes on in the next one where it stops: its blank tail)."""
    found = {}
    key = (p.topic_bytes, p.partition)
    pos = start
    while pos < stop and len(found) < hi - lo:
        seg = log_.segment_at(pos)
        if seg is None:
            break
        end = min(seg.end, stop) - seg.start
        rel = pos - seg.start
        while rel < end and len(found) < hi - lo:
            rel_next, count, _max_id, units, runs = scan_log(seg.file.mm, rel, end, seg.start,
                                                                    store_limits.RECOVERY_SCAN_RECORDS)
            for topic, partition, first, at, n in runs:
                if (topic, partition) != key or first >= hi or first + n <= lo:
                    continue
                for k in range(max(lo, first), min(hi, first + n)):
                    i = (at + k - first) * UNIT_SIZE
                    found[k] = bytes(units[i:i + UNIT_SIZE])
            if not count:
                break  # a blank tail (or the end): the next segment
            rel = rel_next
        pos = seg.end
    return found



def repair_resident(log_, p, n, written):
    """Rebuild unit ``n`` of ``p`` on the spot (a read met it: it does not name its record) when that reads no disk:
    the units before and after it name their records, the stretch between those records is at most
    ``limits.UNIT_REPAIR_READ_BYTES`` within one segment, and every page of the three records' span and of the
    unit is resident. True when rebuilt (logged); False leaves it to ``check_units`` (the next start or catch-up).
    A record the unit names that is its own but fails its CRC is corrupt for real: not a unit to rebuild."""
    if not p.min < n < p.max - 1:
        return False
    f = p.file_for(n)
    if f is None or not f.file.resident((n - f.start) * UNIT_SIZE):
        return False
    before, after = p.unit(n - 1), p.unit(n + 1)
    seg = log_.segment_at(before[0]) if before[1] > 0 else None
    if seg is None or after[1] <= 0 or not seg.start <= after[0] < seg.end or after[0] + after[1] > seg.end:
        return False
    lo, hi = before[0] + before[1], after[0]
    if not 0 <= hi - lo <= store_limits.UNIT_REPAIR_READ_BYTES:
        return False
    if not _resident(seg.file, before[0] - seg.start, hi + after[1] - seg.start):
        return False
    if _names_its_own_record(log_, p, n) or not (unit_names_its_record(log_, p, n - 1)
                                                  and unit_names_its_record(log_, p, n + 1)):
        return False
    return _rebuild(log_, p, n, n + 1, p.min, written) == 1


def _resident(file, start, end):
    """True when every page of ``[start, end)`` of ``file`` (a MappedFile) is in memory."""
    page = start - start % mmap.PAGESIZE
    while page < end:
        if not file.resident(page):
            return False
        page += mmap.PAGESIZE
    return True


def _names_its_own_record(log_, p, n):
    """True when unit ``n`` points at a record whose header says it is ``p``'s record ``n`` (whatever its CRC), or
    at a header not in memory (not looked at: taken as its own)."""
    u = p.unit(n)
    seg = log_.segment_at(u[0]) if u is not None and u[1] > 0 else None
    if seg is None or u[0] + u[1] > seg.end:
        return False
    rel = u[0] - seg.start
    if not _resident(seg.file, rel, min(seg.size, rel + u[1])):
        return True
    return record_is(seg.view, rel, u[1], p.topic_bytes, p.partition, n)
