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
* everything else the log teaches it: ``Idempotence`` is a subscriber of the store's log follower
  (``store/follower.py``) that follows the written end. The follower hands it the records past its ``position``
  (``learn``): a range without the ``MARK`` bytes (``mmap.find``, no copy) is passed whole; otherwise its
  records are walked and only those whose bytes hold the mark are decoded. On the master the appends above
  move ``position`` to the written end as they record, so the follower never hands their records over again
  (no other record can carry an identity: ``idempotence.records``). On a slave, ``follow(append, catch_up)``
  runs the apply of a replicated chunk and the store's step of the follower for this state alone, as one change
  of the table: the table is current when the apply returns (a promotion may take puts at once). Once the
  follower has brought it to the log's end after open (``live``), every append teaches it its own records, so
  the store's regular steps only move its position to the written end, with no search of plain records.

What the follower asks of it (its rules: ``store/follower.py``):

* ``load`` (at open, after recovery): the newest snapshot that passes its checks, and its position; the
  follower's step at open then replays the log from there. A corrupt snapshot is logged and skipped, never
  fatal; one past the recovered end (a recovery that cut the log below its position) makes the follower ``cut``.
  None usable: ``rebuild`` from the log start (the snapshots are deleted).
* ``cut(position)`` (the log was cut back: a slave's divergent tail, ``MessageStore.truncate_log``, or a
  snapshot past the recovered end): the snapshots past ``position`` are deleted and the newest one left is
  loaded (or an empty table at the log start); the follower replays from its position.
* ``checkpoint`` (every store checkpoint, and so a clean close): ``save``, the table's snapshot with the position
  it covers, written to ``producers`` (temp file + fsync + rename + directory fsync); the one it replaces is
  kept as ``producers.prev``. Skipped when the table did not change and the position moved by less than
  ``limits.IDEMPOTENCE_SNAPSHOT_BYTES`` since the last one.

The copy a snapshot writes is taken on the loop thread right before the checkpoint goes to its worker
(``capture``, from ``MessageStore.prepare_checkpoint``); a checkpoint without one (open, close, a cut: all on the
loop thread) copies itself. The position a snapshot covers may be ahead of the flushed end: a power loss that
takes the tail makes recovery end below it, and the follower's cut falls back to the previous snapshot or the log.
"""

import logging
import os
import struct
from operator import itemgetter

from metaq.idempotence.limits import IDEMPOTENCE_SNAPSHOT_BYTES
from metaq.idempotence.records import MARK, MAX_PID, MAX_SEQ, check_identity, stored_identity, with_identity
from metaq.errors import ClientError, QuotaExceeded
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import HEADER
from metaq.store.follower import WRITTEN
from metaq.store.files import fsync_dir, unlink_quietly, write_atomically
from metaq.idempotence.window import OLDER, ProducerTable, SnapshotError, snapshot_position
from metaq.store.recovery import refuse_unreadable
from metaq.store.record import ATTR_LEN, FIXED_OVERHEAD, MARKER, MESSAGE_MAGIC, PREFIX, TOPIC_START, \
    record_size
from metaq.store.results import PutResult

log = logging.getLogger(__name__)

_PARTITION, _SEQ = itemgetter(1), itemgetter(9)  # of idempotence.burst's frames
SNAPSHOT_FILE = "producers"
PREVIOUS_SUFFIX = ".prev"
MAX_SNAPSHOT_BYTES = 256 << 20
_TOPIC_LEN_AT = 40
_TOPIC_LEN = struct.Struct(">h")


class Idempotence:
    """The broker's idempotent-put state over one commit log, a subscriber of its log follower that learns the written
    records (see the module docstring)."""

    follows = WRITTEN

    def __init__(self, root, log_, partition_of, put, written, ttl_ms, quota_of=None):
        """``put``: ``MessageStore.put``; ``written()``: the log's written end; ``partition_of((topic, partition))``:
        the store's PartitionIndex of a partition, or None; ``quota_of(owner)``: the windows a user may hold
        (``idempotence.window``; None: the table's bound only)."""
        self.path = os.path.join(root, SNAPSHOT_FILE)
        self.previous = self.path + PREVIOUS_SUFFIX
        self.root = root
        self._log = log_
        self._partition_of = partition_of
        self._put = put
        self._written = written
        self.table = ProducerTable(ttl_ms=ttl_ms, quota_of=quota_of)
        self.refused_quota = 0  # puts refused: past a quota, an evicted window, another user's producer id
        self.puts = 0  # idempotent puts stored
        self.duplicates = 0  # answered with the original
        self.older_duplicates = 0
        self.different = 0  # resends refused: another message under a stored sequence
        self.rebuilds = 0  # opens or cuts that had to learn the log from its start
        self.position = 0  # every record before it is learned (the follower's subscriber position)
        #: True once the follower brought it to the log's end after open: from then on every append teaches it its
        #: own records (the put paths, a slave's apply), and the store's regular steps only move its position
        self.live = False
        self._problem = None  # why load found nothing to trust: said by rebuild
        self._saved_generation = None  # the table's generation and the position of the last snapshot written
        self._saved_position = 0
        self._captured = None  # capture's copy for the next save

    # -- the put ---------------------------------------------------------------------------

    def put(self, topic, partition, flag, data, now_ms, pid, seq, born_ms=None, owner=None):
        """``(PutResult, record position, duplicate)`` of a put by user ``owner`` (None: no user); raises what
        ``MessageStore.put`` raises, ClientError for a bad identity or reserved properties, QuotaExceeded when
        the producer-partition may not be written by ``owner`` (``admit``)."""
        if type(pid) is not int or type(seq) is not int or not (0 < pid <= MAX_PID and 0 <= seq <= MAX_SEQ):
            check_identity(pid, seq)  # raises, naming the bad one
        self.admit(pid, topic, partition, owner)
        offset = self.table.decide(pid, topic, partition, seq)
        if offset == OLDER:  # stored before the window (and flushed: later ones were answered since)
            return self._older(partition)
        flag, data = with_identity(flag, data, pid, seq, owner)
        return self._put_decided(topic, partition, flag, data, now_ms, pid, seq, offset, born_ms, None, owner)

    def put_prepared(self, topic, partition, flag, data, now_ms, pid, seq, checksum, owner=None):
        """``put`` of data that already holds its identity and ``owner`` (``idempotence.burst``: ``flag``/``data``
        as stored, ``checksum`` their metaq checksum, the identity checked by the scan)."""
        self.admit(pid, topic, partition, owner)
        offset = self.table.decide(pid, topic, partition, seq)
        if offset == OLDER:
            return self._older(partition)
        return self._put_decided(topic, partition, flag, data, now_ms, pid, seq, offset, None, checksum, owner)

    def admit(self, pid, topic, partition, owner):
        """Raise QuotaExceeded when user ``owner`` may not put under producer ``pid`` on ``topic``-``partition``
        (``ProducerTable.refusal``): the window is another user's, it was evicted (so a resend can no longer be
        told from a new message), the user's quota is 0, or the table is full of other users' windows."""
        why = self.table.refusal(pid, topic, partition, owner)
        if why is None:
            return
        self.refused_quota += 1
        kind, value = why
        who = owner if owner is not None else "(none)"
        if kind == "other":
            raise QuotaExceeded("idempotent_producers", owner, None,
                                "producer id %d on %s-%d is another user's: user %s must use a producer id of its "
                                "own (nothing stored)" % (pid, topic, partition, who))
        if kind == "evicted":
            limit = self.table.quota_of(value)
            raise QuotaExceeded("idempotent_producers", owner, limit,
                                "the window of producer %d on %s-%d was evicted: user %s has more than its quota "
                                "idempotent_producers (%d windows) and its least recently written ones go, so a "
                                "resend can no longer be told from a new message (nothing stored): use a new "
                                "producer id" % (pid, topic, partition,
                                                 value if value is not None else "(none)", limit))
        if kind == "quota":
            raise QuotaExceeded("idempotent_producers", owner, value,
                                "quota idempotent_producers of user %s is %d: it may keep no idempotent producer "
                                "windows (nothing stored)" % (who, value))
        raise QuotaExceeded("idempotent_producers", owner, value,
                            "the broker's idempotent producer table is full (%d windows, "
                            "limits.MAX_IDEMPOTENT_PRODUCERS) of other users' windows within their quotas: "
                            "producer %d of user %s gets no window now (nothing stored)" % (value, pid, who))

    def check_batch(self, topic, frames, owner=None):
        """Before a ``putb_idem`` batch stores anything (``frames``: ``idempotence.burst.scan_idem_batch``'s, one
        producer id): raise unless user ``owner`` may put under it on every partition of the batch (``admit``), no
        partition's first sequence is past its next one (a gap: a batch before it was never stored), and every
        resent frame (a sequence at or below the highest, answered as a duplicate) is the message stored under its
        sequence (same checksum, as ``put_prepared`` would find). So a batch over several partitions is refused
        whole before any partition of it is stored. Only resends read the log (their originals' headers)."""
        table = self.table
        pid = frames[0][8]
        # each partition's first sequence (the last write of the reversed walk wins), in order of first appearance
        first_seq = dict(zip(map(_PARTITION, reversed(frames)), map(_SEQ, reversed(frames)), strict=True))
        firsts = {p: first_seq[p] for p in dict.fromkeys(map(_PARTITION, frames))}
        highs = {}
        resent = False
        for partition, seq in firsts.items():
            self.admit(pid, topic, partition, owner)
            high = highs[partition] = table.highest(pid, topic, partition)
            if high is not None and seq > high + 1:
                raise ClientError("putb_idem: producer %d's batch for %s-%d starts at sequence %d, past the next one "
                                  "(%d): the sequences between were never stored; nothing was stored"
                                  % (pid, topic, partition, seq, high + 1))
            resent = resent or (high is not None and seq <= high)
        if not resent:  # each partition's sequences rise from its first (scan_idem_batch): none is a resend
            return
        for k, f in enumerate(frames):
            partition, seq = f[1], f[9]
            high = highs[partition]
            if high is None or seq > high:
                continue
            offset = table.decide(pid, topic, partition, seq)
            if offset is None or offset == OLDER:
                continue
            found = self.original(topic, partition, offset)
            if found is not None and found[2] is not None and found[2] != f[6] & 0x7FFFFFFF:
                self.different += 1
                raise ClientError("putb_idem: sub-record %d of %d: sequence %d of producer %d (%s-%d) was stored at "
                                  "offset %d with other content: a resend must be the same message; nothing was "
                                  "stored" % (k, len(frames), seq, pid, topic, partition, offset))

    def put_run(self, frames, src, now_ms, put_burst, owner=None):
        """Append ``frames`` (``idempotence.burst``'s, one producer-partition's consecutive sequences, with
        ``owner`` in their data) in one pass when the first is above the producer-partition's highest: ``(taken,
        runs)`` as ``put_burst(frames, src, now_ms)`` (the store's) gives them, the table recording each run in
        one step; ``(0, [])`` when the first is not above (a resend or a gap) or ``owner`` may not write it
        (``put_prepared`` decides each, and answers why)."""
        topic_b, partition, pid, seq = frames[0][0], frames[0][1], frames[0][8], frames[0][9]
        topic = topic_b.decode("ascii")
        table = self.table
        if not table.fresh(pid, topic, partition, seq) or table.refusal(pid, topic, partition, owner) is not None:
            return 0, []
        table.begin()
        try:
            taken, runs = put_burst(frames, src, now_ms)
            for run in runs:
                table.record_run(pid, topic, partition, seq, run.first_offset, run.count, now_ms, owner)
                seq += run.count
            if runs:
                self.position = self._written()  # learned here: the follower never hands these over again
        finally:
            table.end()
        self.puts += taken
        return taken, runs

    def _older(self, partition):
        self.duplicates += 1
        self.older_duplicates += 1
        return PutResult(0, partition, -1, 0), 0, True

    def _put_decided(self, topic, partition, flag, data, now_ms, pid, seq, offset, born_ms, checksum, owner):
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
            table.record(pid, topic, partition, seq, r.offset, now_ms, owner)
            self.position = self._written()  # learned here: the follower never hands it over again
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

    # -- following the log (a subscriber of store/follower.py) ------------------------------

    def follow(self, append, catch_up):
        """Run ``append()``, which writes records at the log's written end that were not decided here (a slave's
        apply of a replicated chunk), then ``catch_up()``, which brings this state to the written end (the store's
        step of the follower for it alone), as one change of the table: a snapshot copied meanwhile never covers a
        log position the table has not learned. What ``append`` wrote before raising is learned too. Returns what
        ``append`` returns."""
        table = self.table
        table.begin()
        try:
            return append()
        finally:
            try:
                catch_up()
            finally:
                table.end()

    def load(self, log_start, log_end):
        """Open: the newest snapshot that passes its checks; returns the position it covers (the follower replays
        the log from there, or cuts it back when it is past ``log_end``: a recovery cut the log below it), None
        when none does (the follower rebuilds from the log start). A corrupt snapshot is logged and skipped."""
        found = False
        for path in (self.path, self.previous):
            found = os.path.exists(path) or found
            position = self._load_snapshot(path)
            if position is not None:
                return position
        if found:
            self._problem = "no usable snapshot"
        elif log_end > log_start:
            self._problem = "no snapshot"
        return None

    def _load_snapshot(self, path):
        """The table and position from the snapshot at ``path``; its position, None when there is none or it is
        unusable (the table is then empty)."""
        data = self._read(path)
        if data is None:
            return None
        try:
            position = self.table.load(data)
        except SnapshotError as exc:
            log.error("idempotent producers: %s is unusable (%s): ignored", path, exc)
            return None
        self.position = position
        log.info("idempotent producers: %d producer-partitions from %s (log position %d)",
                 len(self.table), os.path.basename(path), position)
        return position

    def rebuild(self, position):
        """Forget everything (the table and the snapshots on disk); the follower hands the log over again from
        ``position``."""
        self.table.clear()
        for path in (self.path, self.previous):
            unlink_quietly(path)
        fsync_dir(self.root)
        self.position = position
        self.live = False  # the log must be learned again up to its end
        self.rebuilds += 1
        problem, self._problem = self._problem, None
        if problem is not None:
            log.warning("idempotent producers: %s; rebuilt from the log from position %d", problem, position)

    def learn(self, mm, base, rel, stop, end):
        """Record the identities of the records of one segment's map ``mm`` (at log position ``base``) from ``rel``
        while ``rel < stop``, each wholly before ``end``; returns where it stopped (``follower.Subscriber.learn``).
        A range without the ``MARK`` bytes (``mmap.find``, no copy) is passed whole, up to ``end``; otherwise its
        records are walked and only those whose bytes hold the mark are decoded (``_learn_record``). A change of
        the table, with the position it reached."""
        seg = self._log.segment_at(base)
        if seg is not None:
            refuse_unreadable(seg, rel, end)  # the find reads every page: never a SIGBUS
        hit = mm.find(MARK, rel, end)
        if hit < 0:
            return end
        table = self.table
        table.begin()
        try:
            while rel < stop and end - rel >= MARKER.size:
                total, magic = MARKER.unpack_from(mm, rel)
                if magic != MESSAGE_MAGIC or total < FIXED_OVERHEAD or total > end - rel:
                    break
                if hit < rel + total:
                    self._learn_record(mm, rel, total)
                    hit = mm.find(MARK, rel + total, end)
                rel += total
                if hit < 0:  # no marked record left in the range
                    rel = end
                    break
            self.position = max(self.position, base + rel)
        finally:
            table.end()
        return rel

    def _learn_record(self, buf, rel, total):
        """The message record of ``total`` bytes at ``rel`` of a segment's ``buf``: its identity recorded (store
        time, topic, partition and offset from the record) when it carries one."""
        _t, _m, _c, part, qoff, store_ts, _b, tlen = PREFIX.unpack_from(buf, rel)
        h = rel + TOPIC_START + tlen
        msg_len, _chk, _id, flag = HEADER.unpack_from(buf, h)
        if not flag & 1 or msg_len < ATTR_LEN.size:
            return
        (alen,) = ATTR_LEN.unpack_from(buf, h + HEADER.size)
        a = h + HEADER.size + ATTR_LEN.size
        if alen < 0 or a + alen > rel + total:
            return
        ident = stored_identity(bytes(buf[a:a + alen]).decode("utf-8", "replace"))
        if ident is None:
            return
        topic = bytes(buf[rel + TOPIC_START:rel + TOPIC_START + tlen]).decode("utf-8", "replace")
        self.table.record(ident[0], topic, part, ident[1], qoff, store_ts, ident[2])

    def advance(self, position):
        """Every record before ``position`` is learned (records without an identity, a blank tail)."""
        self.position = max(self.position, position)

    def cut(self, position):
        """The log ends at ``position`` now: the snapshots past it are deleted and the newest one left is loaded
        (none: an empty table at the log start); the follower then hands over the log from its position."""
        self.live = False  # what the log holds past the state it reloads is learned again
        for path in (self.path, self.previous):
            data = self._read(path)
            covered = None if data is None else snapshot_position(data)
            if covered is not None and covered > position:
                log.warning("idempotent producers: %s covers the log up to %d, past its end %d: deleted",
                            os.path.basename(path), covered, position)
                unlink_quietly(path)
        if os.path.exists(self.previous) and not os.path.exists(self.path):
            os.replace(self.previous, self.path)
        fsync_dir(self.root)
        for path in (self.path, self.previous):
            if self._load_snapshot(path) is not None:
                return
        self.table.clear()
        start = self._log.start
        self.position = position if start is None else min(start, position)
        self.rebuilds += 1

    def drop_below(self, log_start):
        """Retention: nothing to let go of (a producer's window outlives its records: ``original`` answers a
        deleted one)."""
        return []

    def checkpoint(self, if_changed=False):
        """BLOCKING: ``save`` (which skips a snapshot that says nothing new by its own rule)."""
        self.save()

    def close(self):
        """No files held open."""

    # -- snapshots -------------------------------------------------------------------------

    def capture(self):
        """Loop thread, just before a checkpoint runs in a worker: copy the table now, when nothing can change it
        (``save`` then writes this copy); nothing when no snapshot is due."""
        self._captured = self._copy_if_due()

    def _copy_if_due(self):
        if (self.table.generation == self._saved_generation
                and self.position - self._saved_position < IDEMPOTENCE_SNAPSHOT_BYTES):
            return None
        copied = self.table.copy(lambda: self.position)
        if copied is None:
            log.info("idempotent producers: no quiet moment for a snapshot; the next checkpoint tries again")
        return copied

    def save(self):
        """BLOCKING: write the table's snapshot with the position it covers (keeping the previous one): the copy
        ``capture`` took, else one taken now. False when none was written: nothing changed and the position moved
        less than ``limits.IDEMPOTENCE_SNAPSHOT_BYTES`` since the last one (a restart then replays that much), or no
        quiet moment came for a copy from this worker thread (the next checkpoint tries again)."""
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

    # -- stats -----------------------------------------------------------------------------

    def summary_values(self):
        """The ``stats`` summary's ``(key, value)`` pairs."""
        t = self.table
        return [("idempotent_puts", self.puts), ("idempotent_duplicates", self.duplicates),
                ("idempotent_older_duplicates", self.older_duplicates),
                ("idempotent_refused_different", self.different), ("idempotent_producers", len(t)),
                ("idempotent_producers_evicted", t.evicted), ("idempotent_producers_expired", t.expired),
                ("idempotent_refused_quota", self.refused_quota)]
