"""What a member of the MQTT cluster may ask of this broker on the replication port (state: no socket; the calls'
``serve_calls`` and the follows' ``serve.PeerServer`` ask it; docs/security.md "Replication").

A peer that proved the replication secret is taken at no word about who it is: it must be a member ZooKeeper names
(``members.Members``, its last reading kept while ZooKeeper cannot be read), other than this broker, or one whose
follow of this broker, begun while it was named, is still open (``linked``: a member cut off from ZooKeeper only, its
nodes expired, keeps its links and its sessions, docs/mqtt.md "Failures in a cluster"), and each of its calls is held
to what that member may ask:

* ``register`` (a CONNECT of a client id on the caller) only of an id whose home is this broker; ``registers`` (a
  batch of them) carries at most ``MQTT_CLUSTER_ID_BATCH``, each entry refused on its own when its id is homed
  elsewhere;
* ``give_up`` (end this broker's copy of a client id and hand its session on) only from the id's home;
* ``drop`` (end copies registered elsewhere) only of ids whose home is the caller (the others are passed over);
* ``hold`` and ``release`` (the caller holds, or no longer holds, these ids) only of ids whose home is this broker
  (the others are passed over: a home's registry holds no id it is not the home of);
* ``hold``, ``release`` and ``drop`` carry at most ``MQTT_CLUSTER_ID_BATCH`` ids a call (what a member sends); a
  call past it, or of another shape than a member sends, is refused whole.

Homes are computed over the members as last read, this broker and the caller counted among them (each reads itself
a moment before the others read it). A member whose reading differs for a moment (one joining or leaving) may be
refused a call or have ids passed over; it asks again at its next look at the members, as it does when a home does
not answer.
"""

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.clientids.ids import home_of

__all__ = ["Asks"]


class Asks:
    """See the module doc. ``broker_id``: this broker's; ``members()``: the members as last read
    (``Members.current``: ``{broker id: ...}``, None while ZooKeeper cannot be read); ``linked(broker_id)``: a
    follow of this broker by that peer is open now, admitted while it was a member (``MqttCluster.follows_here``;
    none by default)."""

    def __init__(self, broker_id, members, linked=lambda _broker_id: False):
        self.broker_id = broker_id
        self._members = members
        self._known = {}  # the last reading that was not None
        self.linked = linked
        self.refused = 0  # calls and links refused since the start
        #: op -> check(caller, request) -> (refusal, request)
        self._checks = {"register": self._register, "registers": self._registers, "give_up": self._give_up,
                        "hold": self._homed_here,
                        "release": self._homed_here, "drop": self._homed_by_caller}

    def summary_values(self):
        """The ``stats`` summary's pairs: the peers' links and calls refused since the start."""
        return [("mqtt_cluster_peer_calls_refused", self.refused)]

    def members(self):
        """The member ids as ZooKeeper last said."""
        current = self._members()
        if current is not None:
            self._known = current
        return self._known

    def stranger(self, broker_id):
        """Why peer ``broker_id`` may not be served, or None: it is a member and not this broker, or ZooKeeper dropped
        it while its follow of this broker stayed open (``linked``: cut off from ZooKeeper only, it keeps its links
        and its sessions)."""
        if broker_id == self.broker_id:
            return "broker %d is this broker" % broker_id
        if broker_id not in self.members() and not self.linked(broker_id):
            return "broker %d is no member of the MQTT cluster (ZooKeeper names %s)" % (broker_id,
                                                                                     sorted(self.members()))
        return None

    def admit(self, caller, request):
        """``(refusal, request)``: why ``caller``'s ``request`` (a decoded call) is refused, or None and the request
        to serve (the ids it may not name passed over)."""
        refusal = self.stranger(caller)
        if refusal is None:
            check = self._checks.get(request.get("op"))
            if check is not None:
                try:
                    refusal, request = check(caller, request)
                except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
                    refusal = "a malformed %r call (%s: %s)" % (request.get("op"), type(exc).__name__, exc)
        if refusal is not None:
            self.refused += 1
        return refusal, request

    def _with(self, caller):
        """The member ids, this broker and ``caller`` among them (a member reads itself a moment before the others
        read it: the homes it computes then are those every broker computes once they have)."""
        return set(self.members()) | {self.broker_id, caller}

    def _register(self, caller, request):
        return self._not_homed_here(caller, request, self._with(caller)), request

    def _not_homed_here(self, caller, request, members):
        """Why this broker may not register ``request``'s client id for ``caller`` (None: it may), ``members`` being
        the ids its home is chosen among (``_with``)."""
        client_id = _text(request["c"])
        home = home_of(client_id, members)
        if home != self.broker_id:
            return ("broker %d asked broker %d to register client id %s, whose home is broker %s: only its home "
                    "registers it" % (caller, self.broker_id, client_id, home))
        return None

    def _registers(self, caller, request):
        """A batch of registrations: at most MQTT_CLUSTER_ID_BATCH, each of the shape ``register`` takes (else the
        call is refused whole); those whose id is homed elsewhere refused one by one (``refused``: the reason of each,
        or None), the others served."""
        entries = _batch(request["r"])
        members = self._with(caller)
        refused = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("clean"), bool):
                raise TypeError("an entry %r is not a registration" % (entry,))
            refused.append(self._not_homed_here(caller, entry, members))
        return None, dict(request, refused=refused)

    def _give_up(self, caller, request):
        client_id = _text(request["c"])
        home = home_of(client_id, self._with(caller))
        if home != caller:
            return ("broker %d asked to take client id %s, whose home is broker %s: only its home may"
                    % (caller, client_id, home)), request
        if request.get("to") is not None and request["to"] not in self.members():
            return "broker %d asked to hand client id %s to broker %r, no member" % (caller, client_id,
                                                                                     request["to"]), request
        return None, request

    def _homed_here(self, caller, request):
        ids = _batch(request["ids"])
        members = self._with(caller)
        kept = [c for c in ids if home_of(_text(c), members) == self.broker_id]
        out = dict(request, ids=kept)
        for key in ("rec", "clean"):
            if key in request:
                out[key] = [_text(c) for c in _batch(request[key])]
        return None, out

    def _homed_by_caller(self, caller, request):
        members = self._with(caller)
        kept = []
        for entry in _batch(request["ids"]):
            if not isinstance(entry, list) or len(entry) < 2 or not isinstance(entry[1], int):
                raise ValueError("an entry %r is not [client id, generation, ...]" % (entry,))
            if home_of(_text(entry[0]), members) == caller:
                kept.append(entry)
        return None, dict(request, ids=kept)


def _batch(ids):
    if not isinstance(ids, list):
        raise TypeError("ids must be a list")
    if len(ids) > mqttcluster_limits.MQTT_CLUSTER_ID_BATCH:
        raise ValueError("%d ids in one call: at most %d (MQTT_CLUSTER_ID_BATCH)" % (len(ids),
                                                                                    mqttcluster_limits.MQTT_CLUSTER_ID_BATCH))
    return ids


def _text(value):
    if not isinstance(value, str):
        raise TypeError("a client id must be a string, not %s" % type(value).__name__)
    return value

