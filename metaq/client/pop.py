"""``SimpleConsumer``: per-message acknowledgement from Python (docs/python-client.md "Per-message acknowledgement",
docs/messaging.md "Per-message acknowledgement (POP)"), over the text ``receive``, ``ack`` and ``change_invisible``.

Any number of SimpleConsumers of one group share a topic, whatever its partition count: each ``receive`` gets
messages no other consumer of the group holds, each invisible to the others for ``invisible_ms``; ``ack`` ends a
message, one not acknowledged in time comes back (``attempt`` + 1), and past the broker's maximum attempts it goes to
the group's dead-letter topic ``%DLQ%<group>``. Blocking sockets, no threads of its own (a ``BrokerConnection``).
"""

import time

from metaq import limits
from metaq.pop import limits as pop_limits
from metaq.client.connection import BrokerConnection
from metaq.client.message import Message
from metaq.client.replies import reply_error
from metaq.pop.wire import Ack, ChangeInvisible, Receive, decode_ack_body, decode_received
from metaq.protocol import events as ev
from metaq.protocol.message import Record

__all__ = ["SimpleConsumer", "Received"]


class Received:
    """A message handed out: ``message`` (a ``Message``: body, attribute, properties, partition, offset), its
    ``attempt`` (1 the first time), its ``handle`` (what ``ack`` and ``change_invisible`` take) and ``deadline_ms``
    (when it becomes visible again unless acknowledged)."""

    __slots__ = ("message", "attempt", "handle", "deadline_ms")

    def __init__(self, message, attempt, handle, deadline_ms):
        self.message, self.attempt, self.handle, self.deadline_ms = message, attempt, handle, deadline_ms

    def __repr__(self):
        return "Received(%s-%d attempt %d)" % (self.message.partition, self.message.offset, self.attempt)


class SimpleConsumer:
    """``SimpleConsumer(url, group, topic, invisible_ms=30000, fifo=False, security=None)``: ``url`` a
    ``meta://host:port`` URL (its connection is the consumer's to close) or a ``BrokerConnection``. ``fifo``: the
    messages of one message group (the ``__SHARDINGKEY`` property, ``Message(properties=...)``) come one at a time,
    in order."""

    def __init__(self, url, group, topic, invisible_ms=30_000, fifo=False, security=None, timeout=10.0):
        limits.validate_group(group)
        limits.validate_topic(topic)
        self._own = isinstance(url, str)
        self.conn = BrokerConnection(url, security=security) if self._own else url
        self.group, self.topic, self.invisible_ms, self.fifo, self.timeout = group, topic, invisible_ms, fifo, timeout

    def receive(self, max_messages=pop_limits.POP_MAX_BATCH, invisible_ms=None, wait_s=0.0):
        """Up to ``max_messages`` ``Received``; with ``wait_s``, the broker holds the request until some come (a new
        message, or one whose invisible time ended) or the wait ends (then ``[]``; the broker's ``max_wait_ms``
        bounds one request, so a longer wait asks again)."""
        deadline = time.monotonic() + wait_s
        while True:
            wait_ms = max(0, min(limits.MAX_WAIT_MS, int((deadline - time.monotonic()) * 1000)))
            reply = self.conn.call(Receive(self.topic, self.group, max_messages, invisible_ms or self.invisible_ms,
                                           self.fifo, 0, wait_ms), timeout=self.timeout + wait_ms / 1000.0)
            if not isinstance(reply, ev.Result) or reply.code != 200:
                raise reply_error(reply, "receive %s %s" % (self.topic, self.group))
            got = [Received(Message.from_record(self.topic, it.partition, it.offset,
                                                Record(it.msg_id, it.flag, it.data, it.checksum)),
                            it.attempt, it.handle, it.deadline_ms) for it in decode_received(reply.body)]
            if got or time.monotonic() >= deadline:
                return got

    def ack(self, *received):
        """Acknowledge ``Received`` (or handles); returns per one None or the reason the broker refused it (an
        expired handle, one of an older delivery)."""
        handles = [r.handle if isinstance(r, Received) else r for r in received]
        out = []
        for i in range(0, len(handles), pop_limits.POP_MAX_ACK_HANDLES):
            chunk = handles[i:i + pop_limits.POP_MAX_ACK_HANDLES]
            reply = self.conn.call(Ack(self.topic, self.group, tuple(chunk), 0), timeout=self.timeout)
            if not isinstance(reply, ev.Result) or reply.code != 200:
                raise reply_error(reply, "ack %s %s" % (self.topic, self.group))
            out.extend(decode_ack_body(reply.body))
        return out

    def change_invisible(self, received, invisible_ms):
        """Keep ``received`` invisible for ``invisible_ms`` from now; returns (and sets on it) the new handle."""
        handle = received.handle if isinstance(received, Received) else received
        reply = self.conn.call(ChangeInvisible(self.topic, self.group, handle, invisible_ms, 0), timeout=self.timeout)
        if not isinstance(reply, ev.Result) or reply.code != 200:
            raise reply_error(reply, "change_invisible %s %s" % (self.topic, self.group))
        new = bytes(reply.body).decode("ascii")
        if isinstance(received, Received):
            received.handle = new
        return new

    def close(self):
        if self._own:
            self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


