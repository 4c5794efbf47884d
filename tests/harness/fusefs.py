"""A FUSE passthrough filesystem that fails on demand (fault-catalogue F5), and a helper to run it.

Run as a process of its own (``FaultMount`` below starts and stops it by its PID)::

    python -m tests.harness.fusefs SOURCE MOUNTPOINT --eio-flag PATH [--enospc-flag PATH] [--events PATH]
        [--power-flag PATH] [--stall-flag PATH --stall-prefix PREFIX]

Every operation on MOUNTPOINT is done on the same path under SOURCE. Flag files (kept outside both
trees) switch faults on for as long as they exist:

* **eio**: data written back is reported written but *not stored* (a write past the end still grows the
  file, with zeros), and the next ``fsync`` of that file fails with EIO, once: a later fsync with nothing
  newly lost succeeds. That is Linux's page cache over a failing disk ("fsyncgate"): the writeback fails
  quietly, the next fsync reports it, the pages are marked clean and go on serving bytes the disk never
  got, and a retried fsync "succeeds". ``fsyncdir`` fails with EIO as long as the flag exists. So SOURCE
  holds exactly what reached the "disk" before the flag appeared, and an acknowledgement that escaped a
  failed fsync (or came from a retried one) shows up as a lost message after a restart on SOURCE.
* **enospc**: ``write`` fails with ENOSPC (only under ``--enospc-prefix`` when given: the tests use the commit log).
* **power** (a power cut, for good once the flag appears; ``FaultMount(power=True)``): every file under SOURCE
  goes back to its state at its last completed fsync/fdatasync, names never made durable disappear, and from
  then on no write reaches SOURCE (writes are dropped, fsyncs fail with EIO, name operations fail with EIO).
  The model, and what it leaves out, is ``tests/harness/powercut.py``'s docstring. A thread notices the flag
  within ``POWER_POLL_S`` and appends a ``power-cut`` event (what was undone) when it is done; with the model
  on, every fsync is an event as it starts (``sync-start``) and completes (``sync``, with its start ``t0``),
  and so is the first write to a file after its last fsync (``dirty``: for a broker's fdatasync of an mmap,
  the kernel's writeback of its pages, which comes before the fsync operation), so a test knows what each
  acknowledgement could rest on. The bookkeeping serialises writes and fsyncs under one lock: slower, exact.
* **read-eio** (``--read-eio-flag``): the flag file holds ``<path under the mount> <start> <end>``; a read of that
  file overlapping bytes ``[start, end)`` fails with EIO, as an unreadable sector does (``FaultMount.fail_reads``;
  the page cache must not hold those pages: ``remount``).
* **stall** (``--stall-flag``, under ``--stall-prefix``): writes, truncates and fsyncs of those paths block
  until the flag goes (or the power is cut: then they are dropped / fail). A blocked operation is reported once
  as a ``stall`` event. A broker's mmap writes land in the page cache and are not blocked; its flush is (the
  kernel writes the dirty pages back through ``write`` before the fsync): so "written, not yet on the disk"
  can be held for as long as a test needs, and then cut (power) or let through.

Each injected fault is appended to the events file as a JSON line with its ``time.time()``.

Files go through the kernel page cache (``kernel_cache``, no ``direct_io``) so shared writable mmap works.
fusepy 3.0.1 has no ``fallocate`` operation: the kernel then answers EOPNOTSUPP and glibc's
``posix_fallocate`` falls back to writing one byte per block, which passes through ``write``.
Needs root, /dev/fuse, libfuse2 (Debian ``libfuse2``) and fusepy (the ``test`` extra).
"""

import argparse
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from tests.harness.powercut import PowerModel

#: How often the FUSE process looks for the power flag.
POWER_POLL_S = 0.002

_STAT_KEYS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize",
              "st_rdev")
_STATVFS_KEYS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
                 "f_flag", "f_namemax")
# Flags the kernel has already acted on (or that would change pwrite's meaning) are not passed on.
_OPEN_STRIP = os.O_ACCMODE | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_TRUNC


class FaultFS:
    """The operations (fusepy calls them by name; paths are relative to the mount, with a leading '/')."""

    use_ns = True  # times in integer nanoseconds

    def __init__(self, source, eio_flag, enospc_flag=None, events=None, enospc_prefix="", power_flag=None,
                 stall_flag=None, stall_prefix=""):
        self.source = os.path.realpath(source)
        self.eio_flag = eio_flag
        self.enospc_flag = enospc_flag
        self.enospc_prefix = enospc_prefix  # only writes to paths starting so fail with ENOSPC ("": every write)
        self.events = events
        self._lock = threading.Lock()
        self._lost = set()  # files with lost writes not yet reported by an fsync
        self.power_flag = power_flag
        self.power = PowerModel(self.source) if power_flag else None
        self._plock = threading.RLock()  # the power model's bookkeeping, held across the operation it records
        self.stall_flag = stall_flag
        self.stall_prefix = stall_prefix
        self.read_eio_flag = None  # set by main (--read-eio-flag)

    def __call__(self, op, *args):
        method = getattr(self, op, None)
        if method is None:
            raise OSError(errno.ENOSYS, op)
        return method(*args)

    def _src(self, path):
        return self.source + path

    def _fault(self, kind, op, path, **extra):
        if self.events:
            line = json.dumps(dict({"t": time.time(), "fault": kind, "op": op, "path": path}, **extra))
            with self._lock, open(self.events, "a") as f:
                f.write(line + "\n")

    # -- power cut and stall (off unless their flags are given) -----------------

    def watch_power(self):
        """The power flag's watcher (a thread of the FUSE process): cuts once, as soon as the flag appears."""
        while not os.path.exists(self.power_flag):
            time.sleep(POWER_POLL_S)
        with self._plock:
            summary = self.power.cut()
        self._fault("power-cut", "cut", "/", **summary)

    def _tracked(self):
        """The power model's lock when it is on (a no-op context otherwise)."""
        return self._plock if self.power is not None else _NO_LOCK

    def _cut(self):
        return self.power is not None and self.power.is_cut

    def _name_op(self, op, path):
        if self._cut():
            raise OSError(errno.EIO, "%s %s: the power is off" % (op, path))

    def _stall(self, op, path):
        if not self.stall_flag or not path.startswith(self.stall_prefix) or not os.path.exists(self.stall_flag):
            return
        self._fault("stall", op, path)
        while os.path.exists(self.stall_flag) and not self._cut():
            time.sleep(0.005)

    def _eio(self):
        return os.path.exists(self.eio_flag)

    # -- metadata ------------------------------------------------------------

    def getattr(self, path, fh=None):
        st = os.lstat(self._src(path))
        attrs = {key: getattr(st, key) for key in _STAT_KEYS}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def access(self, path, amode):
        if not os.access(self._src(path), amode):
            raise OSError(errno.EACCES, path)

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._src(path))

    def readlink(self, path):
        return os.readlink(self._src(path))

    def statfs(self, path):
        sv = os.statvfs(self._src(path))
        return {key: getattr(sv, key) for key in _STATVFS_KEYS}

    def chmod(self, path, mode):
        os.chmod(self._src(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._src(path), uid, gid)

    def utimens(self, path, times=None):
        if times is None:
            os.utime(self._src(path))
        else:
            os.utime(self._src(path), ns=(int(times[0]), int(times[1])))

    def truncate(self, path, length, fh=None):
        self._stall("truncate", path)
        with self._tracked():
            self._name_op("truncate", path)
            if self.power is not None:
                self.power.before_truncate(path, length, fh)
            if fh:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._src(path), length)

    # -- names ---------------------------------------------------------------

    def mkdir(self, path, mode):
        with self._tracked():
            self._name_op("mkdir", path)
            os.mkdir(self._src(path), mode)
            if self.power is not None:
                self.power.created(path)

    def rmdir(self, path):
        with self._tracked():
            self._name_op("rmdir", path)
            os.rmdir(self._src(path))
            if self.power is not None:
                self.power.unlinked(path)

    def mknod(self, path, mode, dev):
        with self._tracked():
            self._name_op("mknod", path)
            os.mknod(self._src(path), mode, dev)
            if self.power is not None:
                self.power.created(path)

    def unlink(self, path):
        with self._tracked():
            self._name_op("unlink", path)
            os.unlink(self._src(path))
            if self.power is not None:
                self.power.unlinked(path)

    def rename(self, old, new):
        with self._tracked():
            self._name_op("rename", old)
            os.rename(self._src(old), self._src(new))
            if self.power is not None:
                self.power.renamed(old, new)
        with self._lock:
            if old in self._lost:
                self._lost.discard(old)
                self._lost.add(new)

    def symlink(self, target, source):  # fusepy's names: the link ``target`` points at ``source``
        with self._tracked():
            self._name_op("symlink", target)
            os.symlink(source, self._src(target))
            if self.power is not None:
                self.power.created(target)

    def link(self, target, source):
        with self._tracked():
            self._name_op("link", target)
            os.link(self._src(source), self._src(target))

    # -- open files ----------------------------------------------------------

    def create(self, path, mode, fi=None):
        with self._tracked():
            self._name_op("create", path)
            existed = self.power is not None and os.path.lexists(self._src(path))
            fd = os.open(self._src(path), os.O_RDWR | os.O_CREAT, mode)
            if self.power is not None and not existed:
                self.power.created(path)
            return fd

    def open(self, path, flags):
        # Writeback of a shared mapping may read pages through any writable handle: make those read/write.
        access = os.O_RDONLY if flags & os.O_ACCMODE == os.O_RDONLY else os.O_RDWR
        return os.open(self._src(path), (flags & ~_OPEN_STRIP) | access)

    def read(self, path, size, offset, fh):
        if self.read_eio_flag and os.path.exists(self.read_eio_flag):
            with open(self.read_eio_flag) as f:
                bad, start, end = f.read().split()
            if path == bad and offset < int(end) and offset + size > int(start):
                self._fault("read-eio", "read", path, offset=offset, size=size)
                raise OSError(errno.EIO, path)
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        self._stall("write", path)
        with self._tracked():
            if self._cut():  # the machine is off: the kernel's writeback goes nowhere
                return len(data)
            if self.power is not None and self.power.before_write(path, fh, offset, len(data)):
                self._fault("dirty", "write", path)  # the first write since the file's last fsync
            return self._write(path, data, offset, fh)

    def _write(self, path, data, offset, fh):
        if self.enospc_flag and path.startswith(self.enospc_prefix) and os.path.exists(self.enospc_flag):
            self._fault("enospc", "write", path)
            raise OSError(errno.ENOSPC, path)
        if self._eio():  # "written": the failed writeback is reported by the next fsync
            self._fault("lost", "write", path)
            with self._lock:
                self._lost.add(path)
            if offset + len(data) > os.fstat(fh).st_size:
                os.ftruncate(fh, offset + len(data))  # the size is kept, the bytes are not: zeros
            return len(data)
        return os.pwrite(fh, data, offset)

    def flush(self, path, fh):
        return 0  # nothing is buffered here

    def release(self, path, fh):
        os.close(fh)

    def fsync(self, path, datasync, fh):
        self._stall("fsync", path)
        with self._tracked():
            if self._cut():
                raise OSError(errno.EIO, "fsync %s: the power is off" % path)
            t0 = time.time()
            if self.power is not None:
                self._fault("sync-start", "fdatasync" if datasync else "fsync", path)
            self._fsync(path, datasync, fh)
            if self.power is not None:
                self.power.synced(path)
                self._fault("sync", "fdatasync" if datasync else "fsync", path, t0=t0)

    def _fsync(self, path, datasync, fh):
        with self._lock:
            lost = path in self._lost
            self._lost.discard(path)  # reported once
        if lost:
            self._fault("eio", "fsync", path)
            raise OSError(errno.EIO, path)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    def fsyncdir(self, path, datasync, fh):
        if self._eio():
            self._fault("eio", "fsyncdir", path)
            raise OSError(errno.EIO, path)
        with self._tracked():
            if self._cut():
                raise OSError(errno.EIO, "fsyncdir %s: the power is off" % path)
            fd = os.open(self._src(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if self.power is not None:
                self.power.dir_synced(path)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.harness.fusefs", description=__doc__.split("\n")[0])
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--eio-flag", required=True, help="while this file exists: fsync fails with EIO, writes are lost")
    ap.add_argument("--enospc-flag", help="while this file exists: write fails with ENOSPC")
    ap.add_argument("--events", help="append one JSON line per injected fault here")
    ap.add_argument("--enospc-prefix", default="", help="only writes to paths starting so fail with ENOSPC")
    ap.add_argument("--power-flag", help="when this file appears: the power is cut (see tests/harness/powercut.py)")
    ap.add_argument("--stall-flag", help="while this file exists: writes and fsyncs under --stall-prefix block")
    ap.add_argument("--stall-prefix", default="", help="the paths --stall-flag blocks")
    ap.add_argument("--read-eio-flag", help="holds '<path> <start> <end>': reads of those bytes fail with EIO")
    args = ap.parse_args(argv)
    import fuse  # fusepy; imported here so that a missing package is reported by this process

    ops = FaultFS(args.source, args.eio_flag, args.enospc_flag, args.events, args.enospc_prefix, args.power_flag,
                  args.stall_flag, args.stall_prefix)
    ops.read_eio_flag = args.read_eio_flag
    if ops.power is not None:
        threading.Thread(target=ops.watch_power, name="power-flag", daemon=True).start()
    fuse.FUSE(ops, args.mountpoint, foreground=True, kernel_cache=True, big_writes=True, max_write=131072,
              fsname="metaq-fusefault")


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_LOCK = _NoLock()


# -- the test side: run the filesystem as a process ---------------------------


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1].replace("\\040", " ") == path for line in f)


class FaultMount:
    """The filesystem above in a process of its own, mounted over ``mountpoint`` with ``source`` beneath.

    ``start`` raises AssertionError (so the test FAILS, with the reason) when FUSE cannot be mounted here.
    """

    def __init__(self, workdir, name="", power=False, stall_prefix=None):
        """``power``: keep the power-cut model (``power_cut``); ``stall_prefix``: a path under the mount
        (e.g. ``/data/commitlog/``) that ``set_fault("stall")`` blocks; ``name`` tells two mounts apart."""
        workdir = str(workdir)
        self.source = os.path.join(workdir, name + "fuse-source")
        self.mountpoint = os.path.join(workdir, name + "fuse-mnt")
        self.eio_flag = os.path.join(workdir, name + "fault-eio")
        self.enospc_flag = os.path.join(workdir, name + "fault-enospc")
        self.power_flag = os.path.join(workdir, name + "fault-power") if power else None
        self.stall_flag = os.path.join(workdir, name + "fault-stall") if stall_prefix is not None else None
        self.stall_prefix = stall_prefix
        self.read_eio_flag = os.path.join(workdir, name + "fault-read-eio")
        self.events_path = os.path.join(workdir, name + "fault-events.jsonl")
        self.log_path = os.path.join(workdir, name + "fusefault.log")
        self.proc = None

    def start(self, timeout=15.0):
        problems = self.prerequisites()
        assert not problems, "the FUSE fault filesystem cannot run here: " + "; ".join(problems)
        os.makedirs(self.source, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.harness.fusefs", self.source, self.mountpoint, "--eio-flag", self.eio_flag,
               "--enospc-flag", self.enospc_flag, "--events", self.events_path,
               # the commit log's writes: an index growing on demand would otherwise meet ENOSPC first, and the
               # broker refuse writes as a full disk (507) before any flush of the log failed
               "--enospc-prefix", "/data/commitlog/", "--read-eio-flag", self.read_eio_flag]
        if self.power_flag:
            cmd += ["--power-flag", self.power_flag]
        if self.stall_flag:
            cmd += ["--stall-flag", self.stall_flag, "--stall-prefix", self.stall_prefix]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not is_mounted(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("the FUSE fault filesystem did not mount on %s (exit %s):\n%s"
                                     % (self.mountpoint, self.proc.returncode, self.log_text()))
            time.sleep(0.02)
        return self

    @staticmethod
    def prerequisites():
        """What is missing for a FUSE mount here (empty when nothing is)."""
        problems = []
        if not os.path.exists("/dev/fuse"):
            problems.append("/dev/fuse is missing (no FUSE in this kernel or container)")
        if os.geteuid() != 0:
            problems.append("not root (the mount is made with mount(2) by libfuse)")
        try:
            import fuse  # noqa: F401 - fusepy loads libfuse2 on import
        except (ImportError, OSError) as exc:
            problems.append("fusepy/libfuse2 unusable (%s): `make sysdeps` installs libfuse2, the `test` extra "
                            "installs fusepy" % exc)
        return problems

    def log_text(self):
        from metaq.client.local import read_text

        return read_text(self.log_path)

    def set_fault(self, kind, on=True):
        """Switch ``kind`` ("eio", "enospc" or "stall") on or off; returns the time.time() of the switch."""
        flag = {"eio": self.eio_flag, "enospc": self.enospc_flag, "stall": self.stall_flag}[kind]
        if on:
            with open(flag, "w"):
                pass
        elif os.path.exists(flag):
            os.unlink(flag)
        return time.time()

    def fail_reads(self, path, start, end):
        """From now on, reads of bytes ``[start, end)`` of ``path`` (a path on the mount) fail with EIO."""
        rel = "/" + os.path.relpath(path, self.mountpoint)
        with open(self.read_eio_flag, "w") as f:
            f.write("%s %d %d" % (rel, start, end))

    def remount(self):
        """Unmount and mount again (the page cache of the mount's files goes with it)."""
        self.stop()
        return self.start()

    def power_cut(self, timeout=10.0):
        """Cut the power (for good) and wait until the filesystem has done it; returns the ``power-cut`` event
        (its ``t``: when the disk stopped taking writes; what was undone)."""
        assert self.power_flag, "FaultMount(power=True) keeps the power-cut model"
        with open(self.power_flag, "w"):
            pass
        deadline = time.monotonic() + timeout
        while True:
            cuts = [e for e in self.events() if e["fault"] == "power-cut"]
            if cuts:
                return cuts[0]
            assert time.monotonic() < deadline, "the power cut was not done within %.0f s:\n%s" % (
                timeout, self.log_text())
            time.sleep(0.005)

    def syncs(self, prefix=""):
        """The fsyncs completed before the cut (power model on), of paths starting with ``prefix``."""
        return [e for e in self.events() if e["fault"] == "sync" and e["path"].startswith(prefix)]

    def stalls(self, prefix=""):
        return [e for e in self.events() if e["fault"] == "stall" and e["path"].startswith(prefix)]

    def syncfs(self):
        """Write back what the kernel holds for the mount (a killed process's dirty pages): after kill -9
        without a power cut, the page cache reaches the disk (syncfs(2), via coreutils ``sync -f``)."""
        subprocess.run(["sync", "-f", self.mountpoint], check=True, timeout=60)

    def events(self):
        """The injected faults so far (dicts with t, fault, op, path), in order."""
        try:
            with open(self.events_path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def stop(self):
        """Stop the process (by its PID) and make sure nothing stays mounted. Stop users of the mount first."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # libfuse unmounts and returns from its loop
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if is_mounted(self.mountpoint):
            if shutil.which("fusermount"):
                subprocess.run(["fusermount", "-u", "-z", self.mountpoint], check=False, capture_output=True)
            if is_mounted(self.mountpoint):
                subprocess.run(["umount", "-l", self.mountpoint], check=False, capture_output=True)
        assert not is_mounted(self.mountpoint), "could not unmount %s" % self.mountpoint

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    main()
