"""``put_at``, ``cancel`` and ``timers`` (``protocol/timerwire.py``; README "Any delivery time", "Cancel").

``put_at`` is a put with a delivery time: ``PutPath.append(due_ms=)`` stores its ENTRY in the timer topic
(``server/timers.py``) and it is answered as ``put_delayed`` is, once durable. ``cancel`` is answered once its
CANCEL record is durable (as a put), or at once when the message was delivered, cancelled before or is unknown.
"""

from typing import NamedTuple

from metaq import errors
from metaq.protocol.text import encode_result
from metaq.protocol.timer import TIMER_TOPIC, parse_when
from metaq.protocol.timerwire import format_rows
from metaq.server.clock import now_ms
from metaq.server.guard import ADMIN
from metaq.server.text.putchecks import uncompressed, verified_checksum

NO_WAIT = 0


class TextTimers:
    """The three handlers, given the dispatcher they belong to (its put path and replies) and the timer service."""

    def __init__(self, dispatcher, timers, error_reply):
        self.d = dispatcher
        self.timers = timers
        self.error_reply = error_reply

    def put_at(self, e, conn):
        d = self.d
        path = d.put_path
        now = now_ms()
        try:
            path.check_write(e.topic, conn.session)
            due = parse_when(e.when, now)
            e = uncompressed(e._replace(checksum=verified_checksum(e)), d.max_body)
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return self.error_reply(exc, e.opaque), NO_WAIT
        try:
            r = path.append(e.topic, e.partition, e.flag, e.body, now, checksum=e.checksum, due_ms=due)
        except errors.MetaqError as exc:
            return self.error_reply(exc, e.opaque), NO_WAIT
        return d.ack_put(e, r, now, encode_result(200, b"%d %d -1" % (r.msg_id, r.partition), e.opaque), conn)

    def cancel(self, e, conn):
        d = self.d
        now = now_ms()
        if self.timers is None:
            raise errors.ClientError("this broker has no timer store")
        if d.guard.enabled:
            d.guard.require(conn.session, ADMIN)  # any message's id: an operator's (or the admin tool's) request
        d.put_path.check_writable()
        outcome, r = self.timers.cancel(e.msg_id, now)
        if r is None:
            return encode_result(404, outcome.encode(), e.opaque), NO_WAIT
        return d.ack_put(_Cancelled(TIMER_TOPIC, e.opaque), r, now, encode_result(200, outcome.encode(), e.opaque),
                         conn)

    def list(self, e, conn):
        if self.timers is None:
            raise errors.ClientError("this broker has no timer store")
        if self.d.guard.enabled:
            self.d.guard.require(conn.session, ADMIN)
        rows = self.timers.list(None if e.topic == "*" else e.topic, e.limit)
        return encode_result(200, format_rows(rows), e.opaque), NO_WAIT


class _Cancelled(NamedTuple):
    """What ``ack_put`` needs of a cancel: its CANCEL record's topic, and the opaque of the reply."""

    topic: str
    opaque: int
