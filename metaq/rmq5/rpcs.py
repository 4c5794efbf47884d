"""RocketMQ 5's ``apache.rocketmq.v2.MessagingService``: the RPCs this phase serves, over metaq's put path.

Served: QueryRoute (this broker, its gRPC endpoint, the topic's partitions as queues), Heartbeat,
NotifyClientTermination, SendMessage (normal, FIFO message groups, delivery times through metaq's timers) and
Telemetry's Settings exchange. Every other RPC is answered gRPC UNIMPLEMENTED (12) naming why (POP consumption,
transactions, pulls and recalls come in later phases; docs/rocketmq5.md).

As RocketMQ's proxy does, business errors travel in-band: grpc-status 0 and the response's ``status`` holding an
``apache.rocketmq.v2.Code`` (``Refusal`` and ``code_of``), authentication failures (``UNAUTHORIZED``) included;
Telemetry's are out of band (INVALID_ARGUMENT for the 4xxxx codes, INTERNAL otherwise).

Authentication (security.acl_file set): each call's ``authorization`` metadata (``MQv2-HMAC-SHA1``, reference in
``auth.proofs``) is checked through the broker's one login decision (``Guard.check_login``, then
``Guard.authenticated``, as the remoting port's signatures are); a send then asks ``PutPath.check_write`` (the
user's PUB permission, the broker's state, the topic's name) before ``PutPath.append``, the one put path, and is
answered once ``PutPath.durable`` says the put may be acknowledged.

The service is given what it uses, never the Broker: the store (partition counts, the topic table), the put path,
the guard, the broker's name, ``max_body_bytes`` and a callable naming the port's endpoint.
"""

import itertools
import logging
import zlib

import gevent

from metaq import errors
from metaq.auth import proofs
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.records import GZIP, Refusal, check_message, group_queue
from metaq.rmq5.wire import GrpcError, Status
from metaq.protocol.rocketmq.mapping import record_data_from_send
from metaq.server.clock import now_ms
from metaq.timers.records import timer_due

log = logging.getLogger(__name__)

#: Why the RPCs not served yet are not, as their UNIMPLEMENTED says.
LATER = {
    "QueryAssignment": "push consumers (POP) are not served yet",
    "ReceiveMessage": "receiving (POP: invisible durations, per-message acks) is not served yet",
    "AckMessage": "acknowledging received messages (POP) is not served yet",
    "ChangeInvisibleDuration": "POP is not served yet",
    "ForwardMessageToDeadLetterQueue": "POP is not served yet",
    "EndTransaction": "transactional messages over gRPC are not served yet",
    "PullMessage": "pull consumers over gRPC are not served yet",
    "UpdateOffset": "pull consumers over gRPC are not served yet",
    "GetOffset": "pull consumers over gRPC are not served yet",
    "QueryOffset": "pull consumers over gRPC are not served yet",
    "RecallMessage": "recalling a timed message over gRPC is not served yet (metaq-admin timers cancel does it)",
    "SyncLiteSubscription": "lite topics are not served",
}

#: What a producer's settings get back (the proxy's defaults): its retry policy.
PRODUCER_ATTEMPTS = 3
#: What a consumer's settings get back (the proxy's defaults).
CONSUMER_ATTEMPTS = 17
RECEIVE_BATCH = 32
LONG_POLLING_S = 20
CONSUMER_BACKOFF_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)

#: The message types a route's queues accept (a metaq topic has no type; transactions are not served yet).
ACCEPTED = (pb.NORMAL, pb.FIFO, pb.DELAY)

_WILDCARDS = ("0.0.0.0", "::", "")


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


def _ms(ts):
    return ts.seconds * 1000 + ts.nanos // 1_000_000


class MessagingService:
    """The RPCs (see the module doc). ``endpoint()``: ``(host, port)`` of the gRPC port as it listens."""

    def __init__(self, store, put_path, guard, broker_name, max_body, endpoint):
        self.store = store
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
        }
        self.counts = {"calls": 0, "refused": 0, "sent": 0}

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
        """The serialized response of unary ``rpc`` to request bytes ``data``; GrpcError for a request that does
        not parse (INTERNAL, as grpc's servers answer a message they cannot deserialize)."""
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
            return handler(request, call).SerializeToString()
        except Refusal as exc:
            self.counts["refused"] += 1
            return response_type(status=status(exc.code, exc.message)).SerializeToString()

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

    def _failed(self, call, why):
        log.warning("grpc %s: authentication failed: %s", call.peer, why)
        delay = self.guard.failed(call.session.host)
        if delay:
            gevent.sleep(delay)

    # -- the RPCs ------------------------------------------------------------------------------------------------

    def query_route(self, request, call):
        topic = request.topic.name
        try:
            queues = self.store.partitions_of(topic)
        except (errors.UnknownTopic, errors.InvalidTopic) as exc:
            raise Refusal("TOPIC_NOT_FOUND", "no route for topic %s: %s" % (topic[:256], exc)) from None
        s = self.store.topics.settings_of(topic)
        readable, writable = (True, True) if s is None else (s.readable, s.writable)
        permission = pb.READ_WRITE if readable and writable else pb.READ if readable else \
            pb.WRITE if writable else pb.NONE
        broker = pb.Broker(name=self.broker_name, id=0, endpoints=self._endpoints(request.endpoints))
        route = [pb.MessageQueue(topic=request.topic, id=q, permission=permission, broker=broker,
                                 accept_message_types=ACCEPTED) for q in range(queues)]
        return pb.QueryRouteResponse(status=status("OK"), message_queues=route)

    def _endpoints(self, access_point):
        """This port's endpoint as routes name it: the address it is bound to, or, bound to every interface, the
        host the client reached it by (its access point) with this port."""
        host, port = self.endpoint()
        if host in _WILDCARDS and access_point.addresses:
            host = access_point.addresses[0].host
        scheme = pb.IPv4 if _is_ipv4(host) else pb.IPv6 if ":" in host else pb.DOMAIN_NAME
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])

    def heartbeat(self, request, call):
        return pb.HeartbeatResponse(status=status("OK"))

    def notify_client_termination(self, request, call):
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
        try:  # the furthest put first: its wait covers the others' (each partition's long polls are woken)
            for partition, log_end in sorted(written.items(), key=lambda item: -item[1]):
                self.path.durable(topic, partition, log_end, now_ms())
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
        r = self.path.append(topic, partition, flag, data, now, born_ms=born, due_ms=due, owner=owner)
        return pb.SendResultEntry(status=status("OK"), message_id=sp.message_id, offset=r.offset), r

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
        if which != "settings":
            return None  # a thread stack or a verify result: nothing this phase asks for
        settings = command.settings
        answer = pb.Settings()
        answer.CopyFrom(settings)
        answer.metric.on = False
        if settings.WhichOneof("pub_sub") == "publishing":
            policy = answer.backoff_policy
            policy.Clear()
            policy.max_attempts = PRODUCER_ATTEMPTS
            policy.exponential_backoff.initial.FromMilliseconds(10)
            policy.exponential_backoff.max.FromSeconds(1)
            policy.exponential_backoff.multiplier = 2.0
            answer.publishing.max_body_size = self.max_body
            answer.publishing.validate_message_type = True
        elif settings.WhichOneof("pub_sub") == "subscription":
            policy = answer.backoff_policy
            policy.Clear()
            policy.max_attempts = CONSUMER_ATTEMPTS
            for s in CONSUMER_BACKOFF_S:
                policy.customized_backoff.next.add().FromSeconds(s)
            answer.subscription.fifo = False
            answer.subscription.receive_batch_size = RECEIVE_BATCH
            answer.subscription.long_polling_timeout.FromSeconds(LONG_POLLING_S)
        else:
            raise GrpcError(Status.INVALID_ARGUMENT, "BAD_REQUEST: settings with neither publishing nor "
                            "subscription")
        return pb.TelemetryCommand(status=status("OK"), settings=answer).SerializeToString()


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
