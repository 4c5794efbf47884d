"""The commit log: contiguous, preallocated, memory-mapped segments shared by every topic.

Segment *k+1* starts where segment *k* ends (``start + size``). Only the last
segment is written. ``layout`` is a ``(starts, segments)`` tuple replaced as a
whole on every roll or deletion, so a worker thread that took it keeps a
consistent snapshot while the event loop carries on.
"""

import bisect
import logging
import os

from metaq.errors import StoreError
from metaq.store.mapped import MappedFile
from metaq.store.record import BLANK_MAGIC, MARKER

log = logging.getLogger(__name__)


#: How far ahead of the writer segment pages are prefetched.
PREFETCH_BYTES = 32 << 20


class Segment:
    """One commit-log file covering positions ``[start, end)``.

    ``ready`` is the relative offset up to which pages were prefetched; a
    write that would cross it goes through ``CommitLog.make_room``.
    """

    __slots__ = ("start", "end", "size", "file", "view", "ready")

    def __init__(self, start, file):
        self.start = start
        self.size = file.size
        self.end = start + file.size
        self.file = file
        self.view = file.view
        self.ready = 0

    def prefetch(self, rel):
        """Prefetch from ``rel`` to ``rel + PREFETCH_BYTES``."""
        self.ready = min(self.size, rel + PREFETCH_BYTES)
        self.file.prefetch(rel, self.ready)

    def __repr__(self):
        return "Segment(%s, %d bytes)" % (os.path.basename(self.file.path), self.size)


class CommitLog:
    def __init__(self, dirs, segment_size):
        self.dirs = dirs
        self.segment_size = segment_size
        self.layout = ((), ())
        self.active = None  # the segment the next record goes to (None: none yet)

    # -- loading -------------------------------------------------------------

    def load(self):
        """Map every segment; a gap or overlap between segments refuses to start."""
        found = self.dirs.list_segments()
        if found and os.path.getsize(found[-1][1]) == 0:
            log.warning("removing the empty segment file %s (interrupted creation)", found[-1][1])
            os.unlink(found[-1][1])
            found.pop()
        segments = []
        for start, path in found:
            seg = Segment(start, MappedFile.open(path))
            if segments and segments[-1].end != start:
                prev = segments[-1]
                raise StoreError("commit-log segments are not contiguous: %s ends at %d but %s starts at %d"
                                 % (prev.file.path, prev.end, path, start))
            segments.append(seg)
        self._set(segments)

    def _set(self, segments):
        self.layout = (tuple(s.start for s in segments), tuple(segments))

    @property
    def segments(self):
        return self.layout[1]

    @property
    def start(self):
        """Position of the oldest byte still in the log (None if there are no segments)."""
        segs = self.layout[1]
        return segs[0].start if segs else None

    def segment_at(self, pos):
        """The segment containing ``pos``, or None."""
        starts, segs = self.layout
        i = bisect.bisect_right(starts, pos) - 1
        if i >= 0 and pos < segs[i].end:
            return segs[i]
        return None

    def index_of(self, pos):
        """Index in ``segments`` of the segment containing ``pos`` (len(segments) past the end)."""
        starts, segs = self.layout
        i = bisect.bisect_right(starts, pos) - 1
        if i >= 0 and pos < segs[i].end:
            return i
        return len(segs) if not segs or pos >= segs[-1].end else 0

    def set_write_position(self, pos):
        """Point the writer at ``pos`` (after recovery)."""
        seg = self.segment_at(pos)
        segs = self.layout[1]
        if seg is None and segs and pos == segs[-1].end:
            seg = segs[-1]
        self.active = seg

    # -- writing -------------------------------------------------------------

    def make_room(self, pos, total, now_ms):
        """The segment where a ``total``-byte record goes when it does not fit before ``active.ready``.

        Either the active segment (prefetching further) or a new one (``roll``).
        """
        seg = self.active
        if seg is not None:
            rel = pos - seg.start
            if rel + total <= seg.size:
                seg.prefetch(rel)
                return seg
        seg = self.roll(pos, now_ms)
        seg.prefetch(0)
        return seg

    def roll(self, pos, now_ms):
        """Start a new segment because a record does not fit at ``pos`` (returns it).

        The new file is allocated first (DiskFull leaves everything unchanged);
        then the old segment gets its blank tail and its mtime set to ``now_ms``.
        """
        old = self.active
        start = old.end if old is not None else pos
        new = Segment(start, MappedFile.create(self.dirs.segment_path(start), self.segment_size))
        if old is not None:
            rel = pos - old.start
            left = old.size - rel
            if left >= MARKER.size:
                MARKER.pack_into(old.file.mm, rel, left, BLANK_MAGIC)
            try:
                old.file.set_mtime_ms(now_ms)
            except OSError as exc:
                log.warning("could not set the mtime of %s: %s", old.file.path, exc)
        self._set(self.layout[1] + (new,))
        self.active = new
        return new

    # -- flushing ------------------------------------------------------------

    def flush_range(self, start, end, segments=None):
        """Make ``[start, end)`` durable (BLOCKING). Uses a snapshot of the segments."""
        for seg in segments if segments is not None else self.layout[1]:
            if seg.end > start and seg.start < end:
                seg.file.flush(max(start, seg.start) - seg.start, min(end, seg.end) - seg.start)

    # -- trimming ------------------------------------------------------------

    def truncate(self, pos):
        """Cut the log at ``pos``: zero the rest of its segment, delete the later segments.

        Returns the deleted segment paths.
        """
        i = self.index_of(pos)
        segs = list(self.layout[1])
        deleted = []
        if i < len(segs):
            seg = segs[i]
            rel = pos - seg.start
            seg.file.zero(rel, seg.file.nonzero_end(rel))
            seg.file.flush(rel)
            keep = i + 1
        else:
            keep = len(segs)
        for seg in segs[keep:]:
            seg.file.delete()
            deleted.append(seg.file.path)
        self._set(segs[:keep])
        self.set_write_position(pos)
        return deleted

    def drop_after(self, pos):
        """Delete the (empty) segments after the one holding ``pos``; returns their paths."""
        i = self.index_of(pos)
        segs = self.layout[1]
        if i >= len(segs) - 1:
            return []
        gone = segs[i + 1:]
        self._set(segs[:i + 1])
        for seg in gone:
            log.info("removing %s: it lies after the end of the log (%d)", seg.file.path, pos)
            seg.file.delete()
        return [seg.file.path for seg in gone]

    def delete_oldest(self, count):
        """Delete the ``count`` oldest segments (the caller checked they may go)."""
        segs = self.layout[1]
        gone = segs[:count]
        self._set(segs[count:])
        for seg in gone:
            seg.file.delete()
        return gone

    def close(self):
        for seg in self.layout[1]:
            seg.file.close()
        self.layout = ((), ())
        self.active = None
