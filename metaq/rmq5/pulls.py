"""RocketMQ 5's pull consumers over gRPC: PullMessage, UpdateOffset, GetOffset, QueryOffset.

Offset-based reads, the remoting port's PULL_MESSAGE over the same store calls (``read_records``; with a filter
expression ``read_tagged``, its index's cold pages brought in off the loop first), and the group offsets of the
broker's consumer-offset store, the one the text ``commit_offset`` and RocketMQ's UPDATE_CONSUMER_OFFSET write: an
offset committed here is the one every other protocol reads, and the other way round.

PullMessage answers a server stream in the shape of RocketMQ's proxy (its pull response writer): a status (OK, then
the messages; MESSAGE_NOT_FOUND "no new message"; ILLEGAL_OFFSET for an offset outside the queue), then
``next_offset``, where the next pull starts; a refusal (names, permission, a filter that does not parse) is its
status alone. With nothing to read the call is a long poll of ``long_polling_timeout`` (none given: the call's
deadline), within the call's deadline less ``POLL_RESERVE_MS`` and ``limits.max_wait_ms``, woken by a put on the
queue, counted among the broker's parked long polls (``limits.max_parked_gets``: past it TOO_MANY_REQUESTS) and its
user's (the ``parked_gets`` quota, alike); a call the client resets (or whose connection ends) stops waiting at once.
``batch_size`` is at most ``limits.GRPC_PULL_MAX_BATCH`` (more is served as that many, as RocketMQ's broker caps a
pull); below 1 it is BAD_REQUEST. TAG and SQL92 filter expressions are honoured as the remoting pull honours them
(the unwanted records passed over, ``next_offset`` past them); a read that passes over only unwanted records is
followed by another in the same call, at most ``PULL_FILTER_ROUNDS``.

The permission decision is the remoting port's (``protocol.rocketmq.requests``): a pull, UpdateOffset and GetOffset
need SUB on the group and SUB on the topic (a ``%RETRY%<group>`` topic: its group's, and of its copies only those
of topics the user may read are served); QueryOffset needs SUB on the topic. A pull of a group whose consumption
is disabled (docs/concepts.md "Per-group settings") is FORBIDDEN naming the group. An offset commit is the
master's (HA_NOT_AVAILABLE elsewhere), stored at most at the queue's end, under the caller's quota of offsets.
"""

import time

from metaq import errors, limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.auth.acl import SUB
from metaq.filters.sql import compiled
from metaq.groups import policy as group_policy
from metaq.protocol.rocketmq.mapping import PROP_RETRY_TOPIC, message_of_record, parse_subscription
from metaq.protocol.rocketmq.requests import copies_readable, resource
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.records import Refusal
from metaq.rmq5.calls import code_of, paced_wait
from metaq.rmq5.messagebytes import record_response_bytes, response_bytes
from metaq.rmq5.calls import status as _status
from metaq.clock import now_ms
from metaq.loop.coldpages import bring_in

#: What a long poll keeps of the call's deadline to answer in (as ReceiveMessage's).
POLL_RESERVE_MS = 300
#: Reads one PullMessage makes while each passed over only records its filter does not want (each read scans at
#: most the store's filter scan of index units); then it answers MESSAGE_NOT_FOUND with ``next_offset`` past them.
PULL_FILTER_ROUNDS = 16


class PullService:
    """The four RPCs (see the module doc), given what they use: the store (reads, offsets, the offset store),
    the guard (None: no authentication), the broker's ``PartitionWaiters`` (long polls, woken by puts), its
    ``Roles`` (``read_refusal``, ``end_unknown``), ``check_master()`` (the put path's: raises NotMaster),
    ``host()`` (the store host messages name), ``max_transfer`` (bytes one read returns at most) and
    ``max_wait_ms`` (``limits.max_wait_ms``)."""

    def __init__(self, store, guard, waiters, roles, check_master, host, max_transfer, max_wait_ms=limits.MAX_WAIT_MS):
        self.store = store
        self.guard = guard
        self.waiters = waiters
        self.roles = roles
        self.check_master = check_master
        self.host = host
        self.max_transfer = max_transfer
        self.max_wait_ms = max_wait_ms

    def rpcs(self):
        """``{rpc: (request type, handler)}``, as ``MessagingService.unary`` holds them."""
        return {"PullMessage": (pb.PullMessageRequest, self.pull_message),
                "UpdateOffset": (pb.UpdateOffsetRequest, self.update_offset),
                "GetOffset": (pb.GetOffsetRequest, self.get_offset),
                "QueryOffset": (pb.QueryOffsetRequest, self.query_offset)}

    # -- checks --------------------------------------------------------------------------------------------------

    def _queue(self, mq):
        """``(topic, queue id)`` of a MessageQueue, the topic's name legal (the queue is checked once the caller may
        know the topic: ``_exists``)."""
        try:
            limits.validate_topic(mq.topic.name)
        except errors.InvalidTopic as exc:
            raise Refusal("ILLEGAL_TOPIC", str(exc)) from None
        return mq.topic.name, mq.id

    def _exists(self, topic, queue):
        """The queue is one of the topic's (TOPIC_NOT_FOUND, BAD_REQUEST otherwise): asked after the permission
        check, so that a user who may not read a topic is not told whether it exists."""
        try:
            limits.validate_partition(queue, self.store.partitions_of(topic))
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None

    def _group(self, group):
        try:
            limits.validate_group(group)
        except errors.InvalidTopic as exc:
            raise Refusal("ILLEGAL_CONSUMER_GROUP", str(exc)) from None
        return group

    def _require(self, call, *needs):
        guard = self.guard
        if guard is None or not guard.enabled:
            return
        try:
            for need in needs:
                guard.require(call.session, *need)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None

    def _readable(self, call, topic):
        """``requests.copies_readable`` for this call's user (None without authentication)."""
        return None if self.guard is None else copies_readable(self.guard, call.session, topic)

    # -- PullMessage ---------------------------------------------------------------------------------------------

    def pull_message(self, request, call):
        """The stream (a list of responses): a status, the messages (each its response's bytes, ``messagebytes``),
        ``next_offset`` (see the module doc)."""
        group = self._group(request.group.name)
        topic, queue = self._queue(request.message_queue)
        self._require(call, (SUB, "group", group), resource(SUB, topic))
        self._exists(topic, queue)
        if request.batch_size < 1:
            raise Refusal("BAD_REQUEST", "batch_size must be at least 1, not %d" % request.batch_size)
        batch = min(request.batch_size, rmq5_limits.GRPC_PULL_MAX_BATCH)
        filt = _filter_of(request.filter_expression)
        if self.roles is not None and self.roles.read_refusal is not None:
            raise Refusal("HA_NOT_AVAILABLE", self.roles.read_refusal)
        refusal = group_policy.decide(self.store.groups.get(group), group).refusal  # the group's settings
        if refusal is not None:  # the proxy's answer to the broker's NO_PERMISSION
            raise Refusal("FORBIDDEN", refusal)
        readable = self._readable(call, topic)
        budget = int(call.timeout_s * 1000) - POLL_RESERVE_MS
        wait = _duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else budget
        wait = max(0, min(wait, budget, self.max_wait_ms))
        offset = request.offset
        if not paced_wait(self.guard, call, time.monotonic() + max(0, budget) / 1000.0):  # its user's fetch rate
            return self._none(offset)
        key, waiters, end = (topic, queue), self.waiters, self.store.max_offset
        seen = waiters.ends(end, (key,))  # before the read (a filter's cold pages are brought in off the loop)
        answer, offset = self._read(topic, queue, offset, filt, batch, readable, call)
        if answer is not None or wait <= 0:
            return answer or self._none(offset)
        user, cancel = getattr(call, "user", None), getattr(call, "cancelled", None)
        try:
            admitted = waiters.admit(user)
        except errors.QuotaExceeded as exc:
            raise Refusal("TOO_MANY_REQUESTS", str(exc)) from None
        if not admitted:
            raise Refusal("TOO_MANY_REQUESTS", "too many parked long polls on the broker: the limit is %d"
                          % waiters.max_parked)
        try:
            deadline = time.monotonic() + wait / 1000.0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or waiters.closed or (cancel is not None and cancel.is_set()):
                    return self._none(offset)
                waiters.wait(key, remaining, seen, end, cancel)  # at once when an append came since that read began
                seen = waiters.ends(end, (key,))
                answer, offset = self._read(topic, queue, offset, filt, batch, readable, call)
                if answer is not None:
                    return answer
        finally:
            waiters.leave(user)

    @staticmethod
    def _none(offset):
        return [pb.PullMessageResponse(status=_status("MESSAGE_NOT_FOUND", "no new message")),
                pb.PullMessageResponse(next_offset=offset)]

    def _read(self, topic, queue, offset, filt, batch, readable, call):
        """``(responses, offset)``: the responses when there is something to say now, else None and the offset to
        read from when woken (past the records a filter passed over). The records answered are charged to the
        call's user's fetch rate (``Guard.pace``; the next pull waits for them: ``paced_wait``)."""
        store = self.store
        for _round in range(PULL_FILTER_ROUNDS):
            try:
                if filt is None:
                    records, next_offset = store.read_records(topic, queue, offset, batch, self.max_transfer)
                else:
                    bring_in(store.tagged_index_ranges(topic, queue, offset))
                    r = store.read_tagged(topic, queue, offset, filt, batch, self.max_transfer)
                    records, next_offset = r.records(), r.next_offset
            except errors.Moved as moved:
                if moved.offset < offset and self.roles is not None and self.roles.end_unknown:
                    return None, offset  # past our end on a slave behind its master: not here yet
                return [pb.PullMessageResponse(status=_status("ILLEGAL_OFFSET", "offset %d is outside the queue: "
                                                              "pull from %d" % (offset, moved.offset))),
                        pb.PullMessageResponse(next_offset=moved.offset)], offset
            except errors.CorruptRecord as exc:  # never served; next_offset skips it
                return [pb.PullMessageResponse(status=_status("INTERNAL_SERVER_ERROR", "CORRUPT_RECORD %s" % exc)),
                        pb.PullMessageResponse(next_offset=exc.next_offset)], offset
            except errors.MetaqError as exc:
                raise Refusal(code_of(exc), str(exc)) from None
            host = self.host()
            if readable is None:  # a message is mapped here only for the check to read its properties
                messages = [(rec, None) for rec in records]
            else:
                messages = [(rec, m) for rec, m in ((rec, message_of_record(rec, host)) for rec in records)
                            if readable(m.properties.get(PROP_RETRY_TOPIC))]
            if messages:
                if self.guard is not None:
                    self.guard.pace(call, "fetch", sum(len(rec.data) for rec, _m in messages))
                return [pb.PullMessageResponse(status=_status("OK"))] + [
                    record_response_bytes(rec, host, self.max_transfer) if m is None else
                    response_bytes(m, host, self.max_transfer, rec.msg_id) for rec, m in messages] + [
                    pb.PullMessageResponse(next_offset=next_offset)], next_offset
            if not (offset < next_offset < store.max_offset(topic, queue)):
                return None, next_offset  # at the queue's end: a long poll may wait for more
            offset = next_offset  # a scan of unwanted records with more after them: read on
        return self._none(offset), offset

    # -- offsets -------------------------------------------------------------------------------------------------

    def update_offset(self, request, call):
        """The group's offset of the queue (the master's: HA_NOT_AVAILABLE elsewhere), at most the queue's end; a
        negative one ILLEGAL_OFFSET."""
        group = self._group(request.group.name)
        topic, queue = self._queue(request.message_queue)
        self._require(call, (SUB, "group", group), resource(SUB, topic))
        self._exists(topic, queue)
        if request.offset < 0:
            raise Refusal("ILLEGAL_OFFSET", "an offset may not be negative (%d)" % request.offset)
        try:
            self.check_master()
            end = self.store.max_offset(topic, queue)
            self.store.commit_offset(group, topic, queue, min(request.offset, end), now_ms(),
                                     call.session.user if call.session is not None else None)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        return pb.UpdateOffsetResponse(status=_status("OK"))

    def get_offset(self, request, call):
        """The group's committed offset of the queue; OFFSET_NOT_FOUND when it committed none."""
        group = self._group(request.group.name)
        topic, queue = self._queue(request.message_queue)
        self._require(call, (SUB, "group", group), resource(SUB, topic))
        self._exists(topic, queue)
        try:
            offset = self.store.query_offset(group, topic, queue)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        if offset is None:
            raise Refusal("OFFSET_NOT_FOUND", "group %s has committed no offset of %s queue %d"
                          % (group, topic[:256], queue))
        return pb.GetOffsetResponse(status=_status("OK"), offset=offset)

    def query_offset(self, request, call):
        """BEGINNING: the queue's first offset still held; END: the offset its next message gets; TIMESTAMP: the
        first stored at or after ``timestamp`` (END when none is), BAD_REQUEST without one."""
        topic, queue = self._queue(request.message_queue)
        self._require(call, resource(SUB, topic))
        self._exists(topic, queue)
        policy = request.query_offset_policy
        try:
            if policy == pb.BEGINNING:
                offset = self.store.min_offset(topic, queue)
            elif policy == pb.END:
                offset = self.store.max_offset(topic, queue)
            elif policy == pb.TIMESTAMP:
                if not request.HasField("timestamp"):
                    raise Refusal("BAD_REQUEST", "the TIMESTAMP policy needs a timestamp")
                offset = self.store.offset_by_time(topic, queue, _timestamp_ms(request.timestamp))
            else:
                raise Refusal("BAD_REQUEST", "unknown query_offset_policy %d" % policy)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        return pb.QueryOffsetResponse(status=_status("OK"), offset=offset)


def _filter_of(expression):
    """The store's filter of a pull's expression (TAG: a ``TagFilter``, SQL: a ``SqlFilter``), None for every
    message; Refusal ILLEGAL_FILTER_EXPRESSION when it does not parse."""
    try:
        if expression.type == pb.SQL:
            return compiled(expression.expression)
        return parse_subscription(expression.expression)
    except errors.ClientError as exc:
        raise Refusal("ILLEGAL_FILTER_EXPRESSION", str(exc)) from None


def _duration_ms(d):
    return d.seconds * 1000 + d.nanos // 1_000_000


def _timestamp_ms(ts):
    return ts.seconds * 1000 + ts.nanos // 1_000_000
