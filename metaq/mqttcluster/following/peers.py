"""The MQTT cluster of one broker: its peers (the other masters under the ZooKeeper root), one link to each, the
inbox it copies into, and the peers' retained messages (docs/architecture.md "MQTT across the cluster").

**Membership.** The members (``members.Members``, the cluster's one reader of them in ZooKeeper) wake one greenlet
when they change, which also looks every MEMBERS_S (a promotion or a demotion of this broker); a master keeps one
link per other member (at most MQTT_CLUSTER_MAX_PEERS, the lowest broker ids), a slave none (it copies its
master's inbox). Nothing is written to ZooKeeper for a device or a subscription.

**Copies.** Each MESSAGE entry a link brings is appended to the inbox (``inbox.py``: an MQTT record keeps its bytes,
its origin added to its properties), unless the resume positions say it was copied already, a run of them in one
append of the put path's burst writer (as a batch of puts); positions move with each copy written (and, in memory,
with the POSITION entries). A refused append (a full disk, a slave now) ends the link: it resumes from the
positions, nothing lost.

**Shared groups.** The route carries this broker's ``$share`` groups with members (``sharing.offer.GroupOffer``: its
changes applied here as a new route); the broker a message is published on decides which broker's group takes it
(``sharing.share``): its own group reads only what is assigned here
(``MqttPort.group_takes``), a peer's link sends a SHARED entry for what is assigned there, copied with the groups
marked (only they take the copy).

**The start hold.** A peer follows this broker from where its resume positions say, and a partition it holds no
position in from this broker's end when its route comes, unless this process saw the peer follow it before
(``serve.PeerServer.since``: a cut link, a restart of the peer): after this broker's own start, what it wrote there
before the peer's follow came back (the first message of a topic new here since the peer last followed) would reach
none of the peer's subscribers. So a master that begins keeping sessions (its start, a promotion: ``hold``) lets no MQTT
traffic in until each of its peers follows it again (``followed``: the peer server, once a peer's route came):
CONNACKs and wills wait (``wait_followed``), at most MQTT_CLUSTER_START_HOLD_S from the hold's start
(``mqtt.cluster_start_hold_s``); past it the broker goes on without the peers still away, logged.

**The takeover's end.** A session taken over from another broker (``service.ClientIds``) has its filters added to
the route at once, and the CONNECT waits until every peer whose link is up acted on that route (``routed``: each
acks a route's version with ROUTED): from the positions held then (``positions_for``) every copy is by a route that
holds the session's filters. A session given up keeps its filters in the route (``pin``) until the broker taking it
asked for what reached this broker for it since (or MQTT_HANDOVER_LINGER_S): the two sides meet at those positions.

**Retained messages.** Each link follows the peer's ``%MQTT%`` journal's ``R``/``U`` records from its start, kept
in ``retained.PeerRetained`` (its module doc: the bound, the newest by (time, broker id) against the local table).
"""

import itertools
import logging
import time
import zlib

import gevent
from gevent.event import Event


from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.following import inbox, copyturn
from metaq.mqttcluster.following.link import PeerLink
from metaq.mqttcluster.following.retained import PeerRetained
from metaq.mqttcluster.following.routes import aggregate
from metaq.mqttcluster.sharing.offer import GroupOffer
from metaq.mqttcluster.sharing.share import Shares
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.protocol.replication_mqtt import (EPOCH, MESSAGE, NO_EPOCH, POSITION, RESUMED, RETAINED, ROUTED, SHARED,
                                             RecordEntries, epoch_of, record_check, split_shared)
from metaq.clock import now_ms
from metaq.serving.connections import share_loop
from metaq.serving.putpath import AUTHORIZED
from metaq.store.record import FIXED_OVERHEAD

log = logging.getLogger(__name__)

#: How often the links are looked at again without the members changing (this broker's own role may have).
MEMBERS_S = 2.0
#: How often the route is computed again without a subscription waking it (unsubscriptions, expired sessions).
ROUTE_REFRESH_S = 5.0
#: A copy's record in the log past its data: the record's fixed part and the inbox's name (``store.record``).
_OVERHEAD = FIXED_OVERHEAD + len(inbox.INBOX)


def unfollowed(peers, followers):
    """The peers of ``peers`` (``MqttCluster.peers_of``: broker ids, or None while the members are not known) that do
    not follow this broker now (``followers``: broker ids): a sorted list, None when the members are not known."""
    if peers is None:
        return None
    return sorted(b for b in peers if b not in followers)


def _served(run, frames, i, count, offset, msg_id, position):
    """``[(queue offset, key in Decoded, metaq topic, flag, data, message or None)]`` of the copies
    ``run[i:i + count]`` (``_write``'s run and burst frames, a frame's sixth field the copy's length), written one
    after the other from log
    ``position``, the first at ``offset`` with message id ``msg_id``: the form ``MqttPort.serve_copies`` takes, each
    copy's bytes as ``inbox.read_as`` reads them (an MQTT record kept as it is: its origin's, not joined, its message
    made from the attribute its copy read: not decoded again)."""
    out = []
    for k in range(count):
        e, made, _check, _epoch, data = run[i + k]
        out.append((offset + k, (position, msg_id + k)) + inbox.read_as(e.topic, e.flag, data, made))
        position += _OVERHEAD + frames[i + k][5]
    return out


class MqttCluster:
    """See the module doc. ``broker_id``: this broker's; ``port``: the broker's MqttPort; ``members``: the cluster's
    ``members.Members``; ``is_master()``; ``membership``: ``"on"``, or why the other masters cannot follow this one
    (``registration.mqtt_membership``); ``secret`` and ``tls``: the replication secret (bytes or None) and the
    client TLS context its links prove and dial with; ``hold_s``: the start hold's bound
    (``mqtt.cluster_start_hold_s``; None: MQTT_CLUSTER_START_HOLD_S); ``serve``: what the MQTT port serves the copies
    with from the turn that writes them (``MqttPort.serve_copies``, given through the seam; None: their readers are
    woken only)."""

    def __init__(self, broker_id, store, put_path, port, members, is_master, membership="on", secret=None, tls=None,
                 hold_s=None, serve=None):
        self.broker_id = broker_id
        self.store = store
        self.put_path = put_path
        self.port = port
        self.serve = serve
        self.members = members
        self.is_master = is_master
        self.secret = secret
        self.tls = tls
        self.positions = inbox.Positions()
        #: who takes what of each $share group (peers' ROUTES, ours), by the history the sessions' log holds
        self.shares = Shares(self.broker_id, lambda: store.written_position, lambda: store.log_start,
                             lambda: port.share_histories(),
                             lambda key, changes: port.record_share_history(key, changes),
                             pause=lambda turn: share_loop(time.monotonic() if turn is None else turn))
        #: this broker's groups with members and their weights, as its route carries them (``sharing.offer``)
        self.offer = GroupOffer(self.shares, self._groups_applied)
        self.links = {}  # broker id -> PeerLink
        self._links_lost = 0  # ends of the links to peers no longer followed (``PeerLink.lost``)
        #: the peers' retained messages as this broker knows them (``retained.PeerRetained``)
        self.retained = PeerRetained(broker_id, lambda topic, name: port.topics.holds(topic, name),
                                     lambda name: port.table.retained.get(name))
        self.retained_next = {}  # broker id -> (next offset of its %MQTT% journal read, the check and the epoch of
        # the record before it, its epoch path: ``inbox.entered``) (this process's)
        self.route_changed = Event()
        self._acked = Event()  # replaced at each ROUTED a link gets (``acked``), as ``route_changed`` is
        self._pinned = {}  # key -> filters the route keeps whatever the sessions hold (``pin``)
        self._inbox_end = {}  # inbox partition -> the offset after the last copy appended there (``inbox_marks``)
        self._route = (0, ())
        self._route_set = frozenset()
        self._members_wake = Event()
        self._tasks = []
        self._stopping = False
        self._recovered_as_master = False
        self.hold_s = mqttcluster_limits.MQTT_CLUSTER_START_HOLD_S if hold_s is None else hold_s
        self._followers = {}  # broker id -> how many of its follows of this broker are live now
        self._followed = Event()  # set: no hold (``wait_followed`` returns at once); a master holds from its start
        self._hold_wake = Event()
        self._holding = None  # the greenlet that ends the hold (``_hold``)
        self.copied = 0
        self.taken_whole = 0  # frames ``_take`` copied in one step
        self.recovered = 0
        self.peers_refused = 0
        self.membership = membership

    # -- lifecycle -----------------------------------------------------------------

    def start(self):
        if self.membership != "on":
            log.warning("mqtt cluster: %s: the other masters under this ZooKeeper root cannot follow this broker, so "
                        "what its MQTT clients publish reaches only its own subscribers (and, as a master, it is an "
                        "MQTT island). Set replication.port on every master to make them one MQTT service "
                        "(docs/mqtt.md, \"A cluster\")", self.membership)
        self._recover()
        if self.is_master():
            self.hold()
        else:
            self._followed.set()  # a slave publishes nothing of its own (a promotion holds: ``MqttPort``)
        self.refresh_route()
        self.groups_changed(self.port.group_weights())  # the groups kept here before any member is back
        self.members.on_change(self._members_changed)
        self._tasks = [gevent.spawn(self._members), gevent.spawn(self._routes)]

    def _recover(self):
        """The resume positions from the inbox as this master holds it (at start, and again once a slave that
        copied its master's inbox is promoted: what it copied since its start counts)."""
        positions = inbox.Positions()
        self.recovered = gevent.get_hub().threadpool.apply(inbox.recover, (self.store, positions))
        self.positions = positions
        self._recovered_as_master = self.is_master()
        log.info("mqtt cluster: %d resume positions recovered from %d inbox records", len(positions), self.recovered)

    def stop(self):
        self._stopping = True
        self._members_wake.set()
        self._followed.set()
        for link in list(self.links.values()):
            link.stop()
        self.links.clear()
        for t in self._tasks:
            t.kill(block=False)
        self.offer.stop()

    # -- the route -----------------------------------------------------------------

    def route(self):
        """``(version, filters)`` of this broker's route now."""
        return self._route

    def routes_changed(self, topic_filter=None):
        """A subscription of ``topic_filter`` was made (``MqttPort.routes_changed``): the route gains it at once
        when it does not hold it (O(1) for a filter it holds or covers: a reconnect storm re-subscribing costs no
        walk of the sessions); None: compute the whole route again (every ROUTE_REFRESH_S, which also drops the
        filters no session holds any more). The links waiting on ``route_changed`` (an Event replaced at each change,
        so a wait never finds an old one set) wake."""
        if topic_filter is None:
            changed = self.refresh_route()
        else:
            changed = self._add_filter(topic_filter)
        if changed:
            event, self.route_changed = self.route_changed, Event()
            event.set()

    def groups(self):
        """This broker's ``$share`` groups with members ((share name, filter), ...), as its route carries them."""
        return self.offer.groups

    def weights(self):
        """The weight of each of ``groups()`` here (its members, at most MQTT_CLUSTER_SHARE_WEIGHT_MAX), in order."""
        return self.offer.weights

    def groups_changed(self, live):
        """This broker's groups with members are ``live`` now ({group: members here}): its offer of them changes
        (``offer.GroupOffer.changed``: at once, or once settled), then the route (``_groups_applied``)."""
        self.offer.changed(live)

    def _groups_applied(self):
        """The offer's groups or weights changed: a new route version, the links send ROUTES again."""
        self._set_route(self._route[0] + 1, self._route[1])
        event, self.route_changed = self.route_changed, Event()
        event.set()

    def _add_filter(self, topic_filter):
        version, filters = self._route
        first = topic_filter.split("/", 1)[0]
        if topic_filter in self._route_set or "#" in self._route_set or (first + "/#") in self._route_set:
            return False
        self._set_route(version + 1, aggregate(filters + (topic_filter,)))
        return True

    def _set_route(self, version, filters):
        self._route = (version, filters)
        self._route_set = frozenset(filters)

    def refresh_route(self):
        filters = aggregate(itertools.chain(self.port.subscribed_filters(), *self._pinned.values()))
        if filters == self._route[1]:
            return False
        self._set_route(self._route[0] + 1, filters)
        return True

    # -- the takeover's end --------------------------------------------------------

    def pin(self, key, filters):
        """Keep ``filters`` in the route while ``key`` is pinned, whatever the sessions hold (a session given up, or
        being taken, whose record does not hold them now); added now when the route lacks them. The caller bounds
        the pins (``service.ClientIds``: MQTT_HANDOVER_MAX_LINGERING)."""
        self._pinned[key] = tuple(filters)
        for f in filters:
            self.routes_changed(f)

    def unpin(self, key):
        """``pin``'s filters go from the route at its next refresh unless a session holds them."""
        self._pinned.pop(key, None)

    def pinned(self):
        return len(self._pinned)

    def acked(self):
        """A link got a ROUTED (``PeerLink.acked`` moved): the waits of ``routed`` look again."""
        event, self._acked = self._acked, Event()
        event.set()

    def routed(self, filters, deadline):
        """Add ``filters`` to the route and wait, until ``deadline`` (monotonic) at most, for every peer whose link is
        up to act on a route that holds them (its ROUTED of this version or a later one; ``PeerLink.owes_ack``: not a
        peer of the version before the acks). True when every member's link is up and acked it: then,
        until this greenlet yields, every copy from the positions held now on (``positions_for``) is by such a route.
        False when one did not in time, or its link is down or its peer acks no route (the version before the acks):
        its positions may be short of what the old holder counts, the takeover's end is short."""
        for f in filters:
            self.routes_changed(f)
        version = self._route[0]
        while True:
            event = self._acked
            if not any(link.owes_ack(version) for link in self.links.values()):
                return all(link.connected and link.acked >= version for link in self.links.values())
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            event.wait(left)

    def inbox_marks(self):
        """``{inbox partition: offset}``: where the copies appended so far end (the positions count them)."""
        return dict(self._inbox_end)

    def inbox_visible(self, marks):
        """True when the inbox's readers see every copy up to ``marks`` (``inbox_marks``'s): with ``sync`` flush a
        copy appended is read only once flushed, while the positions count it at once."""
        return all(self.store.max_offset(inbox.INBOX, p) >= end for p, end in marks.items())

    def topics_read(self, filters=None):
        """``(topics, every)``: the metaq topics ``filters`` read (``TopicMap.topics_for``; None: this broker's
        route's), ``every`` true when one of them reads every topic."""
        topics, every = set(), False
        for f in self._route[1] if filters is None else filters:
            read, all_topics = self.port.topics.topics_for(f)
            topics.update(read)
            every = every or all_topics
        return topics, every

    def positions_for(self, filters):
        """``{origin: {(topic, partition): next offset}}`` of this broker's copies of the peers' partitions that
        ``filters`` read (``topics_read``): where its copies for them are now."""
        topics, every = self.topics_read(filters)
        out = {}
        for origin in self.links:
            out[origin] = {(t, p): o for t, p, o in self.positions.of(origin) if every or t in topics}
        return out

    def _routes(self):
        while not self._stopping:
            gevent.sleep(ROUTE_REFRESH_S)
            self.routes_changed()
            self.groups_changed(self.port.group_weights())  # the groups kept here as the sessions' log says now
            if self.is_master() and self._followed.is_set():  # the view whole: every peer follows (or the hold's bound)
                turn = time.monotonic()
                for _group in self.shares.refresh():  # a change its log could not take when it came
                    turn = share_loop(turn)

    # -- membership ----------------------------------------------------------------

    def _members_changed(self):
        self._members_wake.set()  # a listener of the members: record and wake, nothing else
        self._hold_wake.set()

    def _members(self):
        while not self._stopping:
            self._members_wake.clear()
            master = self.is_master()
            if master and not self._recovered_as_master:
                self._set_links({})
                self._recover()
            elif not master:
                self._recovered_as_master = False
            if not self.is_master():
                self._set_links({})
            else:
                peers = self.peers_of(self.members.current)
                if peers is not None:  # None: ZooKeeper cannot be read now, links kept as they are
                    self._set_links(peers)
            self._members_wake.wait(MEMBERS_S)

    def peers_of(self, members):
        """``{broker id: replication address}`` this master follows of ``members`` (``Members.current``): every other
        member, at most MQTT_CLUSTER_MAX_PEERS of them (the lowest ids; the others counted in stats). None: None."""
        if members is None:
            return None
        peers = {bid: address for bid, (address, _owner) in sorted(members.items()) if bid != self.broker_id}
        if len(peers) > mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS:
            kept = sorted(peers)[:mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS]
            self.peers_refused = len(peers) - len(kept)
            log.warning("mqtt cluster: %d peers, past MQTT_CLUSTER_MAX_PEERS (%d): brokers %s are not followed",
                        len(peers), mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS, sorted(set(peers) - set(kept)))
            peers = {b: peers[b] for b in kept}
        else:
            self.peers_refused = 0
        return peers

    def _set_links(self, peers):
        for bid in list(self.links):
            link = self.links[bid]
            if peers.get(bid) != link.address:
                link.stop()
                self._links_lost += link.lost  # (a stopped link counts no more: ``PeerLink._run``)
                del self.links[bid]
        for bid, address in peers.items():
            if bid not in self.links:
                link = self.links[bid] = PeerLink(self, bid, address)
                link.start()

    # -- the start hold ------------------------------------------------------------

    def hold(self):
        """This master begins keeping sessions (its start, a promotion, the end of a fencing: ``MqttPort``): MQTT
        traffic waits (``wait_followed``) until each peer follows it, at most ``hold_s`` from now (0: no hold). A hold
        already running goes on."""
        if self.hold_s <= 0 or self.membership != "on":  # no peer can follow this broker: nothing to wait for
            self._followed.set()
            return
        if self._holding is not None and not self._holding.dead:
            return
        self._followed.clear()
        self._holding = gevent.spawn(self._hold, time.monotonic() + self.hold_s)

    def followed(self, broker_id, live):
        """Peer ``broker_id``'s follow of this broker began, its route in (``live``), or ended (the peer server's)."""
        count = self._followers.get(broker_id, 0) + (1 if live else -1)
        if count > 0:
            self._followers[broker_id] = count
        else:
            self._followers.pop(broker_id, None)
        self._hold_wake.set()

    def follows_here(self, broker_id):
        """True while a follow of this broker by peer ``broker_id`` is live (``followed``): a member ZooKeeper
        dropped whose follow stays open is still served (``asks.Asks.linked``: cut off from ZooKeeper only)."""
        return broker_id in self._followers

    def wait_followed(self):
        """Return once no hold runs: before a CONNACK and a will (``MqttPort``), so that what this broker's clients
        publish reaches every peer's subscribers. At most ``hold_s``."""
        self._followed.wait(self.hold_s)

    def _hold(self, deadline):
        missing = None
        while not self._stopping:
            self._hold_wake.clear()
            missing = unfollowed(self.peers_of(self.members.current), self._followers)
            left = deadline - time.monotonic()
            if missing == [] or left <= 0:
                break
            self._hold_wake.wait(left)
        if missing == []:
            peers = sorted(self.peers_of(self.members.current) or ())
            if peers:
                log.info("mqtt cluster: every peer (brokers %s) follows this broker: MQTT traffic goes on", peers)
            else:
                log.info("mqtt cluster: no other master with a replication port under this ZooKeeper root: nothing "
                         "to wait for, MQTT traffic goes on")
        elif not self._stopping:
            log.warning("mqtt cluster: %s %.1f s after this broker began keeping sessions "
                        "(mqtt.cluster_start_hold_s): MQTT traffic goes on; what is published here on a topic new "
                        "since a peer last followed it reaches the peer's subscribers only from its follow on",
                        "the members unknown (ZooKeeper not read)" if missing is None
                        else "peer brokers %s do not follow this broker" % missing, self.hold_s)
        self._followed.set()

    # -- copies --------------------------------------------------------------------

    def retained_from(self, origin):
        """``(offset, check, epoch, path)``: the ``%MQTT%`` offset of ``origin``'s journal a new link asks retained
        records from, and the ``record_check``, the epoch and the epoch path (``inbox.entered``) of the retained record
        before it as copied here (0, NO_EPOCH, (): none), which ``origin`` proves
        (``PeerFollow.proved``: after async failovers there, one or more in a row, the retained records its new
        masters wrote at offsets this broker saw other records at are sent too)."""
        return self.retained_next.get(origin, (0, 0, NO_EPOCH, ()))

    def apply(self, origin, entries, routed=None):
        """Copy a RECORDS frame's entries from peer ``origin``; returns how many messages were copied. Raises the put
        path's refusal, or a malformed entry's ``RemoteProtocolError`` (the link ends and resumes from the
        positions). A received frame (``RecordEntries``) of at most MQTT_CLUSTER_DIRECT_COPIES plain copies, the
        common case, is taken in one step (``_take``); any other goes entry by entry (``_copy``)."""
        taken = self._take(origin, entries) if type(entries) is RecordEntries else None
        if taken is None:
            return self._copy(origin, entries, routed)
        copied, whole = taken
        return copied if whole else copied + self._copy(origin, entries, routed)

    def _take(self, origin, entries):
        """``copyturn.take`` of a frame of at most MQTT_CLUSTER_DIRECT_COPIES entries (its turn does not share the
        loop, as the direct serve of as many does not): ``(copied, whole)``, the copies made visible and served
        (``_written``); None when the frame is the general path's, nothing done. Not whole: the burst writer stopped,
        the rest is the general path's (which passes over the copies taken: the positions hold them)."""
        most = mqttcluster_limits.MQTT_CLUSTER_DIRECT_COPIES
        if len(entries) > most:
            return None
        now = now_ms()
        taken = copyturn.take(origin, entries.payload, now, self.positions, self.put_path, self.port.topics,
                             most if self.serve is not None else -1)
        if taken is None:
            return None
        copied, whole, keys, ends, copies = taken
        self._inbox_end.update(ends)
        self.copied += copied
        self.taken_whole += 1 if whole else 0
        self._written(keys, now, copies)
        return copied, whole

    def _copy(self, origin, entries, routed=None):
        """``apply``'s general path, entry by entry. The loop is shared between entries (``share_loop``), decoded a few
        dozen at a time as they are reached (``RecordEntries``): a frame of MQTT_CLUSTER_FRAME_BYTES of tiny entries
        keeps the other clients waiting no longer than a turn, read once. The copies of a run of MESSAGE and SHARED
        entries are written together (``_write``), the positions moved once they are, and made visible together
        (``_written``: the subscribers waiting on them served from this turn). ``routed``: a list the frame's ROUTED
        versions are appended to (the link acks them once the frame is applied)."""
        copied, keys, run = 0, set(), []
        copies = {} if self.serve is not None else None  # what ``_written`` serves (``_write``)
        ran = {}  # (topic, partition) -> the highest offset in ``run``: copied once written, not yet in the positions
        now = now_ms()
        positions = self.positions
        turn = time.monotonic()
        try:
            for e in entries:
                turn = share_loop(turn)
                if e.kind in (MESSAGE, SHARED):
                    if positions.is_copied(origin, e.topic, e.partition, e.offset) or \
                            e.offset <= ran.get((e.topic, e.partition), -1):
                        continue  # copied, or earlier in this run (a frame that names an offset twice)
                    ran[(e.topic, e.partition)] = e.offset
                    groups, data = split_shared(e.data) if e.kind == SHARED else ((), e.data)
                    check = record_check(e.ts, data)
                    epoch = positions.epoch_at(origin, e.topic, e.partition, e.offset)
                    made = inbox.copy_parts(origin, e.topic, e.partition, e.offset, e.flag, data, now,
                                            self.port.topics, groups, check, epoch)
                    if made is None:  # not kept (expired): a marker holds the position instead
                        flag, data = inbox.marker(origin, e.topic, e.partition, e.offset + 1, now, check, epoch)
                        made = flag, (data,), None
                    else:
                        copied += 1
                    run.append((e, made, check, epoch, data))
                    continue
                if e.kind == EPOCH:  # of the records after it (the copies before it in the run have theirs)
                    positions.told(origin, e.topic, e.partition, e.offset, epoch_of(e))
                    continue
                if run:
                    done, run = run, []
                    ran.clear()
                    copies = self._write(origin, done, now, keys, copies)
                if e.kind == POSITION:
                    keys.update(self._position(origin, e, now))
                elif e.kind == RETAINED:
                    epoch = positions.epoch_at(origin, MQTT_SESSIONS_TOPIC, 0, e.offset)
                    at, _c, _e, path = self.retained_from(origin)
                    before = at if origin in self.retained_next else None
                    path = inbox.entered(path, epoch, before, e.offset, before is not None and e.offset < at)
                    self.retained_next[origin] = (e.offset + 1, record_check(e.ts, e.data), epoch, path)
                    self.retained.apply(origin, e)
                elif e.kind == ROUTED and routed is not None:
                    routed.append(e.offset)
        finally:  # the copies before a malformed entry are written; what was appended is made visible: readers wake now
            try:
                if run:
                    copies = self._write(origin, run, now, keys, copies)
            finally:
                if keys:
                    self._written(keys, now, copies)
        self.copied += copied
        return copied

    def _written(self, keys, now, copies):
        """The copies appended to the inbox partitions ``keys`` are written: what follows is the put path's
        (``burst_written`` of now: visible, their readers woken), the subscribers waiting on them served first from
        this turn with the copies in hand (``serve``) when ``copies`` holds them (``_write``)."""
        if copies:
            self.put_path.burst_written(keys, now, None, self.serve, (copies,))
        else:
            self.put_path.burst_written(keys, now)

    def _write(self, origin, run, now, keys, copies=None):
        """Append the copies of ``run`` (``(entry, (flag, pieces), check, epoch, the origin record's data)`` each, in
        the frame's order) to their inbox partitions with the put path's burst writer, and move the positions past
        each copy written. A
        copy's last piece (an MQTT record's payload: a view of the RECORDS frame it came in) is written from where it
        is, the frame's tail (``batch.write_run``); only the pieces before it (its attribute block with the copy's
        properties) go through the burst's buffer: the payload is copied once here, into the log. Where the
        burst writer stops (a partition's first append, the next index file, a segment roll) one copy goes through
        ``PutPath.append`` (which refuses what the inbox cannot take) and the burst resumes. ``keys`` gets the
        ``(topic, partition)`` of the inbox partitions written. ``copies`` (None: none kept) gets each inbox
        partition's copies written, in log order, as the port serves them (``_served``), and is returned; None is
        returned when the frame's copies would pass MQTT_CLUSTER_DIRECT_COPIES (a backlog's frame: the subscribers'
        deliveries read them). Raises the put path's refusal once what it wrote is counted."""
        path, positions = self.put_path, self.positions
        if copies is not None and \
                sum(map(len, copies.values())) + len(run) > mqttcluster_limits.MQTT_CLUSTER_DIRECT_COPIES:
            copies = None
        topic = inbox.INBOX.encode("ascii")
        src, frames = bytearray(), []
        for e, (flag, pieces, _read), _check, _epoch, _data in run:
            start, crc, tail = len(src), 0, pieces[-1]
            for piece in pieces[:-1]:
                src += piece
                crc = zlib.crc32(piece, crc)
            crc = zlib.crc32(tail, crc)
            frames.append((topic, inbox.partition_of(origin, e.topic, e.partition), flag, 0, start,
                           len(src) - start + len(tail), crc, 0, tail))
        done, n = 0, len(frames)
        try:
            path.check_write(inbox.INBOX, AUTHORIZED, internal=True)
            while done < n:
                taken, written = path.append_burst(frames[done:] if done else frames, src, now)
                for run_key, count, nbytes, first_id, first_offset, first, end in written:
                    path.counted(inbox.INBOX, count, nbytes)
                    keys.add(run_key)
                    self._inbox_end[run_key[1]] = first_offset + count
                    if copies is not None:  # a run's records lie one after the other, ending at its log end
                        copies.setdefault(run_key, []).extend(_served(
                            run, frames, done + first, count, first_offset, first_id, end - nbytes - count * _OVERHEAD))
                done += taken
                if done < n:  # the burst writer stopped: one copy through the general path, then on
                    f = frames[done]
                    body = b"".join((src[f[4]:f[4] + f[5] - len(f[8])], f[8]))
                    r = path.append(inbox.INBOX, f[1], f[2], body, now, internal=True)
                    keys.add((inbox.INBOX, f[1]))
                    self._inbox_end[f[1]] = r.offset + 1
                    if copies is not None:
                        copies.setdefault((inbox.INBOX, f[1]), []).extend(_served(
                            run, frames, done, 1, r.offset, r.msg_id, r.log_end - _OVERHEAD - len(body)))
                    done += 1
        finally:
            for e, _made, check, epoch, _data in run[:done]:
                positions.copied(origin, e.topic, e.partition, e.offset, check, epoch=epoch)
                positions.keep(origin, e.topic, e.partition)
        return copies

    def _position(self, origin, e, now):
        """A POSITION entry: the copy resumes at ``e.offset`` (its ``ts``: the check of the record before it). A
        marker holds it when nothing of the partition was copied yet, and when the origin resumed the copy there,
        before where it was (RESUMED: what was copied past it is not the origin's any more, and its records there
        are copied now); ``{(inbox, partition)}`` of the marker. Where the position is there already and a record
        holds it (the frame's copy before it), nothing moves: nothing is looked at further."""
        positions, rewound = self.positions, bool(e.flag & RESUMED)
        if not rewound and positions.get(origin, e.topic, e.partition) == e.offset and \
                positions.kept(origin, e.topic, e.partition):
            return ()
        if rewound:
            log.warning("mqtt cluster: peer broker %d resumed %s-%d at %d, before where this broker's copy was (%s): "
                        "its records from there are copied", origin, e.topic, e.partition, e.offset,
                        positions.get(origin, e.topic, e.partition))
        epoch = positions.epoch_at(origin, e.topic, e.partition, e.offset - 1)
        positions.copied(origin, e.topic, e.partition, e.offset - 1, e.ts, rewound, epoch)
        if positions.kept(origin, e.topic, e.partition) and not rewound:
            return set()
        positions.keep(origin, e.topic, e.partition)
        return self._append(origin, e, inbox.marker(origin, e.topic, e.partition, e.offset, now, e.ts, epoch), now)

    def _append(self, origin, e, made, now):
        """Append ``made`` (flag, data) to the inbox partition of ``origin``'s ``e.topic``-``e.partition``; ``{(inbox,
        partition)}``."""
        partition = inbox.partition_of(origin, e.topic, e.partition)
        r = self.put_path.append(inbox.INBOX, partition, made[0], made[1], now, internal=True)
        self._inbox_end[partition] = r.offset + 1
        return {(inbox.INBOX, partition)}

    # -- stats ---------------------------------------------------------------------

    def summary_values(self):
        links = sorted(self.links.items())
        values = [("mqtt_cluster", self.membership),
                  ("mqtt_cluster_peers", len(links)),
                  ("mqtt_cluster_peers_up", sum(1 for _b, link in links if link.connected)),
                  ("mqtt_cluster_links_lost", self._links_lost + sum(link.lost for _b, link in links)),
                  ("mqtt_cluster_filters", len(self._route[1])),
                  ("mqtt_cluster_copied", self.copied),
                  ("mqtt_cluster_frames_one_step", self.taken_whole),
                  ("mqtt_cluster_positions", len(self.positions)),
                  ("mqtt_cluster_groups", len(self.offer.groups)),
                  ("mqtt_cluster_peer_groups", sum(len(g) for _t, g in self.shares.peers.values())),
                  ("mqtt_cluster_peer_group_members", sum(sum(g.values()) for _t, g in self.shares.peers.values())),
                  ("mqtt_cluster_retained", self.retained.count())]
        if self.shares.refused:
            values.append(("mqtt_cluster_groups_refused", self.shares.refused))
        if self.shares.forgotten:
            values.append(("mqtt_cluster_share_changes_forgotten", self.shares.forgotten))
        if self.peers_refused:
            values.append(("mqtt_cluster_peers_refused", self.peers_refused))
        for bid, link in links:
            values.append(("mqtt_cluster_peer_%d" % bid, link.state()))
        return values

