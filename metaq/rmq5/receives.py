"""RocketMQ 5's POP consumption over the store's ``PopService``: QueryAssignment, ReceiveMessage (a server stream: a
status, the messages, a delivery timestamp), AckMessage, ChangeInvisibleDuration and
ForwardMessageToDeadLetterQueue, with a consumer's Settings (FIFO, maximum delivery attempts) read from the port's
consumer clients table (``consumers.py``). A consumer needs SUB on its group and on the topic, as a text ``get``
with a group does.
"""

import functools
import logging
import time

from metaq import errors, limits
from metaq.pop import limits as pop_limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.auth.acl import SUB
from metaq.filters.sql import compiled
from metaq.filters.wire import parse_tag_expression
from metaq.groups import policy as group_policy
from metaq.pop.records import InvalidHandle
from metaq.protocol.properties import PROP_TAGS
from metaq.protocol.rocketmq.mapping import message_of_record
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.calls import POLL_RESERVE_MS, client_of, code_of, delivered_now, duration_ms, paced_wait, status, \
    status_fields
from metaq.rmq5.messagebytes import Served, encode_fields, received_response_bytes, response_bytes
from metaq.rmq5.records import Refusal
from metaq.rmq5.wire import WAITS
from metaq.clock import now_ms

log = logging.getLogger(__name__)


#: A receive's invisible duration when the request names none and no renewer is given (a push consumer's
#: ``auto_renew``), as the proxy's.
DEFAULT_INVISIBLE_MS = rmq5_limits.GRPC_RENEW_INVISIBLE_MS


#: Receives a ReceiveMessage makes while every message it got was filtered out, even past its long poll (each one
#: acknowledges what it filtered out, so a backlog of unwanted messages is passed over this many batches a call).
FILTER_ROUNDS = 16


class Receives:
    """The five RPCs, given what they use: the store (the groups' settings, the transfer bound), the POP service
    (None: refused NOT_IMPLEMENTED), the guard (None: no authentication), ``endpoint()`` (the store host messages
    name), the renewer (None: nothing is renewed), the ``consumers.ConsumerClients`` table and ``route(request,
    call)`` (``routes.Routes.query_route``: an assignment is of the topic's route)."""

    def __init__(self, store, pop, guard, endpoint, renewer, consumers, route):
        self.store = store
        self.pop = pop
        self.guard = guard
        self.endpoint = endpoint
        self.renewer = renewer
        self.consumers = consumers
        self.route = route

    def rpcs(self):
        """``{rpc: (request type, handler)}``, as ``MessagingService.unary`` holds them."""
        return {"QueryAssignment": (pb.QueryAssignmentRequest, self.query_assignment),
                "ReceiveMessage": (pb.ReceiveMessageRequest, self.receive_message),
                "AckMessage": (pb.AckMessageRequest, self.ack_message),
                "ChangeInvisibleDuration": (pb.ChangeInvisibleDurationRequest, self.change_invisible_duration),
                "ForwardMessageToDeadLetterQueue": (pb.ForwardMessageToDeadLetterQueueRequest, self.forward_to_dlq)}

    def _pop_service(self):
        if self.pop is None:
            raise Refusal("NOT_IMPLEMENTED", "this broker serves no per-message acknowledgement (POP)")
        return self.pop

    def _may_consume(self, call, group, topic):
        """The names legal (ILLEGAL_CONSUMER_GROUP, ILLEGAL_TOPIC) and, as a text ``get`` with a group checks, the
        user may consume as ``group`` and subscribe to ``topic``."""
        try:
            limits.validate_group(group)
        except errors.InvalidTopic as exc:
            raise Refusal("ILLEGAL_CONSUMER_GROUP", str(exc)) from None
        try:
            limits.validate_topic(topic)
        except errors.InvalidTopic as exc:
            raise Refusal("ILLEGAL_TOPIC", str(exc)) from None
        guard = self.guard
        if guard is None or not guard.enabled:
            return
        try:
            guard.require(call.session, SUB, "group", group)
            guard.require(call.session, SUB, "topic", topic)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None

    def query_assignment(self, request, call):
        """As the proxy answers: per broker holding the topic, one queue of id -1 ("any queue of this broker") for
        every consumer of a non-FIFO group, every queue of the broker for a FIFO one (its client's Settings, or the
        group's ``fifo`` setting: ``groups.policy.fifo``)."""
        topic, group = request.topic.name, request.group.name
        self._may_consume(call, group, topic)
        route = self.route(pb.QueryRouteRequest(topic=request.topic, endpoints=request.endpoints), call)
        fifo = group_policy.fifo(self.store.groups.get(group), self.consumers.settings_of(call).fifo)
        out, seen = [], set()
        for q in route.message_queues:
            if q.permission in (pb.NONE, pb.WRITE):
                continue
            if fifo:
                out.append(pb.Assignment(message_queue=q))
            elif q.broker.name not in seen:
                seen.add(q.broker.name)
                any_queue = pb.MessageQueue()
                any_queue.CopyFrom(q)
                any_queue.id = -1
                out.append(pb.Assignment(message_queue=any_queue))
        if not out:
            raise Refusal("FORBIDDEN", "no readable queue of topic %s" % topic[:256])
        return pb.QueryAssignmentResponse(status=status("OK"), assignments=out)

    def receive_message(self, request, call, wait=True):
        """Up to ``batch_size`` (at most ``limits.POP_MAX_BATCH``) messages of any partition of the topic on this
        broker (the proxy pops broker-wide whatever queue id the client names), invisible to the group's other
        receivers for ``invisible_duration``; with nothing there, a long poll of ``long_polling_timeout`` (within
        the call's deadline less ``POLL_RESERVE_MS``), counted among the broker's parked long polls and its user's
        (``parked_gets``: TOO_MANY_REQUESTS past either), ended at once when the client resets the call or its
        connection ends (``call.cancelled``). Messages the filter expression refuses are acknowledged
        and never delivered to the group (the proxy acks tag mismatches); a batch all filtered out is followed by
        another, at least ``FILTER_ROUNDS`` batches a call. The stream: a status, the messages, a
        delivery timestamp; each message as the proxy's converter fills it, with its receipt handle, delivery attempt
        and invisible duration (``messagebytes.Served``), given as its response's bytes. ``wait`` False: see
        ``receive_message_now``."""
        pop = self._pop_service()
        group, topic = request.group.name, request.message_queue.topic.name
        self._may_consume(call, group, topic)
        decision = group_policy.decide(self.store.groups.get(group), group)  # the group's settings
        if decision.refusal is not None:  # the proxy's answer to the broker's NO_PERMISSION
            raise Refusal("FORBIDDEN", decision.refusal)
        wanted = _filter_of(request.filter_expression)
        settings = self.consumers.settings_of(call)
        batch = min(max(request.batch_size, 1), pop_limits.POP_MAX_BATCH)
        renewer = self.renewer if request.auto_renew else None
        invisible = _invisible_ms(request, renewer)
        budget = int(call.timeout_s * 1000) - POLL_RESERVE_MS
        poll = duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else budget
        poll = max(0, min(poll, budget, limits.MAX_WAIT_MS))
        start = time.monotonic()
        end, last = start + poll / 1000.0, start + max(0, budget) / 1000.0
        host = self.endpoint()
        rounds, kept = 0, []
        cancel = getattr(call, "cancelled", None)  # set when the client resets the call or its connection ends
        if not paced_wait(self.guard, call, last):  # its user's fetch rate: the receive waits before it takes
            return [_NOT_FOUND, delivered_now()]
        try:
            while not (cancel is not None and cancel.is_set()):  # a call reset before it ran takes nothing
                rounds += 1
                got = pop.receive(group, topic, batch, invisible,
                                  group_policy.fifo(self.store.groups.get(group), settings.fifo), settings.max_attempts,
                                  wait_ms=max(0, int((end - time.monotonic()) * 1000)) if wait else 0, cancel=cancel,
                                  user=getattr(call, "user", None))
                kept, mapped, dropped = (got, None, ()) if wanted is None else _filtered(got, wanted, host)
                if kept:  # from here on, a call that ends before its answer is sent gives them back (port._unsent)
                    call.unsent = functools.partial(self._receive_unsent, group, topic, kept)
                if dropped:
                    pop.ack(group, topic, [r.handle for r in dropped], wait)
                if not wait and not kept and poll > 0 and (not got or rounds >= FILTER_ROUNDS):
                    return WAITS  # its greenlet goes on: the long poll (and the filter rounds within it)
                t = time.monotonic()
                if kept or not got or t >= last or (t >= end and rounds >= FILTER_ROUNDS):
                    break
        except errors.MetaqError as exc:
            if kept:  # taken, then refused (acknowledging the filtered-out ones): the client never gets them
                call.unsent = None
                self._receive_unsent(group, topic, kept)
            raise Refusal(code_of(exc), str(exc)) from None
        client = None
        if self.renewer is not None:
            client = client_of(call)
            self.renewer.heard(client)
        if not kept:
            return [_NOT_FOUND, delivered_now()]
        if renewer is not None and not getattr(call, "reset", False):  # kept invisible while the client lives
            # (renewer.py); a call the client gave up on never brings them to it: they come back at their deadline
            renewer.delivered(client, group, topic, kept)
        if self.guard is not None:  # the bytes it answers with, charged to its user's fetch rate (paced_wait)
            self.guard.pace(call, "fetch", sum([len(r.record.data) for r in kept]))
        max_transfer = self.store.config.max_transfer_size
        if mapped is None:
            served = received_response_bytes(kept, host, max_transfer, invisible)
        else:  # mapped for the filter already: served from that mapping
            served = [response_bytes(msg, host, max_transfer, r.record.msg_id,
                                     Served(r.topic, r.partition, r.offset, r.handle, r.attempt, invisible))
                      for r, msg in zip(kept, mapped, strict=True)]
        return [_OK_RECEIVE, *served, delivered_now()]

    def _receive_unsent(self, group, topic, received):
        """A receive's answer did not reach the client (it reset the call, the connection ended or its window stayed
        shut): its messages are visible again ``limits.GRPC_RELEASE_INVISIBLE_MS`` from now, not after their
        invisible duration (nor renewed): a client never holds what it never got."""
        if self.renewer is not None:
            self.renewer.settled(group, topic, [r.handle for r in received])
        try:
            back = self.pop.release(group, topic, [(r.partition, r.offset, r.attempt, r.deadline_ms) for r in received],
                                    now_ms() + rmq5_limits.GRPC_RELEASE_INVISIBLE_MS)
        except errors.MetaqError as exc:  # not the master now: they come back at their deadline
            log.info("grpc: %d messages of an unsent receive of %s/%s stay invisible until their deadline: %s",
                     len(received), group[:128], topic[:128], exc)
            return
        log.info("grpc: a receive of %s/%s did not reach its client: %d messages visible again in %d ms",
                 group[:128], topic[:128], len(back), rmq5_limits.GRPC_RELEASE_INVISIBLE_MS)

    def waits(self, rpc, request):
        """True when answering ``request`` may wait: every RPC of this group but AckMessage and ReceiveMessage. An
        ack writes its record at once when asked to (``PopService.ack(..., wait=False)``: the log's page cache, no
        flush, as every ack's record) and so never waits: it is answered on the connection's reader
        (``ack_message_now``). A receive is tried there (``receive_message_now``): what it finds at once is
        answered in the reader's turn; one that would long-poll (or pass over messages its filter refuses) is left
        to its greenlet, nothing taken."""
        return rpc not in ("AckMessage", "ReceiveMessage")

    def receive_message_now(self, request, call):
        """``receive_message`` answered without waiting: what is there now, no long poll (the filter's rounds
        included, none of which waits); ``WAITS`` (nothing handed out) when it found nothing to answer with and the
        call asked for a long poll: its greenlet goes on from there."""
        return self.receive_message(request, call, wait=False)

    def ack_message_now(self, request, call):
        """``ack_message`` answered without waiting: its record written now, not at the turn's end."""
        return self.ack_message(request, call, wait=False)

    def ack_message(self, request, call, wait=True):
        """Each entry's receipt handle acknowledged (``PopService.ack``, at most ``limits.POP_MAX_ACK_HANDLES`` a
        journal call): OK, a repeated ack too; a handle expired, of an older delivery or malformed:
        INVALID_RECEIPT_HANDLE. The top status: OK when every entry is, the entries' code when they share one,
        MULTIPLE_RESULTS otherwise. Answered as the response's bytes (``ack_response_bytes``)."""
        pop = self._pop_service()
        group, topic = request.group.name, request.topic.name
        self._may_consume(call, group, topic)
        entries = [(e.message_id, e.receipt_handle) for e in request.entries[:]]  # a list: see sends.py
        if not entries:
            raise Refusal("BAD_REQUEST", "an AckMessage request without entries")
        handles = [h for _m, h in entries]
        results = []
        try:
            for i in range(0, len(handles), pop_limits.POP_MAX_ACK_HANDLES):
                results += pop.ack(group, topic, handles[i:i + pop_limits.POP_MAX_ACK_HANDLES], wait)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        if self.renewer is not None:  # (read only while it renews something)
            self.renewer.settled(group, topic, (h for h, r in zip(handles, results, strict=True) if r is None))
        return ack_response_bytes(entries, results)

    def change_invisible_duration(self, request, call):
        """The message invisible for ``invisible_duration`` from now (below ``limits.POP_MIN_INVISIBLE_MS``, a
        push consumer's nack of 0: that minimum); answered with the new receipt handle (the old one no longer
        acks)."""
        pop = self._pop_service()
        group, topic = request.group.name, request.topic.name
        self._may_consume(call, group, topic)
        invisible = max(duration_ms(request.invisible_duration), pop_limits.POP_MIN_INVISIBLE_MS)
        if invisible > pop_limits.POP_MAX_INVISIBLE_MS:
            raise Refusal("ILLEGAL_INVISIBLE_TIME", "invisible_duration may be at most %d ms"
                          % pop_limits.POP_MAX_INVISIBLE_MS)
        try:
            new = pop.change_invisible(group, topic, request.receipt_handle, invisible)
        except InvalidHandle as exc:
            raise Refusal("INVALID_RECEIPT_HANDLE", str(exc)) from None
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        if self.renewer is not None:  # a nack or an extension by the client: the broker renews it no more
            self.renewer.settled(group, topic, [request.receipt_handle])
        return pb.ChangeInvisibleDurationResponse(status=status("OK"), receipt_handle=new)

    def forward_to_dlq(self, request, call):
        """The message copied to ``%DLQ%<group>`` and acknowledged (``PopService.dead_letter``); a handle no longer
        in flight: INVALID_RECEIPT_HANDLE."""
        pop = self._pop_service()
        group, topic = request.group.name, request.topic.name
        self._may_consume(call, group, topic)
        try:
            pop.dead_letter(group, topic, request.receipt_handle)
        except InvalidHandle as exc:
            raise Refusal("INVALID_RECEIPT_HANDLE", str(exc)) from None
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        if self.renewer is not None:
            self.renewer.settled(group, topic, [request.receipt_handle])
        return pb.ForwardMessageToDeadLetterQueueResponse(status=status("OK"))


_OK = status_fields("OK")
_OK_BYTES = encode_fields(_OK)  # an entry's OK status, written once (a nested message's bytes)
#: A receive stream's first response, as its bytes (the same for every call): messages follow, or none came.
_OK_RECEIVE = pb.ReceiveMessageResponse(status=status("OK")).SerializeToString()
_NOT_FOUND = pb.ReceiveMessageResponse(status=status("MESSAGE_NOT_FOUND", "no new message")).SerializeToString()


def _filtered(got, wanted, host):
    """``(kept, their mapped messages, dropped)`` of a receive's messages ``got`` by the filter ``wanted``: a
    message is mapped here only for a filter to read its properties."""
    kept, mapped, dropped = [], [], []
    for r in got:
        msg = message_of_record(r.record, host)
        if wanted(msg.properties):
            kept.append(r)
            mapped.append(msg)
        else:
            dropped.append(r)
    return kept, mapped, dropped


def ack_response_bytes(entries, results):
    """An AckMessageResponse's bytes (``messagebytes.encode_fields``): an entry per ``(message id, receipt handle)``
    of ``entries``, OK for a None result, else INVALID_RECEIPT_HANDLE saying why; the top status OK when every
    entry is, the entries' status when they share one code, MULTIPLE_RESULTS otherwise."""
    if len(entries) != len(results):
        raise ValueError("%d entries, %d results" % (len(entries), len(results)))
    out = [1, _OK]
    add = out.append
    if results.count(None) == len(results):  # every entry OK (an ack's usual answer): no status to compare
        for message_id, handle in entries:
            add(2)
            add((1, message_id or None, 2, handle or None, 3, _OK_BYTES))
        return encode_fields(out)
    statuses = [_OK if r is None else status_fields("INVALID_RECEIPT_HANDLE", str(r)) for r in results]
    first = statuses[0]
    out[1] = first if all(s[1] == first[1] for s in statuses) else \
        status_fields("MULTIPLE_RESULTS", "the entries' results differ")
    for (message_id, handle), s in zip(entries, statuses, strict=True):
        add(2)
        add((1, message_id or None, 2, handle or None, 3, _OK_BYTES if s is _OK else encode_fields(s)))
    return encode_fields(out)


def _filter_of(expression):
    """A ``properties -> bool`` of a receive's filter expression (TAG: ``a || b``, ``*``; SQL: SQL92 over the
    message's properties), None for every message; Refusal ILLEGAL_FILTER_EXPRESSION when it does not parse."""
    try:
        if expression.type == pb.SQL:
            return compiled(expression.expression).matches
        tags = parse_tag_expression(expression.expression)
    except errors.ClientError as exc:
        raise Refusal("ILLEGAL_FILTER_EXPRESSION", str(exc)) from None
    if tags is None:
        return None
    return lambda props: tags.matches(props.get(PROP_TAGS, "").encode("utf-8", "surrogatepass"))


def _invisible_ms(request, renewer):
    """How long a receive's messages stay invisible: the renewer's period when it keeps them (auto-renew), else the
    request's ``invisible_duration`` (ILLEGAL_INVISIBLE_TIME outside ``POP_MIN_INVISIBLE_MS`` ..
    ``POP_MAX_INVISIBLE_MS``), else ``DEFAULT_INVISIBLE_MS``."""
    if renewer is not None:
        return renewer.invisible_ms
    if request.auto_renew or not request.HasField("invisible_duration"):
        return DEFAULT_INVISIBLE_MS
    invisible = duration_ms(request.invisible_duration)
    if not pop_limits.POP_MIN_INVISIBLE_MS <= invisible <= pop_limits.POP_MAX_INVISIBLE_MS:
        raise Refusal("ILLEGAL_INVISIBLE_TIME", "invisible_duration must be within %d..%d ms, not %d"
                      % (pop_limits.POP_MIN_INVISIBLE_MS, pop_limits.POP_MAX_INVISIBLE_MS, invisible))
    return invisible
