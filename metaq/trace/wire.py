"""The text protocol's ``trace`` command (``metaq-admin trace``), sans-IO (docs/operating.md "Where is my message")::

    trace <id|key> <value> <topic|*> <max> <opaque>

``id``: ``value`` is a message id (``trace/records.parse_message_id``); ``*`` for the topic looks it up without
one (a RocketMQ offset id names its position; a metaq id or a client's ``UNIQ_KEY`` needs the topic). ``key``:
``value`` is a key of the topic's messages (the key index). ``max``: messages answered at most, 1 to
``limits.TRACE_MAX_RESULTS``. Any logged-in user may send it; the broker answers only about messages of topics the
user may subscribe to (403 otherwise). The reply is ``result 200`` with a JSON body (UTF-8): ``{"query": {"kind",
"value", "topic"}, "messages": [...], "more": bool}`` (each message's fields: ``trace/service.py``); 404 when this
broker has no such message, 400 for a malformed id.
"""

import json
from typing import NamedTuple, Optional

from metaq.trace import limits as trace_limits
from metaq.protocol.commands import NEEDS_USER, TextCommand, register, token
from metaq.protocol.integers import parse_int

__all__ = ["TraceQuery", "ANY_TOPIC", "KINDS", "encode_body", "decode_body"]

#: The topic token of a trace by id without a topic.
ANY_TOPIC = "*"
KINDS = ("id", "key")
_INT32 = (-(2**31), 2**31 - 1)


class TraceQuery(NamedTuple):
    """``trace <kind> <value> <topic|*> <max> <opaque>``; ``topic`` None for ``*``."""

    kind: str
    value: str
    topic: Optional[str]
    max_count: int
    opaque: int


def _parse_trace(t):
    if t[1] not in KINDS:
        raise ValueError("trace: the kind is id or key, got %r" % t[1][:32])
    if not t[2]:
        raise ValueError("trace: give a message id or a key")
    return TraceQuery(t[1], t[2], None if t[3] == ANY_TOPIC else t[3],
                      parse_int(t[4], "max", 1, trace_limits.TRACE_MAX_RESULTS), parse_int(t[5], "opaque", *_INT32))


def _serialize_trace(e):
    return ("trace %s %s %s %d %d\r\n" % (e.kind, token(e.value), token(e.topic or ANY_TOPIC), e.max_count,
                                         e.opaque)).encode("utf-8")


register(TextCommand(
    "trace", TraceQuery, (6,), "6 tokens (trace <id|key> <value> <topic|*> <max> <opaque>)", _parse_trace,
    _serialize_trace, NEEDS_USER,
    examples=(b"trace id 123456789 * 20 1\r\n", b"trace key order-7 orders 5 2\r\n")))


def encode_body(value):
    """A reply body: ``value`` as compact JSON in UTF-8."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode_body(body):
    """The JSON of a reply body; ValueError when it is not JSON."""
    return json.loads(bytes(body).decode("utf-8"))
