"""Preallocated, memory-mapped files (commit-log segments and index files).

A new file is ``posix_fallocate``'d to its full size *before* it is mapped: a
sparse mapping that meets a full disk kills the process with SIGBUS, while a
failed fallocate is a clean ENOSPC. On failure the partial file is unlinked
(ext4 leaves a partly allocated file behind) and ``DiskFull`` is raised.

Thread safety: ``flush`` may run in a worker thread while the event-loop
thread keeps writing into the same map. It syncs with ``fdatasync`` (which
releases the GIL; ``mmap.flush`` holds it for the whole msync), so it never
touches the map object itself, and a map is never explicitly unmapped while the
store is open: retired files are simply dropped and unmapped once nobody holds
them.

Descriptors: a map needs no descriptor, but Python's ``mmap.mmap`` keeps a
``dup`` of the file's fd for the life of the object (for ``size``/``resize``,
which the store never calls): one descriptor per segment and per index file,
whatever the limits say. ``_map`` maps without it: ``trackfd=False`` where
Python has it (3.13+); before that, the dup's number is read from the object
(found once per process on a private temporary file, and checked on every map:
the number must name the very file just mapped), set to -1 and closed, as
``trackfd=False`` does. If that check ever fails the dup is simply kept. So a
file's fd is closed once it is mapped, unless its owner asks to keep it (``keep_fd``: the commit log keeps one
for every segment that may still need a flush, so a flush round never opens a
file and cannot meet EMFILE under descriptor pressure; ``release_fd`` gives it
back). Index files keep none: ``sync_map`` makes them durable with
``msync(MS_SYNC)`` called through ctypes (the GIL is released; on Linux that is
``vfs_fsync_range(datasync=1)`` over the mapped range, the same primitive as
``fdatasync``).

Growing (index files): ``grown`` extends a file with ``posix_fallocate`` (a
full disk is a clean DiskFull, never a hole a later write would meet as SIGBUS)
and maps it again at the new size; the old map stays valid for whoever holds it
(same page cache). A failed growth leaves the file at least as long as before
and never shorter, so a map another thread holds is never cut under it.

``populate`` (BLOCKING, for a worker thread) prefaults pages with libc's
``madvise(MADV_POPULATE_READ)`` called through ctypes, which releases the
GIL (``mmap.madvise`` holds it for the whole call). It pins the map with a
buffer export for the duration of the call, so a ``close`` on another thread
cannot unmap the range under it (the close then leaves the map to the GC).

Why READ and not WRITE: on tmpfs both leave writable page-table entries (a
shared mapping without dirty tracking is mapped writable on a read fault), so
a later write costs the same either way. On a disk filesystem POPULATE_WRITE
marks every page dirty ahead of the data: the next fdatasync writes those
zeros, doubling the log's write volume and lengthening sync-mode group
commits (figures: bench/README.md, "Prefaulting the log"); POPULATE_READ
brings the (zero) pages into the page cache clean and the writer only takes
the cheap write-protect fault.
"""

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import sys
import tempfile

from metaq import speedups
from metaq.errors import StoreError
from metaq.store.files import close_now, disk_full_from, fsync_dir, unlink_quietly

log = logging.getLogger(__name__)

_ZERO_CHUNK = bytes(1 << 20)


def nonzero_end_py(buf, start, end):
    """One past the last non-zero byte of ``buf[start:end]``, or ``start`` if all are zero (or ``end <= start``).
    The C helper's ``nonzero_end`` is its twin, reading the map in place."""
    if start < 0 or end > len(buf):
        raise ValueError("need 0 <= start and end <= %d" % len(buf))
    hi = end
    while hi > start:
        lo = max(start, hi - len(_ZERO_CHUNK))
        chunk = buf[lo:hi]
        if chunk != _ZERO_CHUNK[:hi - lo]:
            return lo + len(chunk.rstrip(b"\0"))
        hi = lo
    return start


nonzero_end = speedups.load("nonzero_end", nonzero_end_py)

#: Linux >= 5.14 (include/uapi/asm-generic/mman-common.h): prefault page tables as a read would.
MADV_POPULATE_READ = 22
#: ... as a write would (dirties every page of a file mapping: see above).
MADV_POPULATE_WRITE = 23
MADV_WILLNEED = mmap.MADV_WILLNEED  # 3 (4 is MADV_DONTNEED: it drops the range's page tables instead)
#: What ``populate`` asks for.
POPULATE_ADVICE = MADV_POPULATE_READ
_POPULATE_CHUNK = 16 << 20  # one call per typical prepare_ahead: fewer GIL hand-offs
#: What MADV_POPULATE_READ answers for a page whose read fails (an I/O error, past the file's end, poisoned memory).
_UNREADABLE = (errno.EFAULT, errno.EIO, getattr(errno, "EHWPOISON", 133))


#: msync flag (asm-generic/mman-common.h; the same on every Linux architecture).
MS_SYNC = 4


class _LibcRangeCall:
    """A libc ``int name(void *addr, size_t length, int arg)`` (msync, madvise) through ctypes, loaded on first
    use; the call releases the GIL. Calling it gives 0 on success, else the errno."""

    def __init__(self, name):
        self.name = name
        self.fn = None

    def __call__(self, addr, length, arg):
        if self.fn is None:
            fn = getattr(ctypes.CDLL(None, use_errno=True), self.name)
            fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            fn.restype = ctypes.c_int
            self.fn = fn
        if self.fn(addr, length, arg) == 0:
            return 0
        return ctypes.get_errno()


_msync = _LibcRangeCall("msync")
_madvise = _LibcRangeCall("madvise")


class _Mincore:
    """libc ``mincore`` through ctypes, loaded on first use."""

    fn = None

    @classmethod
    def call(cls, addr, vec):
        if cls.fn is None:
            fn = ctypes.CDLL(None, use_errno=True).mincore
            fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
            fn.restype = ctypes.c_int
            cls.fn = fn
        return cls.fn(addr, mmap.PAGESIZE, ctypes.byref(vec))


class _UntrackedMap:
    """Where ``mmap.mmap`` keeps its dup'd fd (Python < 3.13), found once; None: not found (keep the dup)."""

    offset = None
    probed = False
    _MAX_OFFSET = 160

    @classmethod
    def probe(cls):
        cls.probed = True
        try:
            with tempfile.TemporaryFile() as f:
                f.truncate(mmap.PAGESIZE)
                fd = f.fileno()
                st = os.fstat(fd)
                mm = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                try:
                    for off in range(16, min(cls._MAX_OFFSET, sys.getsizeof(mm) - 3), 4):  # inside the object
                        v = ctypes.c_int.from_address(id(mm) + off).value
                        if v > 2 and v != fd and _same_file(v, st):
                            cls.offset = off
                            break
                finally:
                    mm.close()
        except (OSError, ValueError) as exc:
            log.debug("cannot find mmap's descriptor field: %s", exc)
        if cls.offset is None:
            log.warning("mmap objects keep a descriptor each here (their field was not found): every segment and "
                        "index file then holds one, which limits.FD_STORE_RESERVE does not budget for")

    @classmethod
    def drop_fd(cls, mm, fd):
        """Close ``mm``'s dup of ``fd`` if it is where we expect it and names the same file."""
        if not cls.probed:
            cls.probe()
        if cls.offset is None:
            return
        field = ctypes.c_int.from_address(id(mm) + cls.offset)
        v = field.value
        if v > 2 and v != fd and _same_file(v, os.fstat(fd)):
            field.value = -1  # what trackfd=False leaves: close() and the destructor then close nothing
            close_now(v)


def _same_file(fd, st):
    try:
        other = os.fstat(fd)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _map(fd, size):
    """``mmap`` ``fd`` shared read/write over ``size`` bytes, without the descriptor mmap.mmap would keep."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, trackfd=False)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    _UntrackedMap.drop_fd(mm, fd)
    return mm


class _Madvise:
    """Whether MADV_POPULATE_* works here (Linux >= 5.14); found at the first populate."""

    populate_supported = True


class MappedFile:
    """One fixed-size file mapped shared read/write; ``view`` is a memoryview of the whole map."""

    __slots__ = ("path", "size", "mm", "view", "fd", "__weakref__")

    def __init__(self, path, size, mm, fd=None):
        self.path = path
        self.size = size
        self.mm = mm
        self.view = memoryview(mm)
        self.fd = fd  # kept open for flushing (``keep_fd``), else None

    @classmethod
    def create(cls, path, size, keep_fd=False, sync_dir=True):
        """Create ``path`` with ``size`` bytes allocated on disk, then map it (keeping its fd if ``keep_fd``).

        ``sync_dir=False``: the caller makes the new name durable later (its directory fsync)."""
        if size <= 0:
            raise StoreError("cannot create %s with size %d" % (path, size))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise disk_full_from(exc, "create %s" % path) from None
        try:
            os.posix_fallocate(fd, 0, size)
            mm = _map(fd, size)
        except (OSError, ValueError) as exc:  # ValueError: mmap found the file shorter than allocated
            close_now(fd)
            unlink_quietly(path)
            if isinstance(exc, OSError):
                raise disk_full_from(exc, "allocate %d bytes for %s" % (size, path)) from None
            raise StoreError("cannot map %s after allocating %d bytes: %s" % (path, size, exc)) from None
        if not keep_fd:
            close_now(fd)
            fd = None
        if sync_dir:
            try:
                fsync_dir(os.path.dirname(path))
            except OSError as exc:
                log.warning("could not fsync the directory of %s: %s", path, exc)
        return cls(path, size, mm, fd)

    @classmethod
    def open(cls, path, keep_fd=False):
        """Map an existing file at its current size (which must be > 0)."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size <= 0:
                raise StoreError("cannot map the empty file %s" % path)
            mm = _map(fd, size)
        except BaseException:
            close_now(fd)
            raise
        if not keep_fd:
            close_now(fd)
            fd = None
        return cls(path, size, mm, fd)

    def grown(self, size):
        """A new MappedFile of this file extended to ``size`` bytes (allocated first); this one stays valid.

        Raises DiskFull (ENOSPC/EDQUOT), Unavailable (EMFILE/ENFILE) or StoreError;
        the file is then left at least as long as it was (never cut: another
        thread may hold a map of it).
        """
        if size <= self.size:
            raise StoreError("cannot grow %s from %d to %d bytes" % (self.path, self.size, size))
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError as exc:
            raise disk_full_from(exc, "open %s to grow it" % self.path) from None
        try:
            os.posix_fallocate(fd, 0, size)
            mm = _map(fd, size)
        except OSError as exc:
            raise disk_full_from(exc, "grow %s to %d bytes" % (self.path, size)) from None
        except ValueError as exc:
            raise StoreError("cannot map %s after growing it to %d bytes: %s" % (self.path, size, exc)) from None
        finally:
            close_now(fd)
        return MappedFile(self.path, size, mm)

    def keep_fd(self):
        """Open the descriptor ``flush`` uses, if not open yet (raises OSError)."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR)
        return self.fd

    def release_fd(self):
        """Close the kept descriptor (the caller knows no flush is using it)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            close_now(fd)

    def prefetch(self, start, end):
        """Ask the kernel to bring ``[start, end)`` in ahead of the writer (MADV_WILLNEED).

        Writing into pages that are not resident yet costs a page fault each; the advice brings them in ahead.
        """
        start -= start % mmap.PAGESIZE
        end = min(end, self.size)
        if end > start and hasattr(self.mm, "madvise"):
            try:
                self.mm.madvise(mmap.MADV_WILLNEED, start, end - start)
            except (OSError, ValueError) as exc:
                log.debug("madvise(WILLNEED) on %s failed: %s", self.path, exc)

    def populate(self, start, end):
        """Prefault ``[start, end)`` (BLOCKING: run it in a worker thread; releases the GIL).

        ``POPULATE_ADVICE``, or MADV_WILLNEED where the kernel lacks it (EINVAL).
        Returns False if the map is already closed; other failures are logged
        and ignored (the writer then simply takes the page faults).
        """
        start -= start % mmap.PAGESIZE
        end = min(end, self.size)
        if end <= start:
            return True
        with self._pinned() as base:
            if base is None:
                return False
            while start < end:
                n = min(end - start, _POPULATE_CHUNK)
                _advise(base + start, n, self.path)
                start += n
        return True

    def unreadable(self, start, end):
        """BLOCKING: the offset of the first page of ``[start, end)`` the disk cannot read, or None. A read of such a
        page through the map kills the process (SIGBUS, whatever thread reads it); MADV_POPULATE_READ reads it and
        says EFAULT instead. None where the kernel lacks it (< 5.14: not checked) or the map is closed."""
        start -= start % mmap.PAGESIZE
        end = min(end, self.size)
        with self._pinned() as base:
            while base is not None and start < end:
                n = min(end - start, _POPULATE_CHUNK)
                err = _madvise(base + start, n, MADV_POPULATE_READ)
                if err == errno.EINVAL:  # not supported here
                    return None
                if err in _UNREADABLE:
                    for page in range(start, start + n, mmap.PAGESIZE):  # which page of the chunk
                        if _madvise(base + page, mmap.PAGESIZE, MADV_POPULATE_READ) in _UNREADABLE:
                            return page
                    return start
                start += n
        return None

    def drop_pages(self, start=0, end=None):
        """BLOCKING (a worker thread; releases the GIL): drop the page tables of ``[start, end)`` of this map (whole
        pages within it; MADV_DONTNEED), so that those pages stop counting in the process's resident memory. A
        shared file map loses nothing: its pages stay in the page cache (dirty ones are written back as ever) and a
        later read maps them again. False if closed or nothing to drop."""
        end = self.size if end is None else min(end, self.size)
        start += -start % mmap.PAGESIZE
        end -= end % mmap.PAGESIZE
        if end <= start:
            return False
        with self._pinned() as base:
            if base is None:
                return False
            err = _madvise(base + start, end - start, mmap.MADV_DONTNEED)
        if err:
            log.debug("madvise(DONTNEED) on %s failed: %s", self.path, os.strerror(err))
        return not err

    @contextlib.contextmanager
    def _pinned(self):
        """The map's address, pinned (an export: close() cannot unmap it) while the block runs; None if closed."""
        try:
            pin = ctypes.c_char.from_buffer(self.mm)
        except (ValueError, TypeError):
            yield None
            return
        try:
            yield ctypes.addressof(pin)
        finally:
            del pin

    def resident(self, pos):
        """True when the page holding byte ``pos`` is in the page cache, so that reading it takes no disk read
        (``mincore``: a few microseconds, safe on the event loop). False when unknown (a closed map)."""
        if not 0 <= pos < self.size:
            return False
        try:
            pin = ctypes.c_char.from_buffer(self.mm)  # an export: close() cannot unmap while we hold it
        except (ValueError, TypeError):
            return False
        try:
            vec = ctypes.c_ubyte(0)
            return _Mincore.call(ctypes.addressof(pin) + pos - pos % mmap.PAGESIZE, vec) == 0 and bool(vec.value & 1)
        finally:
            del pin

    def flush(self, start=0, end=None):
        """Make bytes ``[start, end)`` durable (BLOCKING; safe in a worker thread).

        The range is page-aligned; the sync is an ``fdatasync`` of the file, which
        covers every page dirtied through the map. Through the kept fd if there
        is one, else through a fresh one (which can fail with EMFILE).
        """
        end = self.size if end is None else min(end, self.size)
        start -= start % mmap.PAGESIZE
        if end <= start:
            return
        if self.fd is not None:
            os.fdatasync(self.fd)
            return
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.fdatasync(fd)
        finally:
            close_now(fd)

    def sync_map(self):
        """Make the whole map durable with ``msync(MS_SYNC)`` (BLOCKING; releases the GIL; needs no descriptor).

        Raises OSError on failure. A map already closed (store closing) is skipped.
        """
        try:
            pin = ctypes.c_char.from_buffer(self.mm)  # an export: close() cannot unmap while we hold it
        except (ValueError, TypeError):
            return
        try:
            err = _msync(ctypes.addressof(pin), self.size, MS_SYNC)
        finally:
            del pin
        if err:
            raise OSError(err, "msync of %s failed: %s" % (self.path, os.strerror(err)))

    def zero(self, start, end):
        """Overwrite ``[start, end)`` with zeros."""
        pos = start
        while pos < end:
            n = min(end - pos, len(_ZERO_CHUNK))
            self.mm[pos:pos + n] = _ZERO_CHUNK[:n]
            pos += n

    def nonzero_end(self, start, end=None):
        """One past the last non-zero byte in ``[start, end)``, or ``start`` if all are zero.

        Only the file's data extents are read: the holes the kernel reports (``SEEK_HOLE``: the preallocated,
        never written rest of a segment) read as zeros by definition, and reading them through the map would
        fault in a zero-filled page for each 4 KiB (about half of a recovery's time after a crash halfway
        through a 1 GiB segment)."""
        end = self.size if end is None else end
        return nonzero_end(self.mm, start, self.data_end(start, end))

    def data_end(self, start, end):
        """One past the last byte of ``[start, end)`` that is not in a hole of the file (at most ``end``); ``end``
        when the file system cannot say (no ``SEEK_DATA``), ``start`` when all of it is hole."""
        if end <= start or not hasattr(os, "SEEK_DATA"):
            return end
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return end
        try:
            last, pos = start, start
            while pos < end:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # no data from pos to the end of the file
                        break
                    return end
                if data >= end:
                    break
                pos = os.lseek(fd, data, os.SEEK_HOLE)
                last = min(pos, end)
            return last
        except OSError:
            return end
        finally:
            os.close(fd)

    def set_mtime_ms(self, ms):
        ns = int(ms) * 1_000_000
        os.utime(self.path, ns=(ns, ns))

    def mtime_ms(self):
        return os.stat(self.path).st_mtime_ns // 1_000_000

    def close(self):
        """Unmap (at store close only) and close a kept fd; if views are still exported the map is left to the GC."""
        self.release_fd()
        try:
            self.view.release()
        except ValueError:
            pass
        try:
            self.mm.close()
        except BufferError:
            log.debug("%s still has exported views; it is unmapped when they are released", self.path)

    def delete(self):
        """Unlink the file. The map stays valid for whoever still holds it."""
        unlink_quietly(self.path)

    def rename(self, path):
        """Give the file its final name ``path`` (which must not exist); raises OSError.

        The map is unaffected. The directory entry is durable only after the
        caller fsyncs the directory (``fsync_dir``).
        """
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "%s already exists" % path)
        os.rename(self.path, path)
        self.path = path

    def discard(self):
        """Unmap and unlink a file nobody uses any more."""
        self.close()
        self.delete()


def adopt_prepared(prepared, final_path, what):
    """Give a prepared file (built ahead by the worker) its final name; on failure discard it.

    Returns True when renamed. ``what`` names the file kind in the log line.
    """
    try:
        prepared.rename(final_path)
    except OSError as exc:
        log.warning("could not rename the prepared %s %s: %s", what, prepared.path, exc)
        prepared.discard()
        return False
    return True


def close_files(files, prepared, discard_prepared):
    """Unmap every file in ``files`` and the prepared next one (deleted, or kept as a kill -9 would)."""
    for f in files:
        f.close()
    if prepared is not None:
        if discard_prepared:
            prepared.discard()
        else:
            prepared.close()


def _advise(addr, length, path):
    if _Madvise.populate_supported:
        err = _madvise(addr, length, POPULATE_ADVICE)
        if err != errno.EINVAL:
            if err:
                log.debug("madvise(%d) on %s failed: %s", POPULATE_ADVICE, path, os.strerror(err))
            return
        _Madvise.populate_supported = False
        log.info("madvise(MADV_POPULATE_*) is not supported here (Linux < 5.14): using MADV_WILLNEED")
    err = _madvise(addr, length, MADV_WILLNEED)
    if err:
        log.debug("madvise(WILLNEED) on %s failed: %s", path, os.strerror(err))
