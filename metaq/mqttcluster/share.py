"""``$share/<group>/<filter>`` across the cluster: which broker's group takes a message (pure).

The broker a message is published on (its origin) decides, so no two brokers take one message for one group: the
brokers with members of a group are this broker when its own group has members and each peer whose ROUTES carry the
group. Each (origin, topic, partition) of the group goes to one of them, chosen by a rendezvous hash over (group,
filter, origin, topic, partition, broker), so one partition keeps its order at one broker and the partitions spread
over the brokers; when a broker joins or leaves, only its partitions move.

A membership change takes effect for the messages stored after it: each change is remembered with its time (one past
now, later than every message stored so far), and a message is assigned by the brokers of the last change before its
store time. Every reader of a record (the delivery of this broker's group, the link serving each peer) so decides the
same whatever its lag, and nothing is assigned twice. At most MQTT_CLUSTER_SHARE_HISTORY changes are kept per group
and MQTT_CLUSTER_MAX_GROUPS groups; past the latter a group is not shared (its local members take what is published
here, as without a cluster).
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
    """The brokers with members of each group, as this broker (``broker_id``) sees them, with their history;
    ``clock()``: milliseconds, the clock records' store times are of."""

    def __init__(self, broker_id, clock, most=None, history=None):
        self.broker_id = broker_id
        self.most = limits.MQTT_CLUSTER_MAX_GROUPS if most is None else most
        self.history = limits.MQTT_CLUSTER_SHARE_HISTORY if history is None else history
        self.clock = clock
        self.local = frozenset()  # this broker's groups with members
        self.peers = {}  # broker id -> (link token, frozenset of groups)
        self._changes = {}  # group -> [(since ms, sorted tuple of brokers), ...]
        self.refused = 0

    def __len__(self):
        return len(self._changes)

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

    def brokers(self, group):
        out = {b for b, (_token, groups) in self.peers.items() if group in groups}
        if group in self.local:
            out.add(self.broker_id)
        return tuple(sorted(out))

    def _update(self, groups):
        since = self.clock() + 1
        for group in groups:
            brokers = self.brokers(group)
            changes = self._changes.get(group)
            if changes is None:
                if len(self._changes) >= self.most:
                    self.refused += 1  # the caller logs it (``refused``: how many times)
                    continue
                changes = self._changes[group] = []
            if changes and changes[-1][1] == brokers:
                continue
            if not brokers:  # no member anywhere: nobody reads for it; a group begun again starts afresh
                del self._changes[group]
                continue
            changes.append((since, brokers))
            del changes[:-self.history]

    def owner(self, group, origin, topic, partition, ts):
        """The broker whose group takes ``origin``'s record of ``topic``-``partition`` stored at ``ts`` (ms); None when
        the group is not shared across the cluster (this broker's members take what is published here)."""
        changes = self._changes.get(group)
        if not changes:
            return None
        brokers = changes[0][1]
        for since, at in reversed(changes):
            if since <= ts:
                brokers = at
                break
        if not brokers:
            return None
        return owner_of(group, origin, topic, partition, brokers)

    def takes(self, group, topic, partition, ts):
        """True when this broker's group takes its own record of ``topic``-``partition`` stored at ``ts``."""
        owner = self.owner(group, self.broker_id, topic, partition, ts)
        return owner is None or owner == self.broker_id
