"""The idempotent producers' state in the store, and its one owner: decide and append without a yield, learn
from the log, snapshot, rebuild.

``MessageStore`` owns one ``Idempotence``, and every path that learns or changes producer state goes through
its methods; each of them changes the table (``idempotence.window.ProducerTable``) by the one rule,
``ProducerTable.record`` (``record_run``: that rule for a run, in one step), with the record's store time:

* the append (the master's ``put_idem``, a RocketMQ send with an identity): ``put`` decides
  (``ProducerTable.decide``), then either gives the original's ``PutResult`` (read from its index unit and
  record header) or appends the data with the identity added (``metaq.idempotence.records.with_identity``)
  and records it. ``put_prepared`` is the same for data that already holds its identity (the broker's burst
  path: ``metaq.idempotence.burst``), and ``put_run`` appends a burst's run of one producer's next sequences
  with the store's plain burst writer and records it in one step. Nothing in between yields to the event
  loop (the store never does), so two concurrent resends of one sequence cannot both be stored.
* replication (a slave's apply of the master's log): ``follow(append)`` runs the append and learns the
  records it wrote (``replay``), as one change of the table.
* recovery (at open): ``load(end)``, a snapshot and a ``replay`` of the log after it, or a ``rebuild``.
* a cut (a slave's divergent tail, ``MessageStore.truncate_log``): ``cut(position)``.

The entry points that follow the log (``replay``, ``learn``, ``rebuild``, ``cut``, ``load``) take log positions
and read the log themselves:

* ``replay(start, end)``: learn from every idempotent record in ``[start, end)``
  of the log. A segment range without the ``MARK`` bytes (``mmap.find``, no copy) is skipped
  whole; otherwise its records are walked and only those whose attribute holds
  the mark are decoded (``learn``, one record).
* ``save`` (at every store checkpoint, and so at a clean close): the table's
  snapshot with the log position it covers, written to ``producers`` (temp file +
  fsync + rename + directory fsync); the one it replaces is kept as
  ``producers.prev``. Skipped when the table did not change and the log grew by
  less than ``limits.IDEMPOTENCE_SNAPSHOT_BYTES`` since the last one.
* ``load(end)`` (at open, after recovery): the newest snapshot that passes its
  checks and covers no more than the recovered log (a recovery that cut the log
  below a snapshot's position makes that snapshot unusable), then a replay from
  its position to ``end``; with none usable, a rebuild from the start of the
  log. A corrupt snapshot is logged and skipped, never fatal.
* ``rebuild(end)``: forget everything, replay the whole log up to ``end``.
* ``cut(position)`` (the log was cut back to ``position``):
  the snapshots past ``position`` are deleted, and the table is rebuilt from the
  newest one left (or the log start) up to ``position``.

The copy a snapshot writes is taken on the loop thread right before the
checkpoint goes to its worker (``capture``, from ``MessageStore.prepare_checkpoint``);
a checkpoint without one (open, close, a cut: all on the loop thread) copies
itself. The position a snapshot covers is the written end at the copy, so it
may be ahead of the flushed end: a power loss that takes the tail makes
recovery end below it, and ``load`` falls back to the previous snapshot or the log.
"""

import logging
import os
import struct

from metaq.limits import IDEMPOTENCE_SNAPSHOT_BYTES
from metaq.idempotence.records import MARK, MAX_PID, MAX_SEQ, check_identity, identity_in_attribute, with_identity
from metaq.errors import ClientError
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import HEADER
from metaq.store.files import fsync_dir, unlink_quietly, write_atomically
from metaq.idempotence.window import OLDER, ProducerTable, SnapshotError, snapshot_position
from metaq.store.recovery import refuse_unreadable
from metaq.store.record import ATTR_LEN, BLANK_MAGIC, FIXED_OVERHEAD, MARKER, MESSAGE_MAGIC, PREFIX, TOPIC_START, \
    record_size
from metaq.store.results import PutResult

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "producers"
PREVIOUS_SUFFIX = ".prev"
MAX_SNAPSHOT_BYTES = 256 << 20
_TOPIC_LEN_AT = 40
_TOPIC_LEN = struct.Struct(">h")


class Idempotence:
    """The broker's idempotent-put state over one commit log (see the module docstring)."""

    def __init__(self, root, log_, partition_of, put, written, ttl_ms):
        """``put``: ``MessageStore.put``; ``written()``: the log's written end; ``partition_of((topic, partition))``:
        the store's PartitionIndex of a partition, or None."""
        self.path = os.path.join(root, SNAPSHOT_FILE)
        self.previous = self.path + PREVIOUS_SUFFIX
        self.root = root
        self._log = log_
        self._partition_of = partition_of
        self._put = put
        self._written = written
        self.table = ProducerTable(ttl_ms=ttl_ms)
        self.puts = 0  # idempotent puts stored
        self.duplicates = 0  # answered with the original
        self.older_duplicates = 0
        self.different = 0  # resends refused: another message under a stored sequence
        self.rebuilds = 0  # loads or cuts that had to replay the log from its start
        self._saved_generation = None  # the table's generation and the position of the last snapshot written
        self._saved_position = 0
        self._captured = None  # capture's copy for the next save

    # -- the put ---------------------------------------------------------------------------

    def put(self, topic, partition, flag, data, now_ms, pid, seq, born_ms=None):
        """``(PutResult, record position, duplicate)``; raises what ``MessageStore.put`` raises, ClientError for
        a bad identity or reserved properties."""
        if type(pid) is not int or type(seq) is not int or not (0 < pid <= MAX_PID and 0 <= seq <= MAX_SEQ):
            check_identity(pid, seq)  # raises, naming the bad one
        offset = self.table.decide(pid, topic, partition, seq)
        if offset == OLDER:  # stored before the window (and flushed: later ones were answered since)
            return self._older(partition)
        flag, data = with_identity(flag, data, pid, seq)
        return self._put_decided(topic, partition, flag, data, now_ms, pid, seq, offset, born_ms, None)

    def put_prepared(self, topic, partition, flag, data, now_ms, pid, seq, checksum):
        """``put`` of data that already holds its identity (``idempotence.burst``: ``flag``/``data`` as stored,
        ``checksum`` their metaq checksum, the identity checked by the scan)."""
        offset = self.table.decide(pid, topic, partition, seq)
        if offset == OLDER:
            return self._older(partition)
        return self._put_decided(topic, partition, flag, data, now_ms, pid, seq, offset, None, checksum)

    def put_run(self, frames, src, now_ms, put_burst):
        """Append ``frames`` (``idempotence.burst``'s, one producer-partition's consecutive sequences) in one pass
        when the first is above the producer-partition's highest: ``(taken, runs)`` as ``put_burst(frames, src,
        now_ms)`` (the store's) gives them, the table recording each run in one step; ``(0, [])`` when the first
        is not above (a resend or a gap: ``put_prepared`` decides each)."""
        topic_b, partition, pid, seq = frames[0][0], frames[0][1], frames[0][8], frames[0][9]
        topic = topic_b.decode("ascii")
        table = self.table
        if not table.fresh(pid, topic, partition, seq):
            return 0, []
        table.begin()
        try:
            taken, runs = put_burst(frames, src, now_ms)
            for run in runs:
                table.record_run(pid, topic, partition, seq, run.first_offset, run.count, now_ms)
                seq += run.count
        finally:
            table.end()
        self.puts += taken
        return taken, runs

    def _older(self, partition):
        self.duplicates += 1
        self.older_duplicates += 1
        return PutResult(0, partition, -1, 0), 0, True

    def _put_decided(self, topic, partition, flag, data, now_ms, pid, seq, offset, born_ms, checksum):
        table = self.table
        if offset is not None:
            found = self.original(topic, partition, offset)
            if found is not None:
                result, position, stored_checksum = found
                if stored_checksum is not None and stored_checksum != (checksum if checksum is not None
                                                                       else metaq_checksum(data)):
                    self.different += 1
                    raise ClientError("sequence %d of producer %d (%s-%d) was stored at offset %d with other content: "
                                      "a resend must be the same message (nothing stored)"
                                      % (seq, pid, topic, partition, offset))
                self.duplicates += 1
                return result, position, True
            log.warning("producer %d: sequence %d of %s-%d is recorded at offset %d, which this log does not "
                        "hold: stored again", pid, seq, topic, partition, offset)
        table.begin()
        try:
            r = self._put(topic, partition, flag, data, now_ms, born_ms=born_ms, checksum=checksum)
            table.record(pid, topic, partition, seq, r.offset, now_ms)
        finally:
            table.end()
        self.puts += 1
        return r, r.log_end - record_size(len(topic.encode("utf-8")), len(data)), False

    def original(self, topic, partition, offset):
        """``(PutResult, position, checksum)`` of the stored message at ``offset`` (checksum None when it is gone),
        or None when the log does not hold it. A message already deleted by retention answers message id 0 at
        position 0 (its log end 0: no wait)."""
        p = self._partition_of((topic, partition))
        if p is None or offset >= p.max:
            return None
        if offset < p.min:
            return PutResult(0, partition, offset, 0), 0, None
        unit = p.unit(offset)
        seg = self._log.segment_at(unit[0]) if unit is not None else None
        if seg is None:
            return PutResult(0, partition, offset, 0), 0, None
        rel = unit[0] - seg.start
        (tlen,) = _TOPIC_LEN.unpack_from(seg.view, rel + _TOPIC_LEN_AT)
        _len, checksum, msg_id, _flag = HEADER.unpack_from(seg.view, rel + TOPIC_START + tlen)
        return PutResult(msg_id, partition, offset, unit[0] + unit[1]), unit[0], checksum

    # -- learning from the log -------------------------------------------------------------

    def follow(self, append):
        """Run ``append()``, which writes records at the log's written end that were not decided here (a slave's
        apply of a replicated chunk), and learn what it wrote (``replay``) as one change of the table: a snapshot
        copied meanwhile never covers a log position the table has not learned. What ``append`` wrote before
        raising is learned too. Returns what ``append`` returns."""
        start = self._written()
        table = self.table
        table.begin()
        try:
            return append()
        finally:
            try:
                self.replay(start, self._written())
            finally:
                table.end()

    def replay(self, start, end):
        """Record every idempotent record in ``[start, end)`` (record boundaries); returns how many."""
        table = self.table
        found = 0
        table.begin()
        try:
            for seg in self._log.segments:
                lo, hi = max(start, seg.start), min(end, seg.end)
                if lo < hi:
                    refuse_unreadable(seg, lo - seg.start, hi - seg.start)  # never a SIGBUS at every start
                if lo < hi and seg.file.mm.find(MARK, lo - seg.start, hi - seg.start) >= 0:
                    found += self._replay_segment(seg, lo - seg.start, hi - seg.start)
        finally:
            table.end()
        return found

    def _replay_segment(self, seg, rel, stop):
        view, mm = seg.view, seg.file.mm
        found = 0
        hit = mm.find(MARK, rel, stop)
        while 0 <= hit and rel < stop and seg.size - rel >= MARKER.size:
            total, magic = MARKER.unpack_from(view, rel)
            if magic == BLANK_MAGIC or magic != MESSAGE_MAGIC or total < FIXED_OVERHEAD or rel + total > seg.size:
                break
            if hit < rel + total:
                found += self.learn(view, rel, total)
                hit = mm.find(MARK, rel + total, stop)
            rel += total
        return found

    def learn(self, view, rel, total):
        """The message record of ``total`` bytes at ``rel`` of a segment's ``view``: its identity recorded (store
        time, topic, partition and offset from the record) when it carries one; returns 1 if it did, else 0."""
        _t, _m, _c, part, qoff, store_ts, _b, tlen = PREFIX.unpack_from(view, rel)
        h = rel + TOPIC_START + tlen
        msg_len, _chk, _id, flag = HEADER.unpack_from(view, h)
        if not flag & 1 or msg_len < ATTR_LEN.size:
            return 0
        (alen,) = ATTR_LEN.unpack_from(view, h + HEADER.size)
        a = h + HEADER.size + ATTR_LEN.size
        if alen < 0 or a + alen > rel + total:
            return 0
        ident = identity_in_attribute(bytes(view[a:a + alen]).decode("utf-8", "replace"))
        if ident is None:
            return 0
        topic = bytes(view[rel + TOPIC_START:rel + TOPIC_START + tlen]).decode("utf-8", "replace")
        self.table.record(ident[0], topic, part, ident[1], qoff, store_ts)
        return 1

    # -- snapshots -------------------------------------------------------------------------

    def capture(self):
        """Loop thread, just before a checkpoint runs in a worker: copy the table now, when nothing can change it
        (``save`` then writes this copy); nothing when no snapshot is due."""
        self._captured = self._copy_if_due()

    def _copy_if_due(self):
        if (self.table.generation == self._saved_generation
                and self._written() - self._saved_position < IDEMPOTENCE_SNAPSHOT_BYTES):
            return None
        copied = self.table.copy(self._written)
        if copied is None:
            log.info("idempotent producers: no quiet moment for a snapshot; the next checkpoint tries again")
        return copied

    def save(self):
        """BLOCKING: write the table's snapshot (keeping the previous one): the copy ``capture`` took, else one
        taken now. False when none was written: nothing changed and the log grew less than
        ``limits.IDEMPOTENCE_SNAPSHOT_BYTES`` since the last one (a restart then replays that much), or no quiet
        moment came for a copy from this worker thread (the next checkpoint tries again)."""
        copied, self._captured = self._captured, None
        if copied is None:
            copied = self._copy_if_due()
            if copied is None:
                return False
        items, position, counters, generation = copied
        data = self.table.encode(items, position, counters)
        write_atomically(self.path, data, previous=self.previous)
        fsync_dir(self.root)
        self._saved_generation, self._saved_position = generation, position
        return True

    def _read(self, path):
        try:
            with open(path, "rb") as f:
                return f.read(MAX_SNAPSHOT_BYTES)
        except FileNotFoundError:
            return None

    def load(self, end):
        """At open: the newest usable snapshot, then the records after it up to ``end`` (see the module doc)."""
        for path in (self.path, self.previous):
            data = self._read(path)
            if data is None:
                continue
            try:
                position = self.table.load(data)
            except SnapshotError as exc:
                log.error("idempotent producers: %s is unusable (%s): ignored", path, exc)
                continue
            if position > end:
                log.warning("idempotent producers: %s covers the log up to %d but it ends at %d (cut by "
                            "recovery): ignored", path, position, end)
                self.table.clear()
                continue
            n = self.replay(position, end)
            log.info("idempotent producers: %d producer-partitions from %s (log position %d), %d records replayed",
                     len(self.table), os.path.basename(path), position, n)
            return position
        return self.rebuild(end)

    def rebuild(self, end):
        """Forget everything and learn from the whole log up to ``end``; returns the start replayed from."""
        self.table.clear()
        start = self._log.start or 0
        n = self.replay(start, end)
        self.rebuilds += 1
        if n:
            log.warning("idempotent producers: rebuilt from the log (%d idempotent records)", n)
        return start

    def cut(self, position):
        """The log was cut back to ``position``: drop the snapshots past it, rebuild the table up to it."""
        for path in (self.path, self.previous):
            data = self._read(path)
            covered = None if data is None else snapshot_position(data)
            if covered is not None and covered > position:
                unlink_quietly(path)
        if os.path.exists(self.previous) and not os.path.exists(self.path):
            os.replace(self.previous, self.path)
        fsync_dir(self.root)
        self.load(position)

    # -- stats -----------------------------------------------------------------------------

    def summary_values(self):
        """The ``stats`` summary's ``(key, value)`` pairs."""
        t = self.table
        return [("idempotent_puts", self.puts), ("idempotent_duplicates", self.duplicates),
                ("idempotent_older_duplicates", self.older_duplicates),
                ("idempotent_refused_different", self.different), ("idempotent_producers", len(t)),
                ("idempotent_producers_evicted", t.evicted), ("idempotent_producers_expired", t.expired)]
