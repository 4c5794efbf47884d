"""A RocketMQ 5 message (``apache.rocketmq.v2.Message``) checked and laid out as a metaq record, sans-IO.

The record is the one a RocketMQ 4 send over remoting makes (``protocol.rocketmq.mapping.record_data_from_send``):
the body as the payload, the tag first in the attribute, then RocketMQ's properties, so a text ``get``, a remoting
pull and the key index see a gRPC send as they see any other: ``TAGS`` (the tag), ``KEYS`` (the keys, joined by
spaces), ``UNIQ_KEY`` (the client's message id), ``__SHARDINGKEY`` (the FIFO message group, RocketMQ's name for it),
``TIMER_DELIVER_MS`` (a delivery time, served by metaq's timers as a remoting send's is) and the user's properties.

``check_message`` makes the checks RocketMQ's proxy makes before a send (its defaults; docs/rocketmq5.md) and raises
``Refusal`` with the in-band ``Code`` name the proxy answers with.
"""

import base64
import binascii
from typing import NamedTuple, Optional

from metaq.protocol.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY

#: RocketMQ's property of a FIFO message's group (MessageConst.PROPERTY_SHARDING_KEY).
PROP_SHARDING_KEY = "__SHARDINGKEY"
#: RocketMQ 5's property of a message's absolute delivery time, in ms (the timers' TIMER_PROPERTIES).
PROP_DELIVER_MS = "TIMER_DELIVER_MS"

#: User property names the proxy refuses (RocketMQ's own, MessageConst.STRING_HASH_SET): a user property may not
#: pose as one.
RESERVED_PROPERTIES = frozenset({
    "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG",
    "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK",
    "POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
    "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER",
    "MSG_TYPE", "__SHARDINGKEY", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS",
    "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "__STARTDELIVERTIME", "INNER_NUM", "INNER_BASE", "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET",
    "__RMQ.TRANSIENT.TRACE_CONTEXT", "TRACE_CONTEXT", "__RMQ.TRANSIENT.LITE_TOPIC",
})
#: The proxy's bounds (its defaults): user properties per message, and the bytes of properties, tag and keys.
MAX_USER_PROPERTIES = 128
MAX_PROPERTY_BYTES = 16 * 1024
#: A message group is shorter than this many UTF-8 bytes.
MAX_GROUP_BYTES = 64

# the enum values of apache.rocketmq.v2.MessageType and Encoding (the generated module is not needed to read them)
NORMAL, FIFO, DELAY, TRANSACTION = 1, 2, 3, 4
GZIP = 2


class Refusal(Exception):
    """A message the proxy would refuse: ``code`` names its in-band ``apache.rocketmq.v2.Code``."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class Checked(NamedTuple):
    """What a send needs of one message once checked: its properties as stored, the FIFO group (or None), the
    delivery time asked for (epoch ms, or None) and the message type it is sent as."""

    properties: dict
    group: Optional[str]
    deliver_ms: Optional[int]
    message_type: int


def _has_control(text):
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def _blank(text):
    return not text or not text.strip()


def check_message(topic, tag, keys, message_id, group, deliver_ms, user_properties, message_type=0):
    """Check one message's system and user properties (as the proxy does) and lay out the properties it is
    stored with; raise ``Refusal``. ``tag`` and ``group``: None when absent; ``deliver_ms``: the delivery
    timestamp in epoch ms, or None. The delivery time's range is the timers' to check (``timers.records``)."""
    _check_system_properties(tag, keys, message_id, group)
    _check_user_properties(tag, keys, user_properties)
    _check_type(message_type, deliver_ms, group)
    props = dict(user_properties)
    if tag is not None:
        props[PROP_TAGS] = tag
    if keys:
        props[PROP_KEYS] = " ".join(keys)
    props[PROP_UNIQ_KEY] = message_id
    if group is not None:
        props[PROP_SHARDING_KEY] = group
    if deliver_ms is not None:
        props[PROP_DELIVER_MS] = str(deliver_ms)
    kind = TRANSACTION if message_type == TRANSACTION else DELAY if deliver_ms is not None else \
        FIFO if group is not None else NORMAL
    return Checked(props, group, deliver_ms, kind)


def _check_system_properties(tag, keys, message_id, group):
    """Refuses a blank message id, and a tag, key or message group that is blank or holds control characters
    (a tag no ``|`` either, a group under ``MAX_GROUP_BYTES``)."""
    if _blank(message_id):
        raise Refusal("ILLEGAL_MESSAGE_ID", "a message without a message_id")
    if tag is not None and (_blank(tag) or "|" in tag or _has_control(tag)):
        raise Refusal("ILLEGAL_MESSAGE_TAG", "tag %r: not blank, no '|' and no control characters" % tag[:64])
    for key in keys:
        if _blank(key) or _has_control(key):
            raise Refusal("ILLEGAL_MESSAGE_KEY", "key %r: not blank and no control characters" % key[:64])
    if group is not None and (_blank(group) or len(group.encode("utf-8")) >= MAX_GROUP_BYTES
                              or _has_control(group)):
        raise Refusal("ILLEGAL_MESSAGE_GROUP", "message group %r: not blank, shorter than %d bytes, no control "
                      "characters" % (group[:80], MAX_GROUP_BYTES))


def _check_user_properties(tag, keys, user_properties):
    """Refuses more than ``MAX_USER_PROPERTIES`` user properties, a reserved, blank or control-character name,
    and properties, tag and keys over ``MAX_PROPERTY_BYTES`` together."""
    if len(user_properties) > MAX_USER_PROPERTIES:
        raise Refusal("MESSAGE_PROPERTIES_TOO_LARGE", "%d user properties: at most %d"
                      % (len(user_properties), MAX_USER_PROPERTIES))
    size = len((tag or "").encode("utf-8")) + sum(len(k.encode("utf-8")) for k in keys)
    for name, value in user_properties.items():
        if _blank(name) or name in RESERVED_PROPERTIES or _has_control(name):
            raise Refusal("ILLEGAL_MESSAGE_PROPERTY_KEY", "user property %r: reserved by RocketMQ, blank or with "
                          "control characters" % name[:64])
        size += len(name.encode("utf-8")) + len(value.encode("utf-8"))
    if size > MAX_PROPERTY_BYTES:
        raise Refusal("MESSAGE_PROPERTIES_TOO_LARGE", "the properties, tag and keys take %d bytes: at most %d"
                      % (size, MAX_PROPERTY_BYTES))


def _check_type(message_type, deliver_ms, group):
    """Refuses a delivery time or message group on a transactional message, and both on one message."""
    if message_type == TRANSACTION and (deliver_ms is not None or group is not None):
        raise Refusal("MESSAGE_PROPERTY_CONFLICT_WITH_TYPE", "a transactional message may have neither a delivery "
                      "time nor a message group")
    if deliver_ms is not None and group is not None:
        raise Refusal("MESSAGE_PROPERTY_CONFLICT_WITH_TYPE", "a message with both a delivery time and a message "
                      "group")


def group_queue(group, queues):
    """The queue a FIFO message group goes to: the same one for every message of the group (a stable hash, never
    Python's salted one), so their order is the queue's."""
    h = 0
    for b in group.encode("utf-8"):
        h = (h * 31 + b) & 0xFFFFFFFF
    return h % queues


class Recall(NamedTuple):
    """What a recall handle names: the timed message's topic, the broker holding it, its delivery time (epoch ms),
    the client's message id and metaq's timer id (what ``TimerService.cancel`` takes)."""

    topic: str
    broker: str
    deliver_ms: int
    message_id: str
    timer_id: int


#: The longest recall handle read (a topic, a broker name and two ids fit many times over).
MAX_RECALL_HANDLE_BYTES = 2048


def recall_handle(recall):
    """The recall handle of a timed message sent: URL-safe Base64 of RocketMQ's v1 layout, ``v1 <topic> <broker>
    <delivery ms> <message id>``, with metaq's timer id appended."""
    text = "v1 %s %s %d %s %d" % recall
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")


def parse_recall_handle(handle):
    """The ``Recall`` a handle names; Refusal BAD_REQUEST for one no send gave (not Base64, another layout)."""
    if len(handle) > MAX_RECALL_HANDLE_BYTES:
        raise Refusal("BAD_REQUEST", "a recall handle of %d bytes: at most %d" % (len(handle),
                                                                                MAX_RECALL_HANDLE_BYTES))
    try:
        fields = base64.urlsafe_b64decode(handle.encode("ascii")).decode("utf-8").split(" ")
    except (binascii.Error, ValueError):
        fields = []
    if len(fields) != 6 or fields[0] != "v1" or not fields[3].isdigit() or not fields[5].isdigit():
        raise Refusal("BAD_REQUEST", "not a recall handle this broker gave")
    return Recall(fields[1], fields[2], int(fields[3]), fields[4], int(fields[5]))
