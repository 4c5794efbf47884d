"""Working ahead of the writer: what ``MessageStore.prepare_ahead`` does and when it is wanted.

``run`` is BLOCKING work for one worker thread (the server runs it in its
thread pool, never two at once) so that the put path on the event-loop thread
meets neither ``posix_fallocate`` nor a page fault in the normal case:

1. prefault the active segment up to ``POPULATE_BYTES`` past the write
   position (``madvise(MADV_POPULATE_READ)`` through ctypes, see mapped.py: the GIL is
   released while the kernel works);
2. once the active segment is more than half full, build the next one
   (``CommitLog.prepare_next``), unless that would take the disk above the
   danger mark; a failure (ENOSPC) leaves no file behind and is retried only
   after the log has grown by 1/16 of a segment, meanwhile a roll creates the
   segment itself as before;
3. for every partition whose tail index file is more than half full, build
   the next index file (``PartitionIndex.prepare_next``).

Handoff: every object the worker builds is published, complete, with one
attribute assignment (atomic under the GIL); the loop thread reads those
attributes and never waits for the worker. ``wanted`` is the loop's question
"is there work?"; it leaves ``check_at``, the write position before which the
answer cannot change for the commit log (the worker only ever moves that point
further on, and it is never past the end of the active segment, so a roll
brings the question back), and ``MessageStore.wants_preparation`` asks only
past it or when ``hot`` is not empty. ``hot`` is written by the loop only (the
put path adds a partition when it crosses the middle of its tail index file,
``wanted`` drops it when nothing is left to do); the worker reads a copy.
"""

import logging

from metaq.errors import DiskFull, StoreError, Unavailable
from metaq.store.commitlog import POPULATE_BYTES
from metaq.store.files import disk_usage

log = logging.getLogger(__name__)


class AheadWork:
    def __init__(self, commitlog, position, root, danger_ratio):
        self._log = commitlog
        self._position = position  # () -> the commit-log write position (read from any thread)
        self._root = root
        self._danger = danger_ratio
        self.hot = {}  # (topic, partition) -> PartitionIndex past the middle of its tail file
        self.check_at = 0  # loop thread: below this write position the log needs no work (see above)

    def wanted(self):
        """Loop thread: True if ``run`` has something to do (cheap)."""
        pos = self._position()
        clog = self._log
        if (clog.populate_wanted(pos, POPULATE_BYTES) or clog.next_wanted(pos) is not None
                or clog.stale_next() is not None):
            return True
        hot = self.hot
        if hot:
            for key, p in list(hot.items()):
                if p.next_wanted() is not None:
                    return True
                del hot[key]
        self.check_at = clog.work_at(POPULATE_BYTES)
        return False

    def run(self):
        """BLOCKING (one worker thread): prefault, prepare the next segment and index files; True if it worked."""
        clog = self._log
        did = clog.populate_ahead(self._position(), POPULATE_BYTES)
        did = clog.discard_stale_next() or did
        pos = self._position()
        start = clog.next_wanted(pos)
        if start is not None and self._prepare_segment(start, pos):
            did = True
            did = clog.populate_ahead(self._position(), POPULATE_BYTES) or did  # the writer moved meanwhile
        for p in list(self.hot.values()):
            span = p.next_wanted()
            if span is None:
                continue
            try:
                p.prepare_next(span)
                did = True
            except (DiskFull, StoreError, Unavailable) as exc:
                log.warning("could not prepare the next index file of %s-%d (the put path will create it): %s",
                            p.topic, p.partition, exc)
        return did

    def _prepare_segment(self, start, pos):
        clog = self._log
        size = clog.segment_size
        if not fits_below_danger(self._root, size, self._danger):
            clog.defer(pos)
            log.info("not preparing the next segment: %d more bytes would take the disk above the danger mark",
                     size)
            return False
        try:
            clog.prepare_next(start, POPULATE_BYTES)
        except (DiskFull, StoreError, Unavailable) as exc:
            clog.defer(pos)
            log.warning("could not prepare the next segment (a roll will create it): %s", exc)
            return False
        return True


def fits_below_danger(root, size, danger_ratio):
    """True if allocating ``size`` more bytes keeps the disk usage at or below ``danger_ratio``."""
    usage = disk_usage(root)
    return usage.used_bytes + usage.available_bytes > 0 and usage.ratio_after(size) <= danger_ratio
