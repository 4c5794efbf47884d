"""The RocketMQ request codes the remoting port serves: each declared once, with everything derived from it.

A served code is one ``RemotingRequest``: its code and RequestCode name, its header class (or None: the request
is its body alone), whether it must be signed (the name server's requests are not), what it needs of its user
(``needs``: a function of the request, decoded on demand, and a ``NeedsContext``, giving ``(action, kind, name)``
triples), the handler it is routed to (``"owner.method"``: the server resolves the owner among its handler
objects, so this module names no server code), whether that handler runs in a greenlet of its own (``spawn``),
and whether it is handed the user who signed the request (``takes_signer``). The remoting dispatcher builds its
route table from here and refuses to start when a declared code has no handler; the remoting ACL asks
``needs_of``; docs/rocketmq-codes.md and docs/rocketmq.md name these codes and ``BROKER_SENT`` (checked by the
registry's tests). A code not declared here is answered REQUEST_CODE_NOT_SUPPORTED, once its signature passes.

What a request needs follows RocketMQ 4.9's ``PlainAccessValidator.parse``: SEND_MESSAGE(_V2) topic PUB (a retry
topic: the group SUB); CONSUMER_SEND_MSG_BACK group SUB; PULL_MESSAGE topic SUB + group SUB; HEART_BEAT each
consumer group SUB + each subscribed topic SUB; UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP group SUB;
UPDATE_CONSUMER_OFFSET group SUB + topic SUB; ``ADMIN_CODES`` the admin flag; anything else a signature only.
Ours adds: SEND_BATCH_MESSAGE as a send (RocketMQ 5 does), QUERY_CONSUMER_OFFSET group + topic SUB (the text
``query_offset``), SEARCH_OFFSET_BY_TIMESTAMP / GET_MAX_OFFSET / GET_MIN_OFFSET / GET_EARLIEST_MSG_STORETIME topic
SUB (the text ``offset``), QUERY_MESSAGE topic SUB (the text ``lookup``), VIEW_MESSAGE_BY_ID SUB on the message's
topic, CONSUMER_SEND_MSG_BACK also SUB on the copied message's topic, END_TRANSACTION PUB on the half message's
topic, LOCK_BATCH_MQ / UNLOCK_BATCH_MQ the body's group SUB and SUB on each queue's topic, SEND_REPLY_MESSAGE(_V2)
PUB on the cluster's reply topic, as the text ``reply`` (RocketMQ: a signature only), CHECK_CLIENT_CONFIG the
body's group SUB and its subscription's topic SUB, as a heartbeat's (RocketMQ: a signature only). A retry topic is its
group's (``resource``), also where RocketMQ reads the group from another field (a send to ``%RETRY%g`` names its
group in the topic, so the topic decides).

Adding a served code is one ``register(RemotingRequest(...))`` below and its handler method on the owner named.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from metaq import errors
from metaq.auth import limits as auth_limits
from metaq.protocol.commands import ADMIN, PUBLISH as PUB, SUBSCRIBE as SUB
from metaq.protocol.journaltopic import RETRY_PREFIX
from metaq.protocol.rocketmq.bodies import decode_check_client, decode_heartbeat, decode_properties
from metaq.protocol.rocketmq.headers import (ConsumerGroupHeader, ConsumerSendMsgBackHeader, EndTransactionHeader,
                                             PullMessageHeader, QueryConsumerOffsetHeader, QueryMessageHeader,
                                             QueueHeader, RouteInfoHeader, SearchOffsetHeader, SendMessageHeader,
                                             UnregisterClientHeader, UpdateConsumerOffsetHeader, ViewMessageHeader,
                                             decode_header, decode_send_header)
from metaq.protocol.rocketmq.lockbodies import decode_lock_batch
from metaq.protocol.rocketmq.mapping import PROP_RETRY_TOPIC
from metaq.protocol.rocketmq.remoting import RequestCode as R

__all__ = ["ADMIN", "ADMIN_CODES", "BROKER_SENT", "PUB", "SENDS_WAIT", "SUB", "NeedsContext", "RemotingRequest",
           "by_code", "needs_of", "register", "resource", "table", "unsigned_codes"]

#: Request codes only an admin may send: RocketMQ's ``Permission.ADMIN_CODE`` (UPDATE_AND_CREATE_TOPIC 17,
#: UPDATE_BROKER_CONFIG 25, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP 200, DELETE_SUBSCRIPTIONGROUP 207,
#: DELETE_TOPIC_IN_BROKER 215) and the ACL configuration codes (UPDATE_AND_CREATE_ACL_CONFIG 50,
#: DELETE_ACL_CONFIG 51, GET_BROKER_CLUSTER_ACL_INFO 52, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG 53), which RocketMQ 4
#: leaves to any signed user. None is served: an admin gets REQUEST_CODE_NOT_SUPPORTED.
ADMIN_CODES = frozenset({17, 25, 200, 207, 215, 50, 51, 52, 53})

#: Requests the broker sends to its clients (never served): the check-back, the rebalance notice, a pushed reply.
BROKER_SENT = frozenset({R.CHECK_TRANSACTION_STATE, R.NOTIFY_CONSUMER_IDS_CHANGED, R.PUSH_REPLY_MESSAGE_TO_CLIENT})

#: ``spawn`` of a send: in a greenlet of its own when sends wait (a flush, or sync replication), else answered at once.
SENDS_WAIT = "sends"
_SPAWNS = (SENDS_WAIT, True, False)


class NeedsContext(NamedTuple):
    """What a request's needs may look up beyond the request: ``record_topic(offset)``, the topic of the stored
    message at a commit-log offset; ``half_topic(number)``, the topic of a waiting half message, or None;
    ``reply_topic``, the cluster's ``<cluster>_REPLY_TOPIC``."""

    record_topic: Optional[Callable] = None
    half_topic: Optional[Callable] = None
    reply_topic: Optional[str] = None


@dataclass(frozen=True)
class RemotingRequest:
    """One served request code (see the module doc)."""

    code: int
    name: str  # its RequestCode name
    header: Optional[type]  # a header class of ``headers`` (its decoder's), or None
    needs: Callable  # (Request, NeedsContext) -> iterable of (action, kind, name)
    handler: str  # "owner.method", resolved by the server against its handler objects
    spawn: object = False  # SENDS_WAIT, True (a greenlet of its own) or False (answered on the reader)
    signed: bool = True  # False: answered without a signature (RocketMQ 4's name server checks none)
    takes_signer: bool = False  # the handler is given ``signer=``, the user who signed the request

    def decode(self, cmd):
        """``cmd``'s header as this code's header class (RemoteProtocolError for a malformed one)."""
        if self.header is SendMessageHeader:
            return decode_send_header(cmd)
        return decode_header(self.header, cmd)


class Request:
    """A request as its needs read it: ``cmd``, ``code`` and ``header``, decoded on first use."""

    __slots__ = ("cmd", "declaration", "decoded")

    def __init__(self, cmd, declaration):
        self.cmd = cmd
        self.declaration = declaration
        self.decoded = None

    @property
    def code(self):
        return self.cmd.code

    @property
    def header(self):
        if self.decoded is None:
            self.decoded = self.declaration.decode(self.cmd)
        return self.decoded


_BY_CODE = {}


def register(request):
    """Add ``request``; raises TypeError for a declaration that misses a part, or takes a code twice."""
    r = request
    problems = []
    if not isinstance(r.code, int) or getattr(R, r.name, None) != r.code:
        problems.append("a code its RequestCode name gives")
    if r.code in ADMIN_CODES or r.code in BROKER_SENT:
        problems.append("a code neither an admin's nor the broker's own")
    if r.header is not None and r.header is not SendMessageHeader and not hasattr(r.header, "_fields"):
        problems.append("a header class (or None)")
    if not callable(r.needs):
        problems.append("what it needs of the user")
    owner, _, method = r.handler.partition(".")
    if not owner or not method.isidentifier():
        problems.append("a handler named owner.method")
    if r.spawn not in _SPAWNS or not isinstance(r.spawn, (str, bool)):
        problems.append("a spawn policy (%r, True or False)" % SENDS_WAIT)
    if problems:
        raise TypeError("remoting request %r is declared without %s" % (r.name, ", ".join(problems)))
    if r.code in _BY_CODE:
        raise TypeError("remoting request %s (%d) is declared twice" % (r.name, r.code))
    _BY_CODE[r.code] = r
    return r


def table():
    """``{code: RemotingRequest}`` of every served code."""
    return _BY_CODE


def by_code(code):
    """The declaration of ``code``, or None (not served)."""
    return _BY_CODE.get(code)


def unsigned_codes():
    """The codes answered without a signature."""
    return frozenset(code for code, r in _BY_CODE.items() if not r.signed)


# -- what a request needs ---------------------------------------------------------------------------------------


def resource(action, topic):
    """The permission a topic needs: ``(action, "topic", topic)``, or for a retry topic ``%RETRY%<group>``
    ``(SUB, "group", group)`` whatever the action (RocketMQ: ``getRetryTopic(group)`` with ``Permission.SUB``)."""
    if topic.startswith(RETRY_PREFIX):
        return (SUB, "group", topic[len(RETRY_PREFIX):])
    return (action, "topic", topic)


def copies_readable(guard, session, topic):
    """For a pull of a group's retry topic by ``session``'s user, not an admin: ``readable(origin)``, True for a copy
    of a topic (its RETRY_TOPIC property) that user may read, or one without it (sent there as it is, checked at its
    send). The group grants the pull (RocketMQ's rule), but the topic holds copies of every topic the group consumed,
    and the others are not served. None for any other pull (nothing to filter)."""
    if not topic.startswith(RETRY_PREFIX) or guard.is_admin(session):
        return None
    seen = {}

    def readable(origin):
        if not origin:
            return True
        if origin not in seen:
            seen[origin] = guard.allows(session, *resource(SUB, origin))
        return seen[origin]

    return readable


def _group(name):
    return (SUB, "group", name)


def _read_whole(topic):
    """What reading ``topic``'s messages by key or position needs (QUERY_MESSAGE, VIEW_MESSAGE_BY_ID): SUB on it;
    a group's retry topic is an admin's there (its copies of topics the user may not read are passed over only
    in a pull: the remoting ACL's ``copies_readable``)."""
    return (ADMIN, None, None) if topic.startswith(RETRY_PREFIX) else resource(SUB, topic)


def _nothing(r, ctx):
    return ()


def _send(r, ctx):
    h = r.header
    yield resource(PUB, h.topic)
    if h.topic.startswith(RETRY_PREFIX):
        yield from _retry_send(r.code, h)


def _retry_send(code, h):
    """A send to ``%RETRY%<group>`` (RocketMQ's consumer re-sending a failed message when its send-back failed)
    carries the topic it was read from in ``RETRY_TOPIC``, where a consumer of the group delivers it from and
    where ``dlq resend`` puts it back (the sender's own ``reconsumeTimes`` may send it straight to the dead
    letters): the sender must be allowed to publish to that topic, or it could plant a message there through an
    admin's resend. Without ``RETRY_TOPIC`` it is delivered, and resent, as a message of the retry topic itself.
    A batch there (which no RocketMQ client sends) is an admin's."""
    if code == R.SEND_BATCH_MESSAGE or h.batch:
        return [(ADMIN, None, None)]
    origin = decode_properties(h.properties).get(PROP_RETRY_TOPIC)
    return [resource(PUB, origin)] if origin else []


def _pull(r, ctx):
    h = r.header
    return resource(SUB, h.topic), _group(h.consumer_group)


def _group_and_topic(r, ctx):
    h = r.header
    return _group(h.consumer_group), resource(SUB, h.topic)


def _topic_sub(r, ctx):
    return (resource(SUB, r.header.topic),)


def _query_message(r, ctx):
    return (_read_whole(r.header.topic),)


def _view_message(r, ctx):
    return (_read_whole(ctx.record_topic(r.header.offset)),)


def _send_back(r, ctx):
    h = r.header
    return _group(h.group), resource(SUB, ctx.record_topic(h.offset))


def _end_transaction(r, ctx):
    topic = ctx.half_topic(r.header.tran_state_table_offset)
    return () if topic is None else (resource(PUB, topic),)  # none waiting: the handler says so


def _heartbeat(r, ctx):
    for consumer in decode_heartbeat(r.cmd.body, r.cmd.opaque).consumers:
        yield _group(consumer.group_name)
        for s in consumer.subscriptions:
            yield resource(SUB, s.topic)


def _check_client(r, ctx):
    body = decode_check_client(r.cmd.body, r.cmd.opaque)
    if body.group:
        yield _group(body.group)
    yield resource(SUB, body.subscription.topic)


def _unregister(r, ctx):
    group = r.header.consumer_group
    return (_group(group),) if group else ()  # a producer's unregister names no consumer group


def _consumer_group(r, ctx):
    return (_group(r.header.consumer_group),)


def _reply(r, ctx):
    return (resource(PUB, ctx.reply_topic),)


def _lock_batch(r, ctx):
    body = decode_lock_batch(r.cmd.body, r.cmd.opaque)
    yield _group(body.consumer_group)
    for mq in body.mq_set:
        yield resource(SUB, mq.topic)


_NO_CONTEXT = NeedsContext()


def needs_of(cmd, ctx=_NO_CONTEXT):
    """What ``cmd`` needs of its (already authenticated) user: a list of distinct ``(action, kind, name)`` in
    order; ``[(ADMIN, None, None)]`` for an admin code, ``[]`` for a code not served. Raises ClientError for a
    request that names more than ``limits.MAX_ACL_RESOURCES_PER_REQUEST`` resources (found as they are read, not
    after), and the decoders' RemoteProtocolError for a malformed one."""
    code = cmd.code
    if code in ADMIN_CODES:
        return [(ADMIN, None, None)]
    declaration = _BY_CODE.get(code)
    if declaration is None:
        return []
    found = {}
    for need in declaration.needs(Request(cmd, declaration), ctx):
        found[need] = None
        if len(found) > auth_limits.MAX_ACL_RESOURCES_PER_REQUEST:
            raise errors.ClientError("request code %d names more than %d topics and groups (the limit "
                                     "MAX_ACL_RESOURCES_PER_REQUEST)"
                                     % (code, auth_limits.MAX_ACL_RESOURCES_PER_REQUEST))
    return list(found)


# -- the served codes -------------------------------------------------------------------------------------------

# the name server's
register(RemotingRequest(R.GET_ROUTEINFO_BY_TOPIC, "GET_ROUTEINFO_BY_TOPIC", RouteInfoHeader, _nothing,
                         "dispatcher.route", signed=False))
register(RemotingRequest(R.GET_BROKER_CLUSTER_INFO, "GET_BROKER_CLUSTER_INFO", None, _nothing,
                         "dispatcher.cluster_info", signed=False))
# sends (and half messages), send-backs, transactions
register(RemotingRequest(R.SEND_MESSAGE, "SEND_MESSAGE", SendMessageHeader, _send, "sender.send", SENDS_WAIT))
register(RemotingRequest(R.SEND_MESSAGE_V2, "SEND_MESSAGE_V2", SendMessageHeader, _send, "sender.send", SENDS_WAIT))
register(RemotingRequest(R.SEND_BATCH_MESSAGE, "SEND_BATCH_MESSAGE", SendMessageHeader, _send, "sender.send",
                         SENDS_WAIT))
register(RemotingRequest(R.CONSUMER_SEND_MSG_BACK, "CONSUMER_SEND_MSG_BACK", ConsumerSendMsgBackHeader, _send_back,
                         "sender.send_back", SENDS_WAIT))
register(RemotingRequest(R.END_TRANSACTION, "END_TRANSACTION", EndTransactionHeader, _end_transaction,
                         "sender.end_transaction", True))
# pulls, offsets, look-ups
register(RemotingRequest(R.PULL_MESSAGE, "PULL_MESSAGE", PullMessageHeader, _pull, "dispatcher.pull", True,
                         takes_signer=True))  # a group's retry topic is filtered as its signer
register(RemotingRequest(R.QUERY_CONSUMER_OFFSET, "QUERY_CONSUMER_OFFSET", QueryConsumerOffsetHeader,
                         _group_and_topic, "dispatcher.query_offset"))
register(RemotingRequest(R.UPDATE_CONSUMER_OFFSET, "UPDATE_CONSUMER_OFFSET", UpdateConsumerOffsetHeader,
                         _group_and_topic, "dispatcher.update_offset"))
register(RemotingRequest(R.SEARCH_OFFSET_BY_TIMESTAMP, "SEARCH_OFFSET_BY_TIMESTAMP", SearchOffsetHeader, _topic_sub,
                         "dispatcher.search_offset"))
register(RemotingRequest(R.GET_MAX_OFFSET, "GET_MAX_OFFSET", QueueHeader, _topic_sub, "dispatcher.max_offset"))
register(RemotingRequest(R.GET_MIN_OFFSET, "GET_MIN_OFFSET", QueueHeader, _topic_sub, "dispatcher.min_offset"))
register(RemotingRequest(R.GET_EARLIEST_MSG_STORETIME, "GET_EARLIEST_MSG_STORETIME", QueueHeader, _topic_sub,
                         "dispatcher.earliest_time"))
register(RemotingRequest(R.VIEW_MESSAGE_BY_ID, "VIEW_MESSAGE_BY_ID", ViewMessageHeader, _view_message,
                         "dispatcher.view_message"))
register(RemotingRequest(R.QUERY_MESSAGE, "QUERY_MESSAGE", QueryMessageHeader, _query_message,
                         "dispatcher.query_message", True))
# clients: membership, orderly consumers' locks
register(RemotingRequest(R.HEART_BEAT, "HEART_BEAT", None, _heartbeat, "dispatcher.heartbeat"))
register(RemotingRequest(R.CHECK_CLIENT_CONFIG, "CHECK_CLIENT_CONFIG", None, _check_client,
                         "dispatcher.check_client_config"))
register(RemotingRequest(R.UNREGISTER_CLIENT, "UNREGISTER_CLIENT", UnregisterClientHeader, _unregister,
                         "dispatcher.unregister"))
register(RemotingRequest(R.GET_CONSUMER_LIST_BY_GROUP, "GET_CONSUMER_LIST_BY_GROUP", ConsumerGroupHeader,
                         _consumer_group, "dispatcher.consumer_list"))
register(RemotingRequest(R.LOCK_BATCH_MQ, "LOCK_BATCH_MQ", None, _lock_batch, "dispatcher.lock_batch"))
register(RemotingRequest(R.UNLOCK_BATCH_MQ, "UNLOCK_BATCH_MQ", None, _lock_batch, "dispatcher.unlock_batch"))
# request-reply: served when the broker routes replies (its owner given)
register(RemotingRequest(R.SEND_REPLY_MESSAGE, "SEND_REPLY_MESSAGE", SendMessageHeader, _reply, "replies.send_reply",
                         True))
register(RemotingRequest(R.SEND_REPLY_MESSAGE_V2, "SEND_REPLY_MESSAGE_V2", SendMessageHeader, _reply,
                         "replies.send_reply", True))
