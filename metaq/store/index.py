"""Per topic-partition index: fixed-size files of 16-byte units, one unit per offset.

Unit *n* (offset *n*) describes the record with queue offset *n*::

    UNIT  >qii   commit-log position of the record (int64), record total size (int32),
                 tag hash (int32): protocol.tags.tag_code of the record's tags (its attribute
                 before the first \x02), 0 without; TAG_FORMAT names this definition

A unit with size 0 is empty. Files are named by their first unit's byte
position (16 x first offset), allocated and mapped, and follow each other
without gaps. ``layout`` is a ``(starts, files)`` tuple replaced as a whole, so
a worker thread can read a consistent snapshot.

Growth: a file covers at most ``units_per_file`` units (its span) but starts
with ``INITIAL_UNITS`` (one page) and doubles when a unit past its end is
needed (``MappedFile.grown``: ``posix_fallocate`` first, so a full disk is a
clean DiskFull, then a new map; the old one stays valid for its holders), up
to its span or the next file's start. A new topic costs a page of disk, not
``16 x units_per_file`` bytes. A crash between growing and writing leaves a
longer file whose new units are empty, as a preallocated file's were; a file of
any size that is a multiple of 16 loads as it is and grows on from there.

As for the commit log, a worker thread may build the file after the tail
ahead of time under a ``.prepared`` name (``prepare_next``, BLOCKING) and
publish it as ``next``; the loop renames it when the tail fills up. While the
tail can still grow, ``next`` is instead the tail grown ahead (the same file,
mapped longer): the loop adopts that map when it needs the units.
"""

import bisect
import logging
import os
import struct

from metaq.store.files import PREPARED_SUFFIX, disk_full_from, fsync_dir, prepared_path, unlink_quietly
from metaq.store.mapped import MappedFile, adopt_prepared, close_files
from metaq.store.record import head_struct

log = logging.getLogger(__name__)

#: position (int64), size (int32), tag hash (int32).
UNIT = struct.Struct(">qii")
assert UNIT.size == 16
UNIT_SIZE = 16
#: The definition of the units' tag hash, recorded in every checkpoint (``tag_format``). 2: ``tag_code`` of the
#: tags alone; before it (no ``tag_format``), the checksum of the whole attribute, properties included. Recovery
#: rebuilds every unit from the log when the checkpoint names another format (recovery.untrusted_reason).
TAG_FORMAT = 2
_CHUNK_UNITS = 4096
#: Units a new index file starts with (one 4 KiB page); it doubles up to ``units_per_file``.
INITIAL_UNITS = 256


class IndexFile:
    """Units ``[start, end)`` of one partition."""

    __slots__ = ("start", "end", "file", "view", "mm")

    def __init__(self, start, file):
        self.start = start
        self.end = start + file.size // UNIT_SIZE
        self.file = file
        self.view = file.view
        self.mm = file.mm


class PartitionIndex:
    """The units of one topic-partition plus its offsets (min, max, visible)."""

    def __init__(self, dirs, topic, partition, units_per_file):
        self.dirs = dirs
        self.topic = topic
        self.partition = partition
        self.key = (topic, partition)
        self.topic_bytes = topic.encode("utf-8")
        self.head = head_struct(len(self.topic_bytes))
        self.units_per_file = units_per_file
        self.dirpath = dirs.partition_dir(topic, partition)
        self.layout = ((), ())
        self.tail = None  # the file holding unit ``max`` (None: not allocated yet)
        self.fast_end = 0  # put: offsets below this are in ``tail`` and need no look at files
        self.next = None  # worker thread: a prepared IndexFile not in the layout yet
        self.dir_unsynced = False  # a file was created or renamed here: flush fsyncs the directory
        self.parents_unsynced = False  # the partition's directories were created: flush fsyncs their parents
        self.retry_after = -1  # worker thread: after a failed preparation, no new one for this tail end
        self.min = 0
        self.max = 0  # the offset the next message gets
        self.visible = 0  # the offset the next visible message gets
        self.dirty = False
        self.log_bytes = None  # lazily computed bytes of this partition's records in the log

    # -- files ---------------------------------------------------------------

    def load(self):
        """Map the existing files; returns a reason string if they cannot be trusted, else None."""
        files = []
        problem = None
        for path in self.dirs.remove_prepared(self.dirpath):
            log.info("removed %s: an index file prepared ahead that was never used", path)
        for start_byte, path in self.dirs.list_index_files(self.topic, self.partition):
            size = os.path.getsize(path)
            if start_byte % UNIT_SIZE or size == 0 or size % UNIT_SIZE:
                problem = "index file %s has a bad name or size (%d bytes): removed" % (path, size)
                log.warning("%s", problem)
                os.unlink(path)
                continue
            f = IndexFile(start_byte // UNIT_SIZE, MappedFile.open(path))
            if files and f.start < files[-1].end:
                problem = "index file %s overlaps the previous one: removed" % path
                log.warning("%s", problem)
                f.file.close()
                os.unlink(path)
                continue
            files.append(f)
        self._set(files)
        return problem

    def _set(self, files):
        self.layout = (tuple(f.start for f in files), tuple(files))

    @property
    def files(self):
        return self.layout[1]

    @property
    def first_start(self):
        files = self.layout[1]
        return files[0].start if files else 0

    def file_for(self, n):
        starts, files = self.layout
        i = bisect.bisect_right(starts, n) - 1
        if i >= 0 and n < files[i].end:
            return files[i]
        return None

    def reserve(self, n):
        """Make sure a file holds unit ``n`` (growing or creating one) and make it the tail.

        DiskFull (or Unavailable: no descriptor) leaves the layout unchanged."""
        f = self.file_for(n)
        if f is None:
            f = self._grow_for(n) or self._create_file_for(n)
        self.tail = f
        self.fast_end = 0
        return f

    def _cap(self, i, layout=None):
        """The unit file ``i`` may grow to: its span, or the next file's start."""
        starts, files = layout or self.layout
        cap = files[i].start + self.units_per_file
        if i + 1 < len(files):
            cap = min(cap, files[i + 1].start)
        return cap

    def _grow_for(self, n):
        """The file before unit ``n`` grown to hold it, if ``n`` lies in its span; else None."""
        starts, files = self.layout
        i = bisect.bisect_right(starts, n) - 1
        if i < 0:
            return None
        f = files[i]
        cap = self._cap(i)
        if not f.end <= n < cap:
            return None
        g = self._take_grown(f, n)
        if g is None:
            g = IndexFile(f.start, f.file.grown(_covering(f.start, n, f.end - f.start, cap) * UNIT_SIZE))
        self._set(files[:i] + (g,) + files[i + 1:])
        return g

    def _take_grown(self, f, n):
        """The worker's grown map of ``f``'s file if it holds unit ``n``; else None."""
        nxt = self.next
        if nxt is None or nxt.start != f.start or not n < nxt.end or nxt.file.path != f.file.path:
            return None
        self.next = None
        return nxt

    def _span_for(self, n):
        """``(i, start, end)``: the units of the file to create for unit ``n`` and its place in ``files``."""
        starts, files = self.layout
        units = self.units_per_file
        anchor = files[0].start if files else 0
        start = anchor + ((n - anchor) // units) * units
        i = bisect.bisect_right(starts, n)
        if i > 0:
            start = max(start, files[i - 1].end)
        end = start + units
        if i < len(files):
            end = min(end, files[i].start)
        return i, start, end

    def _create_file_for(self, n):
        i, start, end = self._span_for(n)
        f = self._take_next(start, end, n)
        if f is None:
            if not os.path.isdir(self.dirpath):
                try:
                    os.makedirs(self.dirpath, exist_ok=True)
                except OSError as exc:
                    raise disk_full_from(exc, "create %s" % self.dirpath) from None
                self.parents_unsynced = True
            units = _covering(start, n, INITIAL_UNITS, end)
            # the directory fsyncs wait for the next checkpoint (a worker thread): creating a topic on the
            # event loop costs no journal commit; until then recovery rebuilds what a crash loses, as always
            f = IndexFile(start, MappedFile.create(self.dirs.index_file_path(self.topic, self.partition, start),
                                                   units * UNIT_SIZE, sync_dir=False))
            self.dir_unsynced = True
        files = self.layout[1]
        self._set(files[:i] + (f,) + files[i:])
        if self.next is f:  # taken: let go only now that the layout holds it (see _take_next)
            self.next = None
        return f

    def _take_next(self, start, end, n):
        """The prepared file renamed to its final name if it starts at ``start``, holds ``n`` and ends by ``end``.

        It stays published as ``next`` while it is renamed, until the layout holds it (the caller lets go then):
        a worker that saw neither would build another file for the same units under the same ``.prepared`` name,
        and this rename could take that one (its units all zero) in place of the file this loop writes into."""
        nxt = self.next
        if nxt is None or nxt.start != start or not n < nxt.end <= end or not _is_prepared(nxt):
            return None
        if not adopt_prepared(nxt.file, self.dirs.index_file_path(self.topic, self.partition, start), "index file"):
            if self.next is nxt:
                self.next = None
            return None
        self.dir_unsynced = True
        return nxt

    # -- working ahead (worker thread) ---------------------------------------

    def next_wanted(self):
        """``(start, end)`` of the file after the tail if it should be prepared now, else None (cheap)."""
        t = self.tail
        if t is None or self.max * 2 < t.start + t.end or self.retry_after == t.end:
            return None
        nxt = self.next
        if nxt is not None and nxt.start <= t.end < nxt.end:
            return None
        if self.file_for(t.end) is not None:
            return None
        layout = self.layout
        i = bisect.bisect_right(layout[0], t.start) - 1
        if i >= 0 and layout[1][i].start == t.start:
            cap = self._cap(i, layout)
            if t.end < cap:  # grow the tail: twice as long, within its span
                return t.start, min(cap, t.start + 2 * (t.end - t.start))
        _i, start, end = self._span_for(t.end)
        return (start, min(end, start + INITIAL_UNITS)) if end > start else None

    def prepare_next(self, span):
        """BLOCKING (worker): build the file for units ``span`` = ``(start, end)`` and publish it as ``next``.

        Raises DiskFull or StoreError (nothing is left behind); then no new try
        is made for this tail.
        """
        start, end = span
        old = self.next
        if old is not None:
            self.next = None  # stale: the loop takes only a file that covers what it needs
            _drop(old)
        f = self.file_for(start)
        if f is not None and f.start == start:  # the tail, grown ahead (the same file, mapped longer)
            if f.end >= end:  # the loop grew it meanwhile
                return None
            try:
                g = IndexFile(start, f.file.grown((end - start) * UNIT_SIZE))
            except Exception:
                self.retry_after = f.end
                raise
            self.next = g
            return g
        path = prepared_path(self.dirs.index_file_path(self.topic, self.partition, start))
        unlink_quietly(path)
        try:
            f = IndexFile(start, MappedFile.create(path, (end - start) * UNIT_SIZE))
        except Exception:
            self.retry_after = start
            raise
        self.next = f
        return f

    # -- units ---------------------------------------------------------------

    def bytes_to_hold(self, more):
        """At most the bytes of index file to allocate before ``more`` units past ``max`` fit (a file grows by
        doubling, or a new one starts at INITIAL_UNITS): what a transaction's commit checks the disk for first."""
        t, end = self.tail, self.max + more
        if t is not None and end <= t.end:
            return 0
        size = (end - t.start) * 2 if t is not None else max(INITIAL_UNITS, more * 2)
        return min(max(size, INITIAL_UNITS), self.units_per_file) * UNIT_SIZE

    def unit(self, n):
        """``(position, size, tag)`` of unit ``n``, or None if no file holds it."""
        f = self.file_for(n)
        if f is None:
            return None
        return UNIT.unpack_from(f.mm, (n - f.start) * UNIT_SIZE)

    def set_unit(self, n, position, size, tag):
        """Make unit ``n`` equal ``(position, size, tag)``; True if it had to be written."""
        f = self.tail
        if f is None or not f.start <= n < f.end:
            f = self.reserve(n)
        at = (n - f.start) * UNIT_SIZE
        if UNIT.unpack_from(f.mm, at) == (position, size, tag):
            return False
        UNIT.pack_into(f.mm, at, position, size, tag)
        self.dirty = True
        return True

    def find_end(self, n):
        """The first empty unit at or after ``n`` (or the end of the files)."""
        while True:
            f = self.file_for(n)
            if f is None:
                return n
            hi = min(f.end, n + _CHUNK_UNITS)
            for _phys, size, _tag in UNIT.iter_unpack(f.view[(n - f.start) * UNIT_SIZE:(hi - f.start) * UNIT_SIZE]):
                if size == 0:
                    return n
                n += 1

    def last_used(self, floor=None):
        """The last non-empty unit (scanning the files backwards), or None; stops below ``floor``."""
        for f in reversed(self.layout[1]):
            if floor is not None and f.end <= floor:
                return None
            end = f.file.nonzero_end(0)
            n = f.start + (end - 1) // UNIT_SIZE
            while n >= f.start and end:
                if UNIT.unpack_from(f.mm, (n - f.start) * UNIT_SIZE)[1] != 0:
                    return n
                n -= 1
        return None

    def drop(self, lo, hi):
        """Empty units ``[lo, hi)``; returns how many were not empty."""
        dropped = 0
        n = lo
        while n < hi:
            f = self.file_for(n)
            if f is None:
                nxt = bisect.bisect_right(self.layout[0], n)
                if nxt >= len(self.layout[0]):
                    break
                n = self.layout[0][nxt]
                continue
            top = min(hi, f.end)
            a, b = (n - f.start) * UNIT_SIZE, (top - f.start) * UNIT_SIZE
            used = sum(1 for u in UNIT.iter_unpack(f.view[a:b]) if u[1] != 0)
            if used:
                f.file.zero(a, b)
                self.dirty = True
                dropped += used
            n = top
        return dropped

    def first_at_or_after(self, position, lo, hi):
        """The first offset in ``[lo, hi)`` whose unit is used and points at or after ``position``."""
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is not None and u[1] != 0 and u[0] >= position:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def units(self, lo, hi):
        """Yield ``(offset, position, size, tag)`` for ``[lo, hi)`` (missing files yield nothing)."""
        n = lo
        while n < hi:
            f = self.file_for(n)
            if f is None:
                return
            top = min(hi, f.end)
            for phys, size, tag in UNIT.iter_unpack(f.view[(n - f.start) * UNIT_SIZE:(top - f.start) * UNIT_SIZE]):
                yield n, phys, size, tag
                n += 1

    # -- retention, flush, close --------------------------------------------

    def delete_files_below(self, n):
        """Delete the files whose units all lie below offset ``n``, never the last one."""
        files = self.layout[1]
        keep = 0
        while keep < len(files) - 1 and files[keep].end <= n:
            keep += 1
        if not keep:
            return []
        gone = files[:keep]
        self._set(files[keep:])
        for f in gone:
            f.file.delete()
        return [f.file.path for f in gone]

    def flush(self):
        """Make every file durable (BLOCKING; a file deleted meanwhile is skipped)."""
        if self.parents_unsynced:  # the topic's and partition's directory entries
            self.parents_unsynced = False
            try:
                topic_dir = os.path.dirname(self.dirpath)
                fsync_dir(topic_dir)
                fsync_dir(os.path.dirname(topic_dir))
            except OSError:
                self.parents_unsynced = True
                raise
        if self.dir_unsynced:  # a file was created or renamed here: make its name durable
            self.dir_unsynced = False
            try:
                fsync_dir(self.dirpath)
            except OSError:
                self.dir_unsynced = True
                raise
        for f in self.layout[1]:
            f.file.sync_map()  # msync: no descriptor needed (a file deleted meanwhile is still mapped)

    def size_on_disk(self):
        return sum(f.file.size for f in self.layout[1])

    def close(self, discard_prepared=True):
        nxt, self.next = self.next, None
        if nxt is not None and not _is_prepared(nxt):  # a grown map of a live file: unmap, never delete
            nxt.file.close()
            nxt = None
        close_files([f.file for f in self.layout[1]], nxt and nxt.file, discard_prepared)
        self.layout = ((), ())
        self.tail = None
        self.fast_end = 0


def _covering(start, n, units, cap):
    """``units`` doubled until ``[start, start + units)`` holds unit ``n``, never past ``cap``: a file's length."""
    units = max(1, units)
    while start + units <= n:
        units *= 2
    return min(units, cap - start)


def _is_prepared(f):
    return f.file.path.endswith(PREPARED_SUFFIX)


def _drop(f):
    """Let go of a stale ``next``: a prepared file is deleted, a grown map of a live file only unmapped."""
    if _is_prepared(f):
        f.file.discard()
    else:
        f.file.close()


def check_units_trusted(pidx, floor):
    """Why the units below ``floor`` cannot be trusted, or None if they look complete.

    Every file below ``floor`` must end with a used unit, and the unit at
    ``floor - 1`` must be used: a deleted or zeroed file fails this.
    """
    if floor <= 0 or (pidx.files and floor <= pidx.first_start):
        return None
    if not pidx.files:
        return "%s-%d: no index files although the checkpoint counts %d messages" % (pidx.topic, pidx.partition, floor)
    prev_end = None
    for f in pidx.files:
        if f.start >= floor:
            break
        if prev_end is not None and f.start != prev_end:
            return "%s-%d: index units %d..%d have no file" % (pidx.topic, pidx.partition, prev_end, f.start - 1)
        prev_end = f.end
        last = min(f.end, floor) - 1
        if UNIT.unpack_from(f.mm, (last - f.start) * UNIT_SIZE)[1] == 0:
            return "%s-%d: index unit %d is empty although the checkpoint counts %d messages" % (
                pidx.topic, pidx.partition, last, floor)
    if pidx.file_for(floor - 1) is None:
        return "%s-%d: no index file holds unit %d" % (pidx.topic, pidx.partition, floor - 1)
    return None

