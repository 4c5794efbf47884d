"""A persistent session handed from one broker of the cluster to another (front-end: the server layer;
docs/mqtt.md "A client id across the cluster").

``export``: on the broker that held it, the session as its last state stood (``MqttPort.give_up``), as JSON: its
subscriptions, shared subscriptions, QoS 2 packet ids, and the messages it has not acknowledged, each as its
stored record (metaq topic, flag, data): those in flight (packet id and state kept: sent again with DUP, or their
PUBREL), the ones it brought from a broker before, then what its subscriptions had not yet read from this broker's
log, each at the QoS it would have been sent with. At most ``MQTT_HANDOVER_MAX_MESSAGES`` messages of
``MQTT_HANDOVER_MAX_BYTES`` together, the oldest first; the rest are dropped, counted in the answer and logged.

Both share the loop between messages (``share_loop``), as the calls' JSON is built and parsed an item at a time
(``calls._encode``/``_decode``): a handover of up to MQTT_HANDOVER_MAX_BYTES stalls the brokers' other clients no
longer than one message does.

``rest``: the handover's end, on the broker that gave the session up: what reached it for the session after it did
(its own log and its inbox past where ``export`` stopped: ``ends``), up to where the broker taking it copies for the
session itself (``upto``: per origin broker, the positions from which its own copies hold the session's filters), so
each message goes once either way: a copy whose origin record is before that position, a record of its own log
before the taking broker's position of it. Within the same bounds as ``export`` (counted apart).

``adopt``: on the broker taking it, each message is written to its own sessions' log (``MqttPort.carry``) and the
session to it (``MqttPort.adopt``), its read positions at this broker's log end when its route came to hold the
session's filters (``cursors_of``; what was published here before reached it through the broker it came from, in
``export`` or ``rest``), its messages in flight
named by their place in ``%MQTT%``, the others listed in ``carried``: the delivery sends them after those in
flight and before what its subscriptions read (``resend.send_carried``).
"""

import base64
import logging
import time

from metaq import errors

from metaq.mqtt import limits as mqtt_limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqtt.follow import SavedSession
from metaq.mqtt.records import message_of
from metaq.mqtt.resend import message_at
from metaq.mqtt.session import PUBLISH_SENT, PUBREL_SENT, MqttSession
from metaq.mqttcluster.following.inbox import INBOX, origin_of
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.clock import now_ms
from metaq.serving.connections import share_loop

log = logging.getLogger(__name__)

__all__ = ["export", "rest", "cursors_of", "problem", "rest_problem", "adopt", "positions_wire", "positions_read"]


class _Bound:
    """The messages a handover takes, within its two bounds; ``dropped`` counts those past them."""

    def __init__(self, max_messages, max_bytes):
        self.left, self.bytes_left, self.dropped = max_messages, max_bytes, 0
        self.turn = time.monotonic()  # when this turn of the loop began (``share_loop``)

    def take(self, data):
        if self.left <= 0 or len(data) > self.bytes_left:
            self.dropped += 1
            return False
        self.left -= 1
        self.bytes_left -= len(data)
        return True


def _wire(topic, flag, data):
    return [topic, flag, base64.b64encode(bytes(data)).decode("ascii")]


def export(store, saved, max_transfer, max_messages=mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES,
           max_bytes=mqttcluster_limits.MQTT_HANDOVER_MAX_BYTES, ends=None):
    """``saved`` (a ``SavedSession`` this broker gave up) as the JSON its new broker adopts (see the module doc).
    ``ends``: a dict given is filled with where the read of each partition stopped (``rest`` goes on from there)."""
    bound = _Bound(max_messages, max_bytes)
    inflight = []
    for pid, state, qos, topic, partition, offset in saved.inflight:
        if state == PUBREL_SENT:
            inflight.append([pid, state, qos])
            continue
        found = message_at(store, topic, partition, offset, max_transfer)
        if found is not None and bound.take(found[2]):
            inflight.append([pid, state, qos] + _wire(*found))
        bound.turn = share_loop(bound.turn)
    queued = []
    for qos, offset in saved.carried:
        found = message_at(store, MQTT_SESSIONS_TOPIC, 0, offset, max_transfer)
        if found is not None and bound.take(found[2]):
            queued.append([qos] + _wire(*found))
        bound.turn = share_loop(bound.turn)
    session = MqttSession(saved.client_id, saved.version, 65535)
    session.restore(saved)
    for (topic, partition), offset in sorted(saved.cursors.items()):
        end = _queued(store, session, topic, partition, offset, max_transfer, bound, queued)
        if ends is not None:
            ends[(topic, partition)] = end
    if bound.dropped:
        log.warning("mqtt client %s: its session moves to another broker with %d messages; %d more past "
                    "MQTT_HANDOVER_MAX_MESSAGES or MQTT_HANDOVER_MAX_BYTES are dropped", saved.client_id,
                    len(queued) + len(inflight), bound.dropped)
    return {"c": saved.client_id, "u": saved.user, "v": saved.version, "e": saved.expiry_s,
            "subs": [list(s) for s in saved.subscriptions], "q2": list(saved.qos2),
            "sh": [list(x) for x in saved.shared], "inf": inflight, "queued": queued, "dropped": bound.dropped}


def _queued(store, session, topic, partition, offset, max_transfer, bound, out, keep=None, stop=None):
    """Append to ``out`` what ``session`` would read of one partition from ``offset`` to the log end (or ``stop``),
    the records ``keep(rec)`` says yes to (None: all); returns the offset where the read stopped."""
    while stop is None or offset < stop:
        try:
            records, _next = store.read_records(topic, partition, offset, mqtt_limits.MQTT_DELIVERY_BATCH, max_transfer)
        except errors.Moved as moved:
            if moved.offset == offset:
                return offset
            offset = moved.offset
            continue
        except errors.CorruptRecord as exc:
            offset = exc.next_offset
            continue
        except errors.MetaqError:
            return offset
        if not records:
            return offset
        for rec in records:
            if stop is not None and rec.queue_offset >= stop:
                return offset
            m = message_of(topic, rec.flag, rec.data)
            granted = session.granted_qos(topic, m.topic, m.client_id)
            if granted is not None and (keep is None or keep(rec)) and bound.take(rec.data):
                out.append([min(granted, m.qos)] + _wire(topic, rec.flag, rec.data))
            offset = rec.queue_offset + 1
            bound.turn = share_loop(bound.turn)
    return offset


def problem(state, client_id):
    """Why ``state`` (a peer's answer) is no handover of ``client_id`` ``adopt`` may take, or None: of ``export``'s
    shape, that id's, at most MQTT_HANDOVER_MAX_MESSAGES messages (what ``export`` sends at most). Checked whole
    before ``adopt`` writes anything of it."""
    try:
        _check_state(state, client_id)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        return "a malformed handover (%s)" % exc
    return None


def _check_state(state, client_id):
    if not isinstance(state, dict):
        raise TypeError("not an object")
    if state["c"] != client_id:
        raise ValueError("the session of %r, not of %r" % (state["c"], client_id))
    if not isinstance(state["v"], int) or not (state["e"] is None or isinstance(state["e"], int)):
        raise TypeError("its version and expiry are not numbers")
    lists = [state[k] for k in ("subs", "q2", "sh", "inf", "queued")]
    if not all(isinstance(x, list) for x in lists):
        raise TypeError("subs, q2, sh, inf and queued must be lists")
    count = len(state["inf"]) + len(state["queued"])
    if count > mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES:
        raise ValueError("%d messages: at most %d (MQTT_HANDOVER_MAX_MESSAGES)"
                         % (count, mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES))
    for sub in state["subs"]:
        if not (isinstance(sub, list) and len(sub) >= 5 and isinstance(sub[0], str) and isinstance(sub[3], list)
                and all(isinstance(t, str) for t in sub[3])):
            raise TypeError("a subscription %r is not [filter, qos, no local, [topics], retain as published...]"
                            % (sub,))
    if not all(isinstance(x, list) for x in state["sh"]) or not all(isinstance(x, int) for x in state["q2"]):
        raise TypeError("sh must list lists and q2 packet ids")
    for entry in state["inf"]:
        if not (isinstance(entry, list) and len(entry) in (3, 6) and isinstance(entry[0], int)
                and entry[1] in (PUBLISH_SENT, PUBREL_SENT) and isinstance(entry[2], int)):
            raise TypeError("a message in flight %r is not [packet id, state, qos, (topic, flag, data)]" % (entry,))
        if entry[1] != PUBREL_SENT:
            if len(entry) != 6:
                raise TypeError("a message in flight %r without its message" % (entry,))
            _check_message(entry[3:])
    for entry in state["queued"]:
        _check_queued(entry)


def rest_problem(answer):
    """Why ``answer`` (a holder's ``rest``: ``{"queued": [...], "dropped": n}``) is no end of a handover the taker may
    add to the session, or None: of ``rest``'s shape, at most MQTT_HANDOVER_MAX_MESSAGES messages. Checked whole
    before any of it is taken, as ``problem`` checks the handover itself."""
    try:
        if not isinstance(answer, dict):
            raise TypeError("not an object")
        queued, dropped = answer.get("queued", []), answer.get("dropped", 0)
        if not isinstance(queued, list) or not isinstance(dropped, int):
            raise TypeError("queued must be a list and dropped a number")
        if len(queued) > mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES:
            raise ValueError("%d messages: at most %d (MQTT_HANDOVER_MAX_MESSAGES)"
                             % (len(queued), mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES))
        for entry in queued:
            _check_queued(entry)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        return "a malformed end of a handover (%s)" % exc
    return None


def _check_queued(entry):
    if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], int)):
        raise TypeError("a queued message is not [qos, topic, flag, data]")
    _check_message(entry[1:])


def _check_message(message):
    topic, flag, data = message
    if not (isinstance(topic, str) and isinstance(flag, int) and isinstance(data, str)):
        raise TypeError("a message is not [topic, flag, base64 data]")
    base64.b64decode(data, validate=True)


def rest(store, saved, ends, upto, own_id, max_transfer, max_messages=mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES,
         max_bytes=mqttcluster_limits.MQTT_HANDOVER_MAX_BYTES):
    """The handover's end of ``saved`` (see the module doc): ``{"queued": [...], "dropped": n}``, the messages of this
    broker's partitions from ``ends`` (``export``'s) on that the taking broker does not copy itself: ``upto`` is
    ``{origin broker: {(topic, partition): offset}}``, where its copies of that origin's partition begin (this
    broker's own, ``own_id``: its copies of this broker's log; its own: its log). A partition it names no position
    of is not handed (it copies all of it)."""
    bound = _Bound(max_messages, max_bytes)
    session = MqttSession(saved.client_id, saved.version, 65535)
    session.restore(saved)
    queued = []

    def before_theirs(rec):
        origin = origin_of(rec.flag, rec.data)
        if origin is None:
            return False
        start = upto.get(origin[0], {}).get((origin[1], origin[2]))
        return start is not None and origin[3] < start

    own = upto.get(own_id, {})
    for (topic, partition), offset in sorted(ends.items()):
        if topic == INBOX:
            _queued(store, session, topic, partition, offset, max_transfer, bound, queued, keep=before_theirs)
        elif (topic, partition) in own:
            _queued(store, session, topic, partition, offset, max_transfer, bound, queued, stop=own[(topic, partition)])
    if bound.dropped:
        log.warning("mqtt client %s: the end of its handover carries %d messages; %d more past "
                    "MQTT_HANDOVER_MAX_MESSAGES or MQTT_HANDOVER_MAX_BYTES are dropped", saved.client_id,
                    len(queued), bound.dropped)
    return {"queued": queued, "dropped": bound.dropped}


def positions_wire(positions):
    """``{origin broker: {(topic, partition): offset}}`` as a call carries it: ``[[origin, [[topic, partition,
    offset], ...]], ...]`` (the taker's ``upto`` of ``rest``, the holder's ``stop`` of its give_up)."""
    return [[origin, [[t, p, o] for (t, p), o in sorted(at.items())]] for origin, at in sorted(positions.items())]


def positions_read(wire):
    """``positions_wire``'s inverse, checked: at most MQTT_CLUSTER_MAX_PEERS + 1 origins (the peers and the broker
    itself) and MQTT_CLUSTER_MAX_FOLLOWED positions of each (what a follow holds at most). Raises ValueError (or
    TypeError) naming what is wrong; nothing of it is taken then."""
    if not isinstance(wire, list):
        raise TypeError("not a list")
    if len(wire) > mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS + 1 or \
            any(not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[1], list)
                or len(entry[1]) > mqttcluster_limits.MQTT_CLUSTER_MAX_FOLLOWED for entry in wire):
        raise ValueError("not [[origin, [[topic, partition, offset], ...]], ...] of at most %d origins "
                         "(MQTT_CLUSTER_MAX_PEERS and the broker itself) and %d positions of one "
                         "(MQTT_CLUSTER_MAX_FOLLOWED)" % (mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS + 1,
                                                          mqttcluster_limits.MQTT_CLUSTER_MAX_FOLLOWED))
    return {int(origin): {(str(t), int(p)): int(o) for t, p, o in positions} for origin, positions in wire}


def cursors_of(store, subs):
    """``{(topic, partition): offset}``: this broker's log end of each partition the subscriptions ``subs`` (a handed
    session's) read, where the session adopted here starts reading."""
    cursors = {}
    for sub in subs:
        for topic in sub[3]:
            try:
                partitions = store.partitions_of(topic)
            except errors.MetaqError:
                continue  # not a topic here (yet): a wildcard's rescan finds it when it appears
            for p in range(partitions):
                cursors[(topic, p)] = store.max_offset(topic, p)
    return cursors


def adopt(port, store, state, user, cursors=None):
    """Take the session ``state`` (``export``'s) on this broker: its messages and then itself written to this
    broker's sessions' log, the session handed to the CONNECT taking it (``MqttPort.adopt``). ``user``: the
    connecting user (the session's own when authentication is on: the holder checked it); ``cursors``: where its
    subscriptions start reading (``cursors_of``; None: this broker's log end now)."""
    client_id = state["c"]
    inflight, carried, turn = [], [], time.monotonic()
    for entry in state["inf"]:
        pid, kind, qos = entry[:3]
        if kind == PUBREL_SENT:
            inflight.append((pid, kind, qos, MQTT_SESSIONS_TOPIC, 0, 0))
            continue
        offset = port.carry(client_id, entry[3], entry[4], base64.b64decode(entry[5]))
        if offset is not None:
            inflight.append((pid, kind, qos, MQTT_SESSIONS_TOPIC, 0, offset))
        turn = share_loop(turn)
    for qos, topic, flag, data in state["queued"]:
        offset = port.carry(client_id, topic, flag, base64.b64decode(data))
        if offset is not None:
            carried.append((qos, offset))
        turn = share_loop(turn)
    subs = [tuple(s[:6]) if len(s) >= 6 else tuple(s) + (None,) for s in state["subs"]]
    if cursors is None:
        cursors = cursors_of(store, subs)
    saved = SavedSession(client_id, state.get("u", user), state["v"], state["e"], now_ms(), False,
                         subs, cursors, list(state["q2"]), inflight,
                         [tuple(x) for x in state["sh"]], carried=carried)
    port.adopt(saved)
    return saved
