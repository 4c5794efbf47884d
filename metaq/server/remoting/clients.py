"""Which RocketMQ clients are alive in which consumer group, and which connections are producers of which
producer group (``ProducerRegistry``) (HEART_BEAT bookkeeping).

A client joins each consumer group of its heartbeat, on the connection the
heartbeat came over. It leaves a group on UNREGISTER_CLIENT, when that
connection closes, or when it sends no heartbeat for ``timeout_s`` (RocketMQ's
120 s channel expiry). ``on_change(group)`` is called whenever a group's
membership changes, so the server can tell the group's clients to rebalance
(NOTIFY_CONSUMER_IDS_CHANGED). Time comes in as an argument (monotonic seconds).
"""

from typing import NamedTuple

from metaq import errors
from metaq.server.remoting import limits as remoting_limits


class Member(NamedTuple):
    conn: object
    last_seen: float
    broadcasting: bool = False  # its heartbeat's messageModel is BROADCASTING


class ClientRegistry:
    """``max_members`` bounds the (group, client) entries: a heartbeat that would add more is refused."""

    def __init__(self, timeout_s, on_change=None, max_members=remoting_limits.MAX_REMOTING_MEMBERS):
        self.timeout_s = timeout_s
        self.max_members = max_members
        self._on_change = on_change or (lambda group: None)
        self._groups = {}  # group -> {client_id: Member}
        self._by_conn = {}  # connection -> {(group, client_id)} registered through it
        self.members = 0  # (group, client) entries in _groups

    def heartbeat(self, conn, hb, now):
        """Record a ``HeartbeatData`` that arrived on ``conn``; returns the groups the client newly joined.

        ClientError (nothing recorded) when it would take the registry past ``max_members``."""
        groups = self._groups
        names = {c.group_name for c in hb.consumers}
        if len(names) > remoting_limits.MAX_HEARTBEAT_GROUPS:
            raise errors.ClientError("a heartbeat may name at most %d consumer groups, this one names %d"
                                     % (remoting_limits.MAX_HEARTBEAT_GROUPS, len(names)))
        new = sum(1 for c in names if hb.client_id not in groups.get(c, ()))
        if new and self.members + new > self.max_members:
            raise errors.ClientError("too many RocketMQ clients registered: the limit is %d (group, client) entries"
                                     % self.max_members)
        joined = []
        for consumer in hb.consumers:
            group = consumer.group_name
            members = groups.setdefault(group, {})
            old = members.get(hb.client_id)
            members[hb.client_id] = Member(conn, now, consumer.message_model == "BROADCASTING")
            if old is None:
                self.members += 1
            elif old.conn is not conn:
                self._unindex(old.conn, group, hb.client_id)
            if old is None or old.conn is not conn:
                self._by_conn.setdefault(conn, set()).add((group, hb.client_id))
                joined.append(group)
        for group in joined:
            self._on_change(group)
        return joined

    def _unindex(self, conn, group, client_id):
        keys = self._by_conn.get(conn)
        if keys is not None:
            keys.discard((group, client_id))
            if not keys:
                del self._by_conn[conn]

    def unregister(self, client_id, group=None):
        """Remove ``client_id`` from ``group`` (every group when None); returns the groups it left. Its time grows
        with the groups at most, never with their members (an UNREGISTER_CLIENT walked the whole registry: 7 ms
        each over 100,000 entries, a pipeline of them stalled every client)."""
        groups = [group] if group else [g for g, members in self._groups.items() if client_id in members]
        changed = []
        for name in groups:
            members = self._groups.get(name)
            member = members.get(client_id) if members is not None else None
            if member is None:
                continue
            self._unindex(member.conn, name, client_id)
            del members[client_id]
            self.members -= 1
            if not members:
                del self._groups[name]
            changed.append(name)
        for name in changed:
            self._on_change(name)
        return changed

    def connection_closed(self, conn):
        """Remove every client registered through ``conn``; returns the groups that changed (in time that
        grows with what ``conn`` registered, not with the whole registry)."""
        changed = {}  # group -> None: the groups in order, each once
        for group, cid in sorted(self._by_conn.pop(conn, ())):
            members = self._groups.get(group)
            if members is None or cid not in members or members[cid].conn is not conn:
                continue
            del members[cid]
            self.members -= 1
            if not members:
                del self._groups[group]
            changed[group] = None
        for group in changed:
            self._on_change(group)
        return list(changed)

    def expire(self, now):
        """Remove clients silent for more than ``timeout_s``; returns the groups that changed."""
        limit = now - self.timeout_s
        return self._remove(lambda g, cid, m: m.last_seen < limit)

    def _remove(self, doomed):
        changed = []
        for group, members in list(self._groups.items()):
            gone = [cid for cid, m in members.items() if doomed(group, cid, m)]
            for cid in gone:
                self._unindex(members[cid].conn, group, cid)
                del members[cid]
                self.members -= 1
            if not members:
                del self._groups[group]
            if gone:
                changed.append(group)
        for group in changed:
            self._on_change(group)
        return changed

    def registered_through(self, group, client_id, conn):
        """Whether ``client_id`` is a live member of ``group`` whose last heartbeat came through ``conn``."""
        member = self._groups.get(group, {}).get(client_id)
        return member is not None and member.conn is conn

    def broadcasting(self, group, conn):
        """Whether a live client of ``group`` registered through ``conn`` consumes in BROADCASTING mode (a pull
        carries no message model: its connection's heartbeat said it)."""
        members = self._groups.get(group, {})
        for g, client_id in self._by_conn.get(conn, ()):
            member = members.get(client_id) if g == group else None
            if member is not None and member.broadcasting:
                return True
        return False

    def consumers(self, group):
        """The live client ids of ``group``, sorted."""
        return sorted(self._groups.get(group, ()))

    def live_members(self, group, now):
        """``[(client id, peer address, idle seconds)]`` of ``group``'s live clients, sorted by id."""
        return [(cid, getattr(m.conn, "peer", ""), max(0.0, now - m.last_seen))
                for cid, m in sorted(self._groups.get(group, {}).items())]

    def connections(self, group):
        """The distinct connections of ``group``'s live clients."""
        seen = {}  # id(conn) -> conn, in first-seen order
        for m in self._groups.get(group, {}).values():
            seen.setdefault(id(m.conn), m.conn)
        return list(seen.values())

    def groups(self):
        return sorted(self._groups)


def _user_of(conn):
    session = getattr(conn, "session", None)
    return session.user if session is not None else None


class ProducerRegistry:
    """Which connections are producers of which producer group (HEART_BEAT's ``producerDataSet``), for the
    transaction check-back (``metaq.transactions.remoting``): RocketMQ's ProducerManager, keyed by connection as
    its is by channel.

    A connection leaves a group on UNREGISTER_CLIENT naming it, when it closes, or after ``timeout_s`` without
    a heartbeat. ``max_members`` bounds the (group, connection) entries: a heartbeat that would add more is
    refused. ``pick`` takes the group's connections in turn."""

    def __init__(self, timeout_s, max_members=remoting_limits.MAX_REMOTING_MEMBERS):
        self.timeout_s = timeout_s
        self.max_members = max_members
        self._groups = {}  # group -> {conn: last seen}
        self._by_conn = {}  # conn -> {group}
        self._clients = {}  # client id -> conn: where replies to that client go (request-reply)
        self._client_of = {}  # conn -> client id
        self._turn = 0
        self.members = 0

    def heartbeat(self, conn, groups, now, client_id=None):
        """Record that ``conn`` is a producer of each of ``groups`` (ClientError, nothing recorded, past a bound),
        and that producer ``client_id`` is reached through ``conn`` (RocketMQ's ``findChannel(clientId)``: replies
        to it are pushed there) while ``conn`` is a producer of some group."""
        groups = set(groups)
        if len(groups) > remoting_limits.MAX_HEARTBEAT_GROUPS:
            raise errors.ClientError("a heartbeat may name at most %d producer groups, this one names %d"
                                     % (remoting_limits.MAX_HEARTBEAT_GROUPS, len(groups)))
        new = sum(1 for g in groups if conn not in self._groups.get(g, ()))
        if new and self.members + new > self.max_members:
            raise errors.ClientError("too many RocketMQ producers registered: the limit is %d (group, connection) "
                                     "entries" % self.max_members)
        for group in groups:
            members = self._groups.setdefault(group, {})
            if conn not in members:
                self.members += 1
                self._by_conn.setdefault(conn, set()).add(group)
            members[conn] = now
        if client_id and groups and not self._held_by_another_user(client_id, conn):
            if self._client_of.get(conn) != client_id:
                self._forget_client(conn)
            self._clients[client_id] = conn
            self._client_of[conn] = client_id

    def _held_by_another_user(self, client_id, conn):
        """Whether ``client_id`` is a live client of another authenticated user than ``conn``'s: its replies must
        never be taken over by a heartbeat naming it (a subscriber of a request topic reads REPLY_TO_CLIENT). With
        authentication off every user is None: a reconnecting client takes its id back, as in RocketMQ."""
        held = self._clients.get(client_id)
        if held is None or held is conn or getattr(held, "closed", False):
            return False
        return _user_of(held) != _user_of(conn)

    def client(self, client_id):
        """The open connection producer ``client_id``'s last heartbeat came over, or None."""
        conn = self._clients.get(client_id)
        if conn is None or getattr(conn, "closed", False) or conn not in self._by_conn:
            return None
        return conn

    def _forget_client(self, conn):
        old = self._client_of.pop(conn, None)
        if old is not None and self._clients.get(old) is conn:
            del self._clients[old]

    def unregister(self, conn, group):
        self._leave(conn, group)

    def connection_closed(self, conn):
        for group in sorted(self._by_conn.get(conn, ())):
            self._leave(conn, group)

    def expire(self, now):
        """Forget producers silent for more than ``timeout_s``; returns how many entries went."""
        limit = now - self.timeout_s
        gone = [(conn, group) for group, members in self._groups.items() for conn, seen in members.items()
                if seen < limit]
        for conn, group in gone:
            self._leave(conn, group)
        return len(gone)

    def _leave(self, conn, group):
        members = self._groups.get(group)
        if members is None or members.pop(conn, None) is None:
            return
        self.members -= 1
        if not members:
            del self._groups[group]
        groups = self._by_conn.get(conn)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._by_conn[conn]
                self._forget_client(conn)

    def pick(self, group, usable=lambda conn: True):
        """A connection of ``group`` that is open and ``usable`` (the next in turn), or None."""
        conns = [c for c in self._groups.get(group, ()) if not getattr(c, "closed", False) and usable(c)]
        if not conns:
            return None
        self._turn += 1
        return conns[self._turn % len(conns)]

    def groups(self):
        return sorted(self._groups)
