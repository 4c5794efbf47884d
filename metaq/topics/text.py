"""``topic <action> <name> <settings> <opaque>`` (``topics/wire.py``) on the text port: the topic table's service
(``topics/service.py``) asked, its answer sent as JSON.

A request runs on a greenlet of its connection's own (a change waits for the table's fsync, a delete for its files'
removal); ``list`` names only the topics the user may publish to or read (``Guard.known_to``). The permission a
change needs (admin) is checked by the dispatcher from the command's declaration, before this handler runs.
"""

import json
import logging

from metaq import errors
from metaq.protocol.text import encode_result

log = logging.getLogger(__name__)

NO_WAIT = 0


class TextTopics:
    """The ``topic`` handler over the topic table's service."""

    def __init__(self, topics, known_to, error_reply):
        """``topics``: the ``TopicAdmin`` (None: ``topic`` answered 400); ``known_to(session)``: the names a user
        may see (the guard's); ``error_reply(exc, opaque)``: the dispatcher's one error→reply mapping."""
        self.topics = topics
        self.known_to = known_to
        self.error_reply = error_reply

    def topic(self, e, conn):
        if self.topics is None:
            return encode_result(400, b"the topic table is not served here", e.opaque), NO_WAIT
        conn.spawn(self._answer, e, self.known_to(conn.session))
        return None, NO_WAIT

    def _answer(self, e, known):
        try:
            result = self.topics.handle(e.action, e.name, dict(e.settings), known)
        except errors.MetaqError as exc:
            log.warning("topic %s %s refused: %s", e.action, e.name or "", exc)
            return self.error_reply(exc, e.opaque)
        return encode_result(200, json.dumps(result, sort_keys=True).encode("utf-8"), e.opaque)
