"""The text ``request`` and ``reply`` commands (our extension; docs/messaging.md "Request-reply"): their parsers,
serializers and registration (``metaq.textcommands`` lists this module, so the registry is complete). The events are
``protocol.events.Request`` and ``Reply``; what the messages carry is ``reqreply.records``'.
"""

from metaq.protocol.commands import NEEDS_HANDLER, TextCommand, register, token
from metaq.protocol.events import UNCHECKED, Reply, Request
from metaq.protocol.integers import INT32_MAX, INT32_MIN, parse_int


def _parse_request(t):
    topic = t[1]
    partition = parse_int(t[2], "partition", -1, INT32_MAX)
    flag = parse_int(t[4], "flag", INT32_MIN, INT32_MAX)
    checksum = parse_int(t[5], "checksum", UNCHECKED, INT32_MAX)
    timeout_ms = parse_int(t[6], "timeoutMs", 1, INT32_MAX)
    opaque = parse_int(t[7], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: Request(topic, partition, flag, body, opaque, checksum, timeout_ms)


def _parse_reply(t):
    flag = parse_int(t[2], "flag", INT32_MIN, INT32_MAX)
    checksum = parse_int(t[3], "checksum", UNCHECKED, INT32_MAX)
    opaque = parse_int(t[4], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: Reply(flag, body, opaque, checksum)


def _serialize_request(e):
    head = "request %s %d %d %d %d %d %d\r\n" % (
        token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.timeout_ms, e.opaque)
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_reply(e):
    return b"".join((b"reply %d %d %d %d\r\n" % (len(e.body), e.flag, e.checksum, e.opaque), e.body))


register(TextCommand(
    "request", Request, (8,), "8 tokens (request <topic> <partition> <len> <flag> <checksum> <timeoutMs> <opaque>)",
    _parse_request, _serialize_request, NEEDS_HANDLER, body=3, examples=(b"request t 0 2 0 -1 1000 5\r\nhi",)))
register(TextCommand(
    "reply", Reply, (5,), "5 tokens (reply <len> <flag> <checksum> <opaque>)", _parse_reply, _serialize_reply,
    NEEDS_HANDLER, body=1, examples=(b"reply 2 0 -1 5\r\nhi",)))
