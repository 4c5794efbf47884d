"""RocketMQ 5's ``apache.rocketmq.v2.MessagingService``: the dispatcher of its RPCs, each group in its own module.

It parses a call's request, checks the call's client id and credentials, and hands the request to the group that
serves the RPC; it decides nothing else. The groups, each given what it uses and none another's state:

    routing.py    QueryRoute, Heartbeat, NotifyClientTermination
    sends.py      SendMessage (normal, FIFO, timed; transactional through halves.py), RecallMessage
    receives.py   QueryAssignment, ReceiveMessage, AckMessage, ChangeInvisibleDuration,
                  ForwardMessageToDeadLetterQueue (POP over the store's PopService)
    halves.py     EndTransaction and the check-back of half messages
    pulls.py      PullMessage, UpdateOffset, GetOffset, QueryOffset
    telemetry.py  Telemetry: Settings, an admin's questions (clientcommands.py), the renewer's streams
and what they share: calls.py (a call's client, status, pacing, a message as a client is given it), the
consumer clients table (consumers.py) and the producers' streams (producers.py). Every other RPC is answered gRPC
UNIMPLEMENTED (12) naming why (lite topics; docs/rocketmq5.md).

As RocketMQ's proxy does, business errors travel in-band: grpc-status 0 and the response's ``status`` holding an
``apache.rocketmq.v2.Code`` (``Refusal`` and ``calls.code_of``), authentication failures (``UNAUTHORIZED``)
included; Telemetry's are out of band (INVALID_ARGUMENT for the 4xxxx codes, INTERNAL otherwise).

Authentication (security.acl_file set): each call's ``authorization`` metadata (``MQv2-HMAC-SHA1``, reference in
``auth.proofs``) is checked through the broker's one login decision (``Guard.check_login``, then
``Guard.authenticated``, as the remoting port's signatures are), here, before any group sees the call.

The service is given what it uses, never the Broker: the store (partition counts, the topic table), the put path,
the guard, the broker's name, ``max_body_bytes``, a callable naming the port's endpoint, the cluster's brokers (a
callable), the transaction service and its check-back's settings, the POP service.
"""

import logging

import gevent

from metaq import errors
from metaq.rmq5 import limits as rmq5_limits
from metaq.auth import proofs
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.calls import delivered_now, status
from metaq.rmq5.consumers import ConsumerClients
from metaq.rmq5.halves import Halves
from metaq.rmq5.producers import ProducerStreams
from metaq.rmq5.receives import Receives
from metaq.rmq5.records import Refusal
from metaq.rmq5.routing import Routes
from metaq.rmq5.sends import Sends
from metaq.rmq5.telemetry import Telemetry
from metaq.rmq5.wire import WAITS, GrpcError, Status
from metaq.clock import now_ms

log = logging.getLogger(__name__)

#: Why the RPCs not served yet are not, as their UNIMPLEMENTED says.
LATER = {
    "SyncLiteSubscription": "lite topics are not served",
}

#: The RPCs answered with a stream of responses (their handler returns a list), and what follows a refusal's status,
#: as bytes (ReceiveMessage's: a delivery timestamp; PullMessage's: nothing, as the proxy's pull writer answers an
#: error).
STREAMING = {"ReceiveMessage": lambda: [delivered_now()], "PullMessage": lambda: []}


def _check_signed_date(date_time, now):
    """Refuse (UNAUTHORIZED) a signature whose ``x-mq-date-time`` is not within ``limits.GRPC_AUTH_MAX_SKEW_MS`` of
    ``now`` (ms), either way, or does not parse: the signature covers only that date, so without the bound a
    captured ``authorization`` header would sign calls for ever."""
    try:
        signed = proofs.mqv2_date_ms(date_time)
    except ValueError:
        raise Refusal("UNAUTHORIZED", "x-mq-date-time %r is not yyyyMMdd'T'HHmmss'Z'" % date_time[:40]) from None
    skew = rmq5_limits.GRPC_AUTH_MAX_SKEW_MS
    if abs(now - signed) > skew:
        raise Refusal("UNAUTHORIZED", "x-mq-date-time %s is %d s %s the broker's clock: a signature is accepted "
                      "within %d s of it (limits.GRPC_AUTH_MAX_SKEW_MS; sign each call when it is made, check the "
                      "client's clock)" % (date_time[:40], abs(now - signed) // 1000,
                                           "behind" if signed < now else "ahead of", skew // 1000))


class MessagingService:
    """The dispatcher (see the module doc). ``endpoint()``: ``(host, port)`` of the gRPC port as it listens."""

    def __init__(self, store, put_path, guard, broker_name, max_body, endpoint, broker_id=0, cluster=None, tx=None,
                 checks=None, pop=None, pulls=None, clients=None, renewer=None):
        """``cluster(topic)``: with ZooKeeper, the cluster's brokers now (``server.routes.ClusterView.brokers``:
        rows with ``broker_id``, ``name``, ``grpc`` (the master's endpoint) and ``queues``; None while ZooKeeper
        cannot be read); None: routes name this broker alone. ``broker_id``: ours, whose row this port answers
        from the store. ``tx``: the TxService, which keeps transactional messages' half messages (None:
        transactional sends refused NOT_IMPLEMENTED); ``checks``: its check-back's ``halves.Checks``; ``pop``: the
        PopService receives, acks, invisible durations and dead letters go to (None: refused NOT_IMPLEMENTED);
        ``pulls``: the ``pulls.PullService`` serving PullMessage and the offsets (None: those are unknown RPCs);
        ``clients``: the ``clientcommands.ClientCommands`` an admin asks clients through, told of Telemetry streams
        and their ThreadStackTrace / VerifyMessageResult answers (None: those are ignored); ``renewer``: the
        ``renewer.Renewer`` keeping ``auto_renew`` receives' messages invisible while their client lives, told of
        deliveries, acks, nacks, heartbeats, terminations and Telemetry streams (None: nothing is renewed)."""
        self.guard = guard
        self.renewer = renewer
        self.clients = clients
        self.endpoint = endpoint
        self.consumers = ConsumerClients(guard)
        self.producers = ProducerStreams(guard)
        self.routes = Routes(store, guard, broker_name, broker_id, endpoint, cluster, renewer, self.consumers)
        self.halves = Halves(tx, checks, put_path, endpoint, self.producers)
        self.sends = Sends(store, put_path, guard, broker_name, max_body, self.halves.send_half)
        self.receives = Receives(store, pop, guard, endpoint, renewer, self.consumers, self.routes.query_route)
        self.telemetry_commands = Telemetry(store, max_body, renewer, clients, self.consumers, self.producers)
        self.unary = {}
        for group in (self.routes, self.sends, self.receives, self.halves) + ((pulls,) if pulls is not None else ()):
            self.unary.update(group.rpcs())
        # the handlers of RPCs answered on the reader that would otherwise wait (``waits``: not, asked this way)
        self._now = {"AckMessage": self.receives.ack_message_now,
                     "ReceiveMessage": self.receives.receive_message_now}
        self._counts = {"calls": 0, "refused": 0}

    @property
    def counts(self):
        """The port's counts (``stats grpc``): calls, refused, sent, and the check-back's."""
        return dict(self._counts, **self.sends.counts, **self.halves.counts)

    def consumer_clients_held(self):
        """``{user: consumer clients whose Settings are kept}`` (``stats quotas``; None: no user)."""
        return self.consumers.held()

    def producer_topics_held(self):
        """``{user: topic names its producers' streams hold}`` (``stats quotas``; None: no user)."""
        return self.producers.held()

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

    def call(self, rpc, call, data, wait=True):
        """The serialized response of unary ``rpc`` to request bytes ``data`` (a list of them for a ``STREAMING``
        RPC: a refusal is its one status response and a delivery timestamp, the proxy's stream shape; a handler
        may give a response as its bytes already); GrpcError for a request that does not parse (INTERNAL, as grpc's
        servers answer a message they cannot deserialize). ``wait`` False: the caller cannot wait (the connection's
        reader); ``WAITS``, nothing done, when answering might (``waits``), for the caller to ask again where it
        can."""
        request_type, handler = self.unary[rpc]
        request = request_type()
        try:
            request.ParseFromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its relatives
            raise GrpcError(Status.INTERNAL,
                            "the %s request does not parse as %s" % (rpc, request_type.__name__)) from None
        if not wait:
            if self.waits(rpc, request):
                return WAITS
            handler = self._now.get(rpc, handler)
        self._counts["calls"] += 1
        try:
            if not call.metadata.get("x-mq-client-id"):
                raise Refusal("CLIENT_ID_REQUIRED", "x-mq-client-id is missing from the call's metadata")
            self.login(call)
            response = handler(request, call)
            if response is WAITS:  # tried on the reader, it would wait (``_now``'s handler): asked again, counted then
                self._counts["calls"] -= 1
                return WAITS
        except Refusal as exc:
            self._counts["refused"] += 1
            response_type = getattr(pb, request_type.__name__[:-len("Request")] + "Response")
            refused = response_type(status=status(exc.code, exc.message)).SerializeToString()
            if rpc in STREAMING:
                return [refused] + STREAMING[rpc]()
            return refused
        if rpc in STREAMING:  # a served message comes as its bytes already (messagebytes.py)
            return [r if type(r) is bytes else r.SerializeToString() for r in response]
        return response if type(response) is bytes else response.SerializeToString()

    def waits(self, rpc, request):
        """True when answering ``rpc``'s ``request`` may wait (sleep, block on an event, a pool thread or a peer):
        with authentication on every call may (a failed login's delay, the user's rates), else what the RPC's group
        says (``Sends.waits``: a send to a broker that acknowledges at once, without a transactional message, never
        waits; ``Receives.waits``: an AckMessage never does and a ReceiveMessage is tried, answered by ``_now``'s
        handler, which may still answer ``WAITS``); the other RPCs may."""
        guard = self.guard
        if guard is not None and guard.enabled:
            return True
        if rpc in self._now:
            return self.receives.waits(rpc, request)
        return self.sends.waits(rpc, request)

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

    def telemetry(self, call, data):
        """The serialized answer to one TelemetryCommand of the client's stream, or None (nothing to answer);
        GrpcError ends the stream (the proxy's out-of-band codes)."""
        command = pb.TelemetryCommand()
        try:
            command.ParseFromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError and its relatives
            raise GrpcError(Status.INTERNAL, "a TelemetryCommand that does not parse") from None
        try:
            self.login(call)
        except Refusal as exc:
            raise GrpcError(Status.INVALID_ARGUMENT, "%s: %s" % (exc.code, exc.message)) from None
        return self.telemetry_commands.command(call, command)

    def telemetry_closed(self, call):
        """``call``'s Telemetry stream ended (``telemetry.Telemetry.closed``)."""
        self.telemetry_commands.closed(call)

    def start(self):
        """Start the renewer and the check-back of gRPC half messages (with a transaction service)."""
        if self.renewer is not None:
            self.renewer.start()
        self.halves.start()

    def stop(self):
        """Stop the renewer and the check-back."""
        if self.renewer is not None:
            self.renewer.stop()
        self.halves.stop()
