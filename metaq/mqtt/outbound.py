"""How one message goes out to one MQTT connection, whichever way it goes (docs/mqtt.md "Subscribing"): the
decision of the subscriptions that match it (``Outbound.decision``), its PUBLISH for this connection
(``Outbound.prepare``: Message Expiry, the Maximum Packet Size, the window in flight), its topic alias
(``Outbound.with_alias``), its send and its user's pacing (``Outbound.send``, ``Outbound.paced_wait``), and the
session's read positions (``Outbound.cursor_to``).

The delivery's greenlet (``delivery``), a publisher's turn (``direct``), a fan-out reader's plans (``fanplan``),
resends (``resend``) and retained messages (``subscribing``) all decide and encode by these: a subscriber gets a
message alike whichever way it went. ``Outbound`` is the small state they share: the connection and its session,
what a send reads of the port, and the pacing of its greenlet (``resume_at``, ``turn``).
"""

import logging
import time

import gevent

from metaq import errors
from metaq.mqtt import limits as mqtt_limits
from metaq.auth.acl import SUB
from metaq.mqtt import wire
from metaq.mqtt.records import message_of
from metaq.clock import now_ms

log = logging.getLogger(__name__)

#: ``Outbound.prepare``: not sent, as if delivered (expired, too large for the client).
DROPPED = object()
#: ``Outbound.prepare``: not sent now (no room in flight without waiting, QoS 2 from a turn that may not wait, the
#: connection closed while waiting).
HELD = object()


class Outbound:
    """One connection's (``conn``, an ``mqtt.connection.Connection``) way out through ``port`` (the store, the guard,
    the shared decodes, its topic map and cluster inbox, the session saves a QoS 2 delivery waits for).
    ``resume_at``: the monotonic time its user's fetch rate lets it send again (``paced_wait``), None when it may
    now; ``turn``: when its greenlet's turn on the loop began (``connections.share_loop``)."""

    __slots__ = ("conn", "session", "port", "store", "guard", "decoded", "max_transfer", "resume_at", "turn",
                 "_matched", "_matched_at", "_sendable", "_sendable_at", "_plain", "path")

    def __init__(self, conn, port):
        self.conn = conn
        self.session = conn.mqtt
        self.port = port
        self.store = port.store
        self.guard = port.guard
        self.decoded = port.decoded
        self.max_transfer = port.max_transfer
        self.resume_at = None
        self.turn = 0.0
        self._matched = {}  # (metaq topic, name, published by this client) -> [granted QoS, ids, Retain As Published]
        self._matched_at = self.session.changes  # the subscriptions' changes ``_matched`` was made at
        self._sendable = {}  # metaq topic -> ``sendable``'s answer
        self._sendable_at = None  # (put path version, user, subscriptions' changes) ``_sendable`` was made at
        self._plain = {}  # (metaq topic, published by this client) -> ``plain_names``'s {name: True}
        #: The delivery's ``direct.DirectPath``, which keeps what ``plain_names`` answers: told (``drop``) whenever
        #: the names kept here are dropped (None: no path).
        self.path = None

    def may_read(self, topic):
        """This session's user may read ``topic`` now (asked at every read: a reloaded permissions file applies at
        once). The MQTT cluster's inbox holds every peer's topics: each message of it is asked for its own
        (``_may_read_copy``, in ``decision``)."""
        return topic in self.port.cluster_topics or self.guard.allows(self.conn.session, SUB, "topic", topic)

    def sendable(self, topic):
        """True when a publisher's turn may send this session's messages of ``topic`` itself (``direct``): its user
        may read ``topic`` (``may_read``) and has no fetch rate (``Guard.paced``: a paced user's bytes wait in its own
        greenlet). The answer is kept per topic while all it reads stands: the broker's ``PutPath.version`` (moved
        by every reload of the permissions file, its users, rules and quotas, and by a topic created, altered or
        deleted), the connection's user, and the session's subscriptions (``MqttSession.changes``, which also bounds
        the kept topics by those its subscriptions read). The MQTT cluster's inbox is asked each time."""
        stamp = (self.port.put_path.version, self.conn.session.user, self.session.changes)
        kept = self._sendable
        if stamp != self._sendable_at:
            kept.clear()
            self._drop_plain()
            self._sendable_at = stamp
        answer = kept.get(topic)
        if answer is None:
            answer = not self.guard.paced(self.conn.session, "fetch") and self.may_read(topic)
            if topic not in self.port.cluster_topics:
                kept[topic] = answer
        return answer

    def plain_names(self, topic, own):
        """The names of metaq topic ``topic`` whose plain messages (QoS 1, no properties, not retained; published by
        this session's client when ``own``) a publisher's turn may send to this session as they are, in one step
        (``direct.direct_publishes``): ``{name: True}``, each a name whose kept match (``decision``) is a granted QoS
        of 1 or more without Subscription Identifiers; None when that turn may not send to it at all (``sendable``).
        Both answers it holds are the kept ones, asked once per partition run instead of once per message: the
        dict is ``sendable``'s (dropped with it when its stamp moves: permissions, quotas, topics, the user, the
        subscriptions) and ``decision`` adds a name to it as it keeps that name's match (dropped with the kept
        matches). A name not in it goes through ``decision``. The MQTT cluster's inbox is never plain: each of its
        messages asks its own permission."""
        stamp = (self.port.put_path.version, self.conn.session.user, self.session.changes)
        if stamp == self._sendable_at:
            names = self._plain.get((topic, own))
            if names is not None:
                return names
        if not self.sendable(topic):  # (its stamp made current: what is kept below stands with it)
            return None
        if topic in self.port.cluster_topics:
            return {}
        if self._matched_at != self.session.changes:
            self._matched.clear()
            self._matched_at = self.session.changes
        names = self._plain[(topic, own)] = {}
        for (t, name, mine), match in self._matched.items():
            if t == topic and mine == own and match[0] and not match[1]:
                names[name] = True
        return names

    def _drop_plain(self):
        """The plain names kept are dropped, here and by the delivery's path (``direct.DirectPath``)."""
        self._plain.clear()
        if self.path is not None:
            self.path.drop()

    def _may_read_copy(self, m):
        """A peer's message in the inbox: this session's user may read the metaq topic it was published to (a ``$``
        name is the cluster's own marker, never a message)."""
        if m.topic.startswith("$"):
            return False
        if not self.guard.enabled:
            return True
        try:
            topic = self.port.topics.topic_of(m.topic)
        except ValueError:
            return False
        return self.guard.allows(self.conn.session, SUB, "topic", topic)

    def decision(self, topic, m):
        """How message ``m`` of metaq topic ``topic`` goes to this session: ``(granted QoS, Subscription
        Identifiers, RETAIN flag)`` of the subscriptions that match it (``MqttSession.matching``: filters, No Local;
        Retain As Published), the granted QoS None when none does. The match is kept per (topic, name, published by
        this client: No Local) for ``limits.MQTT_KEPT_MATCHES`` names at most (past it all are asked again) of at
        most ``limits.MQTT_KEPT_NAME`` characters (a longer one is asked each time), and all dropped when the
        session's subscriptions change (``MqttSession.changed``): a filter added, replaced or dropped, or a topic a
        wildcard filter reads, applies to the next message. The permission of a cluster's copy is asked each
        time."""
        session = self.session
        matched = self._matched
        if self._matched_at != session.changes:
            matched.clear()
            self._drop_plain()
            self._matched_at = session.changes
        name = m.topic
        key = (topic, name, m.client_id == session.client_id)
        match = matched.get(key)
        if match is None:
            granted, ids = session.matching(topic, name, m.client_id)
            match = [granted, tuple(ids), None]
            if len(name) <= mqtt_limits.MQTT_KEPT_NAME:
                if len(matched) >= mqtt_limits.MQTT_KEPT_MATCHES:
                    matched.clear()
                    self._drop_plain()
                matched[key] = match
                if granted and not ids and self._plain:
                    names = self._plain.get(key[0::2])
                    if names is not None:
                        names[name] = True  # (``plain_names``: the cluster's inbox never has an entry)
        granted = match[0]
        if granted is None:
            return None, match[1], False
        if topic in self.port.cluster_topics and not self._may_read_copy(m):
            return None, (), False
        if not m.retain:
            return granted, match[1], False
        rap = match[2]
        if rap is None:
            rap = match[2] = session.retain_as_published(topic, name)
        return granted, match[1], rap

    def prepare(self, m, granted, retain, ids, key, wait):
        """The PUBLISH of message ``m`` for this connection: ``(data, QoS, packet id, shared)`` at
        min(its QoS, ``granted``), RETAIN ``retain``, carrying the Subscription Identifiers ``ids`` (MQTT 5) and the
        Message Expiry Interval left, never a Topic Alias (``with_alias`` adds it as it is written). ``DROPPED``
        (not sent, as if delivered) when it expired (MQTT 5.0 §3.3.2.3.3) or is past the client's Maximum Packet Size
        ([MQTT-3.1.2-25]). A QoS 1 or 2 one takes a packet id once the window in flight (the connection's
        ``inflight_window``) has room: ``wait`` waits for it (``HELD`` when the connection closes meanwhile); without
        ``wait`` it is ``HELD`` at once, and so is QoS 2 (a persistent session writes it to the sessions' log first:
        the greenlet's). ``key``: the record's in ``Decoded`` (None for a retained message): its QoS 0 PUBLISH without
        identifiers or expiry is encoded once for every subscriber, and ``shared`` is then ``(key, retain)`` (else
        None), its aliased forms made once too (``Decoded.aliased``)."""
        conn = self.conn
        version = conn.version
        qos = min(granted, m.qos)
        if key is not None and not ids and m.expires_ms is None and not qos:
            data = self.decoded.packet(key, m, retain, version)
            if conn.client_max_packet is not None and len(data) > conn.client_max_packet:
                return DROPPED
            return data, 0, None, (key, retain)
        props = m.properties
        if m.expires_ms is not None:
            left_ms = m.expires_ms - now_ms()
            if left_ms <= 0:
                return DROPPED
            props = dict(props, message_expiry_interval=(left_ms + 999) // 1000)
        if ids:
            props = dict(props, subscription_identifier=tuple(ids))
        packet_id = None
        if qos:
            session = self.session
            most = conn.inflight_window
            if not wait and (qos == 2 or len(session.inflight) >= most):
                return HELD
            while len(session.inflight) >= most:
                conn.room.clear()
                if conn.closed:
                    return HELD
                conn.room.wait(1.0)
            packet_id = session.next_packet_id()
        if props and version == wire.MQTT_5:
            data = wire.encode(wire.Publish(m.topic, m.payload, qos, retain, False, packet_id, props), version)
        else:
            data = encode_publish(m.topic, m.payload, qos, retain, version, packet_id)
        if conn.client_max_packet is not None and len(data) > conn.client_max_packet:
            return DROPPED
        return data, qos, packet_id, None

    def with_alias(self, aliases, data, name, shared):
        """The PUBLISH ``data`` (``prepare``'s, of topic ``name``; ``shared``: its one encoding's ``(key, retain)``
        in ``Decoded``, or None) as this connection's topic aliases send it (``aliases``, its ``OutboundAliases``:
        the policy's one decision, ``choose``): with the alias and the name, the alias alone, or as it is. An aliased
        QoS 0 PUBLISH is encoded once per message, alias and form (``Decoded.aliased``); one the client's Maximum
        Packet Size would refuse goes as it is. The caller writes it before it yields, or undoes the decision
        (``OutboundAliases.undo``) when it is not written."""
        mark = aliases.mark()
        choice = aliases.choose(name)
        if choice is None:
            return data
        alias, named = choice
        out = (self.decoded.aliased(*shared, self.conn.version, data, alias, named) if shared is not None
               else wire.with_topic_alias(data, alias, named))
        most = self.conn.client_max_packet
        if most is not None and len(out) > most:
            aliases.undo(mark)
            return data
        return out

    def _alias_now(self, aliases, data, name, shared):
        """``with_alias`` for a write that follows at once, under the write lock (``Connection.send_made``)."""
        out = self.with_alias(aliases, data, name, shared)
        aliases.settle()
        return out

    def send(self, topic, where, flag, data, granted, retain, m=None, ids=(), key=None, own=False, carried=None):
        """Send the message of a record (``where``: its ``(partition, offset)``, None for a retained message) as
        ``prepare`` makes it (``key``: the record's in ``Decoded``), waiting for room in flight. ``own``: the record
        is read at the session's own read position (not a shared group's), which a QoS 1 or 2 message in flight is
        past: a session saved from then on sends it again as itself (DUP), never as a new message too. ``carried``:
        its entry first in the session's ``carried`` messages, which a QoS 1 or 2 one in flight leaves in the same
        step, for the same reason (``resend.send_carried``). A QoS 2
        delivery of a persistent session is written to the sessions' log before it is sent (exactly once across a
        restart, a kill or a failover needs its packet id and that position kept: ``_saved_first``). False when the
        connection closed meanwhile."""
        conn, session = self.conn, self.session
        if m is None:
            m = message_of(topic, flag, data, self.port.topics)
        prepared = self.prepare(m, granted, retain, ids, key, True)
        if prepared is DROPPED:
            return True
        if prepared is HELD:
            return False
        data, qos, packet_id, shared = prepared
        if qos:
            session.sent(packet_id, (qos, topic) + where if where is not None else None)
            if own:
                self.cursor_to((topic, where[0]), where[1] + 1)
            elif carried is not None and session.carried[:1] == [carried]:
                del session.carried[0]
            if qos == 2 and session.persistent and not self._saved_first():
                return False
        aliases = conn.outbound_aliases
        if aliases is None:
            if not conn.send_bytes(data):
                return False
        elif not conn.send_made(lambda: self._alias_now(aliases, data, m.topic, shared)):
            return False
        delay = self.guard.pace(conn.session, "fetch", len(data))  # the one pacing point: these bytes are the user's
        if delay > 0:
            self.resume_at = time.monotonic() + delay
        return True

    def paced_wait(self):
        """Wait, in the delivery's own greenlet, until its user's fetch rate lets it send again (``Guard.pace``
        said how long after its last PUBLISH): other sessions and the loop go on meanwhile, and nothing more is read
        from the log for it, so what waits for it stays bounded as ever (its window in flight, its reply budget)."""
        resume_at, self.resume_at = self.resume_at, None
        if resume_at is not None:
            left = resume_at - time.monotonic()
            if left > 0:
                gevent.sleep(left)
            self.turn = time.monotonic()

    def _saved_first(self):
        """Write the session before its QoS 2 PUBLISH goes out and wait, as a PUBACK does, until the record may be
        counted on (``MqttPort.save_first``: with ``sync`` replication the slave holds it), so that a failover sends
        it again as itself (DUP), never as a new message. False when it may not be: the connection closes, and the
        client, back, is sent it again from its session."""
        wait = self.port.save_first(self.session)
        if wait is None:
            return True
        topic, r, now, cuts = wait
        try:
            self.port.put_path.durable(topic, r.partition, r.log_end, now, cuts)
        except errors.MetaqError as exc:
            log.warning("mqtt %s: a QoS 2 delivery was written but may not be counted on: %s; closing",
                        self.conn.peer, exc)
            self.conn.close()
            return False
        return True

    def cursor_to(self, key, offset):
        """The session's read position of partition ``key`` moves on to ``offset`` (never back; a partition it no
        longer reads is left alone)."""
        session = self.session
        if offset > session.cursors.get(key, offset):
            session.cursors[key] = offset
            session.dirty = True


def encode_publish(name, payload, qos, retain, version, packet_id=None):
    """A PUBLISH without properties: ``wire.encode``'s bytes of ``wire.Publish(name, payload, qos, retain, False,
    packet_id, {})``, written in one call by the wire's own (``wire.publish_bytes``, in C when built): its fixed
    header, lengths, topic name, packet id, empty MQTT 5 property block and payload."""
    if qos not in (0, 1, 2):
        raise ValueError("QoS %r" % (qos,))
    return wire.publish_bytes(0x30 | qos << 1 | (1 if retain else 0), name, packet_id if qos else 0,
                              b"\x00" if version == wire.MQTT_5 else None, payload)
