"""The transaction journal in the commit log: its records are messages of the internal topic ``%TX%`` (one
partition), followed by the store's log follower through ``store/journals.py``'s ``JournalFollow`` (``TX_JOURNAL``).

Why the log and not files of its own: the log is what a slave copies, what a sync master waits for and what a
rejoining master cuts back to the new master's history. A journal in the log is replicated, confirmed and cut with
the messages it commits, by the same code, at the same positions: a prepared branch answered XA_OK in ``sync``
mode is on every in-sync member, and a branch that a deposed master prepared after the new master's history began
goes with the rest of that master's diverged tail (docs/replication.md "Transactions and failover").

* **Records** (``TxLog``): each journal record (``records.encode``) is one ``%TX%`` message, written by the master
  alone (``protocol/journaltopic.py``: no client may put there). Durable when the log is flushed past its end.
* **Snapshots**: the live branches' records written again at the log end between ``Snapshot`` and ``SnapEnd``, each
  with the message flag ``SNAPSHOT_FLAG``; a complete one replaces everything before it (``LogReplay``), an
  incomplete one (a full disk, a crash) is ignored. The manager writes one in steps, serving requests between
  them, so ordinary records may lie among its records: each is about a branch the snapshot wrote already or will
  not write (the manager writes a branch's records into the snapshot before a change to it), so the snapshot plus
  the ordinary records after its start, in log order, are the state. Retention keeps the log from the last
  complete snapshot (``retention_floor``), and the manager writes one whenever the log has grown a segment past it.
* **Following** (a slave): ``learn`` hands every ``%TX%`` record replicated to the manager's replica state
  (``TransactionManager.learn``), at most ``TX_LEARN_BATCH`` records and ``TX_LEARN_BATCH_BYTES`` of them a call
  (the follower's next step takes the rest), each checked and decoded once from the segment map it is handed; a
  **cut** makes it replay the log again up to the cut, so nothing of a diverged tail survives. A master learns
  nothing from its own records: it applied them as it wrote them.

No sockets, gevent or clock.
"""

import logging

from metaq.errors import CorruptLog
from metaq.protocol.journaltopic import TX_TOPIC
from metaq.store.journals import JournalTopic, first_position, read_journal
from metaq.transactions import records as R

log = logging.getLogger(__name__)

#: The message flag of a snapshot's records (bit 0 is MetaQ's attribute flag; this one no client writes here).
SNAPSHOT_FLAG = 2
#: The journal's topic and decoder (``store/journals.py`` reads and follows it).
TX_JOURNAL = JournalTopic(TX_TOPIC, R.decode, R.RecordError, "transactions")


class TxLog:
    """The journal's records as ``%TX%`` messages of ``store``: ``append``, ``read``, and where they end."""

    def __init__(self, store, append):
        """``append``: the put path's journal append (``serving.putpath.journal_append``)."""
        self._store = store
        self._append = append
        self.end = 0  # the log end after the last record appended: durable once the log is flushed past it

    def append(self, rec, now_ms, flag=0):
        """Write one record (page cache); returns its log end. Raises RecordError past ``MAX_RECORD_BYTES``, or what
        the store's put raises (DiskFull, RecordTooLarge ...), nothing written then."""
        data = b"".join(R.encode(rec))
        if len(data) > R.MAX_RECORD_BYTES:
            raise R.RecordError("a %s record of %d bytes exceeds %d" % (type(rec).__name__, len(data),
                                                                         R.MAX_RECORD_BYTES))
        self.end = self._append(TX_TOPIC, flag, data, now_ms).log_end
        return self.end

    def cut(self, position):
        """The log was cut back to ``position``: no record of the journal ends past it (nothing is left to flush
        there for the journal's sake)."""
        self.end = min(self.end, position)

    def read(self, upto=None):
        """Every ``(position, flag, record)`` of ``%TX%`` in log order, before ``upto`` (default: the written end).
        A record that does not decode (a bug, a foreign writer) is logged and passed over."""
        return read_journal(self._store, TX_JOURNAL, upto)

    def has_records(self):
        return first_position(self._store, TX_JOURNAL) is not None


class _Reading:
    """A snapshot being read: where it starts, the state it builds (its records and the ordinary ones among them),
    how many of its own records came so far, and the anomalies of the state before it when it began."""

    __slots__ = ("at", "state", "count", "anomalies")

    def __init__(self, at, state, anomalies):
        self.at, self.state, self.count, self.anomalies = at, state, 0, anomalies


class LogReplay:
    """Branches rebuilt from ``(position, flag, record)`` in log order: a ``records.ReplayState`` that a complete
    snapshot replaces whole. ``snapshot_at``: the position of the last complete snapshot (None: none yet).

    A log that retention cut starts in the segment of its floor snapshot, so the state before that snapshot may lack
    a branch's first records and break on a later one (a COMMIT naming more messages than it holds). Such a break is
    kept, not raised, since the complete snapshot after it replaces that state whole; ``finish`` raises it when no
    complete snapshot came after (then it is the state in use, and the log is corrupt).

    The ordinary records among a snapshot's (written while it was) go to both states: the one before it, and the
    snapshot's, which they bring up to date. While a snapshot is read, the state before it tells nobody of the
    records that fit none of its branches (a log that starts at the snapshot lacks their first records; the
    snapshot's state tells of those that fit none of its own); they are counted all the same."""

    def __init__(self, on_anomaly=None):
        self.on_anomaly = on_anomaly
        self.state = self._fresh()
        self.snapshot_at = None
        self.records = 0
        self._next = None  # a _Reading: a snapshot being read
        self._broken = None  # the first CorruptLog of the state in use (see the class doc)

    def _fresh(self):
        return R.ReplayState(keep_done_after=1 << 62, on_anomaly=self.on_anomaly)  # the log holds what DONE names

    def apply(self, position, flag, rec):
        self.records += 1
        t = type(rec)
        reading = self._next
        if flag & SNAPSHOT_FLAG:
            if t is R.Snapshot:
                self._next = _Reading(position, self._fresh(), self.state.anomalies)
                self.state.on_anomaly = None
            elif reading is None:
                return  # the rest of a snapshot whose start retention deleted or a cut left out
            elif t is R.SnapEnd:
                self._next = None
                self.state.on_anomaly = self.on_anomaly
                if reading.count == rec.records:
                    state = reading.state
                    state.anomalies = reading.anomalies + state.anomalies
                    state.records = self.state.records
                    self.state, self.snapshot_at, self._broken = state, reading.at, None
            else:
                reading.count += 1
                reading.state.apply(rec)
            return
        try:
            self.state.apply(rec)
        except CorruptLog as exc:
            if self._broken is None:
                log.warning("transactions: %s (at log position %d; a complete snapshot after it replaces the state "
                            "it breaks)", exc, position)
                self._broken = exc
        if reading is not None:
            reading.state.apply(rec)

    def finish(self):
        """Raise the CorruptLog that broke the state in use, if one did (see the class doc)."""
        if self._broken is not None:
            raise self._broken

