"""``$share/<group>/<filter>`` across the cluster: which broker's group takes a message (pure).

The broker a message is published on (its origin) decides, so no two brokers take one message for one group: the
brokers with members of a group are this broker when its own group has members and each peer whose ROUTES carry the
group. Each message goes to one of them on its own, chosen by a rendezvous hash over (group, filter, origin, topic,
partition, the message's place in the origin's log, broker) (``owner_of``, the one function of it), so the brokers
with members share what is published whatever the topic's partitions (one partition too: its order across brokers is
not kept), and every broker decides alike from what it knows with no call per message; when a broker joins or
leaves, only its share moves. A broker's share is weighted by its members in the group (each broker's route says
how many, at most MQTT_CLUSTER_SHARE_WEIGHT_MAX), so each member gets about as much wherever it is connected; a
change in a count goes into the weights at most once per MQTT_CLUSTER_SHARE_SETTLE_S
(``MqttCluster.groups_changed``). A broker where a group is kept for persistent members away, none connected,
weighs 0: it takes no share while any broker has a member connected, and when none has, the brokers that keep the
group share what is published, kept there for the members that come back.

A membership change (brokers, or their weights) takes effect for the messages stored after it: it starts at its own
record's place in the log (every message stored so far lies before it), and a message is assigned by the brokers
of the last change at or before its place in the log (none: no member anywhere then, and each broker's own members
take its messages).
Every reader of a record (the delivery of this broker's group, the link serving each peer) so decides the same
whatever its lag, and nothing is assigned twice. The history is kept in the sessions' log (``%MQTT%``, written
before any message it assigns), so a slave holds its master's as it copied it, and a slave promoted, or a master
started again after a kill, assigns what it reads again as the master that stored it did.

Only a peer's ROUTES say its members: a peer whose link ended, or that has not linked since this broker's start,
keeps the brokers its last change gave it (what is published meanwhile waits for its link to resume), so a cut link
moves nothing. A change is dropped once the change after it starts at or below the log's start (no reader can reach
a record it assigns); a change with nothing written since it is replaced by the next (a member that leaves and comes
back with no traffic between leaves its history as it was; a group's first change is never replaced: it also
assigns what was stored before it). At most MQTT_CLUSTER_SHARE_HISTORY changes are kept per
group (past it the oldest goes, counted in ``forgotten``: the records older than the oldest kept change are assigned
by it), and MQTT_CLUSTER_MAX_GROUPS groups (a new group past them takes the place of one with no member anywhere,
the one whose last change is the oldest first); past the latter a group is not shared (its local members take what
is published here, as without a cluster). A group with no member anywhere since before the log's start ends.
"""

import hashlib
import math

from metaq.mqttcluster import limits as mqttcluster_limits

__all__ = ["Shares", "owner_of", "unit", "weights_moved"]


def owner_of(group, origin, topic, partition, offset, brokers, weights=None):
    """The broker of ``brokers`` whose group ``group`` (share name, filter) takes ``origin``'s message at ``offset``
    (its place in ``origin``'s log) of ``topic``-``partition`` (None: no broker). A rendezvous hash over the message's
    coordinates and each broker, so the origin and every member broker decide alike with no call, each message on
    its own (a one-partition topic spreads over the brokers), and a broker that joins or leaves moves only its own
    share. ``weights`` ({broker: weight > 0}, 1 when absent): a broker's share is its weight over the weights' sum
    (weighted rendezvous: the highest ``weight / -ln(u)`` wins, ``u`` the hash as ``unit`` gives it)."""
    base = b"%s\x00%s\x00%d\x00%s\x00%d\x00%d\x00" % (group[0].encode("utf-8"), group[1].encode("utf-8"), origin,
                                                       topic.encode("utf-8"), partition, offset)
    best, owner = None, None
    for b in brokers:
        h = int.from_bytes(hashlib.blake2b(base + b"%d" % b, digest_size=8).digest(), "big")
        if weights is None:
            score = h
        else:
            score = weights.get(b, 1) / -math.log(unit(h))
        if best is None or score > best or (score == best and b < owner):
            best, owner = score, b
    return owner


def weights_moved(applied, now):
    """True when a weight of ``now`` differs from the one at its place in ``applied`` (the weights a broker's route
    carries) by more than MQTT_CLUSTER_SHARE_WEIGHT_STEP_PERCENT of it: each change of weights is a change of every
    group's history in the sessions' log (bounded at MQTT_CLUSTER_SHARE_HISTORY), so a count that moves a little,
    members coming and going around it, changes nothing."""
    step = mqttcluster_limits.MQTT_CLUSTER_SHARE_WEIGHT_STEP_PERCENT
    return len(applied) != len(now) or any(abs(n - a) * 100 > step * a for a, n in zip(applied, now, strict=True))


def unit(h):
    """The 64-bit hash ``h`` as a number strictly inside (0, 1): its top 52 bits, so that no hash gives
    1.0 (whose log is 0: a division by zero in every reader of that record); 52 bits, so that adding 0.5 is exact."""
    return ((h >> 12) + 0.5) / _SPAN


_SPAN = float(1 << 52)


class Shares:
    """The brokers with members of each group as this broker (``broker_id``) sees them now (``local``, ``peers``),
    and the history of them that assigns this broker's messages, which the sessions' log holds: ``position()`` is
    the log's end (the position its next record gets), ``start()`` its start (the oldest position a reader can still
    reach), ``histories()`` the history of each group as the log holds it now ({group: an object whose ``changes``
    are ((since position, sorted brokers), ...), oldest first}: a slave's is its master's, as copied), ``record(group,
    changes)`` writes a group's history (None: it ends; a change whose since is None starts at this record) and gives
    the log's end after the record (None: not written): only a master that may write does, and a change not written is
    not made (the history goes on assigning as it did; ``refresh`` tries again). ``pause(turn)``: after each group
    of a change (None at the first of them; gives the next turn), so that thousands of groups do not hold the event
    loop (``MqttCluster``: ``connections.share_loop``)."""

    def __init__(self, broker_id, position, start, histories, record, most=None, history=None, pause=None):
        """A history's change is ``(since, ((broker, weight), ...))``, the brokers sorted."""
        self.broker_id = broker_id
        self.most = mqttcluster_limits.MQTT_CLUSTER_MAX_GROUPS if most is None else most
        self.history = mqttcluster_limits.MQTT_CLUSTER_SHARE_HISTORY if history is None else history
        self.position = position
        self.start = start
        self.histories = histories
        self.record = record
        self.pause = pause or (lambda turn: turn)
        self.local = {}  # this broker's groups with members -> their weight here
        self.peers = {}  # broker id -> (link token, {group: weight}): the peers linked now
        self.refused = 0  # new groups not tracked (past ``most``)
        self.forgotten = 0  # changes dropped past ``history`` while a reader could still reach what they assign
        self._ends = {}  # group -> the log's end after its last record written here (a change to replace)
        self._evictable = {}  # groups whose last change has no broker, that change recorded longest ago first

    def __len__(self):
        return len(self.histories())

    def set_local(self, groups):
        """This broker's groups with members are ``groups`` now (an iterable of groups, each of weight 1, or a
        mapping {group: weight})."""
        old, self.local = self.local, _weighted(groups)
        self._update(_moved(old, self.local))

    def set_peer(self, broker, token, groups):
        """Peer ``broker``'s ROUTES (over the link ``token``) carry ``groups`` (as ``set_local`` takes them)."""
        old = self.peers.get(broker, (None, {}))[1]
        new = _weighted(groups)
        self.peers[broker] = (token, new)
        self._update(_moved(old, new))

    def drop_peer(self, broker, token):
        """The link ``token`` of ``broker`` ended (unless a newer link of it is up): its groups keep the brokers their
        last change gave them until its ROUTES come again; nothing is recorded."""
        held = self.peers.get(broker)
        if held is not None and held[0] == token:
            del self.peers[broker]

    def refresh(self):
        """Record each group whose brokers now are not its history's last: a change that was not written when it
        came (a master that could not write then); a group past MQTT_CLUSTER_MAX_GROUPS is not counted refused
        again. Drops the changes no reader can reach and ends a history with no broker since before the log's start.
        A generator: one group a step, so that the caller lets others run between steps."""
        groups = set(self.local).union(self.histories(), *(set(g) for _token, g in self.peers.values()))
        for group in groups:
            self._change(group, count=False)
            yield group

    def brokers(self, group):
        """The brokers with members of ``group`` as this broker sees them now (a peer not linked: as its last change
        says), each with its weight: ``((broker, weight), ...)`` sorted."""
        held = self.histories().get(group)
        return self._brokers(group, held.changes[-1][1] if held is not None and held.changes else ())

    def _brokers(self, group, last):
        """``((broker, weight), ...)`` sorted: the linked peers' and this broker's as they say now, the others' as
        ``last`` (the history's last change) gave them."""
        out = {b: groups[group] for b, (_token, groups) in self.peers.items() if group in groups}
        out.update((b, w) for b, w in last if b != self.broker_id and b not in self.peers)
        if group in self.local:
            out[self.broker_id] = self.local[group]
        return tuple(sorted(out.items()))

    def _update(self, groups):
        turn = None
        for group in groups:
            self._change(group)
            turn = self.pause(turn)

    def _change(self, group, count=True):
        """Record ``group``'s change when its brokers are not its history's last (no broker at all: no member
        anywhere, each broker's own members take what is published on it, as without a cluster). A group new here
        past ``most`` histories takes the place of one with no member connected anywhere (kept only, or none), else it
        is not shared; a group kept only takes no other's place."""
        histories = self.histories()
        held = histories.get(group)
        changes = [] if held is None else list(held.changes)
        last = changes[-1][1] if changes else ()
        brokers = self._brokers(group, last)
        start = self.start()
        if changes and last == brokers:
            kept = self._reachable(changes, start)
            if not _live(brokers):
                self._evictable.setdefault(group)  # one found in the log (a start, a promotion)
            if not brokers:
                if kept[-1][0] <= start:
                    self._write(group, None)  # nothing a reader reaches is assigned by the history
                    return
            if len(kept) < len(changes):
                self._write(group, kept)
            return
        if not changes:
            if not brokers:
                return
            if len(histories) >= self.most and (not _live(brokers) or not self._evict(histories)):
                if count:
                    self.refused += 1  # the caller logs it (``refused``: how many times)
                return
        elif len(changes) > 1 and self.position() == self._ends.get(group):
            changes.pop()  # nothing written since its last change (not its first, which also assigns what came before)
        if not changes or changes[-1][1] != brokers:  # else back to the brokers before the replaced change
            changes.append((None, brokers))
        changes = self._reachable(changes, start)
        if len(changes) > self.history:
            self.forgotten += len(changes) - self.history
            changes = changes[-self.history:]
        self._write(group, changes)

    @staticmethod
    def _reachable(changes, start):
        """``changes`` without those the next of which starts at or below ``start`` (they assign nothing a reader
        can still reach)."""
        first = 0
        while first + 1 < len(changes) and changes[first + 1][0] is not None and changes[first + 1][0] <= start:
            first += 1
        return changes[first:]

    def _write(self, group, changes):
        """Write ``group``'s history (None: end it); True when written. A last change whose since is None is new: it
        goes last among the groups that may be evicted, and the next change replaces it while nothing is written
        after its record."""
        end = self.record(group, None if changes is None else tuple(changes))
        if end is None:
            return False
        fresh = changes is not None and changes[-1][0] is None
        if fresh:
            self._ends[group] = end
        else:
            self._ends.pop(group, None)
        if changes is None or _live(changes[-1][1]):
            self._evictable.pop(group, None)
        elif fresh or group not in self._evictable:
            self._evictable.pop(group, None)
            self._evictable[group] = None
        return True

    def _evict(self, histories):
        """End the history of a group with no member anywhere since its last change, the one whose last change was
        recorded longest ago first (begun again, such a group starts afresh: what was stored before is assigned by
        its first change); False when there is none, or the log did not take it."""
        while self._evictable:
            key = next(iter(self._evictable))
            held = histories.get(key)
            if held is None or _live(held.changes[-1][1]) or _live(self._brokers(key, ())):
                del self._evictable[key]  # not one any more (a new member, a history the log ended)
                continue
            return self._write(key, None)
        return False

    def owner(self, group, origin, topic, partition, position):
        """The broker whose group takes ``origin``'s record of ``topic``-``partition`` at log ``position`` (by the
        brokers of the change at or before it, the record on its own: ``owner_of``); None when the group is not shared
        across the cluster (this broker's members take what is published here)."""
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
        live = [b for b, w in brokers if w]
        if not live:  # kept with no member anywhere: the brokers that keep it share it for the members that return
            return owner_of(group, origin, topic, partition, position, [b for b, _w in brokers])
        return owner_of(group, origin, topic, partition, position, live, dict(brokers))

    def takes(self, group, topic, partition, position):
        """True when this broker's group takes its own record of ``topic``-``partition`` at log ``position``."""
        owner = self.owner(group, self.broker_id, topic, partition, position)
        return owner is None or owner == self.broker_id


def _weighted(groups):
    """{group: weight} of ``groups`` (a mapping as it is, an iterable: each of weight 1)."""
    return dict(groups) if isinstance(groups, dict) else dict.fromkeys(groups, 1)


def _moved(old, new):
    """The groups whose weight differs between ``old`` and ``new`` (in one and not the other too)."""
    return {g for g in old.keys() | new.keys() if old.get(g) != new.get(g)}


def _live(brokers):
    """True when some broker of ``brokers`` ((broker, weight), ...) has a member connected (weight above 0)."""
    return any(w for _b, w in brokers)
