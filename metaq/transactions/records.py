"""Transaction journal records: the binary codec, the branch they describe, and their replay.

Every record on disk is ``HEADER`` (payload length, CRC-32 of the payload) then
the payload; the payload starts with a type byte and its fixed struct, then
length-prefixed strings (``STR``: uint16 length + UTF-8) and blobs (``BLOB``:
uint32 length + bytes)::

    PUT        PUT_FIXED       type, partition, flag, checksum (-1: none)   key, topic, data (BLOB)
    PREPARE    PREPARE_FIXED   type, now_ms, begun_ms, timeout_s            key [, owner]
    COMMIT     COMMIT_FIXED    type, now_ms, log_start, flags, id count     key, count x ID (uint64) [, owner]
    DONE       DONE_FIXED      type, now_ms, log_end                        key
    ROLLBACK   ROLLBACK_FIXED  type, now_ms, reason                         key
    HEURISTIC  HEURISTIC_FIXED type, now_ms, commit (0/1)                   key [, owner]
    FORGET     FORGET_FIXED    type, now_ms                                 key
    SNAPSHOT   SNAPSHOT_FIXED  type, now_ms, through (journal sequence)     (first record of a snapshot file)
    SNAP_END   SNAP_END_FIXED  type, records (between SNAPSHOT and SNAP_END)
    HALF       HALF_FIXED      type, now_ms, stored_ms, checks, immunity_ms key, group, transaction id [, owner]

A branch first appears with its first PUT (a branch without puts needs no
record). ``owner`` (a ``STR`` at the very end, at most ``limits.MAX_TX_OWNER_BYTES``) is the user who began
the branch, written only when there is one (authentication on): a record without it, as every record of a
journal written before owners existed, decodes with owner None. PREPARE carries it so that a prepared
branch keeps its owner across a restart, COMMIT for a commit recovery may have to finish, HEURISTIC for the
outcome its owner forgets (an older broker cannot read a journal holding owners: it refuses to start).

HALF makes a branch of one PUT a RocketMQ half message (``metaq.transactions.state``): prepared, owned by no
connection, kept across restarts until its producer (or the check-back) ends it. It is written again at each
check with the count so far (``checks``); replay keeps the last.

COMMIT's ids follow ``apply_order(puts)``: the puts grouped by partition, partitions in order of first
appearance, puts in order within one.
``ReplayState`` turns a record sequence back into branches; recovery and the
journal checkpoint (``TransactionManager.maintain``) both use it. Pure: a record that fits no branch is counted
and told to the caller's ``on_anomaly``, which logs it.
"""

import struct
from typing import NamedTuple, Optional

from metaq import limits
from metaq.errors import CorruptLog

#: Record header: payload length (uint32), CRC-32 of the payload (uint32).
HEADER = struct.Struct(">II")
assert HEADER.size == 8
STR = struct.Struct(">H")
assert STR.size == 2
BLOB = struct.Struct(">I")
assert BLOB.size == 4
ID = struct.Struct(">Q")
assert ID.size == 8
#: type, partition, flag, checksum.
PUT_FIXED = struct.Struct(">Biii")
assert PUT_FIXED.size == 13
#: type, now_ms, begun_ms, timeout_s.
PREPARE_FIXED = struct.Struct(">BqqI")
assert PREPARE_FIXED.size == 21
#: type, now_ms, log_start, flags (bit 0: one phase), id count.
COMMIT_FIXED = struct.Struct(">BqqBI")
assert COMMIT_FIXED.size == 22
#: type, now_ms, log_end.
DONE_FIXED = struct.Struct(">Bqq")
assert DONE_FIXED.size == 17
#: type, now_ms, reason.
ROLLBACK_FIXED = struct.Struct(">BqB")
assert ROLLBACK_FIXED.size == 10
#: type, now_ms, commit.
HEURISTIC_FIXED = struct.Struct(">BqB")
assert HEURISTIC_FIXED.size == 10
#: type, now_ms.
FORGET_FIXED = struct.Struct(">Bq")
assert FORGET_FIXED.size == 9
#: type, now_ms, through.
SNAPSHOT_FIXED = struct.Struct(">BqQ")
assert SNAPSHOT_FIXED.size == 17
#: type, record count.
SNAP_END_FIXED = struct.Struct(">BI")
assert SNAP_END_FIXED.size == 5

#: type, now_ms, stored_ms, checks, immunity_ms (-1: the broker's transaction timeout).
HALF_FIXED = struct.Struct(">BqqIq")
assert HALF_FIXED.size == 29

T_PUT, T_PREPARE, T_COMMIT, T_DONE, T_ROLLBACK, T_HEURISTIC, T_FORGET, T_SNAPSHOT, T_SNAP_END, T_HALF = range(1, 11)

#: Longest transaction key (XID keys are bounded by the command line).
MAX_KEY_BYTES = limits.MAX_LINE_BYTES
#: Largest record payload: one put body plus key, topic and headers (a COMMIT of MAX_PUTS_LIMIT ids fits too).
MAX_RECORD_BYTES = limits.MAX_BODY_BYTES + 64 * 1024
#: Most messages one transaction may hold (``max_puts_per_tx`` may not exceed it): its COMMIT must fit a record.
MAX_PUTS_LIMIT = (MAX_RECORD_BYTES - COMMIT_FIXED.size - STR.size - MAX_KEY_BYTES) // ID.size

# ROLLBACK reasons (for the record only: every one has the same effect)
RB_CLIENT, RB_TIMEOUT, RB_OWNER_CLOSED, RB_RECOVERY = range(4)

#: A branch's outcomes once it ended (``ReplayState.decided``; the manager's remembered decisions).
COMMITTED, ROLLED_BACK, TIMED_OUT, READ_ONLY = "committed", "rolled back", "timed out", "read-only"
#: The most decisions a replay (and the manager) keeps, the oldest dropped first.
DECIDED_KEPT = 100_000

# branch states
ACTIVE = "active"
PREPARED = "prepared"
COMMITTING = "committing"
DONE = "done"


class RecordError(ValueError):
    """A CRC-valid payload that does not decode (a bug or a foreign file)."""


class Put(NamedTuple):
    key: str
    topic: str
    partition: int
    flag: int
    checksum: int  # -1: none given (the store computes it)
    data: bytes


class Prepare(NamedTuple):
    key: str
    now_ms: int
    begun_ms: int
    timeout_s: int
    owner: Optional[str] = None  # the user who began the branch (None: none, or a journal older than owners)


class Commit(NamedTuple):
    key: str
    now_ms: int
    log_start: int
    one_phase: bool
    ids: tuple
    owner: Optional[str] = None


class Done(NamedTuple):
    key: str
    now_ms: int
    log_end: int


class Rollback(NamedTuple):
    key: str
    now_ms: int
    reason: int


class Heuristic(NamedTuple):
    key: str
    now_ms: int
    commit: bool
    owner: Optional[str] = None


class Forget(NamedTuple):
    key: str
    now_ms: int


class Half(NamedTuple):
    """A RocketMQ half message: written once when it is stored (checks 0), then at each check-back."""

    key: str
    now_ms: int
    stored_ms: int  # when the broker stored it (the check-back's clock starts here)
    checks: int  # check-backs sent so far
    immunity_ms: int  # CHECK_IMMUNITY_TIME_IN_SECONDS in ms, -1 when the message had none
    group: str  # the producer group of its send
    transaction_id: str
    owner: Optional[str] = None


class Snapshot(NamedTuple):
    now_ms: int
    through: int


class SnapEnd(NamedTuple):
    records: int


# -- encoding: every encoder returns a list of bytes-like parts (data is not copied) --------------------


def _s(text):
    b = text.encode("utf-8")
    if len(b) > 0xFFFF:
        raise RecordError("string of %d bytes cannot be journaled" % len(b))
    return STR.pack(len(b)) + b


def _owner(owner):
    """The optional trailing owner field: nothing for None."""
    if owner is None:
        return b""
    b = owner.encode("utf-8")
    if not b or len(b) > limits.MAX_TX_OWNER_BYTES:
        raise RecordError("an owner of %d bytes cannot be journaled (1 to %d)" % (len(b), limits.MAX_TX_OWNER_BYTES))
    return STR.pack(len(b)) + b


def encode(rec):
    """The payload of ``rec`` as a list of parts (their concatenation is the payload)."""
    t = type(rec)
    if t is Put:
        return [PUT_FIXED.pack(T_PUT, rec.partition, rec.flag, rec.checksum) + _s(rec.key) + _s(rec.topic)
                + BLOB.pack(len(rec.data)), rec.data]
    if t is Prepare:
        return [PREPARE_FIXED.pack(T_PREPARE, rec.now_ms, rec.begun_ms, rec.timeout_s) + _s(rec.key)
                + _owner(rec.owner)]
    if t is Commit:
        ids = struct.pack(">%dQ" % len(rec.ids), *rec.ids)
        return [COMMIT_FIXED.pack(T_COMMIT, rec.now_ms, rec.log_start, 1 if rec.one_phase else 0, len(rec.ids))
                + _s(rec.key), ids, _owner(rec.owner)]
    if t is Done:
        return [DONE_FIXED.pack(T_DONE, rec.now_ms, rec.log_end) + _s(rec.key)]
    if t is Rollback:
        return [ROLLBACK_FIXED.pack(T_ROLLBACK, rec.now_ms, rec.reason) + _s(rec.key)]
    if t is Heuristic:
        return [HEURISTIC_FIXED.pack(T_HEURISTIC, rec.now_ms, 1 if rec.commit else 0) + _s(rec.key)
                + _owner(rec.owner)]
    if t is Forget:
        return [FORGET_FIXED.pack(T_FORGET, rec.now_ms) + _s(rec.key)]
    if t is Half:
        return [HALF_FIXED.pack(T_HALF, rec.now_ms, rec.stored_ms, rec.checks, rec.immunity_ms) + _s(rec.key)
                + _s(rec.group) + _s(rec.transaction_id) + _owner(rec.owner)]
    if t is Snapshot:
        return [SNAPSHOT_FIXED.pack(T_SNAPSHOT, rec.now_ms, rec.through)]
    if t is SnapEnd:
        return [SNAP_END_FIXED.pack(T_SNAP_END, rec.records)]
    raise TypeError("not a journal record: %r" % (rec,))


# -- decoding --------------------------------------------------------------------------------------------


def encoded_size(rec):
    """The length of ``rec``'s payload (``encode``'s parts together)."""
    return sum(len(part) for part in encode(rec))


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf, pos):
        self.buf = buf
        self.pos = pos

    def text(self, limit):
        n = self._unpack(STR)[0]
        if n > limit:
            raise RecordError("string of %d bytes exceeds its limit %d" % (n, limit))
        return self.take(n).decode("utf-8")

    def blob(self, limit):
        n = self._unpack(BLOB)[0]
        if n > limit:
            raise RecordError("blob of %d bytes exceeds its limit %d" % (n, limit))
        return self.take(n)

    def owner(self):
        """The optional trailing owner: None when the record ends here (older journals)."""
        if self.pos == len(self.buf):
            return None
        owner = self.text(limits.MAX_TX_OWNER_BYTES)
        if not owner:
            raise RecordError("an empty owner")
        return owner

    def fixed(self, st):
        return self._unpack(st)

    def _unpack(self, st):
        if self.pos + st.size > len(self.buf):
            raise RecordError("record ends inside a field")
        v = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise RecordError("record ends inside a field")
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def end(self, rec):
        if self.pos != len(self.buf):
            raise RecordError("%d stray bytes after a %s record" % (len(self.buf) - self.pos, type(rec).__name__))
        return rec


def decode(payload):
    """The record in ``payload`` (bytes or memoryview); RecordError when it does not decode."""
    if not payload:
        raise RecordError("empty record")
    try:
        return _decode(payload[0], _Reader(payload, 0))
    except UnicodeDecodeError:
        raise RecordError("a key or topic is not UTF-8") from None


def _decode(t, r):
    if t == T_PUT:
        _t, partition, flag, checksum = r.fixed(PUT_FIXED)
        key = r.text(MAX_KEY_BYTES)
        topic = r.text(limits.MAX_NAME_BYTES)
        return r.end(Put(key, topic, partition, flag, checksum, r.blob(limits.MAX_BODY_BYTES)))
    if t == T_PREPARE:
        _t, now_ms, begun_ms, timeout_s = r.fixed(PREPARE_FIXED)
        return r.end(Prepare(r.text(MAX_KEY_BYTES), now_ms, begun_ms, timeout_s, r.owner()))
    if t == T_COMMIT:
        _t, now_ms, log_start, flags, count = r.fixed(COMMIT_FIXED)
        if count > MAX_PUTS_LIMIT:
            raise RecordError("COMMIT declares %d ids, more than %d" % (count, MAX_PUTS_LIMIT))
        key = r.text(MAX_KEY_BYTES)
        raw = r.take(count * ID.size)
        return r.end(Commit(key, now_ms, log_start, bool(flags & 1), struct.unpack(">%dQ" % count, raw), r.owner()))
    if t == T_DONE:
        _t, now_ms, log_end = r.fixed(DONE_FIXED)
        return r.end(Done(r.text(MAX_KEY_BYTES), now_ms, log_end))
    if t == T_ROLLBACK:
        _t, now_ms, reason = r.fixed(ROLLBACK_FIXED)
        return r.end(Rollback(r.text(MAX_KEY_BYTES), now_ms, reason))
    if t == T_HEURISTIC:
        _t, now_ms, commit = r.fixed(HEURISTIC_FIXED)
        return r.end(Heuristic(r.text(MAX_KEY_BYTES), now_ms, bool(commit), r.owner()))
    if t == T_FORGET:
        _t, now_ms = r.fixed(FORGET_FIXED)
        return r.end(Forget(r.text(MAX_KEY_BYTES), now_ms))
    if t == T_HALF:
        _t, now_ms, stored_ms, checks, immunity_ms = r.fixed(HALF_FIXED)
        key, group = r.text(MAX_KEY_BYTES), r.text(limits.MAX_NAME_BYTES)
        return r.end(Half(key, now_ms, stored_ms, checks, immunity_ms, group, r.text(limits.MAX_NAME_BYTES),
                          r.owner()))
    if t == T_SNAPSHOT:
        _t, now_ms, through = r.fixed(SNAPSHOT_FIXED)
        return r.end(Snapshot(now_ms, through))
    if t == T_SNAP_END:
        return r.end(SnapEnd(r.fixed(SNAP_END_FIXED)[1]))
    raise RecordError("unknown record type %d" % t)


# -- branches and replay ---------------------------------------------------------------------------------


def apply_order(puts):
    """Indexes of ``puts`` grouped by (topic, partition): first-seen partition first, put order within."""
    groups = {}
    for i, p in enumerate(puts):
        groups.setdefault((p.topic, p.partition), []).append(i)
    return [i for run in groups.values() for i in run]


class Branch:
    """One transaction branch, live in the manager or rebuilt by replay.

    After COMMIT: ``order`` (apply order of ``puts``), ``ids[j]`` the id of ``puts[order[j]]``,
    ``applied[j]`` 1 once that message is in the commit log, ``log_end`` the largest end seen.
    """

    __slots__ = ("key", "xa", "qualifier", "owner", "user", "state", "puts", "nbytes", "begun_ms", "timeout_s",
                 "deadline_ms", "prepared_ms", "order", "ids", "log_start", "one_phase", "applied", "log_end",
                 "done_pending", "half")

    def __init__(self, key, xa, qualifier, owner, begun_ms, timeout_s, user=None):
        self.key = key
        self.xa = xa
        self.qualifier = qualifier
        self.owner = owner  # the connection of a live local branch (None: XA, or rebuilt by replay)
        self.user = user  # the user who began it (None: authentication off, or journaled without one)
        self.state = ACTIVE
        self.puts = []
        self.nbytes = 0
        self.begun_ms = begun_ms
        self.timeout_s = timeout_s
        self.deadline_ms = None if begun_ms is None or not timeout_s else begun_ms + 1000 * timeout_s
        self.prepared_ms = None
        self.order = self.ids = self.applied = None
        self.log_start = self.log_end = 0
        self.one_phase = False
        self.done_pending = False
        self.half = None  # a RocketMQ half message: its last Half record

    def set_commit(self, ids, log_start, one_phase):
        self.order = apply_order(self.puts)
        if len(ids) != len(self.order):
            raise RecordError("COMMIT of %s lists %d ids for %d messages" % (self.key, len(ids), len(self.order)))
        self.ids = tuple(ids)
        self.log_start = log_start
        self.one_phase = one_phase
        self.applied = bytearray(len(ids))
        self.state = COMMITTING

    def records(self):
        """The records that rebuild this branch (PUTs, then PREPARE / COMMIT / DONE as it went)."""
        out = list(self.puts)
        if self.half is not None:
            out.append(self.half)
        elif self.prepared_ms is not None:
            out.append(Prepare(self.key, self.prepared_ms, self.begun_ms or 0, self.timeout_s or 0, self.user))
        if self.ids is not None:
            out.append(Commit(self.key, self.prepared_ms or self.begun_ms or 0, self.log_start, self.one_phase,
                              self.ids, self.user))
        if self.state == DONE:
            out.append(Done(self.key, 0, self.log_end))
        return out


def key_qualifier(key):
    """``(is_xa, unique qualifier or None)`` of a key (no validation: journaled keys were validated)."""
    if key.startswith("XID:"):
        return True, key.rsplit(":", 1)[-1]
    return False, None


class ReplayState:
    """Branches rebuilt from a record sequence.

    ``branches``: key -> Branch (ACTIVE / PREPARED / COMMITTING); ``heuristic``: key -> Heuristic record;
    ``settled``: key -> Branch finished by DONE whose ``log_end > keep_done_after`` (its messages may not be
    durable in the commit log yet, so it is kept with its data); ``anomalies``: records that fit no branch, each
    also given to ``on_anomaly(description)`` when one is set.
    """

    def __init__(self, keep_done_after, on_anomaly=None):
        self.keep_done_after = keep_done_after
        self.on_anomaly = on_anomaly
        self.branches = {}
        self.heuristic = {}
        self.settled = {}
        self.done = set()  # keys finished by DONE (a second DONE for one of them is expected, not an anomaly)
        self.decided = {}  # key -> (outcome, now_ms, user, log_end) of the branches that ended, oldest first
        self.records = 0
        self.anomalies = 0

    def apply(self, rec):
        self.records += 1
        t = type(rec)
        if t is Put:
            self._put(rec)
        elif t is Heuristic:
            self.heuristic[rec.key] = rec
            if not rec.commit:
                self.branches.pop(rec.key, None)
        elif t is Forget:
            if self.heuristic.pop(rec.key, None) is None:
                self._anomaly(rec, "no heuristic outcome")
        elif t in (Prepare, Commit, Done, Rollback, Half):
            b = self.branches.get(rec.key)
            if b is None and t is Done and rec.key in self.done:
                self._done_again(rec)
            elif b is None:
                self._anomaly(rec, "unknown branch")
            else:
                self._step(b, rec)
        elif t not in (Snapshot, SnapEnd):
            raise TypeError("not a journal record: %r" % (rec,))

    def _put(self, rec):
        b = self.branches.get(rec.key)
        if b is None:
            xa, qualifier = key_qualifier(rec.key)
            b = self.branches[rec.key] = Branch(rec.key, xa, qualifier, None, None, 0)
        elif b.state != ACTIVE:
            self._anomaly(rec, "branch is %s" % b.state)
            return
        b.puts.append(rec)
        b.nbytes += len(rec.data)

    def _step(self, b, rec):
        t = type(rec)
        if t is Rollback:
            if b.state == COMMITTING:
                self._anomaly(rec, "branch is committing")
            else:
                del self.branches[b.key]
                self._decided(b.key, TIMED_OUT if rec.reason == RB_TIMEOUT else ROLLED_BACK, rec.now_ms, b.user, 0)
        elif t is Half and (b.state == ACTIVE or b.half is not None and b.state == PREPARED):
            b.state = PREPARED
            b.half, b.user, b.begun_ms = rec, rec.owner, rec.stored_ms
            b.prepared_ms, b.timeout_s, b.deadline_ms = rec.stored_ms, 0, None
        elif t is Prepare and b.state == ACTIVE:
            b.state = PREPARED
            b.prepared_ms, b.begun_ms, b.timeout_s, b.user = rec.now_ms, rec.begun_ms, rec.timeout_s, rec.owner
        elif t is Commit and b.state in (ACTIVE, PREPARED):
            if rec.owner is not None:
                b.user = rec.owner
            try:
                b.set_commit(rec.ids, rec.log_start, rec.one_phase)
            except RecordError as exc:
                raise CorruptLog("transaction journal: %s" % exc) from None
        elif t is Done and b.state == COMMITTING:
            del self.branches[b.key]
            b.state = DONE
            b.log_end = rec.log_end
            self.done.add(b.key)
            self._decided(b.key, COMMITTED, rec.now_ms, b.user, rec.log_end)
            if rec.log_end > self.keep_done_after:
                self.settled[b.key] = b
            else:
                self.settled.pop(b.key, None)
        else:
            self._anomaly(rec, "branch is %s" % b.state)

    def _decided(self, key, outcome, now_ms, user, log_end):
        decided = self.decided
        decided.pop(key, None)
        decided[key] = (outcome, now_ms, user, log_end)
        if len(decided) > DECIDED_KEPT:
            del decided[next(iter(decided))]

    def _done_again(self, rec):
        """A commit that recovery completed again (the log had lost some of it): the newer DONE counts."""
        b = self.settled.get(rec.key)
        if b is not None:
            b.log_end = rec.log_end
            if rec.log_end <= self.keep_done_after:
                del self.settled[b.key]

    def _anomaly(self, rec, why):
        self.anomalies += 1
        if self.on_anomaly is not None:
            self.on_anomaly("transaction journal: %s record for %s ignored: %s"
                            % (type(rec).__name__, getattr(rec, "key", "?"), why))

    def snapshot_records(self):
        """Every record a snapshot of this state holds (live branches, settled commits, heuristic outcomes)."""
        for b in list(self.settled.values()) + list(self.branches.values()):  # settled first: a key may be reused
            yield from b.records()
        yield from self.heuristic.values()
