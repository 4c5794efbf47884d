"""The text protocol's request-reply commands, ``request`` and ``reply`` (our extension; docs/messaging.md
"Request-reply", ``metaq.reqreply.records``, ``metaq.reqreply.service``).

``request``: the request is entered in the pending table (503 past its bounds, nothing stored), its message
stored with ``CORRELATION_ID``, ``REPLY_TO_CLIENT``, ``TTL`` and ``CLUSTER`` added, and, from a greenlet of
its own, answered with the reply (``value``: one record, msgId 0) or ``result 504`` when none came within its
timeout. An error storing it is answered as a put's would be.

``reply``: the reply is routed to its requester's connection (text or RocketMQ): ``result 200`` once handed
over, 404 when nobody waits for it. It is not stored.
"""

from metaq import errors
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_record
from metaq.reqreply.records import properties_of, reply_topic, request_properties, with_properties
from metaq.protocol.text import encode_result, encode_value_header
from metaq.clock import now_ms
from metaq.auth.acl import PUB
from metaq.serving.putchecks import uncompressed, verified_checksum
from metaq.reqreply.service import STOPPING, ReplyMessage


class TextRequests:
    """``error_reply(exc, opaque)``: the dispatcher's one error→reply mapping."""

    def __init__(self, router, put_path, guard, max_timeout_ms, error_reply, max_body):
        self.max_body = max_body
        self.router = router
        self.path = put_path
        self.guard = guard
        self.max_timeout_ms = max_timeout_ms
        self.error_reply = error_reply

    def request(self, e, conn):
        """``request``: None (answered from its greenlet) or the refusal now."""
        self.path.check_write(e.topic, conn.session)
        # the checks of a put: checksum, attribute block, no put_idem identity; a compressed body decompressed
        e = uncompressed(e._replace(checksum=verified_checksum(e)), self.max_body)
        timeout_ms = min(e.timeout_ms, self.max_timeout_ms)
        router = self.router
        correlation_id, waiter = router.open(conn, timeout_ms / 1000.0)
        try:
            flag, data = with_properties(e.flag, e.body, request_properties(
                correlation_id, router.requester_name(conn), timeout_ms, router.cluster))
        except errors.MetaqError:
            router.cancel(correlation_id)
            raise
        # the request's bytes are the greenlet's to drop once stored: its arguments live as long as it waits
        conn.spawn(self._serve, [e, flag, data], conn, correlation_id, waiter, timeout_ms)
        return None

    def _serve(self, job, conn, correlation_id, waiter, timeout_ms):
        e, flag, data = job
        job.clear()
        opaque = e.opaque
        path = self.path
        now = now_ms()
        try:
            r = path.append(e.topic, e.partition, flag, data, now, checksum=metaq_checksum(data))
            del data  # stored: the wait for the reply holds none of the request (150 waiting 4 MiB requests: 1.3 GB)
            path.durable(e.topic, r.partition, r.log_end, now)
        except errors.MetaqError as exc:
            self.router.cancel(correlation_id)
            return self.error_reply(exc, opaque)
        del e
        reply = self.router.wait(correlation_id, waiter, timeout_ms / 1000.0)
        if reply is STOPPING:
            return encode_result(503, b"the broker is stopping: no reply will come (correlation id %s)"
                                 % correlation_id.encode(), opaque)
        if reply is None:
            return encode_result(504, b"no reply within %d ms (correlation id %s): the request was stored, "
                                 b"no consumer answered it in time" % (timeout_ms, correlation_id.encode()),
                                 opaque)
        record = encode_record(0, reply.flag, reply.data)
        out = [encode_value_header(len(record), opaque), record]
        # the router reserved the reply's data in this connection's budget; the send releases what ``out`` holds
        conn.replies.release(len(reply.data))
        conn.replies.reserve(len(out[0]) + len(record), lambda: conn.closed)  # connection.held_by(out)
        return out

    def reply(self, e, conn):
        """``reply``: the reply bytes now (200, or an error raised for the dispatcher to answer)."""
        topic = reply_topic(self.router.cluster)
        if self.guard.enabled:
            self.guard.require(conn.session, PUB, "topic", topic)
        e = uncompressed(e._replace(checksum=verified_checksum(e)), self.max_body)
        _tags, props = properties_of(e.flag, e.body)
        host = conn.address if isinstance(conn.address, tuple) else None
        self.router.route(ReplyMessage(topic, e.flag, e.body, props, host[:2] if host else None, now_ms()))
        return encode_result(200, b"delivered", e.opaque)
