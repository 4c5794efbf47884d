"""Request-reply in the metaq client (docs/messaging.md "Request-reply"): ``Producer.request`` sends a message and
waits for its reply; ``Consumer.subscribe(topic, handler, reply=True)`` sends what the handler returns back as the
reply.

The requester sends the text protocol's ``request`` (``metaq.protocol.events.Request``) to the broker of the
partition its selector picks; the broker stores the message with a correlation id and answers with the reply
itself (or 504 after the timeout). The replier's consumer answers a request message (one that carries
``CORRELATION_ID`` and ``REPLY_TO_CLIENT``, whether a metaq requester or a RocketMQ one sent it) with the
text protocol's ``reply`` to the broker the message came from. A handler that raises is answered with an
error reply (``METAQ_REPLY_ERROR`` = the exception's type and text): the requester gets ``errors.ReplyError``
at once. Either way the request counts as consumed: it is not retried, since its requester has its answer.
"""

import logging

from metaq import errors
from metaq.client.message import Message
from metaq.client.replies import reply_error
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import iter_records
from metaq.reqreply.records import REPLY_ERROR, is_request, reply_properties

__all__ = ["request", "replying", "reply_message"]

log = logging.getLogger(__name__)

#: How much longer than the request's own timeout the client waits for the broker's answer (504 or the reply).
ANSWER_MARGIN_S = 5.0
#: How long a replier waits for the broker to take its reply.
REPLY_TIMEOUT_S = 10.0


def request(producer, message, timeout):
    """``Producer.request``: the reply ``Message``. Raises ``errors.NoReply`` (no reply within ``timeout`` s),
    ``errors.ReplyError`` (the replier's handler raised), ``errors.ConnectionLost`` and the other broker errors
    (``metaq.client.replies``); ValueError / TypeError for a message that cannot be a request."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError("timeout must be a number of seconds > 0, got %r" % (timeout,))
    if producer.current_transaction() is not None:
        raise ValueError("a request cannot be part of a transaction: send it outside transaction()")
    if getattr(message, "delay_level", 0) or getattr(message, "when", None):
        raise ValueError("a request cannot be delayed (delay_level %d, when %s)" % (message.delay_level, message.when))
    producer.make_put(message)  # validates the topic and the size
    flag, data = message.encode()
    partition = producer.choose_partition(message)
    conn = producer.broker_connection(partition.broker_id) if partition is not None else None
    if conn is None:
        raise errors.UnknownTopic("no broker has a partition of topic %s" % message.topic)
    timeout_ms = max(1, int(timeout * 1000))
    event = ev.Request(message.topic, partition.partition, flag, data, 0, metaq_checksum(data), timeout_ms)
    answer = conn.call(event, timeout=timeout + ANSWER_MARGIN_S)
    if not isinstance(answer, ev.Value):
        raise reply_error(answer)
    records = [rec for rec, _end in iter_records(answer.body)]
    if len(records) != 1:
        raise errors.BrokerError("the answer to a request holds %d records, not one" % len(records))
    reply = Message.from_record(message.topic, partition, None, records[0])
    reply.id = None
    failure = reply.properties.get(REPLY_ERROR)
    if failure is not None:
        raise errors.ReplyError(failure)
    return reply


def reply_message(request_message, result=None, error=None):
    """``(flag, data)`` of the reply to ``request_message``: ``result`` (bytes, a ``Message`` whose body,
    attribute and properties are taken, or None for an empty body), or an error reply saying ``error``."""
    attribute, props = None, {}
    if isinstance(result, Message):
        body, attribute, props = result.body, result.attribute, dict(result.properties)
    elif result is None:
        body = b""
    elif isinstance(result, (bytes, bytearray, memoryview)):
        body = bytes(result)
    else:
        raise TypeError("a reply handler returns bytes, a Message or None, not %s" % type(result).__name__)
    props.update(reply_properties(request_message.properties, error))
    return Message("reply", body, attribute, properties=props).encode()


def replying(handler, connection_of, timeout=REPLY_TIMEOUT_S):
    """A handler for ``Consumer.subscribe(..., reply=True)``: ``handler``'s result (or what it raised) is sent
    back as the reply of each request message; other messages go to ``handler`` as they would without
    ``reply=True``. ``connection_of(broker_id)``: the consumer's connection to that broker's master. A reply
    the broker cannot take now (unreachable, busy) raises, so the consumer tries the message again; a reply
    nobody waits for any more (404) is logged and dropped."""

    def handle(message):
        if not is_request(message.properties):
            return handler(message)
        try:
            flag, data = reply_message(message, handler(message))
        except Exception as exc:  # noqa: BLE001 - a failed handler is answered, not retried
            log.info("reply handler failed on %s: %r; the requester gets an error reply", message, exc)
            flag, data = reply_message(message, None, "%s: %s" % (type(exc).__name__, exc))
        conn = connection_of(message.partition.broker_id)
        if conn is None:
            raise errors.Unavailable("broker %d of the request is not known" % message.partition.broker_id)
        answer = conn.call(ev.Reply(flag, data, 0, metaq_checksum(data)), timeout=timeout)
        if isinstance(answer, ev.Result) and answer.code == 200:
            return None
        error = reply_error(answer)
        if isinstance(error, errors.NotFound):
            log.info("reply to %s dropped: %s", message, error)
            return None
        raise error

    return handle
