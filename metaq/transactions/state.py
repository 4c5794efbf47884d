"""``TransactionManager``: local and XA transaction branches over a ``MessageStore`` and its journal in the log.

State machine of a branch::

    ACTIVE --prepare--> PREPARED --commit(2PC)--> COMMITTING --apply_commit--> (done)
    ACTIVE --commit(1PC)--> COMMITTING
    ACTIVE / PREPARED --rollback, timeout (ACTIVE only), owner closed (local only)--> (rolled back)
    PREPARED --heuristic--> HEURISTIC_COMMIT (via COMMITTING) / HEURISTIC_ROLLBACK --forget--> (gone)

A RocketMQ half message is a local branch of one message that, unlike a text ``transaction``, belongs to no
connection: its send journals PUT then HALF (``records.Half``), which makes it PREPARED at once, so it is kept
across restarts (recovery keeps prepared branches), never times out and is not rolled back when its connection
closes. It ends by ``commit(key, HALF_OWNER, False, …)`` or ``rollback(key, HALF_OWNER, …)``: its producer's
END_TRANSACTION, from any connection, or the check-back giving up (``metaq.transactions.policy`` decides,
``metaq.transactions.remoting`` asks). Each check-back sent is journaled with ``half_checked`` (the count survives
a restart, as RocketMQ keeps it in the message). Text front-ends name their owner by connection id (an int), so no
text command can end a half message: ``HALF_OWNER`` is a string.

The journal is the log's internal topic ``%TX%`` (``metaq.transactions.follow``): replicated, confirmed and cut
with the messages it commits. Durability (the caller, the broker, waits for the log's flush past
``journal_end``): PREPARE (and HALF) must be durable before PREPARE (the send) is answered. A COMMIT lies before
its messages in the log, and DONE after them, so any prefix a crash leaves that holds a message holds its COMMIT:
recovery completes what is missing, exactly once (message ids are fixed in COMMIT and a message is re-appended
only when its id is not in the log after COMMIT's position).

Replication: a slave's manager follows the master's records (``learn``, through ``JournalFollow``) into a replica
state and writes nothing; a cut replays the log to the cut (``relearn``); a promotion takes the branches over
(``take_over``: recovery as at an open). The decisions the log holds are remembered as at run time.

Threads: everything runs on the loop; ``open`` and ``flush_journal`` block (broker start, tests). No clock: time
is ``now_ms``.
"""

import itertools
import logging
import random
from dataclasses import dataclass
from typing import NamedTuple, Optional

from metaq.errors import ClientError, MetaqError, TransactionError
from metaq.limits import MAX_BODY_BYTES, MAX_TX_OWNER_BYTES, validate_partition
from metaq.transactions.limits import TX_LEARN_BATCH, TX_LEARN_BATCH_BYTES, TX_SNAPSHOT_STEP
from metaq.store.record import FIXED_OVERHEAD, RecordTooLarge, record_size
from metaq.transactions import records as R
from metaq.protocol.journaltopic import TX_TOPIC
from metaq.store.journals import JournalFollow, SnapshotFloor, first_position
from metaq.transactions.follow import SNAPSHOT_FLAG, TX_JOURNAL, LogReplay, TxLog
from metaq.transactions.journal import Journal, JournalReport, journal_dir, remove_journal
from metaq.transactions.wire import (XA_HEURCOM, XA_HEURRB, XA_OK, XA_RBROLLBACK, XA_RBTIMEOUT, XA_RDONLY, XAER_DUPID,
                                     XAER_INVAL, XAER_NOTA, XAER_PROTO, XAER_RMERR, XAER_RMFAIL, LocalTxId, XaTxId,
                                     parse_tx_key)

log = logging.getLogger(__name__)

#: How long a decided branch's outcome is remembered after it ended, and how many outcomes at most (oldest dropped
#: first): a retried COMMIT or ROLLBACK within it is answered with the decision (``Decided``), a BEGIN of the key
#: XAER_DUPID.
REMEMBER_MS = 600_000
MAX_REMEMBERED = R.DECIDED_KEPT

#: A decided branch's outcomes (``Decided.outcome``).
COMMITTED, ROLLED_BACK, TIMED_OUT, READ_ONLY = R.COMMITTED, R.ROLLED_BACK, R.TIMED_OUT, R.READ_ONLY

#: ``recover(user=EVERYONE)``: every branch, whoever began it (an admin's view).
EVERYONE = object()

#: The owner of every half branch (no connection id equals it).
HALF_OWNER = "rocketmq-half"
#: The session of half messages' keys: ``TX:rmq:<number>``.
HALF_SESSION = "rmq"
#: Half messages' ids name this + their transaction number as the commit-log offset (never a real position).
HALF_ID_BASE = 1 << 62


def half_txid(number):
    """The transaction id of half message ``number``."""
    return LocalTxId(HALF_SESSION, number)


def half_number(key):
    """The number of a half message's key, None for any other key."""
    prefix = "TX:%s:" % HALF_SESSION
    if key.startswith(prefix) and key[len(prefix):].isdigit():
        return int(key[len(prefix):])
    return None


class HalfMessage(NamedTuple):
    """A pending half message as the front-end and the check-back see it."""

    key: str
    number: int
    topic: str
    partition: int
    flag: int
    data: bytes
    stored_ms: int
    checks: int
    immunity_ms: int  # -1: the broker's transaction timeout
    group: str
    transaction_id: str
    user: Optional[str]


def half_view(b):
    """The HalfMessage of branch ``b`` (a records.Branch with a HALF record)."""
    put, half = b.puts[0], b.half
    return HalfMessage(b.key, half_number(b.key), put.topic, put.partition, put.flag, put.data, half.stored_ms,
                       half.checks, half.immunity_ms, half.group, half.transaction_id, b.user)


def check_commit_room(store, branch):
    """TransactionError(XAER_RMFAIL) unless ``store`` has room for ``branch``'s messages not yet appended.

    Checked before a commit's first append (``TransactionManager.apply_commit``): a full disk met half way through
    a commit would leave its first messages visible and the rest missing, with other puts stored in between. So the
    commit asks the store first whether every message still to append fits, new segments and index files included
    (``MessageStore.check_room``), and is refused whole, nothing stored, when they do not: the branch stays
    committing, and a later ``commit`` (once there is room) stores it all.
    """
    units, nbytes, largest = {}, 0, 0
    for j, i in enumerate(branch.order):
        if not branch.applied[j]:
            p = branch.puts[i]
            units[(p.topic, p.partition)] = units.get((p.topic, p.partition), 0) + 1
            size = record_size(len(p.topic.encode("utf-8")), len(p.data))
            nbytes, largest = nbytes + size, max(largest, size)
    if not units:
        return
    try:
        store.check_room(nbytes, units, largest)
    except MetaqError as exc:
        raise TransactionError(XAER_RMFAIL, "commit of %s refused before storing any of its %d messages: %s; "
                                            "commit again" % (branch.key, sum(units.values()), exc)) from exc


class TxInfo(NamedTuple):
    """One branch as the admin sees it."""

    key: str
    state: str  # active, prepared, committing, heuristic-commit, heuristic-rollback
    puts: int
    bytes: int
    begun_ms: Optional[int]
    prepared_ms: Optional[int]
    qualifier: Optional[str]
    timeout_s: int
    user: Optional[str] = None  # who began it (None: authentication off, or journaled before owners)


class TxPutResult(NamedTuple):
    """A store PutResult (the same four fields first) plus the topic, so the caller knows whom to wake."""

    msg_id: int
    partition: int
    offset: int
    log_end: int  # commit-log position after the record: durable once the store's flushed_position reaches it
    topic: str


class Decided(NamedTuple):
    """A branch that ended, remembered for ``REMEMBER_MS``: what a retried COMMIT or ROLLBACK is answered.

    ``log_end``: the commit log's end after a commit's messages (a retried commit waits for it to be confirmed
    again, as the first did: a commit answered 503 because no slave confirmed it is answered OK once one has)."""

    outcome: str  # COMMITTED, ROLLED_BACK, TIMED_OUT, READ_ONLY
    owner: object  # the connection of a local branch (None for XA: any connection may retry)
    user: Optional[str]  # who began it (authentication on): only that user or an admin learns the outcome
    log_end: int
    until_ms: int


class CommitPlan:
    """What ``commit`` decided; hand it to ``apply_commit`` once the journal is durable. ``confirm_end``: for a
    commit already done (a retry), the log end its messages reached (0: nothing to wait for)."""

    __slots__ = ("key", "messages", "branch", "confirm_end")

    def __init__(self, key, branch, confirm_end=0):
        self.key = key
        self.branch = branch
        self.confirm_end = confirm_end
        self.messages = 0 if branch is None else len(branch.ids) - sum(branch.applied)

    @property
    def empty(self):
        """True when nothing is to be appended (no fsync or apply needed; apply_commit returns [])."""
        return self.branch is None

    def __repr__(self):
        return "CommitPlan(%s, %d messages)" % (self.key, self.messages)


class _Snapshot:
    """A snapshot being written (``TransactionManager.maintain``): ``pending``, the keys of the live branches and
    heuristic outcomes when it began that it has not written yet (in order); ``records``, how many it wrote;
    ``start``, the log position its ``Snapshot`` record was written from."""

    __slots__ = ("pending", "records", "start")

    def __init__(self, keys, start):
        self.pending, self.records, self.start = dict.fromkeys(keys), 0, start


@dataclass
class RecoveryReport:
    """What ``TransactionManager.open`` found and did."""

    journal: Optional[JournalReport] = None  # a journal directory of an older broker, migrated into the log
    records: int = 0
    anomalies: int = 0  # records that fit no branch (logged)
    commits_completed: int = 0  # COMMIT without DONE, or DONE whose messages the log lost, finished
    messages_reappended: int = 0
    messages_dropped: int = 0  # the store no longer accepts them (topic gone): logged as errors
    commits_incomplete: int = 0  # left COMMITTING (the store refused: disk full); retried by commit/heuristic
    rolled_back: int = 0
    prepared_kept: int = 0
    heuristic_kept: int = 0

    @property
    def torn_bytes(self):
        return self.journal.torn_bytes if self.journal is not None else 0


def _xa(code, msg):
    return TransactionError(code, msg)


class TransactionManager:
    """See the module docstring (half messages too); open with ``TransactionManager.open``."""

    def __init__(self, store, config, writes):
        self.store = store
        self.config = config
        self._writes = writes
        self._log = TxLog(store, writes.journal)
        self._branches = {}  # key -> Branch (ACTIVE, PREPARED, COMMITTING): changed by _add_branch / _drop_branch only
        self._per_user = {}  # user -> live branches it began (None: those of no user), kept with _branches
        self._by_owner = {}  # owner -> set of local keys
        self._halves = {}  # key -> Branch: the pending RocketMQ half messages
        self._held = 0  # at least the message bytes open branches hold (see _check_held)
        self._heuristic = {}  # key -> records.Heuristic
        self._recent = {}  # key -> Decided, oldest first
        self._counts = {"committed": 0, "rolled_back": 0, "timed_out": 0}
        self._replica = None  # a slave's LogReplay of the master's records (None: this broker writes them)
        self._snapshots = SnapshotFloor(store)  # the last complete snapshot (retention keeps the log from it)
        self._snap = None  # the _Snapshot being written, between maintain's steps
        self.follow = JournalFollow(store, TX_JOURNAL, self.learn, self.relearn, self.retention_floor,
                                    TX_LEARN_BATCH, TX_LEARN_BATCH_BYTES)
        self.recovery = None

    # -- open / recovery -----------------------------------------------------------------------------------

    @classmethod
    def open(cls, store, config, now_ms, writes, force=None, master=True):
        """BLOCKING: replay the journal from the log (``%TX%``) and recover (see module docstring); ``master``: this
        broker writes (a slave's manager only follows the master's records, ``learn``). An older broker's journal
        directory is migrated into the log first (``force``, default the store's ``force_recovery``: cut its
        mid-file corruption instead of raising CorruptLog). ``writes``: the put path's ``BrokerWrites``, which
        appends the journal's records and a commit's messages. The store must be open; recovery appends the missing
        messages of interrupted commits and flushes them. The manager then follows the log (``store.follower``)."""
        config = config.validate()
        if force is None:
            force = bool(getattr(store.config, "force_recovery", False))
        self = cls(store, config, writes)
        jreport = self._migrate(force, now_ms) if master else None
        replay = self._replay()
        if master:
            self.recovery = self._recover(replay, jreport, now_ms)
            if self.recovery.messages_reappended or self.recovery.rolled_back or jreport is not None:
                store.mark_flushed(store.flush_log())  # durable (and visible) before the records that name them
            if jreport is not None:
                remove_journal(journal_dir(store.dirs.root))
        else:
            directory = journal_dir(store.dirs.root)
            if Journal.exists(directory):  # an older broker's own journal: a slave's branches are its master's
                log.warning("transactions: %s, an older broker's journal, is removed: this broker is a slave, its "
                            "branches are the master's (in the log)", directory)
                remove_journal(directory)
            self._replica = replay
            self.follow.replicating = True
            self.recovery = RecoveryReport(None, records=replay.records, anomalies=replay.state.anomalies)
        store.follower.add(self.follow, store.written_position)
        return self

    def _replay(self, upto=None):
        replay = LogReplay(on_anomaly=log.warning)
        for position, flag, rec in self._log.read(upto):
            replay.apply(position, flag, rec)
        replay.finish()
        self._snapshots.reset(replay.snapshot_at)
        return replay

    def _migrate(self, force, now_ms):
        """An older broker's ``<data dir>/transactions/`` journal: its live state written into the log as a snapshot
        (unless the log holds the journal already: a migration that crashed after its snapshot); the directory is
        removed once the log is durable (``open``). Returns its JournalReport, or None when there is none."""
        directory = journal_dir(self.store.dirs.root)
        if not Journal.exists(directory):
            return None
        journal, records, jreport = Journal.open(directory, self.config.journal_file_size, force)
        journal.close()
        if self._log.has_records():
            log.warning("transactions: %s is left from a migration the log already holds: removed", directory)
            return jreport
        state = R.ReplayState(keep_done_after=self.store.written_position, on_anomaly=log.warning)
        for rec in records:
            state.apply(rec)
        self._write_snapshot(list(state.snapshot_records()), now_ms)
        log.info("transactions: the journal in %s (%d records) is now in the log as %d live records",
                 directory, len(records), len(state.branches) + len(state.settled) + len(state.heuristic))
        return jreport

    def _recover(self, replay, jreport, now_ms):
        state = replay.state
        report = RecoveryReport(jreport, records=replay.records, anomalies=state.anomalies)
        self._heuristic = dict(state.heuristic)
        report.heuristic_kept = len(self._heuristic)
        self._remember_replayed(state, now_ms)
        unfinished = [b for b in state.branches.values() if b.state == R.COMMITTING] + list(state.settled.values())
        if unfinished:
            self._complete_after_crash(unfinished, report, now_ms)
        for b in state.branches.values():
            if b.state == R.ACTIVE:
                self._write(R.Rollback(b.key, now_ms, R.RB_RECOVERY), now_ms)
                report.rolled_back += 1
            elif b.state == R.PREPARED:
                self._add_branch(b)
                report.prepared_kept += 1
                self._hold_partitions(b)
                self._keep_half(b)
        log.info("transaction recovery: %d records (%d torn bytes cut from a migrated journal); %d commits completed "
                 "(%d messages re-appended, %d dropped, %d incomplete), %d rolled back, %d prepared kept, "
                 "%d heuristic outcomes", report.records, report.torn_bytes,
                 report.commits_completed, report.messages_reappended, report.messages_dropped,
                 report.commits_incomplete, report.rolled_back, report.prepared_kept, report.heuristic_kept)
        self._held = sum(b.nbytes for b in self._branches.values())
        return report

    def _remember_replayed(self, state, now_ms):
        """The decisions the log holds, still within ``REMEMBER_MS``: a retry after a restart or a failover is
        answered with them (not confirmed again: this broker holds them from the log, where they were made)."""
        for key, (outcome, at_ms, user, _log_end) in state.decided.items():
            if at_ms + REMEMBER_MS > now_ms and key not in state.branches:
                self._remember(key, Decided(outcome, HALF_OWNER if key.startswith("TX:%s:" % HALF_SESSION) else None,
                                            user, 0, at_ms + REMEMBER_MS))

    # -- following the master (a slave) ---------------------------------------------------------------------

    @property
    def replica(self):
        """True while this manager follows a master's records instead of writing its own."""
        return self._replica is not None

    def learn(self, position, flag, rec):
        """A slave: one of the master's records, replicated (``JournalFollow``)."""
        if self._replica is not None:
            self._replica.apply(position, flag, rec)
            at = self._replica.snapshot_at
            if at is not None and at != self._snapshots.latest:  # the master's, complete: the floor once durable here
                self._snapshots.written(at, self.store.written_position)

    def relearn(self, upto):
        """The log was cut at ``upto`` (a slave's truncation, a deposed master rejoining): the branches are what the
        log holds before it, nothing of the cut tail; this manager follows the master's records from now on."""
        self._clear()
        self._log.cut(upto)
        self._replica = self._replay(upto)
        self.follow.replicating = True
        log.info("transactions: the log was cut at %d: %d branches as the master's log has them", upto,
                 len(self._replica.state.branches))

    def follow_master(self):
        """This broker became a slave: its branches are the log's from now on (``learn``), none of its own."""
        if self._replica is None:
            self._clear()
            self._replica = self._replay()
            self.follow.position = self.store.written_position  # everything written is in the replica state
        self.follow.replicating = True

    def take_over(self, now_ms):
        """This slave became the master: the branches it learned become its own (the log up to its written end must
        be learned: ``store.follow_now``), and recovery runs as at an open: commits decided are completed, branches
        never prepared rolled back (their clients were the old master's), prepared ones and half messages kept."""
        replay = self._replica
        if replay is None:
            return None
        self._replica = None
        self.follow.replicating = False
        self._clear()
        self.recovery = self._recover(replay, None, now_ms)
        return self.recovery

    def _clear(self):
        self._snap = None  # a snapshot being written is left incomplete: the branches it wrote are no longer these
        self._branches, self._per_user, self._by_owner, self._halves, self._heuristic = {}, {}, {}, {}, {}
        self._held = 0

    def retention_floor(self):
        """The log position retention keeps for the journal: its last complete snapshot whose end is durable (or the
        first record, with none yet); None when the journal is empty. A snapshot counts once the log is flushed past
        its SnapEnd: a power cut before that leaves it incomplete, and the one before it must still be there."""
        at = self._snapshots.durable()
        return at if at is not None else first_position(self.store, TX_JOURNAL)

    def _hold_partitions(self, b):
        """The partitions a prepared branch will append to are made writable again after a restart."""
        for rec in b.puts:
            try:
                self.store.hold_partition(rec.topic, rec.partition)
            except MetaqError as exc:  # the commit will meet it again and say so; the branch stays prepared
                log.error("transaction recovery: prepared %s puts to %s-%d: %s", b.key, rec.topic, rec.partition, exc)

    def _complete_after_crash(self, branches, report, now_ms):
        """Append the messages of journaled commits that the log lacks, in apply order, with their ids."""
        present = self.store.msg_ids_since(min(b.log_start for b in branches))
        for b in sorted(branches, key=lambda b: b.log_start):
            had_done = b.state == R.DONE
            b.state = R.COMMITTING
            for j, msg_id in enumerate(b.ids):
                b.applied[j] = msg_id in present
            if all(b.applied):
                if not had_done:  # every message made it: only DONE was missing
                    report.commits_completed += 1
                    self._finish_commit(b, now_ms)
                continue
            b.log_end = 0  # the DONE written below names the end of what is appended now
            try:
                self._append_missing(b, now_ms, recovering=report)
            except TransactionError as exc:
                log.error("transaction recovery: commit of %s left incomplete: %s", b.key, exc)
                report.commits_incomplete += 1
                self._add_branch(b)
                continue
            report.commits_completed += 1
            self._finish_commit(b, now_ms)

    # -- lookups ---------------------------------------------------------------------------------------------

    @staticmethod
    def _ident(txid):
        """``(key, is_xa, qualifier)`` of a LocalTxId, XaTxId or key text."""
        if isinstance(txid, str):
            if len(txid) > R.MAX_KEY_BYTES:
                raise _xa(XAER_INVAL, "transaction id of %d characters is too long" % len(txid))
            txid = parse_tx_key(txid)
        if isinstance(txid, (XaTxId, LocalTxId)):
            key = txid.key
            if len(key.encode("utf-8")) > R.MAX_KEY_BYTES:
                raise _xa(XAER_INVAL, "transaction id of %d bytes is too long" % len(key.encode("utf-8")))
            return (key, True, txid.unique_qualifier) if txid.is_xa else (key, False, None)
        raise _xa(XAER_INVAL, "a transaction id is required here")

    def _lookup(self, key, owner, now_ms, action):
        """The live branch ``key`` for ``action`` (put/prepare/commit/rollback), or the right TransactionError."""
        h = self._heuristic.get(key)
        if h is not None:
            code = XA_HEURCOM if h.commit else XA_HEURRB
            if action in ("commit", "rollback"):
                raise _xa(code, "%s was heuristically %s" % (key, "committed" if h.commit else "rolled back"))
            raise _xa(XAER_PROTO, "%s was heuristically completed: only commit, rollback or forget" % key)
        b = self._branches.get(key)
        if b is not None:
            if not b.xa and b.owner is not None and b.owner != owner:
                raise _xa(XAER_NOTA, "unknown transaction %s (it belongs to another connection)" % key)
            if b.state == R.ACTIVE and b.deadline_ms is not None and now_ms >= b.deadline_ms:
                self._roll_back(b, now_ms, R.RB_TIMEOUT)
                raise _xa(XA_RBTIMEOUT, "transaction %s timed out after %d s and was rolled back"
                          % (key, b.timeout_s))
            return b
        d = self.decided(key, owner)
        if d is not None:
            if d.outcome == TIMED_OUT:
                raise _xa(XA_RBTIMEOUT, "transaction %s timed out and was rolled back" % key)
            if action == "commit" and d.outcome == ROLLED_BACK:
                raise _xa(XA_RBROLLBACK, "transaction %s was rolled back" % key)
            if action == "rollback" and d.outcome == COMMITTED:
                raise _xa(XAER_PROTO, "transaction %s was committed: it cannot be rolled back" % key)
            if action not in ("commit", "rollback"):
                raise _xa(XAER_PROTO, "transaction %s was %s already" % (key, d.outcome))
            return d
        raise _xa(XAER_NOTA, "unknown transaction %s" % key)

    def decided(self, key, owner):
        """The remembered outcome of the ended branch ``key`` (``Decided``), or None: a local branch's only for
        the connection that owned it, an XA branch's for any (its user is checked by the front-end: ``user_of``)."""
        d = self._recent.get(key)
        if d is None or not (key.startswith("XID:") or d.owner == owner):
            return None
        return d

    def _write(self, rec, now_ms):
        """Journal ``rec`` (a ``%TX%`` message); a failure becomes XAER_RMFAIL (nothing changed). A slave writes
        nothing: its branches are the master's."""
        if self._replica is not None:
            raise _xa(XAER_RMFAIL, "this broker is a slave: transactions are the master's")
        try:
            self._append(rec, now_ms)
        except (MetaqError, OSError, R.RecordError) as exc:
            raise _xa(XAER_RMFAIL, "cannot write the transaction journal: %s" % exc) from exc

    def _remember(self, key, decided):
        recent = self._recent
        recent.pop(key, None)
        recent[key] = decided
        if len(recent) > MAX_REMEMBERED:
            del recent[next(iter(recent))]

    def _add_branch(self, b):
        """``b`` is live (again): in the branch table and counted for its user (``held_by``). With ``_drop_branch``
        the only writer of both, so the count a quota check reads in O(1) is the table's."""
        old = self._branches.get(b.key)
        if old is b:
            return
        if old is not None:
            self._drop_branch(old)
        self._branches[b.key] = b
        self._per_user[b.user] = self._per_user.get(b.user, 0) + 1

    def _drop_branch(self, b):
        """``b`` ended: out of the branch table and its user's count."""
        del self._branches[b.key]
        n = self._per_user[b.user] - 1
        if n:
            self._per_user[b.user] = n
        else:
            del self._per_user[b.user]

    def _forget_branch(self, b, outcome, now_ms):
        self._drop_branch(b)
        self._halves.pop(b.key, None)
        if not b.xa:
            keys = self._by_owner.get(b.owner)
            if keys is not None:
                keys.discard(b.key)
                if not keys:
                    del self._by_owner[b.owner]
        self._remember(b.key, Decided(outcome, b.owner, b.user, b.log_end if outcome == COMMITTED else 0,
                                      now_ms + REMEMBER_MS))

    # -- begin / put / prepare --------------------------------------------------------------------------------

    def begin(self, txid, owner, timeout_s, now_ms, user=None):
        """Start a branch; XAER_DUPID if the key is live, heuristic or recently used; XAER_INVAL for a bad id.

        ``owner``: the connection a local branch is bound to; ``user``: the name of the user beginning it (None
        with authentication off), journaled with it (``user_of``)."""
        key, xa, qualifier = self._ident(txid)
        if user is not None and not 0 < len(user.encode("utf-8")) <= MAX_TX_OWNER_BYTES:
            raise _xa(XAER_INVAL, "a user name of 1 to %d bytes is needed to own a transaction" % MAX_TX_OWNER_BYTES)
        if key in self._branches or key in self._heuristic or key in self._recent:
            raise _xa(XAER_DUPID, "transaction %s already exists" % key)
        if not isinstance(timeout_s, int) or timeout_s < 0:
            raise _xa(XAER_INVAL, "bad transaction timeout %r" % (timeout_s,))
        if len(self._branches) >= self.config.max_open:
            raise _xa(XAER_RMERR, "too many open transactions on the broker: the limit is %d "
                      "(transactions.max_open)" % self.config.max_open)
        timeout_s = min(timeout_s or self.config.default_timeout_s, self.config.max_timeout_s)
        b = R.Branch(key, xa, qualifier, None if xa else owner, now_ms, timeout_s, user)
        self._add_branch(b)
        if not xa:
            self._by_owner.setdefault(owner, set()).add(key)

    def put(self, txid, owner, topic, partition, flag, data, checksum, now_ms):
        """Journal one message of the branch; returns its partition (chosen now when -1).

        Raises TransactionError (XAER_NOTA, XAER_PROTO when prepared, XA_RBTIMEOUT, XAER_RMERR past a limit,
        XAER_RMFAIL when the journal cannot be written) or the store's InvalidTopic / UnknownTopic /
        InvalidPartition / RecordTooLarge. Nothing is stored on failure.
        """
        key = self._ident(txid)[0]
        b = self._lookup(key, owner, now_ms, "put")
        if b.state != R.ACTIVE:
            raise _xa(XAER_PROTO, "transaction %s is %s: no more puts" % (key, b.state))
        count = self.store.partitions_of(topic)
        partition = random.randrange(count) if partition == -1 else validate_partition(partition, count)
        self.store.hold_partition(topic, partition)  # a topic limit refuses the put now, never the commit
        size = FIXED_OVERHEAD + len(topic.encode("utf-8")) + len(data)
        if len(data) > MAX_BODY_BYTES or size > self.store.config.segment_size:
            raise RecordTooLarge("message of %d bytes cannot be stored (segment size %d)"
                                 % (size, self.store.config.segment_size))
        if len(b.puts) >= self.config.max_puts_per_tx:
            raise _xa(XAER_RMERR, "transaction %s already holds %d messages, the limit (max_puts_per_tx)"
                      % (key, len(b.puts)))
        if b.nbytes + len(data) > self.config.max_tx_bytes:
            raise _xa(XAER_RMERR, "transaction %s would hold %d bytes, more than max_tx_bytes %d"
                      % (key, b.nbytes + len(data), self.config.max_tx_bytes))
        self._check_held(len(data))
        rec = R.Put(key, topic, partition, flag, -1 if checksum is None or checksum < 0 else checksum, bytes(data))
        journaled = FIXED_OVERHEAD + len(TX_TOPIC) + R.encoded_size(rec)
        if journaled > self.store.config.segment_size:
            raise RecordTooLarge("message of %d bytes cannot be stored: its journal record of %d bytes must fit in a "
                                 "%d-byte segment" % (len(data), journaled, self.store.config.segment_size))
        self._write(rec, now_ms)
        b.puts.append(rec)
        b.nbytes += len(rec.data)
        self._held += len(rec.data)
        return partition

    def _check_held(self, nbytes):
        """XAER_RMERR when open transactions would hold more than ``max_held_bytes`` with ``nbytes`` more.

        ``_held`` only grows between checks (ended branches do not take theirs back), so it is a bound on
        what is held; near the limit it is recounted from the open branches before anything is refused."""
        limit = self.config.max_held_bytes
        if self._held + nbytes > limit:
            self._held = sum(b.nbytes for b in self._branches.values())
            if self._held + nbytes > limit:
                raise _xa(XAER_RMERR, "open transactions hold %d bytes: %d more would pass the limit %d "
                          "(transactions.max_held_bytes)" % (self._held, nbytes, limit))

    def prepare(self, txid, owner, now_ms):
        """XA_OK (PREPARE journaled: fsync before answering) or XA_RDONLY (no puts: the branch is finished)."""
        key, xa, _q = self._ident(txid)
        if not xa:
            raise _xa(XAER_RMERR, "prepare is for XA transactions; %s is local" % key)
        b = self._lookup(key, owner, now_ms, "prepare")
        if b.state != R.ACTIVE:
            raise _xa(XAER_PROTO, "transaction %s is already %s" % (key, b.state))
        if not b.puts:
            self._forget_branch(b, READ_ONLY, now_ms)
            return XA_RDONLY
        self._write(R.Prepare(key, now_ms, b.begun_ms, b.timeout_s, b.user), now_ms)
        b.state = R.PREPARED
        b.prepared_ms = now_ms
        b.deadline_ms = None
        return XA_OK

    # -- commit ------------------------------------------------------------------------------------------------

    def commit(self, txid, owner, one_phase, now_ms):
        """Decide to commit: assign ids, journal COMMIT; returns a CommitPlan (fsync, then ``apply_commit``).

        One phase from ACTIVE, two phase from PREPARED (else XAER_PROTO). A COMMITTING branch (its apply
        failed, or another commit is in flight) gets a plan for what is still missing.
        """
        key = self._ident(txid)[0]
        b = self._lookup(key, owner, now_ms, "commit")
        if isinstance(b, Decided):  # a retry: answered with the commit made (its messages confirmed again)
            return CommitPlan(key, None, b.log_end)
        if b.state == R.COMMITTING:
            return CommitPlan(key, b)
        if b.state == R.ACTIVE and not one_phase:
            raise _xa(XAER_PROTO, "transaction %s is not prepared: two-phase commit refused" % key)
        if b.state == R.PREPARED and one_phase:
            raise _xa(XAER_PROTO, "transaction %s is prepared: one-phase commit refused" % key)
        if not b.puts:
            self._forget_branch(b, READ_ONLY, now_ms)
            self._counts["committed"] += 1
            return CommitPlan(key, None)
        self._decide_commit(b, one_phase, now_ms)
        return CommitPlan(key, b)

    def _decide_commit(self, b, one_phase, now_ms):
        ids = [self.store.new_msg_id(now_ms) for _p in b.puts]
        rec = R.Commit(b.key, now_ms, self.store.written_position, one_phase, tuple(ids), b.user)
        self._write(rec, now_ms)
        b.set_commit(rec.ids, rec.log_start, one_phase)
        b.deadline_ms = None

    def apply_commit(self, plan, now_ms):
        """Append the plan's messages (each partition's run contiguous), in one go on the loop once the disk holds them
        all (``check_commit_room``), and journal DONE; returns TxPutResults. A store failure raises
        TransactionError(XAER_RMFAIL) (its ``__cause__``), the branch left COMMITTING: a later ``commit`` (or
        recovery, or the admin's ``heuristic``) appends only what is missing. A plan whose branch is already done
        returns []."""
        b = plan.branch
        if b is None or self._branches.get(b.key) is not b or b.state != R.COMMITTING:
            return []
        check_commit_room(self.store, b)
        results = self._append_missing(b, now_ms)
        self._finish_commit(b, now_ms)
        return results

    def _append_missing(self, b, now_ms, recovering=None):
        out = []
        put = self._writes.message
        for j, i in enumerate(b.order):
            if b.applied[j]:
                continue
            p = b.puts[i]
            try:
                r = put(p.topic, p.partition, p.flag, p.data, now_ms, checksum=None if p.checksum < 0 else p.checksum,
                        msg_id=b.ids[j])
            except ClientError as exc:
                if recovering is None:
                    raise _xa(XAER_RMFAIL, "commit of %s cannot store a message: %s" % (b.key, exc)) from exc
                log.error("transaction recovery: message %d of %s to %s-%d dropped: %s", b.ids[j], b.key,
                          p.topic, p.partition, exc)
                recovering.messages_dropped += 1
                b.applied[j] = 1
                continue
            except (MetaqError, OSError) as exc:
                raise _xa(XAER_RMFAIL, "commit of %s is incomplete (%d of %d messages stored): %s; commit again"
                          % (b.key, sum(b.applied), len(b.ids), exc)) from exc
            b.applied[j] = 1
            b.log_end = max(b.log_end, r.log_end)
            out.append(TxPutResult(r.msg_id, r.partition, r.offset, r.log_end, p.topic))
            if recovering is not None:
                recovering.messages_reappended += 1
        return out

    def _finish_commit(self, b, now_ms):
        try:
            self._append(R.Done(b.key, now_ms, b.log_end or self.store.written_position), now_ms)
        except (MetaqError, OSError) as exc:  # the messages are in; DONE is retried by expire() / commit()
            log.error("transaction %s committed but its DONE record failed: %s", b.key, exc)
            b.done_pending = True
            self._add_branch(b)
            return
        b.done_pending = False
        if self._branches.get(b.key) is b:
            self._forget_branch(b, COMMITTED, now_ms)
        self._counts["committed"] += 1

    # -- rollback / forget / recover --------------------------------------------------------------------------

    def rollback(self, txid, owner, now_ms):
        """Roll back an ACTIVE or PREPARED branch (journal ROLLBACK; fsync per policy)."""
        key = self._ident(txid)[0]
        b = self._lookup(key, owner, now_ms, "rollback")
        if isinstance(b, Decided):  # a retry of a rollback (or of a read-only branch's end): nothing more to do
            return
        if b.state == R.COMMITTING:
            raise _xa(XAER_PROTO, "transaction %s is being committed" % key)
        self._roll_back(b, now_ms, R.RB_CLIENT)

    def _roll_back(self, b, now_ms, reason):
        if b.puts:
            self._write(R.Rollback(b.key, now_ms, reason), now_ms)
        timed_out = reason == R.RB_TIMEOUT
        self._forget_branch(b, TIMED_OUT if timed_out else ROLLED_BACK, now_ms)
        self._counts["timed_out" if timed_out else "rolled_back"] += 1

    def forget(self, txid, now_ms):
        """Drop a heuristic outcome (journal FORGET); XAER_NOTA when there is none."""
        key = self._ident(txid)[0]
        if key not in self._heuristic:
            raise _xa(XAER_NOTA, "no heuristic outcome for %s" % key)
        self._write(R.Forget(key, now_ms), now_ms)
        del self._heuristic[key]

    def recover(self, qualifier=None, user=EVERYONE):
        """Sorted keys of XA branches that are prepared (or committing) or heuristically completed; with ``user``
        only those that user began."""
        keys = [b.key for b in self._branches.values() if b.xa and b.state != R.ACTIVE
                and (qualifier is None or b.qualifier == qualifier) and (user is EVERYONE or b.user == user)]
        keys += [k for k, h in self._heuristic.items() if (qualifier is None or R.key_qualifier(k)[1] == qualifier)
                 and (user is EVERYONE or h.owner == user)]
        return sorted(set(keys))

    def held_by(self, user):
        """How many live branches (open, prepared, committing; half messages among them) ``user`` began: asked by
        the quota check of every BEGIN and half message, so read from a count kept with the branch table."""
        return self._per_user.get(user, 0)

    def by_user(self):
        """``{user: live branches it began}`` (``stats quotas``); branches of no user are not counted."""
        return {user: n for user, n in self._per_user.items() if user is not None}

    def user_of(self, txid):
        """``(found, user)``: whether ``txid`` is a live branch, a heuristic outcome or a remembered decision
        (``Decided``), and who began it."""
        key = self._ident(txid)[0]
        b = self._branches.get(key)
        if b is not None:
            return True, b.user
        h = self._heuristic.get(key)
        if h is not None:
            return True, h.owner
        d = self._recent.get(key)
        return (d is not None), (d.user if d is not None else None)

    # -- timers / connections / admin --------------------------------------------------------------------------

    def expire(self, now_ms):
        """Roll back ACTIVE branches past their deadline; returns their keys (also retries pending DONEs)."""
        gone = []
        for b in list(self._branches.values()):
            if b.state == R.ACTIVE and b.deadline_ms is not None and now_ms >= b.deadline_ms:
                self._roll_back(b, now_ms, R.RB_TIMEOUT)
                gone.append(b.key)
            elif b.done_pending and all(b.applied):
                self._finish_commit(b, now_ms)
        recent = self._recent
        while recent:
            key = next(iter(recent))
            if recent[key].until_ms > now_ms:
                break
            del recent[key]
        return gone

    def owner_closed(self, owner, now_ms):
        """Roll back the ACTIVE local branches of a closed connection; returns their keys."""
        gone = []
        for key in sorted(self._by_owner.get(owner, ())):
            b = self._branches[key]
            if b.state == R.ACTIVE:
                self._roll_back(b, now_ms, R.RB_OWNER_CLOSED)
                gone.append(key)
        return gone

    def in_doubt(self):
        """TxInfo of every live branch and heuristic outcome, sorted by key."""
        out = [TxInfo(b.key, b.state, len(b.puts), b.nbytes, b.begun_ms, b.prepared_ms, b.qualifier, b.timeout_s,
                      b.user) for b in self._branches.values()]
        for key, h in self._heuristic.items():
            if key not in self._branches:
                out.append(TxInfo(key, "heuristic-commit" if h.commit else "heuristic-rollback", 0, 0, None,
                                  h.now_ms, R.key_qualifier(key)[1], 0, h.owner))
        return sorted(out, key=lambda info: info.key)

    def heuristic(self, key, commit, now_ms):
        """Operator decision on a PREPARED XA branch: a CommitPlan for a commit, None for a rollback.

        A commit journals COMMIT + HEURISTIC; like ``commit``, the caller makes the journal durable
        (``flush_journal``, off the event loop) and then calls ``apply_commit(plan)``. The outcome is
        answered XA_HEURCOM / XA_HEURRB until ``forget``. On a COMMITTING branch ``commit=True``
        returns a plan that completes the commit (no heuristic outcome is recorded).
        """
        key = self._ident(key)[0]
        b = self._branches.get(key)
        if b is None:
            raise _xa(XAER_NOTA, "no prepared transaction %s" % key)
        if b.state == R.COMMITTING and commit:
            return CommitPlan(key, b)
        if b.state != R.PREPARED:
            raise _xa(XAER_PROTO, "transaction %s is %s, not prepared" % (key, b.state))
        h = R.Heuristic(key, now_ms, bool(commit), b.user)
        if not commit:
            self._write(h, now_ms)
            self._heuristic[key] = h
            self._forget_branch(b, ROLLED_BACK, now_ms)
            self._counts["rolled_back"] += 1
            return None
        self._decide_commit(b, False, now_ms)
        self._write(h, now_ms)
        self._heuristic[key] = h
        return CommitPlan(key, b)

    # -- RocketMQ half messages ---------------------------------------------------------------------------------

    def put_half(self, number, topic, partition, flag, data, group, transaction_id, immunity_ms, limit, now_ms,
                 user=None):
        """Journal half message ``number`` (PUT, HALF); returns its partition (chosen now when -1).

        XAER_RMERR when ``limit`` half messages are pending already; the errors of ``begin`` and ``put``
        otherwise. The caller makes the journal durable (``flush_journal``) before acknowledging the send."""
        if len(self._halves) >= limit:
            raise TransactionError(XAER_RMERR, "too many half messages waiting for their end: the limit is %d "
                                   "(remoting.max_half_messages)" % limit)
        txid = half_txid(number)
        self.begin(txid, HALF_OWNER, 0, now_ms, user)
        try:
            partition = self.put(txid, HALF_OWNER, topic, partition, flag, data, None, now_ms)
            rec = R.Half(txid.key, now_ms, now_ms, 0, immunity_ms, group, transaction_id, user)
            self._write(rec, now_ms)
        except BaseException:
            if txid.key in self._branches:
                self.rollback(txid, HALF_OWNER, now_ms)
            raise
        b = self._branches[txid.key]
        self._by_owner.pop(HALF_OWNER, None)  # a half branch is no connection's (begin indexed it)
        b.state, b.half, b.prepared_ms, b.deadline_ms, b.timeout_s = R.PREPARED, rec, now_ms, None, 0
        self._halves[b.key] = b
        return partition

    def half(self, number):
        """The pending half message ``number`` (a HalfMessage), or None."""
        b = self._halves.get(half_txid(number).key)
        return half_view(b) if b is not None else None

    def halves(self):
        """Every half message waiting for its end (HalfMessage; not one being committed), oldest first."""
        return [half_view(b) for b in self._halves.values() if b.state == R.PREPARED]

    @property
    def half_count(self):
        return len(self._halves)

    def half_checked(self, number, now_ms):
        """Journal one more check-back of half message ``number`` (no fsync needed: a crash that loses it
        only allows one more check); returns the HalfMessage after it. XAER_NOTA when it is not pending."""
        b = self._halves.get(half_txid(number).key)
        if b is None:
            raise TransactionError(XAER_NOTA, "no half message %d is pending" % number)
        rec = b.half._replace(now_ms=now_ms, checks=b.half.checks + 1)
        self._write(rec, now_ms)
        b.half = rec
        return half_view(b)

    def _keep_half(self, b):
        """Recovery: a prepared branch rebuilt with a HALF record is a pending half message again."""
        if b.half is None:
            return
        b.owner = HALF_OWNER
        self._halves[b.key] = b

    # -- journal upkeep -----------------------------------------------------------------------------------------

    @property
    def needs_flush(self):
        """True when the journal has records the log has not flushed yet."""
        return self.store.flushed_position < self._log.end

    @property
    def journal_end(self):
        """The log end after the last journal record: it is durable once the log is flushed there (and in ``sync``
        replication confirmed once a slave holds the log there)."""
        return self._log.end

    def flush_journal(self):
        """BLOCKING: flush the log up to the journal's end (tests and scripts; the broker's flusher does it)."""
        if self.needs_flush:
            self.store.mark_flushed(self.store.flush_log())

    @property
    def wants_maintenance(self):
        """Cheap: True when the log has grown a segment past the last snapshot (or since its first journal record,
        with none yet): ``maintain`` writes one, and retention may delete what lies before it."""
        if self._replica is not None:
            return False
        floor = self.retention_floor()
        if self._snapshots.unflushed is not None:  # written, durable soon: no second one meanwhile
            floor = self._snapshots.latest
        return floor is not None and self.store.written_position - floor > self.store.config.segment_size

    def maintain(self, now_ms, pause=None, step=TX_SNAPSHOT_STEP):
        """Write a snapshot of the live branches and heuristic outcomes at the log end (on the loop: its records are
        what open branches hold in memory already), ``step`` keys at most at a time with ``pause()`` between two
        steps (the service's yields to the loop; None: none), so that many branches do not stall the requests.

        Requests served meanwhile journal their records among the snapshot's; before a record about a key the
        snapshot has not written yet, that key's branch is written into it as it is then (``_append``), so that
        every ordinary record after the snapshot's start changes a branch it holds, or one it never will: replay
        applies them on top of it (``LogReplay``). A full disk, or a change of role meanwhile, leaves it
        incomplete, which replay ignores."""
        if self._replica is not None or self._snap is not None:
            return
        snap = None
        try:
            snap = self._snap = self._begin_snapshot(itertools.chain(self._branches, self._heuristic), now_ms)
            while snap.pending:
                for key in list(itertools.islice(snap.pending, step)):
                    self._snapshot_key(snap, key, now_ms)
                if snap.pending and pause is not None:
                    pause()
                    if self._snap is not snap:  # left incomplete meanwhile (a failed write, a change of role)
                        return
            self._end_snapshot(snap, now_ms)
        except (MetaqError, OSError, R.RecordError) as exc:
            log.warning("transactions: a snapshot of the journal was not written: %s", exc)
        finally:
            if snap is not None and self._snap is snap:  # ended, or not (an error, the greenlet killed): incomplete
                self._snap = None

    def _begin_snapshot(self, keys, now_ms):
        snap = _Snapshot(keys, self.store.written_position)
        self._log.append(R.Snapshot(now_ms, 0), now_ms, SNAPSHOT_FLAG)
        return snap

    def _snapshot_key(self, snap, key, now_ms):
        """Write ``key``'s live branch and heuristic outcome, as they are now, into ``snap``."""
        del snap.pending[key]
        b, h = self._branches.get(key), self._heuristic.get(key)
        for rec in itertools.chain(() if b is None else b.records(), () if h is None else (h,)):
            self._log.append(rec, now_ms, SNAPSHOT_FLAG)
            snap.records += 1

    def _end_snapshot(self, snap, now_ms):
        end = self._log.append(R.SnapEnd(snap.records), now_ms, SNAPSHOT_FLAG)
        spans = self.store.record_spans(TX_TOPIC, 0, snap.start, self.store.written_position, 1)
        if spans:
            self._snapshots.written(spans[0][1], end)  # the floor once durable (retention_floor)

    def _write_snapshot(self, recs, now_ms):
        """A snapshot of ``recs`` at once (the migration of an older broker's journal, at open)."""
        snap = self._begin_snapshot((), now_ms)
        for rec in recs:
            self._log.append(rec, now_ms, SNAPSHOT_FLAG)
            snap.records += 1
        self._end_snapshot(snap, now_ms)

    def _append(self, rec, now_ms):
        """Journal ``rec``; while a snapshot is written in steps, the branch it is about goes into the snapshot first
        when it has not yet (see ``maintain``). A snapshot that cannot take it is left incomplete."""
        snap = self._snap
        if snap is not None and rec.key in snap.pending:
            try:
                self._snapshot_key(snap, rec.key, now_ms)
            except (MetaqError, OSError, R.RecordError) as exc:
                self._snap = None
                log.warning("transactions: a snapshot of the journal was not written: %s", exc)
        return self._log.append(rec, now_ms)

    def close(self, now_ms):
        """Nothing to close: the journal is the log's."""

    def abandon(self):
        """Nothing to abandon: the journal is the log's."""

    def summary_values(self):
        """The general ``stats`` lines of the journal: the log bytes retention keeps for it (from its last snapshot)
        and the branches prepared (half messages among them)."""
        s = self.stats()
        return [("tx_journal_bytes", s["journal_bytes"]), ("tx_prepared", s["prepared"])]

    def stats(self):
        counts = {"open": 0, "prepared": 0, "committing": 0}
        for b in self._branches.values():
            counts["open" if b.state == R.ACTIVE else b.state] += 1
        counts.update(self._counts)
        counts["heuristic"] = len(self._heuristic)
        floor = self.retention_floor()
        counts["journal_bytes"] = 0 if floor is None else max(0, self._log.end - floor)
        return counts
