"""``put_at``, ``cancel`` and ``timers`` (``timers/wire.py``; docs/messaging.md "Any delivery time", "Cancel").

``put_at`` is a put with a delivery time: ``PutPath.append(due_ms=)`` stores its ENTRY in the timer topic
(``timers/service.py``) and it is answered as ``put_delayed`` is, once durable. ``cancel`` is answered once its
CANCEL record is durable (as a put), or at once when the message was delivered, cancelled before or is unknown.
"""

from typing import NamedTuple

from metaq import errors
from metaq.protocol.text import encode_result
from metaq.clock import now_ms
from metaq.serving.putchecks import uncompressed, verified_checksum
from metaq.timers.records import TIMER_TOPIC, parse_when
from metaq.timers.wire import format_rows

NO_WAIT = 0


class TextTimers:
    """The three handlers, over the put path and the timer service (None: no timer store). ``cancel`` and
    ``timers`` need the admin permission, ``put_at`` the topic-write decision (``timers.wire``)."""

    def __init__(self, put_path, timers, max_body, *, ack_put, error_reply):
        """``ack_put(e, r, now, reply, conn)``: how a stored put is answered (the dispatcher's, per the flush and
        replication modes); ``error_reply(exc, opaque)``: the dispatcher's one error→reply mapping."""
        self.put_path = put_path
        self.timers = timers
        self.max_body = max_body
        self.ack_put = ack_put
        self.error_reply = error_reply

    def put_at(self, e, conn):
        path = self.put_path
        now = now_ms()
        try:
            path.check_write(e.topic, conn.session)
            due = parse_when(e.when, now)
            e = uncompressed(e._replace(checksum=verified_checksum(e)), self.max_body)
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return self.error_reply(exc, e.opaque), NO_WAIT
        try:
            r = path.append(e.topic, e.partition, e.flag, e.body, now, checksum=e.checksum, due_ms=due,
                            owner=conn.session.user if conn.session else None)
        except errors.MetaqError as exc:
            return self.error_reply(exc, e.opaque), NO_WAIT
        return self.ack_put(e, r, now, encode_result(200, b"%d %d -1" % (r.msg_id, r.partition), e.opaque), conn)

    def cancel(self, e, conn):
        now = now_ms()
        if self.timers is None:
            raise errors.ClientError("this broker has no timer store")
        self.put_path.check_writable()
        outcome, r = self.timers.cancel(e.msg_id, now)
        if r is None:
            return encode_result(404, outcome.encode(), e.opaque), NO_WAIT
        return self.ack_put(_Cancelled(TIMER_TOPIC, e.opaque), r, now, encode_result(200, outcome.encode(), e.opaque),
                            conn)

    def list(self, e, conn):
        if self.timers is None:
            raise errors.ClientError("this broker has no timer store")
        rows = self.timers.list(None if e.topic == "*" else e.topic, e.limit)
        return encode_result(200, format_rows(rows), e.opaque), NO_WAIT


class _Cancelled(NamedTuple):
    """What ``ack_put`` needs of a cancel: its CANCEL record's topic, and the opaque of the reply."""

    topic: str
    opaque: int
