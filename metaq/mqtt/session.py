"""One MQTT session's state (MQTT 5.0 §4.1): what the broker keeps for a client identifier (pure: no socket, no
clock; docs/mqtt.md "Sessions").

``MqttSession`` holds the session's subscriptions (each filter, its granted QoS and options, the metaq topics it
reads), the read position of every partition those topics have (``cursors``: the next offset to deliver from), the
QoS 2 packet identifiers received and not yet released (exactly once across a client's resend), and the QoS 1 and
2 messages sent and not yet acknowledged (``inflight``). Every part is bounded by the front-end's limits, which it
is given.

A persistent session (MQTT 3.1.1 Clean Session 0, MQTT 5 a Session Expiry Interval) is this object's state
written to the sessions' log (``saved``, ``follow.SavedSession``) and read back at the next CONNECT (``restore``):
``dirty`` says its read positions or messages in flight changed since it was last written. Each message in flight
keeps where it is in the log (``where``), so that it is sent again after a reconnect.
"""

from collections import OrderedDict

from metaq.mqtt.follow import SavedSession
from metaq.mqtt.topics import matches

__all__ = ["Subscribed", "SharedGroup", "MqttSession", "PUBLISH_SENT", "PUBREL_SENT"]

#: ``inflight`` states: a QoS 1 or 2 PUBLISH sent, waiting for its PUBACK or PUBREC; a PUBREL sent, waiting for PUBCOMP.
PUBLISH_SENT = "publish"
PUBREL_SENT = "pubrel"


class Subscribed:
    """One filter of a session: its granted QoS, No Local, Retain As Published, the metaq topics it reads (its
    first level when that is literal; every topic its user may read when it starts with a wildcard) and its MQTT 5
    Subscription Identifier (None: none; every PUBLISH it matches carries it, MQTT 5.0 §3.3.2.3.8)."""

    __slots__ = ("topic_filter", "qos", "no_local", "topics", "wildcard", "retain_as_published", "sub_id")

    def __init__(self, topic_filter, qos, no_local, topics, retain_as_published=False, sub_id=None):
        self.topic_filter = topic_filter
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.sub_id = sub_id
        self.topics = set(topics)
        self.wildcard = topic_filter.split("/", 1)[0] in ("+", "#")


class SharedGroup:
    """A shared subscription's group (``$share/<name>/<filter>``, MQTT 5.0 §4.8.2): the members (connections) that
    share it and one read position per partition (``cursors``): a message is claimed by the member whose delivery
    moves the cursor past it, so each goes to one member. It lives in memory while it has members; its cursors are
    kept in the sessions' log while some session holding one of its subscriptions exists (``MqttPort``), and a
    group begun again goes on from them; otherwise a new one starts at the end of the log. ``dirty``: the cursors
    moved since they were last written."""

    __slots__ = ("name", "topic_filter", "topics", "cursors", "members", "dirty")

    def __init__(self, name, topic_filter, topics):
        self.name, self.topic_filter, self.topics = name, topic_filter, set(topics)
        self.cursors = {}  # (metaq topic, partition) -> the next offset some member delivers
        self.members = {}  # member -> messages it claimed (the member with the fewest claims the next)
        self.dirty = False

    def my_turn(self, member, ready):
        """True when ``member`` has claimed no more messages than any other member ``ready(member)`` says may take
        one now: the next is its to claim."""
        mine = self.members.get(member, 0)
        return mine <= min((n for m, n in self.members.items() if m is member or ready(m)), default=mine)

    def claimed(self, member):
        self.members[member] = self.members.get(member, 0) + 1


class MqttSession:
    """A client's session (see the module doc); ``max_qos2`` bounds the QoS 2 packet ids kept. Its attributes are in
    slots: every connected client has one."""

    __slots__ = ("client_id", "version", "max_qos2", "subscriptions", "shared", "cursors", "qos2_received", "inflight",
                 "where", "last_id", "persistent", "expiry_s", "user", "dirty", "rejoin", "carried", "changes")

    def __init__(self, client_id, version, max_qos2):
        self.client_id = client_id
        self.version = version
        self.max_qos2 = max_qos2
        self.subscriptions = OrderedDict()  # filter -> Subscribed
        self.shared = OrderedDict()  # $share/<name>/<filter> -> (SharedGroup, granted QoS, subscription id or None)
        self.cursors = {}  # (metaq topic, partition) -> next offset to deliver
        self.qos2_received = set()  # inbound QoS 2 packet ids stored, waiting for their PUBREL
        self.inflight = OrderedDict()  # outbound packet id -> PUBLISH_SENT or PUBREL_SENT
        self.where = {}  # outbound packet id -> (qos, metaq topic, partition, offset) of the message in flight
        self.last_id = 0  # the outbound packet id given last (0: none yet): see ``next_packet_id``
        self.persistent = False  # kept past its connection (written to the sessions' log)
        self.expiry_s = None  # MQTT 5's Session Expiry Interval; None: MQTT 3.1.1
        self.user = None
        self.dirty = False  # cursors or messages in flight changed since the last save
        self.rejoin = []  # a resumed session's shared subscriptions, (filter, granted QoS, sub id), until they rejoin
        self.carried = []  # (QoS, offset in %MQTT%) of messages brought from another broker, not yet sent
        self.changes = 0  # moved by every change of its subscriptions (``changed``): what a kept match is checked by

    # -- persistence -----------------------------------------------------------

    def saved(self, now_ms, connected):
        """This session's state as a ``follow.SavedSession`` (what a record of the sessions' log holds)."""
        subs = [(s.topic_filter, s.qos, s.no_local, sorted(s.topics), s.retain_as_published, s.sub_id)
                for s in self.subscriptions.values()]
        inflight = [(pid, state) + self.where[pid] for pid, state in self.inflight.items() if pid in self.where]
        shared = [(f, granted, sub_id) for f, (_group, granted, sub_id) in self.shared.items()] + self.rejoin
        return SavedSession(self.client_id, self.user, self.version, self.expiry_s, now_ms, connected, subs,
                            dict(self.cursors), sorted(self.qos2_received), inflight, shared,
                            carried=list(self.carried))

    def restore(self, saved):
        """Take ``saved``'s subscriptions, read positions, QoS 2 packet ids and messages in flight."""
        for topic_filter, qos, no_local, topics, rap, sub_id in saved.subscriptions:
            self.subscriptions[topic_filter] = Subscribed(topic_filter, qos, no_local, topics, rap, sub_id)
        self.changed()
        self.cursors.update(saved.cursors)
        self.qos2_received.update(saved.qos2[:self.max_qos2])
        self.rejoin = list(saved.shared)
        self.carried = list(saved.carried)
        for pid, state, qos, topic, partition, offset in saved.inflight:
            self.inflight[pid] = state
            self.where[pid] = (qos, topic, partition, offset)

    # -- inbound QoS 2 ---------------------------------------------------------

    def qos2_seen(self, packet_id):
        """True when a QoS 2 PUBLISH with ``packet_id`` was stored and not yet released: a resend, not stored again."""
        return packet_id in self.qos2_received

    def qos2_room(self):
        return len(self.qos2_received) < self.max_qos2

    def qos2_stored(self, packet_id):
        self.qos2_received.add(packet_id)

    def qos2_released(self, packet_id):
        """The PUBREL of ``packet_id`` came: forget it (True when it was known)."""
        if packet_id in self.qos2_received:
            self.qos2_received.discard(packet_id)
            return True
        return False

    # -- subscriptions ---------------------------------------------------------

    def subscribe(self, sub):
        """Add or replace ``sub``; returns the metaq topics it reads that no other subscription read before."""
        before = self.topics()
        self.subscriptions[sub.topic_filter] = sub
        self.changed()
        return sub.topics - before

    def unsubscribe(self, topic_filter):
        """Drop the filter (True when it was there) and the cursors of the topics no subscription reads any more."""
        if self.subscriptions.pop(topic_filter, None) is None:
            return False
        self.changed()
        still = self.topics()
        for key in [k for k in self.cursors if k[0] not in still]:
            del self.cursors[key]
        return True

    def changed(self):
        """Its subscriptions changed (one added, replaced or dropped, a metaq topic added to one's ``topics``): every
        match kept by them (``outbound.Outbound.decision``) is asked again."""
        self.changes += 1

    def topics(self):
        """Every metaq topic some subscription reads."""
        out = set()
        for sub in self.subscriptions.values():
            out |= sub.topics
        return out

    def wildcards(self):
        """The subscriptions whose filter starts with a wildcard."""
        return [s for s in self.subscriptions.values() if s.wildcard]

    def retain_as_published(self, metaq_topic, name):
        """True when a subscription that matches ``name`` (of ``metaq_topic``) asked for Retain As Published."""
        return any(sub.retain_as_published and metaq_topic in sub.topics and matches(sub.topic_filter, name)
                   for sub in self.subscriptions.values())

    def granted_qos(self, metaq_topic, name, publisher):
        """The QoS a message of MQTT topic ``name`` (stored in ``metaq_topic``, published by client ``publisher``) is
        delivered with: the highest QoS granted to a matching subscription that reads ``metaq_topic``; None when
        none matches (MQTT 5.0 §3.3.4: one copy at the highest matching QoS)."""
        return self.matching(metaq_topic, name, publisher)[0]

    def matching(self, metaq_topic, name, publisher):
        """``(QoS, subscription ids)`` of a message (see ``granted_qos``): the ids of every matching subscription
        that has one, which its one copy carries (MQTT 5.0 §3.3.4); at most ``mqtt.max_subscriptions`` of them."""
        best, ids = None, []
        for sub in self.subscriptions.values():
            if metaq_topic not in sub.topics or (sub.no_local and publisher == self.client_id):
                continue
            if matches(sub.topic_filter, name):
                if best is None or sub.qos > best:
                    best = sub.qos
                if sub.sub_id is not None:
                    ids.append(sub.sub_id)
        return best, ids

    # -- outbound QoS 1 and 2 --------------------------------------------------

    def next_packet_id(self):
        """A packet id no message in flight uses (1..65535, wrapping): the first after ``last_id`` not in
        ``inflight``, which becomes ``last_id``; None when all are in use. The rule every writer of the session's
        messages in flight takes ids by: ``sent_next``, and a publisher's turn writing a run of QoS 1 PUBLISHes in one
        step (``direct.direct_publishes``), which takes them, records them in
        ``inflight`` and ``where`` and gives back those it did not write as ``sent_next`` and ``dropped`` do, and sets
        ``last_id`` and ``dirty`` alike: the documented contract of those four attributes."""
        for _ in range(65535):
            self.last_id = self.last_id % 65535 + 1
            if self.last_id not in self.inflight:
                return self.last_id
        return None

    def sent(self, packet_id, where=None):
        """A QoS 1 or 2 PUBLISH went out; ``where``: ``(qos, topic, partition, offset)`` of its message."""
        self.inflight[packet_id] = PUBLISH_SENT
        if where is not None:
            self.where[packet_id] = where
        self.dirty = True

    def sent_next(self, where):
        """A QoS 1 PUBLISH going out now (``where``: ``(qos, topic, partition, offset)`` of its message): its packet
        id (``next_packet_id``), recorded in flight at once (``sent``), in one step for a writer that sends it before
        it yields; one whose write took none of it gives the id back (``dropped``). None when every id is in use."""
        packet_id = self.last_id % 65535 + 1
        inflight = self.inflight
        if packet_id in inflight:
            packet_id = self.next_packet_id()
            if packet_id is None:
                return None
        else:
            self.last_id = packet_id
        inflight[packet_id] = PUBLISH_SENT
        self.where[packet_id] = where
        self.dirty = True
        return packet_id

    def acknowledged(self, packet_id, state):
        """The client's PUBACK (``state`` PUBLISH_SENT, QoS 1) or PUBCOMP (PUBREL_SENT, QoS 2) of ``packet_id``: True
        when it ends a message in flight in that state (an unknown one is ignored). A subscriber's read of plain
        PUBACKs ends its messages the same way in one step (``wire.end_pubacks``)."""
        if self.inflight.get(packet_id) == state:
            del self.inflight[packet_id]
            self.where.pop(packet_id, None)
            self.dirty = True
            return True
        return False

    def received(self, packet_id):
        """The client's PUBREC of ``packet_id``: True when the PUBREL is to be sent (a PUBREL once sent is sent
        again for a repeated PUBREC)."""
        if packet_id in self.inflight:
            self.inflight[packet_id] = PUBREL_SENT
            self.dirty = True
            return True
        return False

    def dropped(self, packet_id):
        """A PUBREC with a reason code of 0x80 or more ends the exchange; a packet id ``sent_next`` gave whose
        PUBLISH was not written is given back."""
        self.inflight.pop(packet_id, None)
        self.where.pop(packet_id, None)
        self.dirty = True
