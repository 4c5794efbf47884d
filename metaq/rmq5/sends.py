"""RocketMQ 5's sends: SendMessage (normal, FIFO message groups, delivery times through metaq's timers,
transactional messages handed to the half messages' group, ``halves.py``) and RecallMessage (metaq's timer cancel).

A send asks ``PutPath.check_write`` (the user's PUB permission, the broker's state, the topic's name) before
``PutPath.append``, the one put path, and is answered once ``PutPath.durable`` says the put may be acknowledged.
"""

import itertools
import time
import zlib
from typing import NamedTuple, Optional

from metaq import errors
from metaq.protocol.rocketmq.mapping import record_data_from_send
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.calls import POLL_RESERVE_MS, code_of, ms_of, paced_wait, status, status_fields
from metaq.rmq5.messagebytes import encode_fields
from metaq.rmq5.records import GZIP, TRANSACTION, Recall, Refusal, check_message, group_queue, parse_recall_handle, \
    recall_handle
from metaq.clock import now_ms
from metaq.timers.records import TIMER_TOPIC, timer_due


class Entry(NamedTuple):
    """One message's SendResultEntry: its status (a ``Code`` name and its message: the name when None), message id,
    transaction id (a half message's), offset and recall handle (a timed message's); empty or None ones are left
    out."""

    code: str
    message: Optional[str]
    message_id: str
    transaction_id: Optional[str] = None
    offset: int = 0
    recall_handle: Optional[str] = None


def response_bytes(entries):
    """A SendMessageResponse's bytes (written as ``messagebytes.encode_fields`` writes fields): a status, the first
    entry's when every entry has its code, else MULTIPLE_RESULTS; one SendResultEntry per message, in order."""
    first = entries[0]
    top = status_fields(first.code, first.message) if all(e.code == first.code for e in entries) else \
        status_fields("MULTIPLE_RESULTS")
    out = [1, top]
    for e in entries:
        out += (2, (1, status_fields(e.code, e.message), 2, e.message_id or None, 3, e.transaction_id or None,
                    4, e.offset or None, 5, e.recall_handle or None))
    return encode_fields(out)


class Sends:
    """The two RPCs, given what they use: the store (partition counts, the log's truncation count), the put path,
    the guard (None: no authentication), the broker's name, ``max_body`` (bytes of a body at most) and
    ``send_half(topic, partition, flag, data, system_properties, now, owner)`` (``halves.Halves.send_half``: a
    transactional message's half message and its entry)."""

    def __init__(self, store, put_path, guard, broker_name, max_body, send_half):
        self.store = store
        self.path = put_path
        self.guard = guard
        self.broker_name = broker_name
        self.max_body = max_body
        self.send_half = send_half
        self._next_queue = itertools.count()
        self.counts = {"sent": 0}

    def rpcs(self):
        """``{rpc: (request type, handler)}``, as ``MessagingService.unary`` holds them."""
        return {"SendMessage": (pb.SendMessageRequest, self.send_message),
                "RecallMessage": (pb.RecallMessageRequest, self.recall_message)}

    def waits(self, rpc, request):
        """True when answering ``request`` may wait: a SendMessage whose acknowledgement waits (``PutPath.acks_wait``:
        a flush, a slave) or that holds a transactional message (its half message's journal is flushed first), and
        every RecallMessage (its cancel waits for the timer store). A send that cannot wait is answered on the
        connection's reader, as the remoting port answers its sends; a user's produce rate (authentication on) is
        the service's to weigh (``MessagingService.call``)."""
        if rpc != "SendMessage" or self.path.acks_wait:
            return True
        return any(m.system_properties.message_type == TRANSACTION for m in request.messages[:])

    def send_message(self, request, call):
        """Each message checked, stored through the put path (a delivery time: metaq's timers), then one wait
        for the last put's durability covers them all; one entry per message, in order. Answered as the response's
        bytes (``response_bytes``)."""
        # a repeated field's slice is a list: iterating the field itself ends by an IndexError raised and caught
        messages = request.messages[:]
        if not messages:
            raise Refusal("MESSAGE_CORRUPTED", "a SendMessage request without messages")
        topic = messages[0].topic.name
        if any(m.topic.name != topic for m in messages):
            raise Refusal("ILLEGAL_TOPIC", "the messages of one SendMessage request must share one topic")
        try:
            self.path.check_write(topic, call.session)  # the user's PUB, the broker's state, the topic's name
            queues = self.store.partitions_of(topic)
        except errors.MetaqError as exc:  # every message refused alike (clients expect one entry per message)
            code, text = code_of(exc), str(exc)
            return response_bytes([Entry(code, text, m.system_properties.message_id) for m in messages])
        # its user's produce rate: waits what the user owes (within the call's deadline), then charges these bodies
        paced_wait(self.guard, call, time.monotonic() + max(0, call.timeout_s - POLL_RESERVE_MS / 1000.0), "produce")
        if self.guard is not None:
            self.guard.pace(call, "produce", sum(len(m.body) for m in messages))
        entries, written = [], {}
        for m in messages:
            try:
                entry, r = self._send_one(topic, queues, m, call)
            except Refusal as exc:
                entry, r = Entry(exc.code, exc.message, m.system_properties.message_id), None
            except errors.MetaqError as exc:
                entry, r = Entry(code_of(exc), str(exc), m.system_properties.message_id), None
            entries.append(entry)
            if r is not None:
                written[r.partition] = max(r.log_end, written.get(r.partition, 0))
        cuts = self.store.log_cuts  # the writes' truncation count: the waits after the first begin after its yields
        try:  # the furthest put first: its wait covers the others' (each partition's long polls are woken)
            for partition, log_end in sorted(written.items(), key=lambda item: -item[1]):
                self.path.durable(topic, partition, log_end, now_ms(), cuts)
        except errors.MetaqError as exc:  # written, not acknowledged (a failed flush, a lost lease)
            code, text = code_of(exc), str(exc)
            entries = [e._replace(code=code, message=text) if e.code == "OK" else e for e in entries]
        self.counts["sent"] += sum(1 for e in entries if e.code == "OK")
        return response_bytes(entries)

    def _send_one(self, topic, queues, m, call):
        sp = m.system_properties
        body = m.body
        if sp.body_encoding == GZIP:
            body = _gunzip(body, self.max_body)
        if not body:
            raise Refusal("MESSAGE_BODY_EMPTY", "a message without a body")
        if len(body) > self.max_body:
            raise Refusal("MESSAGE_BODY_TOO_LARGE", "a body of %d bytes: the limit is %d (limits.max_body_bytes)"
                          % (len(body), self.max_body))
        deliver = ms_of(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
        checked = check_message(topic, sp.tag if sp.HasField("tag") else None, sp.keys[:], sp.message_id,
                                sp.message_group if sp.HasField("message_group") else None, deliver,
                                dict(m.user_properties), sp.message_type)
        now = now_ms()
        due = None
        if deliver is not None:
            try:
                due = timer_due(("TIMER_DELIVER_MS", deliver), now)
            except errors.ClientError as exc:
                raise Refusal("ILLEGAL_DELIVERY_TIME", str(exc)) from None
        if checked.group is not None:
            partition = group_queue(checked.group, queues)
        else:
            partition = next(self._next_queue) % queues
        flag, data = record_data_from_send(body, checked.properties, born_host=call.peer)
        born = ms_of(sp.born_timestamp) if sp.HasField("born_timestamp") else now
        owner = call.session.user if call.session is not None else None
        if checked.message_type == TRANSACTION:
            transaction_id, number = self.send_half(topic, partition, flag, data, sp, now, owner)
            return Entry("OK", None, sp.message_id, transaction_id, number), None
        r = self.path.append(topic, partition, flag, data, now, born_ms=born, due_ms=due, owner=owner)
        recall = None
        if due is not None:  # held by the timers: r.msg_id is its timer id
            recall = recall_handle(Recall(topic, self.broker_name, deliver, sp.message_id, r.msg_id))
        return Entry("OK", None, sp.message_id, offset=r.offset, recall_handle=recall), r

    def recall_message(self, request, call):
        """Cancel a timed message before its delivery time by the recall handle its send gave (``TimerService.cancel``,
        answered once the cancel is durable). The handle must name this topic and this broker; the caller needs
        publish on the topic and, with authentication on, to be the user who sent it (the pending row's owner in the
        timer store: a handle alone is no proof of who sent the message) or an administrator."""
        recall = parse_recall_handle(request.recall_handle)
        topic = request.topic.name
        if recall.topic != topic:
            raise Refusal("BAD_REQUEST", "the recall handle names topic %s, not %s" % (recall.topic[:256], topic[:256]))
        if recall.broker != self.broker_name:
            raise Refusal("BAD_REQUEST", "the message is held by broker %s, not %s: recall it there"
                          % (recall.broker[:256], self.broker_name))
        timers = getattr(self.path, "timers", None)
        if timers is None:
            raise Refusal("NOT_IMPLEMENTED", "this broker has no timer store")
        try:
            self.path.check_write(topic, call.session)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        if self.guard is not None and self.guard.enabled and not self.guard.is_admin(call.session):
            try:
                pending, owner = timers.owner_of(recall.timer_id)
            except errors.MetaqError as exc:
                raise Refusal(code_of(exc), str(exc)) from None
            if pending and (owner is None or owner != call.session.user):
                raise Refusal("FORBIDDEN", "the timed message is not yours: with authentication on, a user recalls "
                              "the messages it sent, an administrator any")
        now = now_ms()
        if recall.deliver_ms <= now:
            raise Refusal("NOT_FOUND", "message %s was due at %d: delivered already" % (recall.message_id[:128],
                                                                                        recall.deliver_ms))
        try:
            outcome, r = timers.cancel(recall.timer_id, now)
            if r is None:
                raise Refusal("NOT_FOUND", "message %s is not waiting for its time (%s)" % (recall.message_id[:128],
                                                                                             outcome))
            self.path.durable(TIMER_TOPIC, 0, r.log_end, now)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        return pb.RecallMessageResponse(status=status("OK"), message_id=recall.message_id)


def _gunzip(data, max_bytes):
    """A GZIP ``body_encoding``'s body decompressed, at most ``max_bytes`` (Refusal past it or when corrupt)."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise Refusal("MESSAGE_CORRUPTED", "a GZIP body that does not decompress: %s" % exc) from None
    if len(out) > max_bytes:
        raise Refusal("MESSAGE_BODY_TOO_LARGE", "a GZIP body decompresses past %d bytes (limits.max_body_bytes)"
                      % max_bytes)
    if not d.eof:
        raise Refusal("MESSAGE_CORRUPTED", "a GZIP body that ends early")
    return out
