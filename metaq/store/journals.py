"""A feature's journal in an internal topic of the commit log (``%TX%``, ``%POP%``, ``%MQTT%``: one partition each,
written by the master alone): the one replay reader (``read_journal``), the one subscriber of the log follower
(``JournalFollow``) and the one snapshot floor (``SnapshotFloor``). A feature says what is its own in a
``JournalTopic`` (its topic, its decoder) and in the callables it hands ``JournalFollow``; the rest is here, once.

Why one: the three journals are followed the same way. A slave learns the master's records through the topic's
partition index (no walk of the other topics' records), each checked and decoded once from the segment map it is
handed, a record that fails either logged and passed over, a bounded batch per follower step; a cut replays the log
up to the cut (the feature's ``relearn``), so nothing of a diverged tail survives; a master learns nothing from its
own records (it applied them as it wrote them); retention keeps what the feature's ``floor`` names.

No sockets, gevent or clock.
"""

import logging
from typing import Callable, NamedTuple

from metaq.protocol.message import HEADER
from metaq.store.follower import WRITTEN
from metaq.store.record import PREFIX, TOPIC_START, check_record

log = logging.getLogger(__name__)

#: How many index entries one read of the partition takes at a time (``read_journal``).
READ_SPANS = 1024


class JournalTopic(NamedTuple):
    """What a journal is: ``topic`` (partition 0), ``decode(payload)`` -> the value its reader and subscriber hand on
    (``payload``: bytes, or a view of a segment's map valid during the call only: a decoder that keeps it copies it),
    ``error``: what ``decode`` raises for a record that does not decode; ``name``: the feature, for the logs."""

    topic: str
    decode: Callable
    error: type
    name: str


def read_journal(store, journal, upto=None):
    """Every ``(position, flag, value)`` of ``journal``'s topic in log order, before ``upto`` (default: the written
    end). A record that does not decode (a bug, a foreign writer) is logged and passed over."""
    end = store.written_position if upto is None else upto
    pos = 0
    while pos < end:
        spans = store.record_spans(journal.topic, 0, pos, end, READ_SPANS)
        if not spans:
            return
        for offset, at, _size in spans:
            rec = store.record_at(at)
            try:
                value = journal.decode(rec.data)
            except journal.error as exc:
                log.error("%s: record %d of %s is passed over: %s", journal.name, offset, journal.topic, exc)
                continue
            yield at, rec.flag, value
        pos = spans[-1][1] + spans[-1][2]


def first_position(store, journal):
    """The log position of the first record of ``journal``'s topic the log holds, or None: there is none."""
    first = store.record_spans(journal.topic, 0, 0, store.written_position, 1)
    return first[0][1] if first else None


class SnapshotFloor:
    """Retention's floor for a journal that writes snapshots: its last complete snapshot whose end is durable.

    A snapshot counts once the log is flushed past its end: a power cut before that leaves it incomplete (replay
    ignores it), and the one before it, with the records after that, must still be in the log. ``written(start,
    end)``: a complete snapshot was written (page cache); ``durable()``: the floor now (it moves to the newest
    snapshot once ``store.flushed_position`` reaches its end); ``latest``: the start of the newest one written,
    durable or not (what decides the next one: no second one while the first becomes durable); ``reset(at)``: the
    floor a replay found (its snapshot is in the log the replay read)."""

    __slots__ = ("_store", "at", "unflushed")

    def __init__(self, store, at=None):
        self._store = store
        self.at = at  # the start of the last complete snapshot whose end is durable (None: none)
        self.unflushed = None  # (start, end) of a complete snapshot whose end is not durable yet

    def reset(self, at):
        self.at, self.unflushed = at, None

    def written(self, start, end):
        self.unflushed = (start, end)

    def durable(self):
        newer = self.unflushed
        if newer is not None and self._store.flushed_position >= newer[1]:
            self.at, self.unflushed = newer[0], None
        return self.at

    @property
    def latest(self):
        return self.at if self.unflushed is None else self.unflushed[0]


class MovingFloor:
    """Retention's floor for a journal whose live records move: each is written again at the end (a session, a
    retained message) and the copy it replaces stays needed until the new one is durable.

    ``compute()``: the lowest position a live record is at now (None: none). A lower figure counts at once; a higher
    one only once the log is flushed past everything written when it was computed (a power cut before that
    leaves the old copies as the last records, so they must still be in the log). Calling the object gives the
    floor now; ``reset()`` takes what a replay found as durable."""

    __slots__ = ("_store", "_compute", "at", "pending")

    def __init__(self, store, compute):
        self._store, self._compute = store, compute
        self.at = compute()
        self.pending = None  # (a higher floor, the written end when it was computed)

    def reset(self):
        self.at, self.pending = self._compute(), None

    def __call__(self):
        pending = self.pending
        if pending is not None and self._store.flushed_position >= pending[1]:
            self.at, self.pending = pending[0], None
        now = self._compute()
        if _below(now, self.at):
            self.at, self.pending = now, None
        elif now != self.at and self.pending is None:
            self.pending = (now, self._store.written_position)
        return self.at


def _below(a, b):
    """Whether floor ``a`` keeps more of the log than ``b`` (None keeps nothing)."""
    return a is not None and (b is None or a < b)


class JournalFollow:
    """A feature's subscriber of the log follower for its ``journal`` (a ``JournalTopic``; see the module doc).

    ``learn(position, flag, value)``: the feature's replica state takes one replicated record; ``relearn(upto)``: it
    replays the log up to a cut; ``floor()``: the position retention must keep for it, or None. ``limit`` and
    ``max_bytes`` (None: no byte bound): the most records, and bytes of them, one ``learn`` takes (one record at
    least), so that one follower step on the event loop stays bounded. ``replicating``: a slave, whose records are
    the master's to learn; a master's are not (``passive``)."""

    follows = WRITTEN

    def __init__(self, store, journal, learn, relearn, floor, limit, max_bytes=None):
        self._store, self.journal = store, journal
        self._learn, self._relearn, self._floor = learn, relearn, floor
        self.limit, self.max_bytes = limit, max_bytes
        self.position = 0
        self.replicating = False

    @property
    def passive(self):
        """A master learns nothing from its own records: the follower keeps it at the end without a step."""
        return not self.replicating

    def load(self, log_start, log_end):
        """The feature replayed the whole journal at its open: nothing is left to learn."""
        self.position = log_end
        return log_end

    def rebuild(self, position):
        self.cut(position)

    def learn(self, buf, base, rel, stop, end):
        """Learn the journal's records that start in ``[base + rel, base + stop)`` (found through the partition
        index), at most ``limit`` of them and ``max_bytes`` of log (one at least); returns the start of the first one
        not learned (no room, or wholly past ``end``), or ``end`` when none is left before ``stop``."""
        if not self.replicating:
            return end
        count = nbytes = 0
        max_bytes = self.max_bytes
        for offset, pos, size in self._store.record_spans(self.journal.topic, 0, base + rel, base + end,
                                                          self.limit + 1):
            if pos >= base + stop or pos + size > base + end or count >= self.limit or \
                    (count and max_bytes is not None and nbytes + size > max_bytes):
                return pos - base
            count, nbytes = count + 1, nbytes + size
            self._learn_at(buf, pos - base, offset, pos, size, end)
        return end

    def _learn_at(self, buf, at, offset, pos, size, end):
        """The record at ``buf[at]`` (the topic's ``offset``, log ``pos``): checked, its payload decoded from a view
        of ``buf`` (released after: no view of the segment's map outlives the call), learned; one that fails either
        is logged and passed over."""
        j = self.journal
        if check_record(buf, at, end) != size:
            log.error("%s: replicated record %d of %s is passed over: it fails its check", j.name, offset, j.topic)
            return
        head = at + TOPIC_START + PREFIX.unpack_from(buf, at)[7]
        msg_len, _checksum, _msg_id, flag = HEADER.unpack_from(buf, head)
        payload = memoryview(buf)[head + HEADER.size:head + HEADER.size + msg_len]
        try:
            value = j.decode(payload)
        except j.error as exc:
            log.error("%s: replicated record %d of %s is passed over: %s", j.name, offset, j.topic, exc)
            return
        finally:
            payload.release()
        self._learn(pos, flag, value)

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
