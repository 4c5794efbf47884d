"""The replication port's side of the MQTT cluster: ``PeerServer`` answers another master by its first frame (as
``ReplicationServer.peer_handler``): ROUTES begins its follow of this broker, PEER_CALL its calls
(``calls.serve_calls``, by the handlers of ``service.ClientIds.calls``).

**The follow.** The peer's filters say which metaq topics are followed (``TopicMap.topics_for``, the rule a
subscription's reads use; internal topics never: a peer's inbox is not followed, so a copy is never copied again);
each followed partition is read from the peer's resume position, or, when it has none, from this broker's end (a
topic that only appears later: from its start, followed from the wake of its first write, ``NEW_PARTITION``; a
topic deleted stops being followed at that same wake, which its deletion gives at once). A peer that followed this
broker before (since its start) is resumed without a gap where it has no position (``PeerServer.since``,
``PeerFollow.start_of``): a partition an earlier follow started is started there again, one of a topic made here
after the earlier follows last looked (made during a cut, or while the peer was down) from its start. A
record goes in a RECORDS frame, its bytes as stored, when its MQTT topic name (``records.name_of``: as local delivery
sees it, read from its attribute without copying its payload) matches a filter; a POSITION entry says how far a
partition was read when the last record read there went as no entry (a record sent says it itself: the peer's copy
moves past each record it copies, so a lone message's frame holds it alone). With a retained offset the ``R``/``U``
records of the ``%MQTT%`` journal go too. At most
MQTT_CLUSTER_BATCH_BYTES of records per frame, sent in one write (``send_records``); an empty RECORDS when
HEARTBEAT_S passed without a frame, whatever woke the follow meanwhile (the ``%MQTT%`` journal's sessions records,
written at every CONNECT and end of a persistent session, wake it and send nothing). While the follow waits caught
up, a publisher's turn sends it what the turn writes (``direct.TurnFollows``, the frame ``turn_entries`` makes from
the bytes in hand: the same ``batch`` would send).
ROUTES again from the peer replace its filters (its partitions already followed keep their read positions); a route in
parts (``split_routes``) is acted on once its last part came, the first route too. A route that names a version is acked
with a ROUTED entry in the next batch, after the POSITION of each partition it made followed and before any record it
chose: the peer knows from which of its positions the route holds (``MqttCluster.routed``, a takeover's end).

The peer's ``$share`` groups (``share.Shares``) are followed too: a record whose name a group's filter matches goes as
a SHARED entry naming the groups this broker assigns it to at the peer (its own filters aside), and not at all when
every group that wants it is assigned to another broker (and no filter of the peer matches it).

In ``sync`` mode nothing past the master's confirmed end (``Roles.confirmed_end``) is sent: a record its slaves do not
all hold yet may be cut by a failover and its offset taken by another message, which the peer, whose positions say
that offset was copied, would then skip. Such records wait for the slaves' ACK (``Roles.wait_confirmed``). In
``async`` mode the peer may have copied such a record: each resume position comes with the check of the record
before it, proved here before the follow resumes there (``PeerFollow.proved``), and with its epoch (the store's
``epochs``: which master wrote it): a position past where that epoch ended in this broker's history resumes there, so
a peer away through two failovers in a row gets what the middle master wrote. A peer that takes them is told the epoch
of the records it is sent (EPOCH entries, ``PeerFollow.epoch_entry``), which it keeps beside its positions.
"""

import bisect
import itertools
import logging
import time

import gevent
from gevent.event import Event

from metaq import errors

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqtt.follow import is_retained_record
from metaq.mqtt.records import name_of
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.mqtt.topics import matches
from metaq.mqttcluster.clientids.calls import serve_calls
from metaq.protocol import replication as rp
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.protocol.replication_mqtt import (MESSAGE, NO_EPOCH, POSITION, RESUMED, RETAINED, ROUTED, SHARED, Entry,
                                             Records, epoch_entry, join_routes, record_check, shared_data)
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.serving.connections import share_loop
from metaq.serving.longpoll import NEW_PARTITION
from metaq.serving.replication.link import ERR_REFUSED, HEARTBEAT_S, LINK_TIMEOUT_S, send_event
from metaq.mqttcluster.direct import TurnFollows
from metaq.store.record import FIXED_OVERHEAD
from metaq.topics.names import is_internal

log = logging.getLogger(__name__)

#: Records one read of a followed partition takes at most.
READ_RECORDS = 256
#: How often the followed topics are looked at again without the store's partitions changing (``partitions_made``, whose
#: wake brings a topic made or deleted at once): a safety net only.
RESCAN_S = 30.0


class FilterSet:
    """A peer's filters, indexed by first level for the match of a name (pure)."""

    def __init__(self, filters, topics=DEFAULT_MAP):
        self.filters = tuple(filters)
        self.topicmap = topics  # this broker's ``TopicMap``: which of its topics a filter reads
        self._by_first = {}
        self._wild = []
        self._matched = {}  # topic name -> whether a filter matches it (``match``)
        self._kept = 0  # the characters of the names in ``_matched``
        for f in self.filters:
            first = f.split("/", 1)[0]
            if first in ("+", "#"):
                self._wild.append(f)
            else:
                self._by_first.setdefault(first, []).append(f)

    def match(self, name):
        """Whether a filter matches topic name ``name``: the answer kept per name (new filters: a new FilterSet), the
        names kept at most MQTT_CLUSTER_MATCHES_KEPT_CHARS (one past it drops them all: they are kept again as they
        come)."""
        known = self._matched.get(name)
        if known is not None:
            return known
        found = self._match(name)
        kept = self._kept + len(name)
        if kept > mqttcluster_limits.MQTT_CLUSTER_MATCHES_KEPT_CHARS:
            self._matched.clear()
            kept = len(name)
        self._matched[name] = found
        self._kept = kept
        return found

    def _match(self, name):
        for f in self._by_first.get(name.split("/", 1)[0], ()):
            if matches(f, name):
                return True
        return any(matches(f, name) for f in self._wild)

    def topics(self, known):
        """The metaq topics of ``known`` the filters read (internal ones never); the loop shared between filters
        (``share_loop``: a route of MQTT_CLUSTER_MAX_FILTERS keeps no client waiting)."""
        out = set()
        known = [t for t in known if not is_internal(t)]
        names = set(known)
        turn = time.monotonic()
        for f in self.filters:
            topics, every = self.topicmap.topics_for(f)
            if every:
                return set(known)  # each of them: no other filter adds one
            out.update(t for t in topics if t in names)
            turn = share_loop(turn)
        return out


def _any_retained():
    """A follow given no ``retained_end``: any record of the sessions' journal may be a retained one (all read)."""
    return None


class PeerFollow:
    """What one peer follows here: its filters, the read position of each followed partition, its retained offset."""

    def __init__(self, store, routes, topics=DEFAULT_MAP, shares=None, since=None, retained_end=None):
        """``since``: what this broker's earlier follows of the same peer left (``PeerServer.since``:
        ``(log position, {(topic, partition): start offset})``), None: none (``start_of``). ``retained_end()``: the
        ``%MQTT%`` offset from which on no record is a retained one, None when any may be (the port's
        ``RetainedMark.end``); not given: every record is read."""
        self.store = store
        self.retained_end = _any_retained if retained_end is None else retained_end
        self.topicmap = topics
        self.shares = shares
        self.broker_id = routes.broker_id
        self.groups = ()
        checks = routes.checks or (0,) * len(routes.positions)
        epochs = routes.epochs or (NO_EPOCH,) * len(routes.positions)
        paths = routes.epoch_paths or ((),) * len(routes.positions)
        #: where the peer's copies resume, at most MQTT_CLUSTER_MAX_FOLLOWED (the partitions it may follow here)
        self.resume = {(t, p): (o, c, e, f) for (t, p, o), c, e, f in itertools.islice(
            zip(routes.positions, checks, epochs, paths, strict=True), mqttcluster_limits.MQTT_CLUSTER_MAX_FOLLOWED)}
        #: the peer takes EPOCH entries: ``told`` is, per followed partition, the log span ``[start, end)`` of the
        #: epoch it was last told (at most MQTT_CLUSTER_MAX_FOLLOWED, as the cursors), ``history`` the latest entry
        #: of this broker's epochs they were told by (a new epoch here tells them again)
        self.tells = routes.epochs is not None
        self.told = {}
        self.history = None
        if len(routes.positions) > mqttcluster_limits.MQTT_CLUSTER_MAX_FOLLOWED:
            log.warning("mqtt cluster: peer %d sent %d resume positions; the first %d are kept "
                        "(MQTT_CLUSTER_MAX_FOLLOWED): the others' partitions start as new", self.broker_id,
                        len(routes.positions), mqttcluster_limits.MQTT_CLUSTER_MAX_FOLLOWED)
        self.cursors = {}  # (topic, partition) -> next offset to read
        self.retained = routes.retained  # next offset of %MQTT% partition 0, -1: none
        self.known_at_route = set()
        self.announce = []  # partitions followed since the last batch: their start goes to the peer first
        self.refused_logged = False
        self.held = False  # the last batch stopped at a record past the confirmed end
        self.unsent = b""  # what a writing turn's frame left unwritten: the follow writes it before anything else
        self.routing = 0  # routes being acted on now (``set_filters``, whose rescan may share the loop)
        self.rewound = set()  # partitions resumed before the peer's position (``proved``), said at their announce
        self.made = None  # the store's ``partitions_made()`` at the last rescan
        self.started = {}  # (topic, partition) -> where it was started without a position of the peer
        self.scanned_at = 0  # the log end when the last rescan began: a topic made before it was looked at
        self.since = since  # for the first route's partitions only (``start_of``)
        self.routed = 0  # the version of the peer's route to ack in the next batch (0: none)
        self._rescans = 0  # rescans begun: one that shares the loop and finds a later one begun leaves it to that one
        self.set_filters(routes.filters, routes.groups, routes.version, routes.weights)
        self.since = None
        if routes.retained > 0:  # proved as a position is: an async failover cut what it saw
            self.retained = self.proved((MQTT_SESSIONS_TOPIC, 0), routes.retained, routes.retained_check,
                                        routes.retained_epoch, routes.retained_epoch_path)
            self.rewound.discard((MQTT_SESSIONS_TOPIC, 0))  # no POSITION of it goes to the peer

    def set_filters(self, filters, groups=(), version=0, weights=()):
        """The peer's filters and ``$share`` groups are these now (their topics are followed), each group weighted by
        its members on the peer (``weights``, one per group; empty: each 1); ``version``: the
        route's, acked (ROUTED) in the first batch after its rescan (0: none asked): the ack follows the POSITIONs
        of the partitions this route reads, and a newer route that came during the rescan acks for itself."""
        self.routing += 1  # (its rescan shares the loop: no writing turn sends meanwhile, ``turn_entries``)
        try:
            self._set_filters(filters, groups, version, weights)
        finally:
            self.routing -= 1

    def _set_filters(self, filters, groups, version, weights):
        self.filters = FilterSet(filters, self.topicmap)
        self.groups = tuple(groups) if self.shares is not None else ()
        self._read_set = FilterSet(tuple(filters) + tuple(g[1] for g in self.groups),
                                   self.topicmap)
        if self.shares is not None:
            refused = self.shares.refused
            self.shares.set_peer(self.broker_id, id(self),
                                 dict(zip(self.groups, weights or (1,) * len(self.groups), strict=True)))
            if self.shares.refused > refused:
                log.warning("mqtt cluster: %d shared groups tracked is the limit (MQTT_CLUSTER_MAX_GROUPS): some of "
                            "peer %d's are not shared across the cluster", self.shares.most, self.broker_id)
        self.known_at_route = set(self.store.known_topics())
        read_set = self._read_set
        self.rescan()
        if version and self._read_set is read_set:
            self.routed = version

    def rescan(self):
        """Follow the partitions the filters read that are not followed yet; stop following the others. A topic
        gone (deleted) is no longer known at the route: made again, it is followed from its start. A rescan begun
        while this one shared the loop (a newer route's, or the follow's on a partition made meanwhile) decides: it
        knows the topics made since, which this one would stop following."""
        self._rescans += 1
        mine = self._rescans
        store = self.store
        self.made = store.partitions_made()
        self.scanned_at = store.written_position
        known = store.known_topics()
        self.known_at_route.intersection_update(known)
        read_set = self._read_set
        topics = read_set.topics(known)  # (it shares the loop: a ROUTES read meanwhile may replace the filters)
        if read_set is not self._read_set or mine != self._rescans:
            return  # the newer filters' own rescan decides, or the later one with the topics made since
        wanted = []
        for topic in sorted(topics):
            try:
                partitions = store.partitions_of(topic)
            except errors.MetaqError:
                continue
            wanted.extend((topic, p) for p in range(partitions))
        keep = set(wanted)
        for key in [k for k in self.cursors if k not in keep]:
            self.unfollow(key)
        for key in wanted:
            if key in self.cursors:
                continue
            if len(self.cursors) >= mqttcluster_limits.MQTT_CLUSTER_MAX_FOLLOWED:
                if not self.refused_logged:
                    self.refused_logged = True
                    log.warning("mqtt cluster: peer %d follows %d partitions (MQTT_CLUSTER_MAX_FOLLOWED): %s-%d and "
                                "others are not followed", self.broker_id, len(self.cursors), key[0], key[1])
                break
            resume = self.resume.pop(key, None)
            if resume is not None:
                start = self.proved(key, *resume)
            else:
                start = self.started[key] = self.start_of(key)
            self.cursors[key] = start
            self.announce.append(key)

    def unfollow(self, key):
        """Partition ``key`` is not followed any more (its filters no longer read it, or its topic was deleted): its
        cursor goes, and with it what the follow kept of it (where it started it, the epoch it told), so that they stay
        within the partitions followed however many come and go during one link."""
        self.cursors.pop(key, None)
        self.started.pop(key, None)
        self.told.pop(key, None)

    def start_of(self, key):
        """Where partition ``key``, which the peer sent no position for, is followed from. A topic that appeared
        since the route came: all of it. With ``since`` (the peer followed this broker before: a cut link, a
        restart of the peer): where an earlier follow started it (the peer never said it got that far); a partition
        whose first record is past where the earlier follows last looked (its topic made here while the peer was away):
        all of it. Else from now on (a topic a new subscription of the peer reads: what is published from now)."""
        store = self.store
        if key[0] not in self.known_at_route:
            return store.min_offset(*key)
        if self.since is not None:
            ended, starts = self.since
            first = store.min_offset(*key)
            if key in starts:
                return min(max(starts[key], first), store.max_offset(*key))
            position = store.record_position(key[0], key[1], first)
            if position is not None and position >= ended:
                return first
        return store.max_offset(*key)

    def batch(self, confirmed=None):
        """The next RECORDS entries (empty: nothing new), at most MQTT_CLUSTER_BATCH_BYTES of data, none of a record
        ending past log position ``confirmed`` (None: no bound); ``held`` says whether one waits for it. A partition
        read gets a POSITION only when its last record read went as no entry: the peer's copy of a record moves its
        position past it, with its check."""
        if self.tells and self.history != self.store.epochs.entries[-1]:
            self.told.clear()
            self.history = self.store.epochs.entries[-1]
        store, entries, budget = self.store, self._announced(), mqttcluster_limits.MQTT_CLUSTER_BATCH_BYTES
        self.held = False
        for key, offset in list(self.cursors.items()):
            if budget <= 0:
                break
            try:
                if offset >= store.max_offset(*key):
                    continue
            except errors.MetaqError:  # its topic deleted since the last rescan: not followed any more
                self.unfollow(key)
                continue
            topic, partition = key
            try:
                records, _nxt = store.read_records(topic, partition, offset, READ_RECORDS, budget)
            except errors.Moved as moved:
                self.cursors[key] = moved.offset
                continue
            except errors.CorruptRecord as exc:
                log.error("mqtt cluster: peer %d: %s; skipped", self.broker_id, exc)
                self.cursors[key] = exc.next_offset
                continue
            except errors.MetaqError:
                self.unfollow(key)
                continue
            last = None  # the last record read that went as no entry (its POSITION says how far the peer is)
            for rec in records:
                if confirmed is not None and rec.position + rec.total_size > confirmed:
                    self.held = True
                    break
                if self.tells:
                    self._tell(key, rec, entries)
                entry = self._entry(topic, partition, rec)
                if entry is not None:
                    entries.append(entry)
                    budget -= len(rec.data)
                    last = None
                else:
                    last = rec
                self.cursors[key] = rec.queue_offset + 1
            if last is not None:
                entries.append(Entry(POSITION, topic, partition, self.cursors[key], 0,
                                     record_check(last.store_ts_ms, last.data)))
        if self.retained >= 0 and budget > 0:
            entries.extend(self._retained(budget, confirmed))
        return entries

    def lone_run(self, runs):
        """The one run of ``runs`` (a burst's ``BurstRun``s) on a partition this follow reads; None when none is, or
        more than one (``batch`` sends those, all partitions in one frame)."""
        found = None
        cursors = self.cursors
        for run in runs:
            if run.key in cursors:
                if found is not None:
                    return None
                found = run
        return found

    def turn_entries(self, run, staged, now, confirmed):
        """The entries ``batch`` would send of ``run`` (a ``BurstRun`` just written at ``now`` ms over ``staged``, its
        writer's entries ``(topic, partition, flag, record data, ...)``), made from those bytes rather than read back,
        for a follow waiting caught up (``direct.TurnFollows``); None, when in doubt, for ``batch`` to send instead:
        the partition not at the run's first record, something to announce, ack or finish sending first, a rescan
        owed, a record past ``confirmed`` (``batch``'s bound) or of an epoch the peer was not told, a share group
        that may take a name, more than one read's records."""
        key = run.key
        store = self.store
        if (self.cursors.get(key) != run.first_offset or self.announce or self.routed or self.unsent or self.held
                or self.routing or run.count > READ_RECORDS or (confirmed is not None and run.log_end > confirmed)
                or run.body_bytes + run.count * (FIXED_OVERHEAD + len(key[0]))
                > mqttcluster_limits.MQTT_CLUSTER_BATCH_BYTES
                or self.made != store.partitions_made() or not self._retained_sent()):
            return None
        if self.tells:
            told = self.told.get(key)
            if told is None or run.log_end > told[1] or self.history != store.epochs.entries[-1]:
                return None
        topic, partition = key
        groups, filters, topicmap = self.groups, self.filters, self.topicmap
        entries = []
        last = None  # the data of the last record that goes as no entry (its POSITION says how far the peer is)
        offset = run.first_offset
        for k in range(run.first_frame, run.first_frame + run.count):
            entry = staged[k]
            flag, data = entry[2], entry[3]
            if entry[0] != topic:
                return None
            name = name_of(topic, flag, data, topicmap)
            if groups and any(matches(g[1], name) for g in groups):
                return None
            if filters.match(name):
                entries.append(Entry(MESSAGE, topic, partition, offset, flag, now, bytes(data)))
                last = None
            else:
                last = data
            offset += 1
        if last is not None:
            entries.append(Entry(POSITION, topic, partition, offset, 0, record_check(now, last)))
        return entries

    def _retained_sent(self):
        """True when no retained record waits for the peer (none followed, the follow at the journal's end, or none
        past its offset: ``retained_end``, the sessions' records left unread do not keep a turn from sending)."""
        if self.retained < 0:
            return True
        try:
            if self.retained >= self.store.max_offset(MQTT_SESSIONS_TOPIC, 0):
                return True
        except errors.MetaqError:
            return False
        end = self.retained_end()
        return end is not None and self.retained >= end

    def advance(self, key, offset):
        """Partition ``key`` was sent up to ``offset`` (from the writing turn: ``TurnFollows``)."""
        if key in self.cursors:
            self.cursors[key] = offset

    def _announced(self):
        """A batch's first entries: the POSITION where each partition newly followed starts (the peer learns it before
        any record of it), then the ROUTED of the peer's route acted on since the last batch (every record after it
        was chosen by that route)."""
        entries = []
        announce, self.announce = self.announce, []
        for key in announce:
            if key in self.cursors:
                at = self.cursors[key]
                before = self.store.record_position(key[0], key[1], at - 1) if self.tells and at > 0 else None
                if before is not None:  # the epoch of the record before the position, which the peer keeps
                    entries.append(self.epoch_entry(key, at - 1, before))
                entries.append(Entry(POSITION, key[0], key[1], at, RESUMED if key in self.rewound else 0,
                                     self.check_at(key, at - 1)))
        self.rewound.clear()
        if self.routed:
            entries.append(Entry(ROUTED, "", 0, self.routed))
            self.routed = 0
        return entries

    def _tell(self, key, rec, entries):
        """Append the EPOCH entry of partition ``key``'s record ``rec`` to ``entries`` when the peer was not told its
        epoch (the first record of the partition, or the first of another epoch)."""
        told = self.told.get(key)
        if told is None or not told[0] <= rec.position < told[1]:
            entries.append(self.epoch_entry(key, rec.queue_offset, rec.position))

    def epoch_entry(self, key, offset, position):
        """The EPOCH entry of partition ``key``'s record ``offset`` at log ``position``: the epoch of this broker's
        history whose span holds it, which ``told`` keeps (the records after it in that span need no other); NO_EPOCH
        for a record before the first epoch the history holds (trimmed to MAX_REPLICATION_EPOCHS: none known)."""
        entries = self.store.epochs.entries
        i = bisect.bisect_right(entries, position, key=_start) - 1
        if i < 0:
            self.told[key] = (0, entries[0][1])
            return epoch_entry(key[0], key[1], offset, NO_EPOCH)
        self.told[key] = (entries[i][1], entries[i + 1][1] if i + 1 < len(entries) else 2**63)
        return epoch_entry(key[0], key[1], offset, (entries[i][0], entries[i][2]))

    def epoch_end(self, key, epoch):
        """``(end, held)``: where ``epoch`` ``(number, origin)`` ended in partition ``key`` by this broker's history
        (KIP-101's OffsetForLeaderEpoch): the first offset this broker holds of a later epoch, its end when the epoch
        is its latest; an epoch it does not hold (``held`` False: a deposed master's that none of this log's writers
        took part in) ends where the latest earlier one held here does; end None when none is (the check alone
        decides). Index reads, and a binary search of the history (its entries strictly increase in number:
        ``store.epochs``), so that a route of MQTT_CLUSTER_MAX_FOLLOWED positions is proved in as many steps of log
        MAX_REPLICATION_EPOCHS."""
        entries = self.store.epochs.entries
        i = bisect.bisect_left(entries, epoch[0], key=_number)
        found = i < len(entries) and (entries[i][0], entries[i][2]) == tuple(epoch[:2])
        held = i if found else i - 1
        if held < 0:
            return None, found
        if held + 1 >= len(entries):
            return self.store.max_offset(*key), found
        spans = self.store.record_spans(key[0], key[1], entries[held + 1][1], 2**63 - 1, 1)
        return (spans[0][0] if spans else self.store.max_offset(*key)), found

    def proved(self, key, offset, check, epoch=NO_EPOCH, path=()):
        """Where the peer's copy of partition ``key`` resumes, given its position ``offset``, the ``check`` of the
        record before it as the peer copied it and that record's ``epoch`` (``(number, origin)``; NO_EPOCH: an older
        peer, or none known), and the epochs its copy went through (``path``: ``inbox.entered``'s; () none known).
        With an epoch: no further than ``resume_bound`` says (where that epoch ended here, or where the copy entered
        the epochs this log never held): a peer away through two failovers in a row resumes where its last copy's
        master stopped being this log's writer, before what the middle master wrote. Then by the check: ``offset``
        when this broker's record there is that one (or no check was sent: an older peer, or nothing before it);
        else the first record of the epoch of this broker's record there (the latest epoch when it has none), where
        this log took its own way (an ``async`` master's failover cut what the peer copied and gave those offsets to
        other messages). The peer is told it was rewound. It then copies every record of this log from there:
        nothing it skipped (its copies of the cut messages stay). Index reads and one record read (as ``batch``'s)."""
        if offset <= 0 or offset - 1 < self.store.min_offset(*key):
            return offset  # nothing before it to prove (retention took it: what is before is old, not a cut tail)
        if tuple(epoch) != NO_EPOCH:
            end = self.resume_bound(key, offset, epoch, path)
            if end is not None and end < offset:
                log.warning("mqtt cluster: peer %d's copy of %s-%d stops at %d, past where its epoch %d ended in this "
                            "broker's history or where it entered one this broker never held (failovers since it "
                            "copied there); it resumes at %d", self.broker_id,
                            key[0], key[1], offset, epoch[0], end)
                self.rewound.add(key)
                return end
        if not check:
            return offset
        if self.check_at(key, offset - 1) == check:
            return offset
        store, (topic, partition) = self.store, key
        position = store.record_position(topic, partition, offset - 1)
        entries = store.epochs.entries
        if position is None:
            start = entries[-1][1]
        else:
            i = bisect.bisect_right(entries, position, key=_start) - 1
            start = entries[i][1] if i >= 0 else 0
        spans = store.record_spans(topic, partition, start, 2 ** 63 - 1, 1)
        resumed = min(spans[0][0] if spans else store.max_offset(*key), offset)
        log.warning("mqtt cluster: peer %d's copy of %s-%d stops at %d, past a record this broker does not hold "
                    "(its log took another way at position %d: a failover of an async master); it resumes at %d",
                    self.broker_id, topic, partition, offset, start, resumed)
        self.rewound.add(key)
        return resumed

    def resume_bound(self, key, offset, epoch, path=()):
        """How far a peer's copy of partition ``key`` at position ``offset`` may resume (KIP-279's question, asked
        here epoch by epoch down the peer's ``path``, its last entry ``epoch``'s; none: ``epoch`` entered at
        ``offset``): the end here of the latest epoch of the path this log holds, and no further than where the copy
        entered any later one (those it never held: a master deposed mid-epoch, that had lagged as a slave, may have
        begun its epoch before that end). None of the path held: the end of the latest epoch held before its oldest,
        and no further than where the copy entered that oldest; no epoch here that old: where it entered it (no
        further than this log's end), None when that is ``offset`` itself (the check decides)."""
        if not path or path[-1][:2] != tuple(epoch[:2]):
            path = ((epoch[0], epoch[1], offset),)
        bound, end = offset, None
        for number, origin, start in reversed(path):
            end, held = self.epoch_end(key, (number, origin))
            if held:
                return min(end, bound)
            bound = min(bound, max(start, self.store.min_offset(*key)))
            if end is None:  # none held here as old as it, nor as any before it
                break
        if end is None:
            return None if bound >= offset else min(bound, self.store.max_offset(*key))
        return min(end, bound)

    def check_at(self, key, offset):
        """The ``record_check`` of this broker's record ``offset`` of partition ``key``; 0 when it has none."""
        if offset < 0:
            return 0
        try:
            records, _nxt = self.store.read_records(key[0], key[1], offset, 1,
                                                    mqttcluster_limits.MQTT_CLUSTER_BATCH_BYTES)
        except errors.MetaqError:
            return 0
        if not records or records[0].queue_offset != offset:
            return 0
        return record_check(records[0].store_ts_ms, records[0].data)

    def _entry(self, topic, partition, rec):
        """The entry of record ``rec`` for the peer (None: it wants none): SHARED when this broker assigns it to some
        of the peer's groups (``Shares.owner``), else MESSAGE when a filter of the peer matches its name."""
        name = name_of(topic, rec.flag, rec.data, self.topicmap)
        owned = ()
        if self.groups:
            shares, here = self.shares, self.shares.broker_id
            owned = [g for g in self.groups if matches(g[1], name)
                     and shares.owner(g, here, topic, partition, rec.position) == self.broker_id]
        if owned:
            return Entry(SHARED, topic, partition, rec.queue_offset, rec.flag, rec.store_ts_ms,
                         shared_data(owned, bytes(rec.data)))
        if self.filters.match(name):
            return Entry(MESSAGE, topic, partition, rec.queue_offset, rec.flag, rec.store_ts_ms, bytes(rec.data))
        return None

    def ended(self):
        """The link ended: the peer is not linked here (``Shares.drop_peer``: its groups keep their last assignment)."""
        if self.shares is not None:
            self.shares.drop_peer(self.broker_id, id(self))

    def _retained(self, budget, confirmed):
        """The RETAINED entries of the ``%MQTT%`` records from ``retained`` on (the EPOCH entries before them). Only up
        to where a retained record may lie (``retained_end``): from there it moves to the journal's visible end
        without reading, those records send nothing (in any mode), and the peer is told the EPOCH of its next
        retained record with it. The visible end is read before ``end``: a retained record below it was appended
        before ``end`` was asked, so lies below ``end``; one appended after lies at or past it."""
        store, out = self.store, []
        try:
            visible = store.max_offset(MQTT_SESSIONS_TOPIC, 0)
            if self.retained >= visible:
                return out
            end = self.retained_end()
            if end is not None and self.retained >= end:
                self.retained = visible
                return out
            most = READ_RECORDS if end is None else min(READ_RECORDS, end - self.retained)
            records, _nxt = store.read_records(MQTT_SESSIONS_TOPIC, 0, self.retained, most, budget)
        except errors.Moved as moved:
            self.retained = moved.offset
            return out
        except errors.CorruptRecord as exc:
            self.retained = exc.next_offset
            return out
        except errors.MetaqError:
            return out
        for rec in records:
            if confirmed is not None and rec.position + rec.total_size > confirmed:
                self.held = True
                return out
            if self.tells:
                self._tell((MQTT_SESSIONS_TOPIC, 0), rec, out)
            if is_retained_record(rec.data):
                out.append(Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, rec.queue_offset, rec.flag, rec.store_ts_ms,
                                 bytes(rec.data)))
            self.retained = rec.queue_offset + 1
        if end is not None and self.retained >= end:
            self.retained = max(self.retained, visible)  # the rest up to it holds none
        return out

    def keys(self):
        keys = list(self.cursors)
        if self.retained >= 0:
            keys.append((MQTT_SESSIONS_TOPIC, 0))
        return keys


class PeerServer:
    """Answers the other masters on the replication port (``ReplicationServer.peer_handler``): their follows of this
    broker and their calls; counts for stats."""

    def __init__(self, store, waiters, topics=DEFAULT_MAP, shares=None, confirmed_end=lambda: None,
                 wait_confirmed=None, calls=None, followed=lambda _broker_id, _live: None, asks=None,
                 retained_end=None):
        """``shares``: the cluster's ``share.Shares``; ``confirmed_end()``/``wait_confirmed(timeout)``: ``Roles``'
        (what may leave this broker, and a wait for more of it); ``calls``: op -> handler of the calls answered
        (``ClientIds.calls``; None: none, a call is answered as unknown); ``followed(broker_id, live)``: told when a
        peer's follow begins (its route in, its partitions' cursors set) and ends (``MqttCluster.followed``);
        ``asks``: who may be served and what it may ask (``asks.Asks``; None: any peer that proved the secret);
        ``retained_end``: the follows' (``PeerFollow``): from where no record of the sessions' journal is a retained
        one."""
        self.retained_end = retained_end
        self.followed = followed
        self.asks = asks
        self._links = {}  # peer broker id -> the socket of its follow now (one per member: a newer one ends it)
        self.calls = calls if calls is not None else {}
        self.store = store
        self.waiters = waiters
        self.topicmap = topics  # the MQTT port's ``TopicMap`` (a cluster's brokers share their mqtt settings)
        self.shares = shares
        self.confirmed_end = confirmed_end
        self.wait_confirmed = wait_confirmed
        self.follows = {}  # id(PeerFollow) -> PeerFollow
        self.ended = {}  # peer broker id -> (``scanned_at``, ``started``) of its follows, once they ended (``since``)
        #: the follows waiting caught up, served from a publisher's turn (its ``serve``: ``ClusterSeam.serve_follows``)
        self.turn = TurnFollows(confirmed_end)
        self._sent_records = 0

    @property
    def sent_records(self):
        """The records (not POSITIONs) sent to the peers, by their follows and from the writing turns."""
        return self._sent_records + self.turn.sent_records

    def serve(self, sock, parser, hello, peer):
        """One link of another master, by its first frame ``hello`` (its proof checked): ROUTES or PEER_CALL; refused
        (an ERROR) unless its broker id is a member's (``asks``), looked at again for up to two
        MQTT_CLUSTER_MEMBERS_POLL_S (a member that just joined is read here a moment after it reads itself)."""
        if self.asks is not None:
            refusal = self.asks.stranger(hello.broker_id)
            deadline = time.monotonic() + 2 * mqttcluster_limits.MQTT_CLUSTER_MEMBERS_POLL_S
            while refusal is not None and time.monotonic() < deadline:
                gevent.sleep(0.1)
                refusal = self.asks.stranger(hello.broker_id)
            if refusal is not None:
                self.asks.refused += 1
                log.warning("mqtt cluster: refusing a peer from %s: %s", peer, refusal)
                send_event(sock, rp.ErrorFrame(ERR_REFUSED, "refused: %s" % refusal))
                return
        if isinstance(hello, rp.Routes):
            self.follow(sock, parser, hello, peer)
        else:
            serve_calls(sock, parser, hello, peer, self.calls, self.asks.admit if self.asks is not None else None)

    def follow(self, sock, parser, routes, peer):
        """A peer's follow: RECORDS sent for its ROUTES (all its parts: ``join_routes``) until its link ends."""
        try:
            send_event(sock, Records(()))  # the end of the handshake (the peer waits for a first frame)
            routes = _whole_route(sock, parser, routes)
        except (OSError, errors.MetaqError) as exc:
            log.info("mqtt cluster: peer broker %d (%s) link ended before its route came: %s", routes.broker_id,
                     peer, exc)
            return
        older = self._links.pop(routes.broker_id, None)
        if older is not None:  # a link of the same peer still served here: cut, and not seen yet
            log.info("mqtt cluster: peer broker %d follows this broker again: its older link ends", routes.broker_id)
            _close(older)
        self._links[routes.broker_id] = sock
        follow = PeerFollow(self.store, routes, self.topicmap, self.shares, self.since(routes.broker_id),
                            self.retained_end)
        self.follows[id(follow)] = follow
        self.followed(routes.broker_id, True)
        wake = Event()
        log.info("mqtt cluster: peer broker %d (%s) follows this broker: %d filters, %d partitions", routes.broker_id,
                 peer, len(follow.filters.filters), len(follow.cursors))
        reader = gevent.spawn(self._read, sock, parser, follow, wake)
        try:
            rescanned = sent = turn = time.monotonic()
            while not reader.dead:
                if follow.unsent:  # the rest of a frame a writing turn began: whole before anything else
                    rest, follow.unsent = follow.unsent, b""
                    sock.sendall(rest)
                    sent = time.monotonic()
                if follow.made != self.store.partitions_made() or time.monotonic() - rescanned > RESCAN_S:
                    follow.rescan()
                    rescanned = time.monotonic()
                entries = follow.batch(self.confirmed_end())
                if entries:
                    send_records(sock, Records(tuple(entries)))
                    self._sent_records += sum(1 for e in entries if e.kind != POSITION)
                    sent = time.monotonic()
                    turn = share_loop(turn)  # a backlog's batches let the other connections run every MAX_TURN_MS
                    continue
                if follow.held and self.wait_confirmed is not None:
                    if time.monotonic() - sent >= HEARTBEAT_S:
                        send_event(sock, Records(()))
                        sent = time.monotonic()
                    self.wait_confirmed(HEARTBEAT_S)
                    turn = time.monotonic()
                    continue
                wake.clear()
                self.turn.waiting(follow, sock, wake)  # caught up: a writing turn may send it what it writes
                try:
                    self.waiters.wait_any(follow.keys() + [NEW_PARTITION],
                                          max(0.0, sent + HEARTBEAT_S - time.monotonic()), wake)
                finally:
                    self.turn.busy(follow)
                if not reader.dead and not follow.unsent and time.monotonic() - sent >= HEARTBEAT_S:
                    send_event(sock, Records(()))  # idle, or woken only by what it sends the peer nothing of
                    sent = time.monotonic()
                turn = time.monotonic()
        except (OSError, errors.MetaqError) as exc:
            log.info("mqtt cluster: peer broker %d (%s) link ended: %s", routes.broker_id, peer, exc)
        finally:
            self.turn.busy(follow)
            reader.kill(block=False)
            if self._links.get(routes.broker_id) is sock:
                del self._links[routes.broker_id]
            self.follows.pop(id(follow), None)
            self.follow_ended(follow)
            follow.ended()
            self.followed(routes.broker_id, False)

    def since(self, broker_id):
        """What a new follow of peer ``broker_id`` starts its partitions without a position from
        (``PeerFollow.start_of``): the log end when its follows last looked for partitions (``scanned_at``: a
        follow whose link is gone may not see it at once, nor a topic made meanwhile) and where they started
        partitions the peer sent no position for (an older follow still running included: a cut not seen here
        yet). None: no follow of it since this broker started (the start hold covers a restart here)."""
        live = [f for f in self.follows.values() if f.broker_id == broker_id]
        ended = self.ended.get(broker_id)
        if not live and ended is None:
            return None
        marker, starts = ended if ended is not None else (0, {})
        starts = dict(starts)
        for f in live:
            starts.update(f.started)
            marker = max(marker, f.scanned_at)
        return (marker, starts)

    def follow_ended(self, follow):
        """Keep what ``since`` needs of ``follow``, which ended (a newer follow's, ended first, wins): at most
        MQTT_CLUSTER_MAX_PEERS peers (the oldest dropped), each at most MQTT_CLUSTER_MAX_FOLLOWED partitions (its
        cursors' bound)."""
        marker, starts = follow.scanned_at, dict(follow.started)
        old = self.ended.pop(follow.broker_id, None)
        if old is not None and old[0] > marker:
            marker, starts = old[0], {**starts, **old[1]}
            while len(starts) > mqttcluster_limits.MQTT_CLUSTER_MAX_FOLLOWED:
                del starts[next(iter(starts))]
        self.ended[follow.broker_id] = (marker, starts)
        while len(self.ended) > mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS:
            del self.ended[next(iter(self.ended))]

    @staticmethod
    def _read(sock, parser, follow, wake):
        """The peer's frames: a ROUTES (all its parts) replaces its filters; its end ends the link."""
        pending = None  # the parts of a route so far, while its last has not come
        while True:
            try:
                event = _next_frame(sock, parser)
                if isinstance(event, rp.Routes):
                    pending = join_routes(pending, event)
            except errors.RemoteProtocolError as exc:
                log.warning("mqtt cluster: peer broker %d: %s; ending its link", follow.broker_id, exc)
                return
            except OSError:
                return
            if event is CLOSED or isinstance(event, rp.ErrorFrame):
                return
            if isinstance(event, rp.Routes):
                if not pending.more:
                    follow.set_filters(pending.filters, pending.groups, pending.version, pending.weights)
                    pending = None
                    wake.set()
                continue
            log.warning("mqtt cluster: peer broker %d sent %s: ending its link", follow.broker_id,
                        type(event).__name__.upper())
            return


def _number(entry):
    """An epoch history entry's number (``store.epochs``: ``(epoch, start, origin)``)."""
    return entry[0]


def _start(entry):
    """An epoch history entry's log position where it begins."""
    return entry[1]


def send_records(sock, event):
    """Send a RECORDS frame in one write: its parts joined (a frame is at most MQTT_CLUSTER_FRAME_BYTES,
    ``rp.joined``), so that a link with TCP_NODELAY sends a few segments of it, not one per entry's part."""
    sock.sendall(rp.joined(event))


def _close(sock):
    try:
        sock.close()
    except OSError:
        pass


def _next_frame(sock, parser):
    """The peer's next frame (CLOSED at its end); blocks on ``sock``."""
    while True:
        event = parser.next_event()
        if event is not NEED_DATA:
            return event
        parser.receive_data(sock.recv(65536))


def _whole_route(sock, parser, routes):
    """The peer's route of which ``routes`` is the first part: its other parts read and joined (``join_routes``),
    each within LINK_TIMEOUT_S. Raises RemoteProtocolError for anything but a part, OSError at the link's end."""
    if not routes.more:
        return routes
    timeout = sock.gettimeout()
    sock.settimeout(LINK_TIMEOUT_S)
    try:
        while routes.more:
            event = _next_frame(sock, parser)
            if not isinstance(event, rp.Routes):
                raise errors.RemoteProtocolError("peer broker %d sent %s before the rest of its route"
                                                 % (routes.broker_id, "its end" if event is CLOSED
                                                    else type(event).__name__.upper()), fatal=True)
            routes = join_routes(routes, event)
    finally:
        sock.settimeout(timeout)
    return routes
