"""An older broker's transaction journal files: read once at open (torn tails cut, corruption refused unless
forced) and migrated into the commit log, where the journal now lives (``metaq.transactions.follow``). The write
side below is what wrote them; it stays to read them back exactly and to write such a directory in tests.

Layout of ``<data dir>/transactions/`` (all tx file naming lives here)::

    journal.<20-digit sequence>     append files; only the newest one is written
    snapshot.<20-digit sequence>    the state after every journal file up to that sequence (a checkpoint)
    snapshot.<sequence>.tmp         a snapshot being written (left by a crash: deleted at open)

Records are ``records.HEADER`` + payload (see ``records``). ``append`` writes
with ``os.writev`` into the page cache; ``flush`` fdatasyncs. When the active
file reaches ``file_size`` the next append starts ``journal.<n+1>`` (a cheap
``open``); the full files are then "sealed" and a checkpoint
(``install_snapshot``, run by ``TransactionManager.maintain``) replaces them
with one snapshot: write ``.tmp``, fsync, rename, fsync the directory, then
delete the sealed files and older snapshots. At open the newest complete
snapshot wins and anything it covers is deleted, so a crash at any point of
a checkpoint leaves a readable journal.

Threads: ``append``/``roll`` run on the loop; ``flush`` in workers (several
may run at once: each opens the files it syncs by path, so no descriptor is
shared with the loop) and the checkpoint methods (``sealed_seqs``,
``read_through``, ``install_snapshot``) in a worker, one call at a time; none
of them during ``close``. They share only ``_unsynced`` (sequences of rolled
files not yet fdatasynced: the loop appends, ``flush`` removes) and counters
that each have one writer.
"""

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import List, Optional

from metaq.errors import CorruptLog, DiskFull
from metaq.protocol.checksum import crc32
from metaq.store.files import disk_full_from, fsync_dir, offset_name, unlink_quietly, write_atomically
from metaq.transactions import records as R

log = logging.getLogger(__name__)

DIR_NAME = "transactions"
JOURNAL_PREFIX = "journal."
SNAPSHOT_PREFIX = "snapshot."
TMP_SUFFIX = ".tmp"
_NAME = re.compile(r"(journal|snapshot)\.(\d{20})(\.tmp)?")
#: Written by a clean close, removed by the next open: every journal file's length then. With it, damage is not a
#: torn tail (nothing was being written), and a file shorter, longer or missing is corruption, not a crash's doing.
CLEAN_NAME = "clean-close"
#: Smallest and largest ``journal_file_size`` accepted.
MIN_JOURNAL_FILE_SIZE = 1024
MAX_JOURNAL_FILE_SIZE = 1 << 30
# A record's length is below 16 MiB, so its first byte is 0: the search for a valid record after damage
# only looks where a zero byte is followed, 8 bytes on, by a known record type.
assert R.MAX_RECORD_BYTES < 1 << 24
_CANDIDATE = re.compile(rb"(?=\x00[\x00-\xff]{7}[\x01-\x09])", re.S)


def journal_dir(root):
    """The journal directory inside a data dir."""
    return os.path.join(root, DIR_NAME)


def journal_path(directory, seq):
    return os.path.join(directory, JOURNAL_PREFIX + offset_name(seq))


def snapshot_path(directory, seq):
    return os.path.join(directory, SNAPSHOT_PREFIX + offset_name(seq))


def list_files(directory):
    """``(journals, snapshots, temps)``: {seq: path}, {seq: path}, [path]; stray names are logged and left."""
    journals, snapshots, temps = {}, {}, []
    for name in sorted(os.listdir(directory)):
        m = _NAME.fullmatch(name)
        path = os.path.join(directory, name)
        if name == CLEAN_NAME:
            continue
        if m is None:
            log.warning("ignoring stray file %s in %s", name, directory)
        elif m.group(3):
            temps.append(path)
        elif m.group(1) == "journal":
            journals[int(m.group(2))] = path
        else:
            snapshots[int(m.group(2))] = path
    return journals, snapshots, temps


@dataclass
class JournalReport:
    """What opening the journal found and did."""

    files: List[str] = field(default_factory=list)  # journal files replayed, in order
    snapshot: Optional[str] = None  # the snapshot replay started from
    records: int = 0
    torn: List[tuple] = field(default_factory=list)  # (path, cut at byte, bytes cut, reason)
    torn_bytes: int = 0
    corruption: Optional[str] = None  # set when force cut or skipped corrupt data
    removed: List[str] = field(default_factory=list)  # superseded or temporary files deleted


# -- reading ---------------------------------------------------------------------------------------------


def scan_records(data):
    """``([(offset, payload memoryview)], good_end, stop_reason or None)`` of a file's bytes."""
    view = memoryview(data)
    n = len(data)
    pos = 0
    out = []
    while pos < n:
        if n - pos < R.HEADER.size:
            return out, pos, "partial record header"
        length, crc = R.HEADER.unpack_from(data, pos)
        if length == 0 or length > R.MAX_RECORD_BYTES:
            return out, pos, "bad record length %d" % length
        end = pos + R.HEADER.size + length
        if end > n:
            return out, pos, "record of %d bytes runs past the end of the file" % length
        payload = view[pos + R.HEADER.size:end]
        if crc32(payload) != crc:
            return out, pos, "CRC mismatch"
        out.append((pos, payload))
        pos = end
    return out, pos, None


def valid_record_after(data, start):
    """Offset of a CRC-valid record starting after ``start``, or None."""
    n = len(data)
    for m in _CANDIDATE.finditer(data, start + 1):
        p = m.start()
        length, crc = R.HEADER.unpack_from(data, p)
        end = p + R.HEADER.size + length
        if 0 < length <= R.MAX_RECORD_BYTES and end <= n and crc32(memoryview(data)[p + R.HEADER.size:end]) == crc:
            return p
    return None


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _decode_all(path, found, report_bad):
    """Decoded records of ``found``; on a record that does not decode calls ``report_bad(offset, why)``."""
    out = []
    for offset, payload in found:
        try:
            out.append(R.decode(payload))
        except R.RecordError as exc:
            report_bad(offset, str(exc))
            break
    return out


def read_snapshot(path, seq):
    """``(records, problem)``: a complete snapshot's records (without its frame), or a reason it is unusable."""
    data = _read(path)
    found, _end, reason = scan_records(data)
    if reason is not None:
        return None, "%s at byte %d" % (reason, _end)
    bad = []
    recs = _decode_all(path, found, lambda off, why: bad.append("%s at byte %d" % (why, off)))
    if bad:
        return None, bad[0]
    if (len(recs) < 2 or type(recs[0]) is not R.Snapshot or recs[0].through != seq
            or type(recs[-1]) is not R.SnapEnd or recs[-1].records != len(recs) - 2):
        return None, "incomplete snapshot (no matching SNAPSHOT ... SNAP_END frame)"
    return recs[1:-1], None


def read_journal_file(path, force, report, clean_size=None):
    """Decoded records of one journal file; cuts a torn tail (or forced corruption) and notes it in ``report``.
    ``clean_size``: its length at a clean close (the last run ended so): then no tail is torn, any damage is
    corruption, and so is another length."""
    data = _read(path)
    found, end, reason = scan_records(data)
    cut = None
    if clean_size is not None and clean_size != len(data):
        cut = _corrupt(path, min(clean_size, len(data)), None, "%d bytes where a clean close left %d"
                       % (len(data), clean_size), abs(len(data) - clean_size), force, report)
        found = [(offset, payload) for offset, payload in found if offset < cut]
    elif reason is not None:
        after = valid_record_after(data, end)
        if after is not None or clean_size is not None:
            cut = _corrupt(path, end, after, reason, len(data) - end, force, report)
        else:
            cut = end
            log.warning("transaction journal %s: torn tail at byte %d (%s): cutting %d bytes",
                        path, end, reason, len(data) - end)

    def bad(offset, why):
        nonlocal cut
        cut = _corrupt(path, offset, None, why, len(data) - offset, force, report)

    recs = _decode_all(path, found, bad)
    if cut is not None:
        report.torn.append((path, cut, len(data) - cut, reason))
        report.torn_bytes += len(data) - cut
        with open(path, "r+b") as f:
            f.truncate(cut)
            os.fsync(f.fileno())
    if any(type(r) in (R.Snapshot, R.SnapEnd) for r in recs):
        raise CorruptLog("transaction journal %s holds snapshot records" % path, path, 0)
    return recs


def _corrupt(path, position, after, reason, nbytes, force, report):
    where = "transaction journal %s: %s at byte %d" % (path, reason, position)
    if after is not None:
        where += ", but a valid record follows at byte %d" % after
    if not force:
        raise CorruptLog("refusing to start: %s. Repair or restore the data, or start with force_recovery "
                         "(--force-recovery) to cut the journal there, discarding %d bytes" % (where, nbytes),
                         path, position)
    log.error("recovery forced: %s; cutting %d bytes there", where, nbytes)
    report.corruption = where
    return position


def _read_clean(directory):
    """The clean-close marker's ``{journal file name: length}`` (None without one, or unreadable: logged). ``open``
    removes it once the journal is open: the run that opens it writes to it (a refused open leaves it)."""
    path = os.path.join(directory, CLEAN_NAME)
    try:
        with open(path, "rb") as f:
            lengths = json.loads(f.read().decode("utf-8"))
        if not isinstance(lengths, dict) or not all(isinstance(v, int) for v in lengths.values()):
            raise ValueError("not a map of lengths")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("transaction journal: the clean-close marker %s is unreadable (%s): ignored", path, exc)
        lengths = None
    return lengths


# -- the journal -----------------------------------------------------------------------------------------


def remove_journal(directory):
    """BLOCKING: delete a migrated journal directory (its files, then itself; the parent directory synced)."""
    for name in os.listdir(directory):
        unlink_quietly(os.path.join(directory, name))
    try:
        os.rmdir(directory)
    except OSError as exc:
        log.warning("transactions: %s not removed: %s", directory, exc)
        return
    fsync_dir(os.path.dirname(directory) or ".")


class Journal:
    """The append side plus checkpoint helpers; open with ``Journal.open``."""

    @staticmethod
    def exists(directory):
        """True when ``directory`` holds a journal or a snapshot (an older broker's journal to migrate)."""
        if not os.path.isdir(directory):
            return False
        journals, snapshots, _temps = list_files(directory)
        return bool(journals or snapshots)

    def __init__(self, directory, file_size):
        self.directory = directory
        self.file_size = file_size
        self._fd = None
        self._active_seq = 0
        self._active_size = 0
        self._unsynced = []  # sequences of rolled files (no longer written) not yet fdatasynced
        self._appended = 0  # loop: bytes appended since open
        self._synced = 0  # flush: ``_appended`` durable
        self._dir_changes = 0  # loop: files created
        self._dir_synced = 0
        self._snapshot_seq = None  # open / checkpoint worker
        self._oldest_seq = 0  # open / checkpoint worker: the oldest journal file kept
        self._base_bytes = 0  # bytes on disk at open
        self._added_bytes = 0  # checkpoint worker: snapshot bytes written
        self._removed_bytes = 0  # checkpoint worker: bytes of deleted files

    @classmethod
    def open(cls, directory, file_size, force=False):
        """BLOCKING: ``(journal, records, JournalReport)``; the records are everything still live, in order.

        Raises CorruptLog for damage followed by valid records (unless ``force``: cut there).
        """
        os.makedirs(directory, exist_ok=True)
        self = cls(directory, file_size)
        report = JournalReport()
        journals, snapshots, temps = list_files(directory)
        clean = _read_clean(directory)  # {name: length} of a clean close, or None
        for path in temps:
            unlink_quietly(path)
            report.removed.append(path)
        records = self._load_snapshot(snapshots, force, report)
        missing = sorted(set(clean or ()) - {os.path.basename(p) for p in journals.values()})
        if missing:
            _corrupt(os.path.join(directory, missing[0]), 0, None, "missing (a clean close left it with %d bytes)"
                     % clean[missing[0]], clean[missing[0]], force, report)
        for seq, path in sorted(journals.items()):
            if self._snapshot_seq is not None and seq <= self._snapshot_seq:
                unlink_quietly(path)  # a crash between a checkpoint's rename and its deletes
                report.removed.append(path)
                continue
            size = clean.get(os.path.basename(path), -1) if clean is not None else None
            records.extend(read_journal_file(path, force, report, size))
            report.files.append(path)
            self._active_seq = seq
        report.records = len(records)
        self._open_active()
        unlink_quietly(os.path.join(directory, CLEAN_NAME))  # this run writes: its end is a crash's until close
        self._oldest_seq = int(os.path.basename(report.files[0])[len(JOURNAL_PREFIX):]) if report.files \
            else self._active_seq
        fsync_dir(directory)
        self._base_bytes = self._disk_bytes()
        return self, records, report

    def _load_snapshot(self, snapshots, force, report):
        for seq in sorted(snapshots, reverse=True):
            path = snapshots[seq]
            recs, problem = read_snapshot(path, seq)
            if problem is None:
                self._snapshot_seq = self._active_seq = seq
                report.snapshot = path
                for old in sorted(s for s in snapshots if s < seq):
                    unlink_quietly(snapshots[old])
                    report.removed.append(snapshots[old])
                return list(recs)
            what = "transaction snapshot %s is unusable: %s" % (path, problem)
            if not force:
                raise CorruptLog("refusing to start: %s. Repair or restore the data, or start with force_recovery "
                                 "(--force-recovery) to skip it" % what, path, 0)
            log.error("recovery forced: %s; skipping it", what)
            report.corruption = what
            os.replace(path, path + ".bad")
        return []

    def _open_active(self):
        if self._active_seq == 0 or self._active_seq == self._snapshot_seq:
            self._active_seq += 1
        path = journal_path(self.directory, self._active_seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._active_size = os.fstat(self._fd).st_size

    def _disk_bytes(self):
        journals, snapshots, _t = list_files(self.directory)
        return sum(_size(p) for p in list(journals.values()) + list(snapshots.values()))

    # -- append (loop) ---------------------------------------------------------

    def append(self, rec):
        """Append one record (page cache only); raises DiskFull or StoreError and leaves the file as it was."""
        parts = R.encode(rec)
        length = sum(len(p) for p in parts)
        if length > R.MAX_RECORD_BYTES:
            raise R.RecordError("a %s record of %d bytes exceeds %d" % (type(rec).__name__, length,
                                                                         R.MAX_RECORD_BYTES))
        crc = 0
        for p in parts:
            crc = crc32(p, crc)
        if self._active_size >= self.file_size:
            self.roll()
        total = R.HEADER.size + length
        try:
            written = os.writev(self._fd, [R.HEADER.pack(length, crc)] + parts)
        except OSError as exc:
            self._undo()
            raise disk_full_from(exc, "append to the transaction journal") from None
        if written != total:
            self._undo()
            raise DiskFull("disk full: short write (%d of %d bytes) to the transaction journal" % (written, total))
        self._active_size += total
        self._appended += total

    def _undo(self):
        try:
            os.ftruncate(self._fd, self._active_size)
        except OSError as exc:
            log.error("cannot cut a failed append from the transaction journal: %s", exc)

    def roll(self):
        """Start the next journal file (loop; one ``open``); on failure keep appending to the current one."""
        seq = self._active_seq + 1
        try:
            fd = os.open(journal_path(self.directory, seq), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND,
                         0o644)
        except OSError as exc:
            log.warning("cannot start transaction journal file %d: %s; continuing in %d", seq, exc, seq - 1)
            return
        old = self._fd
        self._unsynced.append(self._active_seq)  # before the switch: see flush
        self._fd = fd
        self._active_seq = seq
        self._active_size = 0
        self._dir_changes += 1
        os.close(old)

    # -- flush (worker) ----------------------------------------------------------

    @property
    def needs_flush(self):
        return self._appended > self._synced or self._dir_changes > self._dir_synced or bool(self._unsynced)

    def flush(self):
        """BLOCKING: fdatasync everything appended before the call (and the directory after a roll).

        Safe to run in several workers at once: every call makes what was appended before it durable.
        """
        mark = self._appended
        changes = self._dir_changes
        active = self._active_seq  # read before the list: roll appends to it before switching
        rolled = list(self._unsynced)
        if mark > self._synced:
            _sync_path(journal_path(self.directory, active))
        for seq in rolled:
            _sync_path(journal_path(self.directory, seq))
            try:
                self._unsynced.remove(seq)
            except ValueError:  # another flush synced it too
                pass
        if changes > self._dir_synced:
            fsync_dir(self.directory)
            self._dir_synced = max(self._dir_synced, changes)
        self._synced = max(self._synced, mark)

    # -- checkpoint (worker) -----------------------------------------------------------

    @property
    def active_seq(self):
        return self._active_seq

    @property
    def has_sealed(self):
        """Cheap: True when journal files the loop no longer writes are waiting for a checkpoint."""
        return self._oldest_seq < self._active_seq

    def sealed_seqs(self):
        """Sequences of journal files the loop no longer writes (the checkpoint may replace them)."""
        active = self._active_seq
        journals, _s, _t = list_files(self.directory)
        return sorted(s for s in journals if s < active)

    def read_through(self, through):
        """Records of the current snapshot and of journal files up to ``through`` (all complete)."""
        records = []
        snap = self._snapshot_seq
        if snap is not None:
            recs, problem = read_snapshot(snapshot_path(self.directory, snap), snap)
            if problem is not None:
                raise CorruptLog("transaction snapshot %d became unreadable: %s" % (snap, problem))
            records.extend(recs)
        journals, _s, _t = list_files(self.directory)
        for seq in sorted(s for s in journals if (snap is None or s > snap) and s <= through):
            report = JournalReport()
            records.extend(read_journal_file(journals[seq], False, report))
            if report.torn:
                raise CorruptLog("sealed transaction journal %s had a bad tail" % journals[seq])
        return records

    def install_snapshot(self, through, recs, now_ms):
        """BLOCKING: write ``recs`` as ``snapshot.<through>`` durably, then delete what it replaces.

        Returns the deleted paths.
        """
        final = snapshot_path(self.directory, through)
        tmp = final + TMP_SUFFIX
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        count = size = 0
        try:
            size += self._write_to(fd, R.Snapshot(now_ms, through))
            for rec in recs:
                size += self._write_to(fd, rec)
                count += 1
            size += self._write_to(fd, R.SnapEnd(count))
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            unlink_quietly(tmp)
            raise disk_full_from(exc, "write a transaction snapshot") from None
        os.close(fd)
        os.replace(tmp, final)
        fsync_dir(self.directory)
        self._added_bytes += size
        old_snap, self._snapshot_seq = self._snapshot_seq, through
        self._oldest_seq = through + 1
        journals, snapshots, _t = list_files(self.directory)
        gone = [p for s, p in sorted(journals.items()) if s <= through]
        gone += [p for s, p in sorted(snapshots.items()) if s < through]
        for path in gone:
            self._removed_bytes += _size(path)
            unlink_quietly(path)
        fsync_dir(self.directory)
        log.info("transaction journal checkpoint: snapshot %d (%d records, %d bytes) replaces %d files "
                 "(previous snapshot %s)", through, count, size, len(gone), old_snap)
        return gone

    @staticmethod
    def _write_to(fd, rec):
        parts = R.encode(rec)
        length = sum(len(p) for p in parts)
        crc = 0
        for p in parts:
            crc = crc32(p, crc)
        data = [R.HEADER.pack(length, crc)] + parts
        if os.writev(fd, data) != R.HEADER.size + length:
            raise OSError(28, "short write")
        return R.HEADER.size + length

    # -- close ---------------------------------------------------------------------

    @property
    def disk_bytes(self):
        """Bytes of journal and snapshot files (tracked, not measured)."""
        return self._base_bytes + self._appended + self._added_bytes - self._removed_bytes

    def close(self):
        """Flush, close and write the clean-close marker (no worker may be running ``flush`` or a checkpoint)."""
        if self._fd is None:
            return
        try:
            self.flush()
        finally:
            self.abandon()
        journals, _snapshots, _temps = list_files(self.directory)
        try:
            write_atomically(os.path.join(self.directory, CLEAN_NAME),
                             json.dumps({os.path.basename(p): _size(p) for p in journals.values()}).encode("utf-8"))
            fsync_dir(self.directory)
        except OSError as exc:  # the next open takes the end for a crash's: torn tails cut, as ever
            log.warning("transaction journal: no clean-close marker written: %s", exc)

    def abandon(self):
        """Close the files without flushing (tests: as after a kill -9)."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None


def _sync_path(path):
    """fdatasync a file through a descriptor of its own (a checkpoint may have deleted it: then nothing to do)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _size(path):
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0
