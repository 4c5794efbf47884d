"""Which broker of an MQTT cluster is a client id's home, and the home's registry of the ids it serves (state: no
socket, gevent or clock; docs/mqtt.md "A client id across the cluster", docs/architecture.md "MQTT cluster: client
ids").

``home_of``: the home of a client id is the member (a master's broker id) with the highest rendezvous weight of
(member, id). Every broker computes it from the same members (ZooKeeper's ``/brokers/ids/*``), with no table and
no ZooKeeper write per device; when a member joins or leaves, only the ids whose highest weight was or becomes that
member's move.

``HomeRegistry``: on the home, client id -> the broker holding its session (a live connection, or a persistent
session kept offline), at most ``max_ids`` (``mqtt.cluster_max_ids``), and of them at most a share
(``holder_share``: mqtt.cluster_holder_share_percent) held by any one other broker: one member cannot take every slot
from the others and from the home's own devices. It lives in memory only: when the members
change, each broker tells the ids it holds to their homes again (``hold``), so a home that restarts or takes ids
over learns them back without a write to ZooKeeper per device.

Which copy stands when two brokers re-register one id (``hold``) is a rule, not the order the holds arrive in: a
copy the holder *recovered* (loaded from its log at its start, or learned as a slave before its promotion, no
connection claimed it since) gives way to one another broker holds live (connected there, or a session made there
since), whichever told the home first; between two of the same kind, the first registered stands.

With each holder the registry keeps how the device's CONNECT began the copy registered (``clean``): True for a
Clean Start 1 CONNECT, False for Clean Start 0 (that copy continues the session), None when not known (a copy
recovered at a restart). The copy that gives way is ended as that CONNECT would have ended it on one broker: its
pending will dropped after a Clean Start 0 (MQTT 5.0 3.1.3.2.2: a new Network Connection to the session within the
Will Delay Interval), published otherwise (``ClientIds._drop``).
"""

import functools
import hashlib

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits

__all__ = ["home_of", "holder_share", "HomeRegistry", "RegistryFull"]


@functools.lru_cache(maxsize=limits.MAX_BROKER_ID + 1)  # one a broker id
def _member_hash(member):
    """The hash of a member's part of its weights' input (its id and a zero byte), shared: each weight continues a
    copy of it, never it."""
    return hashlib.blake2b(b"%d\x00" % member, digest_size=8)


def home_of(client_id, members):
    """The home of ``client_id`` among ``members`` (broker ids): the highest rendezvous weight (ties: the lowest id);
    None when there is no member. A weight is the 8-byte BLAKE2b digest of ``"<member>\\0<client id>"`` in UTF-8,
    read big-endian: every broker of every version computes the same home."""
    key = client_id.encode("utf-8")
    best, best_weight = None, -1
    for member in sorted(members):
        h = _member_hash(member).copy()
        h.update(key)
        w = int.from_bytes(h.digest(), "big")
        if w > best_weight:
            best, best_weight = member, w
    return best


class RegistryFull(Exception):
    """One more client id would pass the registry's bound (``mqtt.cluster_max_ids``), or its holder's share of it
    (``holder_share``)."""


def holder_share(max_ids, percent=mqttcluster_limits.MQTT_CLUSTER_HOLDER_SHARE_PERCENT):
    """The ids one broker other than the home may hold in a home's registry of ``max_ids``: ``percent``
    (``mqtt.cluster_holder_share_percent``) of them (at least one), so that no member (a busy one, or one lying in its
    holds) takes every slot from the others and from the home's own devices."""
    return max(1, max_ids * percent // 100)


class HomeRegistry:
    """client id -> holding broker id, at most ``max_ids`` of them, and at most ``share`` (``holder_share``) held by
    any one broker other than ``own`` (this home; None: every holder is bounded) (see the module doc)."""

    __slots__ = ("max_ids", "own", "share", "_holders", "_counts")

    def __init__(self, max_ids, own=None, share_percent=mqttcluster_limits.MQTT_CLUSTER_HOLDER_SHARE_PERCENT):
        self.max_ids = max_ids
        self.own = own
        self.share = holder_share(max_ids, share_percent)
        #: client id -> (broker id, generation, recovered: True for a copy from before a restart, clean: how a
        #: CONNECT began that copy, True / False / None: not known)
        self._holders = {}
        self._counts = {}  # broker id -> how many ids it holds here

    def __len__(self):
        return len(self._holders)

    def holder(self, client_id):
        """The broker holding ``client_id``'s session, or None."""
        held = self._holders.get(client_id)
        return None if held is None else held[0]

    def generation(self, client_id):
        """The generation ``client_id`` was registered with (0: by a re-registration, or unknown): the holder
        tells by it whether the answer registering it there has reached it yet."""
        held = self._holders.get(client_id)
        return 0 if held is None else held[1]

    def recovered(self, client_id):
        """True when ``client_id``'s holder registered it as a copy recovered at its start (``hold``)."""
        held = self._holders.get(client_id)
        return held is not None and held[2]

    def clean(self, client_id):
        """How a CONNECT began the registered holder's copy of ``client_id``: True (Clean Start 1), False (Clean
        Start 0), None (not known, or no holder)."""
        held = self._holders.get(client_id)
        return None if held is None else held[3]

    def register(self, client_id, broker_id, generation=0, recovered=False, clean=None, checked=False):
        """``broker_id`` holds ``client_id`` now (the home's ``generation`` of this registration; ``recovered``:
        a copy from before the holder's restart, only ever by ``hold``; ``clean``: the Clean Start of the CONNECT,
        None: not known); returns the broker that held it before (None: none). A Clean Start 0 CONNECT to the broker
        already holding the id continues its copy: how that copy began stands. Raises RegistryFull when the id is
        new and the registry is at its bound, or (unless ``checked``: the share was checked before a takeover, which
        must not be thrown away once the old holder gave the session up) past ``broker_id``'s share: nothing changes
        then."""
        held = self._holders.get(client_id)
        old = None if held is None else held[0]
        refusal = self.refusal(client_id, broker_id, share=not checked)
        if refusal is not None:
            raise RegistryFull(refusal)
        if old == broker_id and not clean and held[3] is not None:
            clean = held[3]
        self._set(client_id, (broker_id, generation, recovered, clean))
        return old

    def refusal(self, client_id, broker_id, share=True):
        """Why ``broker_id`` may not hold ``client_id`` now, or None: a new id past ``max_ids``, or (``share``) one
        more id of a broker other than this home past its ``share``."""
        old = self.holder(client_id)
        if old is None and len(self._holders) >= self.max_ids:
            return "%d client ids is this home broker's limit (mqtt.cluster_max_ids)" % self.max_ids
        if share and old != broker_id and broker_id != self.own and self._counts.get(broker_id, 0) >= self.share:
            return ("broker %d holds %d client ids of this home broker, its share (mqtt.cluster_holder_share_percent "
                    "of mqtt.cluster_max_ids)" % (broker_id, self.share))
        return None

    def held_by(self, broker_id):
        """How many ids ``broker_id`` holds here."""
        return self._counts.get(broker_id, 0)

    def _set(self, client_id, held):
        old = self._holders.get(client_id)
        if old is not None:
            self._uncount(old[0])
        self._holders[client_id] = held
        self._counts[held[0]] = self._counts.get(held[0], 0) + 1

    def _forget(self, client_id):
        self._uncount(self._holders.pop(client_id)[0])

    def _uncount(self, broker_id):
        left = self._counts[broker_id] - 1
        if left:
            self._counts[broker_id] = left
        else:
            del self._counts[broker_id]

    def hold(self, client_id, broker_id, recovered=False, clean=None):
        """A re-registration: ``broker_id`` says it holds ``client_id`` (``recovered``: a copy it loaded from its
        log at its start and no connection claimed since; ``clean``: how a CONNECT there began it, None: not known;
        the holder's word, newer than the home's, is kept with it). Returns the broker that must end its copy: None
        when nobody must (the id was unknown, or already that broker's); ``broker_id`` when the registered holder
        stands (another broker registered it first, or holds it live while this copy is recovered); the registered
        holder when its copy is recovered and ``broker_id``'s is live: ``broker_id`` holds it now. Raises
        RegistryFull as ``register``."""
        held = self._holders.get(client_id)
        if held is None:
            self.register(client_id, broker_id, recovered=recovered, clean=clean)
            return None
        old, generation, old_recovered, old_clean = held
        if old == broker_id:
            if old_recovered and not recovered:  # connected there since: live from now on
                old_recovered = False
            self._holders[client_id] = (old, generation, old_recovered, old_clean if clean is None else clean)
            return None
        if old_recovered and not recovered:
            refusal = self.refusal(client_id, broker_id)
            if refusal is not None:
                raise RegistryFull(refusal)
            self._set(client_id, (broker_id, 0, False, clean))
            return old
        return broker_id

    def release(self, client_id, broker_id):
        """``broker_id`` holds no session of ``client_id`` any more: forgotten unless another broker holds it now."""
        if self.holder(client_id) == broker_id:
            self._forget(client_id)

    def forget_unless(self, keep):
        """Drop the ids ``keep(client_id)`` says are not this home's any more (the members changed); their
        holders register them with their new home."""
        for client_id in [c for c in self._holders if not keep(c)]:
            self._forget(client_id)

    def drop_holder(self, broker_id):
        """Forget the ids ``broker_id`` held (it left the cluster: its sessions went with it)."""
        for client_id in [c for c, held in self._holders.items() if held[0] == broker_id]:
            self._forget(client_id)
