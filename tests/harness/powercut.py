"""What a power cut leaves on a disk: the bookkeeping behind ``fusefs``'s ``--power-flag`` (see its docstring).

The model: **nothing written since a file's last fsync survives, and nothing written after the cut reaches
the disk.**

* Every ``write`` and ``truncate`` of a file records how to undo it: ``(offset, old bytes, old size)``. An
  ``fsync`` or ``fdatasync`` of the file that completes before the cut forgets the file's records: what it
  covered is on the disk. At the cut the records are applied in reverse, newest first, so each file is back
  to its content and size at its last completed fsync (or, never fsynced, at its creation: empty).
* A **name** created since the cut's last chance to make it durable is removed at the cut: a file or
  directory made by ``create``/``mknod``/``mkdir`` survives only once its parent directory was fsynced
  (``fsyncdir``) or the object itself was (an fsync of a new file commits its name on ext4 and XFS, whose
  journal holds the creation with it). A segment or index file created and preallocated ahead of the writer
  and never fsynced is gone after the cut; one fsynced once keeps its name and only its fsynced bytes and size
  (preallocation is writes here: fusepy has no ``fallocate``, glibc writes one byte per block instead).
* ``rename`` and ``unlink`` are durable at once (ext4's ordered journal commits them in order; the store makes
  every rename it relies on durable with a directory fsync anyway). A new name moved by a rename stays new.
* After the cut every write is dropped (reported written: the kernel keeps writing back a killed process's
  dirty mmap pages, and none of that may reach the "disk"), every fsync fails with EIO (nothing can be made
  durable any more; a real cut would never answer), and every name operation and truncate fails with EIO.

This is the state with the most lost that a POSIX file system may leave. A real disk may also keep part of
what was written since the last fsync (a torn tail, a half-written page): the torn-tail and corrupt-record
tests cover those; here the question is only what an acknowledgement promised.
"""

import os
import shutil


class PowerModel:
    """Undo records per file (paths relative to the mount, with a leading '/') and the names not yet durable.

    Not thread-safe: ``FaultFS`` calls it under one lock, held across the operation it records.
    """

    def __init__(self, source):
        self.source = source
        self.undo = {}  # path -> [(offset, old bytes, old size)] since its last fsync
        self.new = set()  # names created since they (or their directory) were last fsynced
        self.is_cut = False

    def _src(self, path):
        return self.source + path

    def before_write(self, path, fd, offset, length):
        """Record the undo of a write; True when it is the file's first since its last fsync (or ever)."""
        first = path not in self.undo
        size = os.fstat(fd).st_size
        old = os.pread(fd, max(0, min(length, size - offset)), offset) if offset < size else b""
        self.undo.setdefault(path, []).append((offset, old, size))
        return first

    def before_truncate(self, path, length, fd=None):
        size = os.fstat(fd).st_size if fd else os.stat(self._src(path)).st_size
        old = b""
        if length < size:
            with open(self._src(path), "rb") as f:
                f.seek(length)
                old = f.read(size - length)
        self.undo.setdefault(path, []).append((length, old, size))

    def created(self, path):
        self.new.add(path)

    def synced(self, path):
        self.undo.pop(path, None)
        self.new.discard(path)

    def dir_synced(self, path):
        prefix = path.rstrip("/") + "/"
        self.new = {p for p in self.new if p.rsplit("/", 1)[0] + "/" != prefix}
        self.new.discard(path)

    def renamed(self, old, new):
        if old in self.undo:
            self.undo[new] = self.undo.pop(old)
        if old in self.new:
            self.new.discard(old)
            self.new.add(new)
        elif os.path.isdir(self._src(new)):  # names under a moved directory move with it
            moved = {p for p in self.new if p.startswith(old + "/")}
            self.new = (self.new - moved) | {new + p[len(old):] for p in moved}

    def unlinked(self, path):
        self.undo.pop(path, None)
        self.new.discard(path)

    def cut(self):
        """Restore every file to its last fsynced state and remove the names never made durable; returns a
        summary (files restored, bytes undone, names removed). From now on nothing reaches the disk."""
        self.is_cut = True
        restored, undone = 0, 0
        for path, records in self.undo.items():
            src = self._src(path)
            if not os.path.exists(src):
                continue
            fd = os.open(src, os.O_RDWR)
            try:
                for offset, old, size in reversed(records):
                    os.ftruncate(fd, size)
                    if old:
                        os.pwrite(fd, old, offset)
                    undone += len(old)
            finally:
                os.close(fd)
            restored += 1
        removed = []
        for path in sorted(self.new, key=len, reverse=True):  # children first
            src = self._src(path)
            if os.path.isdir(src) and not os.path.islink(src):
                shutil.rmtree(src, ignore_errors=True)
            elif os.path.lexists(src):
                os.unlink(src)
            else:
                continue
            removed.append(path)
        self.undo.clear()
        self.new.clear()
        return {"restored_files": restored, "bytes_undone": undone, "removed": sorted(removed)}
