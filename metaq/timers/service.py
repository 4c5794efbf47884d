"""Any delivery time: the timer store's service (docs/messaging.md "Delayed delivery", "Any delivery time", "Cancel").

* ``put_at`` stores an ENTRY record (``metaq.timers.records``: real topic, partition, flag, checksum, due and
  born times, the original data) in the internal topic ``TIMER_TOPIC``, partition 0, through the put path
  (``PutPath.append`` asks, ``BrokerWrites`` writes; durability, flushes and replication are a put's). Its record
  id is the message's id: the producer is answered with it and the delivered message carries it.
* The **indexer** (master and slave): timers.db (``metaq.timers.index``) follows the log through the store's log
  follower, as every derived index does: its subscriber (``metaq.timers.follow``) collects the flushed TIMER_TOPIC
  records past timers.db's ``indexed_position`` into a bounded pending batch, on the event loop; this service
  waits for a batch, applies it in its thread with the position it covers (one SQLite transaction) and lets the
  follower go on. On a master, what this broker itself appends to TIMER_TOPIC (entries, cancels, DONE records;
  ``written``) is kept decoded, at most ``MAX_TIMER_FRESH``, and taken from there, not decoded again: the same
  records, the same durability rule (learned once flushed). Cuts reach the subscriber through the follower
  (the batch dropped, timers.db rewound); a demotion drops what is kept.
* The **delivery** greenlet (master only) keeps a window of the rows due within ``TIMER_WINDOW_MS`` (at most
  ``MAX_TIMER_WINDOW_ROWS``), sleeps until the head is due, then puts the due messages into their topics with
  their ids and, in the same loop turn (no yield), appends one DONE record listing them. The ids it ended
  (delivered or cancelled) stay in memory (``_ended``) until long after the index knows them, so a window
  load never delivers one twice.
* **Exactly once after kill -9**: at start and at promotion the indexer first catches up; the due rows are
  the candidates, and those whose id is in the log after ``scan_from`` (a position before which every
  delivery's DONE is durable) were delivered before the crash: they get a DONE record, not a second delivery.
* **Quotas**: a timed put counts against the broker-wide ``limits.max_pending_timers`` (answered 503 past it) and
  its user's ``timers`` quota (docs/security.md "Quotas"); the user is kept in its entry (an OWNED record), so a
  slave, a rebuild and a promoted slave count the same. What a user holds is timers.db's count of its pending
  rows (``TimerIndex.held``) and its entries written and not indexed yet (``_unindexed``).
* **Cancel** is decided in the loop, against the same state the delivery reads: exactly one of them wins.
* **Retention** keeps every segment from the first TIMER_TOPIC record timers.db has not committed (the
  subscriber's ``retention_floor``, the follower's floor); once committed, a message lives in timers.db, so a
  message due in a year does not pin the log.

Every SQLite call goes through one dedicated thread (``ThreadPool(1)``): never on the event loop.
"""

import logging
import random
import time
from collections import OrderedDict

import gevent
from gevent.event import Event
from gevent.threadpool import ThreadPool

from metaq import errors
from metaq.limits import validate_partition
from metaq.timers.limits import (MAX_PENDING_TIMERS, MAX_TIMER_DONE_IDS, MAX_TIMER_LIST, MAX_TIMER_OUTCOMES,
                                 MAX_TIMER_WINDOW_ROWS, TIMER_INDEX_INTERVAL_MS, TIMER_SCAN_FROM_INTERVAL_S,
                                 TIMER_WINDOW_MS)
from metaq.protocol.checksum import metaq_checksum
from metaq.clock import now_ms
from metaq.loop.coldpages import bring_in
from metaq.serving.putpath import BrokerWrites
from metaq.timers.follow import TimerFollow
from metaq.timers.handoff import Handoff
from metaq.timers.index import CANCELLED, DELIVERED, TimerIndex
from metaq.timers.records import (TIMER_TOPIC, TimerCancel, TimerDone, TimerEntry, encode_cancel, encode_done,
                                  encode_entry)
from metaq.timers.window import DeliveryWindow

log = logging.getLogger(__name__)

KEY = (TIMER_TOPIC, 0)
_TOPIC_LEN = len(TIMER_TOPIC.encode("utf-8"))
#: Seconds the delivery waits after a refused put (disk full, failed flush) before trying again.
RETRY_S = 1.0
#: Longest wait of the indexer for a batch (the subscriber wakes it at once; this bounds every wait).
IDLE_WAIT_S = 5.0
UNKNOWN = "unknown"
#: Longest wait of a cancel for the indexer to reach the log's end (an id put just before must not be "unknown").
CANCEL_INDEX_WAIT_S = 5.0


def place(store, topic, partition, body, checksum):
    """Where a message kept for later delivery goes, a timer's or a delay level's, decided when it is put:
    ``(partition, checksum)``, the partition given (checked) or, for -1, one at random; the topic's limits asked now
    (a topic limit refuses the put, not its delivery); the body's checksum when none is given (None or < 0).
    Raises ClientError / the store's errors."""
    count = store.partitions_of(topic)
    if partition == -1:
        partition = random.randrange(count)
    else:
        validate_partition(partition, count)
    store.check_creatable(topic, partition)
    if checksum is None or checksum < 0:
        checksum = metaq_checksum(body)
    return partition, checksum


class TimerService:
    """See the module docstring."""

    def __init__(self, store, flusher, waiters, gate, is_master, async_flush, max_pending=MAX_PENDING_TIMERS,
                 quota=None):
        """``max_pending``: the broker-wide bound of pending timed messages; ``quota(user, held, more)``: the
        ``timers`` quota decision (raises QuotaExceeded), None: none."""
        self.store = store
        self.max_pending = max_pending
        self.quota = quota
        self._unindexed = {}  # owner (None: none) -> its entries this master wrote that timers.db has not applied
        self.flusher = flusher
        self.waiters = waiters
        self.writes = BrokerWrites(store, waiters, flusher, sync_flush=not async_flush)  # every record it writes
        self.gate = gate
        self.enabled = is_master
        self.async_flush = async_flush
        self.started = False
        self._pool = ThreadPool(1)
        self.index = self._call(TimerIndex, store.dirs.root)
        self.pending = self._call(self.index.count)  # kept up to date by the indexer
        self._running = False
        self._delivering = False
        self._recovered = Event()  # this master's recovery check is done: a cancel may be decided
        self._stop = Event()
        self._wake = Event()  # the delivery loop: a put or an index batch landed in its window, a stop
        self._indexed = Event()  # set after each index batch
        self._indexer = self._deliverer = None
        self._win = DeliveryWindow()  # the rows due soonest (timers/window.py)
        self._loading = None  # entries indexed while a window load runs
        self._extending = None  # the greenlet loading the window's next rows while delivery goes on
        self._extension = None  # entries indexed while it runs
        self._all_ended = False
        self._ended = OrderedDict()  # msg_id -> DELIVERED | CANCELLED, ended by this process (bounded)
        self._done_end = 0  # end position of the last DONE record appended
        self._scan_from_next = 0.0  # monotonic time before which scan_from is not recorded again
        self._fresh = Handoff(len(TIMER_TOPIC.encode("utf-8")))  # what this master appended, not indexed yet
        self._batch_ready = Event()  # the subscriber's batch has records
        self.follow = TimerFollow(store, TIMER_TOPIC, self._fresh, self._batch_ready.set)  # timers/follow.py
        self.follow.open(self.index.indexed_position, self.index.indexed_offset)
        store.follower.add(self.follow, store.written_position)
        self.delivered = 0
        self.cancelled = 0
        self.redeliveries_skipped = 0
        self.dropped = 0
        self.window_loads = 0
        self.window_extensions = 0

    def _call(self, fn, *args):
        """``fn(*args)`` in the timer thread (every SQLite call goes there)."""
        return self._pool.apply(fn, args)

    # -- producers ---------------------------------------------------------------

    def put_at(self, topic, partition, flag, body, due_ms, now, checksum=None, owner=None):
        """Schedule ``body`` for ``topic``/``partition`` at ``due_ms`` (already validated: ``parse_when``) for user
        ``owner`` (None: none); returns the ENTRY's PutResult with the real partition. Raises ClientError,
        QuotaExceeded, Unavailable past ``max_pending`` / the store's errors; nothing stored."""
        if not self.enabled:
            raise errors.Unavailable("this broker is a replication slave: timer puts go to the master")
        self.check_room(owner, 1)
        partition, checksum = place(self.store, topic, partition, body, checksum)
        data = encode_entry(topic, partition, flag, checksum, due_ms, now, body, owner)
        r = self.writes.journal(TIMER_TOPIC, 0, data, now)
        self.written(r.offset, r.msg_id, TimerEntry(topic, partition, flag, checksum, due_ms, now, bytes(body), owner),
                     r.log_end)
        self.count_written(owner, 1)
        self.writes.written((KEY,), now)
        return r._replace(partition=partition)

    def cancel(self, msg_id, now):
        """``(outcome, PutResult or None)``: ``"cancelled"`` with the CANCEL record's result (answer once it is
        durable), or ``"delivered"``, ``"cancelled"`` (before) or ``"unknown"`` with None."""
        if not self.enabled:
            raise errors.Unavailable("this broker is a replication slave: cancel on the master")
        if not self._recovered.wait(CANCEL_INDEX_WAIT_S):  # a delivery a crash left without its DONE is known first
            raise errors.Unavailable("the timer store is still checking the log after a start or a promotion; try "
                                     "again")
        done = self._ended.get(msg_id)
        if done is not None:
            return done, None
        if self._win.index_of(msg_id) is None:
            row = self._call(self.index.get, msg_id)
            if row is None and self._call(self.index.outcome, msg_id) is None and self._ended.get(msg_id) is None:
                self._wait_indexed(self.store.max_offset(TIMER_TOPIC, 0))  # a put just answered may not be indexed
                row = self._call(self.index.get, msg_id) if self._win.index_of(msg_id) is None else True
            if row is None:
                done = self._ended.get(msg_id) or self._call(self.index.outcome, msg_id)
                return (done or UNKNOWN), None
            done = self._ended.get(msg_id)  # the pool call yielded: look again
            if done is not None:
                return done, None
        return CANCELLED, self._append_cancel(msg_id, now)

    def owner_of(self, msg_id):
        """``(pending, owner)``: whether timed message ``msg_id`` waits for its time and the user whose put
        scheduled it (None: no one's), read in the timer thread from timers.db (a put just answered is indexed
        first, bounded by ``CANCEL_INDEX_WAIT_S``). Lets its owner, not only an administrator, recall it."""
        found = self._call(self.index.owner_of, msg_id)
        if not found[0] and self._ended.get(msg_id) is None:
            self._wait_indexed(self.store.max_offset(TIMER_TOPIC, 0))
            found = self._call(self.index.owner_of, msg_id)
        return found

    def _wait_indexed(self, offset, timeout=CANCEL_INDEX_WAIT_S):
        """Wait (bounded) until the indexer has indexed the timer topic up to ``offset``."""
        deadline = time.monotonic() + timeout
        while self.index.indexed_offset < offset and time.monotonic() < deadline and self._running:
            self.flusher.wake_index()
            self._indexed.wait(max(0.0, min(1.0, deadline - time.monotonic())))

    def _append_cancel(self, msg_id, now):
        """No yield from the caller's last check to here: the cancel wins."""
        i = self._win.index_of(msg_id)
        if i is not None:
            self._win.remove_at(i)
        r = self.writes.journal(TIMER_TOPIC, 0, encode_cancel(msg_id), now)
        self.written(r.offset, r.msg_id, TimerCancel(msg_id), r.log_end)
        self._end(msg_id, CANCELLED)
        self.cancelled += 1
        self.writes.written((KEY,), now)
        return r

    def _end(self, msg_id, outcome):
        self._ended[msg_id] = outcome
        while len(self._ended) > MAX_TIMER_OUTCOMES:
            self._ended.popitem(last=False)

    def written(self, offset, msg_id, rec, log_end):
        """This master appended ``rec`` (a TimerEntry, TimerCancel or TimerDone) to TIMER_TOPIC at ``offset`` as
        message ``msg_id``, its record ending at ``log_end``: handed to the indexer. The caller has not yielded
        since the append, so what is handed over is in log order."""
        self._fresh.add(offset, msg_id, rec, log_end)

    def check_room(self, owner, more):
        """Raise unless ``more`` timed messages of ``owner`` may be scheduled now: Unavailable past the broker-wide
        ``max_pending``, QuotaExceeded past the user's ``timers`` quota. The one decision of every timed put."""
        held = self.pending + sum(self._unindexed.values())
        if held + more > self.max_pending:
            raise errors.Unavailable("the broker holds %d pending timed messages: the limit is %d "
                                     "(limits.max_pending_timers); try again once some are delivered"
                                     % (held, self.max_pending))
        if owner is not None and self.quota is not None:
            self.quota(owner, self.index.held.get(owner, 0) + self._unindexed.get(owner, 0), more)

    def count_written(self, owner, n):
        """``n`` entries of ``owner`` were appended (not yet in timers.db): counted until the indexer applies them."""
        self._unindexed[owner] = self._unindexed.get(owner, 0) + n

    def held(self):
        """``{user: pending timed messages}`` (stats quotas)."""
        out = dict(self.index.held)
        for owner, n in self._unindexed.items():
            if owner is not None and n:
                out[owner] = out.get(owner, 0) + n
        return out

    def written_run(self, first_offset, first_id, recs, sizes, log_end):
        """``written`` for a burst's run (``Handoff.add_run``)."""
        self._fresh.add_run(first_offset, first_id, recs, sizes, log_end)

    def list(self, topic=None, limit=MAX_TIMER_LIST):
        """Pending timers ``[(msg_id, due_ms, topic, partition, size)]`` by due time, at most MAX_TIMER_LIST."""
        rows = self._call(self.index.list, topic, min(limit, MAX_TIMER_LIST) + len(self._ended))
        return [r for r in rows if r[0] not in self._ended][:min(limit, MAX_TIMER_LIST)]

    # -- lifecycle -----------------------------------------------------------------

    def start(self):
        self.started = True
        if self._running:
            return
        self._running = True
        self._stop = Event()
        self._indexer = gevent.spawn(self._index_loop)
        if self.enabled:
            self._start_delivery()

    def _start_delivery(self):
        self._delivering = True
        self._recovered.clear()
        self._deliverer = gevent.spawn(self._delivery_loop)

    def stop(self):
        if not self._running:
            return
        self._running = False
        self._delivering = False
        self._stop.set()
        self._wake.set()
        self._batch_ready.set()
        greenlets = [g for g in (self._indexer, self._deliverer, self._extending) if g is not None]
        gevent.joinall(greenlets, timeout=5.0)
        gevent.killall(greenlets, block=True, timeout=1.0)
        self._deliverer = None
        self.store.follower.remove(self.follow)
        self._call(self.index.close)
        self._pool.kill()

    def role_changed(self, slave_id):
        """A promoted slave starts delivering (after the recovery check), a master turned slave stops."""
        master = slave_id is None
        if master == self.enabled:
            return
        self.enabled = master
        if not master:
            self._fresh.clear()  # a slave's log follows its master's: what this one wrote may be cut
            self._unindexed.clear()  # counted from timers.db alone, as its master's follow
            self._delivering = False
            self._wake.set()
            log.info("timers: delivery stopped (this broker is now a replication slave)")
        elif self._running:
            if self._deliverer is not None:
                self._deliverer.kill(block=False)  # an old loop (demoted, then promoted again) never runs beside
            self._win.reset()
            self._start_delivery()

    # -- the indexer ---------------------------------------------------------------

    def _index_loop(self):
        self.flusher.wake_index()  # the follower brings the subscriber to the log's end
        while self._running:
            try:
                started = time.monotonic()
                self._batch_ready.clear()
                if not self._index_step():
                    self._batch_ready.wait(IDLE_WAIT_S)
                else:  # at most one transaction (one fsync) per TIMER_INDEX_INTERVAL_MS: a burst is one batch
                    rest = TIMER_INDEX_INTERVAL_MS / 1000.0 - (time.monotonic() - started)
                    if rest > 0:
                        self._stop.wait(rest)
            except Exception:  # noqa: BLE001 - the indexer must never stop silently
                log.exception("timers: indexing failed; retrying in %.0f s", RETRY_S)
                self._stop.wait(RETRY_S)

    def _index_step(self):
        """Apply the subscriber's batch (after a rewind a cut asked for); False when it has no records (now)."""
        to = self.follow.rewind
        if to is not None:  # here, after any batch being applied when the cut came
            self._call(self.index.rewind, to[1], to[0])
            self.follow.rewound(to)
        if not self.follow.pending():
            return False
        batch = self.follow.take()
        try:
            added, ended = self._call(self.index.apply, batch.records, batch.next_offset, now_ms(), batch.done_end,
                                      batch.position)
        except BaseException:
            self.follow.relearn()  # from what timers.db holds
            raise
        finally:
            self.flusher.wake_index()  # the batch has room again
        self.follow.applied(batch)
        self.pending += added - len(ended)
        unindexed = self._unindexed
        if unindexed:
            for _msg_id, entry in batch.entries:  # now in timers.db's counts
                n = unindexed.get(entry.owner)
                if n is not None:
                    if n > 1:
                        unindexed[entry.owner] = n - 1
                    else:
                        del unindexed[entry.owner]
        self._add_to_window(batch.entries)
        self._indexed.set()
        self._indexed = Event()
        return True

    def _add_to_window(self, entries):
        """Newly indexed entries due within the loaded window join it (the window loader sees the rest)."""
        if self._loading is not None:
            self._loading.extend(entries)  # a window load is under way: merged when it ends
        if self._extension is not None:
            self._extension.extend(entries)
        if self._win.add(entries, self._ended):
            self._wake.set()

    def catch_up(self):
        """Wait for the indexer to index the log up to its end (start, promotion)."""
        while self._running and self.store.max_offset(TIMER_TOPIC, 0) > self.index.indexed_offset:
            self._wait_indexed(self.store.max_offset(TIMER_TOPIC, 0))

    # -- delivery ------------------------------------------------------------------

    def _delivery_loop(self):
        while True:
            if not (self._running and self._delivering):
                return
            try:
                self.catch_up()
                self._recover(now_ms())
                break
            except Exception:  # noqa: BLE001 - delivery must never stop silently
                log.exception("timers: the recovery check failed; retrying in %.0f s", RETRY_S)
                self._stop.wait(RETRY_S)
        self._recovered.set()
        while self._running and self._delivering:
            try:
                self._delivery_step()
            except Exception:  # noqa: BLE001 - delivery must never stop silently
                log.exception("timers: delivery failed; retrying in %.0f s", RETRY_S)
                self._win.until = None
                self._stop.wait(RETRY_S)

    def _recover(self, now):
        """The due rows whose id is in the log after ``scan_from`` were delivered before a crash: DONE, not again.
        Every due row is checked, a page of MAX_TIMER_WINDOW_ROWS at a time (a crash may leave more deliveries
        without their DONE than one window holds)."""
        checked = skipped = 0
        after = None
        while True:
            page = self._call(self.index.due_ids, now, MAX_TIMER_WINDOW_ROWS, after)
            if not page:
                break
            checked += len(page)
            skipped += self._skip_delivered({row[1] for row in page}, now)
            if len(page) < MAX_TIMER_WINDOW_ROWS:
                break
            after = page[-1]
        if checked:
            log.info("timers recovery: %d due messages; %d of them were delivered before the restart and will not "
                     "be delivered again", checked, skipped)

    def _skip_delivered(self, candidates, now):
        """Those of ``candidates`` (ids) found in the log after ``scan_from`` get a DONE record; how many."""
        scan = self.store.msg_ids_since(self.index.scan_from, skip_topic=TIMER_TOPIC, among=candidates,
                                        stepwise=True)
        while not scan.done:  # a step (ID_SCAN_STEP_BYTES) at a time, its cold pages brought in off the loop
            need = scan.need()
            if need is not None:
                bring_in((need,))
            scan.step()
            gevent.sleep(0)
        found = scan.found
        if found:
            ids = sorted(found)
            for i in range(0, len(ids), MAX_TIMER_DONE_IDS):
                r = self.writes.journal(TIMER_TOPIC, 0, encode_done(ids[i:i + MAX_TIMER_DONE_IDS]), now)
                self.written(r.offset, r.msg_id, TimerDone(tuple(ids[i:i + MAX_TIMER_DONE_IDS])), r.log_end)
                self._done_end = r.log_end
            for i in ids:
                self._end(i, DELIVERED)
            self.redeliveries_skipped += len(ids)
            self.flusher.wake()
        return len(found)

    def _load_window(self, now):
        until = now + TIMER_WINDOW_MS
        self._loading = []
        try:
            rows, cut_due = self._call(self.index.window_rows, None, until, self._win.max_rows, self._win.max_bytes)
        finally:
            added, self._loading = self._loading, None
        self._all_ended, loaded = self._win.load(rows, cut_due, until, now, self._ended)
        self.window_loads += 1
        self._add_to_window([(i, e) for i, e in added if i not in loaded])

    def _extend_window(self, start, now):
        """Load the rows due from ``start`` (the window's end: it was cut by a bound) while delivery goes on from the
        rows loaded, and append them: a busy window is never left empty for a load (a load of 10,000 rows takes tens
        of ms, every message due meanwhile would be late). Dropped if the window changed its end meanwhile."""
        until = now + TIMER_WINDOW_MS
        rows_room, bytes_room = self._win.room()
        self._extension = []
        try:
            rows, cut_due = self._call(self.index.window_rows, start, until, rows_room, bytes_room)
        finally:
            added, self._extension = self._extension, None
            self._extending = None
        loaded = self._win.extend(start, rows, cut_due, until, now, self._ended)
        if loaded is None:
            return
        self.window_extensions += 1
        self._add_to_window([(i, e) for i, e in added if i not in loaded and e.due_ms >= start])
        self._wake.set()

    def _delivery_step(self):
        if self.gate.refusal is not None:
            self._stop.wait(RETRY_S)
            return
        now = now_ms()
        win = self._win
        if win.until is None or (not win.items and now >= win.until - TIMER_WINDOW_MS // 2):
            self._load_window(now)
        elif win.cut and self._extending is None and len(win) < win.max_rows // 2 and win.nbytes < win.max_bytes // 2:
            self._extending = gevent.spawn(self._extend_window, win.until, now)
        self._record_scan_from()
        if not win.items and self._all_ended:  # wait for the index to learn what was delivered, not spin
            self._all_ended = False
            self._wait_indexed(self.index.indexed_offset + 1, timeout=1.0)
            win.until = None
            return
        if not win.items:
            self._wake.clear()
            self._wake.wait(max(0.0, (win.until - now) / 1000.0 / 2))
            return
        due = win.items[0][0]
        if due > now:
            self._wake.clear()
            self._wake.wait((due - now) / 1000.0)
            return
        self._deliver(now)
        gevent.sleep(0)

    def _deliver(self, now):
        """Put the due rows (at most MAX_TIMER_DONE_IDS) into their topics and append their DONE: no yield."""
        ids, keys, refused = [], set(), False
        items = self._win.items
        while items and items[0][0] <= now and len(ids) < MAX_TIMER_DONE_IDS:
            _due, msg_id, row = items[0]
            _id, _due, topic, partition, flag, checksum, born_ms, data = row
            try:
                r = self.writes.message(topic, partition, flag, data, now, born_ms, checksum, msg_id)
            except errors.ClientError as exc:  # the topic or partition is gone: it will never be deliverable
                log.error("timers: dropped message %d for %s-%d: %s", msg_id, topic, partition, exc)
                self.dropped += 1
            except errors.MetaqError as exc:  # a full disk, a store error: stay on it and try later
                log.warning("timers: delivery waits: %s", exc)
                refused = True
                break
            else:
                keys.add((topic, r.partition))
                self.delivered += 1
            self._win.remove_at(0)
            ids.append(msg_id)
            self._end(msg_id, DELIVERED)
        if ids:
            r = self.writes.journal(TIMER_TOPIC, 0, encode_done(ids), now)
            self.written(r.offset, r.msg_id, TimerDone(tuple(ids)), r.log_end)
            self._done_end = r.log_end
            keys.add(KEY)
            self.writes.written(keys, now)  # after the DONE: the wake may yield
        if refused:
            self._stop.wait(RETRY_S)

    def _record_scan_from(self):
        """Every delivery before the flushed position has its DONE durable once the last DONE is: record it (at
        most once a TIMER_SCAN_FROM_INTERVAL_S: each is an SQLite transaction, an fsync; indexing a DONE moves it
        too)."""
        flushed = self.store.flushed_position
        now = time.monotonic()
        if flushed >= self._done_end and flushed > self.index.scan_from and now >= self._scan_from_next:
            self._scan_from_next = now + TIMER_SCAN_FROM_INTERVAL_S
            self._call(self.index.set_scan_from, flushed)

    # -- stats ---------------------------------------------------------------------

    def summary_values(self):
        """The ``stats`` summary's ``(key, value)`` pairs of the timers."""
        return [("timers_pending", self.pending), ("timers_delivered", self.delivered),
                ("timers_cancelled", self.cancelled), ("timers_redeliveries_skipped", self.redeliveries_skipped),
                ("timers_dropped", self.dropped + self.follow.dropped), ("timers_indexed_direct", self._fresh.taken),
                ("timers_window_loads", self.window_loads), ("timers_window_extensions", self.window_extensions)]
