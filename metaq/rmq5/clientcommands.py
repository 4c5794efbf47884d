"""An admin's questions to a connected RocketMQ 5 client, on its Telemetry stream (docs/rocketmq5.md "Asking a
connected client").

RocketMQ's proxy relays two operator requests to a gRPC client this way: the admin's GET_CONSUMER_RUNNING_INFO
becomes a ``PrintThreadStackTraceCommand{nonce}``, answered by ``ThreadStackTrace{nonce, thread_stack_trace}``;
CONSUME_MESSAGE_DIRECTLY becomes a ``VerifyMessageCommand{nonce, message}``, answered by
``VerifyMessageResult{nonce}`` whose TelemetryCommand's ``status`` says the outcome, read as the proxy reads it
(``CONSUME_RESULTS``: OK is CR_SUCCESS, FAILED_TO_CONSUME_MESSAGE CR_LATER, MESSAGE_CORRUPTED CR_RETURN_NULL, any
other code no result). Here the admin's side is the text command
``client_command`` (``admin/wire.py``, the admin permission), ``metaq-admin clients stack|verify``.

``ClientCommands`` keeps each client's open Telemetry stream by its ``x-mq-client-id`` and, with authentication on,
the user it signed in as (``calls.client_of``; the stream it last spoke on): clients of two users may share an id.
The admin names a client by its id; when clients of more than one user have it, the question is refused (400, naming
the users) and the admin names one as ``user/id``. It keeps the questions awaiting an answer by nonce: at most
``max_pending`` (``limits.GRPC_MAX_PENDING_CLIENT_COMMANDS``; one more refused 503), each waiting at most its
timeout (504 past it, the entry dropped), each dropped with a 503 when its stream ends first. An answer whose nonce
names no question of that stream is ignored, as the proxy ignores a late one. It is given what it uses: how a stored
message is found (``StoredMessages``) and the dispatcher's error mapping.
"""

import logging
import uuid
from typing import NamedTuple

import gevent
from gevent.event import AsyncResult

from metaq import errors, limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.admin import wire as adminwire
from metaq.protocol.rocketmq.mapping import message_of_record
from metaq.protocol.text import encode_result
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.calls import ClientKey, message_of
from metaq.loop.coldpages import walk

log = logging.getLogger(__name__)

#: The answer each question waits for: the TelemetryCommand's oneof field.
ANSWERS = {"stack": "thread_stack_trace", "verify": "verify_message_result"}
_ALL_TIME = (0, 2**63 - 1)
#: A VerifyMessageResult's status as the proxy's ConsumeMessageDirectlyResult reads it (other codes: no result).
CONSUME_RESULTS = {pb.OK: "CR_SUCCESS", pb.FAILED_TO_CONSUME_MESSAGE: "CR_LATER",
                   pb.MESSAGE_CORRUPTED: "CR_RETURN_NULL"}


class Pending(NamedTuple):
    """A question sent on ``call``'s stream, answered through ``result``: ``(status, answer message)``."""

    call: object
    kind: str
    result: AsyncResult


class StoredMessages:
    """A message of a topic by its client's message id (``UNIQ_KEY``, found by the key index), as a gRPC client is
    given it (``calls.message_of``). ``endpoint()``: the gRPC port's ``(host, port)``."""

    def __init__(self, store, endpoint, max_transfer):
        self.store, self.endpoint, self.max_transfer = store, endpoint, max_transfer

    def find(self, topic, message_id):
        """The ``pb.Message`` stored in ``topic`` with ``message_id``; NotFound otherwise."""
        limits.validate_topic(topic)
        try:
            self.store.partitions_of(topic)
        except errors.UnknownTopic:
            raise errors.NotFound("no topic %s on this broker" % topic) from None
        records = walk(self.store.key_search(topic, message_id, _ALL_TIME[0], _ALL_TIME[1], 1)).page().records
        if not records:
            raise errors.NotFound("no message %s in topic %s on this broker" % (message_id, topic))
        rec = records[0]
        host = self.endpoint()
        m = message_of(message_of_record(rec, host), host, self.max_transfer, rec.msg_id)
        m.topic.name = topic
        return m


class ClientCommands:
    """The streams and the questions (see the module doc). ``find(topic, message_id) -> pb.Message``."""

    def __init__(self, find, max_pending=rmq5_limits.GRPC_MAX_PENDING_CLIENT_COMMANDS):
        self.find = find
        self.max_pending = max_pending
        self.streams = {}  # client id -> {user ("" with authentication off): its Telemetry call (the last spoken on)}
        self.pending = {}  # nonce -> Pending
        self.counts = {"asked": 0, "answered": 0, "timed_out": 0, "refused_full": 0, "unmatched": 0}

    # -- what the Telemetry stream tells ---------------------------------------------------------------------------

    def stream_seen(self, client, call):
        """``call`` (a Telemetry stream) of ``client`` (``calls.ClientKey``) spoke: that client is asked there."""
        if client.id and call.push is not None:
            self.streams.setdefault(client.id, {})[client.user] = call

    def stream_closed(self, client, call):
        """``call`` of ``client`` ended: it is no longer reachable there, its unanswered questions end (503)."""
        users = self.streams.get(client.id)
        if users is not None and users.get(client.user) is call:
            del users[client.user]
            if not users:
                del self.streams[client.id]
        for nonce, p in list(self.pending.items()):
            if p.call is call:
                del self.pending[nonce]
                p.result.set_exception(errors.Unavailable(
                    "client %s's Telemetry stream ended before it answered" % (client,)))

    def answer(self, call, command):
        """A ThreadStackTrace or VerifyMessageResult on ``call``: the question of its nonce is answered."""
        which = command.WhichOneof("command")
        nonce = getattr(command, which).nonce
        p = self.pending.get(nonce)
        if p is None or p.call is not call or ANSWERS[p.kind] != which:
            self.counts["unmatched"] += 1
            log.info("grpc %s: a %s whose nonce %r names no question of this stream; ignored", call.peer, which,
                     nonce[:64])
            return
        del self.pending[nonce]
        self.counts["answered"] += 1
        p.result.set((command.status, getattr(command, which)))

    # -- the admin's side ------------------------------------------------------------------------------------------

    def lookup(self, name):
        """The ``(ClientKey, call)`` an admin's ``name`` means: a client id (of one user only), or ``user/id``.
        NotFound: no such client here; ClientError (400): clients of several users have that id (the users named)."""
        users = self.streams.get(name)
        if users and len(users) > 1:
            raise errors.ClientError("gRPC clients of users %s have the id %s on this broker: name one as user/id "
                                  "(e.g. %s/%s)" % (", ".join(sorted(users)), name, sorted(users)[0], name))
        if users:
            [(user, call)] = users.items()
            return ClientKey(user, name), call
        for i, c in enumerate(name):  # user/id: a user name may hold a "/" too, so each split is tried
            if c == "/" and name[:i] and name[i + 1:] in self.streams:
                call = self.streams[name[i + 1:]].get(name[:i])
                if call is not None:
                    return ClientKey(name[:i], name[i + 1:]), call
        raise errors.NotFound("no gRPC client %s has a Telemetry stream open on this broker" % name)

    def ask(self, kind, name, topic=None, message_id=None, timeout_s=rmq5_limits.GRPC_CLIENT_COMMAND_TIMEOUT_MS / 1000):
        """Ask the client ``name`` (``lookup``) (``stack`` or ``verify``) and wait for its answer: the reply body's
        dict. NotFound (no such client here, no such message), ClientError (an id of several users' clients),
        Unavailable (``max_pending`` questions waiting; the stream ended), ClientNoAnswer (nothing within
        ``timeout_s``)."""
        client, call = self.lookup(name)
        if len(self.pending) >= self.max_pending:
            self.counts["refused_full"] += 1
            raise errors.Unavailable("%d questions to clients are awaiting answers already "
                                     "(limits.GRPC_MAX_PENDING_CLIENT_COMMANDS); try again later" % self.max_pending)
        nonce = uuid.uuid4().hex
        if kind == "stack":
            command = pb.TelemetryCommand(print_thread_stack_trace_command=pb.PrintThreadStackTraceCommand(nonce=nonce))
        else:
            command = pb.TelemetryCommand(verify_message_command=pb.VerifyMessageCommand(
                nonce=nonce, message=self.find(topic, message_id)))
        p = self.pending[nonce] = Pending(call, kind, AsyncResult())
        self.counts["asked"] += 1
        try:
            if not call.push(command.SerializeToString()):
                raise errors.Unavailable("client %s's Telemetry stream ended before it was asked" % (client,))
            answered = p.result.get(timeout=timeout_s)
        except gevent.Timeout:
            self.counts["timed_out"] += 1
            raise errors.ClientNoAnswer("client %s gave no answer within %.3f s" % (client, timeout_s)) from None
        finally:
            self.pending.pop(nonce, None)
        return _body(kind, client, topic, message_id, *answered)

    def text(self, error_reply):
        """The text port's ``client_command`` handler (``admin/wire.py``; the admin permission is the
        dispatcher's): answered from a greenlet of its own, as it waits for the client."""
        def handle(e, conn):
            conn.spawn(self._text, e, error_reply)
            return None, 0
        return handle

    def _text(self, e, error_reply):
        try:
            body = self.ask(e.kind, e.client, e.topic, e.message_id, e.timeout_ms / 1000.0)
        except errors.MetaqError as exc:
            return error_reply(exc, e.opaque)
        return encode_result(200, adminwire.encode_body(body), e.opaque)


def _body(kind, client, topic, message_id, status, answer):
    """The reply body of an answered question: the client (its id; ``user`` with authentication on), its status,
    and what it answered (a verify's ``result``
    read as the proxy reads it, ``CONSUME_RESULTS``; ``remark`` the client's status message)."""
    code = pb.Code.Name(status.code) if status.code in pb.Code.values() else str(status.code)
    body = {"client": client.id, "kind": kind, "status": code, "message": status.message}
    if client.user:
        body["user"] = client.user
    if kind == "stack":
        body["thread_stack_trace"] = answer.thread_stack_trace
    else:
        body.update(topic=topic, message_id=message_id, result=CONSUME_RESULTS.get(status.code),
                    remark=status.message)
    return body
