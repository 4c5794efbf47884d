"""Which client of a consumer group holds which queue: the lock table of RocketMQ's orderly consumers.

An orderly consumer (``PushConsumer(orderly=True)``) processes a queue only while the broker
says the queue is its own: it asks with LOCK_BATCH_MQ (41) for the queues its rebalance gave it,
renews them by asking again (the C++ client every 20 s, Java's ``lockAll`` too), and gives them
back with UNLOCK_BATCH_MQ (42) when its rebalance takes them away or it shuts down. The rules
are RocketMQ's ``RebalanceLockManager``:

* a queue is locked by at most one client of a group at a time; other groups are independent;
* asking again for a queue one already holds renews it; asking for a queue another client
  holds is refused while that lock is live;
* a lock not renewed for ``expiry_s`` (RocketMQ: 60 s) is expired: anyone of the group may take
  it, and ``expire`` drops it;
* only the holder unlocks.

Ours adds: a lock also ends when its holder unregisters (``release_client``) or when the
connection it was taken or last renewed through closes (``connection_closed``), so a consumer
killed with kill -9 frees its queues at once instead of after the expiry. The table holds at
most ``max_locks`` entries (``limits.MAX_REMOTING_LOCKS``): past it a new queue is refused (the
expired entries are dropped first), counted in ``full_refusals``.

Pure bookkeeping: no socket, no clock (``now`` is monotonic seconds, passed in), no logging.
A connection is any hashable object.
"""

from typing import NamedTuple

from metaq.server.remoting import limits as remoting_limits


class LockEntry(NamedTuple):
    client_id: str
    conn: object
    renewed: float  # when it was taken or last renewed (monotonic seconds)


class LockTable:
    def __init__(self, expiry_s, max_locks=remoting_limits.MAX_REMOTING_LOCKS):
        if expiry_s <= 0:
            raise ValueError("the lock expiry must be positive, got %r" % (expiry_s,))
        self.expiry_s = expiry_s
        self.max_locks = max_locks
        self.full_refusals = 0  # queues refused because the table was full
        self._locks = {}  # (group, topic, queue_id) -> LockEntry
        self._by_conn = {}  # conn -> {(group, topic, queue_id)} held through it

    def __len__(self):
        return len(self._locks)

    def _live(self, entry, now):
        return now - entry.renewed <= self.expiry_s

    def holder(self, group, topic, queue_id, now):
        """The client id holding the queue now, or None (free or expired)."""
        entry = self._locks.get((group, topic, queue_id))
        return entry.client_id if entry is not None and self._live(entry, now) else None

    def lock(self, group, client_id, conn, queues, now):
        """Lock or renew ``queues`` (``(topic, queue_id)`` pairs) for ``client_id`` of ``group``, who asks
        through ``conn``; returns those it now holds, in the order asked, each once.

        A queue held live by another client of the group is left out, and so is a new queue when the
        table is full even after dropping the expired entries."""
        got = []
        purged = False
        for topic, queue_id in dict.fromkeys(queues):
            key = (group, topic, queue_id)
            entry = self._locks.get(key)
            if entry is not None and entry.client_id != client_id and self._live(entry, now):
                continue  # another client's live lock
            if entry is None and len(self._locks) >= self.max_locks:
                if not purged:
                    self.expire(now)
                    purged = True
                if len(self._locks) >= self.max_locks:
                    self.full_refusals += 1
                    continue
            if entry is not None:
                self._unindex(entry.conn, key)
            self._locks[key] = LockEntry(client_id, conn, now)
            self._by_conn.setdefault(conn, set()).add(key)
            got.append((topic, queue_id))
        return got

    def unlock(self, group, client_id, conn, queues):
        """Release those of ``queues`` that ``client_id`` holds through ``conn`` (expired or not); returns them.

        A queue another client holds, or that this client holds through another connection, is left as it is."""
        released = []
        for topic, queue_id in dict.fromkeys(queues):
            key = (group, topic, queue_id)
            entry = self._locks.get(key)
            if entry is not None and entry.client_id == client_id and entry.conn is conn:
                self._drop(key, entry)
                released.append((topic, queue_id))
        return released

    def release_client(self, group, client_id, conn):
        """Everything ``client_id`` holds in ``group`` through ``conn`` (it unregistered); returns the count."""
        keys = [k for k in self._by_conn.get(conn, ()) if k[0] == group and self._locks[k].client_id == client_id]
        for key in keys:
            self._drop(key, self._locks[key])
        return len(keys)

    def connection_closed(self, conn):
        """Everything held through ``conn``; returns the count (time grows with what ``conn`` held)."""
        keys = self._by_conn.pop(conn, ())
        for key in keys:
            del self._locks[key]
        return len(keys)

    def expire(self, now):
        """Drop every lock not renewed for more than ``expiry_s``; returns the count."""
        dead = [(k, e) for k, e in self._locks.items() if not self._live(e, now)]
        for key, entry in dead:
            self._drop(key, entry)
        return len(dead)

    def held(self, group, client_id, now):
        """The ``(topic, queue_id)`` pairs ``client_id`` holds live in ``group``, sorted."""
        return sorted((k[1], k[2]) for k, e in self._locks.items()
                      if k[0] == group and e.client_id == client_id and self._live(e, now))

    def _drop(self, key, entry):
        del self._locks[key]
        self._unindex(entry.conn, key)

    def _unindex(self, conn, key):
        keys = self._by_conn.get(conn)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_conn[conn]
