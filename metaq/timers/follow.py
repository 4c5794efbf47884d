"""The timer index's subscriber of the store's log follower (``store/follower.py``): how timers.db follows the log.

Its ``position`` is a log position: every %TIMER% record before it is learned, into the pending batch or into
timers.db. The follower calls it on the event loop, so it does no SQLite work: ``learn`` only collects the flushed
%TIMER% records of the span it is handed into a bounded pending batch (``TIMER_INDEX_BATCH`` records,
``TIMER_INDEX_BATCH_BYTES`` of log records, one at least), decoded — taken from the ``Handoff`` when this master wrote
them, read from the segment's map otherwise. The timer service takes the batch (``take``), applies it in its own
thread with the position it covers (one SQLite transaction) and says so (``applied``): ``committed`` is the
position timers.db holds, the one a restart resumes from (``load``); ``checkpoint`` has nothing to do.

It finds its records through the %TIMER% partition's index (``spans``: offset, position and size of the records
that start in a span), never by walking the other topics' records: following a log of other traffic costs one
lookup a span.

* **Cut** (a slave's truncation past its position): the batch and the Handoff are dropped, the position goes back
  to the cut, and timers.db is rewound there by the service before its next batch (``rewind``), so the new
  master's records written past the cut are learned. What the cut records did stays in timers.db: an entry of the
  lost tail stays pending (an acknowledged put_at the async failover lost: delivered if this broker is promoted,
  rather than lost) and a DONE or CANCEL of it stays an outcome.
* **Retention** keeps every %TIMER% record timers.db has not committed (``retention_floor``): once committed, a
  message lives in timers.db, so a message due in a year does not pin the log. Records retention deleted all the
  same before they were learned are counted (``dropped``) and passed over (``drop_below``).
* **Migration**: a timers.db that only says ``indexed_offset`` (the next %TIMER% offset) resumes from that record's
  position, found through the partition index.

No SQLite, sockets, gevent or clock: the service wakes on ``wake`` and does the I/O.
"""

import logging

from metaq.timers.limits import TIMER_INDEX_BATCH, TIMER_INDEX_BATCH_BYTES
from metaq.store.follower import FLUSHED
from metaq.store.record import HEADER, MESSAGE_MAGIC, PREFIX, TOPIC_START, check_record, decode_record
from metaq.timers.records import BadTimerRecord, TimerDone, TimerEntry, decode

log = logging.getLogger(__name__)


class Batch:
    """What ``learn`` collected for one SQLite transaction: ``records`` ``(msg_id, record)`` in log order, the
    ``entries`` among them, ``next_offset`` (the %TIMER% offset after the last), ``position`` (the log position
    before which every %TIMER% record is in it or in timers.db), ``done_end`` (the end of its last DONE record, or
    None), ``nbytes`` (the log bytes of its records), ``passed`` (records it passes over: bad, or deleted before
    they were learned; timers.db's ``indexed_offset`` moves past them all the same)."""

    __slots__ = ("records", "entries", "next_offset", "position", "done_end", "nbytes", "passed")

    def __init__(self, next_offset, position):
        self.records, self.entries = [], []
        self.next_offset, self.position, self.done_end, self.nbytes, self.passed = next_offset, position, None, 0, 0


class TimerFollow:
    """See the module docstring. ``store``: its ``record_spans``, ``record_position``, ``min_offset`` and
    ``max_offset`` of ``topic`` partition 0 are read (the partition index, no log read); ``handoff``: what this
    master wrote; ``wake()``: the batch has something for the service (a record, or one passed over)."""

    follows = FLUSHED

    def __init__(self, store, topic, handoff, wake, limit=TIMER_INDEX_BATCH, max_bytes=TIMER_INDEX_BATCH_BYTES):
        self._store, self._topic = store, topic
        self.handoff = handoff
        self._wake = wake
        self.limit, self.max_bytes = limit, max_bytes
        self.position = 0
        self.committed = None  # the position timers.db holds (None: a file from before positions)
        self.committed_offset = 0  # timers.db's indexed_offset
        self.rewind = None  # (position, offset): timers.db goes back there before the next batch (a cut)
        self.dropped = 0  # records passed over: bad, or deleted by retention before they were learned
        self._batch = Batch(0, 0)
        self._applying = None  # the batch the service took and has not said it applied

    def _spans(self, position, end, most):
        return self._store.record_spans(self._topic, 0, position, end, most)

    # -- what the timer service reads and says --------------------------------

    def open(self, position, indexed_offset):
        """timers.db's committed state: its ``indexed_position`` (None: a file from before positions) and
        ``indexed_offset``; before ``MessageStore.follower.add``."""
        self.committed, self.committed_offset = position, indexed_offset

    @property
    def full(self):
        """The batch has no room: the follower passes it over until the service takes it (``take``)."""
        b = self._batch
        return bool(b.records) and (len(b.records) >= self.limit or b.nbytes >= self.max_bytes)

    def pending(self):
        """Records in the batch waiting for the service (those passed over count: ``indexed_offset`` moves)."""
        return len(self._batch.records) + self._batch.passed

    def take(self):
        """The batch to apply (its records may be none: the position alone moved); a new one starts after it."""
        b = self._batch
        b.position = self.position
        self._batch = Batch(b.next_offset, self.position)
        self._applying = b
        return b

    def applied(self, batch):
        """timers.db committed ``batch``; a cut that came meanwhile still takes it back (``rewind``)."""
        self._applying = None
        self.committed, self.committed_offset = batch.position, batch.next_offset
        if self.rewind is not None:
            self.committed = min(self.committed, self.rewind[0])
            self.committed_offset = min(self.committed_offset, self.rewind[1])

    def relearn(self):
        """A batch taken could not be applied: learn again from what timers.db holds (the log still has it)."""
        self._applying = None
        self.position = self.committed
        self._batch = Batch(self.committed_offset, self.committed)

    def rewound(self, to):
        """timers.db went back to ``rewind`` as it was (``to``); a cut that came meanwhile keeps its own."""
        if self.rewind == to:
            self.rewind = None

    def retention_floor(self):
        """The first %TIMER% record timers.db has not committed (None: there is none)."""
        first = self._spans(self.committed or 0, 1 << 62, 1)
        return first[0][1] if first else None

    # -- the follower's subscriber ---------------------------------------------

    def load(self, log_start, log_end):
        """The committed position; for a timers.db that only has ``indexed_offset``, that record's position (the log
        end when every record was indexed, the log start when retention deleted it: counted)."""
        if self.committed is None:
            off, first = self.committed_offset, self._store.min_offset(self._topic, 0)
            if off >= self._store.max_offset(self._topic, 0):
                self.committed = log_end
            elif off < first:  # counted below
                self.committed = log_start
            else:
                at = self._store.record_position(self._topic, 0, off)
                self.committed = log_start if at is None else at
        self.position = self.committed
        self._batch = Batch(self.committed_offset, self.position)
        self._pass_deleted()
        return self.position

    def rebuild(self, position):
        """Never asked (``load`` always trusts timers.db: a damaged one refuses the start); learns again from
        ``position`` without forgetting anything, as after a cut."""
        self.cut(position)

    def learn(self, buf, base, rel, stop, end):
        """Collect the %TIMER% records that start in ``[base + rel, base + stop)`` into the batch while it has room;
        returns the start of the first one not collected, or ``end`` when none is left before it."""
        b = self._batch
        for offset, pos, size in self._spans(base + rel, base + end, max(self.limit - len(b.records), 0) + 1):
            at = pos - base
            if pos >= base + stop or pos + size > base + end or not self._has_room(b, size):
                return at
            self._collect(b, buf, at, offset, pos, size, end)
        return end

    def _has_room(self, b, size):
        return not b.records or (len(b.records) < self.limit and b.nbytes + size <= self.max_bytes)

    def _collect(self, b, buf, at, offset, pos, size, end):
        """The record at ``buf[at]`` (%TIMER% ``offset``, log ``pos``, ``size`` bytes) joins the batch, or is passed
        over (counted) if bad."""
        b.next_offset = offset + 1
        total, magic, _crc, _part, _off, _st, _bt, topic_len = PREFIX.unpack_from(buf, at)
        head = at + TOPIC_START + topic_len
        rec = msg_id = None
        if magic == MESSAGE_MAGIC and total == size and head + HEADER.size <= at + size:
            msg_id = HEADER.unpack_from(buf, head)[2]
            rec = self.handoff.get(offset, msg_id)  # what this master wrote there, decoded: the log's own id
        if rec is None:
            if msg_id is None or not check_record(buf, at, end):
                log.error("timers: record %d of the timer topic is skipped: it fails its check", offset)
                self._pass(b, 1)
                return
            try:
                rec = decode(decode_record(buf, at).data)
            except BadTimerRecord as exc:
                log.error("timers: record %d of the timer topic is skipped: %s", offset, exc)
                self._pass(b, 1)
                return
        b.records.append((msg_id, rec))
        b.nbytes += size
        if isinstance(rec, TimerEntry):
            b.entries.append((msg_id, rec))
        elif isinstance(rec, TimerDone):  # a delivery step's messages all lie before its DONE: scan_from
            b.done_end = pos + size
        if len(b.records) + b.passed == 1:
            self._wake()

    def _pass(self, b, n):
        """``n`` records are passed over: counted, and the service told (timers.db's offset moves past them)."""
        self.dropped += n
        b.passed += n
        if len(b.records) + b.passed == n:
            self._wake()

    def advance(self, position):
        if position > self.position:
            self.position = position

    def cut(self, position):
        """The log ends at ``position``, before what was learned: the batch is dropped (learned again from the log),
        and timers.db goes back to the cut (or to what it holds or is being given, when that is before) before
        its next batch; a batch being applied meanwhile is taken back to the cut too."""
        self.handoff.clear()
        if position >= self.position:
            return
        held = self._applying
        held = (self.committed, self.committed_offset) if held is None else (held.position, held.next_offset)
        back = min(position, held[0])
        offset = min(held[1], self._store.max_offset(self._topic, 0))
        log.warning("timers: the log was cut at %d, past which the timer index had learned up to %d: learning again "
                    "from %d", position, self.position, back)
        self._batch = Batch(offset, back)
        self.position = back
        self.committed, self.committed_offset = min(self.committed, back), min(self.committed_offset, offset)
        if held[0] > back:  # timers.db holds (or is being given) records past the cut
            self.rewind = (back, offset) if self.rewind is None else (min(back, self.rewind[0]),
                                                                       min(offset, self.rewind[1]))

    def drop_below(self, log_start):
        """Retention moved the log start: %TIMER% records below it not learned yet are gone (counted)."""
        self._pass_deleted()
        return []

    def _pass_deleted(self):
        b, first = self._batch, self._store.min_offset(self._topic, 0)
        if first > b.next_offset:
            log.error("timers: records %d..%d were deleted before they were indexed", b.next_offset, first - 1)
            self._pass(b, first - b.next_offset)
            b.next_offset = first

    def checkpoint(self, if_changed=False):
        """timers.db commits with each batch (the service): nothing to do here."""

    def close(self):
        """timers.db is the service's to close."""
