"""Request-reply (RocketMQ's RIP-16), the pure part: property names, what a request and a reply carry, how they
are read from and added to a MetaQ message (sans-IO; docs/messaging.md "Request-reply").

A *request* is an ordinary message that carries ``CORRELATION_ID`` (unique per request) and ``REPLY_TO_CLIENT``
(who waits for the reply), and ``TTL`` (how long, in ms); the broker adds ``CLUSTER`` (its
``remoting.cluster``). A *reply* carries the request's ``CORRELATION_ID``, ``REPLY_TO_CLIENT`` and ``TTL``,
``MSG_TYPE=reply`` and its topic is ``<cluster>_REPLY_TOPIC`` (RocketMQ's ``MessageUtil.createReplyMessage``).
A replier whose handler failed says so in ``METAQ_REPLY_ERROR`` (ours): the requester gets an error at once
instead of waiting for its timeout.

Over the text protocol (``request`` / ``reply``, ``metaq.protocol.text``) the broker makes the correlation id
and names the requester ``metaq-text@<broker>/<connection id>``; over remoting the requester makes both (its
client id, as its heartbeats name it). Properties travel in a MetaQ message's attribute after ``\\x02``
(``rocketmq.mapping``), so either kind of client reads them.
"""

from metaq import limits
from metaq.reqreply import limits as reqreply_limits
from metaq.errors import ClientError, RemoteProtocolError
from metaq.protocol.message import ATTRIBUTE_FLAG, decode_payload, encode_payload
from metaq.protocol.properties import encode_attribute, split_attribute

__all__ = [
    "CORRELATION_ID",
    "REPLY_TO_CLIENT",
    "TTL",
    "MSG_TYPE",
    "REPLY_TYPE",
    "CLUSTER",
    "PUSH_REPLY_TIME",
    "REPLY_ERROR",
    "TEXT_REQUESTER",
    "reply_topic",
    "is_request",
    "request_properties",
    "reply_properties",
    "routing",
    "reply_error",
    "properties_of",
    "with_properties",
]

CORRELATION_ID = "CORRELATION_ID"
REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
TTL = "TTL"
MSG_TYPE = "MSG_TYPE"
REPLY_TYPE = "reply"
CLUSTER = "CLUSTER"
PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
#: Ours: the reply of a handler that raised; its value says what was raised (at most MAX_REPLY_ERROR_BYTES).
REPLY_ERROR = "METAQ_REPLY_ERROR"
#: How ``REPLY_TO_CLIENT`` of a text-protocol requester starts (``metaq-text@<broker id>/<connection id>``).
TEXT_REQUESTER = "metaq-text@"
_REPLY_TOPIC_SUFFIX = "_REPLY_TOPIC"


def reply_topic(cluster):
    """RocketMQ's reply topic of ``cluster`` (``MixAll.getReplyTopic``)."""
    return cluster + _REPLY_TOPIC_SUFFIX


def is_request(properties):
    """Whether a message with these properties waits for a reply (it names a correlation id and a requester)."""
    return bool(properties.get(CORRELATION_ID)) and bool(properties.get(REPLY_TO_CLIENT))


def request_properties(correlation_id, reply_to, ttl_ms, cluster):
    """What a request carries (the broker's ``CLUSTER`` included)."""
    return {CORRELATION_ID: correlation_id, REPLY_TO_CLIENT: reply_to, TTL: str(int(ttl_ms)), CLUSTER: cluster}


def reply_properties(request, error=None):
    """The properties of the reply to a request with properties ``request`` (``createReplyMessage``), with
    ``REPLY_ERROR`` when ``error`` (text: what the handler raised, cut to ``limits.MAX_REPLY_ERROR_BYTES`` and
    rid of the property separators) is given. ClientError when ``request`` is not a request."""
    if not is_request(request):
        raise ClientError("the message is not a request: it has no %s and %s" % (CORRELATION_ID, REPLY_TO_CLIENT))
    props = {MSG_TYPE: REPLY_TYPE, CORRELATION_ID: request[CORRELATION_ID],
             REPLY_TO_CLIENT: request[REPLY_TO_CLIENT]}
    if request.get(TTL):
        props[TTL] = request[TTL]
    if error is not None:
        props[REPLY_ERROR] = _error_text(error)
    return props


def _error_text(error):
    text = str(error).replace("\x01", " ").replace("\x02", " ") or "error"
    data = text.encode("utf-8")
    if len(data) > reqreply_limits.MAX_REPLY_ERROR_BYTES:
        text = data[:reqreply_limits.MAX_REPLY_ERROR_BYTES].decode("utf-8", "ignore")
    return text


def routing(properties):
    """``(correlation id, reply-to client)`` of a reply; ClientError when either is missing or too long."""
    cid, to = properties.get(CORRELATION_ID), properties.get(REPLY_TO_CLIENT)
    if not cid or not to:
        raise ClientError("a reply must carry the request's %s and %s properties" % (CORRELATION_ID, REPLY_TO_CLIENT))
    for name, value in ((CORRELATION_ID, cid), (REPLY_TO_CLIENT, to)):
        if len(value.encode("utf-8")) > limits.MAX_NAME_BYTES:
            raise ClientError("a reply's %s may hold at most %d bytes" % (name, limits.MAX_NAME_BYTES))
    return cid, to


def reply_error(properties):
    """The error a reply carries (its handler raised), or None for a reply that succeeded."""
    return properties.get(REPLY_ERROR)


def properties_of(flag, data):
    """``(tags, properties)`` of a MetaQ message's ``flag`` and ``data`` (``{}`` without any)."""
    attribute, _payload = decode_payload(flag, data)
    tags, props, _from_remoting = split_attribute(attribute)
    return tags, props


def with_properties(flag, data, extra):
    """``(flag, data)`` of the message with ``extra`` added to its properties (replacing those of the same names);
    the flag's other bits are kept. RemoteProtocolError for a malformed attribute block or a value that cannot be
    a property."""
    attribute, payload = decode_payload(flag, data)
    tags, props, _from_remoting = split_attribute(attribute)
    props.update(extra)
    try:
        new_attribute = encode_attribute(tags, props)
    except ValueError as exc:
        raise RemoteProtocolError(str(exc)) from None
    _flag, new_data = encode_payload(payload, new_attribute)
    return flag | ATTRIBUTE_FLAG, new_data
