"""The put path both protocols share: refusals, the append, stats and registration, durability.

``append`` stores one message or raises a MetaqError (the caller's dispatcher
turns it into its protocol's reply). What must happen before the producer may
be acknowledged depends on the broker's modes:

* ``sync`` flush: the record must be fsynced (the flusher makes it visible and
  wakes long polls);
* ``async`` flush: it is visible at once; long polls are woken here and the
  flusher is woken when its policy says so;
* ``sync`` replication: a slave must also have it.

``durable`` does all of that from a greenlet of the request's own (it blocks);
the text server instead batches the flush waits of a burst (``ack_mode``).
"""

import logging

from metaq import errors
from metaq.auth.acl import PUB
from metaq.protocol.journaltopic import SCHEDULE_TOPIC, is_journal, journal_refusal
from metaq.protocol.leveltopic import is_level_topic, level_refusal, level_topic

log = logging.getLogger(__name__)

#: ack_mode results: reply now / reply once flushed up to log_end / reply from a greenlet after ``durable``.
ACK_NOW, ACK_AFTER_FLUSH, ACK_AFTER_REPLICATION = 0, 1, 2

#: ``write_refusal``'s session for a request its front-end authorized itself (the remoting port's ACL, RocketMQ's
#: rules), or a write the broker makes on a client's behalf after that client's own check.
AUTHORIZED = object()

SCHEDULE_REFUSAL = ("%s is the broker's internal topic for delayed delivery: send to your topic with a delay level "
                    "instead (put_delayed, RocketMQ's DELAY property)" % SCHEDULE_TOPIC)


def journal_append(store):
    """The append a journal's log is given (POP's ``PopLog``, transactions' ``TxLog``, MQTT's sessions):
    ``append(topic, flag, data, now)`` writes one journal record to partition 0 of ``topic`` and returns the store's
    PutResult (``BrokerWrites.journal``)."""
    return BrokerWrites(store).journal


class BrokerWrites:
    """The broker's own writes into the log, beside its clients': journal records (timers, delay levels, POP,
    transactions, MQTT sessions), the messages it stores on a client's behalf once their time comes (a timer's or
    a delay level's delivery, a transaction's commit) and a slave's copy of its master's log. Given to a feature
    built before the broker's ``PutPath`` (or without one, in tests); the put path holds one too, so that what
    follows every write is decided here.

    No statistics and no topic registration (the client's put was counted when it was answered), no write refusal
    of their own (the feature asks the WriteGate: a delivery waits, a journal's caller refuses); a full disk raises,
    nothing written. ``written`` is the after-write step of these writes, ``visible`` the one rule waking readers."""

    def __init__(self, store, waiters=None, flusher=None, sync_flush=False):
        self.store = store
        self.waiters = waiters
        self.flusher = flusher
        self.sync_flush = sync_flush

    def journal(self, topic, flag, data, now, partition=0):
        """One journal record in ``partition`` of the internal ``topic`` (its follower reads it): the PutResult."""
        return self.store.put(topic, partition, flag, data, now)

    def message(self, topic, partition, flag, data, now, born_ms=None, checksum=None, msg_id=None):
        """A message stored for a client whose put was answered before: with the id it was answered with
        (``msg_id``), born when it was put; the PutResult. ClientError when the topic or partition no longer takes
        it, another MetaqError when the store refuses now (a full disk)."""
        return self.store.put(topic, partition, flag, data, now, born_ms=born_ms, checksum=checksum, msg_id=msg_id)

    def replicated(self, position, data, now, master_segment_size=None):
        """A slave's copy of its master's log bytes at ``position``, appended as they are (``MessageStore
        .append_replicated``): no client, no acknowledgement of its own; the slave wakes its readers once flushed."""
        return self.store.append_replicated(position, data, now, master_segment_size)

    def written(self, keys, now):
        """What follows the broker's own records in the partitions ``keys``: with ``async`` flush they are visible
        now (``visible``); with ``sync`` flush the flusher is woken (its flush makes them visible and wakes the
        readers). Nobody waits for an acknowledgement."""
        if self.sync_flush:
            self.flusher.wake()
        else:
            self.visible(keys, now)

    def visible(self, keys, now, quiet=None, deliver=None, args=()):
        """Records of ``keys`` became readable: the one rule waking readers, for every writer. Every waiting reader
        of ``keys`` is woken (``quiet``: ``PartitionWaiters.notify``'s; ``deliver(*args)``, when given, runs first
        and returns it: MQTT's deliveries sent from the publisher's turn) and the writer yields once when one was
        (its ``settle``): the woken readers answer before the writer's acknowledgement and its next frames, so a
        reader waits for one write, never for a writer's whole pipeline. A writer therefore holds no lock and no
        decision across it unless the decision's version says it stands (``PutPath.decision_stands``).
        The flusher is woken when its policy says so. Returns ACK_NOW: a client's write visible now may be
        acknowledged now unless a slave must have it (``PutPath.written``, which knows)."""
        if deliver is not None:
            quiet = deliver(*args)
        if self.waiters is None:  # a journal's writes alone (a slave's): compiled, a typed None would not raise
            raise TypeError("BrokerWrites.visible: made without waiters, it wakes no reader")
        self.waiters.notify(keys, quiet, True)
        if self.store.should_flush(now):
            self.flusher.wake()
        return ACK_NOW


class WriteGate:
    """Why puts are refused right now (a full disk, a failed flush), or None: the one answer every writer reads.

    ``refresh`` recomputes it from the flusher's health and the last disk check; a put that meets a
    full disk sets it at once (``disk_full``) until the next disk check finds space again.
    """

    def __init__(self):
        self.refusal = None
        self.disk_state = None  # the store's last DiskState
        self.flush_failure = None  # the flusher's failure (sticky), or None
        self.on_change = None  # called when ``refusal`` changes (``PutPath.changed``: decisions kept are asked again)

    def refresh(self, flush_failure=None, disk_state=None):
        if flush_failure is not None:
            self.flush_failure = flush_failure
        if disk_state is not None:
            self.disk_state = disk_state
        if self.flush_failure is not None:
            self._refuse("writes are refused after a failed flush (%s); restart the broker" % self.flush_failure)
        elif self.disk_state is not None and self.disk_state.refusing_writes:
            self._refuse(self.disk_state.reason)
        else:
            self._refuse(None)

    def _refuse(self, refusal):
        """``refusal`` is the answer now (None: puts are taken); ``on_change`` is told when it changed."""
        changed = refusal != self.refusal
        self.refusal = refusal
        if changed and self.on_change is not None:
            self.on_change()

    def error(self):
        """The error a refused put gets: Unavailable (503) after a failed flush, else DiskFull (507)."""
        return (errors.Unavailable if self.flush_failure is not None else errors.DiskFull)(self.refusal)

    def disk_full(self, reason, disk_state=None):
        """A put met a full disk: refuse at once; ``disk_state`` is the measurement that refused it, if one did."""
        if self.refusal is None:
            log.error("%s", reason)
        if disk_state is not None:
            self.disk_state = disk_state
        self._refuse(reason)


class PutPath:
    def __init__(self, store, stats, flusher, waiters, roles, gate, delay=None, registry=None, sync_flush=False,
                 guard=None):
        """``guard``: the broker's one authorization check (``server.guard``; None: authentication off)."""
        self.guard = guard
        self.store = store
        self.stats = stats
        self.flusher = flusher
        self.waiters = waiters
        self.roles = roles  # the replication role changes while the broker runs (promotion, rejoin)
        self.gate = gate
        self.delay = delay
        self.timers = None  # the TimerService (timers/service.py), set at assembly
        self.registry = registry
        self.sync_flush = sync_flush
        self.writes = BrokerWrites(store, waiters, flusher, sync_flush)  # the broker's own records, the one wake
        self.version = 0  # moves with every change of what ``write_refusal`` reads (``changed``)
        self._writable_at = None  # the ``standing`` at which ``check_writable`` last said yes
        self.standing = self._standing()
        self.burst_written = self._burst_written()

    def changed(self, *_):
        """Something ``write_refusal`` reads changed: the permissions file (users, rules, quotas), the write gate,
        the replication role, the topic table. The broker wires every such change here; ``version`` moves, so
        every decision a front-end kept (``decision_stands``) is asked again."""
        self.version += 1
        self.standing = self._standing()
        self.burst_written = self._burst_written()

    def _standing(self):
        """``standing``: the version at which a kept yes stands without asking ``decision_stands`` (no answer of
        the broker's own moves with the clock: no replicating master, no election), else None. The roles change
        only through their listeners, which call ``changed``, so it is made again there."""
        roles = self.roles
        steady = roles is not None and roles.replication is None and roles.election is None
        return self.version if steady else None

    def _burst_written(self):
        """``burst_written(keys, now, quiet=None, deliver=None, args=())``, positional arguments only: ``written``
        as the broker's modes of now decide it, kept with ``standing`` (made again by every change, ``changed``):
        with ``async`` flush on a master whose roles move no answer (no replication server, so no ``sync``
        replication; no election) it is ``BrokerWrites.visible`` itself, which returns ACK_NOW (no frame of
        ``written`` between); in every other mode (``sync`` flush, a master serving slaves, a slave, an election)
        ``written``."""
        if (not self.sync_flush and self.standing is not None and self.store is not None
                and self.roles.role == "master"):
            return self.writes.visible
        return self.written

    def decision_stands(self, version):
        """True while a yes of ``write_refusal`` given at ``version`` (for a writer whose session's user did not
        change since: the caller's to compare) still stands: nothing it reads changed since (``changed``) and, where
        the broker's own answer moves with the clock alone (an elected master's lease, a replicating master's
        isolation or its sync slaves' confirmations), that answer is still yes (``writable_refusal``, asked now).
        A no is never kept: each put it refuses asks again."""
        if version != self.version:
            return False
        roles = self.roles
        return (roles.replication is None and roles.election is None) or self.writable_refusal() is None

    @property
    def replication(self):
        """The master's ReplicationServer, or None (a slave, or no replication port)."""
        return self.roles.replication

    @property
    def sync_replication(self):
        return self.roles.sync_replication

    @property
    def acks_wait(self):
        """True when a put's acknowledgement may wait (``durable`` blocks): ``sync`` flush, or replication set to
        ``sync`` (a promotion or an election may make a slave's copy due at any time). The one answer to whether a
        front-end answers its sends in a greenlet of their own (True) or at once, on the connection's reader."""
        return self.sync_flush or self.sync_replication or self.roles.config.replication.mode == "sync"

    @property
    def slave_refusal(self):
        """Why puts are refused on a slave, or None on a master."""
        return self.roles.slave_refusal

    @property
    def refusal(self):
        """Why this broker takes no puts right now, or None."""
        return self.roles.slave_refusal or self.gate.refusal or self.isolation_refusal()

    def writable_refusal(self):
        """Why this broker takes no puts right now, as the error a put gets, or None: Unavailable (503) on a slave
        or after a failed flush, DiskFull (507) on a full disk, Unavailable (503, "nothing was stored") on a
        ``sync`` master no slave could confirm a put for (``Roles.unconfirmable_refusal``) or on an ``async`` master
        cut off from its slaves and ZooKeeper (``isolation_refusal``): refused before the write, so a client's
        retry stores nothing twice."""
        refusal = self.roles.slave_refusal or self.isolation_refusal()
        if refusal is not None:
            return errors.Unavailable(refusal)
        if self.gate.refusal is not None:
            return self.gate.error()
        refusal = self.roles.unconfirmable_refusal
        if refusal is not None:
            return errors.Unavailable(refusal)
        return None

    def check_master(self):
        """Raise ``errors.NotMaster`` (503, naming the master when known) unless this broker is the master that may
        acknowledge: what an offset commit asks (text ``commit_offset``, RocketMQ UPDATE_CONSUMER_OFFSET, the HTTP
        and text offset resets). ``Roles.not_master``: the decision puts read, without a put's other refusals (a
        commit goes to the consumer-offset table, not the log)."""
        exc = self.roles.not_master()
        if exc is not None:
            raise exc

    def isolation_refusal(self):
        """Why this ``async`` master may be cut off and must acknowledge nothing (``Roles.isolation_refusal``)."""
        return self.roles.isolation_refusal()

    def check_writable(self):
        """Raise ``writable_refusal``'s error, if any (a write that names no client topic: a commit, a cancel). A
        yes is kept while it stands without asking (``standing``: nothing it reads changed and no part of it moves
        with the clock); a no is asked again each time."""
        standing = self.standing
        if standing is not None and self._writable_at == standing:
            return
        exc = self.writable_refusal()
        if exc is not None:
            raise exc
        self._writable_at = standing

    def write_refusal(self, topic, session, internal=False):
        """May this writer put to ``topic`` now? None, or the MetaqError its front-end answers. Every put path asks.

        In order: the writer's permission to publish to the topic (``Guard.require``: Unauthenticated 401,
        Forbidden 403; ``session`` AUTHORIZED: the front-end decided it), the broker's (``writable_refusal``),
        then the topic's name (ClientError 400): the delay scheduler's topic, the timer topic and the resent
        journals (unless ``internal``: the broker's own write), a priority level's name. Whether the topic and
        partition exist and take writes is the store's to say at the append.
        """
        if session is not AUTHORIZED and self.guard is not None and self.guard.enabled:
            try:
                self.guard.require(session, PUB, "topic", topic)
            except errors.MetaqError as exc:
                return exc
        exc = self.writable_refusal()
        if exc is not None:
            return exc
        if topic == SCHEDULE_TOPIC:
            return errors.ClientError(SCHEDULE_REFUSAL)
        if not internal and is_journal(topic):
            return errors.ClientError(journal_refusal(topic))
        if is_level_topic(topic):
            return errors.ClientError(level_refusal(topic))
        if session is not AUTHORIZED:
            return self.creation_refusal(topic, session)
        return None

    def creation_refusal(self, topic, session):
        """None, or QuotaExceeded when a put of ``session``'s user would create ``topic`` past the user's
        ``topics`` or ``partitions`` quota (``store.quota``: the topic is then counted as the user's). The remoting
        port, whose ACL decides for it, asks this itself."""
        user = session.user if session is not None else None
        if user is None or self.guard is None or not self.guard.enabled or self.store is None:
            return None  # no user (or no store to count in): only the broker-wide limits
        try:
            self.store.claim_topic(topic, user, self.guard.quotas.check)
        except errors.QuotaExceeded as exc:
            return exc
        return None

    def check_write(self, topic, session, internal=False):
        """Raise ``write_refusal``'s error, if any."""
        exc = self.write_refusal(topic, session, internal)
        if exc is not None:
            raise exc

    def stored_topic(self, topic, priority):
        """The topic a put to ``topic`` with ``priority`` is stored in (docs/messaging.md "Priorities": level k >= 1 of
        a priority topic is ``<topic>%P<k>``); ClientError, nothing stored, for a priority the topic does not have."""
        s = self.store.topics.settings_of(topic)
        levels = s.priorities if s is not None else 0
        if not levels:
            raise errors.ClientError("topic %s has no priorities (a priority %d was given): create or alter it with "
                                     "metaq-admin topics ... --priorities L" % (topic, priority))
        if not 0 <= priority < levels:
            raise errors.ClientError("priority %d is out of range for topic %s: it has %d levels, 0..%d "
                                     "(%d the highest)"
                                     % (priority, topic, levels, levels - 1, levels - 1))
        return level_topic(topic, priority)

    def append(self, topic, partition, flag, body, now, checksum=None, born_ms=None, delay_level=0, internal=False,
               priority=None, due_ms=None, owner=None, checked=False):
        """Store one message whose writer ``check_write`` let through; returns the store's PutResult.

        ``delay_level`` > 0 hands the message to the delay scheduler (``DelayScheduler.put_delayed``: the
        result names its schedule entry). Counts the put (or its failure), turns a full disk into the
        broker's refusal and registers a new topic in ZooKeeper. Raises MetaqError, ``write_refusal``'s among
        them (asked again: the broker may have stopped taking puts since; ``internal``: the broker's own write to
        a journal, admin/service.py). ``priority`` (not None): the message
        goes to that level of ``topic`` (``stored_topic``); no delay level with it. ``due_ms`` (not None, already
        checked by ``timers.records``): the timer service stores it for delivery then (``TimerService.put_at``), as
        user ``owner``'s (its ``timers`` quota). ``checked``: the caller asked ``write_refusal`` for this put and
        did not yield since (nothing can have changed the answer): not asked again.
        """
        stored = topic
        try:
            if not checked:
                self.check_write(topic, AUTHORIZED, internal)
            if priority is not None:
                if delay_level:
                    raise errors.ClientError("a message cannot have both a delay level and a priority")
                stored = self.stored_topic(topic, priority)
            if due_ms is not None and (delay_level or priority is not None):
                raise errors.ClientError("a message cannot have both a delivery time and a delay level or a priority")
            if due_ms is not None:
                r = self.timers.put_at(topic, partition, flag, body, due_ms, now, checksum, owner)
            elif delay_level:
                r = self.delay.put_delayed(topic, partition, flag, body, delay_level, now, checksum)
            else:
                r = self.store.put(stored, partition, flag, body, now, born_ms=born_ms, checksum=checksum)
        except errors.MetaqError as exc:
            self.failed(topic, exc)
            raise
        self.stats.on_put(topic, len(body))  # a level's put counts as its topic's (and registers only the topic)
        if self.registry is not None and topic not in self.registry.registered_topics:
            self.registry.topic_created(topic)
        return r

    def append_idempotent(self, topic, partition, flag, body, now, pid, seq, born_ms=None, owner=None):
        """An idempotent put (``put_idem``, or a remoting send with ``METAQ_PID``/``METAQ_SEQ``):
        ``(PutResult, record position, duplicate)``; a duplicate's result is the original's, and its reply must
        wait for the original's durability like any put's (``ack_mode`` / ``durable`` with its ``log_end``).
        ``owner``: the user who sent it (None: authentication off), whose quota of producer windows it counts in.
        The store decides and appends without yielding (``idempotence/state.py``). Raises MetaqError,
        ``write_refusal``'s among them (asked again, as ``append`` does)."""
        try:
            self.check_write(topic, AUTHORIZED)
            r, position, duplicate = self.store.put_idempotent(topic, partition, flag, body, now, pid, seq, born_ms,
                                                                owner)
        except errors.MetaqError as exc:
            self.failed(topic, exc)
            raise
        if not duplicate:
            self.stats.on_put(topic, len(body))
            if self.registry is not None and topic not in self.registry.registered_topics:
                self.registry.topic_created(topic)
        return r, position, duplicate

    def append_burst(self, frames, src, now):
        """The batch writers' append (``MessageStore.put_burst``): ``(frames taken, BurstRuns)``, the writer's
        refusal (``check_write``) already asked. The caller then counts the runs (``counted``) and owes the
        acknowledgement ``written`` returns."""
        return self.store.put_burst(frames, src, now)

    def append_idempotent_run(self, frames, src, now, owner=None):
        """An idempotent producer's run of frames (``MessageStore.put_idempotent_run``), as ``append_burst``."""
        return self.store.put_idempotent_run(frames, src, now, owner)

    def append_idempotent_prepared(self, topic, partition, flag, body, now, pid, seq, checksum, owner=None):
        """One checked idempotent frame (``MessageStore.put_idempotent_prepared``): ``(PutResult, record position,
        duplicate)``, as ``append_burst``."""
        return self.store.put_idempotent_prepared(topic, partition, flag, body, now, pid, seq, checksum, owner)

    def failed(self, topic, exc, counted_only=False):
        """Account for a put that failed with ``exc`` (``counted_only``: just count it)."""
        self.stats.on_put_failed(topic if topic != SCHEDULE_TOPIC else None)  # no stats for the internal topic
        if counted_only:
            return
        if isinstance(exc, errors.DiskFull):
            self.gate.disk_full(str(exc), self.store.disk_state)  # until the next disk check finds space again
        elif not isinstance(exc, (errors.ClientError, errors.Unavailable)):
            log.warning("put to %s failed: %s", topic, exc)

    def ack_mode(self, topic, result, now):
        """How a front-end acknowledges this one put (``written`` for its partition)."""
        return self.written(((topic, result.partition),), now)

    def made_visible(self, topic, partition, now):
        """Records of ``(topic, partition)`` are readable now (``visible``)."""
        self.visible(((topic, partition),), now)

    def counted(self, topic, count, nbytes):
        """What follows every stored client message, once per run of one topic: count ``count`` messages of
        ``nbytes`` body bytes and register ``topic`` in ZooKeeper when it is new. The one place statistics and
        registration follow a write, so a batch writer counts per run, never per message."""
        self.stats.on_puts(topic, count, nbytes)
        registry = self.registry
        if registry is not None and topic not in registry.registered_topics:
            registry.topic_created(topic)

    def written(self, keys, now, quiet=None, deliver=None, args=()):
        """What follows a client write of the partitions ``keys`` (each ``(topic, partition)``, its records
        counted by ``counted``), the same for every front-end and decided from the broker's modes of now: the
        acknowledgement the caller then owes. ``burst_written`` is this, or what it does in the broker's mode of
        now.

        The flush: with ``sync`` flush the flusher is woken (its flush makes the records visible and wakes their
        readers); with ``async`` flush they are visible now (``visible``, given ``quiet``, ``deliver`` and ``args``:
        ``deliver(*args)``, when given, runs first and returns the ``quiet``: MQTT's deliveries sent from the
        publisher's turn). The acknowledgement:
        ACK_AFTER_REPLICATION with ``sync`` replication (the replicator is told; the caller acknowledges after
        ``durable`` or ``settle``), else ACK_AFTER_FLUSH with ``sync`` flush (after ``settle``), else ACK_NOW."""
        if self.sync_flush:
            self.flusher.wake()
            ack = ACK_AFTER_FLUSH
        else:
            ack = self.writes.visible(keys, now, quiet, deliver, args)
        roles = self.roles
        if roles.sync_replication:
            roles.replication.notify()
            return ACK_AFTER_REPLICATION
        return ack

    def visible(self, keys, now, quiet=None):
        """Records of ``keys`` became readable: ``BrokerWrites.visible``, the one rule waking readers."""
        self.writes.visible(keys, now, quiet)

    def append_journal(self, topic, flag, data, now):
        """One journal record of a feature given the put path (MQTT's sessions, a will): ``BrokerWrites.journal``."""
        return self.writes.journal(topic, flag, data, now)

    def durable(self, topic, partition, log_end, now, since=None):
        """Block (a greenlet of its own) until the put ending at ``log_end``, which ``written`` (or ``ack_mode``)
        followed, may be acknowledged (``settle``). ``since``: the store's ``log_cuts`` read right after the write,
        by a caller that yielded since (None: read now). ``topic`` and ``partition``: a caller that did not ask
        ``written`` has its partition made visible here."""
        if since is None:
            since = self.store.log_cuts
        if self.sync_replication:
            self.replication.notify()
        if not self.sync_flush:
            self.made_visible(topic, partition, now)
        self.settle(log_end, since)

    def settle(self, log_end, since=None):
        """Block until what is written up to ``log_end`` may be acknowledged: flushed (``sync`` flush), then
        ``confirm``. Raises the flush's or ``confirm``'s MetaqError: written, not acknowledged. The text connection
        waits for a burst's puts here, whatever front-end code wrote them. ``since``: ``durable``'s."""
        if since is None:
            since = self.store.log_cuts
        if self.sync_flush:
            self.flusher.wait_flushed(log_end, since=since)
        self.confirm(log_end, since)

    def confirm(self, log_end, since=None):
        """What is written up to ``log_end`` (and flushed, per the flush mode) may be acknowledged: wait for the
        slaves in sync replication, then check this broker still may acknowledge (ha: auto: its lease may have
        run out meanwhile) and, given ``since`` (``durable``'s), that the log was not cut back before ``log_end``
        since the write (a deposed master's tail: its slaves' or its own later records may reach that position
        again once it leads again). Unavailable otherwise: written, not acknowledged."""
        if self.sync_replication:
            self.replication.wait_replicated(log_end)
        refusal = self.roles.slave_refusal
        if refusal is not None:
            raise errors.Unavailable("the message was written but is not acknowledged: %s" % refusal)
        store = self.store
        if since is not None and store.log_cuts != since and store.cut_below(since, log_end):
            raise errors.Unavailable("the message was written but is not acknowledged: the log was cut back before "
                                     "position %d since (this broker was deposed): it is gone" % log_end)
