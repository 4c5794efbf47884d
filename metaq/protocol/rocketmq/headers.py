"""Typed views of the remoting "custom headers" (``extFields``) of the compatibility subset.

Each ``decode_*`` takes a ``RemotingCommand`` and returns a NamedTuple with
snake_case fields, parsing values the way Java does (reference §1.5):
integers are strict decimals (``[+-]?[0-9]+``) range-checked as int32 or
int64, a boolean is true only for ``"true"`` in any case (C++'s ``"0"`` is
false), unknown keys are ignored. A missing required field or a bad number
raises ``RemoteProtocolError(reason, cmd.opaque, fatal=False)`` so the server
can answer the request with an error.

SEND_MESSAGE (10) and SEND_MESSAGE_V2/SEND_BATCH_MESSAGE (310/320) give the same
``SendMessageHeader``: v2 uses the one-letter keys ``a``..``n``.

The ``*_fields`` helpers build response extFields with every field the client
unboxes (Java NPEs on a missing one), as strings.
"""

import re
from collections import namedtuple

from metaq.errors import RemoteProtocolError
from metaq.protocol.rocketmq.remoting import RequestCode

__all__ = [
    "QueryMessageHeader",
    "UNIQUE_KEY_QUERY",
    "SendMessageHeader",
    "PullMessageHeader",
    "QueryConsumerOffsetHeader",
    "UpdateConsumerOffsetHeader",
    "SearchOffsetHeader",
    "QueueHeader",
    "ConsumerSendMsgBackHeader",
    "EndTransactionHeader",
    "CheckTransactionStateHeader",
    "check_transaction_fields",
    "push_reply_fields",
    "UnregisterClientHeader",
    "ConsumerGroupHeader",
    "RouteInfoHeader",
    "ViewMessageHeader",
    "decode_send_header",
    "decode_header",
    "java_int",
    "java_long",
    "java_bool",
    "send_response_fields",
    "pull_response_fields",
    "PULL_COMMIT_OFFSET",
    "PULL_SUSPEND",
    "PULL_SUBSCRIPTION",
    "PULL_CLASS_FILTER",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_PREPARED_TYPE",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
]

#: PullSysFlag bits (reference §2.3).
PULL_COMMIT_OFFSET = 1 << 0
PULL_SUSPEND = 1 << 1
PULL_SUBSCRIPTION = 1 << 2
PULL_CLASS_FILTER = 1 << 3

#: commitOrRollback values of END_TRANSACTION (MessageSysFlag bits 2-3).
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 4
TRANSACTION_COMMIT_TYPE = 8
TRANSACTION_ROLLBACK_TYPE = 12

_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_SHOWN = 64


def _show(text):
    return repr(text) if len(text) <= _SHOWN else repr(text[:_SHOWN]) + "..."


def _java_integer(text, key, bits, opaque):
    if _INTEGER.fullmatch(text):
        value = int(text)
        if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return value
        raise RemoteProtocolError("header field %s=%s is out of the int%d range" % (key, _show(text), bits),
                                  opaque, False)
    raise RemoteProtocolError("header field %s=%s is not an integer" % (key, _show(text)), opaque, False)


def java_int(text, key="value", opaque=0):
    """``Integer.parseInt`` (ASCII digits only): an int32, else RemoteProtocolError."""
    return _java_integer(text, key, 32, opaque)


def java_long(text, key="value", opaque=0):
    """``Long.parseLong`` (ASCII digits only): an int64, else RemoteProtocolError."""
    return _java_integer(text, key, 64, opaque)


def java_bool(text, key="value", opaque=0):
    """``Boolean.parseBoolean``: True only for "true" in any case."""
    return text.lower() == "true"


def _java_str(text, key, opaque):
    return text


_STR, _INT, _LONG, _BOOL = _java_str, java_int, java_long, java_bool
#: Marks a field whose absence is an error (``@CFNotNull`` in Java, and needed by the broker).
REQUIRED = object()

# Each spec: (attribute, extFields key, parser, default or REQUIRED).
_SEND_FIELDS = (
    # attribute, v1 key, v2 key, parser, default
    ("producer_group", "producerGroup", "a", _STR, REQUIRED),
    ("topic", "topic", "b", _STR, REQUIRED),
    ("default_topic", "defaultTopic", "c", _STR, "TBW102"),
    ("default_topic_queue_nums", "defaultTopicQueueNums", "d", _INT, 4),
    ("queue_id", "queueId", "e", _INT, REQUIRED),
    ("sys_flag", "sysFlag", "f", _INT, REQUIRED),
    ("born_timestamp", "bornTimestamp", "g", _LONG, REQUIRED),
    ("flag", "flag", "h", _INT, REQUIRED),
    ("properties", "properties", "i", _STR, ""),
    ("reconsume_times", "reconsumeTimes", "j", _INT, 0),
    ("unit_mode", "unitMode", "k", _BOOL, False),
    ("max_reconsume_times", "maxReconsumeTimes", "l", _INT, None),
    ("batch", "batch", "m", _BOOL, False),
    ("broker_name", "brokerName", "n", _STR, None),
)
_SEND_V1 = tuple((attr, v1, parse, default) for attr, v1, _, parse, default in _SEND_FIELDS)
_SEND_V2 = tuple((attr, v2, parse, default) for attr, _, v2, parse, default in _SEND_FIELDS)

SendMessageHeader = namedtuple("SendMessageHeader", [f[0] for f in _SEND_FIELDS])
SendMessageHeader.__doc__ = """SEND_MESSAGE (10) / SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320) header.

``properties`` is the raw ``\\x01``/``\\x02`` string (``bodies.decode_properties``);
``max_reconsume_times`` and ``broker_name`` are None when absent."""

_SPECS = {}


def _header_type(name, doc, spec):
    cls = namedtuple(name, [f[0] for f in spec])
    cls.__doc__ = doc
    _SPECS[cls] = spec
    return cls


PullMessageHeader = _header_type("PullMessageHeader", "PULL_MESSAGE (11) header; sys_flag holds PULL_* bits.", (
    ("consumer_group", "consumerGroup", _STR, REQUIRED),
    ("topic", "topic", _STR, REQUIRED),
    ("queue_id", "queueId", _INT, REQUIRED),
    ("queue_offset", "queueOffset", _LONG, REQUIRED),
    ("max_msg_nums", "maxMsgNums", _INT, REQUIRED),
    ("sys_flag", "sysFlag", _INT, REQUIRED),
    ("commit_offset", "commitOffset", _LONG, REQUIRED),
    ("suspend_timeout_millis", "suspendTimeoutMillis", _LONG, REQUIRED),
    ("subscription", "subscription", _STR, None),
    ("sub_version", "subVersion", _LONG, 0),
    ("expression_type", "expressionType", _STR, None),
    ("max_msg_bytes", "maxMsgBytes", _INT, None),
))

QueryConsumerOffsetHeader = _header_type(
    "QueryConsumerOffsetHeader",
    "QUERY_CONSUMER_OFFSET (14) header; set_zero_if_not_found is True when absent, as in Java.", (
        ("consumer_group", "consumerGroup", _STR, REQUIRED),
        ("topic", "topic", _STR, REQUIRED),
        ("queue_id", "queueId", _INT, REQUIRED),
        ("set_zero_if_not_found", "setZeroIfNotFound", _BOOL, True),
    ))

UpdateConsumerOffsetHeader = _header_type("UpdateConsumerOffsetHeader", "UPDATE_CONSUMER_OFFSET (15) header.", (
    ("consumer_group", "consumerGroup", _STR, REQUIRED),
    ("topic", "topic", _STR, REQUIRED),
    ("queue_id", "queueId", _INT, REQUIRED),
    ("commit_offset", "commitOffset", _LONG, REQUIRED),
))

SearchOffsetHeader = _header_type("SearchOffsetHeader", "SEARCH_OFFSET_BY_TIMESTAMP (29) header.", (
    ("topic", "topic", _STR, REQUIRED),
    ("queue_id", "queueId", _INT, REQUIRED),
    ("timestamp", "timestamp", _LONG, REQUIRED),
    ("boundary_type", "boundaryType", _STR, "lower"),
))

QueueHeader = _header_type(
    "QueueHeader", "GET_MAX_OFFSET (30) / GET_MIN_OFFSET (31) / GET_EARLIEST_MSG_STORETIME (32) header.", (
        ("topic", "topic", _STR, REQUIRED),
        ("queue_id", "queueId", _INT, REQUIRED),
        ("committed", "committed", _BOOL, True),
    ))

ConsumerSendMsgBackHeader = _header_type(
    "ConsumerSendMsgBackHeader",
    "CONSUMER_SEND_MSG_BACK (36) header; offset is the commit-log (physical) offset.", (
        ("offset", "offset", _LONG, REQUIRED),
        ("group", "group", _STR, REQUIRED),
        ("delay_level", "delayLevel", _INT, REQUIRED),
        ("origin_msg_id", "originMsgId", _STR, None),
        ("origin_topic", "originTopic", _STR, None),
        ("unit_mode", "unitMode", _BOOL, False),
        ("max_reconsume_times", "maxReconsumeTimes", _INT, None),
    ))

EndTransactionHeader = _header_type(
    "EndTransactionHeader", "END_TRANSACTION (37) header; commit_or_rollback is a TRANSACTION_*_TYPE.", (
        ("producer_group", "producerGroup", _STR, REQUIRED),
        ("tran_state_table_offset", "tranStateTableOffset", _LONG, REQUIRED),
        ("commit_log_offset", "commitLogOffset", _LONG, REQUIRED),
        ("commit_or_rollback", "commitOrRollback", _INT, REQUIRED),
        ("from_transaction_check", "fromTransactionCheck", _BOOL, False),
        ("msg_id", "msgId", _STR, REQUIRED),
        ("transaction_id", "transactionId", _STR, None),
        ("topic", "topic", _STR, None),
    ))

CheckTransactionStateHeader = _header_type(
    "CheckTransactionStateHeader",
    "CHECK_TRANSACTION_STATE (39) header, broker to producer; msg_id and transaction_id are the client's id.", (
        ("tran_state_table_offset", "tranStateTableOffset", _LONG, REQUIRED),
        ("commit_log_offset", "commitLogOffset", _LONG, REQUIRED),
        ("msg_id", "msgId", _STR, None),
        ("transaction_id", "transactionId", _STR, None),
        ("offset_msg_id", "offsetMsgId", _STR, None),
        ("topic", "topic", _STR, None),
    ))

UnregisterClientHeader = _header_type("UnregisterClientHeader", "UNREGISTER_CLIENT (35) header.", (
    ("client_id", "clientID", _STR, REQUIRED),
    ("producer_group", "producerGroup", _STR, None),
    ("consumer_group", "consumerGroup", _STR, None),
))

ConsumerGroupHeader = _header_type(
    "ConsumerGroupHeader", "GET_CONSUMER_LIST_BY_GROUP (38) / NOTIFY_CONSUMER_IDS_CHANGED (40) header.", (
        ("consumer_group", "consumerGroup", _STR, REQUIRED),
    ))

RouteInfoHeader = _header_type("RouteInfoHeader", "GET_ROUTEINFO_BY_TOPIC (105) header.", (
    ("topic", "topic", _STR, REQUIRED),
    ("accept_standard_json_only", "acceptStandardJsonOnly", _BOOL, False),
))

QueryMessageHeader = _header_type(
    "QueryMessageHeader", "QUERY_MESSAGE (12) header: a key's messages in a time window.", (
    ("topic", "topic", _STR, REQUIRED),
    ("key", "key", _STR, REQUIRED),
    ("max_num", "maxNum", _INT, REQUIRED),
    ("begin_timestamp", "beginTimestamp", _LONG, REQUIRED),
    ("end_timestamp", "endTimestamp", _LONG, REQUIRED),
))
#: QUERY_MESSAGE's ext field saying the key is a message's unique id (MixAll.UNIQUE_MSG_QUERY_FLAG): a view by id.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"

ViewMessageHeader = _header_type("ViewMessageHeader", "VIEW_MESSAGE_BY_ID (33) header; offset is physical.", (
    ("offset", "offset", _LONG, REQUIRED),
    ("topic", "topic", _STR, None),
))


def _decode(cmd, spec, what):
    ext = cmd.ext_fields
    values = []
    for _attr, key, parse, default in spec:
        text = ext.get(key)
        if text is None:
            if default is REQUIRED:
                raise RemoteProtocolError("%s: missing header field %s" % (what, key), cmd.opaque, False)
            values.append(default)
        else:
            values.append(parse(text, key, cmd.opaque))
    return values


def decode_header(cls, cmd):
    """Decode ``cmd.ext_fields`` into the header type ``cls`` (e.g. ``PullMessageHeader``)."""
    return cls(*_decode(cmd, _SPECS[cls], cls.__name__))


def decode_send_header(cmd):
    """The ``SendMessageHeader`` of a send request: full names for codes 10 and 324 (SEND_REPLY_MESSAGE), one-letter
    keys for 310/320/325."""
    if cmd.code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_REPLY_MESSAGE):
        return SendMessageHeader(*_decode(cmd, _SEND_V1, "SendMessageRequestHeader"))
    if cmd.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2):
        return SendMessageHeader(*_decode(cmd, _SEND_V2, "SendMessageRequestHeaderV2"))
    raise ValueError("code %d is not a send request" % cmd.code)


def send_response_fields(msg_id, queue_id, queue_offset, transaction_id=None):
    """extFields of a successful send: ``msgId`` (offset msg id), ``queueId``, ``queueOffset`` [, ``transactionId``]."""
    fields = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)}
    if transaction_id is not None:
        fields["transactionId"] = transaction_id
    return fields


def check_transaction_fields(tran_state_table_offset, commit_log_offset, transaction_id, offset_msg_id, topic):
    """extFields of a CHECK_TRANSACTION_STATE request: what the producer's END_TRANSACTION sends back."""
    return {"tranStateTableOffset": str(tran_state_table_offset), "commitLogOffset": str(commit_log_offset),
            "msgId": transaction_id, "transactionId": transaction_id, "offsetMsgId": offset_msg_id, "topic": topic}


def push_reply_fields(producer_group, topic, queue_id, sys_flag, born_ms, flag, properties, reconsume_times,
                      born_host, store_host, store_ms):
    """extFields of a PUSH_REPLY_MESSAGE_TO_CLIENT (326) request (RocketMQ's ReplyMessageRequestHeader): the
    reply's send header, ``bornHost``/``storeHost`` as ``ip:port`` and ``storeTimestamp``."""
    return {"producerGroup": producer_group, "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": str(queue_id), "sysFlag": str(sys_flag), "bornTimestamp": str(born_ms), "flag": str(flag),
            "properties": properties, "reconsumeTimes": str(reconsume_times), "unitMode": "false",
            "bornHost": born_host, "storeHost": store_host, "storeTimestamp": str(store_ms)}


def pull_response_fields(next_begin_offset, min_offset, max_offset, suggest_which_broker_id=0):
    """extFields of every pull response, whatever its code (Java unboxes all four)."""
    return {
        "suggestWhichBrokerId": str(suggest_which_broker_id),
        "nextBeginOffset": str(next_begin_offset),
        "minOffset": str(min_offset),
        "maxOffset": str(max_offset),
    }
