"""Delay levels: messages put with a delay level become visible in their topic when their time comes.

Beside the timers of any delivery time (``metaq.timers.service``), whose entry layout (``records.pack_entry``),
placement at a put (``service.place``) it uses, and whose writer (the put path's ``BrokerWrites``: a delivered
record with its entry's id, the wake-ups after it); why the two stay apart: the package's docstring.

The design follows RocketMQ's ScheduleMessageService (docs/messaging.md "Delayed delivery"):

* ``put_delayed`` stores a *schedule entry* (``metaq.timers.levels``: real topic,
  partition, flag, data, due time = store time + the level's delay) in the internal
  topic ``SCHEDULE_TOPIC``, partition ``level - 1``, through the normal store put.
  Every entry of a level has the same delay, so each partition is in due order.
* One greenlet per level reads its partition from its offset, sleeps on a gevent
  timer until the head entry is due (``stop`` wakes it; it never polls), then puts
  the due entries into their real topic and partition through the normal store put,
  **with the entry's message id** (the id the producer was answered with), wakes
  long polls and advances the level's offset. A refused put (disk above the danger
  mark, failed flush) stops the level where it is and retries after ``RETRY_S``.
* Offsets live in the data dir's ``delay_offsets`` state file (CRC-checked, written
  atomically in gevent's thread pool) together with the log position at the moment
  of the snapshot; it is written after each delivery batch, once the delivered
  messages are durable, at most every checkpoint interval otherwise, and at shutdown.

**Exactly once across a crash.** A delivered record carries the entry's message
id, and ids are unique otherwise. At start, for the entries between the saved
offsets and the first one not yet due, the scheduler looks for records with those
ids in the log after the saved position (``store.msg_ids_since``); entries found
there were delivered before the crash and are skipped. So after a kill -9 every
due message is delivered once: neither lost nor duplicated. Without a state file
(first start, or a damaged file) the scan starts at the beginning of the log.

A replication slave never runs the scheduler: it copies the master's log, which
already holds the delivered messages; a slave refuses delayed puts like any put.
"""

import logging

import gevent
from gevent.event import Event
from gevent.lock import Semaphore

from metaq import errors
from metaq.protocol.message import HEADER
from metaq.protocol.stats import DelayLevelRow
from metaq.clock import now_ms
from metaq.timers.levels import (DEFAULT_LEVELS, SCHEDULE_TOPIC, BadScheduleEntry, decode_entry, effective_level,
                                 encode_entry, format_levels, parse_levels)
from metaq.serving.putpath import BrokerWrites
from metaq.timers.service import place

log = logging.getLogger(__name__)

#: RocketMQ's default levels in milliseconds: level 1 = 1 s ... level 18 = 2 h.
DELAY_LEVELS_MS = parse_levels(DEFAULT_LEVELS)

STATE_MAGIC = b"MQDO"
#: Seconds a level waits before trying again after its delivery was refused (disk full, failed flush).
RETRY_S = 1.0
#: Longest wait for a new entry on an empty level (a put wakes it at once; this bounds every wait).
IDLE_WAIT_S = 5.0
#: Longest single sleep until a head entry is due (then the level re-reads its head).
MAX_SLEEP_S = 60.0
#: Bytes of entries read per batch; a batch is delivered without yielding, then saved.
BATCH_BYTES = 256 * 1024


def _entries(views):
    """``(msg_id, ScheduleEntry or None)`` for each MetaQ-form record view; None (logged) for a bad entry."""
    for view in views:
        msg_len, _checksum, msg_id, _flag = HEADER.unpack_from(view, 0)
        try:
            yield msg_id, decode_entry(view[HEADER.size:HEADER.size + msg_len])
        except BadScheduleEntry as exc:
            log.error("delayed delivery: record %d of %s is skipped: %s", msg_id, SCHEDULE_TOPIC, exc)
            yield msg_id, None


class Level:
    """One partition of SCHEDULE_TOPIC: where its delivery stands."""

    def __init__(self, partition, delay_ms, offset):
        self.partition = partition
        self.key = (SCHEDULE_TOPIC, partition)
        self.delay_ms = delay_ms  # None: a level no longer configured (its entries keep their due times)
        self.offset = offset  # the next entry to deliver
        self.head_due = None  # due time of the entry at ``offset`` once read, else None
        self.delivered = 0
        self.greenlet = None


class DelayScheduler:
    """Schedule entries in, due messages out; see the module docstring."""

    def __init__(self, store, config, flusher, waiters, gate, is_master):
        """``gate``: the put path's WriteGate (no delivery while puts are refused); ``is_master``: the
        broker's role at start (``role_changed`` follows it from then on)."""
        self.store = store
        self.flusher = flusher
        self.waiters = waiters
        self.gate = gate
        self.levels_ms = config.delay.levels_ms()
        self.enabled = is_master
        self.started = False  # the broker started: a promotion starts delivering at once
        self.async_flush = config.store.flush == "async"
        self.writes = BrokerWrites(store, waiters, flusher, sync_flush=not self.async_flush)  # what it stores
        self.save_interval_s = config.store.checkpoint_interval_ms / 1000.0
        self._path = self.store.dirs.delay_offsets
        self._pool = gevent.get_hub().threadpool
        self._running = False
        self._stop = Event()
        self._dirty = Event()
        self._saver = None
        self._saved = (None, None)  # (offsets, position) last written
        self._cuts = store.log_cuts  # the log's cuts when the offsets were recovered (``save``)
        self._file = Semaphore()  # a save's write and the cut listener's drop, one at a time
        self._delivery_end = 0  # log end after the last delivered record
        self._already_delivered = set()  # ids found delivered after the saved position (recovery)
        self.redeliveries_skipped = 0
        self.dropped = 0
        self.refusals = 0
        self.levels = {}
        if self.enabled:
            self._recover(now_ms())

    # -- the producer side -----------------------------------------------------

    def put_delayed(self, topic, partition, flag, body, level, now_ms, checksum=None):
        """Schedule ``body`` for ``topic``/``partition`` at ``level``; returns the store's PutResult.

        Level 0: a plain put (its PutResult). Level > 0 (above the last level: the last): the
        PutResult of the schedule entry with ``partition`` replaced by the real partition
        (chosen here when -1): ``msg_id`` is the id the delivered message will carry, ``offset``
        the entry's offset in SCHEDULE_TOPIC (not an offset of ``topic``), ``log_end`` what a
        sync-mode caller waits for. Raises ClientError for a negative level or a put to
        SCHEDULE_TOPIC, the store's errors otherwise; nothing is stored on any error.
        """
        level = effective_level(level, len(self.levels_ms))
        if topic == SCHEDULE_TOPIC:
            raise errors.ClientError("%s is the broker's internal topic for delayed delivery: "
                                     "put to your topic with a delay level instead" % SCHEDULE_TOPIC)
        if not self.enabled:
            raise errors.Unavailable("this broker is a replication slave: delayed puts go to the master")
        if level == 0:
            return self.writes.message(topic, partition, flag, body, now_ms, checksum=checksum)
        partition, checksum = place(self.store, topic, partition, body, checksum)
        data = encode_entry(topic, partition, flag, checksum, now_ms + self.levels_ms[level - 1], now_ms, level,
                            body)
        r = self.writes.journal(SCHEDULE_TOPIC, 0, data, now_ms, partition=level - 1)
        self.writes.written(((SCHEDULE_TOPIC, level - 1),), now_ms)  # wakes the level's greenlet
        return r._replace(partition=partition)

    # -- lifecycle -------------------------------------------------------------

    def start(self):
        self.started = True
        if not self.enabled:
            log.info("delayed delivery: not running on a replication slave (the master delivers)")
            return
        if self._running:
            return
        self._running = True
        self._stop = Event()
        for lv in self.levels.values():
            lv.greenlet = gevent.spawn(self._run_level, lv)
        self._saver = gevent.spawn(self._save_loop)
        log.info("delayed delivery: %d levels (%s), %d messages pending", len(self.levels_ms),
                 format_levels(self.levels_ms), self.pending())

    def stop(self):
        """Stop the levels (a level never stops between a delivery and its offset) and save the offsets."""
        if not self._running:
            return
        self._running = False
        self._stop.set()
        self._dirty.set()
        self.waiters.notify([lv.key for lv in self.levels.values()])
        greenlets = [lv.greenlet for lv in self.levels.values()] + [self._saver]
        gevent.joinall(greenlets, timeout=5.0)
        gevent.killall(greenlets, block=True, timeout=1.0)
        self._save_quietly()

    def role_changed(self, slave_id):
        """Follow the broker's role: a promoted slave starts delivering, a master turned slave stops.

        A promoted slave has no state file of its own (or an old one): recovery then looks for
        the ids of due entries in the log it copied, so what the old master delivered is not
        delivered again.
        """
        master = slave_id is None
        if master == self.enabled:
            return
        if not master:
            self.enabled = False  # first: a role change while stop() yields leaves the levels to it
            self.stop()
            self.levels = {}
            log.info("delayed delivery: stopped (this broker is now a replication slave)")
            return
        self.enabled = True
        self._recover(now_ms())
        if self.started:
            self.start()

    def log_cut(self, report):
        """The epoch handshake cut the log back to ``report.position`` (this broker rejoins as a slave). A state file
        saved past it counts deliveries that went with the cut tail: a later promotion would take its offsets and
        never deliver those entries in this log. Such a file is removed, so that recovery then finds in the log
        itself what was delivered (as a promoted slave without one does). Runs in the thread pool (file I/O), after
        a save's write in progress (a deposition's ``stop``): no offsets of before the cut are written after it."""
        with self._file:
            removed = self._pool.apply(self._drop_state_past, (report.position,))
            self._saved, self._delivery_end = (None, None), 0
        if removed:
            log.warning("delayed delivery: the offsets saved at log position %d are past the cut at %d: removed (a "
                        "promotion finds the deliveries in the log)", removed, report.position)

    def _drop_state_past(self, position):
        """BLOCKING: remove the state file when it was saved past ``position``; returns its position then (else 0)."""
        state = self.store.dirs.read_state(self._path, STATE_MAGIC)
        try:
            saved = int(state.get("position", 0)) if state else 0
        except (TypeError, ValueError, AttributeError):
            saved = position + 1  # malformed: not to be trusted either
        if saved <= position:
            return 0
        self.store.dirs.remove(self._path)
        return saved

    # -- recovery ----------------------------------------------------------------

    def _recover(self, now):
        state = self.store.dirs.read_state(self._path, STATE_MAGIC)
        saved, position = {}, 0
        if state:
            try:
                saved = {int(p): int(o) for p, o in state.get("offsets", {}).items()}
                position = int(state.get("position", 0))
            except (TypeError, ValueError, AttributeError):
                log.warning("delayed delivery: state file %s is malformed; scanning the whole log", self._path)
                saved, position = {}, 0
        parts = set(range(len(self.levels_ms)))
        parts.update(p for t, p in self.store.partition_keys() if t == SCHEDULE_TOPIC)
        for p in sorted(parts):
            low, high = self.store.min_offset(SCHEDULE_TOPIC, p), self.store.max_offset(SCHEDULE_TOPIC, p)
            offset = saved.get(p, low)
            if not low <= offset <= high:
                log.warning("delayed delivery: level %d offset %d is outside %d..%d; using %d",
                            p + 1, offset, low, high, min(max(offset, low), high))
                offset = min(max(offset, low), high)
            delay = self.levels_ms[p] if p < len(self.levels_ms) else None
            self.levels[p] = Level(p, delay, offset)
        self._saved = ({p: lv.offset for p, lv in self.levels.items()}, position)
        self._cuts = self.store.log_cuts
        # an offset moved past an entry found delivered below waits for the log as it is now, never for the end of a
        # delivery of an earlier tenure (a cut may have put that past the end)
        self._delivery_end = self.store.written_position
        candidates = set()
        for lv in self.levels.values():
            candidates.update(self._due_ids(lv, now))
        if candidates:
            if not state:
                log.warning("delayed delivery: no state file: scanning the log for deliveries made before")
            self._already_delivered = self.store.msg_ids_since(position, skip_topic=SCHEDULE_TOPIC,
                                                               among=candidates)
            log.info("delayed delivery recovery: %d due entries; %d of them were delivered before the restart "
                     "and will not be delivered again", len(candidates), len(self._already_delivered))

    def _due_ids(self, lv, now):
        """Ids of the level's entries from its offset that were due by ``now`` (they may be delivered already)."""
        ids, offset = [], lv.offset
        while True:
            views = self._read(lv, offset)
            if not views:
                return ids
            for msg_id, entry in _entries(views):
                if entry is not None and entry.due_ms > now:
                    return ids
                ids.append(msg_id)
            offset += len(views)

    # -- the level loop ----------------------------------------------------------

    def _read(self, lv, offset):
        try:
            return self._read_verified(lv, offset)
        except errors.Moved as exc:  # retention deleted entries below the offset
            if exc.offset > offset:
                log.error("delayed delivery: level %d entries %d..%d were deleted by retention before their "
                          "delivery", lv.partition + 1, offset, exc.offset - 1)
                self.dropped += exc.offset - offset
                lv.offset = exc.offset
            return []

    def _read_verified(self, lv, offset):
        """The level's entries from ``offset``; a corrupt entry at the level's head is dropped, with a log line
        (it cannot be delivered: the store never serves it), and the level goes on past it."""
        while True:
            try:
                return self.store.read(SCHEDULE_TOPIC, lv.partition, offset, BATCH_BYTES).views
            except errors.CorruptRecord as exc:
                if offset != lv.offset:
                    return []  # a recovery scan ahead of the head: stop there
                log.error("delayed delivery: level %d entry %d is corrupt and is dropped", lv.partition + 1, offset)
                self.dropped += 1
                offset = lv.offset = exc.next_offset

    def _run_level(self, lv):
        while self._running:
            try:
                self._level_step(lv)
            except Exception:  # noqa: BLE001 - a level must never stop silently
                log.exception("delayed delivery: level %d failed; retrying in %.0f s", lv.partition + 1, RETRY_S)
                self._stop.wait(RETRY_S)

    def _level_step(self, lv):
        """Wait for the head entry (or a refusal to end), or deliver what is due."""
        if self.gate.refusal is not None:  # disk above the danger mark, or a failed flush
            self._stop.wait(RETRY_S)
            return
        views = self._read(lv, lv.offset)
        if not views:
            lv.head_due = None
            self.waiters.wait(lv.key, IDLE_WAIT_S)  # a put or a flush of this level wakes it
            return
        now = now_ms()
        _msg_id, head = next(_entries(views[:1]))
        if head is not None:
            lv.head_due = head.due_ms
            if head.due_ms > now:
                self._stop.wait(min((head.due_ms - now) / 1000.0, MAX_SLEEP_S))
                return
        if not self._deliver(lv, views, now):
            self.refusals += 1
            self._stop.wait(RETRY_S)
        gevent.sleep(0)  # other requests run between batches

    def _deliver(self, lv, views, now):
        """Put the due entries of ``views`` into their topics; False when the store refused one (retry later)."""
        keys = set()
        refused = False
        for msg_id, e in _entries(views):
            if e is None:  # not an entry: nothing to deliver
                self.dropped += 1
                lv.offset += 1
                continue
            if e.due_ms > now:
                break
            if msg_id in self._already_delivered:
                self._already_delivered.discard(msg_id)
                self.redeliveries_skipped += 1
                lv.offset += 1
                continue
            try:
                r = self.writes.message(e.topic, e.partition, e.flag, e.data, now, e.born_ms, e.checksum, msg_id)
            except errors.Unavailable as exc:  # DiskFull: stay on this entry
                log.warning("delayed delivery: level %d waits: %s", lv.partition + 1, exc)
                refused = True
                break
            except errors.ClientError as exc:  # the topic or partition is no longer configured
                log.error("delayed delivery: dropped message %d for %s-%d: %s", msg_id, e.topic, e.partition, exc)
                self.dropped += 1
                lv.offset += 1
                continue
            except errors.MetaqError as exc:
                log.error("delayed delivery: level %d waits after a store error: %s", lv.partition + 1, exc)
                refused = True
                break
            lv.offset += 1  # no yield since the put: the offset never lags a delivery
            lv.delivered += 1
            keys.add((e.topic, r.partition))
            self._delivery_end = r.log_end
        lv.head_due = None
        if keys:
            self._published(keys, now)
        return not refused

    def _published(self, keys, now):
        self._dirty.set()
        self.writes.written(keys, now)

    # -- the state file ----------------------------------------------------------

    def _save_loop(self):
        while self._running:
            self._dirty.wait(self.save_interval_s)
            self._dirty.clear()
            if self._running:
                self._save_quietly()

    def _save_quietly(self):
        try:
            self.save()
        except (OSError, errors.MetaqError) as exc:
            log.error("delayed delivery: could not save the level offsets (a restart will check the log): %s",
                      exc)

    def save(self):
        """Write offsets + log position if they changed; deliveries are made durable first. True if written.

        Nothing once the log was cut since the offsets were recovered (a deposed master's handshake, which may land
        while its ``stop`` saves): they may count deliveries that went with the cut tail, and ``log_cut`` decided
        the file (a promotion then finds the deliveries in the log)."""
        offsets = {p: lv.offset for p, lv in self.levels.items()}
        position = self.store.written_position
        old_offsets, old_position = self._saved
        if offsets == old_offsets and (position == old_position or not self._in_use()):
            return False
        if offsets != old_offsets:  # never record an offset whose delivery could still be lost
            self.flusher.wait_flushed(self._delivery_end)
        state = {"position": position, "offsets": {str(p): o for p, o in offsets.items()},
                 "levels": format_levels(self.levels_ms)}
        with self._file:
            if self.store.log_cuts != self._cuts:
                log.warning("delayed delivery: the offsets are not saved: the log was cut back since they were "
                            "read (the deliveries are found in the log at the next promotion)")
                return False
            self._pool.apply(self.store.dirs.write_state, (self._path, STATE_MAGIC, state))
        self._saved = (offsets, position)
        return True

    def _in_use(self):
        return any(self.store.max_offset(SCHEDULE_TOPIC, p) for p in self.levels)

    # -- stats -------------------------------------------------------------------

    def pending(self):
        return sum(self.pending_of(lv) for lv in self.levels.values())

    def pending_of(self, lv):
        return max(0, self.store.max_offset(SCHEDULE_TOPIC, lv.partition) - lv.offset)

    def delivered(self):
        return sum(lv.delivered for lv in self.levels.values())

    def summary_values(self):
        """The ``stats`` summary's ``(key, value)`` pairs of delayed delivery."""
        return [("delay_levels", len(self.levels_ms)),
                ("delay_scheduler", "running" if self._running else "off" if not self.enabled else "stopped"),
                ("delay_pending", self.pending()),
                ("delay_delivered", self.delivered())]

    def level_rows(self):
        """``stats delay``: ``([DelayLevelRow] per level, the totals as (key, value) pairs)``."""
        rows = []
        for p, lv in sorted(self.levels.items()):
            delay = format_levels((lv.delay_ms,)) if lv.delay_ms else "removed"
            due = lv.head_due if lv.head_due is not None and self.pending_of(lv) else None
            rows.append(DelayLevelRow(p + 1, delay, self.pending_of(lv), due, lv.delivered))
        totals = [("redeliveries_skipped", self.redeliveries_skipped), ("dropped", self.dropped),
                  ("refused_rounds", self.refusals)]
        return rows, totals
