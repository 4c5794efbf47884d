"""A client id is the cluster's: one live session per client id across the brokers of a ZooKeeper root (service:
the server layer; docs/mqtt.md "A client id across the cluster", docs/architecture.md "MQTT cluster: client ids").

**Members** are the masters registered under ``<root>/brokers/ids/<id>`` with a replication port, as the cluster's
one reader of them says (``members.Members``: it wakes this service when they change; a home not told yet is told
again every ``MQTT_CLUSTER_MEMBERS_POLL_S``). A broker that is no member (a slave, no ZooKeeper, no replication port)
serves client ids as a broker alone does.

**A CONNECT** (``join``, before the port's own ``claim``) asks the id's home (``ids.home_of``) to register this
broker as its holder. The home serialises each id (one registration of an id at a time): when another broker holds
it, the home asks that broker to give it up (``MqttPort.give_up``: its connection taken over, MQTT 5 DISCONNECT
0x8E, its will as on one broker, its session ended in its own sessions' log) and passes the session it got
(``handover.export``) back in its answer; this broker writes it to its own log (``handover.adopt``) and the CONNECT
goes on as a takeover on one broker does (Session Present 1). Clean Start 1: the holder just ends it.

**The takeover's end** (``_takeover_end``, before the CONNACK, within MQTT_HANDOVER_END_S): the peers must copy for
the session here from where the old holder stopped. This broker adds the session's filters to its route and waits
until every peer acts on it (``MqttCluster.routed``) and its own copies of each origin partition reached where the old
holder's stood when it handed the session over (the give_up's ``stop``: a broker that already copied for these
filters may be behind it; ``_start``); at that instant its subscriptions' read positions (this broker's log ends) and
its copies' positions of each peer (``MqttCluster.positions_for``) are where it gets the session's messages itself.
It then asks the old holder for the rest (``rest``): the holder kept the session's filters in its route since it gave
it up (``MqttCluster.pin``, for MQTT_HANDOVER_LINGER_S at most, MQTT_HANDOVER_MAX_LINGERING
sessions), waits until its own copies reach those positions, and hands what its log and its inbox got for the
session past where its handover stopped and before those positions (``handover.rest``): every message once, from
one side or the other. Every
CONNECT of the id here past its registration and not yet claimed is waited for (``finished``) before a later one
takes the id from here; one still not live past that wait, or whose answer comes only after it (held back in a
batch), is refused (``_overtake``: an answer at or before the generation given up), so two brokers never both go
live with one id.

**Failures.** The home unreachable (``MQTT_CLUSTER_CALL_TIMEOUT_S``): the CONNECT is refused, MQTT 5 0x88 Server
unavailable, 3.1.1 0x03, rather than risk two live sessions; the device retries. The holder unreachable: after
``HOLDER_TIMEOUT_S`` (half that) the home registers the new broker anyway, which goes on with what it has (its
own last record of the session, or a new one); the home tells the old holder, once it answers, to end its copy
(``drop``); one that left and comes back re-registers the ids it holds and is told to end those registered
elsewhere meanwhile (``hold``). Which of two re-registered copies stands is a rule (``HomeRegistry.hold``), not
the order the holds reach the home in: a copy its broker recovered from its log at its start (or learned as a
slave before its promotion), with no CONNECT since (``MqttPort.recovered``), gives way to one another broker
holds live; that broker is told to end it (``drop``). A member that leaves takes its ids out of its homes'
registries. A copy ended so goes as the device's CONNECT that made the standing copy would have ended it on one
broker (``_drop``): after a Clean Start 0 one its pending will is dropped, else published.

**Leases** (``_lease_loop``, kept by ``leases.Leases``): a broker keeps a connection of an id whose home is another
broker only while it holds a lease of that home: a call to it answered (``lease``, every quarter of
``mqtt.cluster_id_lease_s``, posted on the open link so that it waits behind no greenlet, or any other: ``_call``),
valid for the lease from when the call was sent, less a quarter of it and a margin (``_end_unleased``). Past it (the
home cut off, or down and not yet gone from ZooKeeper) the connections of the ids homed there are closed (MQTT 5:
DISCONNECT 0x9C Use another server; the will as for a network failure), as a deposed master closes its sessions. A
home that cannot reach the holder of an id registers another broker only once the holder's lease surely ran out since
the home last heard from it (any call from it: ``Leases.heard``), within the registration's bound (else the CONNECT
is refused, 0x88, and retried): two live connections of one id do not overlap, however the brokers are cut.

**No ZooKeeper write per device**: registries live in memory on the homes; when the members change each broker
tells the homes of the ids it holds (those whose home changed or restarted), ``MQTT_CLUSTER_ID_BATCH`` a call, and
sessions that end are told to their homes every ``MQTT_CLUSTER_RELEASE_S`` in batches.
"""

import itertools
import logging
import time
from collections import OrderedDict

import gevent
from gevent.event import Event
from gevent.lock import Semaphore

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqtt import wire
from metaq.mqttcluster.clientids import handover
from metaq.mqttcluster.clientids.calls import PeerUnreachable
from metaq.mqttcluster.clientids.ids import HomeRegistry, RegistryFull, home_of
from metaq.mqttcluster.clientids.leases import Leases
from metaq.mqttcluster.clientids.registrations import Registrations
from metaq.serving.connections import share_loop

log = logging.getLogger(__name__)

__all__ = ["ClientIds"]

#: Seconds the home waits for the holder's answer: half a registration's bound, so the CONNECT that waits for the
#: home learns the outcome either way; the holder waits at most half of it for a CONNECT of its own to go live.
HOLDER_TIMEOUT_S = mqttcluster_limits.MQTT_CLUSTER_CALL_TIMEOUT_S / 2


def _bound_of_register():
    """When (monotonic) a registration arriving now must be answered: before its caller's call bound runs out."""
    return time.monotonic() + mqttcluster_limits.MQTT_CLUSTER_CALL_TIMEOUT_S - HOLDER_TIMEOUT_S / 5


def _failed(exc):
    """The answer of a registration that failed with ``exc`` (its caller's CONNECT is refused, the link goes on)."""
    return {"error": "%s: %s" % (type(exc).__name__, exc)}


class ClientIds:
    """See the module doc. ``port``: the MQTT port; ``members``: the cluster's ``members.Members``; ``client``: a
    ``calls.PeerClient``; ``is_member``: True while this broker is a master with a replication port; ``cluster``:
    the MQTT cluster's following (``following.peers.MqttCluster``: its route and copies' positions, for the
    takeover's end; None: no takeover's end)."""

    def __init__(self, port, store, members, broker_id, client, max_ids, max_transfer, is_member,
                 lease_s=mqttcluster_limits.MQTT_CLUSTER_ID_LEASE_S,
                 share_percent=mqttcluster_limits.MQTT_CLUSTER_HOLDER_SHARE_PERCENT,
                 cluster=None):
        self.port, self.store, self.members_reader = port, store, members
        self.broker_id = broker_id
        self.client = client
        self.max_transfer = max_transfer
        self.is_member = is_member
        self.registry = HomeRegistry(max_ids, broker_id, share_percent)
        self.members = {}  # broker id -> its replication address "host:port"
        self._owners = {}  # broker id -> (address, its node's ZooKeeper session): a restart is a change
        self._serial = {}  # client id -> Semaphore: one registration of an id at a time, on its home
        #: client id -> [Event, n]: n CONNECTs here registered and not yet claimed (the Event set when none is left)
        self._finishing = {}
        #: client id -> the latest generation given up here while a CONNECT of it was being registered or claimed:
        #: one answered at it or before is refused (``join``); kept while such a CONNECT is (``_settle_given``)
        self._given = {}
        self._pending = {}  # client id -> registrations this broker sent to its home and has no answer to yet
        self._answered = {}  # client id -> the generation of the last registration answered here
        self._generations = itertools.count(1)  # the home's: each registration of an id gets the next
        self._released = set()  # client ids whose sessions ended here, not yet told to their homes
        #: broker id -> {client id: (generation, continued)}: ids it held when it did not answer (or a recovered
        #: copy of), to end there; continued: the standing copy was made by a Clean Start 0 CONNECT (``_drop``)
        self._owed = {}
        #: the calls this broker answers as a home or a holder (op -> ``fn(caller, request) -> answer``), served on
        #: the replication port by the cluster's ``serve.PeerServer``
        self.calls = {op: self._heard_by(fn) for op, fn in (
            ("register", self._register), ("registers", self._registers), ("give_up", self._give_up),
            ("hold", self._hold), ("release", self._release),
            ("drop", self._drop), ("rest", self._rest), ("lease", lambda _caller, _request: {}))}
        self.lease_s = lease_s
        self.leases = Leases(broker_id, lease_s)  # of the homes, held here; the holders', heard here
        self.lease_closed = 0  # connections closed: the lease of their id's home ran out
        self._members_wake = Event()
        self.cluster = cluster
        #: (client id, taking broker) -> (until, SavedSession, {(topic, partition): where its handover stopped}):
        #: sessions given up here whose taker may ask for the rest (``_rest``), oldest first, at most
        #: MQTT_HANDOVER_MAX_LINGERING
        self._lingering = OrderedDict()
        self.max_lingering = mqttcluster_limits.MQTT_HANDOVER_MAX_LINGERING
        self.ends_short = 0  # takeovers whose end did not complete within MQTT_HANDOVER_END_S (what came went on)
        self.takeovers = 0  # sessions this broker took from another
        self.refused = 0  # CONNECTs refused: the home unreachable, or its registry full
        self.holds_refused = 0  # ids this home did not register (a CONNECT's, a hold's): full, or the holder's share
        #: this broker's registrations with each home, batched (``registrations.Registrations``)
        self.registrations = Registrations(self._send_registers)
        self._greenlets = []
        self._told_all = False  # every id held here was told to its home since this broker became a member
        self._joined_at = None  # when this broker was last seen becoming a member (monotonic), None: it is none

    # -- this broker's CONNECTs ----------------------------------------------------------------------------------

    def active(self):
        return bool(self.members) and self.broker_id in self.members and self.is_member()

    def join(self, client_id, clean_start, user):
        """A CONNECT of ``client_id`` here: registered with its home, the session taken from the broker that held
        it (adopted here). Returns None to go on, or ``(reason code, why)`` to refuse the CONNECT with."""
        if not self.active():
            return None
        request = {"op": "register", "c": client_id, "clean": bool(clean_start), "u": user}
        home = home_of(client_id, self.members)
        self._pending[client_id] = self._pending.get(client_id, 0) + 1
        answer = None
        try:
            if home == self.broker_id:
                answer = self._register(self.broker_id, request)
            else:
                answer = self.registrations.register(home, request, self.client.timeout_s)
        except PeerUnreachable as exc:
            answer = {"error": "the home broker %d of client id %s is unreachable (%s): try again" % (
                home, client_id, exc)}
        finally:
            left = self._pending.pop(client_id) - 1
            if left:
                self._pending[client_id] = left
            if answer is None:  # an error past PeerUnreachable (the greenlet killed): nothing of it is kept
                self._settle_given(client_id)
        if "error" in answer:
            self._settle_given(client_id)
            self.refused += 1
            code = wire.QUOTA_EXCEEDED if answer.get("full") else \
                wire.CLIENT_ID_NOT_VALID if answer.get("refused") else wire.SERVER_UNAVAILABLE
            return code, answer["error"]
        self._answered[client_id] = max(self._answered.get(client_id, 0), answer.get("gen", 0))
        claiming = self._finishing.setdefault(client_id, [Event(), 0])
        claiming[1] += 1
        try:
            return self._go_on(client_id, answer, user)
        except BaseException:
            self.finished(client_id)
            raise

    def _go_on(self, client_id, answer, user):
        """A CONNECT of ``client_id`` the home registered here (``answer``): the session it passed on adopted, unless
        a give_up here passed this registration meanwhile (``_given``). ``join``'s result."""
        self._released.discard(client_id)
        state = answer.get("session")
        problem = handover.problem(state, client_id) if state is not None else None
        if problem is not None:  # nothing of it taken; the CONNECT refused as if the home were unreachable
            self.refused += 1
            self.finished(client_id)
            log.warning("mqtt client %s: its session from broker %s is refused: %s", client_id, answer.get("from"),
                        problem)
            return wire.SERVER_UNAVAILABLE, "the session of client id %s from another broker is refused: %s" % (
                client_id, problem)
        if state is not None:
            key = ("taking", client_id, answer.get("gen", 0))
            try:
                cursors = self._takeover_end(client_id, state, answer, key)
                handover.adopt(self.port, self.store, state, user, cursors)
            finally:
                if self.cluster is not None:
                    self.cluster.unpin(key)  # the session's record holds its filters now
            self.takeovers += 1
            log.info("mqtt client %s: its session came from broker %d (%d messages not acknowledged%s)", client_id,
                     answer.get("from", -1), len(state["inf"]) + len(state["queued"]),
                     ", %d dropped past the bounds" % state["dropped"] if state.get("dropped") else "")
        if answer.get("gen", 0) <= self._given.get(client_id, -1):  # a later registration elsewhere took the id
            self.finished(client_id)
            if state is not None and not self.port.holds(client_id):
                self.port.end_session(client_id)  # it went on from what was here before: this copy is not the id's
            self.refused += 1
            return wire.SERVER_UNAVAILABLE, "client id %s was registered on another broker while this CONNECT was " \
                "registered or took its session over: try again" % client_id
        return None

    def _takeover_end(self, client_id, state, answer, key):
        """The takeover's end (the module doc): the session's read positions here (``_start``), and ``state``'s queued
        messages joined by what the old holder got for it since its handover (``rest``). Within MQTT_HANDOVER_END_S;
        past it, or the holder unreachable, it goes on with what came (logged, counted: what the holder got since
        may be missed, or come twice)."""
        cluster = self.cluster
        if cluster is None:
            return None
        deadline = time.monotonic() + mqttcluster_limits.MQTT_HANDOVER_END_S
        cursors, upto, short = self._start(state, answer, key, deadline)
        holder = answer.get("from", -1)
        address = self.members.get(holder)
        if not answer.get("rest") or address is None:  # an older holder keeps no rest; one gone took it with it
            self._ended_short(client_id, holder, short)
            return cursors
        request = {"op": "rest", "c": client_id, "upto": handover.positions_wire(upto),
                   "wait": max(0.0, deadline - time.monotonic() - 0.05)}  # its answer's way back within the end
        try:
            rest = self._call(holder, address, request, max(0.05, deadline - time.monotonic()))
        except PeerUnreachable as exc:
            rest = {"error": str(exc)}
        if "error" not in rest:
            problem = handover.rest_problem(rest)
            if problem is not None:
                rest = {"error": problem}
        if "error" in rest or not rest.get("complete", False):
            short = short or "%s: what reached broker %d for it meanwhile may be missed" % (
                rest.get("error") or "broker %d's copies did not catch up" % holder, holder)
        self._ended_short(client_id, holder, short)
        queued = rest.get("queued", ())
        room = max(0, mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES - len(state["inf"]) - len(state["queued"]))
        state["queued"].extend(queued[:room])
        dropped = rest.get("dropped", 0) + max(0, len(queued) - room)
        if dropped:
            state["dropped"] = state.get("dropped", 0) + dropped
        return cursors

    def _ended_short(self, client_id, holder, why):
        """Count and log a takeover's end that did not complete (``why``, None: it did)."""
        if why:
            self.ends_short += 1
            log.warning("mqtt client %s: the end of its takeover from broker %d did not complete within "
                        "MQTT_HANDOVER_END_S: %s", client_id, holder, why)

    def _start(self, state, answer, key, deadline):
        """Where the session taken over (``state``, the old holder's ``answer``) starts reading here: ``(cursors,
        upto, short)``. Its filters pinned in the route (``key``, until the session's record holds them) and every
        peer acting on it (``MqttCluster.routed``), this broker's copies of each origin partition at or past where the
        holder's stood when it exported the session (its ``stop``: what is before came in the handover; a broker that
        already copied for these filters may be behind it), and those copies readable; then, with nothing yielded
        between, ``cursors`` (this broker's log ends: ``handover.cursors_of``) and ``upto`` (its copies' positions
        of each origin, its own log's ends as its own: the rest the holder hands ends there). ``short``: why not all
        of it held by ``deadline`` (the session starts there all the same), or None."""
        cluster = self.cluster
        filters = [sub[0] for sub in state["subs"]]
        cluster.pin(key, filters)
        short = None if cluster.routed(filters, deadline) else "a peer's link was down or it did not act on the route"
        try:
            stop = handover.positions_read(answer.get("stop", []))
        except (TypeError, ValueError) as exc:
            stop, short = {}, short or "the positions where its handover stopped are malformed (%s): what this " \
                "broker copied before them may come twice" % exc
        if not self._caught_up(stop, deadline):
            short = short or "this broker's copies did not reach where its handover stopped: what is before may " \
                "come twice"
        while not cluster.inbox_visible(cluster.inbox_marks()):  # the positions count the copies the reads start past
            if time.monotonic() >= deadline:
                short = short or "copies the positions count were not readable here yet: they may come twice"
                break
            gevent.sleep(0.002)
        cursors = handover.cursors_of(self.store, state["subs"])  # nothing yielded since
        upto = cluster.positions_for(filters)
        upto[self.broker_id] = {k: o for k, o in cursors.items() if k[0] not in self.port.cluster_topics}
        return cursors, upto, short

    def finished(self, client_id):
        """A CONNECT of ``client_id`` here claimed it (or was refused): once no other is between its registration and
        its claim, a later takeover may go on."""
        claiming = self._finishing.get(client_id)
        if claiming is None:
            return
        claiming[1] -= 1
        if claiming[1] <= 0:
            del self._finishing[client_id]
            claiming[0].set()
            self._settle_given(client_id)

    def _settle_given(self, client_id):
        """Forget the generation given up of ``client_id`` once no CONNECT of it here awaits its answer or its claim:
        ``_given`` holds only ids with a CONNECT under way (bounded by the connections)."""
        if not self._pending.get(client_id) and client_id not in self._finishing:
            self._given.pop(client_id, None)

    def released(self, client_id):
        """No connection nor session of ``client_id`` is left here: its home is told (batched)."""
        if self.active():
            self._released.add(client_id)

    # -- the home's side -------------------------------------------------------------------------------------------

    def _register(self, caller, request):
        client_id = request["c"]
        serial = self._serial.get(client_id)
        if serial is None:
            serial = self._serial[client_id] = [Semaphore(), 0]  # the lock, and how many use or wait for it
        serial[1] += 1
        deadline = _bound_of_register()
        try:
            with serial[0]:
                return self._register_one(caller, client_id, request, deadline)
        finally:
            serial[1] -= 1
            if not serial[1]:
                del self._serial[client_id]

    def _registers(self, caller, request):
        """A batch of registrations (``registrations.Registrations``): each entry registered as its own ``register``
        call would be, each serialised with its id's others, their answers in the entries' order; an entry ``asks``
        refused (``refused``: its reason, or None) answered with the refusal. An entry that asks nothing of another
        broker (``_answered_at_once``) is answered in this turn; one that may wait (a takeover, its id's registration
        under way here, an earlier entry of its id waiting) in a greenlet of its own, all of those at once."""
        entries = request["r"]
        refused = request.get("refused") or [None] * len(entries)
        answers = [None] * len(entries)
        going, waiting_ids = {}, set()
        for i, (entry, why) in enumerate(zip(entries, refused, strict=True)):
            if why is not None:
                answers[i] = {"error": why, "refused": True}
                continue
            try:
                call = dict(entry, op="register")
                if call["c"] in waiting_ids or not self._answered_at_once(caller, call["c"]):
                    waiting_ids.add(call["c"])
                    going[i] = gevent.spawn(self._register, caller, call)
                else:
                    answers[i] = self._register(caller, call)
            except Exception as exc:  # noqa: BLE001 - that entry's caller is told, as a greenlet's failure is
                answers[i] = _failed(exc)
        gevent.joinall(list(going.values()))
        for i, greenlet in going.items():
            answers[i] = greenlet.value if greenlet.successful() else _failed(greenlet.exception)
        return {"a": answers}

    def _answered_at_once(self, caller, client_id):
        """True when registering ``client_id`` for ``caller`` asks nothing of any broker and waits for nothing: no
        registration of it under way here and no holder but the caller (a reconnect where it was, a first
        connect)."""
        return client_id not in self._serial and self.registry.holder(client_id) in (None, caller)

    def _send_registers(self, home, requests, timeout_s):
        """``requests`` to ``home`` in one call: an answer per request. A lone one goes as a plain ``register`` call
        (what a home of any version answers, no batch of one); more as one ``registers`` call (to a home of the
        version before: a ``register`` call each, each answer or the PeerUnreachable of its own call). Raises
        PeerUnreachable."""
        address = self.members.get(home)
        if address is None:
            raise PeerUnreachable("broker %s is no member now" % home)
        if len(requests) == 1:
            return [self._call(home, address, requests[0], timeout_s)]
        answer = self._call(home, address, {"op": "registers", "r": requests}, timeout_s)
        if "error" in answer and "unknown call" in str(answer["error"]):
            return self._register_each(home, address, requests, timeout_s)
        if "error" in answer:
            return [answer] * len(requests)
        answers = answer.get("a")
        if not isinstance(answers, list) or len(answers) != len(requests) or \
                not all(isinstance(a, dict) for a in answers):
            raise PeerUnreachable("broker %s answered %d registrations with no answer each" % (home, len(requests)))
        return answers

    def _register_each(self, home, address, requests, timeout_s):
        """``requests`` as a ``register`` call each, at once (a home of the version before)."""
        calls = [gevent.spawn(self._call, home, address, request, timeout_s) for request in requests]
        gevent.joinall(calls)
        return [c.value if c.successful() else c.exception if isinstance(c.exception, PeerUnreachable)
                else PeerUnreachable(str(c.exception)) for c in calls]

    def _register_one(self, caller, client_id, request, deadline=None):
        old = self.registry.holder(client_id)
        refusal = self.registry.refusal(client_id, caller)  # before a holder gives anything up
        if refusal is not None:
            self.holds_refused += 1
            return {"error": "client id %s cannot be registered: %s" % (client_id, refusal), "full": True}
        answer = {}
        if old is not None and old != caller:
            got = self._take_from(old, caller, request, _bound_of_register() if deadline is None else deadline)
            if "error" in got:
                return got
            answer = got
        generation = next(self._generations)
        try:
            self.registry.register(client_id, caller, generation, clean=bool(request["clean"]), checked=True)
        except RegistryFull as exc:
            return {"error": str(exc), "full": True}
        if answer.pop("unreached", False):  # told to end its copy once it answers: never two live sessions
            self._owed.setdefault(old, {})[client_id] = (generation, not request["clean"])
        answer["gen"] = generation
        return answer

    def _take_from(self, holder, caller, request, deadline):
        """Ask ``holder`` to give the id up for ``caller``: its answer (``{"session": ...}``, ``{}``, an error). A
        holder that does not answer is passed over once its lease surely ran out (``Leases.gone``), by ``deadline``;
        else an error (the CONNECT is refused and retried)."""
        ask = {"op": "give_up", "c": request["c"], "clean": request["clean"], "u": request.get("u"), "to": caller,
               "gen": self.registry.generation(request["c"])}
        if holder == self.broker_id:
            return self._give_up(self.broker_id, ask)
        address = self.members.get(holder)
        if address is None:
            return {}  # it left the cluster: its sessions went with it
        try:
            return self._call(holder, address, ask, HOLDER_TIMEOUT_S)
        except PeerUnreachable as exc:
            gone = self.leases.gone(holder)
            if gone > deadline:
                return {"error": "client id %s is held by broker %d, unreachable (%s); its lease of the id runs out "
                                 "in %.1f s (mqtt.cluster_id_lease_s): try again" % (
                                     request["c"], holder, exc, gone - time.monotonic())}
            gevent.sleep(max(0.0, gone - time.monotonic()))
            log.warning("mqtt client %s: broker %d held it and is unreachable (%s), its lease ran out: broker %d goes "
                        "on without its session, and broker %d is told to end it once it answers", request["c"],
                        holder, exc, caller, holder)
            return {"unreached": True}

    # -- the holder's side -----------------------------------------------------------------------------------------

    def _give_up(self, caller, request):
        client_id = request["c"]
        deadline = time.monotonic() + HOLDER_TIMEOUT_S / 2
        self._await_answer(client_id, request.get("gen", 0), deadline)
        claiming = self._finishing.get(client_id)
        if claiming is not None:  # the CONNECTs here going live (every one): taken over once they are
            claiming[0].wait(max(0.0, deadline - time.monotonic()))
        refusal, saved = self.port.give_up(client_id, request["clean"], request.get("u"))
        if refusal is not None:
            return {"error": refusal, "refused": True}
        self._overtake(client_id, request.get("gen", 0))  # nothing yielded since the give_up
        self._released.discard(client_id)
        if saved is None:
            return {"from": self.broker_id}
        log.info("mqtt client %s: connected to broker %d; its session moves there", client_id, request.get("to"))
        key = (client_id, request.get("to", -1))
        if self.cluster is not None:  # pinned before anything yields: the peers never stop copying for it
            self._linger(key, saved)
        ends = {}
        session = handover.export(self.store, saved, self.max_transfer, ends=ends)
        answer = {"session": session, "from": self.broker_id, "rest": self.cluster is not None}
        if self.cluster is not None:
            if key in self._lingering:
                self._lingering[key] = (self._lingering[key][0], saved, ends)
            answer["stop"] = handover.positions_wire(self._stopped(saved, ends))
        return answer

    def _stopped(self, saved, ends):
        """Where the handover of ``saved`` stopped, per origin: ``{origin: {(topic, partition): offset}}``, this
        broker's copies of each peer's partitions the session reads (taken once ``export`` read its inbox: at or
        past each copy it handed) and its own log's ends where ``export``'s reads stopped (``ends``). The taker's
        own copies start past them (``_start``)."""
        stop = self.cluster.positions_for([sub[0] for sub in saved.subscriptions])
        stop[self.broker_id] = {k: o for k, o in ends.items() if k[0] not in self.port.cluster_topics}
        return stop

    def _linger(self, key, saved):
        """Keep what the takeover's end asks of the session ``saved`` given up here (``_rest``): its filters in the
        route, for MQTT_HANDOVER_LINGER_S, at most ``max_lingering`` sessions (past it the oldest goes, logged)."""
        while len(self._lingering) >= self.max_lingering:
            old, _kept = self._lingering.popitem(last=False)
            self.cluster.unpin(("given",) + old)
            log.warning("mqtt client %s: %d sessions given up await their takeover's end (MQTT_HANDOVER_MAX_LINGERING):"
                        " what reaches this broker for it after its handover is not handed on", old[0],
                        self.max_lingering)
        self._lingering[key] = (time.monotonic() + mqttcluster_limits.MQTT_HANDOVER_LINGER_S, saved, {})
        self.cluster.pin(("given",) + key, [sub[0] for sub in saved.subscriptions])

    def _behind(self, upto, reads):
        """True when this broker's copy of one of another origin's partitions in ``upto`` (``{origin: {(topic,
        partition): offset}}``) is before its offset there, or has no position yet while this broker's route reads
        its topic (``reads``: ``MqttCluster.topics_read``; its copy is yet to begin) and the offset is past 0; other
        greenlets run during the look (``share_loop``). Its own log (``upto``'s own origin) is no copy: never behind.
        Both ends of a takeover wait on it: the holder for the taker's positions, the taker for the holder's stops."""
        positions, turn = self.cluster.positions, time.monotonic()
        read, every = reads
        for origin, wanted in upto.items():
            if origin == self.broker_id:
                continue
            for (topic, partition), offset in wanted.items():
                at = positions.get(origin, topic, partition)
                if (at is None and offset > 0 and (every or topic in read)) or (at is not None and at < offset):
                    return True
                turn = share_loop(turn)
        return False

    def _expire_lingering(self):
        now = time.monotonic()
        while self._lingering:
            key, (until, _saved, _ends) = next(iter(self._lingering.items()))
            if until > now:
                return
            del self._lingering[key]
            self.cluster.unpin(("given",) + key)

    def _rest(self, caller, request):
        """The takeover's end on the broker that gave the session up (the module doc): once its copies reach the
        taker's positions (``upto``, within the request's ``wait``), what reached it for the session since its
        handover and before them (``handover.rest``); ``complete`` false when its copies did not catch up. The
        session's filters leave the route."""
        key = (request["c"], caller)
        kept = self._lingering.pop(key, None)
        if kept is None:
            return {"error": "client id %s: no handover to broker %d kept here (past MQTT_HANDOVER_LINGER_S or "
                             "MQTT_HANDOVER_MAX_LINGERING)" % key}
        try:
            _until, saved, ends = kept
            try:
                upto = handover.positions_read(request["upto"])
                wait = min(float(request.get("wait", 0)), mqttcluster_limits.MQTT_HANDOVER_END_S)
            except (KeyError, TypeError, ValueError) as exc:
                return {"error": "client id %s: a call for the rest of its handover that is not [[origin, [[topic, "
                                 "partition, offset], ...]], ...] (%s): nothing handed" % (key[0], exc)}
            deadline = time.monotonic() + wait
            complete = self._caught_up(upto, deadline)
            marks = self.cluster.inbox_marks()  # what the positions count is read (visible) before the read
            while not self.cluster.inbox_visible(marks):
                if time.monotonic() >= deadline:
                    complete = False
                    break
                gevent.sleep(0.002)
            answer = handover.rest(self.store, saved, ends, upto, self.broker_id, self.max_transfer)
            answer["complete"] = complete
            return answer
        finally:
            self.cluster.unpin(("given",) + key)

    def _caught_up(self, upto, deadline):
        """Wait, until ``deadline`` at most, until this broker's copies of each other origin's partition in ``upto``
        that its route reads reach the position there; True when they did."""
        reads = self.cluster.topics_read()
        while True:
            if not self._behind(upto, reads):
                return True
            if time.monotonic() >= deadline:
                return False
            gevent.sleep(0.005)

    def _overtake(self, client_id, generation):
        """A registration elsewhere, later than this broker's of ``generation`` (the home's count), took ``client_id``
        from here: a CONNECT of it here answered at that generation or before and not live yet (its answer on its
        way, or taking a session over past the holder's wait) is refused rather than made live (``join``)."""
        if generation and (self._pending.get(client_id) or client_id in self._finishing):
            self._given[client_id] = max(self._given.get(client_id, 0), generation)

    def _await_answer(self, client_id, generation, deadline):
        """Wait, until ``deadline`` at most, while a CONNECT of ``client_id`` here waits for its home's answer and
        no registration here of ``generation`` or later was answered yet: that CONNECT goes live (or is refused)
        before a call that would end what this broker holds of the id acts on it."""
        while self._pending.get(client_id) and self._answered.get(client_id, 0) < generation and \
                time.monotonic() < deadline:
            gevent.sleep(0.005)

    def _hold(self, caller, request):
        """A re-registration: ``caller`` holds these ids (``rec``: those of them it recovered at its start, no
        connection claimed since; ``clean``: those of the others a Clean Start 1 CONNECT began there, absent: not
        known). Answers the ones whose registered holder stands (``HomeRegistry.hold``): the caller ends its copy of
        them (``cont``: those whose standing copy a Clean Start 0 CONNECT made, as ``_drop``). A holder whose
        recovered copy gives way to the caller's live one is told to end it (``_drop`` at generation 0: not once a
        CONNECT there registered it again). Ids this home cannot register (its registry full, or the caller's share
        of it taken) are not: the caller goes on serving them, a takeover from another broker not finding them (one
        warning a call)."""
        drop, cont, unregistered = [], [], []
        recovered = set(request.get("rec", ()))
        began_clean = set(request["clean"]) if "clean" in request else None
        for client_id in request["ids"]:
            clean = None if client_id in recovered or began_clean is None else client_id in began_clean
            try:
                loser = self.registry.hold(client_id, caller, client_id in recovered, clean)
            except RegistryFull as exc:
                unregistered.append((client_id, exc))
                continue
            if loser == caller:
                drop.append(client_id)
                if self.registry.clean(client_id) is False:
                    cont.append(client_id)
            elif loser is not None:
                log.info("mqtt client %s: broker %d holds it live; the copy broker %d recovered at its start ends",
                         client_id, caller, loser)
                if loser == self.broker_id:
                    self._drop(self.broker_id, {"ids": [[client_id, 0, clean is False]]})
                else:
                    self._owed.setdefault(loser, {})[client_id] = (0, clean is False)  # told by ``_settle_owed``
        if unregistered:
            self.holds_refused += len(unregistered)
            log.warning("mqtt clients %s (%d in all): broker %d holds them and this home does not register them (%s): "
                        "a takeover from another broker will not find them", unregistered[0][0], len(unregistered),
                        caller, unregistered[0][1])
        return {"drop": drop, "cont": cont}

    def _drop(self, caller, request):
        """The home registered these ids elsewhere while this broker did not answer, or over the copy this broker
        recovered at its start (generation 0): each connection and session of them here ends (MQTT 5: DISCONNECT
        0x8E), unless the id was registered here again since (a later generation answered here: a CONNECT; one whose
        answer is on its way is waited for, as ``_give_up`` does, all of a call's within one wait's bound). Each entry
        is ``[client id, generation, continued]``: ``_end_copy`` says what becomes of its will."""
        deadline = time.monotonic() + HOLDER_TIMEOUT_S / 2
        for client_id, generation, *rest in request["ids"]:
            self._await_answer(client_id, generation + 1, deadline)
            if self._answered.get(client_id, 0) > generation:
                continue
            self._overtake(client_id, generation)  # a CONNECT here answered before it is not made live either
            if self.port.holds_any(client_id):
                log.warning("mqtt client %s: registered on another broker while this one did not answer or held a "
                            "copy from before its start; its session here ends", client_id)
                self._end_copy(client_id, bool(rest and rest[0]))
        return {}

    def _end_copy(self, client_id, continued):
        """End this broker's copy of ``client_id``, which gives way to another broker's, as the CONNECT that made
        that copy would have ended it here (``MqttPort.give_up``, nothing handed on): ``continued`` (a Clean Start 0
        CONNECT) drops a will still held for its delay (MQTT 5.0 3.1.3.2.2: a new Network Connection to the session
        came within the Will Delay Interval) and publishes one with no delay (due when its connection ended); else
        (Clean Start 1: the session ended, 3.1.2.5) the will is published now. When how that copy began is not
        known (a copy recovered at a restart, a peer that does not say), the will is published: MQTT 5.0 3.1.2.5
        makes it a MUST once the connection closed and the delay passed or the session ended, and not sending it is
        the exception that only a Clean Start 0 CONNECT seen within the delay earns; the session here ends either
        way."""
        self.port.give_up(client_id, not continued, None)

    def _settle_owed(self):
        """Tell each broker that did not answer a takeover, once it does, to end the sessions it still holds of
        ids registered elsewhere meanwhile (``_drop``)."""
        for holder in list(self._owed):
            owed = self._owed[holder]
            if holder not in self.members:
                del self._owed[holder]  # it left: its sessions went with it (back, it re-registers: ``_hold``)
                continue
            ids = [[c, g, cont] for c, (g, cont) in owed.items() if self.registry.holder(c) != holder]
            try:
                for i in range(0, len(ids), mqttcluster_limits.MQTT_CLUSTER_ID_BATCH):
                    request = {"op": "drop", "ids": ids[i:i + mqttcluster_limits.MQTT_CLUSTER_ID_BATCH]}
                    if holder == self.broker_id:
                        self._drop(self.broker_id, request)
                    else:
                        self._call(holder, self.members[holder], request, exclusive=True)
            except PeerUnreachable:
                continue
            if self._owed.get(holder) is owed:
                del self._owed[holder]

    def _release(self, caller, request):
        for client_id in request["ids"]:
            self.registry.release(client_id, caller)
        return {}

    # -- leases -----------------------------------------------------------------------------------------------------

    def _heard_by(self, fn):
        """``fn``, a call's handler, that first records the caller heard from now (``Leases.gone``)."""
        def handler(caller, request):
            self.leases.heard(caller)
            return fn(caller, request)
        return handler

    def _call(self, broker_id, address, request, timeout_s=None, exclusive=False):
        """``client.call`` to member ``broker_id`` at ``address``: any answer renews this broker's lease of it (it went
        both ways; an older broker answers a ``lease`` as an unknown op), so calls queued behind others renew it too.
        A ``lease`` call goes in the turns kept for it (``PeerClient.call``). Raises PeerUnreachable."""
        sent = time.monotonic()
        answer = self.client.call(address, request, timeout_s, exclusive, lease=request.get("op") == "lease")
        self.leases.renewed(broker_id, sent)
        return answer

    def _lease_loop(self):
        while True:
            gevent.sleep(self.lease_s / 4)
            try:
                if self.active():
                    self.leases.renew(self.members, self._call, self.client.post)
                    self._end_unleased()
                else:
                    self.leases.clear()  # a member again: each home gets a lease's time (``_end_unleased``)
            except Exception:  # noqa: BLE001 - the loop must go on
                log.exception("mqtt cluster: keeping the client ids' leases failed")

    def _end_unleased(self):
        """Close the connections of the ids whose home's lease ran out (``Leases.lapsed``: a quarter of it and
        LEASE_MARGIN_S before its end, so that the closes are done by its end, its look's period and a busy loop
        included: well within the home's wait, ``Leases.gone``)."""
        lapsed = self.leases.lapsed(self.members)
        if not lapsed:
            return
        members, ended, turn = self.members, [], time.monotonic()
        for client_id in self.port.connected_ids():
            if home_of(client_id, members) in lapsed:
                ended.append(client_id)
            turn = share_loop(turn)
        if ended:
            self.lease_closed += len(ended)
            log.warning("mqtt cluster: home brokers %s not reached for %.1f s (mqtt.cluster_id_lease_s): %d "
                        "connections of the ids homed there closed", sorted(lapsed), self.lease_s, len(ended))
            self.port.lease_lost(ended, "its home broker %s is not reached" % sorted(lapsed))

    # -- members, re-registration, releases -------------------------------------------------------------------------

    def start(self):
        self.members_reader.on_change(self._members_wake.set)  # a listener: record and wake, nothing else
        self._greenlets = [gevent.spawn(self._watch), gevent.spawn(self._release_loop), gevent.spawn(self._lease_loop)]

    def stop(self):
        for g in self._greenlets:
            g.kill(block=False)
        self.leases.stop()
        self.client.close()

    def _watch(self):
        while True:
            self._members_wake.clear()
            try:
                found = self.members_reader.current
                if found is not None and (found != self._owners or (not self._told_all and self.active())):
                    self._members_changed(found)  # or a home that did not answer is told again
            except Exception:  # noqa: BLE001 - the watch must go on
                log.exception("mqtt cluster: acting on the members failed")
            self._members_wake.wait(mqttcluster_limits.MQTT_CLUSTER_MEMBERS_POLL_S)

    def _members_changed(self, found):
        before, before_owners = self.members, self._owners
        self._owners = found
        self.members = {b: address for b, (address, _owner) in found.items()}
        if found != before_owners:
            log.info("mqtt cluster: members %s", sorted(self.members))
        for gone in set(before) - set(self.members):
            self.registry.drop_holder(gone)
        members = self.members
        self.registry.forget_unless(lambda c: home_of(c, members) == self.broker_id)
        if not self.active():
            self._told_all = False  # not a member now: once it is, every id it holds is told again
            self._joined_at = None
            return
        if not self._told_all and self._joining():
            return  # told on a later look (the members are looked at every MQTT_CLUSTER_MEMBERS_POLL_S)
        every, self._told_all = not self._told_all, True
        moved = {}  # home -> ids it must learn from this broker
        for client_id in self.port.holding():
            home = home_of(client_id, members)
            was = home_of(client_id, before) if before else None
            if every or home != was or before_owners.get(home) != found.get(home):
                moved.setdefault(home, []).append(client_id)
        for home, ids in moved.items():
            for i in range(0, len(ids), mqttcluster_limits.MQTT_CLUSTER_ID_BATCH):
                self._tell_hold(home, ids[i:i + mqttcluster_limits.MQTT_CLUSTER_ID_BATCH])

    def _joining(self):
        """True for MQTT_CLUSTER_MEMBERS_POLL_S after this broker became a member: the others, who see it join
        at once, tell it (as a home) the ids they registered while it was away before it registers its own copies
        of them with itself. Which copy stands does not depend on it (a recovered copy gives way to a live one,
        ``HomeRegistry.hold``); it saves the home registering a copy here that it then has to end."""
        now = time.monotonic()
        if self._joined_at is None:
            self._joined_at = now
        return now - self._joined_at < mqttcluster_limits.MQTT_CLUSTER_MEMBERS_POLL_S

    def _tell_hold(self, home, ids):
        request = {"op": "hold", "ids": ids, "rec": [c for c in ids if self.port.recovered(c)],
                   "clean": [c for c in ids if self.port.began_clean(c)]}
        if home == self.broker_id:
            answer = self._hold(self.broker_id, request)
        else:
            try:
                answer = self._call(home, self.members[home], request, exclusive=True)
            except PeerUnreachable as exc:
                log.warning("mqtt cluster: the home broker %d of %d client ids held here is unreachable (%s); "
                            "told again at the next look at the members", home, len(ids), exc)
                self._told_all = False
                return
        continued = set(answer.get("cont", ()))
        for client_id in answer.get("drop", ()):
            log.warning("mqtt client %s: registered on another broker while this one was apart; its session here "
                        "ends", client_id)
            self._end_copy(client_id, client_id in continued)

    def _release_loop(self):
        while True:
            gevent.sleep(mqttcluster_limits.MQTT_CLUSTER_RELEASE_S)
            if self._lingering:
                self._expire_lingering()
            if self._owed:
                self._settle_owed()
            if not self._released or not self.active():
                self._released.clear()
                continue
            batch, self._released = self._released, set()
            homes = {}
            for client_id in batch:
                if self.port.holds_any(client_id) or self._pending.get(client_id):
                    continue  # connected again meanwhile
                self._answered.pop(client_id, None)
                homes.setdefault(home_of(client_id, self.members), []).append(client_id)
            for home, ids in homes.items():
                for i in range(0, len(ids), mqttcluster_limits.MQTT_CLUSTER_ID_BATCH):
                    request = {"op": "release", "ids": ids[i:i + mqttcluster_limits.MQTT_CLUSTER_ID_BATCH]}
                    if home == self.broker_id:
                        self._release(self.broker_id, request)
                        continue
                    try:
                        self._call(home, self.members[home], request, exclusive=True)
                    except PeerUnreachable:
                        pass  # its registry forgets them when this broker leaves, or keeps them: bounded as ever

    def summary_values(self):
        """The ``stats`` summary's pairs of the MQTT cluster."""
        return [("mqtt_cluster_members", len(self.members)), ("mqtt_cluster_ids_homed", len(self.registry)),
                ("mqtt_cluster_takeovers", self.takeovers), ("mqtt_cluster_refused", self.refused),
                ("mqtt_cluster_takeover_ends_short", self.ends_short),
                ("mqtt_cluster_lease_closed", self.lease_closed),
                ("mqtt_cluster_handovers_lingering", len(self._lingering)),
                ("mqtt_cluster_holds_refused", self.holds_refused),
                ("mqtt_cluster_calls", self.client.calls), ("mqtt_cluster_call_failures", self.client.failures),
                ("mqtt_cluster_calls_unmatched", self.client.unmatched),
                ("mqtt_cluster_registration_batches", self.registrations.batches),
                ("mqtt_cluster_registrations_batched", self.registrations.batched)]
