"""``group_settings <action> <group> <settings> <opaque>`` (``groups/wire.py``) on the text port: the group settings'
service (``groups/service.py``) asked, its answer sent as JSON.

A request runs on a greenlet of its connection's own (a change waits for the table's fsync). The permission a change
needs (admin) is checked by the dispatcher from the command's declaration, before this handler runs.
"""

import json
import logging

from metaq import errors
from metaq.protocol.text import encode_result

log = logging.getLogger(__name__)

NO_WAIT = 0


class TextGroupSettings:
    """The ``group_settings`` handler over ``GroupAdmin``."""

    def __init__(self, groups, error_reply):
        """``groups``: the GroupAdmin (None: answered 400); ``error_reply(exc, opaque)``: the dispatcher's one
        error→reply mapping."""
        self.groups = groups
        self.error_reply = error_reply

    def group_settings(self, e, conn):
        if self.groups is None:
            return encode_result(400, b"group settings are not served here", e.opaque), NO_WAIT
        conn.spawn(self._answer, e)
        return None, NO_WAIT

    def _answer(self, e):
        try:
            result = self.groups.handle(e.action, e.group, dict(e.settings))
        except errors.MetaqError as exc:
            log.warning("group_settings %s %s refused: %s", e.action, e.group or "", exc)
            return self.error_reply(exc, e.opaque)
        return encode_result(200, json.dumps(result, sort_keys=True).encode("utf-8"), e.opaque)
