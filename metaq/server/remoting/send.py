"""RocketMQ sends over the shared put path: SEND_MESSAGE (v1, v2, batch), CONSUMER_SEND_MSG_BACK, and
half messages with END_TRANSACTION over metaq's transactions (``metaq.transactions.service``,
``metaq.transactions.state``; their check-back: ``metaq.transactions.remoting``).

Every handler runs in a greenlet of its own and answers once the put may be
acknowledged (``PutPath.durable``: the flush in ``sync`` mode, a slave in
``sync`` replication). The response's ``msgId`` is the offset message id
(store ip + remoting port + the record's commit-log position), which is what
consumers compute from each pulled record and what CONSUMER_SEND_MSG_BACK
sends back as ``offset``.

A send carrying the properties ``METAQ_PID`` and ``METAQ_SEQ`` is an idempotent
put (``metaq.idempotence.records``): stored once per (pid, topic, queue, seq);
a resend is answered SUCCESS with the original's offset message id and queue
offset, once the original is durable. It needs an explicit queue id and may
not be a batch, a delayed or a transactional (half) message.

Delays (a ``DELAY`` property, or a send-back's delay level) go to the delay
scheduler (``PutPath.delay``, ``DelayScheduler.put_delayed``, levels from
``delay.levels``, a level past the last meaning the last); the message becomes
visible in its topic when its level's time has passed.
"""

import logging
import random

from metaq import errors, limits
from metaq.groups import policy as group_policy
from metaq.protocol.compression import COMPRESSION_BITS
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.idempotence.records import PID_PROPERTY, SEQ_PROPERTY, check_identity
from metaq.protocol.journaltopic import DLQ_PREFIX, RETRY_PREFIX
from metaq.priorities.wire import level_topic
from metaq.reqreply.records import CLUSTER, is_request
from metaq.protocol.rocketmq.remoting import ResponseCode, response_for
from metaq.protocol.rocketmq.bodies import (SYSFLAG_TRANSACTION_PREPARED, create_offset_msg_id,
                                            decode_batch_messages, decode_properties)
from metaq.protocol.rocketmq.headers import (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE,
                                             ConsumerSendMsgBackHeader, EndTransactionHeader, decode_header,
                                             decode_send_header, send_response_fields)
from metaq.protocol.properties import PROP_UNIQ_KEY
from metaq.protocol.rocketmq.mapping import (
    PROP_CHECK_IMMUNITY,
    PROP_DELAY,
    PROP_TRAN_MSG,
    message_of_record,
    record_data_from_send,
    retry_copy,
)
from metaq.timers.records import ENTRY, TIMER_TOPIC, owner_field, timer_due, timer_property
from metaq.transactions.policy import immunity_ms
from metaq.transactions.state import HALF_ID_BASE, HALF_OWNER, half_txid
from metaq.clock import now_ms
from metaq.loop.inflate import inflate_body
from metaq.serving.putpath import AUTHORIZED
from metaq.store.record import RecordTooLarge, record_size

log = logging.getLogger(__name__)


class RemotingSender:
    def __init__(self, host, store, stats, config, put_path, tx):
        """``host()``: our ``(ip, port)`` as routes give it (in message ids)."""
        self.stats = stats
        self.tx = tx
        self.host = host
        self.store = store
        self.path = put_path
        self.max_body = config.limits.max_body_bytes
        cfg = config.remoting
        self.max_batch = max(cfg.max_frame_bytes, self.max_body)  # what an uncompressed batch may hold: one frame
        self.max_reconsume_times = cfg.max_reconsume_times
        self.send_back_delay_level = cfg.send_back_delay_level
        self.max_half = cfg.max_half_messages
        self.cluster = cfg.cluster

    # -- the put itself -------------------------------------------------------

    def _append(self, topic, partition, flag, data, born_ms, now, delay_level=0, priority=None, due_ms=None,
                owner=None):
        """Append (or schedule, as user ``owner``'s) one message (``priority``: to that level, docs/messaging.md
        "Priorities"); returns ``(PutResult, offset message id)``."""
        if len(data) > self.max_body:
            raise RecordTooLarge("message of %d bytes exceeds limits.max_body_bytes (%d)" % (len(data), self.max_body))
        if partition < 0:
            partition = random.randrange(self.store.partitions_of(topic))
        r = self.path.append(topic, partition, flag, data, now, born_ms=born_ms, delay_level=delay_level,
                             priority=priority, due_ms=due_ms, owner=owner)
        if priority:
            topic = level_topic(topic, priority)  # the record's topic: where the message is stored
        if due_ms is not None:  # the id names the timer entry (docs/messaging.md "Any delivery time")
            stored = (TIMER_TOPIC, ENTRY.size + len(topic.encode("utf-8")) + len(data)
                      + (0 if owner is None else len(owner_field(owner))))
        elif delay_level > 0:  # the id names the schedule entry, like RocketMQ's id of a scheduled message
            stored = (SCHEDULE_TOPIC, ENTRY.size + len(topic.encode("utf-8")) + len(data))
        else:
            stored = (topic, len(data))
        position = r.log_end - record_size(len(stored[0].encode("utf-8")), stored[1])
        return r, create_offset_msg_id(*self.host(), position)

    def _store(self, topic, partition, flag, data, born_ms, delay_level=0, priority=None, timer=None, owner=None):
        """``_append`` one message and wait until it may be acknowledged; returns ``(partition, offset, msg_id)``."""
        now = now_ms()
        r, msg_id = self._append(topic, partition, flag, data, born_ms, now, delay_level, priority,
                                 None if timer is None else timer_due(timer, now), owner)
        self.path.durable(topic, r.partition, r.log_end, now)
        return r.partition, r.offset, msg_id

    # -- SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE --------------------

    def send(self, cmd, conn):
        h = decode_send_header(cmd)
        topic = h.topic
        self.path.check_write(topic, AUTHORIZED)  # the user's permission: the port's ACL (remoting/acl.py)
        refused = self.path.creation_refusal(topic, conn.session)  # the user's quota of topics it creates
        if refused is not None:
            raise refused
        if h.sys_flag & SYSFLAG_TRANSACTION_PREPARED:
            return self._send_half(cmd, h, topic, conn)
        if topic.startswith(RETRY_PREFIX):
            topic = self._retry_or_dlq(topic, h.reconsume_times, h.max_reconsume_times, cmd.version)
        if h.batch or cmd.code == 320:
            return self._send_batch(cmd, h, topic, conn)
        props = decode_properties(h.properties)
        if is_request(props):  # a request-reply request: the replier's reply topic names our cluster (RocketMQ)
            props[CLUSTER] = self.cluster
        level = _delay_level(props)
        timer = timer_property(props)  # RocketMQ 5's TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS
        if timer is not None and level:
            raise errors.ClientError("a message cannot have both %s and a DELAY level" % timer[0])
        identity = _identity(props)
        priority = _priority(props)
        if priority is not None and identity is not None:
            raise errors.ClientError("a message with a %s cannot be idempotent" % PRIORITY_PROPERTY)
        flag, data = record_data_from_send(self._body(h.sys_flag, cmd.body), props, h.flag,
                                           h.sys_flag & ~COMPRESSION_BITS, h.reconsume_times, conn.peer)
        if identity is not None:
            return self._send_idempotent(cmd, h, topic, flag, data, identity, level or timer, conn)
        partition, offset, msg_id = self._store(topic, h.queue_id, flag, data, h.born_timestamp, level, priority,
                                                timer, conn.session.user if conn.session else None)
        return response_for(cmd, ResponseCode.SUCCESS, None, _send_fields(msg_id, partition, offset))

    def _body(self, sys_flag, body):
        """The body as stored: decompressed when ``sys_flag`` says it is compressed (docs/rocketmq.md "Compressed
        bodies")."""
        return inflate_body(sys_flag, body, self.max_body)

    def _send_idempotent(self, cmd, h, topic, flag, data, identity, level, conn):
        """A send with ``METAQ_PID``/``METAQ_SEQ`` (taken out of ``data``'s properties: the store adds them)."""
        if level or h.queue_id < 0:
            raise errors.ClientError("a message with %s/%s needs an explicit queue id and no delay"
                                     % (PID_PROPERTY, SEQ_PROPERTY))
        if len(data) > self.max_body:
            raise RecordTooLarge("message of %d bytes exceeds limits.max_body_bytes (%d)" % (len(data), self.max_body))
        now = now_ms()
        r, position, _dup = self.path.append_idempotent(topic, h.queue_id, flag, data, now, identity[0],
                                                        identity[1], born_ms=h.born_timestamp,
                                                        owner=conn.session.user if conn.session else None)
        if r.log_end:
            self.path.durable(topic, r.partition, r.log_end, now)
        msg_id = create_offset_msg_id(*self.host(), position)
        return response_for(cmd, ResponseCode.SUCCESS, None, _send_fields(msg_id, r.partition, r.offset))

    def _send_batch(self, cmd, h, topic, conn):
        entries = decode_batch_messages(cmd.body, cmd.opaque)
        if not entries:
            raise errors.ClientError("a batch send must hold at least one message")
        if any(PID_PROPERTY in e.properties or SEQ_PROPERTY in e.properties for e in entries):
            raise errors.ClientError("a batch cannot hold idempotent messages (%s/%s): send them one by one"
                                     % (PID_PROPERTY, SEQ_PROPERTY))
        if any(timer_property(e.properties) for e in entries):
            raise errors.ClientError("a batch cannot hold messages with a delivery time: send them one by one")
        if any(PRIORITY_PROPERTY in e.properties for e in entries):
            raise errors.ClientError("a batch cannot hold messages with a %s: send them one by one" % PRIORITY_PROPERTY)
        partition = h.queue_id
        if partition < 0:
            partition = random.randrange(self.store.partitions_of(topic))
        # a batch's sysFlag is each of its messages' (RocketMQ stores it on every one): each body is inflated within
        # limits.max_body_bytes, and all of them together within what the same batch sent uncompressed may hold,
        # one frame (remoting.max_frame_bytes): 150 zip bombs of 4 MiB each were 1.2 GB when only each was bounded
        datas, left = [], self.max_batch
        for e in entries:
            try:
                body = inflate_body(h.sys_flag, e.body, min(left, self.max_body))
            except errors.BadCompressedBody as exc:
                if left >= self.max_body:  # past the message's own limit: its own fault, whatever the others
                    raise
                raise errors.BadCompressedBody("the batch's messages decompress to more than remoting.max_frame_bytes "
                                               "(%d) in all (%s)" % (self.max_batch, exc)) from None
            if h.sys_flag & COMPRESSION_BITS:
                left -= len(body)
            datas.append(record_data_from_send(body, e.properties, e.flag, h.sys_flag & ~COMPRESSION_BITS, 0,
                                               conn.peer))
        now = now_ms()
        results = [self._append(topic, partition, flag, data, h.born_timestamp, now) for flag, data in datas]
        last = results[-1][0]
        self.path.durable(topic, last.partition, last.log_end, now)  # one wait covers the whole batch
        return response_for(cmd, ResponseCode.SUCCESS, None,
                            _send_fields(",".join(i for _r, i in results), last.partition, results[0][0].offset))

    def _retry_or_dlq(self, topic, reconsume_times, max_times, version):
        """A client re-sending a failed message itself: past the maximum it goes to the dead-letter topic."""
        limit = self._max_times(topic[len(RETRY_PREFIX):], max_times, version)
        if reconsume_times >= limit:
            return DLQ_PREFIX + topic[len(RETRY_PREFIX):]
        return topic

    def _max_times(self, group, max_times, version):
        """The request's maxReconsumeTimes (Java honours it from V3_4_9, 121), else the group's ``max_retries``
        (groups/policy.py), else the broker's ``remoting.max_reconsume_times``."""
        requested = max_times if max_times is not None and version >= 121 else None
        return group_policy.max_reconsume_times(self.store.groups.get(group), requested, self.max_reconsume_times)

    # -- CONSUMER_SEND_MSG_BACK -----------------------------------------------

    def send_back(self, cmd, conn):
        h = decode_header(ConsumerSendMsgBackHeader, cmd)
        self.path.check_writable()
        host = self.host()
        msg = message_of_record(self.store.record_at(h.offset), host)
        dead, props, times = retry_copy(msg, host, self._max_times(h.group, h.max_reconsume_times, cmd.version))
        props.pop(PID_PROPERTY, None)  # the copy is a new message, not an idempotent put's record
        props.pop(SEQ_PROPERTY, None)
        if dead or h.delay_level < 0:
            topic, level = DLQ_PREFIX + h.group, 0
            log.info("remoting: message %s of %s goes to %s after %d deliveries", props.get("ORIGIN_MESSAGE_ID"),
                     msg.topic, topic, times)
        else:
            topic, level = RETRY_PREFIX + h.group, self._retry_level(h.delay_level, msg.reconsume_times)
        # a record stored compressed by an older metaq is copied decompressed, like every body stored now
        body = self._body(msg.sys_flag, msg.body)
        born = "%s:%d" % msg.born_host if msg.born_host != host else None
        flag, data = record_data_from_send(body, props, msg.flag, msg.sys_flag & ~COMPRESSION_BITS, times, born)
        self._store(topic, -1, flag, data, msg.born_timestamp, level)
        return response_for(cmd, ResponseCode.SUCCESS)

    def _retry_level(self, requested, reconsume_times):
        if requested > 0:
            return requested
        if self.send_back_delay_level is not None:
            return self.send_back_delay_level
        return 3 + reconsume_times  # RocketMQ's rule: 10 s, then 30 s, 1 min, 2 min ...

    # -- half messages and END_TRANSACTION ------------------------------------------

    def _send_half(self, cmd, h, topic, conn):
        """A half message: a local transaction of its own (``metaq.transactions.state``: journaled, invisible) until
        its end.

        The response's queue offset is the half message's number and its message id names
        ``HALF_ID_BASE + number`` (never a log position): END_TRANSACTION and the check-back bring both back.
        It belongs to its producer group, not to its connection: it survives the connection and a restart,
        and is ended by an END_TRANSACTION from any connection naming the group, or by the check-back
        (``metaq.transactions.remoting.CheckBack``) after ``remoting.transaction_check_max`` unanswered checks. The
        journal is durable (``transactions.journal_flush``) before the send is answered.
        """
        if h.batch or cmd.code == 320:
            raise errors.ClientError("a batch cannot hold transactional messages")
        group = _group_of(h.producer_group)
        props = decode_properties(h.properties)
        if PID_PROPERTY in props or SEQ_PROPERTY in props:
            raise errors.ClientError("a transactional message cannot be idempotent (%s/%s)" % (PID_PROPERTY,
                                                                                                SEQ_PROPERTY))
        props.pop(PROP_TRAN_MSG, None)  # cleared when the message is committed, as RocketMQ does
        flag, data = record_data_from_send(self._body(h.sys_flag, cmd.body), props, h.flag,
                                           h.sys_flag & ~COMPRESSION_BITS, h.reconsume_times, conn.peer)
        if len(data) > self.max_body:
            raise RecordTooLarge("message of %d bytes exceeds limits.max_body_bytes (%d)" % (len(data), self.max_body))
        self.path.check_write(topic, AUTHORIZED)  # again: the body's inflation may have yielded
        number = self.tx.next_half_number(now_ms())
        msg_id = create_offset_msg_id(*self.host(), HALF_ID_BASE + number)
        transaction_id = props.get(PROP_UNIQ_KEY) or msg_id
        if len(transaction_id.encode("utf-8")) > limits.MAX_NAME_BYTES:
            raise errors.ClientError("a half message's %s may hold at most %d bytes" % (PROP_UNIQ_KEY,
                                                                                         limits.MAX_NAME_BYTES))
        manager, now = self.tx.manager, now_ms()
        immunity = immunity_ms(props.get(PROP_CHECK_IMMUNITY))
        user = conn.session.user if conn.session is not None else None
        self.tx.check_quota(user)
        partition = manager.put_half(number, topic, h.queue_id if h.queue_id >= 0 else -1, flag, data, group,
                                     transaction_id, immunity, self.max_half, now, user)
        try:
            self.tx.flush_journal()  # in a pool thread: the send is acknowledged once the half message is durable
        except errors.TransactionError:
            self.tx.rollback_quietly(half_txid(number), HALF_OWNER)
            raise
        self.stats.on_put(topic, len(data))
        fields = _send_fields(msg_id, partition, number)
        fields["transactionId"] = transaction_id
        return response_for(cmd, ResponseCode.SUCCESS, None, fields)

    def half_topic(self, number):
        """The topic of half message ``number`` while it waits for its end, else None."""
        half = self.tx.manager.half(number) if number >= 0 else None
        return half.topic if half is not None else None

    def half_user(self, number):
        """The user who sent half message ``number`` (None: unknown, or sent with authentication off)."""
        half = self.tx.manager.half(number) if number >= 0 else None
        return half.user if half is not None else None

    def end_transaction(self, cmd, conn):
        """END_TRANSACTION, after the send or in answer to a check-back (``fromTransactionCheck``), from any
        connection: the group must be the half message's (RocketMQ's "producer group wrong" check), and so
        must the transactionId when one is given."""
        h = decode_header(EndTransactionHeader, cmd)
        number = h.tran_state_table_offset
        half = self.tx.manager.half(number) if number >= 0 else None
        if half is None or h.commit_log_offset != HALF_ID_BASE + number or h.producer_group != half.group:
            raise errors.NotFound("no half message %d (commitLogOffset %d) of producer group %s is waiting for its "
                                  "end: it was ended, rolled back after its last check-back, or never sent here"
                                  % (number, h.commit_log_offset, _show(h.producer_group)))
        if h.transaction_id and h.transaction_id != half.transaction_id:
            raise errors.ClientError("transactionId %s is not the one of half message %d"
                                     % (_show(h.transaction_id), number))
        if h.commit_or_rollback == TRANSACTION_COMMIT_TYPE:
            self.tx.commit_now(half_txid(number), HALF_OWNER, one_phase=False)
        elif h.commit_or_rollback == TRANSACTION_ROLLBACK_TYPE:
            self.tx.rollback_now(half_txid(number), HALF_OWNER)
        elif h.from_transaction_check:  # unknown: it waits for a later end or the next check
            log.info("remoting %s: producer of %s still does not know half message %d", conn.peer, half.group,
                     number)
        return response_for(cmd, ResponseCode.SUCCESS)


def _group_of(group):
    try:
        return limits.validate_group(group)
    except errors.InvalidTopic as exc:
        raise errors.ClientError("producerGroup: %s" % exc) from None


def _show(text):
    return repr(text[:64]) if len(text) > 64 else repr(text)


def _delay_level(props):
    text = props.get(PROP_DELAY)
    if not text:
        return 0
    try:
        return max(0, int(text))
    except ValueError:
        raise errors.ClientError("property DELAY=%r is not a delay level" % text[:32]) from None


#: The user property of a SEND_MESSAGE that puts the message in a level of a priority topic (docs/messaging.md
#: "Priorities").
PRIORITY_PROPERTY = "PRIORITY"


def _priority(props):
    """The ``PRIORITY`` property as a level, or None without it; ClientError when it is not an integer."""
    text = props.get(PRIORITY_PROPERTY)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise errors.ClientError("property %s=%r is not a priority level (0..levels-1)" % (PRIORITY_PROPERTY,
                                                                                        text[:32])) from None


def _identity(props):
    """``(pid, seq)`` of a send's properties (taken out of ``props``), None without them; ClientError when only
    one is there or either is not a number in range."""
    if PID_PROPERTY not in props and SEQ_PROPERTY not in props:
        return None
    pid, seq = props.pop(PID_PROPERTY, None), props.pop(SEQ_PROPERTY, None)
    try:
        return check_identity(int(pid), int(seq))
    except (TypeError, ValueError):
        raise errors.ClientError("an idempotent message needs both %s (1..2^63-1) and %s (0..2^63-1) as numbers, "
                                 "got %r and %r" % (PID_PROPERTY, SEQ_PROPERTY, pid, seq)) from None


def _send_fields(msg_id, partition, offset):
    fields = send_response_fields(msg_id, partition, offset)
    fields["MSG_REGION"] = "DefaultRegion"
    fields["TRACE_ON"] = "false"
    return fields

