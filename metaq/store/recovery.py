"""Recovery: a scan that reports what it found, then a separate, logged decision to cut.

1. ``scan`` walks the commit log from a position, checks every record (magic,
   size, CRC) and hands the valid ones' index units, in batches
   (``recovery_scan.scan_log``: in C when built), to the rebuilder; where it stops it
   ``examine``s the rest of the log: all zeros is a clean end; otherwise it
   measures the damage and looks for any valid record further on.
2. ``decide`` turns that into nothing, a cut of a torn tail, or ``CorruptLog``
   (damage followed by valid records) unless recovery is forced.
3. ``IndexRebuilder`` makes the index unit of every scanned record equal to
   what a clean run writes; ``settle_partitions`` drops units nothing confirms;
   ``unitcheck.check_units`` rebuilds from the log the units that do not name their records.

Before all that, ``read_checkpoint`` and ``untrusted_reason`` say where the
scan may start (the checkpoint) and whether the index can be trusted up to it.
A checkpoint that does not name the current ``index.TAG_FORMAT`` (one an older
broker wrote) makes the index untrusted: the full scan rewrites every unit's tag
hash before the broker serves a filtered read (docs/messaging.md "Tag filtering").

``read_log`` reads a stopped broker's log offline (for checkers and tools).
"""

import logging
import os
from dataclasses import dataclass
from typing import Optional

from metaq import limits
from metaq.store import limits as store_limits
from metaq.errors import CorruptLog, InvalidTopic, StoreError
from metaq.protocol.checksum import crc32
from metaq.protocol.message import HEADER
from metaq.store.files import CHECKPOINT_MAGIC, CLEAN_MAGIC
from metaq.store import recovery_scan, unitcheck
from metaq.store.index import TAG_FORMAT, UNIT_SIZE, check_units_trusted
from metaq.store.record import (BLANK_MAGIC, FIXED_OVERHEAD, MAGIC_BYTES, MARKER, MESSAGE_MAGIC, MIN_RECORD,
                                PREFIX, check_record, decode_record)
from metaq.store.results import Checkpoint

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What recovery found and did (all positions are commit-log positions)."""

    clean_shutdown: bool = False
    full_scan: bool = False
    scanned_from: int = 0
    scanned_bytes: int = 0
    records_scanned: int = 0
    log_end: int = 0
    truncated_bytes: int = 0
    truncated_records: int = 0
    index_units_rebuilt: int = 0
    index_units_dropped: int = 0
    index_units_repaired: int = 0  # units that did not name their records, rebuilt from the log (unitcheck.py)
    corruption: Optional[str] = None
    stop_reason: str = ""
    untrusted_index: Optional[str] = None
    deleted_segments: tuple = ()


@dataclass
class Damage:
    """Non-zero bytes where the scan stopped."""

    path: str
    position: int  # commit-log position of the first bad byte (= end of the last good record)
    file_offset: int
    reason: str
    nonzero_bytes: int  # bytes from ``position`` to the last non-zero byte, over every segment
    magic_count: int  # record headers that look like ours among them
    valid_after: Optional[int]  # position of a valid record further on, if any
    valid_after_path: Optional[str] = None


@dataclass
class ScanOutcome:
    start: int
    end: int
    records: int = 0
    last_msg_id: Optional[int] = None
    stop_reason: str = ""
    damage: Optional[Damage] = None


def int_or_none(value):
    return value if isinstance(value, int) else None


def read_checkpoint(dirs):
    """The checkpoint (``Checkpoint``) of the data dir, or None if it is missing or unusable (logged)."""
    state = dirs.read_state(dirs.checkpoint, CHECKPOINT_MAGIC)
    if state is None:
        return None
    try:
        floors = {(str(t), int(p)): int(n) for t, p, n in state["partitions"]}
        return Checkpoint(int(state["position"]), int_or_none(state.get("last_msg_id")), floors,
                          state.get("serial"), state.get("tag_format"))
    except (KeyError, TypeError, ValueError):
        log.warning("checkpoint %s has an unexpected content: ignored", dirs.checkpoint)
        return None


def untrusted_reason(log_, parts, cp, log_start):
    """Why the index (``parts``: key -> PartitionIndex) cannot be trusted up to the checkpoint (None if it can)."""
    if cp is None:
        return "no valid checkpoint"
    if cp.tag_format != TAG_FORMAT:  # units of an older broker: their tag hash is rebuilt before any filtered read
        return ("the index units hold the tag hash of an older format (%s, now %d): every unit is rebuilt from the "
                "log" % (cp.tag_format, TAG_FORMAT))
    c = cp.position
    segs = log_.segments
    if c < log_start or (segs and c > segs[-1].end):
        return "checkpoint position %d lies outside the log" % c
    ends_at_c = c == log_start
    for key, floor in cp.floors.items():
        p = parts.get(key)
        if p is None:
            if floor > 0:
                return "the index of %s-%d is missing" % key
            continue
        problem = check_units_trusted(p, floor)
        if problem:
            return problem
        if floor > p.first_start:
            phys, size, _tag = p.unit(floor - 1)
            if phys >= log_start:
                seg = log_.segment_at(phys)
                if seg is None or phys + size > c or check_record(seg.file.mm, phys - seg.start, seg.size) != size:
                    return "unit %d of %s-%d does not match a valid record" % ((floor - 1,) + key)
                ends_at_c = ends_at_c or phys + size == c
    if not ends_at_c:
        return "no indexed record ends at the checkpoint position %d" % c
    return None


def scan(log_, start, apply):
    """Scan the commit log from ``start``; ``apply(units, runs)`` takes each batch of valid records' index units
    (``recovery_scan.scan_log``: runs of one topic-partition with consecutive offsets)."""
    segs = log_.segments
    i = log_.index_of(start)
    out = ScanOutcome(start, start)
    if i >= len(segs):
        out.stop_reason = "end of the last segment"
        return out
    pos = start
    while i < len(segs):
        seg = segs[i]
        rel, stop = _scan_segment(seg, pos - seg.start, apply, out)
        out.end = seg.start + rel
        if stop is not None:
            out.stop_reason = stop
            if stop != "segment end":
                out.damage = examine(segs, i, rel, stop)
                return out
        i += 1
        if i < len(segs):
            pos = segs[i].start
    out.stop_reason = "end of the last segment"
    return out


def _scan_segment(seg, rel, apply, out):
    """Scan one segment from ``rel`` in batches of at most ``limits.RECOVERY_SCAN_RECORDS`` records; returns
    ``(rel, stop)`` where stop says why it ended."""
    mm, size = seg.file.mm, seg.size
    seg.file.prefetch(rel, size)  # page faults would otherwise dominate the scan
    refuse_unreadable(seg, rel, seg.file.nonzero_end(rel))
    while True:
        rel, count, max_id, units, runs = recovery_scan.scan_log(mm, rel, size, seg.start,
                                                                 store_limits.RECOVERY_SCAN_RECORDS)
        if count:
            apply(units, runs)
            out.records += count
            if out.last_msg_id is None or max_id > out.last_msg_id:
                out.last_msg_id = max_id  # the largest, not the last: transaction commits append ids out of order
        stop = stop_reason(mm, seg.view, rel, size)
        if stop is not None:
            return rel, stop
        if not count:
            raise AssertionError("recovery scan stopped at a valid record (relative position %d)" % rel)


def refuse_unreadable(seg, rel, end):
    """StoreError naming the file and place when a page of ``seg``'s ``[rel, end)`` cannot be read from the disk:
    the scan would read it through the map, and die of SIGBUS at every start with nothing said."""
    bad = seg.file.unreadable(rel, end)
    if bad is not None:
        raise StoreError("cannot read %s at byte %d (log position %d): the disk answers an I/O error there. Restore "
                         "the file from a copy or a slave; reading it would kill the broker (SIGBUS)"
                         % (seg.file.path, bad, seg.start + bad))


def stop_reason(mm, buf, rel, size):
    """Why a scan stops at ``rel`` of a segment (``mm``/``buf``: its map and a view of it); None when a valid
    record starts there. "segment end" is a clean end of the segment."""
    left = size - rel
    if left < MARKER.size:
        return "segment end" if not mm[rel:size].strip(b"\0") else "partial record header"
    if left < MIN_RECORD:
        total, magic = MARKER.unpack_from(mm, rel)
        return _marker_stop(total, magic, left)
    total, magic, crc, _part, _qoff, _sts, _bts, tlen = PREFIX.unpack_from(mm, rel)
    if magic != MESSAGE_MAGIC:
        return _marker_stop(total, magic, left)
    if total < MIN_RECORD or total > left or tlen < 1 or FIXED_OVERHEAD + tlen > total:
        return "bad record size %d (topic length %d, %d bytes left)" % (total, tlen, left)
    msg_len = HEADER.unpack_from(mm, rel + 42 + tlen)[0]
    if FIXED_OVERHEAD + tlen + msg_len != total:
        return "record size %d does not match its data length %d" % (total, msg_len)
    if crc32(buf[rel + 12:rel + total]) != crc:
        return "CRC mismatch"
    return None


def _marker_stop(total, magic, left):
    if magic == BLANK_MAGIC and total == left:
        return "segment end"
    if total == 0 and magic == 0:
        return "zero header"
    return "bad record header (size %d, magic %#010x)" % (total, magic)


def examine(segs, i, rel, reason):
    """Measure what lies after the stop point; None when it is all zeros (a clean end)."""
    seg = segs[i]
    nonzero = seg.file.nonzero_end(rel) - rel
    extents = [(seg, rel, rel + nonzero)]
    for later in segs[i + 1:]:
        end = later.file.nonzero_end(0)
        nonzero += end
        extents.append((later, 0, end))
    if nonzero == 0:
        return None
    magic_count, valid_at, valid_path = 0, None, None
    for s, lo, hi in extents:
        q = s.file.mm.find(MAGIC_BYTES, lo, hi)
        while q >= 0:
            magic_count += 1
            r = q - 4
            if valid_at is None and r > (rel if s is seg else -1) and check_record(s.file.mm, r, s.size):
                valid_at, valid_path = s.start + r, s.file.path
            q = s.file.mm.find(MAGIC_BYTES, q + 1, hi)
    return Damage(seg.file.path, seg.start + rel, rel, reason, nonzero, magic_count, valid_at, valid_path)


@dataclass
class Cut:
    position: int
    bytes: int
    records: int
    corruption: Optional[str]


def decide(damage, force, durable_end=0):
    """Nothing to do (None), a cut, or CorruptLog when valid records follow the damage or it lies below
    ``durable_end`` (the checkpoint's position: everything below it was fsynced before, so no crash tore it)."""
    if damage is None:
        return None
    records = max(1, damage.magic_count)
    where = "%s at byte %d (log position %d)" % (damage.path, damage.file_offset, damage.position)
    if damage.valid_after is None and damage.position >= durable_end:
        log.warning("recovery: torn tail in %s: %s; cutting %d bytes (%d records) there",
                    where, damage.reason, damage.nonzero_bytes, records)
        return Cut(damage.position, damage.nonzero_bytes, records, None)
    if damage.valid_after is None:
        msg = ("corrupt commit log: %s: %s, below the checkpoint position %d (on disk before the last run ended: "
               "not a torn tail)" % (where, damage.reason, durable_end))
    else:
        msg = ("corrupt commit log: %s: %s, but a valid record follows at log position %d (%s)"
               % (where, damage.reason, damage.valid_after, os.path.basename(damage.valid_after_path)))
    if not force:
        raise CorruptLog("refusing to start: %s. Repair or restore the data, or start with force_recovery "
                         "(--force-recovery) to cut the log there, discarding %d bytes"
                         % (msg, damage.nonzero_bytes), damage.path, damage.position)
    log.error("recovery forced: %s; cutting %d bytes (%d records) there", msg, damage.nonzero_bytes, records)
    return Cut(damage.position, damage.nonzero_bytes, records, msg)


class IndexRebuilder:
    """The scan's sink: makes unit ``offset`` of each record's partition equal what the log says."""

    def __init__(self, partition_for):
        self._partition_for = partition_for  # (topic, partition) -> PartitionIndex
        self._cache = {}
        self.seen = {}  # PartitionIndex -> last offset seen
        self.rebuilt = 0
        self.skipped = 0

    def apply(self, units, runs):
        """Write each run of ``units`` (``recovery_scan.scan_log``'s batch) into its partition's index files."""
        write = recovery_scan.write_units
        for topic_bytes, partition, offset, at, n in runs:
            key = (topic_bytes, partition)
            pidx = self._cache.get(key)
            if pidx is None:
                pidx = self._cache[key] = self._resolve(topic_bytes, partition)
            if pidx is False:
                self.skipped += n
                continue
            self.seen[pidx] = offset + n - 1
            at *= UNIT_SIZE
            while n:
                f = pidx.tail
                if f is None or not f.start <= offset < f.end:
                    f = pidx.reserve(offset)
                k = min(n, f.end - offset)
                changed = write(f.mm, (offset - f.start) * UNIT_SIZE, units, at, k)
                if changed:
                    pidx.dirty = True
                    self.rebuilt += changed
                offset += k
                at += k * UNIT_SIZE
                n -= k

    def _resolve(self, topic_bytes, partition):
        try:
            topic = limits.validate_topic(topic_bytes.decode("utf-8"))
            if not 0 <= partition < limits.MAX_PARTITIONS:
                raise InvalidTopic("partition %d out of range" % partition)
        except (UnicodeDecodeError, InvalidTopic) as exc:
            log.warning("recovery: records of %r-%d cannot be indexed (%s); skipped", topic_bytes, partition, exc)
            return False
        return self._partition_for(topic, partition)


def settle_partitions(partitions, seen, floors, full, log_start):
    """Set every partition's max/min from the scan and drop units nothing confirms; returns units dropped."""
    dropped = 0
    for key, p in partitions.items():
        last = seen.get(p)
        floor = floors.get(key)
        if not full:
            new_max = last + 1 if last is not None else (floor if floor is not None else p.first_start)
            dropped += p.drop(new_max, p.find_end(new_max))
        else:
            used = p.last_used(last + 1 if last is not None else None)
            new_max = last + 1 if last is not None else _kept_max(p, used, log_start, floor)
            if floor is not None and floor > new_max:  # a forced recovery lost records the checkpoint counted:
                new_max = floor  # their offsets are never given out again (reads of them: corrupt records)
            if used is not None and used >= new_max:
                dropped += p.drop(new_max, used + 1)
        p.max = p.visible = new_max
        p.min = p.first_at_or_after(log_start, p.first_start, new_max)
    return dropped


def _kept_max(p, used, log_start, floor):
    """After a full scan that met no record of ``p``: one past its last unit below the log start."""
    new_max = p.first_start
    n = used
    while n is not None and n >= p.first_start:
        phys, size, _tag = p.unit(n)
        if size and phys < log_start:
            new_max = n + 1
            break
        n -= 1
    if floor is not None and floor > new_max:
        new_max = floor  # never hand out an offset the checkpoint counted again
    return new_max


def scan_and_repair(log_, parts, make_partition, report, cp, floors, log_start, force):
    """Scan the log from the checkpoint (or all of it), cut a torn tail, rebuild index units; fills ``report``.

    Returns ``(log end, last message id seen or None)``.
    """
    full = report.full_scan = cp is None or report.untrusted_index is not None
    if full and cp is not None:
        log.warning("recovery: index not trusted (%s): full scan", report.untrusted_index)
    start = log_start if full else cp.position
    rebuilder = IndexRebuilder(make_partition)
    outcome = scan(log_, start, rebuilder.apply)
    durable = cp.position if cp is not None else 0
    cut = decide(outcome.damage, force, durable)
    end = outcome.end
    if cut is None and end < durable:  # the log stops early, cleanly: a segment lost or emptied
        lost = ("the commit log ends at position %d, below the checkpoint position %d: data that was on disk is "
                "missing (a segment file lost, emptied or cut)" % (end, durable))
        if not force:
            raise CorruptLog("refusing to start: %s. Restore the data, or start with force_recovery "
                             "(--force-recovery) to go on from %d; the offsets the checkpoint counted are not "
                             "given out again" % (lost, end), log_.dirs.commitlog, end)
        log.error("recovery forced: %s; going on from %d", lost, end)
        report.corruption = lost
    if cut is not None:
        report.deleted_segments = tuple(log_.truncate(cut.position))
        report.truncated_bytes, report.truncated_records = cut.bytes, cut.records
        report.corruption = cut.corruption
    report.scanned_from, report.scanned_bytes = start, end - start
    report.records_scanned, report.stop_reason = outcome.records, outcome.stop_reason
    report.index_units_rebuilt = rebuilder.rebuilt
    report.index_units_dropped = settle_partitions(parts, rebuilder.seen, floors, full, log_start)
    log_.flush_range(start, end)
    log.info("recovery scanned %d bytes (%d records) from position %d to %d: %s; index units rebuilt %d, "
             "dropped %d", report.scanned_bytes, outcome.records, start, end, outcome.stop_reason,
             report.index_units_rebuilt, report.index_units_dropped)
    return end, outcome.last_msg_id


def recover(dirs, log_, parts, make_partition, index_problem, force):
    """``MessageStore.open``'s recovery: ``(RecoveryReport, last message id or None, log end)``; a clean restart
    (marker matching the checkpoint, indexes trusted) skips the scan. The segments past the end are dropped."""
    cp = read_checkpoint(dirs)
    marker = dirs.read_state(dirs.clean_shutdown, CLEAN_MAGIC)
    dirs.remove(dirs.clean_shutdown)
    log_start = log_.start
    if log_start is None:
        log_start = cp.position if cp is not None else 0
    untrusted = index_problem or untrusted_reason(log_, parts, cp, log_start)
    report = RecoveryReport(untrusted_index=untrusted)
    floors = cp.floors if cp is not None else {}
    if (marker is not None and untrusted is None and marker.get("end") == cp.position
            and marker.get("checkpoint_serial") == cp.serial):
        report.clean_shutdown = True
        end = report.scanned_from = cp.position
        last_id = int_or_none(marker.get("last_msg_id"))
        report.index_units_dropped = settle_partitions(parts, {}, floors, False, log_start)
        log.info("clean restart: recovery scan skipped (log end %d)", end)
    else:
        if marker is not None:
            log.warning("clean-shutdown marker ignored: %s", untrusted or "it disagrees with the checkpoint")
        end, last_id = scan_and_repair(log_, parts, make_partition, report, cp, floors, log_start, force)
        if cp is not None and cp.last_msg_id is not None:  # ids handed out before the crash stay used
            last_id = cp.last_msg_id if last_id is None else max(last_id, cp.last_msg_id)
    report.deleted_segments += tuple(log_.drop_after(end))
    # units a lost write left empty (or naming another place) below a checkpoint's floors pass untrusted_reason,
    # which looks at each file's last unit only: rebuilt from the log before anything is served
    report.index_units_repaired = unitcheck.check_units(log_, parts.values(), end)
    log_.set_write_position(end)
    report.log_end = end
    return report, last_id, end


def read_log(data_dir):
    """Yield every valid ``LogRecord`` of a stopped broker's commit log, in log order.

    Stops at the first zero or damaged record, as recovery would.
    """
    from metaq.store.files import DataDir  # local: tools only

    for start, path in DataDir(data_dir).list_segments():
        with open(path, "rb") as f:
            data = f.read()
        rel = 0
        while len(data) - rel >= MARKER.size:
            total, magic = MARKER.unpack_from(data, rel)
            if magic == BLANK_MAGIC and total == len(data) - rel:
                break
            if not check_record(data, rel, len(data)):
                return
            yield decode_record(data, rel, start + rel)
            rel += total
