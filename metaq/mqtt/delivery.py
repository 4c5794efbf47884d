"""What one MQTT connection's subscriptions read from the log, filtered in the broker and sent (docs/mqtt.md
"Subscribing").

A filter whose first level is literal reads the metaq topics the topic map says can hold its names
(``TopicMap.topics_for``: usually one), those its user may read; one that starts with a wildcard reads every topic
its user may read (the broker's own topics never), at most ``mqtt.max_wildcard_topics``. Each
subscription's permission is the guard's (``Guard.require(session, SUB, "topic", ...)``) for every topic it reads,
asked again at every read (a reloaded permissions file applies at once): a client never subscribes its way around a
topic it may not read. A new subscription starts at the end of the log (clean sessions); a topic that appears later
under a wildcard filter is read from its start.

One greenlet per connection reads each partition from its cursor (``MessageStore.read_records``, the read path a
RocketMQ pull takes, the connection's ``ReplyBudget`` reserved first: a client that does not read stops its own
reads), matches each record's MQTT topic name (``records.message_of``) against the session's filters
(``MqttSession.granted_qos``) and sends what matches at min(published QoS, granted QoS). QoS 1 and 2 deliveries in
flight are bounded by min(``mqtt.max_inflight``, the client's Receive Maximum): the delivery waits for an
acknowledgement past it. With nothing to read it waits on the partitions (``PartitionWaiters.wait_any``), woken by an
append.

**Fan-out.** A delivery caught up on a partition (its cursor at the end of the log there), whose subscriptions of
that topic are granted QoS 0, hands the partition to the port's one reader of it (``Fanout``, one greenlet per
partition read this way): it reads each record once, decodes it and encodes its PUBLISH once (``Decoded``) and
writes it to every delivery handed to it, each one's own decision taken per record (its permission, its filters,
No Local, Retain As Published, Subscription Identifiers, Message Expiry, its Maximum Packet Size) and its cursor
moved past it. What one read brings goes to each subscriber in one write (a ``sendmsg`` of its PUBLISHes), and the
subscribers that get the same PUBLISHes are written by one call of the C helper (``send_each``, by descriptor;
a TLS connection never joins a reader). It never waits for one: a subscriber whose socket does not take them all
at once (it does not read), whose record needs QoS 1 or 2, or that lost its permission, leaves it at the first
record not written (with what the socket did not take of a PUBLISH begun sent first) and goes on alone from its own
cursor, in order, as above; caught up again, it hands the partition back.

**Topic aliases.** A connection whose client allows them (``Connection.outbound_aliases``, a
``topics.OutboundAliases``) gets each PUBLISH with the alias its table decides (``_with_alias``), added to the same
encoding (``wire.with_topic_alias``; an aliased QoS 0 PUBLISH made once per message and alias, ``Decoded.aliased``),
its fan-out plan its own. Each decision is taken in the order its PUBLISH is written: under the write lock for the
greenlet (``Connection.send_made``), right before a write that never waits otherwise, and undone when that write
did not take the PUBLISH (``fan_wrote``, ``fan_try``, ``deliver_now``), so the client's aliases and the table never
differ. A resend from a session (``resend``) goes by name. A delivery with every partition handed
over and nothing else to do (no wildcard filter, no shared subscription, nothing to resend) keeps no greenlet: an
acknowledgement, a subscription, a fan-out reader that lets it go start one again.

**From the publisher's turn.** While a delivery's greenlet waits between passes, it is listed in the port's
``waiting`` under the partitions it waits on; a publisher's burst, once visible (``flush: async``), has the first
``limits.MQTT_DIRECT_DELIVERIES`` of them send what it brought at once (``deliver_now``: non-blocking writes only,
the QoS 1 window respected), saving the subscriber's wake on the loop; what it cannot send is left to the
greenlet, which the append woke as before. The burst's messages are the publisher's (``records.stored_message``,
the message its record gives back), neither read back from the log nor decoded, and are kept in ``Decoded`` for
the readers of the log that come after; each is decided and encoded by what the greenlet uses (``_decision``,
``_prepare``), so a subscriber gets it alike either way.

**Paced.** A session whose user has a ``fetch_bytes_per_s`` rate (``Guard.paced``) is served by its own greenlet
only: it never joins a fan-out reader (one that joined before the rate was set leaves it) and a publisher's turn
never sends to it. Each PUBLISH it sends is charged to its user (``Guard.pace``, the one pacing point); over the
rate its pass stops and the next begins after the wait, in its greenlet (``_paced_wait``). Nothing is read from
the log for it meanwhile: what waits for it is the log's, its window in flight and reply budget as ever.

Long because one delivery's cursor state is shared by its own reads, the fan-out hand-over, a publisher's direct
delivery, its aliases and its pacing; taking it apart goes with splitting the MQTT connection by operation group.
"""

import _socket
import logging
import time

import gevent
from gevent.event import Event

from metaq import errors, limits, speedups
from metaq.auth.acl import SUB
from metaq.mqtt import wire
from metaq.mqtt.follow import RecordError, decode_carried
from metaq.mqtt.records import message_of, partition_for
from metaq.mqtt.session import PUBREL_SENT, Subscribed
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.mqtt.topics import TopicError, split_shared
from metaq.server.clock import now_ms
from metaq.server.connections import share_loop
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.topics.names import is_internal

log = logging.getLogger(__name__)


class Decoded:
    """Records decoded once for every delivery of a port, and the QoS 0 PUBLISH of each encoded once for every
    subscriber that gets it the same way (same MQTT version and retain flag, no Subscription Identifier, no expiry):
    at most ``count`` of each (``limits.MQTT_SHARED_DECODES``) holding ``nbytes`` together
    (``limits.MQTT_SHARED_DECODES_BYTES``), the oldest dropped first. A record is known by its place in the log and
    its message id, so a log cut and written again (a slave's) is never mistaken for it. ``topics``: the port's
    topic map (``records.message_of``)."""

    __slots__ = ("topics", "count", "nbytes", "_messages", "_packets")

    def __init__(self, topics=DEFAULT_MAP, count=limits.MQTT_SHARED_DECODES, nbytes=limits.MQTT_SHARED_DECODES_BYTES):
        self.topics = topics
        self.count = count
        self.nbytes = nbytes
        self._messages = _Kept(count, nbytes)  # (position, msg id) -> MqttMessage
        self._packets = _Kept(count, nbytes)  # (position, msg id, retain, version) -> encoded QoS 0 PUBLISH

    def message(self, key, topic, flag, data):
        """The ``MqttMessage`` of the record ``key`` (``(position, msg id)``) of metaq topic ``topic``."""
        m = self._messages.get(key)
        if m is None:
            m = message_of(topic, flag, data, self.topics)
            self._messages.put(key, m, len(m.payload))
        return m

    def keep(self, key, m):
        """Keep ``m`` as the message of record ``key``, made without decoding it (``records.stored_message``: the one
        ``message`` would decode)."""
        self._messages.put(key, m, len(m.payload))

    def packet(self, key, m, retain, version):
        """The QoS 0 PUBLISH of record ``key``'s message ``m`` in ``version``."""
        pkey = key + (retain, version)
        data = self._packets.get(pkey)
        if data is None:
            data = wire.encode(wire.Publish(m.topic, m.payload, 0, retain, False, None,
                                            m.properties if version == wire.MQTT_5 else {}), version)
            self._packets.put(pkey, data, len(data))
        return data

    def aliased(self, key, retain, version, data, alias, named):
        """``packet``'s PUBLISH ``data`` (of record ``key``, ``retain``, ``version``) with Topic Alias ``alias``, its
        name kept (``named``) or not (``wire.with_topic_alias``): encoded once for every connection that sends it
        so."""
        akey = key + (retain, version, alias, named)
        out = self._packets.get(akey)
        if out is None:
            out = wire.with_topic_alias(data, alias, named)
            self._packets.put(akey, out, len(out))
        return out


class _Kept:
    """The most recent values, at most ``count`` of them and ``nbytes`` together (a value larger alone: not kept)."""

    __slots__ = ("count", "nbytes", "held", "_values")

    def __init__(self, count, nbytes):
        self.count = count
        self.nbytes = nbytes
        self.held = 0
        self._values = {}  # key -> (value, size), oldest first

    def __len__(self):
        return len(self._values)

    def __contains__(self, key):
        return key in self._values

    def get(self, key):
        kept = self._values.get(key)
        return None if kept is None else kept[0]

    def put(self, key, value, size):
        if size > self.nbytes:
            return
        values = self._values
        values[key] = (value, size)
        self.held += size
        while len(values) > self.count or self.held > self.nbytes:
            oldest = next(iter(values))
            self.held -= values.pop(oldest)[1]


#: Packets one ``send_each`` writes at most (Linux's IOV_MAX).
_SEND_IOV_MAX = 1024


def send_each_py(packets, fds):
    """``packets`` (bytes-like, at most ``_SEND_IOV_MAX``) written in order by one non-blocking ``sendmsg`` to each
    file descriptor of ``fds``, none waited for: ``[(i, n)]`` for each ``fds[i]`` that did not take all of them,
    ``n`` the bytes it took (0: its buffer was full) or ``-errno`` (the send failed). The C helper's twin."""
    if len(packets) > _SEND_IOV_MAX:
        raise ValueError("send_each: %d packets, at most %d" % (len(packets), _SEND_IOV_MAX))
    total = sum(memoryview(p).nbytes for p in packets)
    short = []
    for i, fd in enumerate(fds):
        if fd < 0:
            raise ValueError("send_each: bad file descriptor %d" % fd)
        try:
            s = _socket.socket(fileno=fd)  # no duplicate: the descriptor is let go (detach) after the send
        except OSError as exc:
            n = -exc.errno  # not an open socket: the C helper's sendmsg fails alike
        else:
            try:
                n = s.sendmsg(packets, [], _socket.MSG_DONTWAIT | _socket.MSG_NOSIGNAL)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                n = -exc.errno
            finally:
                s.detach()
        if n != total:
            short.append((i, n))
    return short


send_each = speedups.load("send_each", send_each_py)  # the C twin when built: the GIL released, one call for all


class Fanouts:
    """The port's fan-out readers (``Fanout``), one per partition some caught-up delivery handed over."""

    __slots__ = ("store", "waiters", "decoded", "max_transfer", "readers")

    def __init__(self, store, waiters, decoded, max_transfer):
        self.store, self.waiters, self.decoded, self.max_transfer = store, waiters, decoded, max_transfer
        self.readers = {}  # (metaq topic, partition) -> Fanout

    def join(self, key, delivery, offset):
        """Hand partition ``key`` to its reader from ``offset`` (the delivery's cursor): the reader, or None when one
        reads it from another offset (the delivery reads it alone and tries again once caught up)."""
        f = self.readers.get(key)
        if f is None:
            f = self.readers[key] = Fanout(self, key, offset)
            f.members.add(delivery)
            f.greenlet = gevent.spawn(f.run)
            return f
        if f.offset != offset or f.ended:
            return None
        f.members.add(delivery)
        return f


class _Batch:
    """A fan-out reader's records of one read, as every member's ``Delivery.fan_plan`` reads them: ``items``
    (``(queue offset, key in Decoded, MqttMessage)`` each, in order), ``end`` (the offset after the last), the kinds
    of message ``_decision`` tells apart (``kinds``: the first message of each; ``kind_of``: each item's), whether
    one has an expiry, and the plans decided for members alike (``plans``)."""

    __slots__ = ("items", "first", "end", "kinds", "kind_of", "expiring", "plans")

    def __init__(self, records, topic, decoded):
        self.items, self.kinds, self.kind_of, self.expiring, self.plans = [], [], [], False, {}
        seen = {}  # what _decision reads of a message -> its kind
        for rec in records:
            dkey = (rec.position, rec.msg_id)
            m = decoded.message(dkey, topic, rec.flag, rec.data)
            self.items.append((rec.queue_offset, dkey, m))
            what = (m.topic, m.client_id, m.retain)
            kind = seen.get(what)
            if kind is None:
                kind = seen[what] = len(self.kinds)
                self.kinds.append(m)
            self.kind_of.append(kind)
            if m.expires_ms is not None:
                self.expiring = True
        self.first = records[0].queue_offset
        self.end = records[-1].queue_offset + 1


class Fanout:
    """One reader of partition ``key`` for the deliveries handed to it (see the module doc): ``offset`` is the next
    record it writes to them; it ends when it has none left, and lets every one go when the partition cannot be read
    as it was (moved, a damaged record, the topic deleted, its partitions changed: each member's own read decides)."""

    __slots__ = ("fanouts", "key", "offset", "members", "greenlet", "ended", "_wake", "_partitions")

    def __init__(self, fanouts, key, offset):
        self.fanouts, self.key, self.offset = fanouts, key, offset
        self.members = set()  # Delivery
        self.greenlet = None
        self.ended = False
        self._wake = Event()
        self._partitions = None

    def run(self):
        f, (topic, partition) = self.fanouts, self.key
        store, decoded = f.store, f.decoded
        try:
            try:
                self._partitions = store.partitions_of(topic)
            except errors.MetaqError:
                return
            turn = time.monotonic()
            while self.members and not f.waiters.closed:
                try:
                    if store.partitions_of(topic) != self._partitions:
                        return  # a literal filter's partition may have moved: each member rescans alone
                    records, _next = store.read_records(topic, partition, self.offset, limits.MQTT_DELIVERY_BATCH,
                                                        f.max_transfer)
                except errors.MetaqError:
                    return
                if not records:
                    self._wake.clear()
                    f.waiters.wait_any((self.key,), limits.MQTT_TOPIC_RESCAN_S, self._wake)
                    turn = time.monotonic()
                    continue
                batch = _Batch(records, topic, decoded)
                self.offset = batch.end  # a delivery that joins meanwhile has read these itself
                turn = self._write(batch, turn)
        finally:
            self.ended = True
            if f.readers.get(self.key) is self:
                del f.readers[self.key]
            members, self.members = self.members, set()
            for d in members:
                d.left(self.key)

    def _write(self, batch, turn):
        """Write the records of ``batch`` (a ``_Batch``) to every member, each one's PUBLISHes decided by its delivery
        (``Delivery.fan_plan``) and written by one non-blocking call for all the members that get the same ones
        (``send_each``: one ``sendmsg`` of them all per socket, by descriptor; a connection that cannot be written so
        now goes through ``try_send``); a member whose socket did not take all of them reads on alone
        (``Delivery.fan_wrote``). Members are decided and written in rounds, the loop shared between rounds
        (``share_loop``), never between a member's decision and its write. Returns when this turn started."""
        key = self.key
        members = self.members
        same = {}  # the PUBLISHes, in order -> [(Delivery, plan)]
        budget = limits.MAX_TURN_MS / 1000.0
        for d in list(members):
            if d not in members:
                continue
            plan = d.fan_plan(key, batch)
            if plan is None:
                self.leave(d)
            elif not plan[0]:
                if not d.fan_wrote(key, plan):
                    self.leave(d)
            else:
                same.setdefault(plan[0], []).append((d, plan))
            if time.monotonic() - turn >= budget:
                self._send(same)
                same = {}
                turn = share_loop(turn)
        self._send(same)
        return turn

    def _send(self, same):
        """Write each run of PUBLISHes of ``same`` (see ``_write``) to its members, decided with no yield since."""
        key = self.key
        for packets, planned in same.items():
            direct, fds = [], []
            for d, plan in planned:
                fd = d.conn.fan_fd()
                if fd is None:
                    if not d.fan_try(key, plan):
                        self.leave(d)
                else:
                    direct.append((d, plan))
                    fds.append(fd)
            if not fds:
                continue
            short = dict(send_each(packets, fds))
            for i, (d, plan) in enumerate(direct):
                if not d.fan_wrote(key, plan, short.get(i)):
                    self.leave(d)

    def leave(self, delivery):
        """``delivery`` reads this partition alone from now on, from its cursor."""
        self.members.discard(delivery)
        delivery.left(self.key)


def _one_name(topic_filter):
    """The one MQTT topic name ``topic_filter`` matches when it has no wildcard and more than one level (its messages
    are all in that name's partition), else None: a filter of the first level alone also matches the records put to
    that metaq topic over the other protocols, which may be in any partition."""
    if "/" not in topic_filter or "+" in topic_filter or "#" in topic_filter:
        return None
    return topic_filter


#: ``Delivery._greenlet`` between a wake and the loop's start of its greenlet.
_STARTING = object()
#: ``Delivery._prepare``: not sent, as if delivered (expired, too large for the client).
_DROPPED = object()
#: ``Delivery._prepare``: not sent now (no room in flight without waiting, QoS 2 from a turn that may not wait, the
#: connection closed while waiting).
_HELD = object()


class Delivery:
    """The delivery of one connection (``conn``, an ``mqtt.connection.Connection``) through ``port`` (the store, the
    guard, the waiters and the settings it reads). Its greenlet runs while it has work (``wake`` starts it, ``stop``
    ends it); its attributes are in slots: every subscribed client has one."""

    __slots__ = ("conn", "store", "guard", "waiters", "settings", "max_transfer", "session", "port", "decoded",
                 "fanouts", "_retained", "_deferred", "_seen", "_rescanned", "_overflow_logged", "_turn", "_greenlet",
                 "_resent", "_handed", "_window_full", "_resume_at")

    def __init__(self, conn, port):
        self.conn = conn
        self.store = port.store
        self.guard = port.guard
        self.waiters = port.waiters
        self.settings = port.settings
        self.max_transfer = port.max_transfer
        self.session = conn.mqtt
        self.port = port
        self.decoded = port.decoded
        self.fanouts = port.fanouts
        self._retained = []  # (filter, granted QoS) of subscriptions whose retained messages are to be sent
        self._deferred = None  # (topic, partition) -> (SharedGroup, offset) this member left to another member's turn
        self._window_full = False  # the last pass left a shared group's message for want of room in flight
        self._seen = None  # topics known when a wildcard filter was subscribed, or found since
        self._rescanned = time.monotonic()
        self._overflow_logged = False
        self._turn = 0.0  # when this greenlet's turn on the loop began (connections.share_loop)
        self._greenlet = None  # while it has work
        self._resent = False  # a resumed session's messages in flight were sent again
        self._handed = None  # (topic, partition) -> the Fanout it was handed to
        self._resume_at = None  # monotonic time its user's fetch rate lets it read again (``_paced_wait``)

    # -- subscribing -----------------------------------------------------------

    def subscribe(self, sub, sub_id=None):  # noqa: C901 - to split with the delivery by operation group
        """Add one filter of a SUBSCRIBE (a ``wire.Subscription``) with the SUBSCRIBE's Subscription Identifier
        (``sub_id``, None: none); its SUBACK code (the granted QoS, or a failure)."""
        session, s = self.session, self.settings
        try:
            share, inner = split_shared(sub.topic_filter)
        except TopicError:
            return wire.TOPIC_FILTER_INVALID
        held = len(session.subscriptions) + len(session.shared)
        if sub.topic_filter not in session.subscriptions and sub.topic_filter not in session.shared \
                and held >= s.max_subscriptions:
            log.info("mqtt %s: SUBSCRIBE %s refused: %d subscriptions is the limit (mqtt.max_subscriptions)",
                     self.conn.peer, sub.topic_filter, s.max_subscriptions)
            return wire.QUOTA_EXCEEDED
        if share is not None:
            try:
                self.guard.require(self.conn.session, SUB, "group", share)  # the group is a consumer group's
            except (errors.Forbidden, errors.Unauthenticated) as exc:
                log.info("mqtt %s: SUBSCRIBE %s refused: %s", self.conn.peer, sub.topic_filter, exc)
                return wire.NOT_AUTHORIZED
        topics, every = self.port.topics.topics_for(inner)
        if every:  # the rules' topics among them once they exist (``_rescan``)
            topics = self._readable()
            if self._seen is None:
                self._seen = set()
            self._seen.update(self.store.known_topics())
            if len(topics) > s.max_wildcard_topics:
                log.info("mqtt %s: SUBSCRIBE %s refused: it would read %d topics, past the limit of %d "
                         "(mqtt.max_wildcard_topics)", self.conn.peer, sub.topic_filter, len(topics),
                         s.max_wildcard_topics)
                return wire.QUOTA_EXCEEDED
        elif not topics:
            log.info("mqtt %s: SUBSCRIBE %s refused: topic filters beginning with '$' are the broker's",
                     self.conn.peer, sub.topic_filter)
            return wire.TOPIC_FILTER_INVALID
        code, topics = self._allowed(sub.topic_filter, topics) if not every else (None, topics)
        if code is not None:
            return code
        granted = min(sub.qos, 2)
        cluster = self.port.cluster_topics  # the MQTT cluster's inbox: what the peers published (metaq.mqttcluster)
        if share is not None:
            old = session.shared.pop(sub.topic_filter, None)
            if old is not None:
                self.port.leave_group(self.conn, old[0])
            group = self.port.join_group(self.conn, share, inner, topics, self.store.max_offset)
            session.shared[sub.topic_filter] = (group, granted, sub_id)
            return granted
        session.subscribe(Subscribed(sub.topic_filter, granted, sub.no_local, list(topics) + list(cluster),
                                     sub.retain_as_published, sub_id))
        for topic in topics:
            self._start_at_end(topic, name=_one_name(inner))
        for topic in cluster:
            self._start_at_end(topic)
        if cluster:
            self.port.routes_changed(sub.topic_filter)
        return granted

    def resumed(self):
        """A resumed session's filters whose first level is literal also read the topics the topic map gives them now
        and did not when they were subscribed (``mqtt.topic_map`` changed since), from the end of the log; those read
        before go on from their positions (what they hold was written under the rules of then)."""
        for sub in self.session.subscriptions.values():
            if sub.wildcard:
                continue
            topics, _every = self.port.topics.topics_for(sub.topic_filter)
            new = [t for t in topics if t not in sub.topics]
            for topic in (self._allowed(sub.topic_filter, new)[1] or ()) if new else ():
                sub.topics.add(topic)
                self._start_at_end(topic, name=_one_name(sub.topic_filter))

    def _allowed(self, topic_filter, topics):
        """``(None, the topics of ``topics`` this subscriber may read)`` for a filter whose first level is literal
        (``TopicMap.topics_for``'s), or ``(SUBACK failure code, None)`` when it may read none of them: a filter that
        spans topics reads those its user may read (and the store has or may create), as a wildcard one does."""
        allowed, code, why = [], None, None
        for topic in topics:
            try:
                self.guard.require(self.conn.session, SUB, "topic", topic)
                self.store.partitions_of(topic)
            except (errors.Forbidden, errors.Unauthenticated) as exc:
                code, why = code or wire.NOT_AUTHORIZED, why or exc
                continue
            except errors.InvalidTopic as exc:
                code, why = code or wire.TOPIC_FILTER_INVALID, why or exc
                continue
            except errors.MetaqError as exc:
                code, why = code or wire.UNSPECIFIED_ERROR, why or exc
                continue
            allowed.append(topic)
        if not allowed:
            log.info("mqtt %s: SUBSCRIBE %s refused: %s", self.conn.peer, topic_filter, why)
            return code, None
        return None, allowed

    def _readable(self):
        """The topics a wildcard filter reads: every topic this user may read, the broker's own left out."""
        security = self.conn.session
        return [t for t in self.store.known_topics()
                if not is_internal(t) and self.guard.allows(security, SUB, "topic", t)]

    def _start_at_end(self, topic, at_start=False, name=None):
        """Read ``topic`` from the end of the log (``at_start``: from its start) on the partitions not read yet: every
        partition, or with ``name`` (a filter without wildcards: one MQTT topic name) only the one its messages are
        stored in (``records.partition_for``), so that its delivery neither reads nor wakes on the others."""
        try:
            partitions = self.store.partitions_of(topic)
        except errors.MetaqError:
            return
        for p in range(partitions) if name is None else (partition_for(name, partitions),):
            key = (topic, p)
            if key not in self.session.cursors:
                self.session.cursors[key] = (self.store.min_offset(topic, p) if at_start
                                             else self.store.max_offset(topic, p))

    def _rescan(self):
        """Topics that appeared since (or became readable) join the wildcard filters, within their bound; a filter
        without wildcards whose name's partition has no read position (partitions were added since it subscribed)
        reads it from its start."""
        self._rescanned = time.monotonic()
        for sub in list(self.session.subscriptions.values()):
            name = _one_name(sub.topic_filter)
            if name is not None:  # its name's partition moves when the topic's count changes
                for topic in sub.topics:
                    self._start_at_end(topic, at_start=True, name=name)
        wild = self.session.wildcards()
        if not wild:
            return
        readable = self._readable()
        for sub in wild:
            for topic in readable:
                if topic in sub.topics:
                    continue
                if len(sub.topics) >= self.settings.max_wildcard_topics:
                    if not self._overflow_logged:
                        self._overflow_logged = True
                        log.warning("mqtt %s: filter %s reads %d topics (mqtt.max_wildcard_topics): topic %s and "
                                    "others created since are not read", self.conn.peer, sub.topic_filter,
                                    len(sub.topics), topic)
                    break
                sub.topics.add(topic)
                self._start_at_end(topic, at_start=topic not in (self._seen or ()))  # new: all of it is new
        if self._seen is None:
            self._seen = set()
        self._seen.update(readable)

    # -- delivering ------------------------------------------------------------

    @property
    def event(self):
        """What its greenlet waits on between passes (the connection's ``room``): set by ``wake`` and by appends to
        the partitions it reads."""
        return self.conn.room

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
        """The connection ended: its greenlet is ended and the fan-out readers let it go."""
        g, self._greenlet = self._greenlet, None
        if g is not None and g is not _STARTING:
            g.kill(block=False)
        self._leave_fanouts()

    def _leave_fanouts(self):
        """Take every partition back from the fan-out readers (its cursors are where they left them)."""
        handed, self._handed = self._handed, None
        for f in (handed or {}).values():
            f.members.discard(self)

    def left(self, key):
        """A fan-out reader let partition ``key`` go: this delivery reads it alone from its cursor."""
        if self._handed is not None:
            self._handed.pop(key, None)
        self.wake()

    def run(self):  # noqa: C901 - to split with the delivery by operation group
        conn = self.conn
        room = conn.room
        me = gevent.getcurrent()
        try:
            self._turn = time.monotonic()
            if not self._resent:
                self._resent = True
                self.resend()
            if self.session.carried and not self._send_carried():
                return
            while not conn.closed:
                if conn.unsent and not conn.flush_unsent():  # what a fan-out reader began goes first
                    return
                if self._retained:
                    self._send_retained()
                if time.monotonic() - self._rescanned >= limits.MQTT_TOPIC_RESCAN_S:
                    self._rescan()
                seen = self._ends()  # before the pass: an append after its read of a partition woke nobody
                room.clear()  # before the pass: an acknowledgement during it is kept when the pass needed one
                self._window_full = False
                if self._pass() and (self.session.shared or self._behind()):
                    continue  # more to read (an append came while it sent)
                if not self._window_full:
                    room.clear()  # a wake during the pass that changes nothing for it (the others: _unread, below)
                if conn.closed or self.waiters.closed:
                    return
                if self._retained or conn.unsent:
                    continue
                self._hand_over()
                handed = self._handed or ()
                keys = [k for k in self.session.cursors if k not in handed]
                for group, _granted, _id in self.session.shared.values():
                    keys.extend(group.cursors)
                if not keys and self._idle():
                    return  # every partition is a fan-out reader's: no greenlet until woken
                waiting = self.port.waiting
                for key in keys:  # a publisher's burst may send to it from its own turn meanwhile (deliver_now)
                    ds = waiting.get(key)
                    if ds is None:
                        waiting[key] = {self: None}
                    else:
                        ds[self] = None
                try:
                    self.waiters.wait_any(keys, limits.MQTT_TOPIC_RESCAN_S, room, self._unread(seen),
                                          self.store.max_offset)
                finally:
                    for key in keys:
                        ds = waiting.get(key)
                        if ds is not None:
                            ds.pop(self, None)
                            if not ds:
                                del waiting[key]
                self._turn = time.monotonic()
        finally:
            if self._greenlet is me:
                self._greenlet = None

    def _ends(self):
        """``{key: visible end}`` of the partitions the next pass reads (its own and its shared groups')."""
        end, visible_end = self.store.max_offset, self.waiters.visible_end
        handed = self._handed or ()
        ends = {key: visible_end(end, key) for key in self.session.cursors if key not in handed}
        for group, _granted, _id in self.session.shared.values():
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
        end, visible_end = self.store.max_offset, self.waiters.visible_end
        handed = self._handed or ()
        unread = {}
        for key, at in self.session.cursors.items():
            if key not in handed and at < visible_end(end, key):
                unread[key] = seen.get(key, at)
        for group, _granted, _id in self.session.shared.values():
            for key, at in group.cursors.items():
                if at < visible_end(end, key):
                    unread[key] = seen.get(key, at)
        return unread

    def deliver_now(self, key, staged=None):  # noqa: C901 - to split with the delivery by operation group
        """Called by a publisher's turn (``MqttPort.deliver_now``) while this delivery's greenlet waits (in ``run``,
        between passes): send what partition ``key`` holds past its cursor, each record as ``_deliver`` decides it
        (``_decision``, ``_prepare``: filters, No Local, Retain As Published, Subscription Identifiers, Message Expiry,
        the Maximum Packet Size, the window in flight), but only while that needs no wait: the connection takes each
        PUBLISH whole at once (``try_send``; a part taken is finished by this delivery's greenlet, which the append
        woke, before anything else), a QoS 1 one has room in flight. It stops, leaving the rest to the greenlet, at
        anything else (a QoS 2 message: its greenlet's); and does nothing on a TLS connection or with retained
        messages or a resend to send first. ``staged``: the publisher's burst in this partition, ``[(queue offset,
        key in Decoded, MqttMessage)]``: from its first record on they are sent from it, nothing read from the log
        (a cursor behind it reads the log as the greenlet would). Order is the cursor's, as the greenlet's. True when
        it sent everything and left the cursor at the partition's end: its greenlet has nothing to do there (not so
        when a shared group of the session reads the partition too: the group's copy is the greenlet's)."""
        conn, session = self.conn, self.session
        if conn.closed or conn.tls or conn.unsent or self._retained or not self._resent \
                or self.guard.paced(conn.session, "fetch"):  # a paced user's bytes wait in its own greenlet
            return False
        cursors = session.cursors
        offset = cursors.get(key)
        topic, partition = key
        if offset is None or not self._may_read(topic):
            return False
        if staged and offset >= staged[0][0]:
            records = staged[offset - staged[0][0]:]  # a partition's offsets in one burst follow one another
        else:
            try:
                read, _next = self.store.read_records(topic, partition, offset, limits.MQTT_DELIVERY_BATCH,
                                                      self.max_transfer)
            except errors.MetaqError:
                return False  # the greenlet meets it and says why
            records = self._decoded(topic, read)
        for queue_offset, dkey, m in records:
            granted, ids, retain = self._decision(topic, m)
            if granted is not None:
                prepared = self._prepare(m, granted, retain, ids, dkey, False)
                if prepared is _HELD:
                    return False
                if prepared is not _DROPPED:
                    data, qos, packet_id, shared = prepared
                    aliases = conn.outbound_aliases
                    if aliases is not None:
                        mark = aliases.mark()
                        data = self._with_alias(aliases, data, m.topic, shared)
                    sent = conn.try_send(data)
                    if aliases is not None:
                        if not sent:
                            aliases.undo(mark)
                        aliases.settle()
                    if not sent:
                        return False
                    if qos:
                        session.sent(packet_id, (qos, topic, partition, queue_offset))
                    if sent < len(data):  # the connection writes the rest before anything else
                        cursors[key] = queue_offset + 1
                        session.dirty = True
                        return False
            cursors[key] = queue_offset + 1
            session.dirty = True
        if any(key in group.cursors for group, _granted, _id in session.shared.values()):
            return False
        try:
            return cursors[key] >= self.store.max_offset(topic, partition)
        except errors.MetaqError:
            return False

    def _decoded(self, topic, records):
        """``(queue offset, key in Decoded, MqttMessage)`` of each of ``records`` (of metaq topic ``topic``), each
        decoded as it is reached."""
        message = self.decoded.message
        for rec in records:
            dkey = (rec.position, rec.msg_id)
            yield rec.queue_offset, dkey, message(dkey, topic, rec.flag, rec.data)

    def _idle(self):
        """True when nothing but the fan-out readers has work for this delivery: no wildcard filter (it looks for new
        topics), no shared subscription, no retained message to send."""
        session = self.session
        return not session.shared and not self._retained and not session.wildcards()

    def _hand_over(self):
        """Hand every partition it is caught up on (its cursor at the log's end there), whose subscriptions are
        granted QoS 0, to the port's fan-out reader of it (a TLS connection keeps its own: only ``send_bytes``
        writes it)."""
        conn, session = self.conn, self.session
        if conn.tls or self.guard.paced(conn.session, "fetch"):  # a paced user reads alone, at its rate
            return
        max_offset = self.store.max_offset
        handed = self._handed
        for key, offset in session.cursors.items():
            if handed is not None and key in handed:
                continue
            if any(sub.qos and key[0] in sub.topics for sub in session.subscriptions.values()):
                continue
            try:
                if offset != max_offset(*key):
                    continue
            except errors.MetaqError:
                continue
            f = self.fanouts.join(key, self, offset)
            if f is not None:
                if handed is None:
                    handed = self._handed = {}
                handed[key] = f

    def fan_plan(self, key, batch):
        """What this delivery gets of a fan-out reader's records (``batch``, a ``_Batch``) of partition ``key``, each
        decided as its greenlet decides it (the permission, ``_decision``, ``_prepare``): ``(packets, offsets, end,
        stop, marks)``, the PUBLISHes to write in order, the queue offset of each, its cursor once they are written,
        True when it reads on alone from ``end`` then (a record needs QoS 1 or 2: its greenlet's), and with topic
        aliases the alias table's mark before each PUBLISH (None without); None when it reads on alone from its cursor
        now (closed, its permission gone). Members whose decisions, MQTT version and Maximum Packet Size are alike (no
        Subscription Identifier, no expiry, no topic aliases of their own) share one plan. Nothing here yields: the
        reader writes them before it does (``fan_wrote``, ``fan_try``), and what was not written has its topic alias
        decisions undone there."""
        conn, session = self.conn, self.session
        offset = session.cursors.get(key)
        if offset is None or conn.closed:
            return None
        topic = key[0]
        if not self._may_read(topic) or self.guard.paced(conn.session, "fetch"):
            return None  # its permission gone, or a rate set since it joined: it reads alone
        decisions = [self._decision(topic, m) for m in batch.kinds]
        alike = None
        aliases = conn.outbound_aliases  # its own topic aliases: its plan is its own, each PUBLISH's alias decided
        marks = None if aliases is None else []  # the table's mark before each PUBLISH's decision (fan_wrote)
        if aliases is None and offset <= batch.first and not batch.expiring and \
                not any(ids for _granted, ids, _retain in decisions):
            alike = (tuple((granted, retain) for granted, _ids, retain in decisions), conn.version,
                     conn.client_max_packet)
            plan = batch.plans.get(alike)
            if plan is not None:
                return plan
        packets, offsets = [], []
        end, stop = max(offset, batch.end), False
        for (queue_offset, dkey, m), kind in zip(batch.items, batch.kind_of):
            if queue_offset < offset:
                continue  # it sent this one itself before it joined
            granted, ids, retain = decisions[kind]
            if granted is None:
                continue
            if min(granted, m.qos):
                end, stop = queue_offset, True
                break
            prepared = self._prepare(m, granted, retain, ids, dkey, False)
            if prepared is not _DROPPED:
                data = prepared[0]
                if aliases is not None:
                    marks.append(aliases.mark())
                    data = self._with_alias(aliases, data, m.topic, prepared[3])
                packets.append(data)
                offsets.append(queue_offset)
        plan = (tuple(packets), tuple(offsets), end, stop, marks)
        if alike is not None:
            batch.plans[alike] = plan
        return plan

    def fan_wrote(self, key, plan, took=None):
        """``fan_plan``'s ``plan`` of partition ``key`` was written by descriptor (``Connection.fan_fd``, no yield
        since): ``took`` None when the socket took all of it, else the bytes it took (0 when full) or ``-errno``
        when the write failed (the connection closes). Its cursor moves past every record written, and past the one
        begun (the connection keeps the rest of its PUBLISH, written before anything else); True while it stays with
        the reader, False when it reads on alone from there."""
        packets, offsets, end, stop, marks = plan
        if took is not None:
            if took < 0:
                self.conn.send_failed(-took)
                took = 0
            for i, (data, queue_offset) in enumerate(zip(packets, offsets)):
                if took < len(data):
                    if took:
                        self.conn.keep_unsent(data[took:])
                        end = queue_offset + 1
                        i += 1  # begun: the rest is written before anything else
                    else:
                        end = queue_offset
                    self._unwritten(marks, i)
                    break
                took -= len(data)
            stop = True
        self._unwritten(marks, len(packets))
        self._cursor_to(key, end)
        return not stop

    def _unwritten(self, marks, i):
        """A plan's PUBLISHes from the ``i``-th on were not written: their topic alias decisions are undone (``marks``,
        ``fan_plan``'s; None: no topic aliases), the others' kept."""
        if marks is not None:
            aliases = self.conn.outbound_aliases
            if i < len(marks):
                aliases.undo(marks[i])
            aliases.settle()

    def fan_try(self, key, plan):
        """``fan_wrote``'s work for a connection that cannot be written by descriptor now (another writer holds it,
        part of a packet is left, it closed): each PUBLISH through ``try_send``, which never waits."""
        packets, offsets, end, stop, marks = plan
        conn = self.conn
        for i, (data, queue_offset) in enumerate(zip(packets, offsets)):
            sent = conn.try_send(data)
            if not sent or sent < len(data):  # a part taken: the connection writes the rest before anything else
                self._unwritten(marks, i + 1 if sent else i)
                self._cursor_to(key, queue_offset + 1 if sent else queue_offset)
                return False
        self._unwritten(marks, len(packets))
        self._cursor_to(key, end)
        return not stop

    def _cursor_to(self, key, offset):
        """The session's read position of partition ``key`` moves on to ``offset`` (never back; a partition it no
        longer reads is left alone)."""
        session = self.session
        if offset > session.cursors.get(key, offset):
            session.cursors[key] = offset
            session.dirty = True

    def _decision(self, topic, m):
        """How message ``m`` of metaq topic ``topic`` goes to this session: ``(granted QoS, Subscription
        Identifiers, RETAIN flag)`` of the subscriptions that match it (``MqttSession.matching``: filters, No Local;
        Retain As Published), the granted QoS None when none does."""
        session = self.session
        granted, ids = session.matching(topic, m.topic, m.client_id)
        if granted is None:
            return None, ids, False
        if topic in self.port.cluster_topics and not self._may_read_copy(m):
            return None, (), False
        return granted, ids, m.retain and session.retain_as_published(topic, m.topic)

    def _may_read(self, topic):
        """This session's user may read ``topic`` now (asked at every read: a reloaded permissions file applies at
        once). The MQTT cluster's inbox holds every peer's topics: each message of it is asked for its own
        (``_may_read_copy``, in ``_decision``)."""
        return topic in self.port.cluster_topics or self.guard.allows(self.conn.session, SUB, "topic", topic)

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

    def _prepare(self, m, granted, retain, ids, key, wait):
        """The PUBLISH of message ``m`` for this connection: ``(data, QoS, packet id, shared)`` at
        min(its QoS, ``granted``), RETAIN ``retain``, carrying the Subscription Identifiers ``ids`` (MQTT 5) and the
        Message Expiry Interval left, never a Topic Alias (``_with_alias`` adds it as it is written). ``_DROPPED``
        (not sent, as if delivered) when it expired (MQTT 5.0 §3.3.2.3.3) or is past the client's Maximum Packet Size
        ([MQTT-3.1.2-25]). A QoS 1 or 2 one takes a packet id once the window in flight (the connection's
        ``inflight_window``) has room: ``wait`` waits for it (``_HELD`` when the connection closes meanwhile); without
        ``wait`` it is ``_HELD`` at once, and so is QoS 2 (a persistent session writes it to the sessions' log first:
        the greenlet's). ``key``: the record's in ``Decoded`` (None for a retained message): its QoS 0 PUBLISH without
        identifiers or expiry is encoded once for every subscriber, and ``shared`` is then ``(key, retain)`` (else
        None), its aliased forms made once too (``Decoded.aliased``)."""
        conn = self.conn
        version = conn.version
        qos = min(granted, m.qos)
        if key is not None and not ids and m.expires_ms is None and not qos:
            data = self.decoded.packet(key, m, retain, version)
            if conn.client_max_packet is not None and len(data) > conn.client_max_packet:
                return _DROPPED
            return data, 0, None, (key, retain)
        props = m.properties
        if m.expires_ms is not None:
            left_ms = m.expires_ms - now_ms()
            if left_ms <= 0:
                return _DROPPED
            props = dict(props, message_expiry_interval=(left_ms + 999) // 1000)
        if ids:
            props = dict(props, subscription_identifier=tuple(ids))
        packet_id = None
        if qos:
            session = self.session
            most = conn.inflight_window
            if not wait and (qos == 2 or len(session.inflight) >= most):
                return _HELD
            while len(session.inflight) >= most:
                conn.room.clear()
                if conn.closed:
                    return _HELD
                conn.room.wait(1.0)
            packet_id = session.next_packet_id()
        data = wire.encode(wire.Publish(m.topic, m.payload, qos, retain, False, packet_id,
                                        props if version == wire.MQTT_5 else {}), version)
        if conn.client_max_packet is not None and len(data) > conn.client_max_packet:
            return _DROPPED
        return data, qos, packet_id, None

    def _with_alias(self, aliases, data, name, shared):
        """The PUBLISH ``data`` (``_prepare``'s, of topic ``name``; ``shared``: its one encoding's ``(key, retain)``
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
        """``_with_alias`` for a write that follows at once, under the write lock (``Connection.send_made``)."""
        out = self._with_alias(aliases, data, name, shared)
        aliases.settle()
        return out

    def _behind(self):
        """True when a partition this session reads (not a fan-out reader's) has messages past its cursor: asked,
        without yielding, after a pass that read something, instead of a second pass that would read nothing (an
        append while the pass sent has already moved the visible end, so its wake is not missed)."""
        max_offset = self.store.max_offset
        handed = self._handed or ()
        for key, offset in self.session.cursors.items():
            if key not in handed and offset < max_offset(*key):
                return True
        return False

    def _pass(self):
        """Read every partition once from its cursor and send what matches; True when something was read. A pass
        begins once its user's fetch rate lets it (``_paced_wait``)."""
        self._paced_wait()
        read_any = False
        conn = self.conn
        handed = self._handed or ()
        for key in [k for k in self.session.cursors if k not in handed]:
            self._turn = share_loop(self._turn)  # a backlog (of records no filter wants, too) lets the others run
            if conn.closed:
                return False
            if self._resume_at is not None:
                return True  # over its user's fetch rate: the next pass goes on once it may
            topic = key[0]
            if not self._may_read(topic):
                continue  # a reloaded permissions file took it away: nothing more of it is read
            if not conn.replies.reserve(self.max_transfer, lambda: conn.closed):
                return False
            try:
                read_any = self._read(key) or read_any
            finally:
                conn.replies.release(self.max_transfer)
        for group, granted, sub_id in list(self.session.shared.values()):
            for key in list(group.cursors):
                self._turn = share_loop(self._turn)
                if conn.closed:
                    return False
                if self._resume_at is not None:
                    return True
                if not self.guard.allows(conn.session, SUB, "topic", key[0]):
                    continue
                if not conn.replies.reserve(self.max_transfer, lambda: conn.closed):
                    return False
                try:
                    read_any = self._read_shared(group, granted, key, sub_id) or read_any
                finally:
                    conn.replies.release(self.max_transfer)
        return read_any

    def _read_shared(self, group, granted, key, sub_id=None):
        """Read a shared group's partition from the group's cursor: each record is claimed (the cursor moved past it)
        before it is sent, so another member's delivery never sends it too."""
        topic, partition = key
        offset = group.cursors.get(key)
        if offset is None:
            return False
        try:
            records, _next = self.store.read_records(topic, partition, offset, limits.MQTT_DELIVERY_BATCH,
                                                     self.max_transfer)
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
            if not self._send(topic, (partition, rec.queue_offset), rec.flag, rec.data, granted, False, m,
                              () if sub_id is None else (sub_id,)):
                return False
            if self._resume_at is not None:
                return True  # over its user's fetch rate: the next pass goes on from here once it may
        return bool(records)

    def _has_room(self, conn):
        """True when ``conn`` (a member of a shared group) may have one more QoS 1 or 2 message in flight now."""
        return not conn.closed and len(conn.mqtt.inflight) < conn.inflight_window

    def _read(self, key):
        topic, partition = key
        cursors = self.session.cursors
        offset = cursors.get(key)
        if offset is None:
            return False
        try:
            records, _next = self.store.read_records(topic, partition, offset, limits.MQTT_DELIVERY_BATCH,
                                                     self.max_transfer)
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
        for rec in records:
            if not self._deliver(topic, partition, rec):
                return False
            if key in cursors:
                cursors[key] = rec.queue_offset + 1
                self.session.dirty = True
            if self._resume_at is not None:
                return True  # over its user's fetch rate: the next pass goes on from here once it may
        return bool(records)

    def _deliver(self, topic, partition, rec):
        """Send one record when a subscription matches it; False when the connection closed meanwhile."""
        key = (rec.position, rec.msg_id)
        m = self.decoded.message(key, topic, rec.flag, rec.data)
        granted, ids, retain = self._decision(topic, m)
        if granted is None:
            return True
        return self._send(topic, (partition, rec.queue_offset), rec.flag, rec.data, granted, retain, m, ids, key,
                          True)

    def _send(self, topic, where, flag, data, granted, retain, m=None, ids=(), key=None, own=False):
        """Send the message of a record (``where``: its ``(partition, offset)``, None for a retained message) as
        ``_prepare`` makes it (``key``: the record's in ``Decoded``), waiting for room in flight. ``own``: the record
        is read at the session's own read position (not a shared group's), which a QoS 1 or 2 message in flight is
        past: a session saved from then on sends it again as itself (DUP), never as a new message too. A QoS 2
        delivery of a persistent session is written to the sessions' log before it is sent (exactly once across a
        restart, a kill or a failover needs its packet id and that position kept: ``_saved_first``). False when the
        connection closed meanwhile."""
        conn, session = self.conn, self.session
        if m is None:
            m = message_of(topic, flag, data, self.port.topics)
        prepared = self._prepare(m, granted, retain, ids, key, True)
        if prepared is _DROPPED:
            return True
        if prepared is _HELD:
            return False
        data, qos, packet_id, shared = prepared
        if qos:
            session.sent(packet_id, (qos, topic) + where if where is not None else None)
            if own:
                self._cursor_to((topic, where[0]), where[1] + 1)
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
            self._resume_at = time.monotonic() + delay
        return True

    def _paced_wait(self):
        """Wait, in this delivery's own greenlet, until its user's fetch rate lets it send again (``Guard.pace``
        said how long after its last PUBLISH): other sessions and the loop go on meanwhile, and nothing more is read
        from the log for it, so what waits for it stays bounded as ever (its window in flight, its reply budget)."""
        resume_at, self._resume_at = self._resume_at, None
        if resume_at is not None:
            left = resume_at - time.monotonic()
            if left > 0:
                gevent.sleep(left)
            self._turn = time.monotonic()

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

    def retained_after_suback(self, subscribed):
        """The retained messages of the filters in ``subscribed`` (``(filter, granted QoS)``) are to be sent, by
        this delivery's greenlet (a QoS 1 or 2 one may wait for room in flight), after the SUBACK."""
        self._retained.extend(subscribed)
        self._leave_fanouts()  # its retained messages go before what comes next: this greenlet sends both
        self.wake()

    def _send_retained(self):
        """Send each retained message a new subscription matches, RETAIN set ([MQTT-3.3.1-8]), at min(its QoS,
        granted), of the metaq topics the filter reads and its user may read now."""
        pending, self._retained = self._retained, []
        security = self.conn.session
        for topic_filter, granted in pending:
            sub = self.session.subscriptions.get(topic_filter)
            if sub is None:
                continue
            for r in self.port.retained_for(topic_filter, sub.topics):
                if not self.guard.allows(security, SUB, "topic", r.metaq_topic):
                    continue
                if not self._send(r.metaq_topic, None, r.flag, r.data, granted, True, None,
                                  () if sub.sub_id is None else (sub.sub_id,)):
                    return

    def resend(self):
        """A resumed session's messages in flight go out again (MQTT 5.0 §4.4): a PUBLISH not acknowledged is sent
        again with DUP set, from the log; one whose PUBREC came gets its PUBREL again."""
        conn, session = self.conn, self.session
        v5 = conn.version == wire.MQTT_5
        for pid, state in list(session.inflight.items()):
            if state == PUBREL_SENT:
                conn.send(wire.PubRel(pid))
                continue
            where = session.where.get(pid)
            found = self._message_at(where) if where is not None else None
            if found is None:
                session.dropped(pid)  # its message is gone from the log (retention): nothing to send again
                continue
            qos, (topic, flag, data) = where[0], found
            m = message_of(topic, flag, data, self.port.topics)
            props = m.properties
            ids = session.matching(topic, m.topic, m.client_id)[1]
            if ids:
                props = dict(props, subscription_identifier=tuple(ids))
            conn.send_bytes(wire.encode(wire.Publish(m.topic, m.payload, qos, False, True, pid,
                                                     props if v5 else {}), conn.version))

    def _message_at(self, where):
        """``(metaq topic, flag, data)`` of the message a ``where`` names, or None when the log holds it no more: a
        record of its topic, or one a session carried from another broker (a ``%MQTT%`` record, ``follow``'s
        ``encode_carried``), which is the message of the topic it names."""
        _qos, topic, partition, offset = where
        try:
            records, _next = self.store.read_records(topic, partition, offset, 1, self.max_transfer)
        except errors.MetaqError:
            return None
        if not records or records[0].queue_offset != offset:
            return None
        rec = records[0]
        if topic != MQTT_SESSIONS_TOPIC:
            return topic, rec.flag, rec.data
        try:
            return decode_carried(rec.data)
        except RecordError:
            return None

    def _send_carried(self):
        """Send the messages the session brought from another broker (``MqttSession.carried``), in order, after
        those in flight and before what its subscriptions read: each at its QoS then, a QoS 1 or 2 one in flight
        under its place in ``%MQTT%`` (so it is sent again from there). False when the connection closed."""
        session = self.session
        while session.carried:
            qos, offset = session.carried[0]
            found = self._message_at((qos, MQTT_SESSIONS_TOPIC, 0, offset))
            if found is None:
                session.carried.pop(0)  # gone from the log (retention), as a queued message would be
                session.dirty = True
                continue
            topic, flag, data = found
            sent = self._send(MQTT_SESSIONS_TOPIC, (0, offset), flag, data, qos, False, message_of(topic, flag, data))
            if sent or any(w[1:] == (MQTT_SESSIONS_TOPIC, 0, offset) for w in session.where.values()):
                session.carried.pop(0)  # sent, or in flight now: never both carried and in flight
                session.dirty = True
            if not sent:
                return False
        return True
