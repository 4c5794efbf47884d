"""The text handlers of ``receive``, ``ack`` and ``change_invisible`` (``pop/wire.py``; docs/messaging.md
"Per-message acknowledgement (POP)"): each a call of ``PopService`` and its reply. The permission (consume as the
group, subscribe to the topic) is the dispatcher's, from the commands' declarations. A receive with a wait holds
the connection (its later requests wait) until it answers, within the broker's ``limits.max_wait_ms``: a consumer
long-polls on a connection of its own."""

from metaq.pop.wire import encode_ack_body, encode_received
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import encode_result

NO_WAIT = 0


class TextPop:
    """The three handlers over ``service`` (a ``PopService``)."""

    def __init__(self, service, max_wait_ms):
        self.service, self.max_wait_ms = service, max_wait_ms

    def receive(self, e, conn):
        """Received messages are charged to the user's fetch rate (``Connection.pace``, ``Guard.pace``): a receive
        first waits what its user owes, then takes, so its messages' invisible time is never spent waiting."""
        conn.pace("fetch", 0)
        got = self.service.receive(e.group, e.topic, e.max_messages, e.invisible_ms, e.fifo,
                                   wait_ms=min(e.max_wait_ms, self.max_wait_ms))
        body = encode_received([(r.partition, r.offset, r.attempt, r.deadline_ms, r.handle, r.record.msg_id,
                                 r.record.flag, r.record.data, metaq_checksum(r.record.data)) for r in got])
        conn.pace("fetch", sum(len(r.record.data) for r in got), wait=False)
        return encode_result(200, body, e.opaque), NO_WAIT

    def ack(self, e, conn):
        return encode_result(200, encode_ack_body(self.service.ack(e.group, e.topic, list(e.handles))),
                             e.opaque), NO_WAIT

    def change_invisible(self, e, conn):
        new = self.service.change_invisible(e.group, e.topic, e.handle, e.invisible_ms)
        return encode_result(200, new.encode("ascii"), e.opaque), NO_WAIT
