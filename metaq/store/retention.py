"""Retention: which commit-log segments may go (a pure decision), and applying it (``apply_retention``).

Only a prefix of the log is ever deleted, so the segments stay contiguous. A
segment may go only when it is sealed (not the active last one), flushed and
covered by a checkpoint; it goes when it is older than the retention time, or
while the disk is under pressure: its usage above the warn mark, or, with a warn
mark below 1.0, too little free to hold one more segment (a disk that cannot take
the next segment refuses every write once the active one is full, whatever its
usage: a segment larger than the room above the warn mark would otherwise stop
the broker for good). A warn mark of 1.0 deletes nothing early. The rule is the
store's, so a master and a slave follow it alike.
"""

import logging
from dataclasses import dataclass, field
from typing import List

from metaq.store.files import disk_usage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentInfo:
    """What the decision needs to know about one segment, oldest first."""

    path: str
    size: int
    mtime_ms: int
    deletable: bool  # sealed, flushed and checkpointed


@dataclass
class RetentionReport:
    deleted_segments: List[str] = field(default_factory=list)
    freed_bytes: int = 0
    deleted_index_files: List[str] = field(default_factory=list)
    raised_min_offsets: dict = field(default_factory=dict)  # (topic, partition) -> new min offset
    reason: str = ""
    pressured_segments: int = 0  # of the deleted, those young enough to keep but for the disk's usage


def plan_deletion(segments, now_ms, retention_ms, usage_ratio=None, warn_ratio=1.0, disk_total_bytes=None,
                  free_bytes=None, segment_size=None):
    """How many of the oldest ``segments`` to delete, and why (a short text).

    ``usage_ratio`` above ``warn_ratio`` deletes the oldest deletable segments,
    even young ones, until the ratio (estimated with ``disk_total_bytes``, df's used + available)
    drops to the mark; so does ``free_bytes`` (df's available) below ``segment_size`` with a
    warn mark below 1.0, until the next segment fits (``short_of_room``).
    """
    count = 0
    expired = pressured = 0
    ratio, free = usage_ratio, free_bytes
    for seg in segments:
        if not seg.deletable:
            break
        if now_ms - seg.mtime_ms > retention_ms:
            expired += 1
        elif (ratio is not None and ratio > warn_ratio) or short_of_room(free, segment_size, warn_ratio):
            pressured += 1
        else:
            break
        count += 1
        if ratio is not None and disk_total_bytes:
            ratio -= seg.size / disk_total_bytes
        if free is not None:
            free += seg.size
    reasons = []
    if expired:
        reasons.append("%d older than the retention time" % expired)
    if pressured:
        if usage_ratio is not None and usage_ratio > warn_ratio:
            reasons.append("%d to bring disk usage %.1f%% below the warn mark %.0f%%"
                           % (pressured, usage_ratio * 100, warn_ratio * 100))
        else:
            reasons.append("%d to make room for the next %d-byte segment (%d bytes free)"
                           % (pressured, segment_size, free_bytes))
    return count, "; ".join(reasons)


def short_of_room(free_bytes, segment_size, warn_ratio):
    """True when a disk with ``free_bytes`` available cannot hold one more ``segment_size`` segment and the warn mark
    ``warn_ratio`` allows early deletion at all (below 1.0)."""
    return (free_bytes is not None and segment_size is not None and warn_ratio < 1.0
            and free_bytes < segment_size)


def first_kept_offset(pidx, log_start):
    """The new min offset of a partition once the log starts at ``log_start``."""
    return pidx.first_at_or_after(log_start, max(pidx.min, pidx.first_start), pidx.max)


def apply_retention(log_, partitions, limit, written, root, config, now_ms, disk_usage_ratio=None, floor=None):
    """Delete the sealed segments ``plan_deletion`` picks among those wholly below ``limit`` (flushed and
    checkpointed) and ``floor`` (None, or the timer index's: records it has not indexed yet stay; docs/messaging.md
    "Any delivery time"), raise each partition's first offset past them and drop its index files below it."""
    if floor is not None:
        limit = min(limit, floor)
    infos = []
    for seg in log_.segments[:-1]:
        if seg.end > limit:
            break
        infos.append(SegmentInfo(seg.file.path, seg.size, seg.file.mtime_ms(), True))
    total = free = None
    if disk_usage_ratio is not None:  # what each deleted segment takes off the ratio: df's denominator, not the size
        usage = disk_usage(root)
        total, free = usage.used_bytes + usage.available_bytes, usage.available_bytes
    count, reason = plan_deletion(infos, now_ms, config.retention_ms, disk_usage_ratio, config.disk_warn_ratio, total,
                                  free, config.segment_size)
    report = RetentionReport(reason=reason, pressured_segments=sum(
        1 for seg in infos[:count] if now_ms - seg.mtime_ms <= config.retention_ms))
    if count:
        for seg in log_.delete_oldest(count):
            report.deleted_segments.append(seg.file.path)
            report.freed_bytes += seg.size
        log.info("retention deleted %d segments (%d bytes): %s", count, report.freed_bytes, reason)
    log_start = log_.start if log_.start is not None else written
    for p in partitions:
        new_min = first_kept_offset(p, log_start)
        if new_min > p.min:
            p.min = new_min
            p.log_bytes = None
            report.raised_min_offsets[p.key] = new_min
        report.deleted_index_files.extend(p.delete_files_below(p.min))
    return report
