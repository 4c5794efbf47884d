"""Requests waiting for their replies (docs/messaging.md "Request-reply"): pure, time passed in, no gevent.

A text-protocol ``request`` is entered here, under its correlation id, before its message is stored, with the
connection it came over, a ``waiter`` (whatever the caller wakes it with) and its deadline. A reply takes its
entry out (``take``); so do the request's own timeout (``remove``), its connection closing
(``connection_closed``) and the sweep of entries past their deadline (``expire``, in case a waiter was lost).
Two bounds: ``per_connection`` entries per connection and ``max_total`` on the broker; ``add`` past either
raises ``errors.Unavailable`` (503) and records nothing. A third, per user: ``quota(user, current)`` (the quota
decision, ``metaq.auth.quotas``: ``request_waiters``) raises ``errors.QuotaExceeded`` when the user already has
its quota of requests waiting, so one user cannot take the broker's whole ``max_total``. Every operation costs
what it touches: no scan of the whole table but ``expire``'s.
"""

from typing import NamedTuple

from metaq import errors
from metaq.reqreply import limits as reqreply_limits


class Pending(NamedTuple):
    conn: object
    waiter: object
    deadline: float
    user: object = None


class PendingRequests:
    def __init__(self, max_total=reqreply_limits.MAX_PENDING_REQUESTS,
                 per_connection=reqreply_limits.MAX_PENDING_REQUESTS_PER_CONNECTION, quota=None):
        """``quota(user, current)``: raises when ``user``, with ``current`` requests waiting, may not add one."""
        self.max_total = max_total
        self.per_connection = per_connection
        self.quota = quota
        self._by_id = {}  # correlation id -> Pending
        self._by_conn = {}  # conn -> {correlation id}
        self._by_user = {}  # user -> requests waiting
        self.refused = 0  # adds refused past a bound

    def __len__(self):
        return len(self._by_id)

    def __contains__(self, correlation_id):
        return correlation_id in self._by_id

    def waiting_on(self, conn):
        """How many requests of ``conn`` wait."""
        return len(self._by_conn.get(conn, ()))

    def by_user(self):
        """``{user: requests waiting}`` (stats)."""
        return dict(self._by_user)

    def add(self, correlation_id, conn, waiter, deadline, user=None):
        """Enter a request of ``user``; Unavailable past a bound, QuotaExceeded past the user's quota, ClientError
        for a correlation id already waiting."""
        if correlation_id in self._by_id:
            raise errors.ClientError("a request with correlation id %s is already waiting" % correlation_id)
        if self.waiting_on(conn) >= self.per_connection:
            self.refused += 1
            raise errors.Unavailable("too many requests waiting for replies on this connection: the limit is %d"
                                     % self.per_connection)
        if self.quota is not None:
            try:
                self.quota(user, self._by_user.get(user, 0))
            except errors.QuotaExceeded:
                self.refused += 1
                raise
        if len(self._by_id) >= self.max_total:
            self.refused += 1
            raise errors.Unavailable("too many requests waiting for replies on the broker: the limit is %d"
                                     % self.max_total)
        self._by_id[correlation_id] = Pending(conn, waiter, deadline, user)
        self._by_conn.setdefault(conn, set()).add(correlation_id)
        self._by_user[user] = self._by_user.get(user, 0) + 1

    def peek(self, correlation_id):
        """The entry of ``correlation_id`` (left in the table), or None when none waits."""
        return self._by_id.get(correlation_id)

    def take(self, correlation_id):
        """The entry of ``correlation_id``, taken out (a reply arrived), or None when none waits."""
        entry = self._by_id.pop(correlation_id, None)
        if entry is not None:
            self._unindex(entry.conn, correlation_id)
            self._uncount(entry.user)
        return entry

    def remove(self, correlation_id):
        """Forget ``correlation_id`` (its request timed out or failed); whether it was there."""
        return self.take(correlation_id) is not None

    def connection_closed(self, conn):
        """Take out every request of ``conn``; returns their entries."""
        ids = self._by_conn.pop(conn, ())
        entries = [self._by_id.pop(cid) for cid in ids if cid in self._by_id]
        for entry in entries:
            self._uncount(entry.user)
        return entries

    def drain(self):
        """Take out every entry (the broker is stopping); returns them."""
        entries = list(self._by_id.values())
        self._by_id.clear()
        self._by_conn.clear()
        self._by_user.clear()
        return entries

    def _uncount(self, user):
        n = self._by_user.get(user, 0) - 1
        if n > 0:
            self._by_user[user] = n
        else:
            self._by_user.pop(user, None)

    def expire(self, now):
        """Take out the entries whose deadline has passed; returns ``[(correlation id, entry)]``."""
        gone = [(cid, e) for cid, e in self._by_id.items() if e.deadline <= now]
        for cid, _entry in gone:
            self.take(cid)
        return gone

    def _unindex(self, conn, correlation_id):
        ids = self._by_conn.get(conn)
        if ids is not None:
            ids.discard(correlation_id)
            if not ids:
                del self._by_conn[conn]
