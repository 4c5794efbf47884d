"""What an MQTT client publishes: PUBLISH (topic aliases, the QoS 1/2 state, the burst) and the PUBREL that releases
a QoS 2 PUBLISH (docs/mqtt.md).

A PUBLISH is stored through the port's put (the put path's one write decision); its PUBACK or PUBREC goes out through
the connection's acknowledgements (``acks.Acknowledgements``), in the order the PUBLISHes came, once the put may be
acknowledged as a text ``put`` would be. The QoS 0 and 1 PUBLISHes one read brings (not retained) are gathered as a
burst (``limits.MQTT_PUBLISH_BURST``, ``MQTT_PUBLISH_BURST_BYTES``), their write decision asked as each comes (a
yes kept across turns while nothing it reads changed, ``PutPath.decision_stands``), and
stored together through the store's burst path (``MqttPort.write_burst``) before any other packet is handled, the
reader yields or answers; their PUBACKs go out together once the burst may be acknowledged. The plain ones (no
properties, of a name staged in this turn, to a topic the decision let through) are split from the buffer and
staged in one step (``wire.MqttParser.plain_publishes``). A PUBLISH the burst cannot store is refused as alone,
those before it stored and acknowledged, those after it put one by one. A QoS 2 resend of a packet id not yet
released is answered PUBREC and not stored again. A refusal: MQTT 5 QoS 1/2 get the reason code in the
PUBACK/PUBREC, MQTT 5 QoS 0 is dropped (logged), MQTT 3.1.1 (which has no negative acknowledgement) is closed.
"""

import logging
import time

from metaq import errors
from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt.limits import MQTT_PUBLISH_BURST, MQTT_PUBLISH_BURST_BYTES
from metaq.mqtt import wire
from metaq.mqtt.plainturn import entries_of, plain_turn
from metaq.mqtt.records import RecordRefusal, plain_plan
from metaq.mqtt.wire import MQTT_5
from metaq.clock import now_ms
from metaq.serving.putpath import ACK_NOW

log = logging.getLogger(__name__)
_time = time.time

#: Longest Reason String a refused PUBACK or PUBREC carries (the refusal's words, cut).
MAX_REASON_CHARS = 256
#: Topic names a connection keeps the staging plan of (``records.plain_plan``: their plain PUBLISHes are split and
#: staged in one step, ``wire.MqttParser.plain_publishes``): a device publishes to a few; past the count the plans
#: start again.
MQTT_PLAIN_PLANS = 32


def reason_of(exc):
    """The MQTT 5 reason code of a refused put or subscribe (a MetaqError or a ``records.RecordRefusal``)."""
    if isinstance(exc, RecordRefusal):
        return wire.TOPIC_NAME_INVALID if exc.what == "topic" else wire.IMPLEMENTATION_SPECIFIC_ERROR
    if isinstance(exc, (errors.Forbidden, errors.Unauthenticated)):
        return wire.NOT_AUTHORIZED
    if isinstance(exc, errors.QuotaExceeded):
        return wire.QUOTA_EXCEEDED
    if isinstance(exc, errors.InvalidTopic):
        return wire.TOPIC_NAME_INVALID
    if isinstance(exc, errors.ClientError):
        return wire.IMPLEMENTATION_SPECIFIC_ERROR
    return wire.UNSPECIFIED_ERROR


def remember_plan(plans, topics, name, client_id):
    """Add ``records.plain_plan(topics, name, client_id)`` to ``plans`` under the name's bytes unless it is there;
    ``plans`` holds at most ``MQTT_PLAIN_PLANS`` names (full, it starts again), of at most ``limits.MQTT_KEPT_NAME``
    characters (a longer name takes the general path at each PUBLISH)."""
    if len(name) > mqtt_limits.MQTT_KEPT_NAME:
        return
    key = name.encode("utf-8")
    if key not in plans:
        if len(plans) >= MQTT_PLAIN_PLANS:
            plans.clear()
        plans[key] = plain_plan(topics, name, client_id)


class Publishes:
    """One connection's PUBLISHes and PUBRELs (see the module doc): read from ``conn`` (its session, version,
    settings, ``disconnect``), stored through ``port`` (``stage``, ``write_burst``, ``put``, ``save``, the fan-out's
    ``deliver_now``), acknowledged through ``acks``. ``decided`` holds, per metaq topic, the partitions the write
    decision let through, kept across turns while those decisions stand (``_decisions``: asked again once something
    the decision reads changed, ``PutPath.decision_stands``, or the session's user did)."""

    __slots__ = ("conn", "port", "acks", "decided", "plans", "_decided_at", "_aliases", "_burst", "_burst_bytes",
                 "_burst_now", "_pubacks")

    def __init__(self, conn, port, acks):
        self.conn = conn
        self.port = port
        self.acks = acks
        self.decided = {}
        self._decided_at = None  # (the put path's decision version, the session's user) of the decisions in decided
        self.plans = None  # name bytes -> records.plain_plan of names staged this turn: a dict once one is (_plan)
        self._aliases = {}  # topic alias -> topic name (MQTT 5, this connection's)
        self._burst = []  # PUBLISHes staged, not yet stored: (topic, partition, flag, data, packet, name)
        self._burst_bytes = 0
        self._burst_now = 0  # the burst's time (epoch ms): its records' store time
        self._pubacks = None  # the burst's PUBACKs as one read's split made them (``read``), while it is all of it

    def publish(self, p):
        """A PUBLISH: staged in the burst, or stored alone (QoS 2, retained); False when the connection must close."""
        conn = self.conn
        name = self._name(p)
        if name is None:
            return False
        if p.qos == 2 or p.retain:
            return self.flush() and self._publish_one(p, name)
        if p.qos and not self._room():
            return False
        burst = self._burst
        now = self._burst_now if burst else now_ms()
        try:
            topic, partition, flag, data = self.port.stage(name, p.payload, p.qos, conn.mqtt.client_id, p.properties,
                                                           conn.session, self._decisions(), now)
        except (RecordRefusal, errors.MetaqError) as exc:
            self.decided.clear()
            return self.flush() and self._refused(p, name, exc)
        self._burst_now = now
        self._pubacks = None
        burst.append((topic, partition, flag, data, p, name))
        if p.qos:
            self.acks.unacked += 1
        self._burst_bytes += len(data)
        if not p.properties:
            self._plan(name)
        if len(burst) >= mqtt_limits.MQTT_PUBLISH_BURST or self._burst_bytes >= mqtt_limits.MQTT_PUBLISH_BURST_BYTES:
            return self.flush()
        return True

    def _decisions(self):
        """``decided``, emptied first unless the decisions in it still stand: made at the put path's decision version of
        now (``PutPath.decision_stands``: nothing the write decision reads changed since, the clock's part still yes;
        not asked at its ``standing`` version, where no part moves with the clock) for the session's user of now.
        Holds at most ``limits.MQTT_KEPT_DECISIONS`` topics (past them it starts again). A refusal is never kept
        (``MqttPort.put``). While a burst is staged they were asked at its first PUBLISH and nothing yielded since
        (the burst is stored before the reader yields): not asked again."""
        decided = self.decided
        if self._burst:
            return decided
        session = self.conn.session
        user = session.user if session is not None else None
        at = self._decided_at
        path = self.port.put_path
        if (at is None or at[1] != user or (at[0] != path.standing and not path.decision_stands(at[0]))
                or len(decided) >= mqtt_limits.MQTT_KEPT_DECISIONS):
            decided.clear()
            self._decided_at = (path.version, user)
        return decided

    def parked(self):
        """The connection parks: it keeps its staging plans and write decisions while they are at most
        ``limits.MQTT_PARKED_PLANS`` each (a device's next PUBLISH is then staged in one step from the first packet
        of its next turn, ``stage_plain``), else drops them (its next turn makes them again)."""
        if self.plans is not None and len(self.plans) > mqtt_limits.MQTT_PARKED_PLANS:
            self.plans = None
        if len(self.decided) > mqtt_limits.MQTT_PARKED_PLANS:
            self.decided.clear()

    def _name(self, p):
        """The PUBLISH's topic name, its MQTT 5 topic alias set or resolved; None: refused (the connection closes)."""
        conn = self.conn
        name = p.topic
        alias = p.properties.get("topic_alias") if conn.version == MQTT_5 else None
        if alias is None:
            return name
        most = conn.settings.topic_alias_maximum
        if alias > most:
            return conn.disconnect(wire.TOPIC_ALIAS_INVALID, "topic alias %d is past the maximum of %d "
                                   "(mqtt.topic_alias_maximum)" % (alias, most)) or None
        if name:
            self._aliases[alias] = name
            return name
        name = self._aliases.get(alias)
        if name is None:
            return conn.disconnect(wire.PROTOCOL_ERROR, "topic alias %d was never set" % alias) or None
        return name

    def _room(self):
        """A QoS 1 PUBLISH for the burst: within ``mqtt.receive_maximum`` unacknowledged (MQTT 3.1.1, told none,
        waits for our acknowledgements first); False: refused, the connection closes."""
        most = self.conn.settings.receive_maximum
        if self.acks.unacked < most:
            return True
        if self.conn.version != MQTT_5:
            if not self.flush():
                return False
            self._wait_for_acks()
        if self.acks.unacked >= most:
            return self.conn.disconnect(wire.RECEIVE_MAXIMUM_EXCEEDED, "more than %d QoS 1 and 2 PUBLISHes "
                                        "unacknowledged (mqtt.receive_maximum)" % most)
        return True

    def _plan(self, name):
        """Remember the staging plan of ``name``, just staged from a PUBLISH without properties (so a valid topic
        name, a valid metaq topic): its next plain PUBLISHes are split and staged in one step (``stage_plain``)."""
        if self.plans is None:
            self.plans = {}
        remember_plan(self.plans, self.port.topics, name, self.conn.mqtt.client_id)

    def stage_plain(self, parser):
        """Split from ``parser``'s buffer the plain PUBLISHes of names staged before (``wire.MqttParser
        .plain_publishes``, the write decision being ``decided``'s while it stands, the QoS 1 ones within
        ``mqtt.receive_maximum``) and add them to the burst, as ``publish`` adds each. None when there were none;
        else False when the connection must close."""
        burst = self._burst
        split, qos1, nbytes = parser.plain_publishes(
            self.plans, self._decisions(), self.conn.settings.receive_maximum - self.acks.unacked,
            mqtt_limits.MQTT_PUBLISH_BURST - len(burst), mqtt_limits.MQTT_PUBLISH_BURST_BYTES - self._burst_bytes)
        if not split:
            return None
        self._pubacks = None
        return self._add(entries_of(split), qos1, nbytes)

    def read(self, parser, data, whole=False):
        """The bytes a read brought (``data``, not empty) to the reader's turn, which begins with no burst staged:
        the plain PUBLISHes they begin with are split and staged in one step and, when nothing follows them, stored
        and acknowledged at once (the PUBACKs sent as made). ``whole``: nothing was buffered before ``data`` (the
        reader's last read was taken whole, or its parser holds nothing): then the whole step is one call
        (``plainturn.plain_turn``), which hands back what it does
        not end itself; else the parser splits (``wire.MqttParser.plain_read``) and ``flush`` stores. None when
        the rest is for the general path (``Connection._process``, with what is staged): the read began with no
        such PUBLISH, or other or partial packets follow them (all not taken is in the parser's buffer); else False
        when the connection must close."""
        acks, conn, decided = self.acks, self.conn, self.decided
        session = conn.session
        # the kept decisions made at the put path's standing version for the session's user of now stand with no
        # question asked (``_decisions``, which decides every other case: not called for this one)
        if (self._decided_at != (self.port.put_path.standing, session.user if session is not None else None)
                or len(decided) >= mqtt_limits.MQTT_KEPT_DECISIONS):
            decided = self._decisions()
        room = conn.settings.receive_maximum - acks.unacked
        now = int(_time() * 1000)  # (``clock.now_ms``)
        taken = None
        try:
            if whole:
                port = self.port
                went = plain_turn(port, port.put_path, acks, conn, conn.mqtt.client_id, MQTT_PUBLISH_BURST,
                                  MQTT_PUBLISH_BURST_BYTES, data, parser.version == MQTT_5, parser.max_packet,
                                  self.plans, decided, room, now)
                if went is True:
                    return False if conn.closed else True
                if went is None:
                    parser.receive_data(data)
                    return None
                entries, qos1, nbytes, pubacks, pos, taken = went  # (its QoS 1 ones counted in ``acks.unacked``)
                rest = pos < len(data)
                if rest:
                    parser.receive_data(data[pos:])
            else:
                split, qos1, nbytes, pubacks, rest = parser.plain_read(
                    data, self.plans, decided, room, MQTT_PUBLISH_BURST, MQTT_PUBLISH_BURST_BYTES)
                if not split:
                    return None
                acks.unacked += qos1
                entries = entries_of(split)
            self._burst = entries
            self._burst_now = now
            self._burst_bytes = nbytes
            self._pubacks = pubacks
            if len(entries) >= MQTT_PUBLISH_BURST or nbytes >= MQTT_PUBLISH_BURST_BYTES or not rest:
                if not self.flush(taken):
                    return False
            return False if conn.closed else (None if rest else True)
        except BaseException:
            self.drop()  # not stored: the connection closes without acknowledging them
            raise

    def _add(self, staged, qos1, nbytes):
        """Add ``staged`` (split and staged entries, ``qos1`` of them at QoS 1, their records' ``nbytes``) to the
        burst, stored once full; True, or False when the connection must close."""
        burst = self._burst
        if not burst:
            self._burst_now = now_ms()
        burst.extend(staged)
        self.acks.unacked += qos1
        self._burst_bytes += nbytes
        if len(burst) >= mqtt_limits.MQTT_PUBLISH_BURST or self._burst_bytes >= mqtt_limits.MQTT_PUBLISH_BURST_BYTES:
            return self.flush()
        return True

    @property
    def staged(self):
        """True while PUBLISHes are staged and not yet stored."""
        return bool(self._burst)

    def drop(self):
        """The connection closes: what is staged is not stored, nor acknowledged."""
        self._burst = []
        self._pubacks = None

    def flush(self, taken=None):
        """Store the staged PUBLISHes (``MqttPort.write_burst``, given ``taken``: what ``plain_turn`` appended of
        them already), in order, and queue the PUBACKs of its QoS 1 ones as one run, sent once the burst may be
        acknowledged. Where the store refuses one, it is answered as a refused PUBLISH and those after it are put one
        by one. False when the connection must close."""
        burst = self._burst
        if not burst:
            return True
        self._burst = []
        self._burst_bytes = 0
        pubacks, self._pubacks = self._pubacks, None
        now = self._burst_now
        runs = []
        port = self.port
        stored, log_end, keys, exc = port.write_burst(burst, now, runs, taken)
        cuts = port.store.log_cuts  # nothing yielded since the writes: their wait begins later
        if stored:
            # how its acknowledgements wait (ACK_NOW, ACK_AFTER_FLUSH or ACK_AFTER_REPLICATION), the same for every
            # put of the burst; visible now (flush async): its subscribers waiting for it get it from here
            # (``MqttPort.serving.serve``, called with ``args``: no function made per burst). The wake may yield: the
            # write decision is asked again after (``_decisions``).
            mode = port.put_path.burst_written(keys, now, None, port.serving.serve,
                                               (keys, burst, runs, self.conn.mqtt.client_id, now))
            if pubacks is None or exc is not None:
                ids = [e[4].packet_id for e in (burst[:stored] if exc is not None else burst) if e[4].qos]
                pubacks = wire.encode_pubacks(ids) if ids else None
            if pubacks:
                self.acks.pubacks(pubacks, None if mode == ACK_NOW else (keys, log_end, now, cuts))
        if exc is None:
            return True
        self.decided.clear()
        rest = burst[stored:]
        self.acks.unacked -= sum(1 for e in rest if e[4].qos)
        if not self._refused(rest[0][4], rest[0][5], exc):
            return False
        for e in rest[1:]:
            if not self._publish_one(e[4], e[5]):
                return False
        return True

    def _publish_one(self, p, name):
        """A PUBLISH stored alone (QoS 2, retained, or after a refusal in a burst), answered in its order."""
        conn, acks = self.conn, self.acks
        most = conn.settings.receive_maximum
        session = conn.mqtt
        if p.qos == 2 and session.qos2_seen(p.packet_id):
            acks.queue(wire.PubRec(p.packet_id))  # a resend: stored once already
            return True
        if p.qos and conn.version != MQTT_5:
            self._wait_for_acks()
        if p.qos and (acks.unacked >= most or (p.qos == 2 and not session.qos2_room())):
            return conn.disconnect(wire.RECEIVE_MAXIMUM_EXCEEDED, "more than %d QoS 1 and 2 PUBLISHes unacknowledged "
                                   "(mqtt.receive_maximum)" % most)
        try:
            topic, r, now = self.port.put(name, p.payload, p.qos, session.client_id, p.properties, conn.session,
                                          p.retain, self._decisions())
        except (RecordRefusal, errors.MetaqError) as exc:
            self.decided.clear()
            return self._refused(p, name, exc)
        cuts = self.port.store.log_cuts  # nothing yielded since the write (a session's save below may)
        if p.qos == 0:
            self.port.made_visible(topic, r, now)
            return True
        mode = self.port.put_path.ack_mode(topic, r, now)
        acks.unacked += 1
        if p.qos == 2:
            session.qos2_stored(p.packet_id)
            if session.persistent:  # its packet id saved before the PUBREC: exactly once across a restart
                end = self.port.save(session)
                if end is not None:
                    r = r._replace(log_end=max(r.log_end, end))
        ack = wire.PubAck(p.packet_id) if p.qos == 1 else wire.PubRec(p.packet_id)
        acks.queue(ack, None if mode == ACK_NOW else (topic, r, now, cuts), counted=p.qos == 1)
        return True

    def _wait_for_acks(self):
        """MQTT 3.1.1 has no Receive Maximum: its client waits for our acknowledgements instead
        (``Acknowledgements.wait_for_room``); the decisions kept stand through the wait while ``_decisions`` says."""
        self.acks.wait_for_room(self.conn.settings.receive_maximum, self.conn.request_timeout)

    def _refused(self, p, name, exc):
        conn = self.conn
        code = reason_of(exc)
        if conn.version != MQTT_5:
            log.info("mqtt %s: PUBLISH to %s refused: %s; closing (MQTT 3.1.1 has no negative acknowledgement)",
                     conn.peer, name, exc)
            return False
        log.debug("mqtt %s: PUBLISH to %s refused (0x%02X): %s", conn.peer, name, code, exc)
        props = {}
        if conn.problem_information:  # why, in the words every other port answers with ([MQTT-3.1.2-29])
            props["reason_string"] = str(exc)[:MAX_REASON_CHARS]
        if p.qos == 1:
            self.acks.queue(wire.PubAck(p.packet_id, code, props))
        elif p.qos == 2:
            self.acks.queue(wire.PubRec(p.packet_id, code, props))
        return True

    def release(self, p):
        """The client's PUBREL of a QoS 2 PUBLISH: released (a persistent session saves it before the PUBCOMP: the
        client may use the id again), then PUBCOMP. An id the broker does not hold (never stored: a PUBLISH refused
        at its PUBREC; or released already, a resend after the PUBCOMP was lost) still gets PUBCOMP, in MQTT 5 with
        0x92 Packet Identifier not found (MQTT 5.0 §3.7.2.1): not held, which for a message refused at its PUBREC
        tells a client that ignored the PUBREC's reason it was not taken, and for a resent PUBREL means the message was
        stored; MQTT 3.1.1 has no reason code."""
        conn = self.conn
        session = conn.mqtt
        code = wire.SUCCESS
        if session.qos2_released(p.packet_id):
            self.acks.unacked -= 1
            if session.persistent:
                self.port.save(session)
        elif conn.version == MQTT_5:
            code = wire.PACKET_IDENTIFIER_NOT_FOUND
        self.acks.queue(wire.PubComp(p.packet_id, code))
        return True
