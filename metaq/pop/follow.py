"""The POP journal in the commit log: its records (``pop/records.py``) are messages of the internal topic ``%POP%``
(one partition), followed by the store's log follower through ``store/journals.py``'s ``JournalFollow``
(``POP_JOURNAL``), as the transaction journal is (``transactions/follow.py``).

Why the log: it is what a slave copies and what a rejoining master cuts back, so the POP state of a promoted slave
is the master's (what was handed out and acknowledged up to the last record it received), and nothing of a
diverged tail survives.

* **Records** (``PopLog``): written by the master alone (``protocol/journaltopic.py``: no client may put there),
  into the page cache at once, before the reply: a killed broker (kill -9) keeps them. Not waited for a flush: a
  record lost with a power cut means a message handed out again (at least once), never one lost.
* **Replay** (``Replay``): the records in log order; a complete snapshot (``S`` … ``E``, written in one go) replaces
  the state before it. The broker replays the whole journal at open; retention keeps the log from the last
  complete snapshot whose end is durable (``PopLog.snapshots``: a power cut may lose an unflushed one, and the one
  before it must still be there), which the service writes when the journal grew ``POP_SNAPSHOT_BYTES`` past it.
* **Following** (a slave): ``learn`` hands every replicated ``%POP%`` record to the replay, at most
  ``POP_LEARN_BATCH`` a call; a **cut** replays the log again up to the cut. A master learns nothing from its own
  records: it applied them as it wrote them.

No sockets, gevent or clock.
"""

from metaq.pop import records as R
from metaq.pop.state import PopState
from metaq.protocol.journaltopic import POP_TOPIC
from metaq.store.journals import JournalTopic, SnapshotFloor, first_position, read_journal

#: Records one ``learn`` takes at most (the follower's next step takes the rest).
POP_LEARN_BATCH = 4096
#: The journal's topic and decoder (``store/journals.py`` reads and follows it).
POP_JOURNAL = JournalTopic(POP_TOPIC, R.decode, R.RecordError, "pop")


class PopLog:
    """The journal's records as ``%POP%`` messages of ``store``: ``append``, ``read``; ``written``: bytes appended
    since the last snapshot began (what decides the next one), ``snapshots``: the last complete snapshot's log
    position (a ``SnapshotFloor``: retention's once its end is durable)."""

    def __init__(self, store, append):
        """``append``: the put path's journal append (``serving.putpath.journal_append``)."""
        self._store = store
        self._append = append
        self.written = 0
        self.snapshots = SnapshotFloor(store)

    def append(self, rec, now_ms):
        """Write one record (page cache); returns its log end. Raises RecordError past ``MAX_RECORD_BYTES`` or what
        the store's put raises (nothing written then)."""
        data = R.encode(rec)
        if len(data) > R.MAX_RECORD_BYTES:
            raise R.RecordError("a POP %s record of %d bytes exceeds %d" % (rec["k"], len(data), R.MAX_RECORD_BYTES))
        r = self._append(POP_TOPIC, 0, data, now_ms)
        self.written += len(data)
        return r

    def first_position(self):
        """The log position of the first ``%POP%`` record the log holds, or None: there is none."""
        return first_position(self._store, POP_JOURNAL)

    def write_snapshot(self, state, now_ms):
        """Write ``state`` as a snapshot; retention may drop the records before it once its end is durable
        (``snapshots.durable()``: a power cut before that leaves it incomplete, and the one before it is needed)."""
        first = r = None
        for rec in state.snapshot_records():
            r = self.append(rec, now_ms)
            if first is None:
                first = self._store.record_position(POP_TOPIC, 0, r.offset)
        if first is not None:
            self.snapshots.written(first, r.log_end)
        self.written = 0

    def read(self, upto=None):
        """Every ``(position, record)`` of ``%POP%`` in log order, before ``upto`` (default: the written end)."""
        for position, _flag, rec in read_journal(self._store, POP_JOURNAL, upto):
            yield position, rec


class Replay:
    """A ``PopState`` rebuilt from records in log order (see the module doc); ``state`` is the one in use."""

    def __init__(self, make_state=PopState):
        self._make = make_state
        self.state = make_state()
        self.snapshot_at = None
        self._next = None  # (position, PopState, count): a snapshot being read

    def apply(self, position, rec):
        kind = rec["k"]
        if kind == "S":
            self._next = (position, self._make(), 0)
        elif kind == "P":
            if self._next is not None:
                at, state, count = self._next
                state.apply(rec)
                self._next = (at, state, count + 1)
        elif kind == "E":
            if self._next is not None and self._next[2] == rec["n"]:
                self.snapshot_at, self.state = self._next[0], self._next[1]
            self._next = None
        else:
            self.state.apply(rec)
            if self._next is not None:
                self._next[1].apply(rec)


def replay(journal, make_state=PopState, upto=None):
    """The ``Replay`` of every record of ``journal`` (a ``PopLog``) before ``upto``."""
    r = Replay(make_state)
    for position, rec in journal.read(upto):
        r.apply(position, rec)
    return r
