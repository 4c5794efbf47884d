"""Replication primitives: copy a master's commit log byte for byte, at the same positions (DESIGN §8).

``MessageStore.read_log``, ``append_replicated`` and ``truncate_log`` delegate
here, handing over what the functions work on as a ``LogAccess`` (the commit
log, its ``LogPositions``, the partitions' indexes and the store's append
steps). No sockets, threads or clock: the server moves the bytes (see
``metaq.protocol.replication``) and passes ``now_ms``.

**What a read returns (master side).** ``read_log(acc, position, max_bytes)``
returns a memoryview of the master's map holding whole *units* from
``position``, all inside one segment: records, and, at the end of a segment,
its blank tail (the 8-byte blank marker and the zeros after it, or the fewer
than 8 zero bytes a roll leaves unmarked). Reading the tail of a segment
returns ``next_position`` = the next segment's start, so the slave reproduces
the boundary exactly. At least one unit is returned even if it is larger than
``max_bytes``. ``position`` must be a record boundary: the slave always asks
for its own end, which is one; anything else is checked (a record there must
pass its CRC *and* be the one its partition's index unit names) and refused
with ``NotABoundary``. Below the log start it raises ``Moved(log start)``.

**How far a slave may copy.** ``upto="flushed"`` (default) stops at the
master's flushed position: the slave never holds a byte the master could lose
in a power failure, so the slave's log is always a prefix of the master's
durable log and a promoted slave never has a tail its master never had. This
is what ``async`` replication uses. ``upto="written"`` goes up to the written
end: it ships a record as soon as it is in the master's page cache, in
parallel with the master's own fsync, which is what ``sync`` replication
wants for latency (the put is acknowledged once the slave has it and the
master flushed it). The price: after a master *power* loss the slave may
hold a tail the master lost; the epoch handshake then either promotes the
slave or cuts that tail with ``truncate_log``.

**Appending (slave side).** ``append_replicated`` checks the whole chunk
first (position = our written end, every record's structure and CRC, no record
crossing our segment end, blank tails matching our segment size, every
partition offset continuing its partition's sequence, topic names legal) and
writes nothing if any check fails (``ReplicationRefused``, naming what was
expected). Then it applies unit by unit, each step leaving the store
consistent (a ``DiskFull`` mid-chunk keeps what was applied; the next call
resumes from the new end): blank tails make the slave roll exactly where the
master rolled, records are copied as they are and indexed with the offsets
they carry, and visibility follows the slave's flush mode like a put.
A slave whose log is empty may start at any segment start of the master
(``position`` a multiple of the segment size, e.g. the master's log start
after retention); partitions then begin at the first offset seen.
"""

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, NamedTuple, Tuple

from metaq import limits
from metaq.errors import CorruptRecord, DiskFull, InvalidTopic, Moved, StoreError
from metaq.protocol.message import HEADER
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.record import (
    BLANK_MAGIC,
    FIXED_OVERHEAD,
    MARKER,
    MESSAGE_MAGIC,
    PREFIX,
    TOPIC_START,
    check_record,
    scan_records,
    tag_hash,
)

log = logging.getLogger(__name__)

UPTO_CHOICES = ("flushed", "written")


class ReplicationRefused(StoreError):
    """A replicated chunk (or a position) the store will not accept; nothing was written."""


class NotABoundary(ReplicationRefused):
    """The position is not the start of a record or blank tail in this log."""


class LogAccess(NamedTuple):
    """What the replication functions work on; ``MessageStore`` builds it from its own state."""

    log: object  # the CommitLog
    positions: object  # its LogPositions (moved only through their methods)
    parts: object  # the store's Partitions (partitions.py): read, and ``make`` a partition a record needs
    index_tail: Callable  # index_tail(p, offset) -> the index file for unit ``offset``, created if needed
    check_disk: Callable  # check_disk() -> DiskState
    segment_size: int


@dataclass
class TruncateReport:
    """What ``truncate_log`` cut: totals and per ``(topic, partition)`` ``[records, bytes]``."""

    position: int
    old_end: int
    bytes: int = 0
    records: int = 0
    partitions: Dict[Tuple[str, int], list] = field(default_factory=dict)
    new_max_offsets: Dict[Tuple[str, int], int] = field(default_factory=dict)
    deleted_segments: tuple = ()


# -- master side --------------------------------------------------------------


def read_log(acc, position, max_bytes, upto="flushed"):
    """``(memoryview, next_position)``: whole units from ``position`` within one segment (see module doc)."""
    if upto not in UPTO_CHOICES:
        raise ValueError("upto must be one of %s, got %r" % ("/".join(UPTO_CHOICES), upto))
    limit = acc.positions.flushed if upto == "flushed" else acc.positions.written
    check_boundary(acc, position)
    if position >= limit:
        return memoryview(b""), position
    seg = acc.log.segment_at(position)
    if seg is None:
        raise StoreError("no commit-log segment holds position %d" % position)
    view, base, end = seg.view, seg.start, min(seg.end, limit)
    rel, stop = position - base, end - base
    taken = 0
    while rel < stop:
        left = seg.size - rel
        if left < MARKER.size or MARKER.unpack_from(view, rel) == (left, BLANK_MAGIC):
            if taken and taken + left > max_bytes:
                break
            ok = _verified(acc, view, base, position - base, rel)
            if ok < rel:  # a corrupt record before the tail: the chunk ends before it
                return view[position - base:ok], base + ok
            return view[position - base:seg.size], seg.end
        total, magic = MARKER.unpack_from(view, rel)
        if magic != MESSAGE_MAGIC or total < FIXED_OVERHEAD or total > stop - rel:
            raise StoreError("commit log damaged at position %d (size %d, magic %#010x): cannot replicate it"
                             % (base + rel, total, magic))
        if taken and taken + total > max_bytes:
            break
        taken += total
        rel += total
    rel = _verified(acc, view, base, position - base, rel)
    return view[position - base:rel], base + rel


def _verified(acc, view, base, rel, stop):
    """Where the chunk's records ``[rel, stop)`` must end so that none is corrupt: ``stop``, or the first corrupt
    record's place. A master never ships a record it knows is corrupt (the slave would refuse it anyway): when
    the chunk starts with one, ``CorruptRecord`` names it, and the link ends there (docs/operating.md "Corrupt
    records")."""
    bad = scan_records(view, rel, stop)[0]
    if bad >= stop:
        return stop
    if bad > rel:
        return bad
    _t, _m, _c, part, qoff, _s, _b, tlen = PREFIX.unpack_from(view, bad)
    topic = bytes(view[bad + TOPIC_START:bad + TOPIC_START + max(0, tlen)]).decode("utf-8", "replace")
    raise CorruptRecord(topic, part, qoff, qoff + 1, base + bad)


def check_boundary(acc, position):
    """Raise unless ``position`` starts a record or blank tail of this log (or is its end)."""
    written = acc.positions.written
    start = acc.log.start
    if position == written or (start is None and position == 0):
        return
    if start is None or position < start:
        raise Moved(start if start is not None else written,
                    "position %d is below the log start %s" % (position, start if start is not None else written))
    if position > written:
        raise NotABoundary("position %d is past the end of the log (%d)" % (position, written))
    seg = acc.log.segment_at(position)
    if seg is None:
        raise NotABoundary("no commit-log segment holds position %d" % position)
    rel, left = position - seg.start, seg.end - position
    if rel == 0:
        return
    if left < MARKER.size:
        if not any(seg.view[rel:]):
            return
    else:
        total, magic = MARKER.unpack_from(seg.view, rel)
        if magic == BLANK_MAGIC and total == left:
            return
        if magic == MESSAGE_MAGIC and _indexed_here(acc, seg, rel, position):
            return
    raise NotABoundary("position %d is not a record boundary of the commit log" % position)


def _indexed_here(acc, seg, rel, position):
    """True when the record at ``rel`` is the one its partition's index unit names at ``position`` (its CRC is
    not asked for: a corrupt record the index names is still a boundary, and ``read_log`` refuses to ship it)."""
    if seg.size - rel < PREFIX.size:
        return False
    total, _m, _c, part, qoff, _s, _b, tlen = PREFIX.unpack_from(seg.view, rel)
    if total < FIXED_OVERHEAD or total > seg.size - rel or not 0 < tlen <= total - FIXED_OVERHEAD:
        return False
    topic = bytes(seg.view[rel + TOPIC_START:rel + TOPIC_START + tlen]).decode("utf-8", "replace")
    p = acc.parts.get((topic, part))
    unit = p.unit(qoff) if p is not None and p.min <= qoff < p.max else None
    return unit is not None and unit[0] == position and unit[1] == total


# -- slave side ----------------------------------------------------------------


class _Plan:
    """The checked units of a chunk: ``(kind, pos, at, total, key, offset, tag, msg_id)``."""

    def __init__(self):
        self.units = []
        self.first = {}  # key -> first offset, for partitions that start inside this chunk


def append_replicated(acc, position, data, now_ms, master_segment_size=None):
    """Verify then apply a chunk read from the master's ``read_log``.

    Returns ``(new written end, highest message id applied or None)``: the store seeds its id generator with it.
    """
    if master_segment_size is not None and master_segment_size != acc.segment_size:
        raise ReplicationRefused("segment size mismatch: the master uses %d-byte segments, this store %d; "
                                 "a slave must use the master's segment_size"
                                 % (master_segment_size, acc.segment_size))
    written = acc.positions.written
    if position != written and not (acc.log.start is None and written == 0):
        raise ReplicationRefused("replicated data starts at position %d but this store's log ends at %d: "
                                 "resume from %d" % (position, written, written))
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    plan = _check_chunk(acc, position, view)
    return _apply(acc, plan, view, now_ms)


def _first_segment_end(acc, pos):
    """The end of the segment the unit at ``pos`` (our written end) goes to, as it is or as a roll makes it."""
    size = acc.segment_size
    seg = acc.log.active
    if seg is not None:
        return seg.end  # pos == seg.end: the loop moves on to the next segment
    if pos % size:
        raise ReplicationRefused("this store's log is empty and can only start at a segment start "
                                 "(a multiple of %d), not at %d" % (size, pos))
    return pos + size


def _check_chunk(acc, position, view):
    size = acc.segment_size
    plan = _Plan()
    expected = {}
    n, pos, at = len(view), position, 0
    log_start = acc.log.start
    started_mid_log = (log_start if log_start is not None else position) > 0
    seg_end = _first_segment_end(acc, position)
    while at < n:
        if pos == seg_end:
            seg_end += size
        left = seg_end - pos
        if left < MARKER.size or _is_blank(view, at):
            if left == size:
                raise ReplicationRefused("blank tail at the segment start %d: corrupt chunk" % pos)
            _check_tail(view, at, left, pos)
            plan.units.append(("tail", pos, at, left, None, 0, 0, 0))
            pos, at = seg_end, at + left
            continue
        key, qoff, total, tag, msg_id = _check_record(view, at, pos, left, n)
        exp = expected.get(key)
        if exp is None:
            p = acc.parts.get(key)
            exp = p.max if p is not None else 0
            if exp == 0 and (p is None or not p.files) and started_mid_log:
                exp = qoff  # a partition whose earlier records lie before where this log starts
                plan.first[key] = qoff
        if qoff != exp:
            raise ReplicationRefused("record at position %d is offset %d of %s-%d but this store expects "
                                     "offset %d: partition sequence broken" % (pos, qoff, key[0], key[1], exp))
        expected[key] = qoff + 1
        plan.units.append(("record", pos, at, total, key, qoff, tag, msg_id))
        pos, at = pos + total, at + total
    return plan


def _is_blank(view, at):
    if len(view) - at < MARKER.size:
        return False
    _total, magic = MARKER.unpack_from(view, at)
    return magic == BLANK_MAGIC


def _check_tail(view, at, left, pos):
    if left >= MARKER.size:
        total, _magic = MARKER.unpack_from(view, at)
        if total != left:
            raise ReplicationRefused("blank tail at position %d covers %d bytes but this store's segment ends %d "
                                     "bytes later: the master's segment size differs from ours" % (pos, total, left))
    if len(view) - at < left:
        raise ReplicationRefused("chunk ends inside the blank tail at position %d (%d of %d bytes)"
                                 % (pos, len(view) - at, left))
    if left >= MARKER.size:
        at += MARKER.size
        left -= MARKER.size
    if left and bytes(view[at:at + left]).count(0) != left:
        raise ReplicationRefused("blank tail at position %d holds non-zero bytes (corrupt chunk)" % pos)


def _check_record(view, at, pos, left, n):
    """``(key, offset, total, tag, msg_id)`` of the record at ``at``; raises ReplicationRefused."""
    if n - at < MARKER.size:
        raise ReplicationRefused("chunk ends inside a record header at position %d" % pos)
    total, magic = MARKER.unpack_from(view, at)
    if magic != MESSAGE_MAGIC:
        raise ReplicationRefused("no record at position %d (magic %#010x): corrupt chunk" % (pos, magic))
    if total > left:
        raise ReplicationRefused("record at position %d (%d bytes) would cross this store's segment end %d bytes "
                                 "later: corrupt chunk or a master with another segment size" % (pos, total, left))
    if total > n - at:
        raise ReplicationRefused("chunk ends inside the record at position %d (%d of %d bytes)" % (pos, n - at, total))
    if check_record(view, at, at + total) != total:
        raise ReplicationRefused("record at position %d fails its structure or CRC check: corrupt chunk" % pos)
    _t, _m, _c, part, qoff, _s, _b, tlen = PREFIX.unpack_from(view, at)
    try:
        topic = limits.validate_topic(bytes(view[at + TOPIC_START:at + TOPIC_START + tlen]).decode("utf-8"))
    except (UnicodeDecodeError, InvalidTopic) as exc:
        raise ReplicationRefused("record at position %d has an illegal topic: %s" % (pos, exc)) from None
    if not 0 <= part < limits.MAX_PARTITIONS or qoff < 0:
        raise ReplicationRefused("record at position %d has partition %d offset %d: out of range" % (pos, part, qoff))
    h = at + TOPIC_START + tlen
    _len, _chk, msg_id, flag = HEADER.unpack_from(view, h)
    tag = tag_hash(flag, view[h + HEADER.size:at + total]) if flag & 1 else 0
    return (topic, part), qoff, total, tag, msg_id


def _apply(acc, plan, view, now_ms):
    lg = acc.log
    positions = acc.positions
    last_id = None
    for kind, pos, at, total, key, qoff, tag, msg_id in plan.units:
        if kind == "tail":
            seg = lg.active
            new = _roll(acc, pos, now_ms)  # writes the same blank marker the master wrote
            seg.view[pos - seg.start:seg.size] = view[at:at + total]
            positions.skip_to(new.start)
            continue
        p = acc.parts.make(*key)
        if key in plan.first and p.max == 0:
            p.min = p.max = p.visible = plan.first.pop(key)
        t = acc.index_tail(p, qoff)  # before the record, as put does
        seg = lg.active
        if seg is None or pos == seg.end:
            seg = _roll(acc, pos, now_ms)
        rel = pos - seg.start
        if rel + total > seg.ready:
            seg.advance_ready(rel)
        seg.view[rel:rel + total] = view[at:at + total]
        UNIT.pack_into(t.mm, (qoff - t.start) * UNIT_SIZE, pos, total, tag)
        positions.advance(p, qoff, pos + total, total)
        if last_id is None or msg_id > last_id:
            last_id = msg_id
    return positions.written, last_id


def _roll(acc, pos, now_ms):
    """Start the next segment as the master did at ``pos`` (DiskFull changes nothing)."""
    state = acc.check_disk()
    if state.refusing_writes:
        raise DiskFull(state.reason)
    seg = acc.log.roll(pos, now_ms)
    seg.advance_ready(0)
    return seg


# -- truncation ------------------------------------------------------------------


def truncate_log(acc, position):
    """Cut the log back to the record boundary ``position``; returns a TruncateReport (logged).

    The caller then writes a checkpoint (the flushed and checkpointed positions may have moved back)
    and cuts the epoch history.
    """
    check_boundary(acc, position)
    old_end = acc.positions.written
    report = TruncateReport(position, old_end)
    if position == old_end:
        return report
    acc.log.dirs.remove(acc.log.dirs.checkpoint)  # a crash mid-cut leaves no checkpoint claiming what is cut
    first_cut = {}
    for key, qoff, total in _records_between(acc, position, old_end):
        counts = report.partitions.setdefault(key, [0, 0])
        counts[0] += 1
        counts[1] += total
        report.records += 1
        first_cut.setdefault(key, qoff)
    report.bytes = old_end - position
    report.deleted_segments = tuple(acc.log.truncate(position))
    for key, new_max in first_cut.items():
        p = acc.parts[key]
        p.drop(new_max, p.max)
        p.max = p.visible = new_max
        p.fast_end = 0
        p.log_bytes = None
        p.dirty = True
        report.new_max_offsets[key] = new_max
    acc.positions.cut(position)
    log.warning("commit log truncated from %d to %d: %d bytes, %d records cut (%s); segments deleted: %s",
                old_end, position, report.bytes, report.records,
                ", ".join("%s-%d: %d records, %d bytes" % (k + tuple(v)) for k, v in sorted(report.partitions.items()))
                or "no records", ", ".join(report.deleted_segments) or "none")
    return report


def _records_between(acc, start, end):
    """Yield ``(key, offset, total)`` of every record in ``[start, end)`` of this store's log."""
    pos = start
    while pos < end:
        seg = acc.log.segment_at(pos)
        if seg is None:
            return
        rel = pos - seg.start
        total = check_record(seg.view, rel, min(seg.end, end) - seg.start)
        if not total:  # a blank tail: continue in the next segment
            pos = seg.end
            continue
        _t, _m, _c, part, qoff, _s, _b, tlen = PREFIX.unpack_from(seg.view, rel)
        topic = bytes(seg.view[rel + TOPIC_START:rel + TOPIC_START + tlen]).decode("utf-8", "replace")
        yield (topic, part), qoff, total
        pos += total
