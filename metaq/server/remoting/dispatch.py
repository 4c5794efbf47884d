"""RocketMQ remoting requests: name-server codes, broker codes, and the one error→response mapping.

The broker is its own name server: a route names this broker (``ip:port`` of
the remoting port) as the master (broker id 0) of every topic the topic table
accepts, with the topic's partition count as its queue count (``%RETRY%<group>``
and ``%DLQ%<group>``: ``remoting.retry_queues``). With ``replication.ha: auto``
every member names the elected master of its broker id instead, and no master
while an election has none (``RemotingServer.route_addresses``); a member that
is not the master refuses sends with SERVICE_NOT_AVAILABLE (14), as RocketMQ's
slave does, and the client sends again after its next route refresh. With
ZooKeeper, a route also lists every other broker of the cluster holding the topic
and the slaves of each (``RemotingServer.route_brokers``). Queue id =
partition, queue offset = our offset; consumer offsets are the broker's
consumer-offset store, the one the text ``commit_offset`` writes. Sends,
send-backs and end-transaction live in ``remoting.send``. Any other code gets
REQUEST_CODE_NOT_SUPPORTED.

Which codes are served, by which handler, in a greenlet or not, is declared once per code in
``protocol.rocketmq.requests``; the route table is built from there (``route_table``).
"""

import functools
import logging
import os
import time

from metaq import errors
from metaq.keys import limits as keys_limits
from metaq.reqreply.records import reply_topic
from metaq.protocol.rocketmq import requests
from metaq.protocol.rocketmq.remoting import ResponseCode, not_supported, response_for
from metaq.protocol.rocketmq.bodies import (PERM_READ, PERM_WRITE, BrokerData, QueueData, decode_check_client,
                                            decode_heartbeat, encode_cluster_info, encode_consumer_list,
                                            encode_topic_route)
from metaq.protocol.rocketmq.headers import (PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, ConsumerGroupHeader,
                                             PullMessageHeader, QueryConsumerOffsetHeader, QueueHeader,
                                             RouteInfoHeader, SearchOffsetHeader, UnregisterClientHeader,
                                             UpdateConsumerOffsetHeader, ViewMessageHeader, decode_header,
                                             pull_response_fields)
from metaq.protocol.rocketmq.lockbodies import decode_lock_batch, encode_lock_ok
from metaq.protocol.rocketmq.mapping import (PROP_RETRY_TOPIC, message_of_record, parse_subscription,
                                             stored_message_bytes)
from metaq.filters.remoting import EXPRESSION_SQL92, SqlSubscriptions
from metaq.filters.sql import SqlFilter, compiled
from metaq.groups import policy as group_policy
from metaq.clock import now_ms
from metaq.loop.coldpages import bring_in
from metaq.keys import remoting as keys
from metaq.server.remoting.acl import ACL_EXCEPTION, RemotingAcl
from metaq.server.remoting.send import RemotingSender
from metaq.store.record import RecordTooLarge

log = logging.getLogger(__name__)


#: Distinct unsupported request codes logged once each (a client inventing codes gets no more lines or memory).
UNSUPPORTED_LOGGED = 256


def error_response(cmd, exc):
    """The response to ``cmd`` for a MetaqError (the only error→response mapping of the remoting port)."""
    text = str(exc)
    if isinstance(exc, (errors.TopicForbidden, errors.ConsumptionDisabled)):
        code = ResponseCode.NO_PERMISSION  # RocketMQ's broker: a topic without the permission, a disabled group
    elif isinstance(exc, (errors.Unauthenticated, errors.Forbidden)):
        code = ResponseCode.SYSTEM_ERROR  # RocketMQ's broker: an AclException out of its RPC hook (remoting/acl.py)
        text = ACL_EXCEPTION + text
    elif isinstance(exc, (errors.UnknownTopic, errors.InvalidTopic)):
        code = ResponseCode.TOPIC_NOT_EXIST
    elif isinstance(exc, (RecordTooLarge, errors.ChecksumMismatch, errors.BadCompressedBody)):
        code = ResponseCode.MESSAGE_ILLEGAL
    elif isinstance(exc, errors.InvalidPartition):
        code = ResponseCode.SYSTEM_ERROR  # Java's answer to a queue id past the topic's queues
    elif isinstance(exc, errors.ClientError):
        code = ResponseCode.INVALID_PARAMETER
    elif isinstance(exc, errors.Unavailable):
        code = ResponseCode.SERVICE_NOT_AVAILABLE
    elif isinstance(exc, errors.TransactionError):
        code = ResponseCode.TRANSACTION_FAILED
    else:
        code = ResponseCode.SYSTEM_ERROR
    return response_for(cmd, code, text)


def physical_memory():
    """The machine's physical memory in bytes (RocketMQ's TOTAL_PHYSICAL_MEMORY_SIZE); 0 when unknown."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def route_table(owners, sends_wait):
    """``{code: (handler, spawn, takes_signer)}`` of every code the registry declares
    (``protocol.rocketmq.requests``), each handler ``"owner.method"`` found among ``owners`` (``{name: object}``);
    an owner given as None is a feature turned off (request-reply), whose codes are then not served. Raises
    TypeError when a declared code has no handler: the port refuses to start rather than fail on first use.
    ``sends_wait``: whether a send waits (a flush, sync replication), which decides the ``SENDS_WAIT`` policy."""
    table, missing = {}, []
    for code, declared in sorted(requests.table().items()):
        owner_name, _, method = declared.handler.partition(".")
        if owner_name in owners and owners[owner_name] is None:
            continue
        handler = getattr(owners.get(owner_name), method, None)
        if not callable(handler):
            missing.append("%s (%d) -> %s" % (declared.name, code, declared.handler))
            continue
        spawn = sends_wait if declared.spawn == requests.SENDS_WAIT else declared.spawn
        table[code] = (handler, bool(spawn), declared.takes_signer)
    if missing:
        raise TypeError("remoting request codes without a handler: %s" % ", ".join(missing))
    return table


def _ok(cmd, ext_fields=None, body=b""):
    return response_for(cmd, ResponseCode.SUCCESS, None, ext_fields, body)


class RemotingDispatcher:
    def __init__(self, store, stats, config, put_path, tx, roles, waiters, *, broker_name, host, route_brokers,
                 clients, producers, locks, replies, guard, requests, closing):
        """The remoting port's: ``broker_name``; ``host()``, our ``(ip, port)`` as routes give it;
        ``route_brokers(topic)``, a route's brokers (``RemotingServer.route_brokers``); its client tables
        (``clients``: ClientRegistry, ``producers``: ProducerRegistry, ``locks``: LockTable); ``replies``: its
        RemotingReplies (None: request-reply off). ``guard``: the broker's Guard (None: no authentication);
        ``requests``: the ReplyBudget of every connection's requests in progress; ``closing()``: True once the
        broker shuts down."""
        self.config = config
        self.roles = roles
        self.waiters = waiters
        self.broker_name = broker_name
        self.host = host
        self.route_brokers = route_brokers
        self.clients = clients
        self.producers = producers
        self.locks = locks
        self.requests = requests
        self.closing = closing
        self.store = store
        self.stats = stats
        self.max_transfer = config.store.max_transfer_size
        #: The part of the log RocketMQ deems kept in memory (accessMessageInMemoryMaxRatio of the physical memory): a
        #: pull leaving a larger backlog behind is slow, and a group's read_from_slave_when_slow names its slave.
        self.memory_bytes = physical_memory() * config.remoting.access_message_in_memory_max_ratio // 100
        #: The SQL92 subscriptions of the groups' heartbeats: a pull without its own subscription uses them.
        self.sql_subscriptions = SqlSubscriptions(lambda group: bool(clients.consumers(group)))
        self.max_wait_ms = config.limits.max_wait_ms
        self.sender = RemotingSender(host, store, stats, config, put_path, tx)
        self.error_response = error_response
        #: The per-request signature and permission check, with authentication on (remoting/acl.py).
        self.acl = (RemotingAcl(guard, store, self.sender.half_topic, self.sender.half_user,
                                reply_topic(config.remoting.cluster))
                    if guard is not None and guard.enabled else None)
        # Sends wait for their flush or a slave in a greenlet of their own; with neither they answer at once.
        waits = self.sender.path.acks_wait
        # code -> (handler, runs in a greenlet of its own, is given the signer), from the registry
        self._handlers = route_table({"dispatcher": self, "sender": self.sender, "replies": replies}, waits)
        self._unsupported_seen = set()

    def handle(self, cmd, conn):
        """Answer ``cmd`` now, or from a greenlet; False when the connection must close."""
        signer = None
        if self.acl is not None:
            signer = self._allowed(cmd, conn)
            if signer is False:
                return not conn.closed
        entry = self._handlers.get(cmd.code)
        if entry is None:
            if cmd.code not in self._unsupported_seen and len(self._unsupported_seen) < UNSUPPORTED_LOGGED:
                self._unsupported_seen.add(cmd.code)
                log.info("remoting %s: request code %d is not supported", conn.peer, cmd.code)
            self._reply(conn, cmd, not_supported(cmd))
            return True
        handler, spawn, takes_signer = entry
        if takes_signer and signer is not None:  # a pull: a group's retry topic filtered as its signer (acl.py)
            handler = functools.partial(handler, signer=signer)
        if spawn:
            held = len(cmd.body) if cmd.body else 0
            closed = lambda: conn.closed  # noqa: E731
            # the reader waits while the bodies of this connection's requests in progress (unanswered sends), or
            # of every connection's, reach their budget
            if not conn.requests.reserve(held, closed):
                return False
            if not self.requests.reserve(held, closed):
                conn.requests.release(held)
                return False
            conn.spawn(self._run_holding, handler, cmd, conn, held)
            return True
        return self._run(handler, cmd, conn)

    def _run_holding(self, handler, cmd, conn, held):
        try:
            return self._run(handler, cmd, conn)
        finally:
            conn.requests.release(held)
            self.requests.release(held)

    def _allowed(self, cmd, conn):
        """The user who signed ``cmd`` (None for a name-server request) when its signature and permissions pass
        (remoting/acl.py); else False, ``cmd`` answered here, and after a failed authentication the connection
        closed."""
        try:
            return self.acl.check(cmd, conn)
        except errors.Unauthenticated as exc:
            self._reply(conn, cmd, error_response(cmd, exc))
            conn.close()
        except errors.MetaqError as exc:
            self._reply(conn, cmd, error_response(cmd, exc))
        return False

    def _run(self, handler, cmd, conn):
        try:
            response = handler(cmd, conn)
        except errors.MetaqError as exc:
            response = error_response(cmd, exc)
        except Exception:  # noqa: BLE001 - the one place an unexpected error becomes a SYSTEM_ERROR
            log.exception("remoting %s: unexpected error handling request code %d", conn.peer, cmd.code)
            self._reply(conn, cmd, response_for(cmd, ResponseCode.SYSTEM_ERROR, "internal error; see the broker log"))
            conn.close()
            return False
        self._reply(conn, cmd, response)
        return True

    @staticmethod
    def _reply(conn, cmd, response):
        if not cmd.is_oneway:
            conn.send(response)

    # -- name server ---------------------------------------------------------

    def route(self, cmd, conn):
        h = decode_header(RouteInfoHeader, cmd)
        try:
            local = self.store.partitions_of(h.topic)
        except (errors.UnknownTopic, errors.InvalidTopic):
            local = None
        s = self.store.topics.settings_of(h.topic) if local is not None else None  # the topic table: perm, ordered
        own_perm = PERM_READ | PERM_WRITE if s is None else (PERM_READ if s.readable else 0) | (
            PERM_WRITE if s.writable else 0)
        cluster = self.config.remoting.cluster
        brokers, queues = [], []
        for name, addrs, count in self.route_brokers(h.topic):
            perm = PERM_READ | PERM_WRITE  # another broker's topic table is its own
            if count is None:  # ours
                if local is None:
                    continue
                count, perm = local, own_perm
            elif count <= 0:  # a broker that does not hold the topic yet: our count for it (a cluster's brokers
                if local is None:  # share their topic settings); the first send creates it there
                    continue
                count = local
            brokers.append(BrokerData(name, addrs, cluster))
            queues.append(QueueData(name, count, count, perm))
        if not brokers:
            return response_for(cmd, ResponseCode.TOPIC_NOT_EXIST,
                                "No topic route info in name server for the topic: %s" % h.topic)
        order = (";".join("%s:%d" % (q.broker_name, q.write_queue_nums) for q in queues)
                 if s is not None and s.ordered else None)
        return _ok(cmd, body=encode_topic_route(brokers, queues, order))

    def cluster_info(self, cmd, conn):
        cluster = self.config.remoting.cluster
        return _ok(cmd, body=encode_cluster_info([BrokerData(name, addrs, cluster)
                                                  for name, addrs, _count in self.route_brokers(None)]))

    # -- pull ----------------------------------------------------------------

    def pull(self, cmd, conn, signer=None):
        """A pull, answered here: its response holds its body's bytes of the connection's reply budget
        (``connections.ReplyBudget``) until sent."""
        response = self._pull(cmd, conn, signer)
        sent = len(response.body or b"") if response is not None else 0
        try:
            if sent:
                conn.pace("fetch", sent)  # the user's fetch rate: the response waits (connections.Connection.pace)
            if not cmd.is_oneway:
                conn.send(response)
        finally:
            conn.replies.release(sent)
        return None  # sent

    def _pull(self, cmd, conn, signer=None):
        h = decode_header(PullMessageHeader, cmd)
        if self.roles.read_refusal is not None:  # a former master before its epoch handshake (roles.py)
            return response_for(cmd, ResponseCode.SYSTEM_BUSY, self.roles.read_refusal)
        group = self.store.groups.get(h.consumer_group)  # the group's settings (groups/policy.py)
        refusal = group_policy.decide(group, h.consumer_group,
                                      group is not None and self.clients.broadcasting(h.consumer_group, conn)).refusal
        if refusal is not None:  # RocketMQ's broker: NO_PERMISSION naming the group
            return response_for(cmd, ResponseCode.NO_PERMISSION, refusal)
        sql = (h.expression_type or "TAG").upper() == EXPRESSION_SQL92
        if not sql and h.expression_type and h.expression_type.upper() != "TAG":
            return response_for(cmd, ResponseCode.SYSTEM_ERROR, "The broker does not support consumer to filter "
                                "message by %s (only TAG and SQL92 subscriptions)" % h.expression_type)
        if sql and h.sys_flag & PULL_SUBSCRIPTION:
            try:  # RocketMQ's broker: SUBSCRIPTION_PARSE_FAILED, nothing committed
                filt = compiled(h.subscription or "")
            except errors.BadFilterExpression as exc:
                return response_for(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                    "parse the consumer's subscription failed: %s" % exc)
        elif sql:  # the expression of the group's heartbeat (docs/messaging.md "SQL92 filters")
            filt = self.sql_subscriptions.get(h.consumer_group, h.topic)
            if not isinstance(filt, SqlFilter):
                return response_for(cmd, ResponseCode.FILTER_DATA_NOT_EXIST, "The broker's consumer filter data is "
                                    "not exist: %s" % (filt or "no SQL92 subscription of this group and topic in "
                                                               "a heartbeat"))
        else:
            filt = parse_subscription(h.subscription) if h.sys_flag & PULL_SUBSCRIPTION else None
        if h.sys_flag & PULL_COMMIT_OFFSET and h.commit_offset >= 0:
            self._commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset,
                         conn.session.user if conn.session is not None else None)
        max_nums = max(1, h.max_msg_nums)
        key, waiters, end = (h.topic, h.queue_id), self.waiters, self.store.max_offset
        seen = waiters.ends(end, (key,))  # before the read and its reservation (which may yield)
        response, offset = self._pull_held(conn, cmd, h, filt, max_nums, h.queue_offset, signer)
        if response is not None or not h.sys_flag & PULL_SUSPEND or conn.closed:
            return response or self._not_found(cmd, h, offset)
        if not waiters.admit():
            return response_for(cmd, ResponseCode.SYSTEM_BUSY, "too many parked pulls on the broker: the limit is %d"
                                % waiters.max_parked)
        try:
            wait_s = min(max(h.suspend_timeout_millis, 0), self.max_wait_ms) / 1000.0
            deadline = time.monotonic() + wait_s
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closing() or conn.closed:
                    return self._not_found(cmd, h, offset)
                waiters.wait(key, remaining, seen, end)  # at once when an append came since that read began
                seen = waiters.ends(end, (key,))
                response, offset = self._pull_held(conn, cmd, h, filt, max_nums, offset, signer)
                if response is not None:
                    return response
        finally:
            waiters.leave()

    def _pull_held(self, conn, cmd, h, filt, max_nums, offset, signer=None):
        """``_pull_once`` once the connection has room for a full read; the response keeps its body's bytes."""
        budget = conn.replies
        if not budget.reserve(self.max_transfer, lambda: conn.closed):
            return None, offset
        try:
            readable = self.acl.copies_readable(conn, h.topic, signer) if self.acl is not None else None
            response, offset = self._pull_once(cmd, h, filt, max_nums, offset, readable)
        except BaseException:
            budget.release(self.max_transfer)
            raise
        budget.release(self.max_transfer - (len(response.body or b"") if response is not None else 0))
        return response, offset

    def _pull_once(self, cmd, h, filt, max_nums, offset, readable=None):
        """``(response, offset)``: the response when there is something to say now, else None and the offset to
        read from when woken (past the units a filtered read passed over: docs/messaging.md "Tag filtering").
        ``readable``: for a group's retry topic, which copies this user may be served
        (``RemotingAcl.copies_readable``)."""
        store = self.store
        try:
            if filt is None:
                records, next_offset = store.read_records(h.topic, h.queue_id, offset, max_nums, self.max_transfer)
            else:  # the index units' tag hashes first (their cold pages brought in off the loop), then the records;
                # a SQL92 filter reads each record and evaluates its properties (filters/reads.py)
                bring_in(store.tagged_index_ranges(h.topic, h.queue_id, offset))
                r = store.read_tagged(h.topic, h.queue_id, offset, filt, max_nums, self.max_transfer)
                self.stats.filter_skipped_units += r.skipped
                records, next_offset = r.records(), r.next_offset
        except errors.Moved as moved:
            if moved.offset < offset and self.roles.end_unknown:
                # past our end on a slave behind its master: not here yet (RocketMQ's slave does not correct the
                # offset either); moving the consumer back to our end would make it read again
                return None, offset
            return response_for(cmd, ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY",
                                self._pull_fields(h, moved.offset)), offset
        except errors.CorruptRecord as exc:  # never served: SYSTEM_ERROR naming it; nextBeginOffset skips it
            return response_for(cmd, ResponseCode.SYSTEM_ERROR, "CORRUPT_RECORD " + str(exc),
                                self._pull_fields(h, exc.next_offset)), offset
        host = self.host()
        messages = [message_of_record(rec, host) for rec in records]
        if readable is not None:  # passed over like a tag filter's unwanted records
            messages = [m for m in messages if readable(m.properties.get(PROP_RETRY_TOPIC))]
        if not messages:
            if next_offset > offset and next_offset < store.max_offset(h.topic, h.queue_id):
                # a full scan of unwanted units with more after them: pull again from past them at once (RocketMQ)
                return response_for(cmd, ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE",
                                    self._pull_fields(h, next_offset)), next_offset
            return None, next_offset
        self.stats.on_get(h.topic, False)
        body = b"".join(stored_message_bytes(m) for m in messages)
        suggest = group_policy.suggest_broker(self.store.groups.get(h.consumer_group),
                                              store.written_position - records[-1].position, self.memory_bytes)
        return response_for(cmd, ResponseCode.SUCCESS, "FOUND", self._pull_fields(h, next_offset, suggest),
                            body), next_offset

    def _not_found(self, cmd, h, offset):
        """PULL_NOT_FOUND; ``offset`` is past the units a filtered read passed over (the queue's offset otherwise)."""
        self.stats.on_get(h.topic, True)
        return response_for(cmd, ResponseCode.PULL_NOT_FOUND, "NO_NEW_MESSAGE", self._pull_fields(h, offset))

    def _pull_fields(self, h, next_offset, suggest=group_policy.MASTER_ID):
        return pull_response_fields(next_offset, self.store.min_offset(h.topic, h.queue_id),
                                    self.store.max_offset(h.topic, h.queue_id), suggest)

    # -- offsets -------------------------------------------------------------

    def _commit(self, group, topic, queue_id, offset, owner=None):
        """A pull's commit flag: stored on the master only. Elsewhere it is dropped, the pull served, as RocketMQ's
        slave does (its table is the master's copy and would overwrite it)."""
        if self.roles.not_master() is not None:
            return
        try:
            self.store.commit_offset(group, topic, queue_id, offset, now_ms(), owner)
        except errors.ClientError as exc:
            log.info("remoting: offset commit of %s for %s-%d ignored: %s", group, topic, queue_id, exc)

    def query_offset(self, cmd, conn):
        h = decode_header(QueryConsumerOffsetHeader, cmd)
        offset = self.store.query_offset(h.consumer_group, h.topic, h.queue_id)
        if offset is None and h.set_zero_if_not_found and self.store.min_offset(h.topic, h.queue_id) == 0:
            offset = 0  # as Java: a group new to a queue that still holds its first message starts there
        if offset is None:
            return response_for(cmd, ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group "
                                "consumer boot first")
        return _ok(cmd, {"offset": offset})

    def update_offset(self, cmd, conn):
        """RocketMQ's broker stores any offset and answers SUCCESS; a pull from past the queue's end is then
        told PULL_OFFSET_MOVED to the end. We answer SUCCESS too but store at most the queue's end now, so what
        is written after this commit is never skipped (the text ``commit_offset`` refuses such an offset: 400).
        A broker that is not the master answers SERVICE_NOT_AVAILABLE ``NOT_MASTER: ...`` naming the master when it
        knows it, and stores nothing (``PutPath.check_master``, as the text ``commit_offset``)."""
        h = decode_header(UpdateConsumerOffsetHeader, cmd)
        self.sender.path.check_master()
        if h.commit_offset >= 0:  # a negative offset is ignored, never stored
            end = self.store.max_offset(h.topic, h.queue_id)
            self.store.commit_offset(h.consumer_group, h.topic, h.queue_id, min(h.commit_offset, end), now_ms(),
                                     conn.session.user if conn.session is not None else None)
        return _ok(cmd)

    def search_offset(self, cmd, conn):
        h = decode_header(SearchOffsetHeader, cmd)
        upper = h.boundary_type.lower() == "upper"
        return _ok(cmd, {"offset": self.store.offset_by_time(h.topic, h.queue_id, h.timestamp, upper)})

    def max_offset(self, cmd, conn):
        h = decode_header(QueueHeader, cmd)
        return _ok(cmd, {"offset": self.store.max_offset(h.topic, h.queue_id)})

    def min_offset(self, cmd, conn):
        h = decode_header(QueueHeader, cmd)
        return _ok(cmd, {"offset": self.store.min_offset(h.topic, h.queue_id)})

    def earliest_time(self, cmd, conn):
        h = decode_header(QueueHeader, cmd)
        first = self.store.min_offset(h.topic, h.queue_id)
        records, _next = self.store.read_records(h.topic, h.queue_id, first, 1, 1)
        return _ok(cmd, {"timestamp": records[0].store_ts_ms if records else -1})

    def view_message(self, cmd, conn):
        h = decode_header(ViewMessageHeader, cmd)
        rec = self.store.record_at(h.offset)
        host = self.host()
        conn.pace("fetch", len(rec.data))  # the user's fetch rate: the response waits (Connection.pace)
        return _ok(cmd, body=stored_message_bytes(message_of_record(rec, host)))

    def query_message(self, cmd, conn):
        """QUERY_MESSAGE, answered here like a pull: the page reserves its most (``MAX_KEY_QUERY_BYTES``) of the
        connection's reply budget before it reads and holds its body's bytes until sent, so a client that
        pipelines queries and never reads stops its own queries instead of growing the broker."""
        budget, held = conn.replies, keys_limits.MAX_KEY_QUERY_BYTES
        if not budget.reserve(held, lambda: conn.closed):
            return None
        try:
            try:
                response = keys.query_message(self.store, cmd, self.host())
            except errors.MetaqError as exc:
                response = error_response(cmd, exc)
            used = len(response.body or b"")
            budget.release(held - used)
            held = used
            conn.pace("fetch", used)  # the user's fetch rate: the response waits (Connection.pace)
            if not cmd.is_oneway:
                conn.send(response)
        finally:
            budget.release(held)
        return None  # sent

    # -- clients -------------------------------------------------------------

    def heartbeat(self, cmd, conn):
        hb = decode_heartbeat(cmd.body, cmd.opaque)
        self.sql_subscriptions.check(hb.consumers)  # before anything of it is recorded
        for c in hb.consumers:  # a BROADCASTING consumer of a group whose settings refuse it (groups/policy.py)
            if c.message_model == "BROADCASTING":
                group_policy.require(self.store.groups.get(c.group_name), c.group_name, broadcasting=True)
        self.producers.heartbeat(conn, hb.producer_groups, time.monotonic(), hb.client_id)  # the check-back's channels
        self.clients.heartbeat(conn, hb, time.monotonic())
        self.sql_subscriptions.heartbeat(hb.consumers)
        return _ok(cmd)

    def check_client_config(self, cmd, conn):
        """CHECK_CLIENT_CONFIG: whether the broker takes a subscription, as RocketMQ's broker answers it (a Java
        push consumer with an SQL92 subscription asks before it starts): TAG yes, SQL92 when it compiles
        (SUBSCRIPTION_PARSE_FAILED naming the position otherwise), any other type SYSTEM_ERROR."""
        sub = decode_check_client(cmd.body, cmd.opaque).subscription
        kind = (sub.expression_type or "TAG").upper()
        if kind == "TAG":
            return _ok(cmd)
        if kind != EXPRESSION_SQL92:
            return response_for(cmd, ResponseCode.SYSTEM_ERROR, "The broker does not support consumer to filter "
                                "message by %s (only TAG and SQL92 subscriptions)" % sub.expression_type)
        try:
            compiled(sub.sub_string)
        except errors.BadFilterExpression as exc:
            return response_for(cmd, ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return _ok(cmd)

    def unregister(self, cmd, conn):
        h = decode_header(UnregisterClientHeader, cmd)
        if h.consumer_group:
            self.clients.unregister(h.client_id, h.consumer_group)
            self.locks.release_client(h.consumer_group, h.client_id, conn)
        if h.producer_group:
            self.producers.unregister(conn, h.producer_group)
        return _ok(cmd)

    def consumer_list(self, cmd, conn):
        h = decode_header(ConsumerGroupHeader, cmd)
        ids = self.clients.consumers(h.consumer_group)
        if not ids:
            return response_for(cmd, ResponseCode.SYSTEM_ERROR, "no consumer for this group, %s" % h.consumer_group)
        return _ok(cmd, body=encode_consumer_list(ids))

    # -- orderly consumers: queue locks (remoting/locks.py) ----------------------------------------

    def lock_batch(self, cmd, conn):
        """LOCK_BATCH_MQ: lock or renew the queues of ``mqSet`` for the client; the answer lists those it holds.

        Only a client registered in the group (its last heartbeat) through this very connection may lock, so a
        connection cannot lock, or renew, in another client's name unless it heartbeats as that client; a queue
        of another broker, of a topic the broker does not have or past the topic's queues is never locked."""
        body = decode_lock_batch(cmd.body, cmd.opaque)
        if not self.clients.registered_through(body.consumer_group, body.client_id, conn):
            return response_for(cmd, ResponseCode.SYSTEM_ERROR, "client %s is not registered in consumer group %s "
                                "on this connection: a heartbeat comes first" % (body.client_id, body.consumer_group))
        queues = [mq for mq in dict.fromkeys(body.mq_set) if self._lockable(mq)]
        table = self.locks
        full = table.full_refusals
        got = set(table.lock(body.consumer_group, body.client_id, conn, [(mq.topic, mq.queue_id) for mq in queues],
                             time.monotonic()))
        if table.full_refusals != full:
            log.warning("remoting %s: %d queue locks refused: the lock table is full (%d locks, remoting.max_locks)",
                        conn.peer, table.full_refusals - full, table.max_locks)
        return _ok(cmd, body=encode_lock_ok([mq for mq in queues if (mq.topic, mq.queue_id) in got]))

    def _lockable(self, mq):
        if mq.broker_name != self.broker_name:
            return False
        try:
            return 0 <= mq.queue_id < self.store.partitions_of(mq.topic)
        except (errors.UnknownTopic, errors.InvalidTopic):
            return False

    def unlock_batch(self, cmd, conn):
        """UNLOCK_BATCH_MQ: release the queues of ``mqSet`` this client holds through this connection."""
        body = decode_lock_batch(cmd.body, cmd.opaque, "unlock batch body")
        self.locks.unlock(body.consumer_group, body.client_id, conn, [(mq.topic, mq.queue_id)
                                                                            for mq in body.mq_set])
        return _ok(cmd)
