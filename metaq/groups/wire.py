"""``group_settings <action> <group|-> <settings|-> <opaque>`` (our text extension; ``metaq-admin group-settings``),
sans-IO. docs/concepts.md "Per-group settings".

Actions: ``list`` (``group_settings list - - <opaque>``: every group with settings), ``show <group> -`` (its settings,
the defaults when it has none), ``set <group> <settings>`` (the settings given change, the others stay),
``delete <group> -`` (the group behaves as one without settings). Settings are ``key=value`` pairs joined by commas,
no spaces, as the ``topic`` command's::

    group_settings set billing max_retries=3,consumption_enabled=0 7

Keys: ``max_retries``, ``consumption_enabled``, ``broadcast_allowed``, ``read_from_slave_when_slow`` (``none``
clears a number), ``fifo``; their meaning and checks are the table's (``metaq.groups.table``). The broker answers
``result 200`` with a JSON body, or ``result 400/403/404`` with the reason. ``set`` and ``delete`` need the admin
permission (as topic administration does), ``list`` and ``show`` any user.

The command is declared here, in ``protocol.commands`` (``metaq.textcommands`` lists this module, so the registry is
complete).
"""

from typing import NamedTuple

from metaq import limits
from metaq.errors import InvalidTopic
from metaq.protocol.commands import NEEDS_ADMIN, NEEDS_USER, TextCommand, depends, register
from metaq.protocol.integers import TokenError, parse_int
from metaq.topics.wire import encode_settings, parse_settings

_INT32 = (-(1 << 31), (1 << 31) - 1)

ACTIONS = ("list", "show", "set", "delete")


class GroupSettingsCommand(NamedTuple):
    action: str
    group: str  # None for list
    settings: tuple  # ((key, value text), ...)
    opaque: int


def parse(tokens):
    """``(action, group, settings)`` from ``group_settings <action> <group> <settings>``; ValueError with the
    reason."""
    action, group, text = tokens[1], tokens[2], tokens[3]
    if action not in ACTIONS:
        raise ValueError("unknown group_settings action %r: use %s" % (action[:40], ", ".join(ACTIONS)))
    if action == "list":
        if group != "-" or text != "-":
            raise ValueError("group_settings list takes no group or settings: group_settings list - - <opaque>")
        return action, None, ()
    limits.validate_group(group)
    if action != "set" and text != "-":
        raise ValueError("group_settings %s takes no settings: group_settings %s <group> - <opaque>"
                         % (action, action))
    settings = parse_settings(text)
    if action == "set" and not settings:
        raise ValueError("group_settings set needs at least one key=value setting")
    return action, group, settings


def serialize(e):
    return ("group_settings %s %s %s %d\r\n"
            % (e.action, e.group or "-", encode_settings(e.settings), e.opaque)).encode()


def _parse(t):
    try:
        action, group, settings = parse(t)
    except (ValueError, InvalidTopic) as exc:
        raise TokenError(str(exc)) from None
    return GroupSettingsCommand(action, group, settings, parse_int(t[4], "opaque", *_INT32))


def _need(e):
    return NEEDS_ADMIN if e.action in ("set", "delete") else NEEDS_USER


register(TextCommand(
    "group_settings", GroupSettingsCommand, (5,),
    "5 tokens (group_settings <list|show|set|delete> <group|-> <settings|-> <opaque>)",
    _parse, serialize, depends(_need),
    examples=(b"group_settings list - - 1\r\n", b"group_settings show billing - 2\r\n",
              b"group_settings set billing max_retries=3,consumption_enabled=0 3\r\n",
              b"group_settings delete billing - 4\r\n")))
