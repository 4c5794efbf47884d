"""The JSON bodies of LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42), RocketMQ's orderly-consumer locks.

Request (both codes; Java ``LockBatchRequestBody`` / ``UnlockBatchRequestBody``)::

    {"consumerGroup": "CG", "clientId": "10.0.0.5@1234", "onlyThisBroker": false,
     "mqSet": [{"topic": "orders", "brokerName": "metaq-7", "queueId": 2}, ...]}

The C++ client leaves ``mqSet`` out when it is empty and never sends ``onlyThisBroker``.
Response of 41: ``{"lockOKMQSet": [...]}``, the queues the client now holds; 42 answers with no body.

Decoding is strict (a real client sends exactly this): a body that is not such an object, an entry
without a text topic and broker name and an int32 queue id, or more than
``limits.MAX_LOCK_BATCH_QUEUES`` entries raises ``RemoteProtocolError`` (not fatal: the frame was
whole), and nothing of the request is applied.
"""

import json
from typing import NamedTuple

from metaq.server.remoting import limits as remoting_limits
from metaq.errors import RemoteProtocolError

__all__ = ["MessageQueue", "LockBatchBody", "decode_lock_batch", "encode_lock_batch", "encode_lock_ok"]


class MessageQueue(NamedTuple):
    topic: str
    broker_name: str
    queue_id: int

    def to_json(self):
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


class LockBatchBody(NamedTuple):
    consumer_group: str
    client_id: str
    mq_set: tuple = ()  # MessageQueue, as sent (duplicates included)
    only_this_broker: bool = False


def _text(obj, key, what, opaque):
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise RemoteProtocolError("%s: %s must be a non-empty string" % (what, key), opaque, False)
    return value


def decode_lock_batch(data, opaque=0, what="lock batch body"):
    """A ``LockBatchBody`` from a 41/42 request body; RemoteProtocolError(opaque) when malformed or too long."""
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise RemoteProtocolError("%s is not JSON: %s" % (what, exc), opaque, False) from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError("%s is not a JSON object" % what, opaque, False)
    group = _text(obj, "consumerGroup", what, opaque)
    client_id = _text(obj, "clientId", what, opaque)
    entries = obj.get("mqSet", [])
    if not isinstance(entries, list):
        raise RemoteProtocolError("%s: mqSet must be a list" % what, opaque, False)
    if len(entries) > remoting_limits.MAX_LOCK_BATCH_QUEUES:
        raise RemoteProtocolError("%s names %d queues: the limit is %d (MAX_LOCK_BATCH_QUEUES)"
                                  % (what, len(entries), remoting_limits.MAX_LOCK_BATCH_QUEUES), opaque, False)
    queues = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise RemoteProtocolError("%s: every mqSet entry must be an object" % what, opaque, False)
        queue_id = entry.get("queueId")
        if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not -2**31 <= queue_id < 2**31:
            raise RemoteProtocolError("%s: queueId must be an int32, got %r" % (what, queue_id), opaque, False)
        queues.append(MessageQueue(_text(entry, "topic", what, opaque), _text(entry, "brokerName", what, opaque),
                                   queue_id))
    return LockBatchBody(group, client_id, tuple(queues), obj.get("onlyThisBroker") is True)


def encode_lock_batch(body):
    """The request body (for our own client and tests), with ``mqSet`` always present."""
    return json.dumps({"clientId": body.client_id, "consumerGroup": body.consumer_group,
                       "mqSet": [mq.to_json() for mq in body.mq_set], "onlyThisBroker": body.only_this_broker},
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_lock_ok(queues):
    """LOCK_BATCH_MQ's response body: ``{"lockOKMQSet": [...]}`` (MessageQueue items)."""
    return json.dumps({"lockOKMQSet": [mq.to_json() for mq in queues]}, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")
