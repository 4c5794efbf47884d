"""``PopService``: per-message acknowledgement (POP, RocketMQ 5's SimpleConsumer model), protocol-neutral
(docs/messaging.md "Per-message acknowledgement (POP)").

What a front-end calls (the text ``receive``/``ack``/``change_invisible``: ``pop/text.py``; a gRPC front-end's
ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue), after its permission check
(consume as the group, subscribe to the topic):

* ``receive(group, topic, max_messages, invisible_ms, fifo=False, max_attempts=None, wait_ms=0)`` ->
  ``[Received]``: up to ``max_messages`` messages of any partition of ``topic``, each with a receipt handle and its
  delivery attempt (1 the first time), invisible to the group's other receives for ``invisible_ms``. Expired ones
  come first, with attempt + 1; one delivered ``max_attempts`` times is copied to ``%DLQ%<group>`` instead
  (``dead_letter``) and counted. Empty when nothing is there; with ``wait_ms``, a long poll first (until a message
  arrives or one in flight expires).
* ``ack(group, topic, handles)`` -> ``[None | InvalidHandle]`` per handle: a handle in flight is acknowledged (the
  message never comes back); a repeated ack is fine; an expired handle, or one of an older delivery, is refused.
* ``change_invisible(group, topic, handle, invisible_ms)`` -> the new handle (the old one no longer acks): the
  message is invisible for ``invisible_ms`` from now; 0 < ``POP_MIN_INVISIBLE_MS`` is refused, so a "nack" asks for
  the minimum.
* ``dead_letter(group, topic, handle)``: the message copied to ``%DLQ%<group>`` now and done
  (ForwardMessageToDeadLetterQueue).
* ``renew(group, topic, entries, deadline)`` -> the entries renewed: deliveries still in flight made invisible
  until ``deadline``, their handles still naming them (auto-renew, ``rmq5/renewer.py``); ``release(group, topic,
  entries, deadline)`` -> the entries moved: deliveries still in flight visible again at ``deadline`` (a client
  that ended; their handles no longer ack).

Every change is one journal record written before the call returns (``pop/follow.py``), applied to the state
(``pop/state.py``) as a replay would; the acknowledgements of one loop turn, from every connection, share one record
per group and topic (``AckBatch``), the callers waiting for the turn's end. Only the master answers
(``PutPath.check_writable``: a slave raises NotMaster naming it); a slave follows the journal and, promoted, has the
state the master had.
"""

import functools
import logging
import random
import time
import zlib
from typing import NamedTuple

import gevent
from gevent.event import AsyncResult, Event

from metaq import errors, limits
from metaq.pop import limits as pop_limits
from metaq.groups import lag as group_lag
from metaq.groups import policy as group_policy
from metaq.pop.follow import POP_JOURNAL, POP_LEARN_BATCH, PopLog, replay
from metaq.pop.records import InvalidHandle, RecordError, handle
from metaq.pop.state import PopState
from metaq.protocol.compression import COMPRESSION_BITS
from metaq.protocol.journaltopic import DLQ_PREFIX
from metaq.protocol.rocketmq.mapping import message_of_record, record_data_from_send, retry_copy
from metaq.clock import now_ms
from metaq.loop.inflate import inflate_body
from metaq.serving.putpath import journal_append
from metaq.store.journals import JournalFollow

log = logging.getLogger(__name__)

__all__ = ["PopService", "Received", "MESSAGE_GROUP"]

#: The property naming a message's FIFO group (RocketMQ 5's message group: ``__SHARDINGKEY``).
MESSAGE_GROUP = "__SHARDINGKEY"
_HOST = ("127.0.0.1", 0)
#: Seconds between two checks whether the journal needs a snapshot for retention's sake (``maintain``).
MAINTAIN_INTERVAL_S = 5.0


class Received(NamedTuple):
    """One message handed out: where it is, its delivery attempt (1 the first time), its receipt handle, its
    invisible deadline (ms since the epoch) and the ``LogRecord`` (``flag``, ``data``, ``msg_id`` ...)."""

    topic: str
    partition: int
    offset: int
    attempt: int
    handle: str
    deadline_ms: int
    record: object


#: ``Received`` made from a tuple of its fields without namedtuple's ``__new__`` (a Python frame a message).
_received_of = functools.partial(tuple.__new__, Received)


class PopService:
    """See the module doc. ``put_path``: the dead letters' appends and the master check; ``is_master``: whether this
    broker starts as the master (a slave's service follows the journal); ``max_attempts``: deliveries before a
    message is dead-lettered; ``waiters``: the partitions' long-poll waiters (``serving/longpoll.py``) a receive with a
    wait parks on."""

    def __init__(self, store, put_path, is_master=True, max_attempts=pop_limits.POP_MAX_ATTEMPTS, make_state=PopState,
                 snapshot_bytes=pop_limits.POP_SNAPSHOT_BYTES, waiters=None):
        self.store, self.path, self.waiters = store, put_path, waiters
        self.max_attempts = max(1, max_attempts)
        self.snapshot_bytes = snapshot_bytes
        self._make = make_state
        self.journal = PopLog(store, journal_append(store))
        self._replay = replay(self.journal, make_state)
        self.journal.snapshots.reset(self._replay.snapshot_at)
        self.follow = JournalFollow(store, POP_JOURNAL, self._learn, self._relearn, self._floor, POP_LEARN_BATCH)
        self.follow.replicating = not is_master
        store.follower.add(self.follow, store.written_position)
        self._acks = AckBatch(self._write_acks)
        self._unjournaled = False  # acks applied whose record was refused or failed (``_write_acks``)
        self._tasks = []

    def start(self):
        self._tasks = [gevent.spawn(self._maintain_loop)]

    def stop(self):
        gevent.killall(self._tasks, block=True, timeout=2.0)

    @property
    def state(self):
        return self._replay.state

    # -- what a front-end asks ---------------------------------------------------

    def receive(self, group, topic, max_messages, invisible_ms, fifo=False, max_attempts=None, wait_ms=0,
                cancel=None, user=None):
        """``max_attempts``: the group's deliveries before a dead letter (a gRPC client's Settings), at least 1;
        None: the broker's (``POP_MAX_ATTEMPTS``); a group with settings (groups/table.py) is refused when its
        consumption is disabled (ConsumptionDisabled) and its ``max_retries`` + 1 replace both.
        ``wait_ms`` (at most ``limits.MAX_WAIT_MS``): with nothing to
        hand out, BLOCKS this greenlet until a message arrives on a partition of the topic or one in flight expires
        (a long poll, counted among the broker's parked gets: 503 past ``max_parked_gets``; and, given its ``user``,
        among the user's: QuotaExceeded past its ``parked_gets`` quota), then ``[]``. ``cancel``: an Event set when
        the caller's request is gone (a gRPC call reset, its connection ended): the long poll ends at once, ``[]``,
        having taken nothing."""
        attempts = self.max_attempts if max_attempts is None else max(1, max_attempts)
        limits.validate_group(group)
        settings = self.store.groups.get(group)
        group_policy.require(settings, group)  # the group's settings: may it consume now (groups/policy.py)
        attempts = group_policy.max_attempts(settings, attempts)
        limits.validate_topic(topic)
        _check_range("max_messages", max_messages, 1, pop_limits.POP_MAX_BATCH)
        _check_range("invisible_ms", invisible_ms, pop_limits.POP_MIN_INVISIBLE_MS, pop_limits.POP_MAX_INVISIBLE_MS)
        _check_range("wait_ms", wait_ms, 0, limits.MAX_WAIT_MS)
        waits = wait_ms and self.waiters is not None
        seen = self._seen(topic) if waits else None  # before the read: an append after it is read at once
        got = self._receive_now(group, topic, max_messages, invisible_ms, fifo, attempts)
        if got or not waits:
            return got
        if not self.waiters.admit(user):
            raise errors.Unavailable("too many parked gets on the broker: the limit is %d" % self.waiters.max_parked)
        try:
            end = time.monotonic() + wait_ms / 1000.0
            while not self.waiters.closed and not (cancel is not None and cancel.is_set()):
                left = end - time.monotonic()
                if left <= 0:
                    return []
                due = self.state.next_deadline(group, topic)
                if due is not None:
                    left = min(left, max(0.005, (due - now_ms()) / 1000.0))
                keys = [(topic, p) for p in range(self.store.partitions_of(topic))]
                self.waiters.wait_any(keys, left, Event(), seen, self.store.max_offset, cancel)
                if cancel is not None and cancel.is_set():
                    return []
                seen = self._seen(topic)
                got = self._receive_now(group, topic, max_messages, invisible_ms, fifo, attempts)
                if got:
                    return got
            return []
        finally:
            self.waiters.leave(user)

    def _seen(self, topic):
        """``{(topic, p): visible end}`` of the topic's partitions, for ``PartitionWaiters.wait_any``'s ``seen``
        (empty for a topic that cannot be read: the receive says why)."""
        try:
            partitions = self.store.partitions_of(topic)
        except errors.MetaqError:
            return {}
        return self.waiters.ends(self.store.max_offset, [(topic, p) for p in range(partitions)])

    def _receive_now(self, group, topic, max_messages, invisible_ms, fifo, attempts):
        self.path.check_writable()
        partitions = self.store.partitions_of(topic)
        if not partitions:
            return []
        now = now_ms()
        fresh = {}  # (p, offset) -> LogRecord read by the plan

        def read(p, offset, count):
            try:
                recs, _next = self.store.read_records(topic, p, offset, count, self.store.config.max_transfer_size)
            except errors.Moved as exc:
                return [], exc.offset
            items = []
            for r in recs:
                fresh[(p, r.queue_offset)] = r
                items.append((r.queue_offset, _message_group(r) if fifo else None))
            return items, None

        plan = self.state.plan(group, topic, partitions, max_messages, invisible_ms, now, attempts, read,
                               lambda p: self._start(group, topic, p), fifo)
        for p, o in plan.dead:
            rec = self._record(topic, p, o)
            if rec is not None:
                self._copy_dead(group, rec, now, attempts)
        self._write(plan.records(group, topic), now)
        out, gone = [], []
        for p, o, attempt, deadline, _g in plan.deliver:
            rec = fresh.get((p, o)) or self._record(topic, p, o)
            if rec is None:  # deleted by retention since its last delivery: nothing to hand out again
                gone.append([p, o])
                continue
            out.append(_received_of((topic, p, o, attempt, handle(p, o, attempt, deadline), deadline, rec)))
        if gone:
            self._write([{"k": "a", "g": group, "t": topic, "e": gone}], now)
        self._maybe_snapshot(now)
        return out

    def ack(self, group, topic, handles, wait=True):
        """``wait`` False: the caller cannot wait for the turn's end (a connection's reader answering in its turn):
        the turn's acknowledgements so far, these included, are written now (``AckBatch.write_now``), so that the
        answer still follows its record into the log."""
        if not 1 <= len(handles) <= pop_limits.POP_MAX_ACK_HANDLES:
            raise errors.ClientError("an ack takes 1..%d receipt handles (limits.POP_MAX_ACK_HANDLES), not %d"
                                     % (pop_limits.POP_MAX_ACK_HANDLES, len(handles)))
        self.path.check_writable()
        now = now_ms()
        results, done = [], []
        for found in self.state.flights(group, topic, handles, now):
            if isinstance(found, InvalidHandle):
                results.append(found)
                continue
            if found[2] is not None:
                done.append([found[0], found[1]])
            results.append(None)
        if done:
            written = self._acks.add(group, topic, done, self.state)
            if not wait:
                self._acks.write_now()
            written.get()  # raises the write's error
        return results

    def change_invisible(self, group, topic, handle_text, invisible_ms):
        _check_range("invisible_ms", invisible_ms, pop_limits.POP_MIN_INVISIBLE_MS, pop_limits.POP_MAX_INVISIBLE_MS)
        self.path.check_writable()
        now = now_ms()
        p, o, f = self.state.flight(group, topic, handle_text, now)
        if f is None:
            raise InvalidHandle("receipt handle %s: the message is acknowledged already" % handle_text)
        deadline = now + invisible_ms
        self._write([{"k": "c", "g": group, "t": topic, "e": [[p, o, deadline]]}], now)
        self._deadlines_moved(topic, [p])
        return handle(p, o, f.attempt, deadline)

    def dead_letter(self, group, topic, handle_text):
        self.path.check_writable()
        now = now_ms()
        p, o, f = self.state.flight(group, topic, handle_text, now)
        if f is None:
            return
        rec = self._record(topic, p, o)
        if rec is not None:
            self._copy_dead(group, rec, now)
        self._write([{"k": "x", "g": group, "t": topic, "e": [[p, o]]}], now)

    def renew(self, group, topic, entries, deadline):
        """``entries`` ``[(partition, offset, attempt, expected)]``: each delivery whose flight is still that
        attempt with deadline ``expected``, not passed (no ack, nack, redelivery or expiry since), is made invisible
        until ``deadline``
        by one ``r`` record (the handle it was delivered with still acks it); returns those renewed, in order.
        Asks the put path's write decision first: a slave or a deposed master writes nothing (NotMaster, or the
        refusal)."""
        return self._move(group, topic, entries, deadline, "r")

    def release(self, group, topic, entries, deadline):
        """As ``renew``'s entries, but each matching delivery is visible again at ``deadline`` (or its own deadline,
        when sooner) by one ``c`` record: its client ended, so its handles no longer ack; returns those moved."""
        return self._move(group, topic, entries, deadline, "c")

    def _move(self, group, topic, entries, deadline, kind):
        self.path.check_writable()
        now = now_ms()
        keep = []
        for p, o, attempt, expected in entries:
            f = self.state.flight_at(group, topic, p, o)
            if f is not None and f.attempt == attempt and f.deadline == expected and expected > now:
                keep.append((p, o, attempt, expected))
        if keep:
            if kind == "r":
                e = [[p, o, a, deadline] for p, o, a, _x in keep]
            else:  # never later than it was
                e = [[p, o, min(deadline, x)] for p, o, _a, x in keep]
            self._write([{"k": kind, "g": group, "t": topic, "e": e}], now)
            self._maybe_snapshot(now)
            if kind == "c":
                self._deadlines_moved(topic, {p for p, _o, _a, _x in keep})
        return keep

    def _deadlines_moved(self, topic, partitions):
        """A message of ``topic`` may be handed out sooner than a waiting receive computed (a nack, a release): wake
        the receives waiting on those partitions so they look at the deadlines again (other waiters there read again
        and wait on)."""
        if self.waiters is not None:
            self.waiters.notify([(topic, p) for p in partitions])

    def rows(self):
        """``(group, topic, in_flight, redelivered, dead_lettered)`` of every pair (``stats pop``)."""
        return self.state.rows()

    def positions(self):
        """Where every POP group is in each partition of its topic (``stats groups``: ``metaq.groups.lag.Position``
        of kind ``pop``): its lowest offset not acknowledged, those acknowledged above it, those in flight; a
        partition it has not received from yet at where its first receive starts (``_start``)."""
        out = []
        for group, topic, cursors in self.state.cursors():
            try:
                partitions = self.store.partitions_of(topic)
            except errors.MetaqError:  # the topic is no longer configured
                continue
            for p in range(partitions):
                low, done, flying = cursors.get(p) or (self._start(group, topic, p), 0, 0)
                out.append(group_lag.Position(group, "pop", topic, p, low, None, flying, done))
        return out

    # -- the role ----------------------------------------------------------------

    def role_changed(self, slave_id):
        """A slave follows the master's journal; a promoted slave has learned every record it holds and answers. A
        master made slave has applied every record it wrote: its follow position moves to the log end (as the
        transactions' and MQTT's do), so a cut below that end relearns the state even when no follower step ran
        since its last records (the cut tail's records would otherwise stay applied); acks it applied and never
        wrote (``_write_acks``) are undone there."""
        if slave_id is not None:
            if not self.follow.replicating:
                self.follow.position = max(self.follow.position, self.store.written_position)
                if self._unjournaled:  # a turn's acks were refused or failed while it led: not in the log
                    self._relearn_unjournaled()
            self.follow.replicating = True
            return
        if self.follow.replicating:
            self.store.follow_now(self.follow)
            self.follow.replicating = False
            self.journal.snapshots.reset(self._replay.snapshot_at)
            log.info("pop: taken over as master: %d group/topic pairs, %d messages in flight",
                     len(self.state.groups), sum(r[2] for r in self.rows()))

    # -- inside ------------------------------------------------------------------

    def _start(self, group, topic, p):
        """Where ``group`` starts on a partition it never received from: its committed offset (a group that
        consumed by offsets goes on from there), else the partition's first offset."""
        first = self.store.min_offset(topic, p)
        committed = self.store.query_offset(group, topic, p)
        return first if committed is None else max(first, committed)

    def _record(self, topic, p, o):
        try:
            recs, _n = self.store.read_records(topic, p, o, 1, 1)
        except errors.Moved:
            return None
        return recs[0] if recs and recs[0].queue_offset == o else None

    def _copy_dead(self, group, rec, now, attempts=None):
        """A copy of ``rec`` in ``%DLQ%<group>`` as a RocketMQ send-back writes one (``RETRY_TOPIC`` the original
        topic, ``ORIGIN_MESSAGE_ID``, the deliveries), so ``metaq-admin dlq list|resend`` sees it."""
        msg = message_of_record(rec, _HOST)
        _dead, props, times = retry_copy(msg, _HOST, 0)
        body = inflate_body(msg.sys_flag, msg.body, self.store.config.max_transfer_size)
        born = "%s:%d" % msg.born_host if msg.born_host != _HOST else None
        flag, data = record_data_from_send(body, props, msg.flag, msg.sys_flag & ~COMPRESSION_BITS,
                                           max(times, attempts or self.max_attempts), born)
        topic = DLQ_PREFIX + group
        r = self.path.append(topic, random.randrange(max(1, self.store.partitions_of(topic))), flag, data, now,
                             born_ms=msg.born_timestamp, internal=True)
        log.info("pop: message %d of %s/%d goes to %s after %d deliveries", rec.queue_offset, rec.topic,
                 rec.partition, topic, attempts or self.max_attempts)
        return r

    def _write_acks(self, batch):
        """A turn's acknowledgements, at its end. The acks were checked writable when made, but the loop turned
        since: the broker may have been deposed (or its lease run out) meanwhile, so the put path's decision is asked
        again right before the write, as a put's is; refused, nothing is written into a log that is no longer a
        master's and every ack of the turn gets the refusal. A write refused or failed leaves acks applied that no
        record holds: a deposed broker's state is rebuilt from its log (now, or at the deposition), so that it
        holds what the log holds when it follows or leads again."""
        now = now_ms()
        try:
            self.path.check_writable()
            self._write_journal([{"k": "a", "g": g, "t": t, "e": e} for (g, t), e in batch.items()], now)
        except errors.MetaqError:
            self._unjournaled = True
            if self.follow.replicating:
                self._relearn_unjournaled()
            raise
        self._maybe_snapshot(now)

    def _relearn_unjournaled(self):
        """The state again from the journal up to the follow position: acks applied but never written are undone."""
        self._unjournaled = False
        self._relearn(self.follow.position)
        log.warning("pop: acknowledgements refused at a deposition were undone: the state is the log's again")

    def _write_journal(self, recs, now):
        for rec in recs:
            self.journal.append(rec, now)

    def _write(self, recs, now):
        for rec in recs:
            self.journal.append(rec, now)
            self.state.apply(rec)

    def _maybe_snapshot(self, now):
        if self.journal.written >= self.snapshot_bytes:
            self._snapshot(now)

    def _snapshot(self, now):
        try:
            self.journal.write_snapshot(self.state, now)
        except RecordError as exc:  # a bug: the bounds keep every record within MAX_RECORD_BYTES
            log.error("pop: snapshot not written: %s", exc)

    def maintain(self):
        """A snapshot when the log grew a segment past the last one while the state holds something (so retention's
        floor follows the log even when few records come), on the master."""
        if self.follow.replicating or not self.state.groups or self.path.writable_refusal() is not None:
            return
        at = self.journal.snapshots.latest  # one written, durable soon: no second one meanwhile
        if at is None or self.store.written_position - at >= self.store.config.segment_size:
            self._snapshot(now_ms())

    def _maintain_loop(self):
        while True:
            gevent.sleep(MAINTAIN_INTERVAL_S)
            try:
                self.maintain()
            except errors.MetaqError as exc:  # a full disk: the next round tries again
                log.warning("pop: snapshot not written: %s", exc)

    def _learn(self, position, _flag, rec):
        self._replay.apply(position, rec)
        at = self._replay.snapshot_at
        if at is not None and at != self.journal.snapshots.latest:  # the master's, complete: the floor once durable
            self.journal.snapshots.written(at, self.store.written_position)

    def _relearn(self, upto):
        self._replay = replay(self.journal, self._make, upto)
        self.journal.snapshots.reset(self._replay.snapshot_at)  # none of the cut tail's snapshots is the floor

    def _floor(self):
        """Retention keeps the log from the last complete snapshot whose end is durable (a slave's: the master's it
        learned, once its copy is flushed), else from the first ``%POP%`` record; nothing when the log holds none (a
        broker that never served a receive)."""
        at = self.journal.snapshots.durable()
        return at if at is not None else self.journal.first_position()


class AckBatch:
    """The acknowledgements of one loop turn, from every connection, written as one record per (group, topic) at the
    end of the turn (``POP_MAX_ACK_HANDLES`` a call, any number of calls a turn). ``add`` applies them to the state at
    once (a receive in the same turn sees them done) and returns what the caller waits on: the turn's write, so
    that an ack is answered once its record is in the log (a kill -9 keeps it). A refused write (the broker deposed
    since the acks were made) or a failed one (a full disk) fails every ack of the turn: their state stays
    acknowledged until a deposition or a restart, which hand them out again (at least once). ``write_now``: the
    turn's record written before its end, for a caller that cannot wait (its callers so far are answered)."""

    def __init__(self, write):
        self._write = write
        self._entries = {}
        self._done = None

    def add(self, group, topic, entries, state):
        state.apply({"k": "a", "g": group, "t": topic, "e": entries})
        self._entries.setdefault((group, topic), []).extend(entries)
        if self._done is None:
            self._done = AsyncResult()
            gevent.get_hub().loop.run_callback(self._flush)
        return self._done

    def write_now(self):
        """The acknowledgements added so far written now, every waiter told; the turn's end writes what comes after."""
        self._flush()

    def _flush(self):
        batch, done = self._entries, self._done
        if done is None:  # written already (``write_now``)
            return
        self._entries, self._done = {}, None
        try:
            self._write(batch)
        except errors.MetaqError as exc:
            done.set_exception(exc)
        except Exception as exc:  # noqa: BLE001 - every waiter is told, the loop goes on
            log.exception("pop: writing a turn's acknowledgements")
            done.set_exception(errors.BrokerError("the acknowledgements were not journaled: %s" % exc))
        else:
            done.set(None)


def _message_group(rec):
    """The record's message group, at most ``POP_MAX_MESSAGE_GROUP_CHARS`` (a longer one: its start and a CRC-32 of
    the whole, so that the journal's records stay bounded)."""
    name = message_of_record(rec, _HOST).properties.get(MESSAGE_GROUP) or None
    if name is not None and len(name) > pop_limits.POP_MAX_MESSAGE_GROUP_CHARS:
        name = "%s~%08x" % (name[:pop_limits.POP_MAX_MESSAGE_GROUP_CHARS - 9], zlib.crc32(name.encode("utf-8")))
    return name


def _check_range(name, value, lo, hi):
    if not lo <= value <= hi:
        raise errors.ClientError("%s must be within %d..%d, not %d" % (name, lo, hi, value))
