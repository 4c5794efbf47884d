"""Request-reply routing (docs/messaging.md "Request-reply"): a reply, from either protocol, handed to the connection of
the requester that waits for it.

Text-protocol requesters wait here: ``open`` enters a request into the pending table (``reqreply.state``:
bounded per connection and on the broker) under a correlation id of our making, and ``wait`` parks the
request's greenlet until its reply comes or its timeout passes. RocketMQ requesters wait in their own client:
a reply naming one (``REPLY_TO_CLIENT`` = its client id) is pushed to the connection its last producer
heartbeat came over (``remote``, set by the remoting server: PUSH_REPLY_MESSAGE_TO_CLIENT).

``route`` raises ``errors.NotFound`` when no requester waits for a reply (it timed out, its connection closed,
or it never existed): the replier gets that answer, and nothing is kept. Replies are not stored: a reply lives
only on its way from the replier's connection to the requester's.
"""

import os
import time
from typing import NamedTuple, Optional

import gevent
from gevent.event import AsyncResult

from metaq import errors
from metaq.reqreply.records import TEXT_REQUESTER, routing
from metaq.reqreply.state import PendingRequests


class ReplyMessage(NamedTuple):
    """A reply as it travels: MetaQ's ``flag`` and ``data`` (properties in the attribute), the properties parsed,
    the replier's address ``(ip, port)`` and when it was born (ms)."""

    topic: str
    flag: int
    data: bytes
    properties: dict
    born_host: Optional[tuple]
    born_ms: int


#: What ``wait`` returns when the broker stops before the reply came.
STOPPING = "stopping"


class ReplyRouter:
    def __init__(self, broker_id, cluster, max_total, per_connection, quota=None):
        """``quota(user, current)``: the quota decision of requests waiting per user (``reqreply.state``)."""
        self.broker_id = broker_id
        self.cluster = cluster
        self.table = PendingRequests(max_total, per_connection, quota)
        #: ``remote(client_id, ReplyMessage)`` -> whether a RocketMQ client of that id was found (and the push
        #: queued); None without a remoting port. Unavailable when it was found but cannot take more now.
        self.remote = None
        self.counts = {"requests": 0, "replies_routed": 0, "replies_unrouted": 0, "replies_refused": 0,
                       "request_timeouts": 0}

    def requester_name(self, conn):
        """``REPLY_TO_CLIENT`` of a text requester: ``metaq-text@<broker id>/<connection id>``."""
        return "%s%d/%d" % (TEXT_REQUESTER, self.broker_id, conn.conn_id)

    def open(self, conn, timeout_s):
        """Enter a text request of ``conn``; ``(correlation id, waiter)``. Unavailable past a bound, QuotaExceeded
        past its user's quota."""
        correlation_id = os.urandom(16).hex()
        waiter = AsyncResult()
        session = getattr(conn, "session", None)
        self.table.add(correlation_id, conn, waiter, time.monotonic() + timeout_s,
                       session.user if session is not None else None)
        self.counts["requests"] += 1
        return correlation_id, waiter

    def cancel(self, correlation_id):
        self.table.remove(correlation_id)

    def wait(self, correlation_id, waiter, timeout_s):
        """The ReplyMessage for the request, None when none came within ``timeout_s`` (or its connection
        closed), ``STOPPING`` when the broker stops first; the request leaves the table either way."""
        try:
            return waiter.get(timeout=timeout_s)
        except gevent.Timeout:
            self.counts["request_timeouts"] += 1
            return None
        finally:
            self.table.remove(correlation_id)

    def route(self, reply):
        """Hand ``reply`` to its requester. ClientError without routing properties, NotFound when no requester
        waits for it, Unavailable when its RocketMQ requester's connection cannot take more now."""
        correlation_id, to = routing(reply.properties)
        if to.startswith(TEXT_REQUESTER):
            entry = self.table.peek(correlation_id)
            if entry is None or getattr(entry.conn, "closed", False):
                self.counts["replies_unrouted"] += 1
                raise errors.NotFound("no request with correlation id %s waits for a reply: it timed out, its "
                                      "requester's connection closed, or it was answered already" % correlation_id)
            # A reply is held until the requester's socket takes it: it counts in that connection's reply budget
            # (``limits.max_reply_bytes``, as a get's data does), so a requester that does not read its replies
            # gets no more of them (the replier is told to try again; the request waits on, or times out).
            budget = getattr(entry.conn, "replies", None)
            if budget is not None:
                if budget.would_wait(len(reply.data)):
                    self.counts["replies_refused"] += 1
                    raise errors.Unavailable("the requester of correlation id %s does not read its replies (its "
                                             "connection holds %d bytes of them): try again" % (correlation_id,
                                                                                              budget.held))
                budget.reserve(len(reply.data), lambda: False)  # does not wait: there is room
            self.table.take(correlation_id)
            entry.waiter.set(reply)
        elif self.remote is None or not self.remote(to, reply):
            self.counts["replies_unrouted"] += 1
            raise errors.NotFound("push reply message fail, channel of <%s> not found: the requester went away"
                                  % to)
        self.counts["replies_routed"] += 1

    def connection_closed(self, conn):
        """A connection ended: its waiting requests leave the table (their greenlets end with it)."""
        for entry in self.table.connection_closed(conn):
            entry.waiter.set(None)

    def close(self):
        """The broker is stopping: every waiting request is answered now (``STOPPING``), none holds the shutdown."""
        for entry in self.table.drain():
            entry.waiter.set(STOPPING)
