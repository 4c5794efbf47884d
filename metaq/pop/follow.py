"""The POP journal in the commit log: its records (``pop/records.py``) are messages of the internal topic ``%POP%``
(one partition), and ``PopFollow`` is its subscriber of the store's log follower (``store/follower.py``), as the
transaction journal's (``transactions/follow.py``).

Why the log: it is what a slave copies and what a rejoining master cuts back, so the POP state of a promoted slave
is the master's (what was handed out and acknowledged up to the last record it received), and nothing of a
diverged tail survives.

* **Records** (``PopLog``): written by the master alone (``protocol/journaltopic.py``: no client may put there),
  into the page cache at once, before the reply: a killed broker (kill -9) keeps them. Not waited for a flush: a
  record lost with a power cut means a message handed out again (at least once), never one lost.
* **Replay** (``Replay``): the records in log order; a complete snapshot (``S`` … ``E``, written in one go) replaces
  the state before it. The broker replays the whole journal at open; retention keeps the log from the last
  complete snapshot (``retention_floor``), which the service writes when the journal grew ``POP_SNAPSHOT_BYTES``
  past it.
* **Following** (a slave): ``learn`` hands every replicated ``%POP%`` record to the replay, at most
  ``POP_LEARN_BATCH`` a call; a **cut** replays the log again up to the cut. A master learns nothing from its own
  records: it applied them as it wrote them.

No sockets, gevent or clock.
"""

import logging

from metaq.pop import records as R
from metaq.pop.state import PopState
from metaq.protocol.journaltopic import POP_TOPIC
from metaq.protocol.message import HEADER
from metaq.store.follower import WRITTEN
from metaq.store.record import PREFIX, TOPIC_START, check_record

log = logging.getLogger(__name__)

#: Records one ``learn`` takes at most (the follower's next step takes the rest).
POP_LEARN_BATCH = 4096
_SPANS = 1024


class PopLog:
    """The journal's records as ``%POP%`` messages of ``store``: ``append``, ``read``; ``written``: bytes appended
    since the last snapshot began (what decides the next one), ``snapshot_at``: the last complete snapshot's log
    position (None: none)."""

    def __init__(self, store):
        self._store = store
        self.written = 0
        self.snapshot_at = None

    def append(self, rec, now_ms):
        """Write one record (page cache); returns its log end. Raises RecordError past ``MAX_RECORD_BYTES`` or what
        the store's put raises (nothing written then)."""
        data = R.encode(rec)
        if len(data) > R.MAX_RECORD_BYTES:
            raise R.RecordError("a POP %s record of %d bytes exceeds %d" % (rec["k"], len(data), R.MAX_RECORD_BYTES))
        r = self._store.put(POP_TOPIC, 0, 0, data, now_ms)
        self.written += len(data)
        return r

    def first_position(self):
        """The log position of the first ``%POP%`` record the log holds, or None: there is none."""
        first = self._store.record_spans(POP_TOPIC, 0, 0, self._store.written_position, 1)
        return first[0][1] if first else None

    def write_snapshot(self, state, now_ms):
        """Write ``state`` as a snapshot; from now on retention may drop the records before it."""
        first = None
        for rec in state.snapshot_records():
            r = self.append(rec, now_ms)
            if first is None:
                first = self._store.record_position(POP_TOPIC, 0, r.offset)
        self.snapshot_at, self.written = first, 0

    def read(self, upto=None):
        """Every ``(position, record)`` of ``%POP%`` in log order, before ``upto`` (default: the written end)."""
        store = self._store
        end = store.written_position if upto is None else upto
        pos = 0
        while pos < end:
            spans = store.record_spans(POP_TOPIC, 0, pos, end, _SPANS)
            if not spans:
                return
            for offset, at, _size in spans:
                try:
                    yield at, R.decode(store.record_at(at).data)
                except R.RecordError as exc:
                    log.error("pop: record %d of %s is passed over: %s", offset, POP_TOPIC, exc)
            pos = spans[-1][1] + spans[-1][2]


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


class PopFollow:
    """The POP service's subscriber of the log follower (see the module doc): ``learn(position, rec)`` takes one
    replicated record, ``relearn(upto)`` replays the log up to a cut, ``floor()`` names retention's floor."""

    follows = WRITTEN

    def __init__(self, store, learn, relearn, floor, limit=POP_LEARN_BATCH):
        self._store = store
        self._learn, self._relearn, self._floor = learn, relearn, floor
        self.limit = limit
        self.position = 0
        self.replicating = False  # a slave: the records arriving are the master's, to be learned

    @property
    def passive(self):
        return not self.replicating

    def load(self, log_start, log_end):
        """The service replayed the whole journal at its open: nothing is left to learn."""
        self.position = log_end
        return log_end

    def rebuild(self, position):
        self.cut(position)

    def learn(self, buf, base, rel, stop, end):
        """Learn the ``%POP%`` records that start in ``[base + rel, base + stop)``, at most ``limit``; returns the start
        of the first one not learned, or ``end`` when none is left before ``stop``."""
        if not self.replicating:
            return end
        count = 0
        for offset, pos, size in self._store.record_spans(POP_TOPIC, 0, base + rel, base + end, self.limit + 1):
            if pos >= base + stop or pos + size > base + end or count >= self.limit:
                return pos - base
            count += 1
            at = pos - base
            if check_record(buf, at, end) != size:
                log.error("pop: replicated record %d of %s is passed over: it fails its check", offset, POP_TOPIC)
                continue
            head = at + TOPIC_START + PREFIX.unpack_from(buf, at)[7]
            msg_len = HEADER.unpack_from(buf, head)[0]
            try:
                rec = R.decode(bytes(buf[head + HEADER.size:head + HEADER.size + msg_len]))
            except R.RecordError as exc:
                log.error("pop: replicated record %d of %s is passed over: %s", offset, POP_TOPIC, exc)
                continue
            self._learn(pos, rec)
        return end

    def advance(self, position):
        self.position = max(self.position, position)

    def cut(self, position):
        if position < self.position:
            self.position = position
            self._relearn(position)

    def drop_below(self, log_start):
        return []

    def retention_floor(self):
        return self._floor()

    def checkpoint(self, if_changed=False):
        pass

    def close(self):
        pass
