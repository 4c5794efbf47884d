"""The MQTT port: a listener on the connection core, the client identifiers connected now, and the persistent
sessions (docs/mqtt.md).

``MqttPort`` opens its listener through ``ConnectionCore.listen("mqtt", ...)``, so the connection cap, the
per-address share, the deadlines, the allow-list, TLS and the strangers' login deadline apply as on every port. It
is given what it uses: the connection core, the ``mqtt:`` settings, the store (partition counts and the read path),
the put path (the one write decision and append), the guard, the partition waiters (deliveries wake on appends)
and the store's ``max_transfer_size``; in an MQTT cluster, what makes its seam with the cluster (``seam.Alone`` is
the contract, and a broker alone's): everything it asks of the cluster goes through that one interface.

What it holds across connections:

* **client identifiers** connected now (``claim``): a second connection with a client id takes it over, the first
  is told DISCONNECT 0x8E (MQTT 5) and closed (MQTT 3.1.1 [MQTT-3.1.4-2], MQTT 5.0 [MQTT-3.1.4-3]);
* **wills** (``wills.Wills``, ``self.wills``): published through the put path when a connection ends without a
  normal DISCONNECT, held for an MQTT 5 Will Delay, kept in the sessions' log until published or dropped, adopted
  by the master taking over, tried again after a passing refusal (metaq/mqtt/wills.py);
* **fencing** (``session_refusal``, checked every ``limits.MQTT_ROLE_CHECK_S`` by ``_keep``): only a master that
  may acknowledge writes keeps sessions and wills; one that stops being one (deposed, its lease run out,
  isolated) closes at once the connections that hold a persistent session or a will (``Connection.move_away``):
  what it would deliver to them could not be saved, and a session served there would be lost. One that only
  may confirm no write (``sync``, no member in sync) does so after ``mqtt.unconfirmable_grace_s``;
* **assigned client identifiers** for a CONNECT with an empty one;
* **the master's MQTT address** (``master_reference``: with ``ha: auto``, from the elected master's leader node):
  a slave refuses a CONNECT that needs a persistent session, naming it (MQTT 5 Server Reference);
* **persistent sessions** (``follow.SessionTable``): the sessions the sessions' log (``%MQTT%``) holds, replayed
  from the log at the start and followed on a slave (``store/journals.py``'s ``JournalFollow``); ``resume`` gives
  a CONNECT its saved session, ``save`` writes one (at once for subscriptions, QoS 2 packet ids and ends; the read
  positions of the connected ones every ``MQTT_SESSION_SAVE_INTERVAL_S`` while they change, by ``_keep``), and
  ``_keep`` ends the offline sessions past their expiry, ``mqtt.offline_session_max_age_s`` or
  ``mqtt.max_offline_sessions`` and writes again those whose record fell ``MQTT_SESSION_REWRITE_BYTES`` (or a
  segment) behind, so retention can go on.
  Only a master writes; a slave's table follows the master's records, and a promoted slave's is its own.
* **shared groups** (``join_group`` / ``leave_group``): a group lives in memory while it has members; its read
  positions are written to the sessions' log when its last member leaves and every
  ``MQTT_SESSION_SAVE_INTERVAL_S`` while they move, as long as some session holding one of its subscriptions
  exists (``_kept_groups``), so that a group begun again goes on where it stopped: what was published while it had
  no member is delivered. When no such session is left (each ended by Clean Start, expiry or the offline bounds)
  ``_keep`` ends the group's record; the groups kept are so bounded by the sessions kept.
"""

import itertools
import logging
import os
import time
import zlib

import gevent
from gevent.lock import Semaphore

from metaq import errors
from metaq.mqtt import limits as mqtt_limits
from metaq.groups.lag import Position
from metaq.mqtt import direct
from metaq.mqtt.connection import Connection
from metaq.mqtt.decoded import Decoded
from metaq.mqtt.fanout import Fanouts
from metaq.mqtt.follow import (MQTT_JOURNAL, MQTT_LEARN_BATCH, MQTT_SESSIONS_TOPIC, Retained, SavedGroup, encode,
                               encode_carried, encode_end, encode_group, encode_group_end, encode_retained,
                               encode_share_history, encode_share_history_end, encode_unretained, encode_will,
                               is_retained_record, replay, RetainedMark)
from metaq.mqtt.records import partition_for, placement, record_data
from metaq.mqtt.seam import Alone
from metaq.mqtt.session import SharedGroup
from metaq.mqtt.topics import TopicError, matches, split_shared
from metaq.mqtt.wills import Wills
from metaq.clock import now_ms
from metaq.serving.connections import close_with_grace, share_loop
from metaq.serving.putpath import ACK_NOW
from metaq.speedups import load
from metaq.store.record import FIXED_OVERHEAD
from metaq.store.results import BurstRun
from metaq.store.journals import JournalFollow, MovingFloor

#: The connection core's listeners whose connections are this port's: TCP, and WebSocket (metaq/mqtt/websocket.py).
LISTENERS = ("mqtt", "mqtt-ws", "mqtt-wss")

log = logging.getLogger(__name__)


def burst_frames_py(staged, largest):
    """The store's burst frames of ``staged`` (``MqttPort.stage``'s entries, each perhaps with more fields after its
    four): ``(frames, src, general, names)``, a frame ``(topic bytes, partition, flag, 0, start in src, length,
    CRC-32)`` per entry over ``src``, their data back to back; ``general`` the indexes of those whose data and topic
    pass ``largest`` bytes (the burst writer does not take them), ``names`` each metaq topic's ASCII bytes. A topic
    is a str (TypeError otherwise). ``metaq.native._bytes``'s ``mqtt_burst_frames`` is this function in C (the tests
    hold the two equal)."""
    names, frames, datas, general = {}, [], [], []
    at = 0
    for k, entry in enumerate(staged):
        topic, partition, flag, data = entry[0], entry[1], entry[2], entry[3]
        tb = names.get(topic)
        if tb is None:
            if not isinstance(topic, str):
                raise TypeError("mqtt_burst_frames: entry %d's topic is %s, not str"
                                % (k, type(topic).__name__))
            tb = names[topic] = topic.encode("ascii")
        n = len(data)
        if n + len(tb) > largest:
            general.append(k)
        frames.append((tb, partition, flag, 0, at, n, zlib.crc32(data)))
        datas.append(data)
        at += n
    return frames, b"".join(datas), general, names


burst_frames = load("mqtt_burst_frames", burst_frames_py)


def session_positions(client_id, cursors, flying, at_ms):
    """A persistent session's ``Position`` per partition it reads: ``cursors`` {(topic, partition): next offset},
    ``flying`` the (topic, partition) of each message in flight (counted per partition), ``at_ms`` its last record's
    time (None: connected)."""
    counts = {}
    for key in flying:
        key = tuple(key)
        counts[key] = counts.get(key, 0) + 1
    return [Position(client_id, "mqtt_session", t, p, o, at_ms, counts.get((t, p), 0)) for (t, p), o in cursors.items()]


class MqttPort:
    """See the module doc."""

    #: ``burst_frames``: the store's burst frames of staged PUBLISHes (``write_burst``'s first step; a connection's
    #: one-step turn makes them itself, ``publishes.plain_turn``).
    frames_of = staticmethod(burst_frames)

    def __init__(self, core, settings, store, put_path, guard, waiters, max_transfer, is_master=lambda: True,
                 master_reference=lambda: None, master_refusal=lambda: None, unconfirmable=lambda: None, cluster=None):
        self.core = core
        self.settings = settings  # the ``mqtt:`` section
        self.store = store
        self.put_path = put_path
        self.guard = guard
        self.waiters = waiters
        self.max_transfer = max_transfer
        self.listener = None
        self.topics = settings.topics()  # MQTT topic names -> metaq topics (``topicmap.TopicMap``), one decision
        self.decoded = Decoded(self.topics)  # records decoded, QoS 0 PUBLISHes encoded, once for all their subscribers
        self.fanouts = Fanouts(store, waiters, self.decoded, max_transfer)  # one reader per partition for many
        self.waiting = {}  # (topic, partition) -> the Deliveries waiting on it now (``deliver_now``)
        #: the deliveries of ``waiting`` served from a publisher's turn (``direct.WaitingDeliveries``: its ``serve``
        #: is what the put path's wake runs first, compiled where built)
        self.serving = direct.WaitingDeliveries(self.waiting, self.fanouts.readers, self._keep_decoded,
                                                mqtt_limits.MQTT_DIRECT_DELIVERIES)
        self._clients = {}  # client id -> its Connection
        self.connects = Semaphore(mqtt_limits.MQTT_CONNECTS_AT_ONCE)  # the CONNECTs worked on at once
        self._ids = itertools.count(1)
        self._id_salt = os.urandom(4).hex()
        self.is_master = is_master
        self.master_reference = master_reference  # the master's MQTT address when known (ha: auto), else None
        self.master_refusal = master_refusal  # why this master may not acknowledge writes now (lease, isolation, sync)
        #: why this master may write nothing now for want of a member to confirm it (``sync``: no in-sync member), or
        #: None: no other member serves in its place, so it serves no CONNECT at all (``unavailable``)
        self.unconfirmable = unconfirmable
        self._fenced = None  # True: keeps no session or will now (session_refusal); None: not looked yet
        self.table = replay(store)  # the persistent sessions the log holds
        self.table.connections_ended()
        #: client ids whose sessions this broker did not get from a CONNECT to itself since it began serving as
        #: master (``recovered``): those loaded from the log at the start, made again at a promotion from the table
        #: the slave learned (``role_changed``); a CONNECT claiming one removes it. Only shrinks between the two, so
        #: bounded by the sessions the table held at the start or the last promotion
        self._recovered = set(self.table.sessions)
        #: client ids whose session here a Clean Start 1 CONNECT began (``began_clean``): each leaves when nothing
        #: holds its id here any more (``release``, ``end_session``), so bounded by the ids held
        self._began_clean = set()
        self._live = {}  # client id -> the MqttSession of a connected persistent session
        self._handed = {}  # client id -> the SavedSession a taken-over connection left to the one taking it over
        self._groups = {}  # (share name, filter) -> SharedGroup
        self.floor = MovingFloor(store, lambda: self.table.floor())
        self.follow = JournalFollow(store, MQTT_JOURNAL, lambda position, _flag, data: self.table.apply(position, data),
                                    self._relearn, self.floor, MQTT_LEARN_BATCH)
        self.follow.replicating = not is_master()
        #: how far into the sessions' log a retained record may lie (what the cluster's follows need not read past)
        self.retained_mark = RetainedMark()
        self._mark_began()
        store.follower.add(self.follow, store.written_position)
        self._keeper = None
        #: the wills (``wills.Wills``): published, held for their delay, kept in the sessions' log, tried again
        self.wills = Wills(settings, self.put, self.made_visible, put_path.check_writable, self._write,
                           lambda: self.table.wills, guard.acting_for, self.holds_will, self.session_refusal,
                           self.wait_followed, self._id_salt)
        self._unconfirmable_since = None  # when this master began to be unable to confirm a write (``_check_role``)
        self._refused_meanwhile = False  # it kept no session for a while: the wills left meanwhile are adopted after
        self.sessions_expired = 0
        self.records_written = 0  # %MQTT% records this broker wrote since its start
        #: the cluster's copies the deliveries' cursors passed from the turn that wrote them (``serve_copies``), and
        #: the inbox records the deliveries read back from the log
        self.copies_served_direct = self.copies_read_back = 0
        #: the seam with the MQTT cluster (``seam.Alone``'s methods): made last, from the port and what it serves the
        #: cluster's copies with (``serve_copies``), by ``cluster`` (a member's: ``metaq.mqttcluster.seam``), else a
        #: broker alone's
        self.cluster = Alone() if cluster is None else cluster(self, self.serve_copies, self.retained_mark.end)
        #: the peers following this broker, served from a publisher's turn (alone: none, nothing called)
        self.serving.follows = None if cluster is None else self.cluster.serve_follows
        self.cluster_topics = self.cluster.topics  # what every subscription reads besides its own (the inbox)

    @property
    def closing(self):
        return self.core.closing

    @property
    def port(self):
        return self.listener.port if self.listener is not None else None

    def listen(self, host, port):
        self.listener = self.core.listen("mqtt", host, port, self._connection)
        self._keeper = gevent.spawn(self._keep)
        return self.listener

    def _connection(self, sock, address, conn_id):
        return Connection(sock, address, conn_id, self)

    def connection_count(self):
        return sum(self.core.count(name) for name in LISTENERS)

    # -- client identifiers ----------------------------------------------------

    def assign_id(self):
        """A client identifier for a CONNECT with an empty one, unique among the connected (MQTT 5.0
        [MQTT-3.2.2-16])."""
        while True:
            client_id = "metaq-%s-%d" % (self._id_salt, next(self._ids))
            if client_id not in self._clients:
                return client_id

    def claim(self, conn, client_id, clean_start):
        """``conn`` now holds ``client_id``: an earlier connection with it is taken over (closed, its will published
        unless the new connection resumes the session before its delay: ``clean_start`` false), and a will held for
        its delay is published now (``clean_start``: the old session ended) or dropped (resumed). With
        authentication on, a client id held by another user's connection (or will) is not taken: returns why (None:
        claimed), so that one user cannot close another's devices or drop their wills."""
        refusal = self._held_by_another(conn.session.user, client_id)
        if refusal is not None:
            self.cluster.finished(client_id)
            return refusal
        self._take_from(conn, client_id, clean_start)
        if clean_start:
            self._began_clean.add(client_id)
        elif client_id not in self._clients and client_id not in self.table.sessions:
            self._began_clean.discard(client_id)  # a Clean Start 0 CONNECT holding nothing here begins a session
        self._clients[client_id] = conn
        self._recovered.discard(client_id)
        return None

    def _take_from(self, conn, client_id, clean_start):
        """What holds ``client_id`` here gives way to ``conn`` (None: a connection on another broker of the
        cluster): the connection holding it is taken over, the wills as ``claim`` says (``Wills.taken_over``)."""
        old = self._clients.get(client_id)
        lost = old.take_over() if old is not None and old is not conn else None
        self.wills.taken_over(client_id, clean_start, lost)

    def _held_by_another(self, user, client_id):
        if not self.guard.enabled:
            return None
        old = self._clients.get(client_id)
        held = self.wills.delayed_security(client_id)
        owner = old.session.user if old is not None else held.user if held is not None else user
        saved = self.table.sessions.get(client_id)
        if owner == user and saved is not None and saved.user != user:
            owner = saved.user  # an offline session is its user's too
        if owner != user:
            return "client identifier %s is held by another user's connection" % client_id
        return None

    def join_cluster(self, client_id, clean_start, user):
        """Before ``claim``: in an MQTT cluster, once this broker's peers follow it (``wait_followed``: what the
        client publishes then reaches their subscribers), ``client_id`` registered with its home broker and its
        session brought from the broker holding it (the seam's ``join``). None: go on; else ``(reason code, why)``."""
        self.cluster.wait_followed()
        return self.cluster.join(client_id, clean_start, user)

    def give_up(self, client_id, clean_start, user):
        """Another broker of the cluster takes ``client_id`` over (``metaq.mqttcluster``): the connection holding
        it here is taken over as by ``claim`` (MQTT 5: DISCONNECT 0x8E; its will as on one broker) and the session
        kept here ends in this broker's sessions' log. Returns ``(refusal, SavedSession or None)``: the session as
        it stood, to carry on over there (None: none, or ``clean_start``, which ends it); a refusal (held by
        another user, authentication on) changes nothing."""
        refusal = self._held_by_another(user, client_id) if user is not None else None
        if refusal is not None:
            return refusal, None
        self._take_from(None, client_id, clean_start)
        self._clients.pop(client_id, None)  # its connection ends on its own; this id is not held here any more
        handed = self._handed.pop(client_id, None)
        saved = handed if handed is not None else self.table.sessions.get(client_id)
        self.end_session(client_id)
        return None, None if clean_start else saved

    def carry(self, client_id, metaq_topic, flag, data):
        """Write a message a session brings from another broker (``follow.encode_carried``) to the sessions' log:
        its offset there, or None when it could not be written (logged)."""
        r = self._put(client_id, encode_carried(metaq_topic, flag, data), None, now_ms())
        return None if r is None else r.offset

    def adopt(self, saved):
        """A session taken over from another broker: written to the sessions' log and handed to the CONNECT that
        asked for it (``resume``), as a takeover on this broker hands one on. The record (and the messages it
        carried, written before it) is waited for as a PUBACK waits (``PutPath.durable``: flushed with ``sync``
        flush, held by the slave with ``sync`` replication) before the CONNACK: the broker it came from ended it."""
        self._handed[saved.client_id] = saved
        now = now_ms()
        r = self._put(saved.client_id, encode(saved), None, now)
        if r is None:
            return
        cuts = self.store.log_cuts  # nothing yielded since the write
        if self.put_path.ack_mode(MQTT_SESSIONS_TOPIC, r, now) != ACK_NOW:
            try:
                self.put_path.durable(MQTT_SESSIONS_TOPIC, r.partition, r.log_end, now, cuts)
            except errors.MetaqError as exc:
                log.warning("mqtt client %s: the session it brought was written but may not be counted on: %s",
                            saved.client_id, exc)

    def holding(self):
        """The client ids this broker holds: its connections' and the persistent sessions it keeps."""
        return set(self._clients) | set(self.table.sessions)

    def connected_ids(self):
        """The client ids of this broker's open connections (a list: a copy); one closing is left out, so that a
        lease lapse closes and counts it once (``ClientIds``' ``mqtt_cluster_lease_closed``)."""
        return [client_id for client_id, conn in self._clients.items() if not conn.closed]

    def lease_lost(self, client_ids, why):
        """In an MQTT cluster, this broker may not keep the connections of ``client_ids`` (their home's lease ran out:
        ``ClientIds``): each is closed as a deposed master's are (``Connection.move_away``), its session kept here;
        other greenlets run between the closes (``share_loop``)."""
        turn = time.monotonic()
        for client_id in client_ids:
            conn = self._clients.get(client_id)
            if conn is not None:
                conn.move_away(None, why)
            turn = share_loop(turn)

    def recovered(self, client_id):
        """True while what holds ``client_id`` here is a session loaded from the sessions' log at this broker's
        start, or learned as a slave and taken over at its promotion, that no connection claimed since: in an MQTT
        cluster, a copy from before a restart or a failover, which gives way to one another broker held live
        meanwhile (``metaq.mqttcluster.clientids.ids.HomeRegistry.hold``)."""
        return client_id in self._recovered and client_id in self.table.sessions and client_id not in self._clients

    def began_clean(self, client_id):
        """True while what holds ``client_id`` here was begun by a Clean Start 1 CONNECT to this broker (since its
        start; later Clean Start 0 CONNECTs continued it): in an MQTT cluster, a copy elsewhere that gives way to it
        ended when that CONNECT came, so its pending will is due (``ClientIds._drop``). False: begun by a Clean
        Start 0 CONNECT, or taken over from another broker, or recovered (``recovered`` tells those apart)."""
        return client_id in self._began_clean and self.holds_any(client_id)

    def holds(self, client_id):
        """True while a connection holds ``client_id``."""
        return client_id in self._clients

    def holds_any(self, client_id):
        """True while a connection or a kept session holds ``client_id`` here."""
        return client_id in self._clients or client_id in self.table.sessions

    def release(self, conn, client_id):
        if self._clients.get(client_id) is conn:
            del self._clients[client_id]
            if client_id not in self.table.sessions:
                self._began_clean.discard(client_id)
                self.cluster.released(client_id)

    # -- persistent sessions ---------------------------------------------------

    def resume(self, client_id, clean_start, persistent=True):
        """The saved session a CONNECT resumes: the one a connection it took over handed on (``taken_over``), else
        the log's (None: none, or ``clean_start``, which ends a saved one). One resumed by a connection it ends with
        (``persistent`` false: MQTT 5 Session Expiry Interval 0) leaves the log now: that connection alone holds
        it, and it ends with it however the connection ends, a takeover too (MQTT 5.0 §3.1.4: the original session
        ends on the takeover), a restart or a failover. So no later CONNECT resumes the state from before what that
        connection acknowledged."""
        self.cluster.finished(client_id)  # claimed: a takeover from another broker may go on
        handed = self._handed.pop(client_id, None)  # newer than its record, which may not have been written
        saved = handed if handed is not None else self.table.sessions.get(client_id)
        if saved is None:
            return None
        if clean_start or not persistent:
            self.end_session(client_id)
        return None if clean_start else saved

    def save(self, session, connected=True):
        """Write ``session``'s whole state to the sessions' log (page cache: a kill -9 keeps it); returns the log end
        after its record, or None when it could not be written (logged: the session lives on in memory)."""
        return self._write(session.client_id, encode(session.saved(now_ms(), connected)), session)

    def end_session(self, client_id):
        """End ``client_id``'s saved session (Clean Start, expiry, the offline bound)."""
        self._recovered.discard(client_id)
        if client_id not in self._clients:
            self._began_clean.discard(client_id)
        if client_id in self.table.sessions:
            self._write(client_id, encode_end(client_id))
            if client_id not in self._clients:
                self.cluster.released(client_id)

    def save_first(self, session):
        """Write ``session`` (as ``save``) before the client is told what depends on the record (a QoS 2 PUBLISH, the
        PUBREL of its PUBREC): what that waits for, as ``PutPath.durable`` and ``Acknowledgements.queue`` take it,
        ``(topic, PutResult, now, cuts)``, so that with ``sync`` replication (or flush) the client learns it only
        once the slave (or the disk) holds the record and a failover finds it; None: no wait (``async`` modes, or
        the record was not written)."""
        now = now_ms()
        r = self._put(session.client_id, encode(session.saved(now, True)), session, now)
        if r is None:
            return None
        cuts = self.store.log_cuts  # nothing yielded since the write
        return None if self.put_path.ack_mode(MQTT_SESSIONS_TOPIC, r, now) == ACK_NOW else \
            (MQTT_SESSIONS_TOPIC, r, now, cuts)

    def _write(self, client_id, data, session=None):
        r = self._put(client_id, data, session, now_ms())
        return None if r is None else r.log_end

    def _put(self, client_id, data, session, now):
        """Write one record of the sessions' log (a master's); its PutResult, or None when it was not written."""
        if not self.is_master():
            return None
        if len(data) > mqtt_limits.MQTT_MAX_SESSION_RECORD_BYTES:
            log.warning("mqtt client %s: its session needs a record of %d bytes, past %d "
                        "(MQTT_MAX_SESSION_RECORD_BYTES): not saved", client_id, len(data),
                        mqtt_limits.MQTT_MAX_SESSION_RECORD_BYTES)
            return None
        try:
            self.put_path.check_writable()
            r = self.put_path.append_journal(MQTT_SESSIONS_TOPIC, 0, data, now)
        except errors.MetaqError as exc:
            log.warning("mqtt client %s: its session was not saved: %s", client_id, exc)
            return None
        self.records_written += 1
        if is_retained_record(data):  # before anything yields: no follow reads past it unread
            self.retained_mark.written(r.offset)
        self.table.apply(r.log_end - 1, data)  # a position inside the record: retention keeps its segment
        if session is not None:
            session.dirty = False
        self.made_visible(MQTT_SESSIONS_TOPIC, r, now)
        return r

    def connected(self, session):
        """A persistent session's connection began: written (connected), kept for the periodic saves."""
        self._live[session.client_id] = session
        self.save(session)

    def went_offline(self, session):
        """A persistent session's connection ended: its last state written; past ``mqtt.max_offline_sessions``
        the session offline longest ends."""
        if self._live.get(session.client_id) is session:
            del self._live[session.client_id]
        self.save(session, connected=False)
        for client_id in self.table.offline_past(self.settings.max_offline_sessions):
            log.info("mqtt client %s: its session ends: %d sessions offline is the limit (mqtt.max_offline_sessions)",
                     client_id, self.settings.max_offline_sessions)
            self.end_session(client_id)

    def taken_over(self, session):
        """A persistent session's connection was taken over: written as ``went_offline`` writes it, and handed in
        memory to the connection taking it over (``resume``), which so goes on from what the old one acknowledged
        even when its record could not be written (past ``MQTT_MAX_SESSION_RECORD_BYTES``, a refused write)."""
        self.went_offline(session)
        self._handed[session.client_id] = session.saved(now_ms(), False)

    def _keep(self):
        """Every ``MQTT_ROLE_CHECK_S``: whether this broker may keep sessions and wills (``_check_role``); every
        ``MQTT_SESSION_SAVE_INTERVAL_S`` while it may: the connected persistent sessions that changed are written,
        the offline ones past their expiry or age end, records too far behind the log end are written again."""
        saved_at = time.monotonic()
        while not self.closing:
            gevent.sleep(mqtt_limits.MQTT_ROLE_CHECK_S)
            try:
                if not self._check_role():
                    continue
                self.wills.due()
                if time.monotonic() - saved_at < mqtt_limits.MQTT_SESSION_SAVE_INTERVAL_S:
                    continue
                saved_at = time.monotonic()
                self._keep_once()
            except Exception:  # noqa: BLE001 - the keeper must go on
                log.exception("mqtt: keeping the sessions failed")

    def session_refusal(self):
        """Why this broker may not keep MQTT sessions and wills now, or None: only a master that may acknowledge
        writes does (a slave writes no session record; a master whose lease ran out or that is isolated could not
        save them, and the member elected in its place goes on from what it last saved; a ``sync`` master with no
        member to confirm a write could save nothing either)."""
        if not self.is_master():
            return "this broker is a replication slave"
        return self.master_refusal()

    def unavailable(self):
        """Why this broker serves no CONNECT at all now, or None: a master that may write nothing for want of a
        member to confirm it (``sync``, no in-sync member). No other member serves in its place, and nothing
        reaches its devices (its peers' copies are writes too), so a device is told Server unavailable rather
        than served a session that is not saved and a subscription that gets nothing."""
        return self.unconfirmable() if self.is_master() else None

    def _check_role(self):
        """One look at ``session_refusal``: when this broker stops keeping sessions, the connections holding a
        persistent session or a will are closed (``Connection.move_away``); when it starts (its start as master, a
        promotion, the end of a fencing), it publishes the wills left in the log (``Wills.adopt_next``). True while it
        keeps sessions. A master that only may confirm no write (``unavailable``: a ``sync`` slave restarting, out
        of sync for a while) refuses new CONNECTs at once but closes its connections only once that lasted
        ``mqtt.unconfirmable_grace_s`` (``unconfirmable_grace``), so that a routine slave restart closes no device."""
        refusal = self.session_refusal()
        if refusal is not None:
            self._refused_meanwhile = True
            if self._fenced is not True and not self.unconfirmable_grace():
                self._fenced = True
                self._move_away(refusal, self.unavailable() is not None)
            return False
        self._unconfirmable_since = None
        if self._fenced is not False or self._refused_meanwhile:
            self._refused_meanwhile = False
            if self._fenced is not False:
                self.cluster.hold()  # in a cluster, until the peers follow this broker again (``MqttCluster.hold``)
            self._fenced = False
            self.wills.adopt_next()  # the wills of the connections that ended meanwhile were left in the log
        return True

    def unconfirmable_grace(self):
        """True while this master may confirm no write (``unavailable``) for less than ``mqtt.unconfirmable_grace_s``:
        its connections stay open meanwhile; any other reason to keep no session (a slave, a lease run out,
        isolation) ends the grace at once."""
        if self.unavailable() is None or self.master_refusal() != self.unconfirmable():
            self._unconfirmable_since = None
            return False
        now = time.monotonic()
        if self._unconfirmable_since is None:
            self._unconfirmable_since = now
        return now - self._unconfirmable_since < self.settings.unconfirmable_grace_s

    def _move_away(self, refusal, unconfirmable):
        """The connections holding a persistent session or a will closed (``Connection.move_away``). ``unconfirmable``:
        this broker stays master and closed them itself, their clients were not lost: their wills wait for them to
        come back (``Wills.mark_moved``). A deposed master's are the next master's, which publishes them as lost."""
        reference = self.master_reference()
        moved = [conn for conn in list(self._clients.values()) if conn.keeps_state()]
        if moved:
            log.warning("mqtt: %d connections with a persistent session or a will closed: this broker keeps no "
                        "session now (%s)%s", len(moved), refusal, "; master named: %s" % reference if reference
                        else "")
        for conn in moved:
            if unconfirmable and conn.will_origin is not None:
                self.wills.mark_moved(conn.will_origin)
            conn.move_away(reference)

    def _keep_once(self):
        """One round of ``_keep``: other greenlets run between its writes (``share_loop``), and each write is checked
        against the table again, so a session that changed meanwhile is not written back as it was. Each kind of
        record is kept by its own step, in this order: live sessions changed, offline sessions expired, shared
        groups changed or ended, then the records left too far behind the log's end written again."""
        turn = time.monotonic()
        turn = self._save_changed_sessions(turn)
        turn = self._expire_sessions(turn)
        turn = self._save_groups(turn)
        behind = self.store.written_position - min(mqtt_limits.MQTT_SESSION_REWRITE_BYTES,
                                                   self.store.config.segment_size)
        turn = self._rewrite_groups(behind, turn)
        turn = self._rewrite_share_histories(behind, turn)
        turn = self._rewrite_retained(behind, turn)
        turn = self._rewrite_wills(behind, turn)
        self._rewrite_sessions(behind, turn)

    def _save_changed_sessions(self, turn):
        """The live sessions changed since their last record saved (``_keep_once``'s steps take and return the
        turn ``share_loop`` goes on with)."""
        for session in list(self._live.values()):
            if session.dirty and self._live.get(session.client_id) is session:
                self.save(session)
                turn = share_loop(turn)
        return turn

    def _expire_sessions(self, turn):
        """The offline sessions past their expiry (or ``mqtt.offline_session_max_age_s``) ended."""
        now = now_ms()
        table = self.table
        for saved in table.offline():
            if saved.expired(now, self.settings.offline_session_max_age_s) and \
                    table.sessions.get(saved.client_id) is saved and not saved.connected:
                log.info("mqtt client %s: its session expired", saved.client_id)
                self.sessions_expired += 1
                self.end_session(saved.client_id)
                turn = share_loop(turn)
        return turn

    def _save_groups(self, turn):
        """The shared groups some session holds saved when changed; those none holds any more ended."""
        kept = self._kept_groups()
        for group in list(self._groups.values()):
            if group.dirty and (group.name, group.topic_filter) in kept:
                self._save_group(group)
                turn = share_loop(turn)
        ended = [k for k in self.table.groups if k not in kept and k not in self._groups]
        for key in ended:
            log.info("mqtt: shared group %s of %s: no session holds it any more; its read position ends", *key)
            self._write("$share/%s/%s" % key, encode_group_end(*key))
            turn = share_loop(turn)
        if ended:
            self._groups_changed()
        return turn

    def _rewrite_groups(self, behind, turn):
        """The shared groups' records written before ``behind`` (a log position) written again at the end (a live
        group's as it stands), so that retention can delete the segments below them
        (``limits.MQTT_SESSION_REWRITE_BYTES``)."""
        table = self.table
        for saved_group in list(table.groups.values()):
            if saved_group.position < behind and table.groups.get(saved_group.key) is saved_group:
                live_group = self._groups.get(saved_group.key)
                if live_group is not None:
                    self._save_group(live_group)
                else:
                    self._write("$share/%s/%s" % saved_group.key, encode_group(saved_group))
                turn = share_loop(turn)
        return turn

    def _rewrite_share_histories(self, behind, turn):
        """The groups' assignment histories written before ``behind`` written again (the positions they hold are
        the messages', not their own: a history means the same wherever its record is)."""
        table = self.table
        for h in list(table.shares.values()):
            if h.position < behind and table.shares.get(h.key) is h:
                self._write("$share/%s/%s" % h.key, encode_share_history(h.key, h.changes))
                turn = share_loop(turn)
        return turn

    def _rewrite_retained(self, behind, turn):
        """The retained messages' records written before ``behind`` written again."""
        table = self.table
        for retained in list(table.retained.values()):
            if retained.position < behind and table.retained.get(retained.name) is retained:
                self._write(retained.name, encode_retained(retained))
                turn = share_loop(turn)
        return turn

    def _rewrite_wills(self, behind, turn):
        """The wills' records written before ``behind`` written again."""
        table = self.table
        for w in list(table.wills.values()):
            if w.position < behind and table.wills.get(w.client_id) is w:
                self._write(w.client_id, encode_will(w))
                turn = share_loop(turn)
        return turn

    def _rewrite_sessions(self, behind, turn):
        """The sessions' records written before ``behind`` written again (a live session's as it stands)."""
        table = self.table
        for saved in list(table.sessions.values()):
            if saved.position < behind and table.sessions.get(saved.client_id) is saved:
                live = self._live.get(saved.client_id)
                if live is not None:
                    self.save(live)
                else:
                    self._write(saved.client_id, encode(saved))
                turn = share_loop(turn)
        return turn

    def _relearn(self, upto):
        """The log was cut at ``upto``: the sessions are what the log holds before it."""
        self.table = replay(self.store, upto)
        self.floor.reset()
        self.follow.replicating = not self.is_master()
        self._mark_began()

    def _mark_began(self):
        """``retained_mark`` as this broker begins writing the sessions' log now (a master: what it holds already may
        hold retained records) or begins following another's (a slave)."""
        if self.follow.replicating:
            self.retained_mark.replicating()
        else:
            self.retained_mark.began(self.store.written_offset(MQTT_SESSIONS_TOPIC, 0))

    def role_changed(self, slave_id):
        """A slave made master takes the sessions it learned as its own (every record it holds learned first), each
        ``recovered`` as one loaded at a start is: learned by following or reloaded after a cut, no CONNECT to this
        broker made it, so in an MQTT cluster it gives way to a copy another broker holds live. Only a connection
        still open here began with a Clean Start 1 (``began_clean``): a slave keeps no session, so one its ended
        connection began is not the learned one. A master made slave follows the master's records from the log."""
        if slave_id is None:
            if self.follow.replicating:
                self.store.follow_now(self.follow)
                self.follow.replicating = False
                self._mark_began()
                self.table.connections_ended(self._live)
                self._recovered = set(self.table.sessions)
                self._began_clean.intersection_update(self._clients)
            return
        if not self.follow.replicating:
            self.table = replay(self.store)
            self.follow.position = self.store.written_position
            self.follow.replicating = True
            self._mark_began()

    # -- puts ------------------------------------------------------------------

    def put(self, name, payload, qos, client_id, properties, security, retain=False, decided=None):
        """Store one PUBLISH (or will) of MQTT topic ``name`` as ``security``'s user: ``(metaq topic, PutResult,
        now)``. The write is the put path's one decision (``PutPath.write_refusal``: the user's permission, the
        broker's, the topic's name), the partition the name's (``records.partition_for``). ``retain``: the message
        becomes the name's retained message (an empty payload clears it), within ``mqtt.max_retained`` and
        ``mqtt.max_retained_bytes`` (QuotaExceeded past them, nothing stored); the result's ``log_end`` is then past
        the retained record too, so an acknowledgement waits for both. ``decided``: the metaq topics the decision let
        ``security``'s user write to, a dict of their partition counts, kept by the caller while those decisions
        stand (``PutPath.decision_stands``): not asked again for them; a topic let through is added. A refusal is
        never remembered: each publish it refuses is asked and answered. Raises ``records.RecordRefusal`` or
        MetaqError."""
        topic = placement(self.topics, name)[0]
        partitions = self._decide(topic, security, decided)
        now = now_ms()
        flag, data = record_data(name, payload, qos, client_id, properties, retain, now)
        if retain and payload:
            refusal = self._retained_refusal(name, len(data))
            if refusal is not None:
                raise errors.QuotaExceeded("mqtt.retained", None, None, refusal)
        partition = partition_for(name, partitions)
        r = self.put_path.append(topic, partition, flag, data, now, checked=True)  # asked above, no yield since
        if retain:
            record = encode_retained(Retained(name, topic, flag, data, now)) if payload else encode_unretained(name)
            elsewhere = self.cluster.knows_retained(name)  # a peer's: cleared too
            if not payload:
                self.cluster.local_cleared(name, now)
            if payload or name in self.table.retained or elsewhere:
                end = self._write(name, record)
                if end is not None:
                    r = r._replace(log_end=max(r.log_end, end))
        return topic, r, now

    def _decide(self, topic, security, decided):
        """``topic``'s partition count once the write decision (``PutPath.write_refusal``) lets ``security``'s user
        write to it (raises its refusal, counted as a failed put). ``decided`` (a dict, or None): the topics the
        decision let through, with their partition counts, while the caller's decisions stand (``PutPath
        .decision_stands``: every change of what the decision or the partition count reads moves its version): not
        asked again."""
        if decided is not None:
            partitions = decided.get(topic)
            if partitions is not None:
                return partitions
        exc = self.put_path.write_refusal(topic, security)
        if exc is not None:
            self.put_path.failed(topic, exc)
            raise exc
        partitions = self.store.partitions_of(topic)
        if decided is not None:
            decided[topic] = partitions
        return partitions

    def stage(self, name, payload, qos, client_id, properties, security, decided, now):
        """A PUBLISH of MQTT topic ``name`` (QoS 0 or 1, not retained) made ready for ``write_burst``, nothing stored:
        ``(metaq topic, partition, flag, data)``. The write decision is ``put``'s (asked once per metaq topic while
        ``decided`` holds it, with its partition count; the caller stores the burst before it yields). Raises
        ``records.RecordRefusal`` or MetaqError (a refusal counted as a failed put), as ``put`` does."""
        topic, crc = placement(self.topics, name)
        partitions = self._decide(topic, security, decided)
        flag, data = record_data(name, payload, qos, client_id, properties, False, now)
        return topic, crc % partitions, flag, data

    @property
    def burst_largest(self):
        """A record's most bytes of data and topic the burst writer takes (``burst_frames``' ``largest``: a larger
        one goes through ``PutPath.append``, which refuses it)."""
        return self.store.config.segment_size - FIXED_OVERHEAD

    def write_burst(self, staged, now, runs=None, taken=None):
        """Append ``staged`` (``stage``'s results in the order their PUBLISHes came, each perhaps with fields of the
        caller's after its four; the write decision asked for each since the caller last yielded) as one burst: the
        put path's burst writer (``PutPath.append_burst``: the records ``put`` writes, the positions advanced once
        per run of a partition), each run counted and its topic registered there (``PutPath.counted``); where it
        stops (a partition's first put, the next index file, a segment roll, a record too large) one goes through
        ``PutPath.append`` and the burst resumes. Returns ``(stored, log end, {(topic, partition)}, error)``: the
        first ``stored`` are in the log; ``error`` (None: all stored) is the MetaqError of ``staged[stored]``, which
        and those after it are not stored. ``runs`` (a list, or None): given a ``BurstRun`` per run stored, in
        order (one of a record the general path stored), where ``deliver_now`` finds each record's place in the
        log. ``taken``: the burst writer's first call made and counted already, where it stopped short
        (``publishes.plain_turn``'s ``(frames, src, frames written, log end, keys, runs)``): the burst resumes
        from there. What follows is the put path's ``burst_written`` (``Publishes.flush``)."""
        path = self.put_path
        if taken is not None:  # the burst writer's first call made: it stopped short of the end
            frames, src, i, log_end, keys, written = taken
            n = len(frames)
            if runs is not None:
                runs.extend(written)
            general = [i]
        else:
            # general: indexes of records the burst writer does not take (too large: ``put`` refuses them)
            frames, src, general, _names = burst_frames(staged, self.burst_largest)
            n = len(frames)
            keys = set()
            log_end = i = 0
        if not general:  # the common turn: one call of the burst writer, which mostly takes it whole
            i, written = path.append_burst(frames, src, now)
            counted = path.counted
            for run in written:
                counted(run[0][0], run[1], run[2])
                keys.add(run[0])
            if written:
                log_end = written[-1][6]  # the runs are in log order
                if runs is not None:
                    runs.extend(written)
            if i == n:
                return n, log_end, keys, None
            general = [i]  # it stopped short: this record through the general path, then the burst goes on
        return self._burst_rest(staged, now, runs, frames, src, general, i, log_end, keys)

    def _burst_rest(self, staged, now, runs, frames, src, general, i, log_end, keys):
        """``write_burst`` from ``frames[i]`` on, a record the burst writer does not take or stopped short at: each of
        ``general`` (and ``frames[i]``) through ``PutPath.append``, the burst writer between them; ``log_end`` and
        ``keys`` what is stored before ``i``. Returns what ``write_burst`` returns."""
        path = self.put_path
        counted = path.counted
        n = len(frames)
        for stop in general + [n]:  # each a record the burst writer does not take, or the end
            while i <= stop < n or i < stop:
                if i < stop:
                    taken, written = path.append_burst(frames[i:stop] if i or stop < n else frames, src, now)
                    for run in written:
                        key, count, nbytes, end = run[0], run[1], run[2], run[6]
                        counted(key[0], count, nbytes)
                        keys.add(key)
                        log_end = max(log_end, end)
                    if runs is not None:  # their frame indexes made the burst's
                        runs.extend(w._replace(first_frame=w.first_frame + i) for w in written) if i else \
                            runs.extend(written)
                    i += taken
                    if i == stop == n:
                        break
                # the burst writer stopped short (a partition's first put, the next index file, a segment roll), or
                # this record is one it does not take: this one through the general path, then the burst goes on
                topic, partition, flag, data = staged[i][:4]
                try:
                    r = path.append(topic, partition, flag, data, now, checksum=frames[i][6] & 0x7FFFFFFF,
                                    checked=True)  # the decision was asked at ``stage``, no yield since
                except errors.MetaqError as exc:
                    return i, log_end, keys, exc
                keys.add((topic, partition))
                log_end = max(log_end, r.log_end)
                if runs is not None:
                    runs.append(BurstRun((topic, partition), 1, len(data), r.msg_id, r.offset, i, r.log_end))
                i += 1
        return n, log_end, keys, None

    def deliver_now(self, keys, staged, runs, client_id, now):
        """A burst just appended to partitions ``keys`` and made visible (``staged`` and ``runs``: ``write_burst``'s)
        served from the publisher's turn to the deliveries waiting on it (``serving.serve``: ``direct.serve_waiting``,
        at most ``limits.MQTT_DIRECT_DELIVERIES``): the messages neither read back from the log nor decoded, the
        subscriber's wake saved; the others are kept decoded for their readers (``_keep_decoded``). Returns ``{key:
        events}``, the waits the append's wake passes over. The publisher's turns hand the put path ``serving.serve``
        itself."""
        return self.serving.serve(keys, staged, runs, client_id, now)

    def serve_copies(self, copies):
        """The MQTT cluster's copies just written to the inbox and made visible (``copies``: ``direct.serve_copies``'
        form, the bytes the cluster's turn holds), served from that turn to the deliveries waiting on them (at most
        ``limits.MQTT_DIRECT_DELIVERIES``) as a publisher's burst is (``deliver_now``): each copy decoded once, none
        read back from the log, the subscriber's wake saved. Returns ``{key: events}``, the waits the append's wake
        passes over."""
        quiet, served = direct.serve_copies(self.waiting, self.decoded, mqtt_limits.MQTT_DIRECT_DELIVERIES, copies)
        self.copies_served_direct += served
        return quiet

    def _keep_decoded(self, key, kruns, staged, client_id, now, made):
        """Keep the messages of partition ``key``'s runs ``kruns`` of the burst (``deliver_now``'s; ``made``: those
        made already) decoded for the readers of the log that come after."""
        records = made.get(key)
        if records is None:
            records = direct.staged_messages(staged, kruns, client_id, now)
        keep = self.decoded.keep
        for _offset, dkey, m in records:
            keep(dkey, m)

    def burst_durable(self, keys, log_end, now, cuts=None):
        """Block (the acknowledgement writer's greenlet) until a burst ending at ``log_end``, which ``PutPath
        .burst_written`` followed, may be acknowledged (``PutPath.settle``; ``cuts``: its ``since``); raises its
        MetaqError."""
        self.put_path.settle(log_end, cuts)

    def _retained_refusal(self, name, size):
        """Why one more retained message of ``size`` bytes for ``name`` is not kept (None: it is)."""
        s, table = self.settings, self.table
        old = table.retained.get(name)
        if old is None and len(table.retained) >= s.max_retained:
            return "%d retained messages is the limit (mqtt.max_retained)" % s.max_retained
        if table.retained_bytes - (len(old.data) if old is not None else 0) + size > s.max_retained_bytes:
            return ("retained messages of %d bytes together is the limit (mqtt.max_retained_bytes)"
                    % s.max_retained_bytes)
        return None

    # -- shared subscriptions --------------------------------------------------

    def join_group(self, member, name, topic_filter, topics, start):
        """``member`` joins shared group ``name`` of ``topic_filter``: returns its ``SharedGroup``; a new group reads
        ``topics`` from ``start(topic, partition)`` (the end of the log)."""
        key = (name, topic_filter)
        group = self._groups.get(key)
        if group is None:
            saved = self.table.groups.get(key)  # kept while a member's session existed: it goes on from there
            if saved is not None:
                topics = saved.topics
            topics = set(topics) | set(self.cluster_topics)  # in a cluster, what the peers assign it (group_takes)
            group = self._groups[key] = SharedGroup(name, topic_filter, topics)
            for topic in topics:
                try:
                    partitions = self.store.partitions_of(topic)
                except errors.MetaqError:
                    continue
                for p in range(partitions):
                    at = saved.cursors.get((topic, p)) if saved is not None else None
                    group.cursors[(topic, p)] = start(topic, p) if at is None else at
        group.members.setdefault(member, min(group.members.values(), default=0))
        self._groups_changed()
        return group

    def leave_group(self, member, group):
        """``member`` leaves ``group``; the group leaves memory with its last member, its read positions written
        when a session holding one of its subscriptions exists (it goes on from them when a member comes back)."""
        group.members.pop(member, None)
        key = (group.name, group.topic_filter)
        if not group.members and self._groups.get(key) is group:
            del self._groups[key]
            if key in self._kept_groups():
                self._save_group(group)
        self._groups_changed()

    def _groups_changed(self):
        """In a cluster, the groups here go in the route (``MqttCluster.groups_changed``)."""
        self.cluster.groups_changed(self.group_weights())

    def group_weights(self):
        """{(share name, filter): its members here} of the shared groups with members here, and 0 for each group
        kept here with none (a persistent member away): in a cluster, what this broker's route says of its groups, so
        that a group with no member connected anywhere is kept for the members that come back."""
        out = {key: len(g.members) for key, g in self._groups.items() if g.members}
        out.update((key, 0) for key in self.table.groups if key not in out)
        return out

    def group_takes(self, group, topic, partition, rec, m):
        """True when ``group``'s member here takes record ``rec`` (message ``m``) of ``topic``-``partition``: its
        name matches the group's filter and, in a cluster, the group takes it here: a record of this broker when
        the cluster assigns that partition here (``Shares.takes``, by the record's place in the log), a copy in the
        inbox when the peer assigned it to this group (``inbox.groups_of``)."""
        if not matches(group.topic_filter, m.topic):
            return False
        return self.cluster.group_takes((group.name, group.topic_filter), topic, partition, rec)

    def share_histories(self):
        """The ``$share`` groups' assignment histories the sessions' log holds ((share name, filter) ->
        ``ShareHistory``; a slave's: its master's, as copied): what
        ``metaq.mqttcluster.sharing.share.Shares`` assigns by."""
        return self.table.shares

    def record_share_history(self, key, changes):
        """Write group ``key``'s assignment history ``changes`` (None: it ends; a last change whose since is None
        starts at this record) to the sessions' log, at once (before any message it assigns); the log's end after the
        record, None when not written (only a master that may write)."""
        data = encode_share_history_end(key) if changes is None else encode_share_history(key, changes)
        return self._write("$share/%s/%s" % key, data)

    def _save_group(self, group):
        g = SavedGroup(group.name, group.topic_filter, group.topics, group.cursors, now_ms())
        if self._write("$share/%s/%s" % g.key, encode_group(g)) is not None:
            group.dirty = False

    def _kept_groups(self):
        """The shared groups (name, filter) some session in the sessions' table holds a subscription of."""
        out = set()
        for saved in self.table.sessions.values():
            for entry in saved.shared:
                try:
                    share, inner = split_shared(entry[0])
                except TopicError:
                    continue
                if share is not None:
                    out.add((share, inner))
        return out

    def retained_for(self, topic_filter, topics):
        """The retained messages whose name ``topic_filter`` matches, of the metaq topics in ``topics`` (in a
        cluster, the peers' too: ``PeerRetained.merged``)."""
        local = [r for r in self.table.retained.values() if r.metaq_topic in topics and matches(topic_filter, r.name)]
        return self.cluster.retained_for(topic_filter, topics, local)

    def subscribed_filters(self):
        """Every filter a session of this broker holds, connected or not (shared ones not): the cluster's route."""
        for conn in list(self._clients.values()):
            session = conn.mqtt
            if session is not None:
                yield from session.subscriptions
        for client_id, saved in list(self.table.sessions.items()):
            if client_id not in self._clients:
                for entry in saved.subscriptions:
                    yield entry[0]

    def routes_changed(self, topic_filter):
        """A subscription of ``topic_filter`` was made: the cluster's route holds it from now on."""
        self.cluster.routes_changed(topic_filter)

    def made_visible(self, topic, result, now):
        """A put nobody waits for (QoS 0, a will): what follows it is the put path's (``PutPath.ack_mode``: visible
        now with ``async`` flush, at the flush it asks for with ``sync``)."""
        self.put_path.ack_mode(topic, result, now)

    def holds_will(self, client_id, origin):
        """True while a connection here holds ``client_id`` with the will ``origin`` (``SavedWill.origin``)."""
        conn = self._clients.get(client_id)
        return conn is not None and conn.will_origin == origin

    def wait_followed(self):
        """In an MQTT cluster, until this broker's peers follow it (``MqttCluster.wait_followed``); else at once."""
        self.cluster.wait_followed()

    def positions(self):
        """Where every shared group and persistent session is (``stats groups``: ``metaq.groups.lag.Position``): a
        ``$share`` group (kind ``mqtt_shared``, named ``$share/<name>/<filter>``) at its cursors, in memory while it
        has members, else as the sessions' log keeps them; a persistent session (kind ``mqtt_session``, named by its
        client id) at its cursors, connected (in memory) or offline (its last record, ``committed_ms`` when that was
        written), with its messages in flight per partition."""
        out = []
        groups = {key: (g.cursors, None) for key, g in self._groups.items()}
        for key, saved in self.table.groups.items():
            groups.setdefault(key, (saved.cursors, saved.at_ms))
        for key, (cursors, at_ms) in groups.items():
            name = "$share/%s/%s" % key
            out.extend(Position(name, "mqtt_shared", t, p, o, at_ms) for (t, p), o in cursors.items())
        sessions = {cid: (s.cursors, [w[1:3] for w in s.where.values()], None) for cid, s in self._live.items()}
        for cid, saved in self.table.sessions.items():
            sessions.setdefault(cid, (saved.cursors, [i[3:5] for i in saved.inflight], saved.at_ms))
        for cid, (cursors, flying, at_ms) in sessions.items():
            out.extend(session_positions(cid, cursors, flying, at_ms))
        return out

    def summary_values(self):
        """The ``stats`` summary's MQTT pairs: the port, its connections, the wills published since the start and
        those waiting for their delay, the cluster's copies served from the turn that wrote them and those read back
        from the inbox (none alone); in an MQTT cluster, the cluster's (the seam's ``summary_values``)."""
        return [("mqtt_port", self.port or 0), ("mqtt_connections", self.connection_count()),
                ("mqtt_wills_published", self.wills.published_count),
                ("mqtt_delayed_wills", self.wills.delayed_count()),
                ("mqtt_sessions", len(self.table.sessions)), ("mqtt_sessions_offline", self.table.offline_count()),
                ("mqtt_sessions_expired", self.sessions_expired), ("mqtt_retained", len(self.table.retained)),
                ("mqtt_retained_bytes", self.table.retained_bytes), ("mqtt_shared_groups", len(self._groups)),
                ("mqtt_shared_groups_kept", len(self.table.groups)),
                ("mqtt_session_records", self.records_written),
                ("mqtt_copies_served_direct", self.copies_served_direct),
                ("mqtt_copies_read_back", self.copies_read_back)] + self.cluster.summary_values()

    def stop(self, grace_s):
        """The broker stops (called while it may still write, before a master hands its leadership over): its MQTT
        connections are closed (a busy one given ``grace_s`` to finish) and end as a network failure would (their
        wills published, their sessions written); the persistent sessions' last state is written; the wills held
        for their delay are published now (a will's delay does not outlive the broker)."""
        if self._keeper is not None:
            self._keeper.kill(block=False)
        self.wills.stop()
        close_with_grace([c for name in LISTENERS for c in self.core.connections(name)], grace_s)
        deadline = time.monotonic() + grace_s
        while self.connection_count() and time.monotonic() < deadline:  # their ends: wills and sessions written
            gevent.sleep(0.01)
        for session in list(self._live.values()):
            self.went_offline(session)
        kept = self._kept_groups()
        for group in list(self._groups.values()):
            if (group.name, group.topic_filter) in kept:
                self._save_group(group)
        self.wills.publish_held()

