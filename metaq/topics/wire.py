"""``topic <action> <name|-> <settings|-> <opaque>`` (our text extension; ``metaq-admin topics``), sans-IO.

Actions: ``create`` and ``alter`` take settings, ``delete`` none (``-``), ``list`` neither name nor settings
(``topic list - - <opaque>``). Settings are ``key=value`` pairs joined by commas, no spaces::

    topic create orders partitions=4,perm=rw,ordered=1,retention_hours=2.5,retention_bytes=1000000 7

Keys: ``partitions``, ``perm`` (rw, r, w, -), ``ordered`` (0/1), ``retention_hours``, ``retention_bytes``
(``none`` removes a retention setting), ``priorities`` and ``priority_max_wait_ms`` (docs/messaging.md "Priorities");
their meaning and checks are the table's (``metaq.topics.table``). The broker answers ``result 200`` with a JSON body
(the topic's settings; for ``list`` a list of them), or
``result 400/403/404`` with the reason. A change needs the admin permission, ``list`` any user (docs/security.md).

The command is declared here, in ``protocol.commands`` (``metaq.textcommands`` lists this module, so the registry is
complete).
"""

from typing import NamedTuple

from metaq import limits
from metaq.errors import InvalidTopic
from metaq.protocol.commands import NEEDS_ADMIN, NEEDS_USER, TextCommand, depends, register
from metaq.protocol.integers import TokenError, parse_int

_INT32 = (-(1 << 31), (1 << 31) - 1)

ACTIONS = ("create", "alter", "delete", "list")
#: Most ``key=value`` pairs one command carries (there are seven settings).
MAX_SETTINGS = 8


class TopicCommand(NamedTuple):
    action: str
    name: str  # None for list
    settings: tuple  # ((key, value text), ...)
    opaque: int


def parse(tokens):
    """``(action, name, settings)`` from the line's tokens ``topic <action> <name> <settings>`` (the opaque is
    the caller's); ValueError with the reason."""
    action, name, text = tokens[1], tokens[2], tokens[3]
    if action not in ACTIONS:
        raise ValueError("unknown topic action %r: use %s" % (action[:40], ", ".join(ACTIONS)))
    if action == "list":
        if name != "-" or text != "-":
            raise ValueError("topic list takes no name or settings: topic list - - <opaque>")
        return action, None, ()
    limits.validate_topic(name)
    if action == "delete" and text != "-":
        raise ValueError("topic delete takes no settings: topic delete <name> - <opaque>")
    return action, name, parse_settings(text)


def parse_settings(text):
    if text == "-":
        return ()
    pairs = text.split(",")
    if len(pairs) > MAX_SETTINGS:
        raise ValueError("at most %d settings, got %d" % (MAX_SETTINGS, len(pairs)))
    out = []
    seen = set()
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise ValueError("a setting is key=value, got %r" % pair[:40])
        if key in seen:
            raise ValueError("setting %s given twice" % key[:40])
        seen.add(key)
        out.append((key, value))
    return tuple(out)


def encode_settings(settings):
    """``{key: value}`` or pairs -> the wire form (``-`` when empty); ValueError on a space, comma or '='."""
    items = settings.items() if isinstance(settings, dict) else settings
    parts = []
    for key, value in items:
        text = "none" if value is None else ("1" if value is True else "0" if value is False else str(value))
        if any(c in text for c in " ,=\r\n") or not text:
            raise ValueError("setting %s=%r cannot be sent" % (key, value))
        parts.append("%s=%s" % (key, text))
    return ",".join(parts) or "-"


def serialize(e):
    return ("topic %s %s %s %d\r\n" % (e.action, e.name or "-", encode_settings(e.settings), e.opaque)).encode()


def _parse_topic(t):
    try:
        action, name, settings = parse(t)
    except (ValueError, InvalidTopic) as exc:
        raise TokenError(str(exc)) from None
    return TopicCommand(action, name, settings, parse_int(t[4], "opaque", *_INT32))


def _topic_need(e):
    return NEEDS_USER if e.action == "list" else NEEDS_ADMIN


register(TextCommand(
    "topic", TopicCommand, (5,), "5 tokens (topic <create|alter|delete|list> <name|-> <settings|-> <opaque>)",
    _parse_topic, serialize, depends(_topic_need),
    examples=(b"topic list - - 1\r\n", b"topic create orders partitions=4 2\r\n")))
