"""``metaq-server --verify``: check every record of a stopped broker's whole commit log, offline.

Recovery scans only from the checkpoint, and a read checks only the records it
serves; this walks every segment from its first byte and checks every record
(structure and CRC: ``record.check_record``, a run at a time through
``record.scan_records``, the C helper's when built). It reports each corrupt
record with its segment file, its place in it, its commit-log position and the
topic, partition and offset its header names (they may be the damaged bytes
themselves: the header is not trusted beyond its structure).

It holds the data directory's lock while it runs: a running broker holds it,
so ``verify`` refuses then (``StoreError``) instead of reading segments a broker
is appending to or deleting; a broker cannot start meanwhile. It never writes
to the log: segments are mapped read-only, nothing is repaired or cut.

What is not corruption: a segment's blank tail, and zeros after the last
record of a segment (unwritten space). Bytes past the checkpoint in the last
segment that fail their check, with no valid record after them, are a torn
tail (a crash while writing), which the next start's recovery cuts: reported
as such, not counted as corrupt.
"""

import mmap
import os
from dataclasses import dataclass, field
from typing import List, Optional

from metaq.store.files import DataDir
from metaq.store.recovery import read_checkpoint
from metaq.store.record import (BLANK_MAGIC, CRC_START, FIXED_OVERHEAD, MAGIC_BYTES, MARKER,
                                MESSAGE_MAGIC, MIN_RECORD, PREFIX, TOPIC_START, check_record, scan_records)
from metaq.protocol.checksum import crc32
from metaq.protocol.message import HEADER


@dataclass(frozen=True)
class Finding:
    """One corrupt record (or run of unreadable bytes) found by ``verify_log``."""

    path: str  # the segment file
    rel: int  # the place in it
    position: int  # the commit-log position
    topic: Optional[str]  # as the header names them; None when the header itself is unreadable
    partition: Optional[int]
    offset: Optional[int]
    length: int  # bytes skipped to the next valid record (or segment end)
    reason: str

    def line(self):
        where = "segment %s position %d (commit-log position %d)" % (self.path, self.rel, self.position)
        if self.topic is None:
            return "corrupt: %s: %d unreadable bytes: %s" % (where, self.length, self.reason)
        return "corrupt: %s topic %s partition %d offset %d: %s" % (where, self.topic, self.partition, self.offset,
                                                                     self.reason)


@dataclass
class VerifyReport:
    segments: int = 0
    records: int = 0  # valid records
    bytes: int = 0  # bytes of valid records
    corrupt: List[Finding] = field(default_factory=list)
    torn_tail: Optional[Finding] = None

    def summary(self):
        text = "verified %d segment%s: %d records (%d bytes) valid, %d corrupt" % (
            self.segments, "" if self.segments == 1 else "s", self.records, self.bytes, len(self.corrupt))
        if self.torn_tail is not None:
            text += "; a torn tail of %d bytes at commit-log position %d (the next start's recovery cuts it)" % (
                self.torn_tail.length, self.torn_tail.position)
        return text


def verify_log(data_dir, on_finding=None):
    """Check every record of the commit log under ``data_dir``; returns a ``VerifyReport``.

    ``on_finding(Finding)`` is called as each is found. Raises ``StoreError`` while a broker holds the
    data directory's lock.
    """
    dirs = DataDir(data_dir)
    if not os.path.isdir(dirs.commitlog):
        raise FileNotFoundError("no commit log under %s (is it a metaq data directory?)" % dirs.root)
    dirs.acquire_lock()
    try:
        report = VerifyReport()
        segments = dirs.list_segments()
        cp = read_checkpoint(dirs)
        checkpointed = cp.position if cp is not None else 0
        for i, (start, path) in enumerate(segments):
            report.segments += 1
            _verify_segment(start, path, checkpointed if i == len(segments) - 1 else None, report, on_finding)
        return report
    finally:
        dirs.release_lock()


def _verify_segment(start, path, torn_from, report, on_finding):
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # the pages mapped at once, not one fault each
        with mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ) as mm:
            _scan(mm, start, path, size, torn_from, report, on_finding)


def _scan(mm, start, path, size, torn_from, report, on_finding):
    rel = 0
    while rel < size:
        stop, count = scan_records(mm, rel, size)
        report.bytes += stop - rel
        report.records += count
        rel = stop
        left = size - rel
        if left < MARKER.size:
            if mm[rel:size].strip(b"\0"):
                _found(report, on_finding, _unreadable(path, start, rel, left, "a partial header at the segment end"))
            return
        total, magic = MARKER.unpack_from(mm, rel)
        if magic == BLANK_MAGIC and total == left:
            return  # the segment's blank tail
        if total == 0 and magic == 0 and not _nonzero_after(mm, rel, size):
            return  # unwritten space
        nxt = _next_valid(mm, rel, size)
        finding = _describe(mm, path, start, rel, nxt)
        if torn_from is not None and start + rel >= torn_from and not _nonzero_after(mm, nxt, size):
            report.torn_tail = finding  # past the checkpoint, nothing valid after it: what recovery cuts
            return
        _found(report, on_finding, finding)
        rel = nxt


def _found(report, on_finding, finding):
    report.corrupt.append(finding)
    if on_finding is not None:
        on_finding(finding)


_ZEROS = bytes(1 << 20)


def _nonzero_after(mm, rel, size):
    """True when a byte of ``[rel, size)`` is not zero (compared a MiB at a time: segments are large)."""
    chunk = len(_ZEROS)
    while rel < size:
        n = min(size - rel, chunk)
        if mm[rel:rel + n] != _ZEROS[:n]:
            return True
        rel += n
    return False


def _next_valid(mm, rel, size):
    """The place of the next valid record (or blank tail) after the bad bytes at ``rel``; ``size`` if none.

    A record whose header still holds together is skipped whole; otherwise the next ``MAGIC_BYTES`` that
    starts a valid record is looked for, as recovery's ``examine`` does."""
    total, magic = MARKER.unpack_from(mm, rel)
    if magic == MESSAGE_MAGIC and MIN_RECORD <= total <= size - rel:
        after = rel + total
        if after >= size or _starts_unit(mm, after, size):
            return after
    q = mm.find(MAGIC_BYTES, rel + 5, size)
    while q >= 0:
        r = q - 4
        if check_record(mm, r, size):
            return r
        q = mm.find(MAGIC_BYTES, q + 1, size)
    return size


def _starts_unit(mm, rel, size):
    left = size - rel
    if left < MARKER.size:
        return not mm[rel:size].strip(b"\0")
    total, magic = MARKER.unpack_from(mm, rel)
    return ((magic == BLANK_MAGIC and total == left) or bool(check_record(mm, rel, size))
            or (total == 0 and magic == 0 and not _nonzero_after(mm, rel, size)))


def _describe(mm, path, start, rel, nxt):
    left = len(mm) - rel
    if left >= PREFIX.size:
        total, magic, crc, part, qoff, _s, _b, tlen = PREFIX.unpack_from(mm, rel)
        if magic == MESSAGE_MAGIC and MIN_RECORD <= total <= left and 0 < tlen <= total - FIXED_OVERHEAD:
            topic = bytes(mm[rel + TOPIC_START:rel + TOPIC_START + tlen]).decode("utf-8", "replace")
            (msg_len,) = HEADER.unpack_from(mm, rel + TOPIC_START + tlen)[:1]
            if FIXED_OVERHEAD + tlen + msg_len != total:
                reason = "record size %d does not match its data length %d" % (total, msg_len)
            elif crc32(mm[rel + CRC_START:rel + total]) != crc:
                reason = "CRC mismatch (stored %#010x, computed %#010x)" % (
                    crc, crc32(mm[rel + CRC_START:rel + total]))
            else:
                reason = "damaged record"
            return Finding(path, rel, start + rel, topic, part, qoff, nxt - rel, reason)
    total, magic = MARKER.unpack_from(mm, rel)
    return _unreadable(path, start, rel, nxt - rel, "bad record header (size %d, magic %#010x)" % (total, magic))


def _unreadable(path, start, rel, length, reason):
    return Finding(path, rel, start + rel, None, None, None, length, reason)

