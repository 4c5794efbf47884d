"""What an MQTT client subscribes to and how it answers what is delivered: SUBSCRIBE, UNSUBSCRIBE, the shared groups
it leaves, and its PUBACK, PUBREC and PUBCOMP of deliveries (docs/mqtt.md).

Each filter's permission is asked of the guard by the delivery (``delivery.Delivery``, created at the first
subscription or the resume of a session that has some; a greenlet of its own while it has work), which reads the
topics the subscriptions read from their end. An acknowledgement of a delivery frees a place in flight and wakes
the delivery when that place can matter to it.
"""

import logging

from gevent.event import Event

from metaq.mqtt import wire
from metaq.mqtt.delivery import Delivery
from metaq.mqtt.session import PUBLISH_SENT
from metaq.mqtt.wire import MQTT_5, encode

log = logging.getLogger(__name__)

#: MQTT 3.1.1's SUBACK failure.
SUBACK_FAILURE_311 = 0x80


class Subscriptions:
    """One connection's subscriptions and its delivery (see the module doc): answered on ``conn`` (its session,
    version, ``send``), saved and grouped through ``port`` (``save``, ``save_first``, ``leave_group``; the delivery
    is given the port), the PUBREL of a persistent session's first PUBREC sent through ``acks``. ``delivery`` is
    None until the client subscribes or resumes a session."""

    __slots__ = ("conn", "port", "acks", "delivery")

    def __init__(self, conn, port, acks):
        self.conn = conn
        self.port = port
        self.acks = acks
        self.delivery = None

    def delivery_of(self):
        """The connection's delivery, created (and the connection's ``room`` with it) at the first call."""
        if self.delivery is None:
            self.conn.room = Event()
            self.delivery = Delivery(self.conn, self.port)
            self.delivery.wake()
        return self.delivery

    def wake(self):
        """Let the delivery look again (an acknowledgement, a subscription, the close); nothing before one exists."""
        if self.delivery is not None:
            self.delivery.wake()

    def subscribe(self, p):
        conn = self.conn
        session = conn.mqtt
        v5 = conn.version == MQTT_5
        sub_id = p.properties.get("subscription_identifier") if v5 else None  # 0 was refused by the codec
        delivery = self.delivery_of()
        codes = []
        retained = []
        for sub in p.subscriptions:
            new = sub.topic_filter not in session.subscriptions
            code = delivery.subscribe(sub, sub_id)
            codes.append(code)
            if code <= 2 and (sub.retain_handling == 0 or (sub.retain_handling == 1 and new)):
                retained.append((sub.topic_filter, code))
        codes = tuple(codes)
        if not v5:
            codes = tuple(c if c <= 2 else SUBACK_FAILURE_311 for c in codes)
        if session.persistent:
            self.port.save(session)
        ok = conn.send(wire.Suback(p.packet_id, codes))
        if retained:
            delivery.retained_after_suback(retained)  # sent by the delivery, after the SUBACK
        self.wake()
        return ok

    def resume(self):
        """A resumed session (CONNACK sent): its messages in flight again, then what came since; its shared groups
        joined again, their permission asked again."""
        session = self.conn.mqtt
        if not (session.subscriptions or session.inflight or session.rejoin or session.carried):
            return
        delivery = self.delivery_of()
        delivery.resumed()
        rejoin, session.rejoin = session.rejoin, []
        for topic_filter, granted, sub_id in rejoin:
            code = delivery.subscribe(wire.Subscription(topic_filter, granted), sub_id)
            if code > 2:
                log.info("mqtt %s: shared subscription %s not resumed (0x%02X)", self.conn.peer, topic_filter, code)

    def unsubscribe(self, p):
        conn = self.conn
        session = conn.mqtt
        codes = tuple(wire.SUCCESS if session.unsubscribe(f) or self.leave(f) else wire.NO_SUBSCRIPTION_EXISTED
                      for f in p.topic_filters)
        if session.persistent:
            self.port.save(session)
        return conn.send(wire.Unsuback(p.packet_id, codes if conn.version == MQTT_5 else ()))

    def leave(self, topic_filter):
        """Leave the shared group of ``topic_filter`` (True when this connection was a member)."""
        held = self.conn.mqtt.shared.pop(topic_filter, None)
        if held is None:
            return False
        self.port.leave_group(self.conn, held[0])
        return True

    def leave_all(self):
        """The connection ended: it leaves every shared group it is in."""
        for topic_filter in list(self.conn.mqtt.shared):
            self.leave(topic_filter)

    def acknowledged(self, packet_id, state):
        """The client's PUBACK (``state`` PUBLISH_SENT) or PUBCOMP (PUBREL_SENT) of a delivery: it ends the message
        in flight (``MqttSession.acknowledged``), and the place it frees wakes the delivery when a place can matter to
        it, that is when its window was full (a pass or the publisher's turn held a message for one:
        ``Outbound.prepare``) or it is in a shared group (whose turns weigh each member's room); a delivery that is
        caught up sleeps on until the next append."""
        conn = self.conn
        session = conn.mqtt
        if session.acknowledged(packet_id, state):
            delivery = self.delivery
            if delivery is not None and (session.shared or len(session.inflight) + 1 >= conn.inflight_window):
                delivery.wake()
        return True

    def read_pubacks(self, parser, data):
        """The bytes a read brought (``data``, beginning as a PUBACK does) to a connected client, a subscriber's
        common turn: the plain PUBACKs they begin with are split and end their messages in flight in one step
        (``wire.MqttParser.end_acks``: as ``acknowledged`` ends each), the delivery woken once when one of them would
        have woken it (its window was full before the first, or it is in a shared group). None when the rest is for
        the general path (``Connection._process``: whatever follows them, from the first other or partial packet on,
        all in the parser's buffer); True when the read was only those; False when the connection must close.
        Nothing is staged between reads, so no PUBLISH is passed over."""
        conn = self.conn
        session = conn.mqtt
        taken, ended, rest = parser.end_acks(data, session.inflight, session.where, PUBLISH_SENT)
        if not taken:
            return None
        if ended:
            session.dirty = True  # (``MqttSession.acknowledged``'s)
            delivery = self.delivery
            if delivery is not None and (session.shared or len(session.inflight) + ended >= conn.inflight_window):
                delivery.wake()
        if conn.closed:
            return False
        return None if rest else True

    def pubrec(self, p):
        """The client's PUBREC of a QoS 2 delivery: PUBREL. A persistent session writes the first PUBREC of a message
        to the sessions' log before its PUBREL goes out, which waits, as a PUBACK does, until the record may be
        counted on (``MqttPort.save_first``: with ``sync`` replication the slave holds it): once the client has the
        PUBREL it may complete the exchange and use the packet id again, so a restart, a kill or a failover must
        send the PUBREL again, never the PUBLISH."""
        conn = self.conn
        session = conn.mqtt
        if p.reason_code >= 0x80:
            session.dropped(p.packet_id)
            self.wake()
            return True
        first = session.inflight.get(p.packet_id) == PUBLISH_SENT
        if session.received(p.packet_id):
            if first and session.persistent:
                self.acks.queue(wire.PubRel(p.packet_id), self.port.save_first(session))
            else:
                self.acks.send_in_order(encode(wire.PubRel(p.packet_id), conn.version))  # after one queued before
            return not conn.closed
        return conn.send(wire.PubRel(p.packet_id, wire.PACKET_IDENTIFIER_NOT_FOUND if conn.version == MQTT_5 else 0))
