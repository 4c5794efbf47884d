"""The text protocol's admin extensions (``metaq-admin reset-offsets`` and ``dlq``), sans-IO.

Each needs the ``admin`` permission (docs/security.md). Replies to a good request are ``result 200`` with a JSON
body (UTF-8), whose shape each event's docstring gives; errors are ``result <code>`` with the reason as text::

    group_info <group> <opaque>                                  the group's live members and broker-kept offsets
    reset_offset <group> <topic> <partition> <offset> <force 0|1> <opaque>
    dlq_list <group> <max> <opaque>                              the group's dead letters, oldest first
    dlq_resend <group> <ids> <opaque>                            ``*`` (all) or ids/positions separated by ``,``
    client_command <stack|verify> <client-id> <topic|*> <message-id|*> <timeout-ms> <opaque>
                                                                 a connected gRPC client asked (``ClientCommand``)

Each command is declared here once (``protocol.commands``); a parser raises ``ValueError`` with the reason for a
bad field (the text parser answers it as its protocol error).
"""

import json
from typing import NamedTuple, Optional, Tuple

from metaq.admin import limits as admin_limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.protocol.commands import NEEDS_ADMIN, TextCommand, register, token
from metaq.protocol.integers import parse_int

__all__ = ["GroupInfo", "ResetOffset", "DlqList", "DlqResend", "EVENTS", "encode_body", "decode_body",
           "ALL_DEAD_LETTERS", "ClientCommand", "CLIENT_COMMAND_KINDS"]

#: ``dlq_resend``'s word for every dead letter not resent yet.
ALL_DEAD_LETTERS = "*"
_INT32 = (-(2**31), 2**31 - 1)
_INT64_MAX = 2**63 - 1


class GroupInfo(NamedTuple):
    """``group_info <group> <opaque>``. Body: ``{"group", "members": [{"kind": "remoting"|"text", "id", "address",
    "idle_s"}], "offsets": [{"topic", "partition", "offset", "commit_ms", "min_offset", "max_offset"}]}``."""

    group: str
    opaque: int


class ResetOffset(NamedTuple):
    """``reset_offset <group> <topic> <partition> <offset> <force 0|1> <opaque>``: set a broker-kept offset.
    Body: ``{"old": <offset or null>, "new": <offset>}``. 409 with the live members named while the group has any
    and ``force`` is 0; 400 for an offset outside the partition's ``[min, max]``."""

    group: str
    topic: str
    partition: int
    offset: int
    force: bool
    opaque: int


class DlqList(NamedTuple):
    """``dlq_list <group> <max> <opaque>``. Body: ``{"group", "topic", "dead_letters": [{"position": "p-o",
    "id", "topic", "tags", "keys", "reconsume_times", "stored_ms", "body_bytes", "body" (a preview, text),
    "resent": bool}], "more": bool}``; 404 when the broker has no dead-letter topic for the group."""

    group: str
    max_count: int
    opaque: int


class DlqResend(NamedTuple):
    """``dlq_resend <group> <ids> <opaque>``: ``ids`` None for every dead letter not resent yet, else the ids
    (``ORIGIN_MESSAGE_ID``) or positions (``p-o``) to resend. Body: ``{"resent": [{"position", "id", "topic",
    "partition", "offset"}], "skipped": [{"position", "id", "reason"}]}``."""

    group: str
    ids: Optional[Tuple[str, ...]]
    opaque: int


class ClientCommand(NamedTuple):
    """``client_command <stack|verify> <client-id> <topic|*> <message-id|*> <timeout-ms> <opaque>``: ask the gRPC
    client ``client`` (its id, or ``user/id``) connected to this broker, on its Telemetry stream
    (``rmq5/clientcommands.py``), for its thread stacks (``stack``) or to consume the message ``message_id`` of
    ``topic`` directly (``verify``), and wait at most ``timeout_ms`` for its answer. Body: ``{"client", "kind",
    "status", "message", ...}`` (``user`` with authentication on; ``thread_stack_trace``; ``topic``, ``message_id``,
    ``result``, ``remark``); 404 for a client with no Telemetry stream here or a message not found, 400 for an id
    that clients of several users have (the users named), 503 with ``limits.GRPC_MAX_PENDING_CLIENT_COMMANDS``
    questions waiting, 504 when no answer came."""

    kind: str
    client: str
    topic: Optional[str]
    message_id: Optional[str]
    timeout_ms: int
    opaque: int


#: What ``client_command`` asks: the client's thread stacks, or one message consumed directly.
CLIENT_COMMAND_KINDS = ("stack", "verify")
_ANY = "*"


def _parse_client_command(t):
    if t[1] not in CLIENT_COMMAND_KINDS:
        raise ValueError("client_command: the kind is stack or verify, got %r" % t[1][:32])
    topic, message_id = (None if t[3] == _ANY else t[3]), (None if t[4] == _ANY else t[4])
    if t[1] == "verify" and (topic is None or message_id is None):
        raise ValueError("client_command verify: name the message's topic and id")
    return ClientCommand(t[1], t[2], topic, message_id,
                         parse_int(t[5], "timeout-ms", 1, rmq5_limits.GRPC_CLIENT_COMMAND_MAX_TIMEOUT_MS),
                         _opaque(t[6]))


def _serialize_client_command(e):
    return ("client_command %s %s %s %s %d %d\r\n" % (e.kind, token(e.client), token(e.topic or _ANY),
                                                       token(e.message_id or _ANY), e.timeout_ms, e.opaque)
            ).encode("utf-8")


def _opaque(token):
    return parse_int(token, "opaque", *_INT32)


def _parse_group_info(t):
    return GroupInfo(t[1], _opaque(t[2]))


def _parse_reset_offset(t):
    return ResetOffset(t[1], t[2], parse_int(t[3], "partition", 0, _INT32[1]),
                       parse_int(t[4], "offset", 0, _INT64_MAX), bool(parse_int(t[5], "force", 0, 1)), _opaque(t[6]))


def _parse_dlq_list(t):
    return DlqList(t[1], parse_int(t[2], "max", 1, admin_limits.MAX_DLQ_LIST), _opaque(t[3]))


def _parse_dlq_resend(t):
    if t[2] == ALL_DEAD_LETTERS:
        return DlqResend(t[1], None, _opaque(t[3]))
    ids = tuple(i for i in t[2].split(",") if i)
    if not ids:
        raise ValueError("dlq_resend: give * or ids separated by ','")
    return DlqResend(t[1], ids, _opaque(t[3]))



#: The admin extensions' events, each declared below with its parser and bytes (``protocol.commands``).
EVENTS = (GroupInfo, ResetOffset, DlqList, DlqResend)

register(TextCommand(
    "group_info", GroupInfo, (3,), "3 tokens (group_info <group> <opaque>)", _parse_group_info,
    lambda e: ("group_info %s %d\r\n" % (token(e.group), e.opaque)).encode("utf-8"), NEEDS_ADMIN,
    examples=(b"group_info g 1\r\n",)))
register(TextCommand(
    "reset_offset", ResetOffset, (7,), "7 tokens (reset_offset <group> <topic> <partition> <offset> <force 0|1> "
    "<opaque>)", _parse_reset_offset,
    lambda e: ("reset_offset %s %s %d %d %d %d\r\n" % (
        token(e.group), token(e.topic), e.partition, e.offset, 1 if e.force else 0, e.opaque)).encode("utf-8"),
    NEEDS_ADMIN,
    examples=(b"reset_offset g t 0 5 1 1\r\n",)))
register(TextCommand(
    "dlq_list", DlqList, (4,), "4 tokens (dlq_list <group> <max> <opaque>)", _parse_dlq_list,
    lambda e: ("dlq_list %s %d %d\r\n" % (token(e.group), e.max_count, e.opaque)).encode("utf-8"), NEEDS_ADMIN,
    examples=(b"dlq_list g 10 1\r\n",)))
register(TextCommand(
    "dlq_resend", DlqResend, (4,), "4 tokens (dlq_resend <group> <*|id,id,...> <opaque>)", _parse_dlq_resend,
    lambda e: ("dlq_resend %s %s %d\r\n" % (
        token(e.group), token(ALL_DEAD_LETTERS if e.ids is None else ",".join(e.ids)), e.opaque)).encode("utf-8"),
    NEEDS_ADMIN,
    examples=(b"dlq_resend g * 1\r\n", b"dlq_resend g 0-5,ABC 2\r\n")))

register(TextCommand(
    "client_command", ClientCommand, (7,), "7 tokens (client_command <stack|verify> <client-id> <topic|*> "
    "<message-id|*> <timeout-ms> <opaque>)", _parse_client_command, _serialize_client_command, NEEDS_ADMIN,
    examples=(b"client_command stack c@1 * * 1000 1\r\n", b"client_command verify c@1 orders 0A1B 5000 2\r\n")))


def encode_body(value):
    """A reply body: ``value`` as compact JSON in UTF-8."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode_body(body):
    """The JSON of a reply body; ValueError when it is not JSON."""
    return json.loads(bytes(body).decode("utf-8"))
