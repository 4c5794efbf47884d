"""``$share/<group>/<filter>`` across the cluster: which broker's group takes a message (pure).

The broker a message is published on (its origin) decides, so no two brokers take one message for one group: the
brokers with members of a group are this broker when its own group has members and each peer whose ROUTES carry the
group. Each (origin, topic, partition) of the group goes to one of them, chosen by a rendezvous hash over (group,
filter, origin, topic, partition, broker) (``owner_of``, the one function of it), so one partition keeps its order at
one broker and the partitions spread over the brokers; when a broker joins or leaves, only its partitions move.

A membership change takes effect for the messages stored after it: it is recorded with the position the log's next
record gets (every message stored so far lies before it), and a message is assigned by the brokers of the last change
at or before its place in the log (none: no member anywhere then, and each broker's own members take its messages).
Every reader of a record (the delivery of this broker's group, the link serving each peer) so decides the same
whatever its lag, and nothing is assigned twice. The history is kept in the sessions' log (``%MQTT%``, written
before any message it assigns), so a slave holds its master's as it copied it, and a slave promoted, or a master
started again after a kill, assigns what it reads again as the master that stored it did. At most
MQTT_CLUSTER_SHARE_HISTORY changes are kept per group and MQTT_CLUSTER_MAX_GROUPS groups (a new group past them takes
the place of one with no member anywhere); past the latter a group is not shared (its local members take what is
published here, as without a cluster).
"""

import hashlib

from metaq import limits

__all__ = ["Shares", "owner_of"]


def owner_of(group, origin, topic, partition, brokers):
    """The broker of ``brokers`` whose group ``group`` (share name, filter) takes ``origin``'s ``topic``-``partition``
    (None: no broker)."""
    best, owner = -1, None
    base = b"%s\x00%s\x00%d\x00%s\x00%d\x00" % (group[0].encode("utf-8"), group[1].encode("utf-8"), origin,
                                                topic.encode("utf-8"), partition)
    for b in brokers:
        score = int.from_bytes(hashlib.blake2b(base + b"%d" % b, digest_size=8).digest(), "big")
        if score > best or (score == best and b < owner):
            best, owner = score, b
    return owner


class Shares:
    """The brokers with members of each group as this broker (``broker_id``) sees them now (``local``, ``peers``),
    and the history of them that assigns this broker's messages, which the sessions' log holds: ``position()`` is
    the log position its next record gets, ``histories()`` the history of each group as the log holds it now
    ({group: an object whose ``changes`` are ((since position, sorted brokers), ...), oldest first}: a slave's is its
    master's, as copied), ``record(group, changes)`` writes a group's history (None: it ends) and says whether it was
    written: only a master that may write does, and a change not written is not made (the history goes on assigning
    as it did; ``refresh`` tries again)."""

    def __init__(self, broker_id, position, histories, record, most=None, history=None):
        self.broker_id = broker_id
        self.most = limits.MQTT_CLUSTER_MAX_GROUPS if most is None else most
        self.history = limits.MQTT_CLUSTER_SHARE_HISTORY if history is None else history
        self.position = position
        self.histories = histories
        self.record = record
        self.local = frozenset()  # this broker's groups with members
        self.peers = {}  # broker id -> (link token, frozenset of groups)
        self.refused = 0

    def __len__(self):
        return len(self.histories())

    def set_local(self, groups):
        """This broker's groups with members are ``groups`` now."""
        old, self.local = self.local, frozenset(groups)
        self._update(old ^ self.local)

    def set_peer(self, broker, token, groups):
        """Peer ``broker``'s ROUTES (over the link ``token``) carry ``groups``."""
        old = self.peers.get(broker, (None, frozenset()))[1]
        new = frozenset(groups)
        self.peers[broker] = (token, new)
        self._update(old ^ new)

    def drop_peer(self, broker, token):
        """The link ``token`` of ``broker`` ended: its groups count no more (unless a newer link of it holds them)."""
        held = self.peers.get(broker)
        if held is not None and held[0] == token:
            del self.peers[broker]
            self._update(held[1])

    def refresh(self):
        """Record each group whose brokers now are not its history's last: a change that was not written when it
        came (a master that could not write then); a group past MQTT_CLUSTER_MAX_GROUPS is not counted refused
        again. For a view that is whole (``MqttCluster``: once every peer follows this master). A generator: one
        group a step, so that the caller lets others run between steps."""
        groups = set(self.local).union(self.histories(), *(g for _token, g in self.peers.values()))
        for group in groups:
            self._update((group,), count=False)
            yield group

    def brokers(self, group):
        out = {b for b, (_token, groups) in self.peers.items() if group in groups}
        if group in self.local:
            out.add(self.broker_id)
        return tuple(sorted(out))

    def _update(self, groups, count=True):
        """A group whose brokers changed gets a change from the log's next position on (no broker at all: no member
        anywhere, each broker's own members take what is published on it, as without a cluster). A group new here
        past ``most`` histories takes the place of one with no member anywhere, else it is not shared."""
        histories = self.histories()
        for group in groups:
            brokers = self.brokers(group)
            held = histories.get(group)
            changes = () if held is None else held.changes
            if changes and changes[-1][1] == brokers:
                continue
            if not changes:
                if not brokers:
                    continue
                if len(histories) >= self.most and not self._evict(histories):
                    if count:
                        self.refused += 1  # the caller logs it (``refused``: how many times)
                    continue
            self.record(group, (tuple(changes) + ((self.position(), brokers),))[-self.history:])

    def _evict(self, histories):
        """End the history of a group with no member anywhere since its last change, the one recorded longest ago
        first (begun again, such a group starts afresh: what was stored before is assigned by its first change);
        False when there is none, or the log did not take it."""
        for key, held in histories.items():
            if not held.changes[-1][1]:
                return self.record(key, None)
        return False

    def owner(self, group, origin, topic, partition, position):
        """The broker whose group takes ``origin``'s record of ``topic``-``partition`` at log ``position``; None when
        the group is not shared across the cluster (this broker's members take what is published here)."""
        held = self.histories().get(group)
        if held is None or not held.changes:
            return None
        changes = held.changes
        brokers = changes[0][1]
        for since, at in reversed(changes):
            if since <= position:
                brokers = at
                break
        if not brokers:
            return None
        return owner_of(group, origin, topic, partition, brokers)

    def takes(self, group, topic, partition, position):
        """True when this broker's group takes its own record of ``topic``-``partition`` at log ``position``."""
        owner = self.owner(group, self.broker_id, topic, partition, position)
        return owner is None or owner == self.broker_id
