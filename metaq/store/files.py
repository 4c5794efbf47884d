"""Every file name of the store, and the small state files (checkpoint, clean-shutdown marker).

Layout of the data dir::

    commitlog/<20-digit start position>                 commit-log segments
    commitlog/<20-digit start position>.prepared        the next segment, built ahead of a roll
    index/<topic>/<partition>/<20-digit start byte>     index files (start byte = 16 x first offset)
    index/<topic>/<partition>/<start byte>.prepared     the next index file, built ahead
    checkpoint                                          log position durable for log and index (CRC)
    clean_shutdown                                      written by a clean close (CRC), removed at open
    consumer_offsets                                    the broker's consumer-offset store (CRC)
    topic_owners                                        the user whose put created each topic (CRC; quota.py)
    delay_offsets                                       the delay scheduler's per-level offsets (CRC)
    lock                                                flock'ed while a broker has the dir open
    epochs                                              replication epoch history (CRC; epochs.py)
    promoted                                            present once this broker was promoted to master (CRC)
    producers, producers.prev                           idempotent producers' windows and the snapshot
                                                        before (CRC; written by idempotence/state.py)

A topic reaches the filesystem only through ``limits.validate_topic()`` and the
resolved path is checked to stay inside the data dir.
"""

import errno
import fcntl
import json
import logging
import os
import struct
from typing import NamedTuple

from metaq import limits
from metaq.errors import DiskFull, InvalidTopic, StoreError, Unavailable
from metaq.protocol.checksum import crc32

log = logging.getLogger(__name__)

COMMITLOG_DIR = "commitlog"
INDEX_DIR = "index"
KEY_INDEX_DIR = "keyindex"  # the key index's files (keys/index.py), named by their first log position
KEY_CHECKPOINT_FILE = "key_checkpoint"
CHECKPOINT_FILE = "checkpoint"
CLEAN_SHUTDOWN_FILE = "clean_shutdown"
LOCK_FILE = "lock"
CONSUMER_OFFSETS_FILE = "consumer_offsets"
TOPIC_OWNERS_FILE = "topic_owners"
DELAY_OFFSETS_FILE = "delay_offsets"
EPOCHS_FILE = "epochs"
PROMOTED_FILE = "promoted"
TEMP_SUFFIX = ".tmp"
#: A file built ahead by a worker thread under this name; a roll renames it to its final name.
PREPARED_SUFFIX = ".prepared"
NAME_DIGITS = 20

#: State file header: magic (4 bytes), body length (uint32), CRC-32 of the body (uint32); body = JSON.
STATE_HEADER = struct.Struct(">4sII")
assert STATE_HEADER.size == 12
CHECKPOINT_MAGIC = b"MQCP"
CLEAN_MAGIC = b"MQCS"
KEY_CHECKPOINT_MAGIC = b"MQKC"
TOPIC_OWNERS_MAGIC = b"MQTO"
MAX_STATE_BYTES = 64 << 20

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: The process (EMFILE) or the system (ENFILE) is out of file descriptors: transient, never a broken store.
FD_EXHAUSTED_ERRNOS = (errno.EMFILE, errno.ENFILE)


class DiskUsage(NamedTuple):
    """``df``'s figures for one filesystem, in bytes: used, and available to a process without root's reserve."""

    used_bytes: int
    available_bytes: int

    @property
    def ratio(self):
        """used / (used + available): ``df``'s Use% before it rounds up (1.0 when the filesystem has no room at all)."""
        room = self.used_bytes + self.available_bytes
        return self.used_bytes / room if room else 1.0

    def ratio_after(self, more_bytes):
        """The ratio once ``more_bytes`` more are used (negative: freed)."""
        room = self.used_bytes + self.available_bytes
        return (self.used_bytes + more_bytes) / room if room else 1.0


def disk_usage(path):
    """BLOCKING (one statvfs): the ``DiskUsage`` of the filesystem holding ``path``, as ``df`` computes it.

    The one measurement behind the danger and warn marks, retention's estimate and ``stats``'
    ``disk_usage``: the blocks root keeps back (``f_bfree - f_bavail``) count neither as used nor as
    available, exactly as in ``df``, so a filesystem with a large root reserve is not shown emptier
    than it is to the broker.
    """
    st = os.statvfs(path)
    return DiskUsage((st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize)


def offset_name(value):
    """The 20-digit zero-padded name of a segment or index file."""
    return "%0*d" % (NAME_DIGITS, value)


def parse_offset_name(name):
    """The number a file name stands for, or None if it is not one of ours (a log position is an int64: twenty
    digits past 2**63-1 were never written by a broker)."""
    if len(name) != NAME_DIGITS or not name.isdigit():
        return None
    number = int(name)
    return number if number < 1 << 63 else None


def prepared_path(path):
    """Where the file that becomes ``path`` is built ahead of time."""
    return path + PREPARED_SUFFIX


def disk_full_from(exc, what):
    """The error for an OSError met doing ``what``: DiskFull (ENOSPC/EDQUOT), Unavailable (out of file
    descriptors: try again later), else StoreError."""
    if exc.errno in DISK_FULL_ERRNOS:
        return DiskFull("disk full: no space left to %s (%s); writes are refused until space is freed"
                        % (what, exc.strerror))
    if exc.errno in FD_EXHAUSTED_ERRNOS:
        return Unavailable("cannot %s now: %s (the broker is out of file descriptors); try again later"
                           % (what, exc.strerror))
    return StoreError("cannot %s: %s" % (what, exc))


class DataDir:
    """Paths inside one data dir; the only place that builds them."""

    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.commitlog = os.path.join(self.root, COMMITLOG_DIR)
        self.index = os.path.join(self.root, INDEX_DIR)
        self.keys = os.path.join(self.root, KEY_INDEX_DIR)
        self.key_checkpoint = os.path.join(self.root, KEY_CHECKPOINT_FILE)
        self.checkpoint = os.path.join(self.root, CHECKPOINT_FILE)
        self.clean_shutdown = os.path.join(self.root, CLEAN_SHUTDOWN_FILE)
        self.lock = os.path.join(self.root, LOCK_FILE)
        self.consumer_offsets = os.path.join(self.root, CONSUMER_OFFSETS_FILE)
        self.topic_owners = os.path.join(self.root, TOPIC_OWNERS_FILE)
        self.delay_offsets = os.path.join(self.root, DELAY_OFFSETS_FILE)
        self.epochs = os.path.join(self.root, EPOCHS_FILE)
        self.promoted = os.path.join(self.root, PROMOTED_FILE)
        self._lock_fd = None

    def create(self):
        try:
            for path in (self.root, self.commitlog, self.index, self.keys):
                os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise disk_full_from(exc, "create the data dir %s" % self.root) from None

    # -- lock ----------------------------------------------------------------

    def acquire_lock(self):
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError("data dir %s is in use by another broker (its lock file %s is held)"
                             % (self.root, self.lock)) from None
        self._lock_fd = fd

    def release_lock(self):
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- commit log ----------------------------------------------------------

    def segment_path(self, start):
        return os.path.join(self.commitlog, offset_name(start))

    def remove_prepared(self, directory):
        """Delete the ``.prepared`` files left in ``directory`` (a crash before their roll); returns them."""
        gone = []
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return gone
        for name in sorted(names):
            if name.endswith(PREPARED_SUFFIX) and parse_offset_name(name[:-len(PREPARED_SUFFIX)]) is not None:
                path = os.path.join(directory, name)
                unlink_quietly(path)
                gone.append(path)
        return gone

    def list_segments(self):
        """Sorted ``[(start, path)]``; stray files are logged and left alone."""
        return self._list_numbered(self.commitlog)

    # -- key index -----------------------------------------------------------

    def key_file_path(self, first_position):
        return os.path.join(self.keys, offset_name(first_position))

    def list_key_files(self):
        """Sorted ``[(first log position, path)]`` of the key index's files."""
        return self._list_numbered(self.keys)

    # -- index ---------------------------------------------------------------

    def partition_dir(self, topic, partition):
        """The index directory of a topic-partition (validated; never outside the data dir)."""
        limits.validate_topic(topic)
        if not isinstance(partition, int) or not 0 <= partition < limits.MAX_PARTITIONS:
            raise InvalidTopic("partition %r cannot name an index directory" % (partition,))
        path = os.path.join(self.index, topic, str(partition))
        real = os.path.realpath(path)
        if os.path.commonpath([real, self.index]) != self.index or real == self.index:
            raise InvalidTopic("topic %r would leave the data directory" % (topic,))
        return real

    def index_file_path(self, topic, partition, start_unit):
        return os.path.join(self.partition_dir(topic, partition), offset_name(16 * start_unit))

    def list_index_files(self, topic, partition):
        """Sorted ``[(start_byte, path)]`` of one partition's index files."""
        return self._list_numbered(self.partition_dir(topic, partition))

    def list_partitions(self):
        """``[(topic, partition)]`` that have an index directory, ignoring anything illegal."""
        found = []
        try:
            topics = sorted(os.listdir(self.index))
        except FileNotFoundError:
            return found
        for topic in topics:
            try:
                limits.validate_topic(topic)
            except InvalidTopic:
                log.warning("ignoring %s in %s: not a legal topic name", topic, self.index)
                continue
            tdir = os.path.join(self.index, topic)
            if not os.path.isdir(tdir):
                continue
            for name in sorted(os.listdir(tdir)):
                if name.isdigit() and str(int(name)) == name and int(name) < limits.MAX_PARTITIONS:
                    found.append((topic, int(name)))
                else:
                    log.warning("ignoring %s in %s: not a partition number", name, tdir)
        return found

    def _list_numbered(self, directory):
        out = []
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return out
        for name in names:
            value = parse_offset_name(name)
            if value is None:
                if not name.endswith((TEMP_SUFFIX, PREPARED_SUFFIX)):
                    log.warning("ignoring stray file %s in %s", name, directory)
                continue
            out.append((value, os.path.join(directory, name)))
        out.sort()
        return out

    # -- state files ---------------------------------------------------------

    def write_state(self, path, magic, state):
        """Write ``state`` (JSON) atomically: temp file + fsync + rename + fsync of the dir.

        An OSError (ENOSPC, EIO) propagates as is; the old file stays in place.
        """
        body = json.dumps(state, sort_keys=True, separators=(",", ":")).encode("utf-8")
        write_atomically(path, STATE_HEADER.pack(magic, len(body), crc32(body)) + body)
        fsync_dir(self.root)

    def read_state(self, path, magic):
        """The JSON state in ``path``, or None if it is missing or fails its checks (logged)."""
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_STATE_BYTES)
        except FileNotFoundError:
            return None
        if len(data) < STATE_HEADER.size:
            log.warning("%s is too short (%d bytes): ignored", path, len(data))
            return None
        got_magic, length, crc = STATE_HEADER.unpack_from(data)
        body = data[STATE_HEADER.size:]
        if got_magic != magic or length != len(body) or crc32(body) != crc:
            log.warning("%s fails its magic/length/CRC check: ignored", path)
            return None
        try:
            state = json.loads(body.decode("utf-8"))
        except ValueError:
            log.warning("%s holds no valid JSON: ignored", path)
            return None
        return state if isinstance(state, dict) else None

    def remove(self, path):
        """Unlink ``path`` (and make that durable); False if it was not there."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        fsync_dir(os.path.dirname(path))
        return True


def write_atomically(path, data, previous=None):
    """``data`` to ``path`` through a temp file (written, fsynced, renamed over it); with ``previous``, the file it
    replaces is renamed there first. The caller fsyncs the directory. An OSError (ENOSPC, EIO) propagates as is,
    the temp file removed and the old file in place."""
    tmp = path + TEMP_SUFFIX
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write to %s" % tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        if previous is not None and os.path.exists(path):
            os.replace(path, previous)
        os.replace(tmp, path)
    except OSError:
        unlink_quietly(tmp)
        raise


def unlink_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_fd(fd):
    """fsync an open descriptor (a directory's, say): the one name tests replace to inject EIO."""
    os.fsync(fd)


def close_now(fd):
    """Close ``fd`` at once, whatever ``os.close`` has been replaced with.

    gevent's monkey-patched ``os.close`` (gevent >= 25.8.1) defers closing anything
    but a regular file (a directory, say) to the next turn of its loop: a burst of
    puts that each create a topic (one directory fsync each) would pile up one
    directory descriptor per put until EMFILE. The store never registers its
    descriptors with an event loop, so it closes them itself.

    An error from close is ignored (Linux frees the descriptor either way): the
    store's durability rests on what fsync/fdatasync answer, and a close error
    (FUSE and NFS report writeback errors there) must not turn a clean DiskFull
    into an unexpected exception.
    """
    os.closerange(fd, fd + 1)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        close_now(fd)
