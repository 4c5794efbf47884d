"""What one MQTT connection's subscriptions read from the log, filtered in the broker and sent (docs/mqtt.md
"Subscribing"): the ``Delivery`` of a connection and its greenlet's loop. Its operations are split by group, each
module given what it uses of the delivery's small shared state (``outbound.Outbound``):

    subscribing.py  a filter's topics and partitions, from where they are read, the retained messages it is sent
    outbound.py     how one message goes out: the decision, the PUBLISH, the window in flight, aliases, pacing
    resend.py       what a resumed session sends first: its messages in flight, those carried from another broker
    direct.py       sending from a publisher's turn (``deliver_now``)
    fanplan.py      its part in a fan-out reader: what it hands over, its plan of a batch, what was written
    fanout.py       the port's fan-out readers (one per partition for every caught-up QoS 0 delivery)
    decoded.py      records decoded and QoS 0 PUBLISHes encoded once for every delivery of the port

One greenlet per connection reads each partition from its cursor (``MessageStore.read_records``, the read path a
RocketMQ pull takes, the connection's ``ReplyBudget`` reserved first: a client that does not read stops its own
reads), matches each record's MQTT topic name (``records.message_of``) against the session's filters
(``MqttSession.granted_qos``) and sends what matches at min(published QoS, granted QoS). QoS 1 and 2 deliveries in
flight are bounded by min(``mqtt.max_inflight``, the client's Receive Maximum): the delivery waits for an
acknowledgement past it. With nothing to read it waits on the partitions (``PartitionWaiters.wait_any``), woken by an
append. Each subscription's permission is asked again at every read (a reloaded permissions file applies at once).

**Fan-out.** A delivery caught up on a partition (its cursor at the end of the log there), whose subscriptions of
that topic are granted QoS 0, hands the partition to the port's one reader of it (``fanout.Fanout``): it reads each
record once, decodes it and encodes its PUBLISH once (``Decoded``) and writes it to every delivery handed to it, each
one's own decision taken per record (its permission, its filters, No Local, Retain As Published, Subscription
Identifiers, Message Expiry, its Maximum Packet Size) and its cursor moved past it. What one read brings goes to each
subscriber in one write (a ``sendmsg`` of its PUBLISHes), and the subscribers that get the same PUBLISHes are written
by one call of the C helper (``send_each``, by descriptor; a TLS connection never joins a reader). It never waits for
one: a subscriber whose socket does not take them all at once (it does not read), whose record needs QoS 1 or 2, or
that lost its permission, leaves it at the first record not written (with what the socket did not take of a PUBLISH
begun sent first) and goes on alone from its own cursor, in order, as above; caught up again, it hands the partition
back.

**Topic aliases.** A connection whose client allows them (``Connection.outbound_aliases``, a
``topics.OutboundAliases``) gets each PUBLISH with the alias its table decides (``Outbound.with_alias``), added to the
same encoding (``wire.with_topic_alias``; an aliased QoS 0 PUBLISH made once per message and alias,
``Decoded.aliased``), its fan-out plan its own. Each decision is taken in the order its PUBLISH is written: under the
write lock for the greenlet (``Connection.send_made``), right before a write that never waits otherwise, and undone
when that write did not take the PUBLISH (``FanMember.wrote``, ``FanMember.try_write``, ``direct.deliver_now``), so
the client's aliases and the table never differ. A resend from a session (``resend``) goes by name. A delivery with
every partition handed over and nothing else to do (no wildcard filter, no shared subscription, nothing to resend)
keeps no greenlet: an acknowledgement, a subscription, a fan-out reader that lets it go start one again.

**From the publisher's turn.** While a delivery's greenlet waits between passes, it is listed in the port's
``waiting`` under the partitions it waits on; a publisher's burst, once visible (``flush: async``), has the first
``limits.MQTT_DIRECT_DELIVERIES`` of them send what it brought at once (``deliver_now``: non-blocking writes only,
the QoS 1 window respected), saving the subscriber's wake on the loop; what it cannot send is left to the
greenlet, which the append woke as before. The burst's messages are the publisher's (``records.stored_message``,
the message its record gives back), neither read back from the log nor decoded, and are kept in ``Decoded`` for
the readers known to read them from the log after (a waiting delivery not served or not left caught up, the
partition's fan-out reader); each is decided and encoded by what the greenlet uses (``Outbound.decision``,
``Outbound.prepare``), so a subscriber gets it alike either way; a run of plain QoS 1 ones, of names whose kept
decision sends them as they are, goes out in one step from the publisher's entries (``direct.direct_publishes``).

**Kept per name.** A delivery keeps the match of a topic name against its session's filters (``Outbound.decision``,
at most ``limits.MQTT_KEPT_MATCHES`` names), dropped at any change of the session's subscriptions
(``MqttSession.changed``), and whether a publisher's turn may send to it is kept per topic (``Outbound.sendable``)
while the broker's ``PutPath.version`` (permissions, quotas, topics), the user and the subscriptions stand.

**Paced.** A session whose user has a ``fetch_bytes_per_s`` rate (``Guard.paced``) is served by its own greenlet
only: it never joins a fan-out reader (one that joined before the rate was set leaves it) and a publisher's turn
never sends to it. Each PUBLISH it sends is charged to its user (``Guard.pace``, the one pacing point); over the
rate its pass stops and the next begins after the wait, in its greenlet (``Outbound.paced_wait``). Nothing is read
from the log for it meanwhile: what waits for it is the log's, its window in flight and reply budget as ever.
"""

import logging
import time

import gevent

from metaq import errors
from metaq.mqtt import limits as mqtt_limits
from metaq.auth.acl import SUB
from metaq.mqtt.direct import DirectPath
from metaq.mqtt.fanplan import FanMember
from metaq.mqtt.outbound import Outbound
from metaq.mqtt.records import message_of
from metaq.mqtt.resend import resend, send_carried
from metaq.mqtt.subscribing import Subscriber
from metaq.serving.connections import share_loop

log = logging.getLogger(__name__)

#: ``Delivery._greenlet`` between a wake and the loop's start of its greenlet.
_STARTING = object()


class Delivery:
    """The delivery of one connection (``conn``, an ``mqtt.connection.Connection``) through ``port`` (the store, the
    guard, the waiters and the settings it reads): its subscriptions (``Subscriber``), its way out (``Outbound``),
    its part in the fan-out readers (``FanMember``) and its greenlet's loop. The greenlet runs while it has work
    (``wake`` starts it, ``stop`` ends it); its attributes are in slots: every subscribed client has one."""

    __slots__ = ("conn", "port", "waiters", "out", "subs", "fan", "event", "path", "_retained", "_deferred",
                 "_greenlet", "_resent", "_window_full")

    def __init__(self, conn, port):
        self.conn = conn
        self.port = port
        self.waiters = port.waiters
        self.out = Outbound(conn, port)
        self.subs = Subscriber(self.out, port.settings)
        self.fan = FanMember(self.out, port.fanouts, self.wake)
        #: What its greenlet waits on between passes (the connection's ``room``, made before its delivery and never
        #: replaced): set by ``wake`` and by appends to the partitions it reads.
        self.event = conn.room
        #: The publisher's turn's one call for this delivery's common case (``direct.DirectPath.send``; None from it:
        #: ``direct.deliver_now`` decides), made once its connection's CONNECT fixed what it keeps.
        self.path = self.out.path = DirectPath(self.out)
        self._retained = []  # (filter, granted QoS) of subscriptions whose retained messages are to be sent
        self._deferred = None  # (topic, partition) -> (SharedGroup, offset) this member left to another member's turn
        self._window_full = False  # the last pass left a shared group's message for want of room in flight
        self._greenlet = None  # while it has work
        self._resent = False  # a resumed session's messages in flight were sent again

    # -- subscribing -----------------------------------------------------------

    def subscribe(self, sub, sub_id=None):
        """Add one filter of a SUBSCRIBE (a ``wire.Subscription``) with the SUBSCRIBE's Subscription Identifier
        (``sub_id``, None: none); its SUBACK code (the granted QoS, or a failure): ``Subscriber.subscribe``."""
        return self.subs.subscribe(sub, sub_id)

    def resumed(self):
        """A resumed session's literal filters also read the topics the topic map gives them now
        (``Subscriber.resumed``)."""
        self.subs.resumed()

    def retained_after_suback(self, subscribed):
        """The retained messages of the filters in ``subscribed`` (``(filter, granted QoS)``) are to be sent, by
        this delivery's greenlet (a QoS 1 or 2 one may wait for room in flight), after the SUBACK."""
        self._retained.extend(subscribed)
        self._unwait()  # a publisher's turn sends it nothing before them (``MqttPort.deliver_now``)
        self.fan.leave_all()  # its retained messages go before what comes next: this greenlet sends both
        self.wake()

    # -- its greenlet ------------------------------------------------------------

    def wake(self):
        """Let the delivery look again (an acknowledgement, a subscription, a fan-out reader that let it go): its
        greenlet is started when it has none; nothing once the connection closed."""
        conn = self.conn
        conn.room.set()
        if self._greenlet is None and not conn.closed:
            self._greenlet = _STARTING  # started from the loop: gevent keeps the frames of a greenlet's spawner
            gevent.get_hub().loop.run_callback(self._start)

    def _start(self):
        if self._greenlet is _STARTING:
            self._greenlet = None if self.conn.closed else gevent.spawn(self.run)

    def stop(self):
        """The connection ended: its greenlet is ended and the fan-out readers let it go; its way out no longer
        keeps its path (which keeps it: a cycle only the collector's full pass would free)."""
        g, self._greenlet = self._greenlet, None
        if g is not None and g is not _STARTING:
            g.kill(block=False)
        self.fan.end()
        self.out.path = None

    def run(self):
        """The greenlet: a resumed session's messages first (``_resend_first``), then passes over its partitions
        until it has nothing left but the fan-out readers' (``_loop``)."""
        me = gevent.getcurrent()
        try:
            self.out.turn = time.monotonic()
            if self._resend_first():
                self._loop()
        finally:
            if self._greenlet is me:
                self._greenlet = None
            me = None  # a kill's traceback keeps this frame: it must not keep its greenlet (a cycle)

    def _resend_first(self):
        """Its messages in flight again, once (``resend.resend``), then those carried from another broker
        (``resend.send_carried``); False when the connection closed meanwhile."""
        if not self._resent:
            self._resent = True
            resend(self.out)
        return not self.out.session.carried or send_carried(self.out)

    def _loop(self):
        """Pass over every partition it reads and send what matches, again while there is more, else wait for an
        append or a wake (``_wait``); returns when the connection closed or nothing but the fan-out readers has work
        for it."""
        conn = self.conn
        room = conn.room
        while not conn.closed:
            if conn.unsent and not conn.flush_unsent():  # what a fan-out reader began goes first
                return
            if self._retained:
                pending, self._retained = self._retained, []
                self.subs.send_retained(pending)
            if time.monotonic() - self.subs.rescanned >= mqtt_limits.MQTT_TOPIC_RESCAN_S:
                self.subs.rescan()
            seen = self._ends()  # before the pass: an append after its read of a partition woke nobody
            room.clear()  # before the pass: an acknowledgement during it is kept when the pass needed one
            self._window_full = False
            if self._pass() and (self.out.session.shared or self._behind()):
                continue  # more to read (an append came while it sent)
            if not self._window_full:
                room.clear()  # a wake during the pass that changes nothing for it (the others: _unread, below)
            if conn.closed or self.waiters.closed:
                return
            if self._retained or conn.unsent:
                continue
            self.fan.hand_over()
            keys = self._keys()
            if not keys and self._idle():
                return  # every partition is a fan-out reader's: no greenlet until woken
            self._wait(keys, seen)
            self.out.turn = time.monotonic()

    def _keys(self):
        """The partitions it reads itself (not handed to a fan-out reader) and its shared groups'."""
        handed = self.fan.handed or ()
        keys = [k for k in self.out.session.cursors if k not in handed]
        for group, _granted, _id in self.out.session.shared.values():
            keys.extend(group.cursors)
        return keys

    def _wait(self, keys, seen):
        """Wait on partitions ``keys`` (a pass began at ``seen``, ``_ends``), listed in the port's ``waiting`` under
        each meanwhile: a publisher's burst may send to it from its own turn (``deliver_now``)."""
        waiting = self.port.waiting
        for key in keys:
            ds = waiting.get(key)
            if ds is None:
                waiting[key] = {self: None}
            else:
                ds[self] = None
        try:
            self.waiters.wait_any(keys, mqtt_limits.MQTT_TOPIC_RESCAN_S, self.conn.room, self._unread(seen),
                                  self.out.store.max_offset)
        finally:
            for key in keys:
                ds = waiting.get(key)
                if ds is not None:
                    ds.pop(self, None)
                    if not ds:
                        del waiting[key]

    def _unwait(self):
        """Out of the port's ``waiting`` until its greenlet waits again: what a publisher's turn would send it now
        must come after what it has to send first (``_wait`` lists it only with nothing of that). A publisher's turn
        sends only to partitions its session has a cursor of (``direct.deliver_now``)."""
        waiting = self.port.waiting
        for key in self.out.session.cursors:
            ds = waiting.get(key)
            if ds is not None and ds.pop(self, 0) is None and not ds:
                del waiting[key]

    def _ends(self):
        """``{key: visible end}`` of the partitions the next pass reads (its own and its shared groups')."""
        end, visible_end = self.out.store.max_offset, self.waiters.visible_end
        handed = self.fan.handed or ()
        ends = {key: visible_end(end, key) for key in self.out.session.cursors if key not in handed}
        for group, _granted, _id in self.out.session.shared.values():
            for key in group.cursors:
                ends[key] = visible_end(end, key)
        return ends

    def _unread(self, seen):
        """``wait_any``'s ``seen`` after a pass that began at ``seen`` (``_ends``): the partitions whose cursor is
        behind the log's end now, each with the end the pass began at, or with its cursor when the pass did not read
        it (a fan-out reader let it go meanwhile, its wake taken back by ``room.clear``). The wait does not begin
        when one of them moved since: the records came while the pass went on, after it read there, and their wakes
        found no wait. A partition behind with nothing appended since (its topic no longer readable, a window full)
        is waited on as before, not read again and again."""
        end, visible_end = self.out.store.max_offset, self.waiters.visible_end
        handed = self.fan.handed or ()
        unread = {}
        for key, at in self.out.session.cursors.items():
            if key not in handed and at < visible_end(end, key):
                unread[key] = seen.get(key, at)
        for group, _granted, _id in self.out.session.shared.values():
            for key, at in group.cursors.items():
                if at < visible_end(end, key):
                    unread[key] = seen.get(key, at)
        return unread

    def _idle(self):
        """True when nothing but the fan-out readers has work for this delivery: no wildcard filter (it looks for new
        topics), no shared subscription, no retained message to send."""
        session = self.out.session
        return not session.shared and not self._retained and not session.wildcards()

    def _behind(self):
        """True when a partition this session reads (not a fan-out reader's) has messages past its cursor: asked,
        without yielding, after a pass that read something, instead of a second pass that would read nothing (an
        append while the pass sent has already moved the visible end, so its wake is not missed)."""
        max_offset = self.out.store.max_offset
        handed = self.fan.handed or ()
        for key, offset in self.out.session.cursors.items():
            if key not in handed and offset < max_offset(*key):
                return True
        return False

    def _pass(self):
        """Read every partition once from its cursor and send what matches; True when something was read. A pass
        begins once its user's fetch rate lets it (``Outbound.paced_wait``)."""
        out = self.out
        out.paced_wait()
        read_any = False
        conn = self.conn
        handed = self.fan.handed or ()
        for key in [k for k in out.session.cursors if k not in handed]:
            out.turn = share_loop(out.turn)  # a backlog (of records no filter wants, too) lets the others run
            if conn.closed:
                return False
            if out.resume_at is not None:
                return True  # over its user's fetch rate: the next pass goes on once it may
            topic = key[0]
            if not out.may_read(topic):
                continue  # a reloaded permissions file took it away: nothing more of it is read
            if not conn.replies.reserve(out.max_transfer, lambda: conn.closed):
                return False
            try:
                read_any = self._read(key) or read_any
            finally:
                conn.replies.release(out.max_transfer)
        for group, granted, sub_id in list(out.session.shared.values()):
            for key in list(group.cursors):
                out.turn = share_loop(out.turn)
                if conn.closed:
                    return False
                if out.resume_at is not None:
                    return True
                if not out.guard.allows(conn.session, SUB, "topic", key[0]):
                    continue
                if not conn.replies.reserve(out.max_transfer, lambda: conn.closed):
                    return False
                try:
                    read_any = self._read_shared(group, granted, key, sub_id) or read_any
                finally:
                    conn.replies.release(out.max_transfer)
        return read_any

    def _read_shared(self, group, granted, key, sub_id=None):
        """Read a shared group's partition from the group's cursor: each record is claimed (the cursor moved past it)
        before it is sent, so another member's delivery never sends it too."""
        out = self.out
        topic, partition = key
        offset = group.cursors.get(key)
        if offset is None:
            return False
        try:
            records, _next = out.store.read_records(topic, partition, offset, mqtt_limits.MQTT_DELIVERY_BATCH,
                                                    out.max_transfer)
        except errors.Moved as moved:
            group.cursors[key] = moved.offset
            group.dirty = True
            return moved.offset != offset
        except errors.CorruptRecord as exc:
            group.cursors[key] = exc.next_offset
            group.dirty = True
            return True
        except errors.MetaqError:
            group.cursors.pop(key, None)
            return False
        for rec in records:
            if group.cursors.get(key) != rec.queue_offset:
                return True  # another member claimed it meanwhile
            m = message_of(topic, rec.flag, rec.data, self.port.topics)
            if not self.port.group_takes(group, topic, partition, rec, m):
                group.cursors[key] = rec.queue_offset + 1
                group.dirty = True
                continue
            if min(granted, m.qos) and not self._has_room(self.conn):
                self._window_full = True  # an acknowledgement that came during the pass is not waited for again
                return False  # its window is full: a member with room takes it (this one waits for an ack)
            if self._deferred is None:
                self._deferred = {}
            if not group.my_turn(self.conn, self._has_room) and \
                    self._deferred.get(key) != (group, rec.queue_offset):
                self._deferred[key] = (group, rec.queue_offset)  # another member's turn; past a wait, this one's
                return False
            group.cursors[key] = rec.queue_offset + 1
            group.dirty = True
            group.claimed(self.conn)
            if not out.send(topic, (partition, rec.queue_offset), rec.flag, rec.data, granted, False, m,
                            () if sub_id is None else (sub_id,)):
                return False
            if out.resume_at is not None:
                return True  # over its user's fetch rate: the next pass goes on from here once it may
        return bool(records)

    def _has_room(self, conn):
        """True when ``conn`` (a member of a shared group) may have one more QoS 1 or 2 message in flight now."""
        return not conn.closed and len(conn.mqtt.inflight) < conn.inflight_window

    def _read(self, key):
        out = self.out
        topic, partition = key
        cursors = out.session.cursors
        offset = cursors.get(key)
        if offset is None:
            return False
        try:
            records, _next = out.store.read_records(topic, partition, offset, mqtt_limits.MQTT_DELIVERY_BATCH,
                                                    out.max_transfer)
        except errors.Moved as moved:  # below the log's start (retention), or past a slave's cut end
            cursors[key] = moved.offset
            return moved.offset != offset
        except errors.CorruptRecord as exc:
            log.error("mqtt %s: %s; skipped", self.conn.peer, exc)
            cursors[key] = exc.next_offset
            return True
        except errors.MetaqError as exc:  # the topic was deleted
            log.info("mqtt %s: %s:%d is not read any more: %s", self.conn.peer, topic, partition, exc)
            cursors.pop(key, None)
            return False
        if topic in self.port.cluster_topics:
            self.port.copies_read_back += len(records)  # (``stats``: against those its port served it directly)
        for rec in records:
            if not self._deliver(topic, partition, rec):
                return False
            if key in cursors:
                cursors[key] = rec.queue_offset + 1
                out.session.dirty = True
            if out.resume_at is not None:
                return True  # over its user's fetch rate: the next pass goes on from here once it may
        return bool(records)

    def _deliver(self, topic, partition, rec):
        """Send one record when a subscription matches it; False when the connection closed meanwhile."""
        out = self.out
        key = (rec.position, rec.msg_id)
        m = out.decoded.message(key, topic, rec.flag, rec.data)
        granted, ids, retain = out.decision(topic, m)
        if granted is None:
            return True
        return out.send(topic, (partition, rec.queue_offset), rec.flag, rec.data, granted, retain, m, ids, key, True)

