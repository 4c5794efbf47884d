"""Which RocketMQ clients are alive in which consumer group (HEART_BEAT bookkeeping).

A client joins each consumer group of its heartbeat, on the connection the
heartbeat came over. It leaves a group on UNREGISTER_CLIENT, when that
connection closes, or when it sends no heartbeat for ``timeout_s`` (RocketMQ's
120 s channel expiry). ``on_change(group)`` is called whenever a group's
membership changes, so the server can tell the group's clients to rebalance
(NOTIFY_CONSUMER_IDS_CHANGED). Time comes in as an argument (monotonic seconds).
"""

from typing import NamedTuple


class Member(NamedTuple):
    conn: object
    last_seen: float


class ClientRegistry:
    def __init__(self, timeout_s, on_change=None):
        self.timeout_s = timeout_s
        self._on_change = on_change or (lambda group: None)
        self._groups = {}  # group -> {client_id: Member}

    def heartbeat(self, conn, hb, now):
        """Record a ``HeartbeatData`` that arrived on ``conn``; returns the groups the client newly joined."""
        joined = []
        for consumer in hb.consumers:
            members = self._groups.setdefault(consumer.group_name, {})
            old = members.get(hb.client_id)
            members[hb.client_id] = Member(conn, now)
            if old is None or old.conn is not conn:
                joined.append(consumer.group_name)
        for group in joined:
            self._on_change(group)
        return joined

    def unregister(self, client_id, group=None):
        """Remove ``client_id`` from ``group`` (every group when None); returns the groups it left."""
        groups = [group] if group else list(self._groups)
        return self._remove(lambda g, cid, m: g in groups and cid == client_id)

    def connection_closed(self, conn):
        """Remove every client registered through ``conn``; returns the groups that changed."""
        return self._remove(lambda g, cid, m: m.conn is conn)

    def expire(self, now):
        """Remove clients silent for more than ``timeout_s``; returns the groups that changed."""
        limit = now - self.timeout_s
        return self._remove(lambda g, cid, m: m.last_seen < limit)

    def _remove(self, doomed):
        changed = []
        for group, members in list(self._groups.items()):
            gone = [cid for cid, m in members.items() if doomed(group, cid, m)]
            for cid in gone:
                del members[cid]
            if not members:
                del self._groups[group]
            if gone:
                changed.append(group)
        for group in changed:
            self._on_change(group)
        return changed

    def consumers(self, group):
        """The live client ids of ``group``, sorted."""
        return sorted(self._groups.get(group, ()))

    def connections(self, group):
        """The distinct connections of ``group``'s live clients."""
        seen = []
        for m in self._groups.get(group, {}).values():
            if all(m.conn is not c for c in seen):
                seen.append(m.conn)
        return seen

    def groups(self):
        return sorted(self._groups)
