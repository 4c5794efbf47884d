"""What a trace reads: message ids as users give them, and RocketMQ's message-trace records (docs/operating.md
"Where is my message").

**Message ids.** A metaq id is a decimal number (``protocol/msgid.py``: the store time's millisecond, the broker id
and a sequence). A RocketMQ id is 32 hex digits (56 for IPv6): the *offset* id a send answers as ``offsetMsgId``
names the storing broker (IP, remoting port) and the record's commit-log position
(``protocol/rocketmq/bodies.parse_offset_msg_id``); the client's ``msgId`` (the ``UNIQ_KEY`` property) has the same
shape and is found through the key index instead. ``parse_message_id`` tells them apart as far as the text can;
anything else is refused with the shapes it accepts.

**Trace records.** A RocketMQ client with message trace on sends what it did to ``RMQ_SYS_TRACE_TOPIC``: a body of
records separated by char 2, each a row of fields separated by char 1, the first field the record's type; the
message's keys are the traced message ids (and their keys), so the key index finds them. The layouts are the
client's ``TraceDataEncoder``'s:

* ``Pub``: type, timestamp, region, producer group, topic, msgId, tags, keys, store host, body length, cost ms,
  message type, offsetMsgId, success (older clients leave out offsetMsgId; newer ones add the client host)
* ``SubBefore``: type, timestamp, region, consumer group, request id, msgId, retry times, keys
* ``SubAfter``: type, request id, msgId, cost ms, success, keys, then (newer clients) context code and timestamp
* ``EndTransaction``: type, timestamp, region, group, topic, msgId, tags, keys, store host, message type,
  transaction id, transaction state, from a check-back

A record that does not fit its layout is skipped, never an error: the topic is written by clients.
"""

from typing import NamedTuple, Optional

from metaq import errors
from metaq.protocol.integers import parse_int
from metaq.protocol.journaltopic import TRACE_TOPIC
from metaq.protocol.rocketmq.bodies import parse_offset_msg_id

__all__ = ["TRACE_TOPIC", "CONTENT_SEPARATOR", "FIELD_SEPARATOR", "MessageRef", "parse_message_id",
           "parse_trace_body", "encode_pub", "encode_sub_before", "encode_sub_after"]

#: Between the fields of one trace record, and after each record (RocketMQ's ``TraceConstants``).
CONTENT_SEPARATOR = "\x01"
FIELD_SEPARATOR = "\x02"
_INT64_MAX = 2**63 - 1


class MessageRef(NamedTuple):
    """A message id as given: ``kind`` ``"metaq"`` (``metaq_id``) or ``"rocketmq"`` (the offset id's ``host``
    ``(ip, port)`` and ``position``, if the text is a client's ``UNIQ_KEY`` rather than an offset id, those name
    nothing); ``text`` the id as written (upper-case hex for a RocketMQ one)."""

    kind: str
    text: str
    metaq_id: Optional[int] = None
    host: Optional[tuple] = None
    position: Optional[int] = None


def parse_message_id(text):
    """The ``MessageRef`` of ``text``; ClientError naming the accepted shapes for anything else."""
    text = (text or "").strip()
    if text.isascii() and text.isdigit() and len(text) <= 19 and 0 < int(text) <= _INT64_MAX:
        return MessageRef("metaq", text, metaq_id=int(text))
    if len(text) in (32, 56):
        try:
            ip, port, position = parse_offset_msg_id(text)
        except errors.RemoteProtocolError:
            pass
        else:
            return MessageRef("rocketmq", text.upper(), host=(ip, port), position=position)
    raise errors.ClientError("not a message id: %r (a metaq id is a decimal number; a RocketMQ id is 32 or 56 hex "
                             "digits; to find messages by key, trace the key with its topic)" % (text[:80],))


def _number(text):
    """A record's integer field, None when it is not one (the records are the clients': skipped, never refused)."""
    try:
        return parse_int(text, "field", -_INT64_MAX - 1, _INT64_MAX)
    except ValueError:
        return None


def _bool(text):
    return text.strip().lower() == "true"


def _pub(f):
    rec = {"type": "Pub", "timestamp_ms": _number(f[1]), "region": f[2], "group": f[3], "topic": f[4],
           "msg_id": f[5], "tags": f[6], "keys": f[7], "store_host": f[8], "body_length": _number(f[9]),
           "cost_ms": _number(f[10]), "offset_msg_id": None, "success": None}
    if len(f) == 13:
        rec["success"] = _bool(f[12])
    elif len(f) >= 14:
        rec["offset_msg_id"], rec["success"] = f[12], _bool(f[13])
    return rec


def _sub_before(f):
    return {"type": "SubBefore", "timestamp_ms": _number(f[1]), "region": f[2], "group": f[3], "request_id": f[4],
            "msg_id": f[5], "retry_times": _number(f[6]), "keys": f[7]}


def _sub_after(f):
    return {"type": "SubAfter", "request_id": f[1], "msg_id": f[2], "cost_ms": _number(f[3]), "success": _bool(f[4]),
            "keys": f[5], "context_code": _number(f[6]) if len(f) > 6 else None,
            "timestamp_ms": _number(f[7]) if len(f) > 7 else None}


def _end_transaction(f):
    return {"type": "EndTransaction", "timestamp_ms": _number(f[1]), "region": f[2], "group": f[3], "topic": f[4],
            "msg_id": f[5], "tags": f[6], "keys": f[7], "store_host": f[8], "transaction_id": f[10],
            "transaction_state": f[11], "from_check": _bool(f[12])}


#: type -> (fewest fields, decoder)
_LAYOUTS = {"Pub": (13, _pub), "SubBefore": (8, _sub_before), "SubAfter": (6, _sub_after),
            "EndTransaction": (13, _end_transaction)}


def parse_trace_body(body):
    """The trace records of one ``RMQ_SYS_TRACE_TOPIC`` message body (bytes or str), as dicts with ``type`` and the
    fields its layout has (the module doc); records of another type or too few fields are skipped."""
    text = bytes(body).decode("utf-8", "replace") if isinstance(body, (bytes, bytearray, memoryview)) else body
    out = []
    for row in text.split(FIELD_SEPARATOR):
        fields = row.split(CONTENT_SEPARATOR)
        layout = _LAYOUTS.get(fields[0])
        if layout is None or len(fields) < layout[0]:
            continue
        rec = layout[1](fields)
        if rec.get("msg_id"):
            out.append(rec)
    return out


def _row(*fields):
    return CONTENT_SEPARATOR.join("" if f is None else (str(f).lower() if isinstance(f, bool) else str(f))
                                  for f in fields) + FIELD_SEPARATOR


def encode_pub(timestamp_ms, group, topic, msg_id, tags, keys, store_host, body_length, cost_ms, offset_msg_id,
               success=True, region="DefaultRegion", msg_type=0):
    """One ``Pub`` record as a client writes it (``msg_type`` 0: a normal message)."""
    return _row("Pub", timestamp_ms, region, group, topic, msg_id, tags, keys, store_host, body_length, cost_ms,
                msg_type, offset_msg_id, success)


def encode_sub_before(timestamp_ms, group, request_id, msg_id, retry_times, keys, region="DefaultRegion"):
    """One ``SubBefore`` record (a consumer is about to handle the message)."""
    return _row("SubBefore", timestamp_ms, region, group, request_id, msg_id, retry_times, keys)


def encode_sub_after(request_id, msg_id, cost_ms, success, keys, context_code, timestamp_ms):
    """One ``SubAfter`` record (the consumer's handler returned; ``success`` its outcome)."""
    return _row("SubAfter", request_id, msg_id, cost_ms, success, keys, context_code, timestamp_ms)
