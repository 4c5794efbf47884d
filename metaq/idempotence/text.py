"""The text handler of ``put_idem`` (``idempotence/wire.py``; docs/spark.md "The idempotent producer"): a put
stored once per ``(pid, topic, partition, seq)``; a duplicate is answered with the original's id and offset and
`` dup``, once the original is durable (as any put is answered, ``ack_put``).
"""

from metaq import errors
from metaq.idempotence.wire import DUPLICATE_MARK
from metaq.protocol.text import encode_result
from metaq.server.clock import now_ms
from metaq.server.text.putchecks import uncompressed, verified_checksum

NO_WAIT = 0


class TextIdempotentPuts:
    """``put_idem`` over the put path (its permission is the topic-write decision every put asks)."""

    def __init__(self, put_path, max_body, *, ack_put, error_reply):
        """``ack_put(e, r, now, reply, conn)``: how a stored put is answered (the dispatcher's, per the flush and
        replication modes); ``error_reply(exc, opaque)``: the dispatcher's one error→reply mapping."""
        self.put_path = put_path
        self.max_body = max_body
        self.ack_put = ack_put
        self.error_reply = error_reply

    def put_idem(self, e, conn):
        path = self.put_path
        try:
            path.check_write(e.topic, conn.session)
            verified_checksum(e, attribute=False)  # the stored data gets the identity and a new checksum
            e = uncompressed(e, self.max_body)
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return self.error_reply(exc, e.opaque), NO_WAIT
        now = now_ms()
        try:
            r, _position, duplicate = path.append_idempotent(e.topic, e.partition, e.flag, e.body, now,
                                                             e.producer_id, e.sequence,
                                                             owner=conn.session.user if conn.session else None)
        except errors.MetaqError as exc:
            return self.error_reply(exc, e.opaque), NO_WAIT
        body = b"%d %d %d" % (r.msg_id, r.partition, r.offset)
        if duplicate:
            body += b" " + DUPLICATE_MARK
            if not r.log_end:  # the original is gone (retention): nothing to wait for
                return encode_result(200, body, e.opaque), NO_WAIT
        return self.ack_put(e, r, now, encode_result(200, body, e.opaque), conn)
