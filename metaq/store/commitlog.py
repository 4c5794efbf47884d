"""The commit log: contiguous, preallocated, memory-mapped segments shared by every topic.

Segment *k+1* starts where segment *k* ends (``start + size``). Only the last
segment is written. ``layout`` is a ``(starts, segments)`` tuple replaced as a
whole on every roll or deletion, so a worker thread that took it keeps a
consistent snapshot while the event loop carries on.

Working ahead (``prepare_next`` and ``populate_ahead``, BLOCKING, one worker
thread at a time): the worker builds the next segment under a ``.prepared``
name (fallocate, map, prefault its first pages) and publishes the finished
``Segment`` with one attribute assignment (``next``); a roll on the loop thread
takes it only if it starts where the new segment must start, renames it and
leaves the directory fsync to the next ``flush_range``. The loop never creates
a ``.prepared`` file and the worker never creates a final name, so neither can
meet a half-built file of the other. The worker also prefaults the active
segment ahead of the writer (``Segment.populated``); the loop only reads that
mark (``Segment.ready`` is the loop's own).

Descriptors: a flush round opens nothing. The log keeps the commit-log
directory open from ``load`` to ``close`` and an fd for each segment that may
still need a flush (the active one, the prepared next one, and those not yet
flushed); ``release_flushed`` (loop thread, after a flush round, when no flush
is running) closes the fds of segments wholly flushed and of segments deleted
meanwhile. So the log holds a handful of descriptors whatever its length.
"""

import bisect
import logging
import os
from collections import deque

from metaq.errors import StoreError
from metaq.store.limits import MAX_CUTS_REMEMBERED
from metaq.store.files import close_now, fsync_dir, fsync_fd, prepared_path, unlink_quietly
from metaq.store.mapped import MappedFile, adopt_prepared, close_files
from metaq.store.record import BLANK_MAGIC, MARKER

log = logging.getLogger(__name__)


#: How far ahead of the writer the worker keeps pages prefaulted (``populate_ahead``).
POPULATE_BYTES = 16 << 20
#: What the loop prefetches (MADV_WILLNEED) itself when the worker did not keep up.
FALLBACK_PREFETCH_BYTES = 8 << 20
#: After a failed preparation, how much the log must grow (in segment sizes) before the next try.
RETRY_FRACTION = 16


class Segment:
    """One commit-log file covering positions ``[start, end)``.

    ``ready`` (loop thread) is the relative offset up to which the writer needs
    no look at prefaulting; a write that would cross it goes through
    ``CommitLog.make_room``. ``populated`` (worker thread) is how far the worker
    has prefaulted.
    """

    __slots__ = ("start", "end", "size", "file", "view", "ready", "populated")

    def __init__(self, start, file):
        self.start = start
        self.size = file.size
        self.end = start + file.size
        self.file = file
        self.view = file.view
        self.ready = 0
        self.populated = 0

    def advance_ready(self, rel):
        """Loop thread, at ``rel``: take the worker's mark, or prefetch a little (the fallback)."""
        if self.populated > rel:
            self.ready = self.populated
        else:
            self.ready = min(self.size, rel + FALLBACK_PREFETCH_BYTES)
            self.file.prefetch(rel, self.ready)

    def __repr__(self):
        return "Segment(%s, %d bytes)" % (os.path.basename(self.file.path), self.size)


class CommitLog:
    def __init__(self, dirs, segment_size):
        self.dirs = dirs
        self.segment_size = segment_size
        self.layout = ((), ())
        self.active = None  # the segment the next record goes to (None: none yet)
        self.next = None  # worker thread: a prepared Segment not in the layout yet (None: none)
        self.dir_unsynced = False  # a roll added a segment name: flush_range fsyncs the directory
        self._retry_at = -1  # worker thread: no preparation before the log reaches this position
        self.dir_fd = None  # the commit-log directory, open from load to close (its fsync after a roll)
        self._retired = []  # files deleted while a flush may still use their fd: closed by release_flushed
        self.cuts = 0  # how many times ``truncate`` rewrote bytes in place (gather.MappedRecords checks again then)
        self._cut_at = deque(maxlen=MAX_CUTS_REMEMBERED)  # the positions of the latest cuts, oldest first

    # -- loading -------------------------------------------------------------

    def load(self):
        """Map every segment; a gap or overlap between segments refuses to start."""
        if self.dir_fd is None:
            self.dir_fd = os.open(self.dirs.commitlog, os.O_RDONLY | os.O_DIRECTORY)
        for path in self.dirs.remove_prepared(self.dirs.commitlog):
            log.info("removed %s: a segment prepared ahead that was never used", path)
        found = self.dirs.list_segments()
        while found and os.path.getsize(found[-1][1]) == 0:  # after a power cut: each one never fsynced
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
        if seg is not None:
            seg.file.keep_fd()  # the writer's segment is flushed through it
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
                seg.advance_ready(rel)
                return seg
        seg = self.roll(pos, now_ms)
        seg.advance_ready(0)
        return seg

    def bytes_to_allocate(self, pos, nbytes, largest):
        """The segment bytes to allocate before ``nbytes`` of records, none over ``largest``, fit from ``pos``: 0
        when they fit, or the next is prepared. A record never straddles two segments, so each may end up to a
        record short of full: counted as holding ``segment_size - largest``."""
        seg = self.active
        left = seg.size - (pos - seg.start) if seg is not None else 0
        if nbytes <= left:
            return 0
        room = max(1, self.segment_size - largest)
        count = -(-(nbytes - max(0, left - largest)) // room)
        nxt = self.next
        if nxt is not None and nxt.start == (seg.end if seg is not None else pos):
            count -= 1
        return count * self.segment_size

    def roll(self, pos, now_ms):
        """Start a new segment because a record does not fit at ``pos`` (returns it).

        The new file is the prepared ``next`` if it starts at the right place,
        else it is allocated here (DiskFull leaves everything unchanged); then
        the old segment gets its blank tail and its mtime set to ``now_ms``.
        """
        old = self.active
        start = old.end if old is not None else pos
        new = self._take_next(start)
        if new is None:
            new = Segment(start, MappedFile.create(self.dirs.segment_path(start), self.segment_size, keep_fd=True))
            # create's own directory fsync only logs a failure: the flush before the first ack in this
            # segment must fsync the directory again (and fail if it cannot), or the name may not be durable.
            self.dir_unsynced = True
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
        if self.next is new:  # taken: let go only now that the layout holds it, and before it is active (which
            self.next = None  # would make it look stale to the worker: see _take_next)
        self.active = new
        return new

    def _take_next(self, start):
        """The prepared segment renamed to its final name, if it starts at ``start``; else None.

        It stays published as ``next`` while it is renamed (``roll`` lets go once the layout holds it): a worker
        that saw no ``next`` would build another segment for the same start under the same ``.prepared`` name, and
        this rename could take that empty one in place of the file the loop writes its records into."""
        nxt = self.next
        if nxt is None or nxt.start != start:
            return None
        if not adopt_prepared(nxt.file, self.dirs.segment_path(start), "segment"):
            if self.next is nxt:
                self.next = None
            return None
        self.dir_unsynced = True
        return nxt

    # -- working ahead (worker thread) ---------------------------------------

    def next_wanted(self, pos):
        """Where the next segment must start if it should be prepared now (cheap; any thread), else None.

        Wanted once the active segment is more than half full (or there is none)
        and no prepared segment starts there, unless a failure asked to wait.
        """
        seg = self.active
        if seg is None:
            start = pos
        elif (pos - seg.start) * 2 > seg.size:
            start = seg.end
        else:
            return None
        nxt = self.next
        if (nxt is not None and nxt.start == start) or pos < self._retry_at:
            return None
        return start

    def prepare_next(self, start, populate_bytes):
        """BLOCKING (worker): build the segment starting at ``start`` and publish it as ``next``.

        A stale prepared segment (the loop rolled without it) is discarded first.
        Raises DiskFull or StoreError (no file is left behind); the caller then
        ``defer``s the next try.
        """
        self.discard_stale_next()
        if self.next is not None:  # already prepared (and perhaps being taken by a roll right now)
            return self.next
        path = prepared_path(self.dirs.segment_path(start))
        unlink_quietly(path)  # only this (one) worker ever creates prepared files
        seg = Segment(start, MappedFile.create(path, self.segment_size, keep_fd=True))
        seg.file.populate(0, populate_bytes)
        seg.populated = min(seg.size, populate_bytes)
        self.next = seg  # published whole: a roll either sees it complete or not at all
        return seg

    def stale_next(self):
        """The prepared segment if a roll went on without it (it can never be used), else None (cheap)."""
        nxt, seg = self.next, self.active
        if nxt is not None and seg is not None and nxt.start != seg.end:
            return nxt
        return None

    def discard_stale_next(self):
        """BLOCKING (worker): delete a stale prepared segment now rather than hold its disk space."""
        nxt = self.stale_next()
        if nxt is None:
            return False
        self.next = None  # a stale one never becomes right again: positions only grow
        nxt.file.discard()
        return True

    def defer(self, pos):
        """After a failed preparation: no new try before the log grows by a fraction of a segment."""
        self._retry_at = pos + max(1, self.segment_size // RETRY_FRACTION)

    def populate_wanted(self, pos, window):
        """True when the worker should prefault more of the active segment (cheap; any thread)."""
        return _populate_span(self.active, pos, window) is not None

    def work_at(self, window):
        """A write position below which neither wanted-check above turns True (never past the active end)."""
        seg = self.active
        if seg is None:
            return 0
        at = seg.end
        if window > 0 and seg.populated < seg.size:
            at = min(at, seg.start + seg.populated - window // 2, seg.start + seg.size - window)
        nxt = self.next
        if nxt is None or nxt.start != seg.end:
            at = min(at, max(seg.start + seg.size // 2, self._retry_at))
        return at

    def populate_ahead(self, pos, window):
        """BLOCKING (worker): prefault the active segment up to ``window`` bytes past ``pos``."""
        seg = self.active
        span = _populate_span(seg, pos, window)
        if span is None or not seg.file.populate(*span):
            return False
        seg.populated = span[1]
        return True

    # -- flushing ------------------------------------------------------------

    def fds_to_flush(self, start, end, segments=None):
        """The kept fds whose fdatasync makes ``[start, end)`` durable, or None while a roll's rename still
        needs the directory fsynced (then ``flush_range`` must run). Cheap: safe on the event loop (a segment
        without its fd, which only a bug leaves, gets one here: OSError, EMFILE say, is for the caller)."""
        if self.dir_unsynced:
            return None
        return [seg.file.keep_fd() for seg in (segments if segments is not None else self.layout[1])
                if seg.end > start and seg.start < end]

    def release_flushed(self, pos):
        """Loop thread, when no flush is running: close the fds of segments flushed to their end (but the
        active one) and of segments deleted since the last call."""
        retired, self._retired = self._retired, []
        for f in retired:
            f.release_fd()
        active = self.active
        for seg in reversed(self.layout[1]):  # only the newest few hold one: a round costs O(1), not O(segments)
            if seg.end > pos or seg is active:
                continue
            if seg.file.fd is None:
                break
            seg.file.release_fd()

    def _retire(self, files):
        self._retired.extend(f for f in files if f.fd is not None)

    def flush_range(self, start, end, segments=None):
        """Make ``[start, end)`` durable (BLOCKING). Uses a snapshot of the segments."""
        if self.dir_unsynced:  # a roll added a segment name: make it durable first
            self.dir_unsynced = False
            try:
                if self.dir_fd is not None:
                    fsync_fd(self.dir_fd)
                else:
                    fsync_dir(self.dirs.commitlog)
            except OSError:
                self.dir_unsynced = True
                raise
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
        self.cuts += 1
        self._cut_at.append(pos)
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
        self._retire([seg.file for seg in segs[keep:]])
        self._set(segs[:keep])
        self.set_write_position(pos)
        return deleted

    def lowest_cut_since(self, cuts):
        """The lowest position cut since ``cuts`` was this log's ``cuts`` (None: no cut since): every byte at or past
        it may have been zeroed, deleted or written again since. A ``cuts`` older than the
        ``limits.MAX_CUTS_REMEMBERED`` latest cuts gives 0 (nothing can be trusted)."""
        since = self.cuts - cuts
        if since <= 0:
            return None
        if since > len(self._cut_at):
            return 0
        return min(self._cut_at[i] for i in range(len(self._cut_at) - since, len(self._cut_at)))

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
        self._retire([seg.file for seg in gone])
        return [seg.file.path for seg in gone]

    def delete_oldest(self, count):
        """Delete the ``count`` oldest segments (the caller checked they may go)."""
        segs = self.layout[1]
        gone = segs[:count]
        self._set(segs[count:])
        for seg in gone:
            seg.file.delete()
        self._retire([seg.file for seg in gone])
        return gone

    def close(self, discard_prepared=True):
        """Unmap every segment; a prepared next segment is deleted (or left, as a kill -9 would)."""
        nxt, self.next = self.next, None
        close_files([seg.file for seg in self.layout[1]], nxt and nxt.file, discard_prepared)
        retired, self._retired = self._retired, []
        for f in retired:
            f.release_fd()
        self.layout = ((), ())
        self.active = None
        fd, self.dir_fd = self.dir_fd, None
        if fd is not None:
            close_now(fd)


def _populate_span(seg, pos, window):
    """``(lo, hi)`` of ``seg`` to prefault now, or None: only once half a window (or the segment's rest) is due."""
    if seg is None or window <= 0:
        return None
    rel = pos - seg.start
    lo = max(seg.populated, rel)
    hi = min(seg.size, rel + window)
    if hi <= lo or (hi - lo < window // 2 and hi < seg.size):
        return None
    return lo, hi
