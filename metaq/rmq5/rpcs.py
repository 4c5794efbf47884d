"""RocketMQ 5's ``apache.rocketmq.v2.MessagingService``: the RPCs this phase serves, over metaq's put path.

Served: QueryRoute (this broker, its gRPC endpoint, the topic's partitions as queues; with ZooKeeper every other
broker of the cluster holding the topic), Heartbeat, NotifyClientTermination, SendMessage (normal, FIFO message
groups, delivery times through metaq's timers, transactional messages as half messages of metaq's transaction
service), EndTransaction, RecallMessage (metaq's timer cancel), and Telemetry: the Settings exchange, and the
check-back of undecided half messages (RecoverOrphanedTransactionCommand on a producer's stream), an admin's
questions and their answers (``clientcommands.py``), and POP
consumption over the store's ``PopService``: QueryAssignment, ReceiveMessage (a server stream: a status, the
messages, a delivery timestamp), AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, with a
consumer's Settings (FIFO, maximum delivery attempts) kept per client; pull consumers (PullMessage, UpdateOffset,
GetOffset, QueryOffset) by ``pulls.PullService``, registered here. Every other RPC is answered gRPC UNIMPLEMENTED
(12) naming why (lite topics; docs/rocketmq5.md).

As RocketMQ's proxy does, business errors travel in-band: grpc-status 0 and the response's ``status`` holding an
``apache.rocketmq.v2.Code`` (``Refusal`` and ``code_of``), authentication failures (``UNAUTHORIZED``) included;
Telemetry's are out of band (INVALID_ARGUMENT for the 4xxxx codes, INTERNAL otherwise).

Authentication (security.acl_file set): each call's ``authorization`` metadata (``MQv2-HMAC-SHA1``, reference in
``auth.proofs``) is checked through the broker's one login decision (``Guard.check_login``, then
``Guard.authenticated``, as the remoting port's signatures are); a send then asks ``PutPath.check_write`` (the
user's PUB permission, the broker's state, the topic's name) before ``PutPath.append``, the one put path, and is
answered once ``PutPath.durable`` says the put may be acknowledged.

The service is given what it uses, never the Broker: the store (partition counts, the topic table), the put path,
the guard, the broker's name, ``max_body_bytes``, a callable naming the port's endpoint, the cluster's brokers (a
callable), the transaction service and its check-back's settings, the POP service.
"""

import functools
import hashlib
import itertools
import logging
import time
import zlib
from collections import OrderedDict

import gevent

from typing import NamedTuple

from metaq import errors, limits
from metaq.auth import proofs
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.records import GZIP, Refusal, check_message, group_queue
from metaq.rmq5.wire import GrpcError, Status
from metaq.auth.acl import SUB
from metaq.filters.sql import compiled
from metaq.filters.wire import parse_tag_expression
from metaq.groups import policy as group_policy
from metaq.pop.records import InvalidHandle
from metaq.protocol.message import decode_payload
from metaq.protocol.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, split_attribute
from metaq.protocol.rocketmq.mapping import message_of_record, record_data_from_send
from metaq.rmq5.records import PROP_DELIVER_MS, PROP_SHARDING_KEY
from metaq.server.inflate import inflate_body
from metaq.rmq5.records import RESERVED_PROPERTIES, TRANSACTION, Recall, parse_recall_handle, recall_handle
from metaq.server.clock import now_ms
from metaq.timers.records import TIMER_TOPIC, timer_due
from metaq.transactions.policy import GRPC_GROUP_PREFIX, immunity_ms, plan_round
from metaq.transactions.state import HALF_OWNER, half_txid

log = logging.getLogger(__name__)

#: Why the RPCs not served yet are not, as their UNIMPLEMENTED says.
LATER = {
    "SyncLiteSubscription": "lite topics are not served",
}

#: What a producer's settings get back (the proxy's defaults): its retry policy.
PRODUCER_ATTEMPTS = 3
#: What a consumer's settings get back (the proxy's defaults).
CONSUMER_ATTEMPTS = 17
RECEIVE_BATCH = 32
LONG_POLLING_S = 20
#: A receive's invisible duration when the request names none and no renewer is given (a push consumer's
#: ``auto_renew``), as the proxy's.
DEFAULT_INVISIBLE_MS = limits.GRPC_RENEW_INVISIBLE_MS
#: What a long poll keeps of the call's deadline to answer in: the poll ends this much before the client gives up.
POLL_RESERVE_MS = 300
#: Receives a ReceiveMessage makes while every message it got was filtered out, even past its long poll (each one
#: acknowledges what it filtered out, so a backlog of unwanted messages is passed over this many batches a call).
FILTER_ROUNDS = 16
#: The RPCs answered with a stream of responses (their handler returns a list), and what follows a refusal's status
#: (ReceiveMessage's: a delivery timestamp; PullMessage's: nothing, as the proxy's pull writer answers an error).
STREAMING = {"ReceiveMessage": lambda: [_delivered_now()], "PullMessage": lambda: []}
CONSUMER_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)

#: The message types a route's queues accept (a metaq topic has no type).
ACCEPTED = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)

_WILDCARDS = ("0.0.0.0", "::", "")


def paced_wait(guard, call, last, kind="fetch"):
    """Wait, in the call's own greenlet, what the call's user still owes its rate of ``kind`` (``Guard.pace``, the
    one pacing point: a receive or a pull charges the bytes of the records it answers with, a SendMessage its
    messages' bodies) before a read takes anything (a send: before it writes, and it writes after the wait anyway).
    True to read on; False when the wait would pass ``last`` (monotonic: the call's deadline less its reserve) or the
    client reset the call: the call then answers that nothing came, at ``last`` at the latest. A paced receive
    never takes messages it then holds while it waits (their invisible time starts when it takes them), and no
    call outlives its deadline."""
    if guard is None:
        return True
    owed = guard.pace(call, kind, 0)
    if owed <= 0:
        return True
    left = last - time.monotonic()
    cancel = getattr(call, "cancelled", None)
    if left > 0:
        if cancel is not None:
            cancel.wait(min(owed, left))
        else:
            gevent.sleep(min(owed, left))
    return owed <= left and not (cancel is not None and cancel.is_set())


def status(code, message=None):
    """An ``apache.rocketmq.v2.Status`` with ``code`` (a Code name) and a message (the code's name by default, as
    the proxy always fills it)."""
    return pb.Status(code=pb.Code.Value(code), message=message or code)


def code_of(exc):
    """The in-band Code name of a metaq error raised by the put path or the store."""
    if isinstance(exc, errors.Unauthenticated):
        return "UNAUTHORIZED"
    if isinstance(exc, errors.QuotaExceeded):
        return "TOO_MANY_REQUESTS"
    if isinstance(exc, errors.Forbidden):
        return "FORBIDDEN"
    if isinstance(exc, errors.UnknownTopic):
        return "TOPIC_NOT_FOUND"
    if isinstance(exc, errors.InvalidTopic):
        return "ILLEGAL_TOPIC"
    if isinstance(exc, errors.BadCompressedBody):
        return "MESSAGE_CORRUPTED"
    if isinstance(exc, errors.ClientError):
        return "BAD_REQUEST"
    if isinstance(exc, errors.Unavailable):
        return "HA_NOT_AVAILABLE" if isinstance(exc, errors.NotMaster) else "INTERNAL_SERVER_ERROR"
    return "INTERNAL_SERVER_ERROR"


class ClientKey(NamedTuple):
    """Whose client a call is: the ``user`` it signed in as ("" with authentication off) and its ``x-mq-client-id``
    (``id``). Every per-client map of the port is keyed by it (see ``client_of``)."""

    user: str
    id: str

    def __str__(self):
        return "%s/%s" % (self.user, self.id) if self.user else self.id


def client_of(call):
    """Which client ``call`` is: the one decision every per-client map of the port (consumers' Settings, producers'
    streams, the renewer's clients, the admin's client streams) keys its entries by. A client id is whatever the
    caller sets, so with authentication on it is the signed-in user's: one user naming another's client id names a
    client of its own, never reads, replaces or ends the other's. Read after the call's login (``call.user``)."""
    return ClientKey(getattr(call, "user", "") or "", call.metadata.get("x-mq-client-id") or "")


def _check_signed_date(date_time, now):
    """Refuse (UNAUTHORIZED) a signature whose ``x-mq-date-time`` is not within ``limits.GRPC_AUTH_MAX_SKEW_MS`` of
    ``now`` (ms), either way, or does not parse: the signature covers only that date, so without the bound a
    captured ``authorization`` header would sign calls for ever."""
    try:
        signed = proofs.mqv2_date_ms(date_time)
    except ValueError:
        raise Refusal("UNAUTHORIZED", "x-mq-date-time %r is not yyyyMMdd'T'HHmmss'Z'" % date_time[:40]) from None
    skew = limits.GRPC_AUTH_MAX_SKEW_MS
    if abs(now - signed) > skew:
        raise Refusal("UNAUTHORIZED", "x-mq-date-time %s is %d s %s the broker's clock: a signature is accepted "
                      "within %d s of it (limits.GRPC_AUTH_MAX_SKEW_MS; sign each call when it is made, check the "
                      "client's clock)" % (date_time[:40], abs(now - signed) // 1000,
                                           "behind" if signed < now else "ahead of", skew // 1000))


def _endpoints_of(address):
    """``host:port`` (``[v6]:port``) as an ``apache.rocketmq.v2.Endpoints``."""
    host, _sep, port = address.rpartition(":")
    host = host.strip("[]")
    scheme = pb.IPv4 if _is_ipv4(host) else pb.IPv6 if ":" in host else pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=int(port))])


def _ms(ts):
    return ts.seconds * 1000 + ts.nanos // 1_000_000


class Checks(NamedTuple):
    """The check-back of half messages sent over gRPC (the remoting port's settings, ``remoting:``): a round every
    ``interval_s``; a half message is due ``timeout_ms`` after it was stored, asked at most ``check_max`` times,
    then rolled back; at most ``max_half`` pending, ``per_round`` asked a round."""

    interval_s: float
    timeout_ms: int
    check_max: int
    max_half: int
    per_round: int


class Consumer(NamedTuple):
    """A consumer client's Settings as its receives use them: it asked for order (``fifo``; its group's setting may
    ask too), and a message is delivered at most ``max_attempts`` times before its dead letter."""

    fifo: bool
    max_attempts: int


DEFAULT_CONSUMER = Consumer(False, CONSUMER_ATTEMPTS)


class MessagingService:
    """The RPCs (see the module doc). ``endpoint()``: ``(host, port)`` of the gRPC port as it listens."""

    def __init__(self, store, put_path, guard, broker_name, max_body, endpoint, broker_id=0, cluster=None, tx=None,
                 checks=None, pop=None, pulls=None, clients=None, renewer=None):
        """``cluster(topic)``: with ZooKeeper, the cluster's brokers now (``server.routes.ClusterView.brokers``:
        rows with ``broker_id``, ``name``, ``grpc`` (the master's endpoint) and ``queues``; None while ZooKeeper
        cannot be read); None: routes name this broker alone. ``broker_id``: ours, whose row this port answers
        from the store. ``tx``: the TxService, which keeps transactional messages' half messages (None:
        transactional sends refused NOT_IMPLEMENTED); ``checks``: its check-back's ``Checks``; ``pop``: the
        PopService receives, acks, invisible durations and dead letters go to (None: refused NOT_IMPLEMENTED);
        ``pulls``: the ``pulls.PullService`` serving PullMessage and the offsets (None: those are unknown RPCs);
        ``clients``: the ``clientcommands.ClientCommands`` an admin asks clients through, told of Telemetry streams
        and their ThreadStackTrace / VerifyMessageResult answers (None: those are ignored); ``renewer``: the
        ``renewer.Renewer`` keeping ``auto_renew`` receives' messages invisible while their client lives, told of
        deliveries, acks, nacks, heartbeats, terminations and Telemetry streams (None: nothing is renewed)."""
        self.clients = clients
        self.renewer = renewer
        self.pop = pop
        self.consumers = OrderedDict()  # ClientKey -> Consumer: its Settings, at most GRPC_MAX_CONSUMER_CLIENTS
        self.consumers_by_user = {}  # user ("" without) -> OrderedDict(ClientKey -> when last heard, monotonic s)
        self.store = store
        self.broker_id = broker_id
        self.cluster = cluster
        self.tx = tx
        self.checks = checks
        self.producers = {}  # topic -> {ClientKey: its Telemetry call}: whom a half message's check asks
        self.published = {}  # Telemetry call -> the topic names its latest producer Settings registered
        self.published_by_user = {}  # user ("" with authentication off) -> names its streams hold (``published``)
        self._check_task = None
        self.path = put_path
        self.guard = guard
        self.broker_name = broker_name
        self.max_body = max_body
        self.endpoint = endpoint
        self._next_queue = itertools.count()
        self.unary = {
            "QueryRoute": (pb.QueryRouteRequest, self.query_route),
            "Heartbeat": (pb.HeartbeatRequest, self.heartbeat),
            "SendMessage": (pb.SendMessageRequest, self.send_message),
            "NotifyClientTermination": (pb.NotifyClientTerminationRequest, self.notify_client_termination),
            "EndTransaction": (pb.EndTransactionRequest, self.end_transaction),
            "RecallMessage": (pb.RecallMessageRequest, self.recall_message),
            "QueryAssignment": (pb.QueryAssignmentRequest, self.query_assignment),
            "ReceiveMessage": (pb.ReceiveMessageRequest, self.receive_message),
            "AckMessage": (pb.AckMessageRequest, self.ack_message),
            "ChangeInvisibleDuration": (pb.ChangeInvisibleDurationRequest, self.change_invisible_duration),
            "ForwardMessageToDeadLetterQueue": (pb.ForwardMessageToDeadLetterQueueRequest, self.forward_to_dlq),
        }
        if pulls is not None:
            self.unary.update(pulls.rpcs())
        self.counts = {"calls": 0, "refused": 0, "sent": 0, "checks_sent": 0, "checks_unsent": 0, "given_up": 0}

    def kind(self, rpc):
        """How ``rpc`` is served: "unary", "telemetry", or "later" (answered UNIMPLEMENTED); None: no such RPC."""
        if rpc in self.unary:
            return "unary"
        if rpc == "Telemetry":
            return "telemetry"
        return "later" if rpc in LATER else None

    def later(self, rpc):
        """Why ``rpc`` is not served yet (its UNIMPLEMENTED's message)."""
        return LATER[rpc]

    # -- a unary call ------------------------------------------------------------------------------------------

    def call(self, rpc, call, data):
        """The serialized response of unary ``rpc`` to request bytes ``data`` (a list of them for a ``STREAMING``
        RPC: a refusal is its one status response and a delivery timestamp, the proxy's stream shape); GrpcError for
        a request that does not parse (INTERNAL, as grpc's servers answer a message they cannot deserialize)."""
        request_type, handler = self.unary[rpc]
        request = request_type()
        try:
            request.ParseFromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its relatives
            raise GrpcError(Status.INTERNAL, "the %s request does not parse as %s" % (rpc, request_type.__name__))
        self.counts["calls"] += 1
        response_type = getattr(pb, request_type.__name__[:-len("Request")] + "Response")
        try:
            if not call.metadata.get("x-mq-client-id"):
                raise Refusal("CLIENT_ID_REQUIRED", "x-mq-client-id is missing from the call's metadata")
            self.login(call)
            response = handler(request, call)
        except Refusal as exc:
            self.counts["refused"] += 1
            refused = response_type(status=status(exc.code, exc.message))
            if rpc in STREAMING:
                return [r.SerializeToString() for r in [refused] + STREAMING[rpc]()]
            return refused.SerializeToString()
        if rpc in STREAMING:
            return [r.SerializeToString() for r in response]
        return response.SerializeToString()

    def login(self, call):
        """Check the call's RocketMQ 5 credentials (authentication on); Refusal UNAUTHORIZED otherwise."""
        guard = self.guard
        if guard is None or not guard.enabled:
            return
        value = call.metadata.get("authorization")
        if not value:
            raise Refusal("UNAUTHORIZED", "no credentials: the client must be given an access key and a secret key "
                          "(the authorization metadata)")
        try:
            name, signature = proofs.parse_mqv2(value)
        except ValueError as exc:
            raise Refusal("UNAUTHORIZED", "malformed authorization metadata (%s)" % exc) from None
        date_time = call.metadata.get("x-mq-date-time")
        if not date_time:
            raise Refusal("UNAUTHORIZED", "authorization without x-mq-date-time")
        _check_signed_date(date_time, now_ms())
        session = call.session
        if guard.check_login(name, lambda secret: proofs.same(signature,
                                                              proofs.mqv2_signature(secret, date_time))) is None:
            self._failed(call, guard.login_failure(name[:128], "signature"))
            raise Refusal("UNAUTHORIZED", "check signature failed for accessKey=%s" % name[:128])
        try:
            guard.authenticated(session, name)
        except errors.Unauthenticated as exc:
            self._failed(call, str(exc))
            raise Refusal("UNAUTHORIZED", str(exc)) from None
        except errors.QuotaExceeded as exc:
            raise Refusal("TOO_MANY_REQUESTS", str(exc)) from None
        call.user = name  # the call's own (its connection's session may sign in as another user later)

    def _failed(self, call, why):
        log.warning("grpc %s: authentication failed: %s", call.peer, why)
        delay = self.guard.failed(call.session.host)
        if delay:
            gevent.sleep(delay)

    # -- the RPCs ------------------------------------------------------------------------------------------------

    def query_route(self, request, call):
        """The topic's queues on this broker (from the store, with the topic table's permission) and, with
        ZooKeeper, on every other broker of the cluster holding it whose master has a gRPC port (read and
        write: their topic tables are their own). Each broker is named with its master's endpoint, as id 0: on a
        slave, our broker id's master, even for a topic no broker has registered yet (its first send creates it).
        With authentication on, only a topic the user may publish to or subscribe to is answered (the proxy's
        ``Permission.ANY``; ``Guard.known_to``, what a topic list shows it); any other is FORBIDDEN whether it
        exists or not, so the refusal tells nothing of the topic."""
        topic = request.topic.name
        self._may_know(call, topic)
        rows = self.cluster(topic) if self.cluster is not None else None
        route, why = [], None
        try:
            queues = self.store.partitions_of(topic)
        except (errors.UnknownTopic, errors.InvalidTopic) as exc:
            queues, why = None, exc
        if queues is not None:
            s = self.store.topics.settings_of(topic)
            readable, writable = (True, True) if s is None else (s.readable, s.writable)
            permission = pb.READ_WRITE if readable and writable else pb.READ if readable else \
                pb.WRITE if writable else pb.NONE
            own = next((r for r in rows or () if r.broker_id == self.broker_id), None)
            if own is None and rows is not None:  # a topic not registered yet: our broker id's master all the same
                own = next((r for r in self.cluster(None) or () if r.broker_id == self.broker_id), None)
            mine = self._endpoints(request.endpoints)
            master = _endpoints_of(own.grpc) if own is not None and own.grpc else mine
            if master.addresses[0].port == mine.addresses[0].port and master.addresses[0].host in (
                    mine.addresses[0].host, self.endpoint()[0]):
                master = mine  # ourselves, as the client reached us
            broker = pb.Broker(name=self.broker_name, id=0, endpoints=master)
            route += [pb.MessageQueue(topic=request.topic, id=q, permission=permission, broker=broker,
                                      accept_message_types=ACCEPTED) for q in range(queues)]
        for r in rows or ():
            if r.broker_id == self.broker_id or not r.grpc or r.queues <= 0:
                continue
            broker = pb.Broker(name=r.name, id=0, endpoints=_endpoints_of(r.grpc))
            route += [pb.MessageQueue(topic=request.topic, id=q, permission=pb.READ_WRITE, broker=broker,
                                      accept_message_types=ACCEPTED) for q in range(r.queues)]
        if not route:
            raise Refusal("TOPIC_NOT_FOUND", "no route for topic %s: %s" % (topic[:256], why or "no broker holds it"))
        return pb.QueryRouteResponse(status=status("OK"), message_queues=route)

    def _may_know(self, call, topic):
        """Refuse (FORBIDDEN) a topic the call's user may neither publish to nor subscribe to; the decision is the
        guard's (``known_to``), made from the names alone, before anything of the topic is looked at."""
        guard = self.guard
        known = guard.known_to(call.session) if guard is not None else None
        if known is not None and not known(topic):
            raise Refusal("FORBIDDEN", "permission denied: user %s may neither publish to nor subscribe to topic %s"
                          % (call.user or "(none)", topic[:256]))

    def _endpoints(self, access_point):
        """This port's endpoint as routes name it: the address it is bound to, or, bound to every interface, the
        host the client reached it by (its access point) with this port."""
        host, port = self.endpoint()
        if host in _WILDCARDS and access_point.addresses:
            host = access_point.addresses[0].host
        scheme = pb.IPv4 if _is_ipv4(host) else pb.IPv6 if ":" in host else pb.DOMAIN_NAME
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])

    def heartbeat(self, request, call):
        if self.renewer is not None:  # the client lives: what it holds is renewed on
            self.renewer.heard(client_of(call))
        return pb.HeartbeatResponse(status=status("OK"))

    def notify_client_termination(self, request, call):
        """The client ends: the messages it holds are no longer renewed, and visible again soon (the proxy's); its
        consumer Settings are forgotten."""
        client = client_of(call)
        self._forget_consumer(client)  # its Settings too: its share of the consumer clients is free again
        if self.renewer is not None:
            self.renewer.terminated(client)
        return pb.NotifyClientTerminationResponse(status=status("OK"))

    def send_message(self, request, call):
        """Each message checked, stored through the put path (a delivery time: metaq's timers), then one wait
        for the last put's durability covers them all; one entry per message, in order."""
        messages = request.messages
        if not messages:
            raise Refusal("MESSAGE_CORRUPTED", "a SendMessage request without messages")
        topic = messages[0].topic.name
        if any(m.topic.name != topic for m in messages):
            raise Refusal("ILLEGAL_TOPIC", "the messages of one SendMessage request must share one topic")
        try:
            self.path.check_write(topic, call.session)  # the user's PUB, the broker's state, the topic's name
            queues = self.store.partitions_of(topic)
        except errors.MetaqError as exc:  # every message refused alike (clients expect one entry per message)
            refused = status(code_of(exc), str(exc))
            return pb.SendMessageResponse(status=refused, entries=[
                pb.SendResultEntry(status=refused, message_id=m.system_properties.message_id) for m in messages])
        # its user's produce rate: waits what the user owes (within the call's deadline), then charges these bodies
        paced_wait(self.guard, call, time.monotonic() + max(0, call.timeout_s - POLL_RESERVE_MS / 1000.0), "produce")
        if self.guard is not None:
            self.guard.pace(call, "produce", sum(len(m.body) for m in messages))
        entries, written = [], {}
        for m in messages:
            try:
                entry, r = self._send_one(topic, queues, m, call)
            except Refusal as exc:
                entry, r = pb.SendResultEntry(status=status(exc.code, exc.message),
                                              message_id=m.system_properties.message_id), None
            except errors.MetaqError as exc:
                entry, r = pb.SendResultEntry(status=status(code_of(exc), str(exc)),
                                              message_id=m.system_properties.message_id), None
            entries.append(entry)
            if r is not None:
                written[r.partition] = max(r.log_end, written.get(r.partition, 0))
        cuts = self.store.log_cuts  # the writes' truncation count: the waits after the first begin after its yields
        try:  # the furthest put first: its wait covers the others' (each partition's long polls are woken)
            for partition, log_end in sorted(written.items(), key=lambda item: -item[1]):
                self.path.durable(topic, partition, log_end, now_ms(), cuts)
        except errors.MetaqError as exc:  # written, not acknowledged (a failed flush, a lost lease)
            code = code_of(exc)
            for e in entries:
                if e.status.code == pb.OK:
                    e.status.CopyFrom(status(code, str(exc)))
        codes = {e.status.code for e in entries}
        overall = entries[0].status if len(codes) == 1 else status("MULTIPLE_RESULTS")
        self.counts["sent"] += sum(1 for e in entries if e.status.code == pb.OK)
        return pb.SendMessageResponse(status=overall, entries=entries)

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
        deliver = _ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
        checked = check_message(topic, sp.tag if sp.HasField("tag") else None, list(sp.keys), sp.message_id,
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
        born = _ms(sp.born_timestamp) if sp.HasField("born_timestamp") else now
        owner = call.session.user if call.session is not None else None
        if checked.message_type == TRANSACTION:
            return self._send_half(topic, partition, flag, data, sp, now, owner), None
        r = self.path.append(topic, partition, flag, data, now, born_ms=born, due_ms=due, owner=owner)
        entry = pb.SendResultEntry(status=status("OK"), message_id=sp.message_id, offset=r.offset)
        if due is not None:  # held by the timers: r.msg_id is its timer id
            entry.recall_handle = recall_handle(Recall(topic, self.broker_name, deliver, sp.message_id, r.msg_id))
        return entry, r

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

    # -- POP: receiving, acknowledging ---------------------------------------------------------------------------

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

    def consumer(self, call):
        """The ``Consumer`` settings of the call's client (its Telemetry Settings), the defaults when it sent
        none (a client may receive without Settings, apache/rocketmq#5728). A known client is heard from now."""
        client = client_of(call)
        found = self.consumers.get(client)
        if found is None:
            return DEFAULT_CONSUMER
        self._heard(client, time.monotonic())
        return found

    def _heard(self, client, now):
        self.consumers.move_to_end(client)
        mine = self.consumers_by_user[client.user]
        mine[client] = now
        mine.move_to_end(client)

    def remember_consumer(self, client, fifo, max_attempts, now=None):
        """Keep the settings of ``client`` (a ``ClientKey``); a new client first gets room (``_room_for``, which
        may refuse it RESOURCE_EXHAUSTED: its Settings then ends its stream and nothing of it is kept)."""
        now = time.monotonic() if now is None else now
        if client not in self.consumers:
            self._room_for(client, now)
            self.consumers_by_user.setdefault(client.user, OrderedDict())
        self.consumers[client] = Consumer(fifo, max_attempts)
        self._heard(client, now)

    def _room_for(self, client, now):
        """Make room for a new consumer client, the one decision on the table's bounds. A user holds at most its
        ``consumer_clients`` quota and the broker ``limits.GRPC_MAX_CONSUMER_CLIENTS``: past either the client
        heard from longest ago (the user's own, or anyone's for the broker's bound) is forgotten when it is idle
        (``limits.GRPC_CLIENT_IDLE_MS``: taken for ended), else the new one is refused RESOURCE_EXHAUSTED, so one
        user's many client ids never push out another user's live Settings. With authentication off there is one
        tenant: the broker's bound forgets the oldest client, idle or not (it sends its Settings again)."""
        idle_before = now - limits.GRPC_CLIENT_IDLE_MS / 1000.0
        user = client.user
        mine = self.consumers_by_user.get(user)
        if user and self.guard is not None and mine:
            try:
                self.guard.quotas.check(user, "consumer_clients", len(mine))
            except errors.QuotaExceeded as exc:
                oldest, heard = next(iter(mine.items()))
                if heard > idle_before:
                    raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: %s" % exc) from None
                self._forget_consumer(oldest)
        if len(self.consumers) < limits.GRPC_MAX_CONSUMER_CLIENTS:
            return
        oldest = next(iter(self.consumers))
        if user and self.consumers_by_user[oldest.user][oldest] > idle_before:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: the gRPC port keeps the Settings of %d "
                            "consumer clients (limits.GRPC_MAX_CONSUMER_CLIENTS), none idle; client %s refused"
                            % (limits.GRPC_MAX_CONSUMER_CLIENTS, client.id))
        self._forget_consumer(oldest)

    def _forget_consumer(self, client):
        self.consumers.pop(client, None)
        mine = self.consumers_by_user.get(client.user)
        if mine is not None:
            mine.pop(client, None)
            if not mine:
                del self.consumers_by_user[client.user]

    def consumer_clients_held(self):
        """``{user: consumer clients whose Settings are kept}`` (``stats quotas``; None: no user)."""
        return {user or None: len(mine) for user, mine in self.consumers_by_user.items()}

    def query_assignment(self, request, call):
        """As the proxy answers: per broker holding the topic, one queue of id -1 ("any queue of this broker") for
        every consumer of a non-FIFO group, every queue of the broker for a FIFO one (its client's Settings, or the
        group's ``fifo`` setting: ``groups.policy.fifo``)."""
        topic, group = request.topic.name, request.group.name
        self._may_consume(call, group, topic)
        route = self.query_route(pb.QueryRouteRequest(topic=request.topic, endpoints=request.endpoints), call)
        fifo = group_policy.fifo(self.store.groups.get(group), self.consumer(call).fifo)
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

    def receive_message(self, request, call):
        """Up to ``batch_size`` (at most ``limits.POP_MAX_BATCH``) messages of any partition of the topic on this
        broker (the proxy pops broker-wide whatever queue id the client names), invisible to the group's other
        receivers for ``invisible_duration``; with nothing there, a long poll of ``long_polling_timeout`` (within
        the call's deadline less ``POLL_RESERVE_MS``), counted among the broker's parked long polls and its user's
        (``parked_gets``: TOO_MANY_REQUESTS past either), ended at once when the client resets the call or its
        connection ends (``call.cancelled``). Messages the filter expression refuses are acknowledged
        and never delivered to the group (the proxy acks tag mismatches); a batch all filtered out is followed by
        another, at least ``FILTER_ROUNDS`` batches a call. The stream: a status, the messages, a
        delivery timestamp."""
        pop = self._pop_service()
        group, topic = request.group.name, request.message_queue.topic.name
        self._may_consume(call, group, topic)
        decision = group_policy.decide(self.store.groups.get(group), group)  # the group's settings
        if decision.refusal is not None:  # the proxy's answer to the broker's NO_PERMISSION
            raise Refusal("FORBIDDEN", decision.refusal)
        wanted = _filter_of(request.filter_expression)
        settings = self.consumer(call)
        batch = min(max(request.batch_size, 1), limits.POP_MAX_BATCH)
        renewer = self.renewer if request.auto_renew else None
        if renewer is not None:
            invisible = renewer.invisible_ms
        elif request.auto_renew or not request.HasField("invisible_duration"):
            invisible = DEFAULT_INVISIBLE_MS
        else:
            invisible = _duration_ms(request.invisible_duration)
            if not limits.POP_MIN_INVISIBLE_MS <= invisible <= limits.POP_MAX_INVISIBLE_MS:
                raise Refusal("ILLEGAL_INVISIBLE_TIME", "invisible_duration must be within %d..%d ms, not %d"
                              % (limits.POP_MIN_INVISIBLE_MS, limits.POP_MAX_INVISIBLE_MS, invisible))
        budget = int(call.timeout_s * 1000) - POLL_RESERVE_MS
        wait = _duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else budget
        wait = max(0, min(wait, budget, limits.MAX_WAIT_MS))
        start = time.monotonic()
        end, last = start + wait / 1000.0, start + max(0, budget) / 1000.0
        host = self.endpoint()
        rounds, kept = 0, []
        cancel = getattr(call, "cancelled", None)  # set when the client resets the call or its connection ends
        if not paced_wait(self.guard, call, last):  # its user's fetch rate: the receive waits before it takes
            return [pb.ReceiveMessageResponse(status=status("MESSAGE_NOT_FOUND", "no new message")), _delivered_now()]
        try:
            while not (cancel is not None and cancel.is_set()):  # a call reset before it ran takes nothing
                rounds += 1
                got = pop.receive(group, topic, batch, invisible,
                                  group_policy.fifo(self.store.groups.get(group), settings.fifo), settings.max_attempts,
                                  wait_ms=max(0, int((end - time.monotonic()) * 1000)), cancel=cancel,
                                  user=getattr(call, "user", None))
                kept, dropped = [], []
                for r in got:
                    msg = message_of_record(r.record, host)
                    (kept if wanted is None or wanted(msg.properties) else dropped).append((r, msg))
                if kept:  # from here on, a call that ends before its answer is sent gives them back (port._unsent)
                    call.unsent = functools.partial(self._receive_unsent, group, topic, [r for r, _m in kept])
                if dropped:
                    pop.ack(group, topic, [r.handle for r, _m in dropped])
                t = time.monotonic()
                if kept or not got or t >= last or (t >= end and rounds >= FILTER_ROUNDS):
                    break
        except errors.MetaqError as exc:
            if kept:  # taken, then refused (acknowledging the filtered-out ones): the client never gets them
                call.unsent = None
                self._receive_unsent(group, topic, [r for r, _m in kept])
            raise Refusal(code_of(exc), str(exc)) from None
        if self.renewer is not None:
            self.renewer.heard(client_of(call))
        if not kept:
            return [pb.ReceiveMessageResponse(status=status("MESSAGE_NOT_FOUND", "no new message")), _delivered_now()]
        if renewer is not None and not getattr(call, "reset", False):  # kept invisible while the client lives
            # (renewer.py); a call the client gave up on never brings them to it: they come back at their deadline
            renewer.delivered(client_of(call), group, topic, [r for r, _m in kept])
        if self.guard is not None:  # the bytes it answers with, charged to its user's fetch rate (paced_wait)
            self.guard.pace(call, "fetch", sum(len(r.record.data) for r, _m in kept))
        out = [pb.ReceiveMessageResponse(status=status("OK"))]
        for r, msg in kept:
            response = pb.ReceiveMessageResponse()
            self._received_message(r, msg, invisible, response.message)
            out.append(response)
        return out + [_delivered_now()]

    def _receive_unsent(self, group, topic, received):
        """A receive's answer did not reach the client (it reset the call, the connection ended or its window stayed
        shut): its messages are visible again ``limits.GRPC_RELEASE_INVISIBLE_MS`` from now, not after their
        invisible duration (nor renewed): a client never holds what it never got."""
        if self.renewer is not None:
            self.renewer.settled(group, topic, [r.handle for r in received])
        try:
            back = self.pop.release(group, topic, [(r.partition, r.offset, r.attempt, r.deadline_ms) for r in received],
                                    now_ms() + limits.GRPC_RELEASE_INVISIBLE_MS)
        except errors.MetaqError as exc:  # not the master now: they come back at their deadline
            log.info("grpc: %d messages of an unsent receive of %s/%s stay invisible until their deadline: %s",
                     len(received), group[:128], topic[:128], exc)
            return
        log.info("grpc: a receive of %s/%s did not reach its client: %d messages visible again in %d ms",
                 group[:128], topic[:128], len(back), limits.GRPC_RELEASE_INVISIBLE_MS)

    def _received_message(self, r, msg, invisible, into):
        """A received message as the proxy's converter fills it (reference 4.3), in ``into`` (``message_of``): with
        the receipt handle, the delivery attempt and the invisible duration, of the topic it was received from."""
        m = message_of(msg, self.endpoint(), self.store.config.max_transfer_size, r.record.msg_id, into)
        m.topic.name = r.topic
        sp = m.system_properties
        sp.queue_id, sp.queue_offset, sp.receipt_handle, sp.delivery_attempt = r.partition, r.offset, r.handle, \
            r.attempt
        sp.invisible_duration.FromMilliseconds(invisible)
        return m

    def ack_message(self, request, call):
        """Each entry's receipt handle acknowledged (``PopService.ack``, at most ``limits.POP_MAX_ACK_HANDLES`` a
        journal call): OK, a repeated ack too; a handle expired, of an older delivery or malformed:
        INVALID_RECEIPT_HANDLE. The top status: OK when every entry is, the entries' code when they share one,
        MULTIPLE_RESULTS otherwise."""
        pop = self._pop_service()
        group, topic = request.group.name, request.topic.name
        self._may_consume(call, group, topic)
        entries = list(request.entries)
        if not entries:
            raise Refusal("BAD_REQUEST", "an AckMessage request without entries")
        results = []
        try:
            for i in range(0, len(entries), limits.POP_MAX_ACK_HANDLES):
                results += pop.ack(group, topic, [e.receipt_handle for e in entries[i:i + limits.POP_MAX_ACK_HANDLES]])
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        if self.renewer is not None:
            self.renewer.settled(group, topic, [e.receipt_handle for e, r in zip(entries, results) if r is None])
        out = []
        for e, result in zip(entries, results):
            s = status("OK") if result is None else status("INVALID_RECEIPT_HANDLE", str(result))
            out.append(pb.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle, status=s))
        codes = {o.status.code for o in out}
        top = out[0].status if len(codes) == 1 else status("MULTIPLE_RESULTS", "the entries' results differ")
        return pb.AckMessageResponse(status=top, entries=out)

    def change_invisible_duration(self, request, call):
        """The message invisible for ``invisible_duration`` from now (below ``limits.POP_MIN_INVISIBLE_MS``, a
        push consumer's nack of 0: that minimum); answered with the new receipt handle (the old one no longer
        acks)."""
        pop = self._pop_service()
        group, topic = request.group.name, request.topic.name
        self._may_consume(call, group, topic)
        invisible = max(_duration_ms(request.invisible_duration), limits.POP_MIN_INVISIBLE_MS)
        if invisible > limits.POP_MAX_INVISIBLE_MS:
            raise Refusal("ILLEGAL_INVISIBLE_TIME", "invisible_duration may be at most %d ms"
                          % limits.POP_MAX_INVISIBLE_MS)
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

    # -- transactions ----------------------------------------------------------------------------------------------

    def _send_half(self, topic, partition, flag, data, sp, now, owner):
        """A transactional message: a half message of metaq's transaction service (journaled, invisible, durable
        before the answer), of group ``%GRPC%<topic>`` (the proxy's group is the topic), ended by EndTransaction or
        by the check-back on a Telemetry stream. Its transaction id, ``<number>:<message id>``, finds it again."""
        tx = self.tx
        if tx is None:
            raise Refusal("NOT_IMPLEMENTED", "transactional messages need the broker's transaction service")
        number = tx.next_half_number(now)
        transaction_id = "%d:%s" % (number, sp.message_id)
        if len(transaction_id.encode("utf-8")) > limits.MAX_NAME_BYTES:
            raise Refusal("ILLEGAL_MESSAGE_ID", "a transactional message's id may hold at most %d bytes"
                          % (limits.MAX_NAME_BYTES - len(str(number)) - 1))
        tx.check_quota(owner)
        tx.manager.put_half(number, topic, partition, flag, data, GRPC_GROUP_PREFIX + topic, transaction_id,
                            immunity_ms(None), self.checks.max_half, now, owner)
        try:
            tx.flush_journal()  # in a pool thread: answered once the half message is durable
        except errors.TransactionError:
            tx.rollback_quietly(half_txid(number), HALF_OWNER)
            raise
        return pb.SendResultEntry(status=status("OK"), message_id=sp.message_id, transaction_id=transaction_id,
                                  offset=number)

    def _half_of(self, topic, transaction_id):
        number, sep, _id = transaction_id.partition(":")
        half = self.tx.manager.half(int(number)) if sep and number.isdigit() and self.tx is not None else None
        if half is None or half.transaction_id != transaction_id or half.group != GRPC_GROUP_PREFIX + topic:
            return None
        return half

    def end_transaction(self, request, call):
        """COMMIT stores the half message in its topic (once), ROLLBACK drops it, UNSPECIFIED leaves it for a
        later end or check; the caller needs publish on the topic. An unknown transaction: the proxy's
        INTERNAL_SERVER_ERROR "cannot found transaction data"."""
        topic = request.topic.name
        if not request.transaction_id.strip():
            raise Refusal("INVALID_TRANSACTION_ID", "a blank transaction id")
        try:
            self.path.check_write(topic, call.session)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        half = self._half_of(topic, request.transaction_id)
        if half is None:
            raise Refusal("INTERNAL_SERVER_ERROR", "cannot found transaction data: no half message of topic %s "
                          "with transaction id %s waits for its end (ended, rolled back after its last check, or "
                          "never sent here)" % (topic[:256], request.transaction_id[:300]))
        try:
            if request.resolution == pb.COMMIT:
                self.tx.commit_now(half_txid(half.number), HALF_OWNER, one_phase=False)
            elif request.resolution == pb.ROLLBACK:
                self.tx.rollback_now(half_txid(half.number), HALF_OWNER)
        except errors.MetaqError as exc:
            raise Refusal(code_of(exc), str(exc)) from None
        return pb.EndTransactionResponse(status=status("OK"))

    def start(self):
        """Start the check-back of gRPC half messages (with a transaction service) and the renewer."""
        if self.renewer is not None:
            self.renewer.start()
        if self.tx is not None and self.checks is not None and self._check_task is None:
            self._check_task = gevent.spawn(self._check_loop)

    def stop(self):
        if self.renewer is not None:
            self.renewer.stop()
        if self._check_task is not None:
            self._check_task.kill(block=False)
            self._check_task = None

    def _check_loop(self):
        while True:
            gevent.sleep(self.checks.interval_s)
            try:
                self.check_round(now_ms())
            except errors.MetaqError as exc:  # the journal cannot be written: the next round tries again
                log.error("grpc: transaction check-back round stopped: %s", exc)
            except Exception:  # noqa: BLE001 - a round's bug must not end every later round
                log.exception("grpc: transaction check-back round failed; the next round tries again")

    def check_round(self, now):
        """One round over the gRPC half messages (RocketMQ's rules, ``policy.plan_round``): each due one is asked
        about with a RecoverOrphanedTransactionCommand on the Telemetry stream of a producer publishing to its
        topic (with authentication on, one of its sender); none online still counts as a check; past
        ``check_max`` checks it is rolled back."""
        manager, c = self.tx.manager, self.checks
        if manager.replica:
            return None
        plan = plan_round([h for h in manager.halves() if h.group.startswith(GRPC_GROUP_PREFIX)], now,
                          c.timeout_ms, c.check_max, c.per_round)
        for number in plan.give_up:
            self.tx.rollback(half_txid(number), HALF_OWNER)
            self.counts["given_up"] += 1
            log.info("grpc: half message %d rolled back: no answer after %d checks", number, c.check_max)
        for number in plan.check:
            half = manager.half_checked(number, now)
            if self._ask(half):
                self.counts["checks_sent"] += 1
            else:
                self.counts["checks_unsent"] += 1
        if plan.give_up:
            self.tx.flush_journal()
        return plan

    def _ask(self, half):
        streams = self.producers.get(half.topic, {})
        for call in list(streams.values()):
            if half.user is not None and client_of(call).user != half.user:
                continue
            command = pb.TelemetryCommand(recover_orphaned_transaction_command=pb.RecoverOrphanedTransactionCommand(
                message=self._half_message(half, call), transaction_id=half.transaction_id))
            if call.push(command.SerializeToString()):
                return True
        return False

    def _half_message(self, half, call):
        """The half message as a client is given it: its body, tag, keys, id and user properties."""
        attribute, body = decode_payload(half.flag, half.data)
        tags, props, _remoting = split_attribute(attribute)
        sp = pb.SystemProperties(message_id=props.get(PROP_UNIQ_KEY, ""), message_type=pb.TRANSACTION,
                                 body_encoding=pb.IDENTITY, queue_id=half.partition,
                                 body_digest=pb.Digest(type=pb.MD5, checksum=hashlib.md5(body).hexdigest().upper()),
                                 store_host="%s:%d" % self.endpoint())
        tag = tags or props.get(PROP_TAGS)
        if tag:
            sp.tag = tag
        sp.keys.extend(k for k in props.get(PROP_KEYS, "").split(" ") if k)
        sp.born_timestamp.FromMilliseconds(half.stored_ms)
        sp.store_timestamp.FromMilliseconds(half.stored_ms)
        user = {k: v for k, v in props.items() if k not in RESERVED_PROPERTIES and not k.startswith(("@", "__"))}
        return pb.Message(topic=pb.Resource(name=half.topic), user_properties=user, system_properties=sp, body=body)

    def telemetry_closed(self, call):
        """``call``'s Telemetry stream ended: it is no longer asked about half messages, nor by an admin; its
        client's last stream closed, what it holds is no longer renewed (``renewer.py``)."""
        client = client_of(call)
        if self.clients is not None:
            self.clients.stream_closed(client, call)
        if self.renewer is not None:
            self.renewer.stream_closed(client, call)
        self._unpublish(client, call)

    def _unpublish(self, client, call):
        """Forget the topic names ``call``'s Settings registered (its stream ended, or new Settings replace them)."""
        names = self.published.pop(call, ())
        if not names:
            return
        left = self.published_by_user.get(client.user, 0) - len(names)
        if left > 0:
            self.published_by_user[client.user] = left
        else:
            self.published_by_user.pop(client.user, None)
        for topic in names:
            streams = self.producers.get(topic)
            if streams is not None and streams.get(client) is call:
                del streams[client]
                if not streams:
                    del self.producers[topic]

    def producer_topics_held(self):
        """``{user: topic names its producers' streams hold}`` (``stats quotas``; None: no user, authentication off)."""
        return {user or None: n for user, n in self.published_by_user.items()}

    def publish(self, client, call, topics):
        """Register ``call`` as ``client``'s stream for ``topics`` (its producer Settings' ``publishing.topics``),
        replacing what its Settings before named. Checked before anything is kept: at most
        ``limits.GRPC_MAX_TOPICS_PER_SETTINGS`` names (INVALID_ARGUMENT), each a legal topic name, and the names
        kept stay within ``limits.GRPC_MAX_PRODUCER_TOPICS`` and the user's ``producer_topics`` quota
        (RESOURCE_EXHAUSTED). So one stream holds at most one Settings' names, and a user at most its quota."""
        most = limits.GRPC_MAX_TOPICS_PER_SETTINGS
        if len(topics) > most:
            raise GrpcError(Status.INVALID_ARGUMENT, "BAD_REQUEST: a producer's Settings names %d topics: at most %d "
                            "(limits.GRPC_MAX_TOPICS_PER_SETTINGS)" % (len(topics), most))
        names = set()
        for resource in topics:
            try:
                limits.validate_topic(resource.name)
            except errors.InvalidTopic as exc:
                raise GrpcError(Status.INVALID_ARGUMENT, "ILLEGAL_TOPIC: %s" % exc) from None
            names.add(resource.name)
        mine = len(self.published.get(call, ()))
        held = sum(self.published_by_user.values()) - mine
        if held + len(names) > limits.GRPC_MAX_PRODUCER_TOPICS:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: the broker keeps %d topic names of "
                            "producers' streams (limits.GRPC_MAX_PRODUCER_TOPICS); this Settings names %d more"
                            % (limits.GRPC_MAX_PRODUCER_TOPICS, len(names)))
        guard = self.guard
        if guard is not None and client.user:
            try:
                guard.quotas.check(client.user, "producer_topics", self.published_by_user.get(client.user, 0) - mine,
                                   len(names))
            except errors.QuotaExceeded as exc:
                raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: %s" % exc) from None
        self._unpublish(client, call)
        if not names:
            return
        self.published[call] = frozenset(names)
        self.published_by_user[client.user] = self.published_by_user.get(client.user, 0) + len(names)
        for topic in names:
            self.producers.setdefault(topic, {})[client] = call

    # -- Telemetry -------------------------------------------------------------------------------------------------

    def telemetry(self, call, data):
        """The serialized answer to one TelemetryCommand of the client's stream, or None (nothing to answer);
        GrpcError ends the stream (the proxy's out-of-band codes)."""
        command = pb.TelemetryCommand()
        try:
            command.ParseFromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its relatives
            raise GrpcError(Status.INTERNAL, "a TelemetryCommand that does not parse")
        try:
            self.login(call)
        except Refusal as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, "%s: %s" % (exc.code, exc.message)) from None
        which = command.WhichOneof("command")
        client = client_of(call)
        if self.renewer is not None:
            self.renewer.stream_seen(client, call)
        if self.clients is not None:
            self.clients.stream_seen(client, call)
            if which in ("thread_stack_trace", "verify_message_result"):
                self.clients.answer(call, command)  # an admin's question answered (clientcommands.py)
        if which != "settings":
            return None
        settings = command.settings
        answer = pb.Settings()
        answer.CopyFrom(settings)
        answer.metric.on = False
        if settings.WhichOneof("pub_sub") == "publishing":
            if client.id and call.push is not None:  # asked about its topics' half messages (check_round)
                self.publish(client, call, settings.publishing.topics)
            policy = answer.backoff_policy
            policy.Clear()
            policy.max_attempts = PRODUCER_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromSeconds(1)
            policy.exponential_backoff.multiplier = 2.0
            answer.publishing.max_body_size = self.max_body
            answer.publishing.validate_message_type = True
        elif settings.WhichOneof("pub_sub") == "subscription":
            attempts = settings.backoff_policy.max_attempts
            attempts = CONSUMER_ATTEMPTS if attempts <= 0 else attempts
            group = settings.subscription.group.name  # its settings' max_retries + 1 win (groups/policy.py)
            group_settings = self.store.groups.get(group) if group else None
            attempts = group_policy.max_attempts(group_settings, attempts)
            asked = settings.subscription.fifo
            if client.id:
                self.remember_consumer(client, asked, attempts)
            policy = answer.backoff_policy
            policy.Clear()
            policy.max_attempts = attempts
            for s in CONSUMER_BACKOFF_S:
                policy.customized_backoff.next.add().FromSeconds(s)
            answer.subscription.fifo = group_policy.fifo(group_settings, asked)
            answer.subscription.receive_batch_size = RECEIVE_BATCH
            answer.subscription.long_polling_timeout.FromSeconds(LONG_POLLING_S)
        else:
            raise GrpcError(Status.INVALID_ARGUMENT, "BAD_REQUEST: settings with neither publishing nor "
                            "subscription")
        return pb.TelemetryCommand(status=status("OK"), settings=answer).SerializeToString()


def message_of(msg, endpoint, max_transfer, msg_id, into=None):
    """A stored message (``mapping.message_of_record``'s) as the proxy's converter fills it (reference 4.3): its
    topic, queue and offset, the user's properties, the system ones (tag, keys, id, digest, type, times, hosts).
    ``msg_id``: the record's metaq id, its message id when the client gave none. ``into``: an empty ``Message``
    to fill in place (a response's own field: no copy of the message into the response), returned."""
    props = msg.properties
    try:
        body = inflate_body(msg.sys_flag, msg.body, max_transfer)
    except errors.MetaqError:
        body = msg.body
    m = pb.Message() if into is None else into
    m.topic.name = msg.topic
    m.body = body
    sp = m.system_properties
    sp.message_id = props.get(PROP_UNIQ_KEY) or "%X" % msg_id
    sp.body_encoding = pb.IDENTITY
    sp.queue_id = msg.queue_id
    sp.queue_offset = msg.queue_offset
    digest = sp.body_digest
    digest.type = pb.MD5
    digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.store_host = "%s:%d" % tuple(endpoint)
    sp.born_host = "%s:%d" % tuple(msg.born_host[:2])
    sp.born_timestamp.FromMilliseconds(msg.born_timestamp)
    sp.store_timestamp.FromMilliseconds(msg.store_timestamp)
    if props.get(PROP_TAGS):
        sp.tag = props[PROP_TAGS]
    sp.keys.extend(k for k in props.get(PROP_KEYS, "").split(" ") if k)
    group = props.get(PROP_SHARDING_KEY)
    deliver = props.get(PROP_DELIVER_MS, "")
    if group:
        sp.message_group = group
        sp.message_type = pb.FIFO
    elif deliver.isdigit():
        sp.delivery_timestamp.FromMilliseconds(int(deliver))
        sp.message_type = pb.DELAY
    else:
        sp.message_type = pb.NORMAL
    m.user_properties.update({k: v for k, v in props.items()
                              if k not in RESERVED_PROPERTIES and not k.startswith(("@", "__"))})
    return m


def _duration_ms(d):
    return d.seconds * 1000 + d.nanos // 1_000_000


def _delivered_now():
    """A receive stream's last response: the time it was answered."""
    r = pb.ReceiveMessageResponse()
    r.delivery_timestamp.FromMilliseconds(now_ms())
    return r


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


def _is_ipv4(host):
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


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
