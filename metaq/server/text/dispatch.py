"""Text-protocol dispatch: events in, reply bytes out.

This is the one place where errors become wire replies (``error_reply``).
Handlers return ``(reply_bytes_or_None, flush_position)``: a non-zero flush
position means the reply may be sent only once the log is durable up to it
(``sync`` flush mode).
"""

import logging
import time

import gevent

import metaq
from metaq import errors, limits
from metaq.admin import wire as adminwire
from metaq.admin.text import TextAdmin
from metaq.filters.text import TagScan
from metaq.protocol import commands, events as ev
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)
from metaq.priorities.wire import PriorityGet, PriorityPut
from metaq.protocol.putbatch import PutBatch
from metaq.protocol.text import encode_result, encode_value_header, error_reply
from metaq.clock import now_ms
from metaq.server.guard import ADMIN, PUB, SUB
from metaq.serving.putchecks import uncompressed, verified_checksum
from metaq.serving.putpath import ACK_NOW
from metaq.serving.batchput import BatchPuts
from metaq.loop.expect import check_expected
from metaq.priorities.text import TextPriorities
from metaq.reqreply.text import TextRequests
from metaq.offsets.text import TextOffsets
from metaq.keys.text import TextKeys
from metaq.idempotence.text import TextIdempotentBatches, TextIdempotentPuts
from metaq.idempotence.wire import IdempotentBatch, IdempotentPut
from metaq.timers.text import TextTimers
from metaq.timers.wire import TimerCancelCommand, TimerList, TimerPut
from metaq.topics.text import TextTopics
from metaq.topics.wire import TopicCommand
from metaq.groups.text import TextGroupSettings
from metaq.groups import policy as group_policy
from metaq.groups.wire import GroupSettingsCommand
from metaq.pop import wire as popwire
from metaq.pop.text import TextPop
from metaq.trace.service import Tracer
from metaq.trace.text import TextTrace
from metaq.trace.wire import TraceQuery

log = logging.getLogger(__name__)

NO_WAIT = 0


def ok(body, opaque):
    return encode_result(200, body, opaque)


def check_need(guard, session, need, event):
    """Enforce what a request's declaration says it needs of its user (``protocol.commands.Need``): raises
    Unauthenticated (401) or Forbidden (403). ``HANDLER`` needs are the handler's own (the hot paths, and the one
    topic-write decision every put asks)."""
    need = need.of(event)
    rule = need.rule
    if rule == commands.NOTHING or rule == commands.HANDLER:
        return
    if rule == commands.USER:
        guard.current_user(session)
    elif rule == commands.ADMIN:
        guard.require(session, ADMIN)
    elif rule == commands.PUBLISH:
        guard.require(session, PUB, "topic", need.subject(event))
    elif rule == commands.SUBSCRIBE:
        guard.require(session, SUB, "topic", need.subject(event))
    elif rule == commands.GROUP:
        guard.require(session, SUB, "group", event.group)
        guard.require(session, SUB, "topic", need.subject(event))
    else:
        raise TypeError("unknown need %r" % (rule,))


def _needs():
    """``{event type: Need}`` of every request, from the registry."""
    return {c.event: c.need for c in commands.requests()}


#: Requests the connection answers itself, never dispatched (``quit`` closes it).
CONNECTION_OWN = (ev.Quit,)


class TextDispatcher:
    def __init__(self, store, stats, put_path, tx, roles, waiters, config, render_stats, guard, replies=None,
                 admin=None, group_members=None, topics=None, pop=None, tracer=None, groups=None):
        """``tx``: the text transaction front (``metaq.transactions.text.TextTransactions``); ``render_stats(item)``:
        the body of a ``stats`` reply; ``guard``: the broker's one authorization check (``server.guard``);
        ``replies``: the request-reply router (``reqreply.service``; None: ``request``/``reply`` answered 400);
        ``admin``: the admin operations (``admin.service.AdminOps``; None: the admin extensions answered 400);
        ``group_members``: told which connection commits or queries which group (``admin.service.TextGroupMembers``);
        ``topics``: the topic table's service (``topics.service.TopicAdmin``; None: ``topic`` answered 400);
        ``pop``: per-message acknowledgement (``pop.service.PopService``; None: ``receive``, ``ack`` and
        ``change_invisible`` answered 400); ``tracer``: ``trace``'s lookup (``trace.service.Tracer``; None: one
        without the remoting address, whose offset ids then name no record here); ``groups``: the group settings'
        service (``groups.service.GroupAdmin``; None: ``group_settings`` answered 400)."""
        self.guard = guard
        self.store = store
        self.stats = stats
        self.put_path = put_path
        self.tx = tx
        self.roles = roles
        self.waiters = waiters
        self.render_stats = render_stats
        self.max_transfer = config.store.max_transfer_size
        self.max_body = config.limits.max_body_bytes
        self.max_wait_ms = config.limits.max_wait_ms
        self.max_parked_per_connection = config.limits.max_parked_gets_per_connection
        if replies is not None:
            self.requests = TextRequests(replies, put_path, guard, config.limits.max_request_timeout_ms, error_reply,
                                         config.limits.max_body_bytes)
        self._handlers = {
            ev.Put: self.put,
            ev.DelayedPut: self.put_delayed,
            ev.Get: self.get,
            ev.GetTags: self.get_tags,
            ev.GetSql: self.get_tags,  # the same scan over a SqlFilter (filters/reads.py)
            ev.Offset: self.offset,
            ev.OffsetAt: self.offset_at,
            ev.Stats: self.stats_cmd,
            ev.Version: self.version,
            ev.Transaction: self.transaction,
            ev.Sync: self.sync,
            ev.Promote: self.promote,
            ev.Auth: self.auth,
            ev.Request: self.reply_from_client,
            ev.Reply: self.reply_from_client,
            ev.Value: self.reply_from_client,
            ev.Result: self.reply_from_client,
        }
        priorities = TextPriorities(store, stats, roles, put_path, guard, self.max_body, self.max_transfer,
                                    ack_put=self.ack_put, get_refusal=self.get_refusal, park=self.park,
                                    error_reply=error_reply)  # put_prio, get_prio (docs/messaging.md "Priorities")
        self._handlers[PriorityPut] = priorities.put_prio
        self._handlers[PriorityGet] = priorities.get_prio
        # commit_offset (the master's only), query_offset (offsets/text.py)
        offsets = TextOffsets(store, group_members, put_path.check_master)
        self._handlers.update({ev.CommitOffset: offsets.commit_offset, ev.QueryOffset: offsets.query_offset})
        self._handlers[TopicCommand] = TextTopics(topics, guard.known_to, error_reply).topic  # topics/text.py
        self._handlers[GroupSettingsCommand] = TextGroupSettings(groups, error_reply).group_settings  # groups/text.py
        self._handlers[ev.Lookup] = TextKeys(store, roles).lookup  # lookup (docs/messaging.md "Key index")
        timers = TextTimers(put_path, put_path.timers, self.max_body, ack_put=self.ack_put,
                            error_reply=error_reply)  # put_at, cancel, timers (docs/messaging.md "Any delivery time")
        self._handlers.update({TimerPut: timers.put_at, TimerCancelCommand: timers.cancel, TimerList: timers.list})
        self._handlers[PutBatch] = BatchPuts(put_path, config.limits, error_reply).putb  # putb (batchput.py)
        self._handlers[IdempotentPut] = TextIdempotentPuts(put_path, self.max_body, ack_put=self.ack_put,
                                                           error_reply=error_reply).put_idem  # put_idem
        self._handlers[IdempotentBatch] = TextIdempotentBatches(put_path, config.limits,
                                                                error_reply).putb_idem  # putb_idem
        self.admin = TextAdmin(admin, error_reply) if admin is not None else None
        if pop is not None:  # receive, ack, change_invisible (docs/messaging.md "Per-message acknowledgement (POP)")
            pop_text = TextPop(pop, min(self.max_wait_ms, limits.MAX_WAIT_MS))
            self._handlers.update({popwire.Receive: pop_text.receive, popwire.Ack: pop_text.ack,
                                   popwire.ChangeInvisible: pop_text.change_invisible})
        else:
            self._handlers.update({t: self._no_pop for t in popwire.EVENTS})
        for event_type in adminwire.EVENTS:
            self._handlers[event_type] = self.admin.handlers[event_type] if admin is not None else self._no_admin
        if tracer is None:  # no remoting address known: offset ids name no record here
            tracer = Tracer(store, lambda: pop.state if pop is not None else None, lambda: None, config.broker.id,
                            lambda: roles.read_refusal)
        self._handlers[TraceQuery] = TextTrace(tracer, guard).trace  # trace (docs/operating.md "Where is my message")
        self._handlers[adminwire.ClientCommand] = self._no_grpc  # until the gRPC port routes it (route)
        if replies is not None:
            self._handlers[ev.Request] = lambda e, conn: (self.requests.request(e, conn), NO_WAIT)
            self._handlers[ev.Reply] = lambda e, conn: (self.requests.reply(e, conn), NO_WAIT)
        self._needs = _needs()
        missing = set(self._needs) - set(self._handlers) - set(CONNECTION_OWN)
        if missing:  # a declared command nobody answers: refuse to start, never a KeyError on its first use
            raise TypeError("text commands without a handler: %s" % ", ".join(sorted(
                commands.by_event(t).word for t in missing)))

    def handle(self, event, conn):
        handler = self._handlers[type(event)]
        try:
            if self.guard.enabled:
                check_need(self.guard, conn.session, self._needs[type(event)], event)
            return handler(event, conn)
        except errors.MetaqError as exc:
            return error_reply(exc, event.opaque), NO_WAIT

    # -- put ---------------------------------------------------------------

    def put(self, e, conn):
        path = self.put_path
        try:
            path.check_write(e.topic, conn.session)
            checksum = verified_checksum(e)
            e = uncompressed(e._replace(checksum=checksum), self.max_body)
            body, checksum = e.body, e.checksum
            if e.tx_key is not None and e.tx_key != "null":
                return self.tx.put(e, conn), NO_WAIT
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return error_reply(exc, e.opaque), NO_WAIT
        now = now_ms()
        try:
            r = path.append(e.topic, e.partition, e.flag, body, now, checksum=checksum)
        except errors.MetaqError as exc:
            return error_reply(exc, e.opaque), NO_WAIT
        return self.ack_put(e, r, now, encode_result(200, b"%d %d %d" % (r.msg_id, r.partition, r.offset), e.opaque),
                         conn)

    def put_delayed(self, e, conn):
        """``put_delayed``: a schedule entry now (``metaq.timers.scheduler``), the message in its topic when due."""
        path = self.put_path
        now = now_ms()
        try:
            path.check_write(e.topic, conn.session)
            e = uncompressed(e._replace(checksum=verified_checksum(e)), self.max_body)
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return error_reply(exc, e.opaque), NO_WAIT
        try:
            r = path.append(e.topic, e.partition, e.flag, e.body, now, checksum=e.checksum, delay_level=e.level)
        except errors.MetaqError as exc:
            return error_reply(exc, e.opaque), NO_WAIT
        offset = r.offset if e.level == 0 else -1  # a delayed message has no offset in its topic until delivered
        return self.ack_put(e, r, now, encode_result(200, b"%d %d %d" % (r.msg_id, r.partition, offset), e.opaque),
                         conn)

    def ack_put(self, e, r, now, reply, conn):
        """``(reply, the log position its acknowledgement waits for)`` of a stored put (``PutPath.written``): the
        connection sends it once ``PutPath.settle`` lets it (the flush, a slave's ACK), or at once."""
        if self.put_path.ack_mode(e.topic, r, now) == ACK_NOW:
            return reply, NO_WAIT
        return reply, r.log_end

    # -- get ---------------------------------------------------------------

    def get_refusal(self, e, conn):
        """The reply refusing a get, get_tags or get_sql before it reads (None: it may read)."""
        if self.guard.enabled:
            self.guard.require(conn.session, SUB, "topic", e.topic)
        if self.roles.read_refusal is not None:
            return encode_result(503, self.roles.read_refusal.encode(), e.opaque)
        refusal = group_policy.decide(self.store.groups.get(e.group), e.group).refusal  # the group's settings
        if refusal is not None:
            return encode_result(403, refusal.encode("utf-8", "replace"), e.opaque)
        if e.max_size <= 0:
            return encode_result(400, b"Bad request,invalid max size:%d" % e.max_size, e.opaque)
        return None

    def get(self, e, conn):
        refusal = self.get_refusal(e, conn)
        if refusal is not None:
            return refusal, NO_WAIT
        max_size = min(e.max_size, self.max_transfer)
        reply = conn.read_reply(max_size, lambda: self._read(e, max_size, conn))
        if reply is not None:
            return reply, NO_WAIT
        if e.max_wait_ms and not conn.closed:
            return self.park(e, conn, max_size), NO_WAIT
        self.stats.on_get(e.topic, True)
        return self._miss(e), NO_WAIT

    def get_tags(self, e, conn):
        """``get_tags`` (our extension, events.GetTags): the records whose tags are wanted, found by the index
        units' tag hashes (``MessageStore.read_tagged``: the others are never read); docs/messaging.md "Tag
        filtering". ``get_sql`` (events.GetSql) too: each record read and its properties evaluated
        (docs/messaging.md "SQL92 filters")."""
        refusal = self.get_refusal(e, conn)
        if refusal is not None:
            return refusal, NO_WAIT
        max_size = min(e.max_size, self.max_transfer)
        scan = TagScan(self.store, self.stats, e, max_size)
        reply = conn.read_reply(max_size, scan.read)
        if reply is not None:
            return reply, NO_WAIT
        if e.max_wait_ms and not conn.closed:
            return self.park(e, conn, max_size, scan.read, scan.miss), NO_WAIT
        self.stats.on_get(e.topic, True)
        return scan.miss(), NO_WAIT

    def park(self, e, conn, max_size, read=None, miss=None, watch=None, seen=None):
        """Park a long-polling get (None: it answers from its own greenlet), or the 503 past a cap. ``watch``: the
        partitions ``read`` reads (None: the get's own; a ``get_prio``'s levels), whose appends since the read that
        missed are read at once (``PartitionWaiters.wait``); ``seen``: their ends taken before that read (None: now,
        for a read that does not yield after it looks at the ends)."""
        if conn.parked >= self.max_parked_per_connection:
            return encode_result(503, b"too many parked gets on this connection: the limit is %d"
                                 % self.max_parked_per_connection, e.opaque)
        if not self.waiters.admit():
            return encode_result(503, b"too many parked gets on the broker: the limit is %d"
                                 % self.waiters.max_parked, e.opaque)
        conn.parked += 1

        def unpark():
            conn.parked -= 1
            self.waiters.leave()

        wait_s = min(e.max_wait_ms, self.max_wait_ms) / 1000.0
        read = read or (lambda: self._read(e, max_size, conn))
        watch = watch or ((e.topic, e.partition),)
        if seen is None:
            seen = self.waiters.ends(self.store.max_offset, watch)  # as of the read that missed: no yield since
        conn.spawn(self._long_poll, e, conn, max_size, wait_s, read, miss or (lambda: self._miss(e)), watch, seen,
                   on_exit=unpark)
        return None

    def _read(self, e, max_size, conn):
        """The reply for a get (a list of buffers: header + record views), or None when nothing is there yet."""
        check_expected(self.store, e)
        try:
            r = self.store.read_joined(e.topic, e.partition, e.offset, max_size, mapped=conn.zero_copy is not None)
        except errors.Moved as exc:
            if exc.offset < e.offset and self.roles.end_unknown:
                return None  # past our end on a slave behind its master: not here yet (a miss, long-pollable)
            raise
        if not r.count:
            return None
        self.stats.on_get(e.topic, False)
        if conn.zero_copy is not None:
            conn.zero_copy.stamp(r.views)  # held from now: server/zerocopy.py bounds how long
        parts = [encode_value_header(r.nbytes, e.opaque)]
        parts.extend(r.views)  # the records gathered into one buffer per segment (store/gather.py), sent by sendmsg
        return parts

    def _miss(self, e):
        return encode_result(404, b"Could not find message at position %d" % e.offset, e.opaque)

    def _long_poll(self, e, conn, max_size, wait_s, read, miss, watch, seen):
        """Wait for an append to the partition and read again, until a reply or the deadline. ``seen``: the visible
        ends of ``watch`` as of the last read; an append since (made before this greenlet first ran) is read at
        once: its wake came before this wait began (``PartitionWaiters.wait``)."""
        deadline = time.monotonic() + wait_s
        key = (e.topic, e.partition)
        waiters, end = self.waiters, self.store.max_offset
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or waiters.closed:
                self.stats.on_get(e.topic, True)
                return miss()
            waiters.wait(key, remaining, seen, end)
            seen = waiters.ends(end, watch)  # before the read (its reservation may yield): later ones count
            try:
                reply = conn.read_reply(max_size, read)
            except errors.MetaqError as exc:
                return error_reply(exc, e.opaque)
            if reply is not None or conn.closed:
                return reply

    # -- the rest ----------------------------------------------------------

    def offset(self, e, conn):
        if self.roles.read_refusal is not None:
            return encode_result(503, self.roles.read_refusal.encode(), e.opaque), NO_WAIT
        self.stats.on_offset(e.topic)
        nearest = self.store.nearest_offset(e.topic, e.partition, e.offset)
        return ok(b"%d" % nearest, e.opaque), NO_WAIT

    def offset_at(self, e, conn):
        """``offset_at`` (our extension, events.OffsetAt): the first offset stored at or after a time.

        A binary search over the partition's index (store times grow with offsets, ``lookup.TimeSearch``): each
        probe reads a 16-byte index unit, then the 8-byte store time of its record, ~2*log2(n) scattered reads.
        Done naively on the loop, a partition out of the page cache costs a major fault per cold page, and the
        loop would wait for each. A worker thread alone would not help (a fault holds the GIL), so each read's
        page is checked first (``MappedFile.resident``, mincore) and a cold one brought in by
        ``MappedFile.populate`` in gevent's pool (the GIL released); the loop then reads it from memory, and the
        disk reads happen off it (figures: bench/README.md, "Cold reads off the loop"); a warm lookup takes no
        pool hop. This connection waits meanwhile (its next requests after it).
        """
        if self.roles.read_refusal is not None:
            return encode_result(503, self.roles.read_refusal.encode(), e.opaque), NO_WAIT
        self.stats.on_offset(e.topic)
        search = self.store.time_search(e.topic, e.partition, e.timestamp_ms)
        pool = gevent.get_hub().threadpool
        while not search.done:
            page = search.need()
            if page is not None and not page[0].resident(page[1]):
                pool.apply(page[0].populate, page[1:])
            search.step()
        return ok(b"%d" % search.result, e.opaque), NO_WAIT


    def _no_admin(self, e, conn):
        return encode_result(400, b"the admin commands are not served by this dispatcher", e.opaque), NO_WAIT

    def _no_grpc(self, e, conn):
        return encode_result(404, b"this broker has no gRPC port (grpc.port): it has no gRPC clients", e.opaque), \
            NO_WAIT

    def route(self, event_type, handler):
        """Answer ``event_type`` with ``handler(e, conn) -> (reply, flush position)`` from now on: a component
        built after the dispatcher (the gRPC port's ``client_command``). Its permission stays the declared one."""
        if event_type not in self._handlers:
            raise TypeError("%s is no declared text command" % event_type.__name__)
        self._handlers[event_type] = handler

    def _no_pop(self, e, conn):
        return encode_result(400, b"receive, ack and change_invisible are not served by this dispatcher",
                             e.opaque), NO_WAIT

    def stats_cmd(self, e, conn):
        return ok(self.render_stats(e.item, self.guard.visible_to(getattr(conn, "session", None))), e.opaque), NO_WAIT

    def version(self, e, conn):
        return ok(metaq.__version__.encode(), e.opaque), NO_WAIT

    def transaction(self, e, conn):
        refusal = self.put_path.slave_refusal
        if refusal is not None:
            return encode_result(503, refusal.encode(), e.opaque), NO_WAIT
        return self.tx.handle(e, conn), NO_WAIT

    def sync(self, e, conn):
        msg = b"sync is accepted only by a replication slave; this broker is a master"
        return encode_result(503, msg, e.opaque), NO_WAIT

    def promote(self, e, conn):
        """``promote <force> <opaque>`` (our extension; roles.py): make this slave the master of its broker id."""
        conn.spawn(self._promote, e)
        return None, NO_WAIT

    def _promote(self, e):
        try:
            text = self.roles.promote(e.force)
        except errors.MetaqError as exc:
            log.warning("promote refused: %s", exc)
            return error_reply(exc, e.opaque)
        return ok(text.encode("utf-8"), e.opaque)

    def auth(self, e, conn):
        """``auth`` (docs/security.md): step one gives a nonce, step two checks the proof. A failure is answered
        401 (after a delay once its address has failed often) and the connection closed."""
        guard = self.guard
        if not guard.enabled:
            return encode_result(400, b"authentication is off on this broker (no security.acl_file)", e.opaque), \
                NO_WAIT
        if e.client_nonce is None:
            return ok(guard.challenge(conn.session, e.user).encode(), e.opaque), NO_WAIT
        try:
            server_proof = guard.answer(conn.session, e.user, e.client_nonce, e.proof)
        except errors.Unauthenticated as exc:
            delay = guard.failed(conn.session.host)
            if delay:
                gevent.sleep(delay)
            conn.hang_up = True
            return error_reply(exc, e.opaque), NO_WAIT
        except errors.QuotaExceeded as exc:  # the user's connections quota: a good proof, no room
            conn.hang_up = True
            return error_reply(exc, e.opaque), NO_WAIT
        log.info("connection %s: authenticated as %s", conn.peer, e.user)
        return ok(server_proof.encode(), e.opaque), NO_WAIT

    def reply_from_client(self, e, conn):
        if isinstance(e, (ev.Request, ev.Reply)):
            return encode_result(400, b"request-reply is not served by this dispatcher", e.opaque), NO_WAIT
        word = "value" if isinstance(e, ev.Value) else "result"
        msg = "'%s' is a reply, not a request" % word
        return encode_result(400, msg.encode(), e.opaque), NO_WAIT

