"""The master's side of replication: the replication port, one sender and one ack reader per slave."""

import logging
import time

import gevent
from gevent.event import Event

from metaq import errors
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.server.replication import limits as replication_limits
from metaq.protocol import replication as rp
from metaq.protocol.stats import ReplicaRow, format_replica
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.serving import connections as core
from metaq.serving.replication import handshake
from metaq.protocol.replication_offsets import frames as offsets_frames
from metaq.protocol import replication_topics as topics_codec
from metaq.serving.replication.link import (ERR_REFUSED, HEARTBEAT_BUSY_S, HEARTBEAT_S, OFFSETS_SYNC_S, POLL_S,
                                           send_event)
from metaq.store.epochs import agreed_position
from metaq.store.replica import ReplicationRefused

log = logging.getLogger(__name__)


class SlaveState:
    """What the master knows about one connected slave."""

    def __init__(self, slave_id, address, start):
        self.slave_id = slave_id
        self.address = address
        self.sent = start
        self.written = start
        self.durable = start
        self.connected_at = time.time()
        self.offsets_version = None  # the consumer-offset version last sent; None: the whole table is still due
        self.topics_version = None  # (the topic table's version, the topic owners') last sent (topics/table.py)
        self.offsets_due = time.monotonic() + OFFSETS_SYNC_S  # the next send, at the latest


class ReplicationServer:
    """The master's side: one greenlet pair (sender, ack reader) per connected slave."""

    def __init__(self, core_, store, config, secret=None, insync=None):
        """``secret``: the replication secret (bytes) slaves must prove, or None (``handshake``); ``insync``:
        an elected master's ``InSyncSet`` (ha: auto): sync puts then wait for every member, not any one slave."""
        self.core = core_
        self.insync = insync
        self.secret = secret
        self.store = store
        self.config = config
        rcfg = config.replication
        self.mode = rcfg.mode
        self.sync_timeout_s = rcfg.sync_timeout_ms / 1000.0
        self.upto = "written" if self.mode == "sync" else "flushed"
        self.host = config.broker.host
        self.port = rcfg.port
        self.slaves = {}  # id(conn state) -> SlaveState
        self.heard_at = None  # when any slave last sent an ACK (monotonic); None: none since this server started
        self.isolation_s = config.max_isolation_ms() / 1000.0  # 0: no bound (isolation.py)
        #: an idle link's heartbeat (each one ACKed): a quarter of max_isolation_ms at most, so a live slave is
        #: always heard within that bound
        self.heartbeat_s = min(HEARTBEAT_S, self.isolation_s / 4.0) if self.isolation_s else HEARTBEAT_S
        #: ``serve(sock, parser, first frame, peer)``: serves another master of an MQTT cluster whose first frame
        #: after its proof is ROUTES (its follow) or PEER_CALL (its calls) instead of a slave's HELLO
        #: (``metaq.mqttcluster.serve.PeerServer``, which dispatches by that frame); None: such a peer is refused
        self.peer_handler = None
        self._data = Event()  # new log bytes may be there
        self._acked = Event()  # replaced on each ACK; sync-mode puts wait on it
        self._confirmed_end = -1  # confirmed_end's high-water mark
        self.listener = None
        self.strangers = self.rules = None  # set at ``start``
        self._stopping = False

    def start(self):
        rules = self.core.rules
        #: connections that have not proved the secret yet: a share of the headroom apart (``SlaveConnection``)
        self.strangers = core.Strangers(replication_limits.REPLICATION_PROOF_TIMEOUT_S,
                                        replication_limits.REPLICATION_STRANGERS,
                                        replication_limits.REPLICATION_STRANGERS_PER_ADDRESS, by_share=True)
        self.rules = core.ConnectionLimits(rules.idle_s, rules.request_s, rules.reply_bytes, strangers=self.strangers)
        self.listener = self.core.listen("replication", self.host, self.port, self._connection, backlog=64,
                                         headroom=self.config.replication_headroom(), guarded=False, server_first=True,
                                         strangers=self.strangers)
        self.port = self.listener.port
        log.info("replication (%s mode) listening on %s:%d, %s", self.mode, self.host, self.port,
                 "slaves must prove the replication secret" if self.secret is not None else
                 "no replication secret (any peer that reaches the port may replicate)")

    def stop(self):
        """Stop serving slaves. Not at the start of a shutdown: they keep getting what the finishing requests
        write (the broker stops replication after its connections have closed)."""
        self._stopping = True
        if self.listener is not None:
            self.core.close_listener(self.listener)

    def notify(self):
        """New bytes were written or flushed: wake the senders."""
        self._data.set()

    # -- sync mode ---------------------------------------------------------

    def best_acked(self):
        return max((s.written for s in self.slaves.values()), default=-1)

    def positions(self):
        """Connected slaves' confirmed (written) positions by slave id (the best link of each id)."""
        out = {}
        for s in self.slaves.values():
            out[s.slave_id] = max(out.get(s.slave_id, -1), s.written)
        return out

    def confirmed_end(self):
        """``sync`` mode: the log position up to which every record is on each slave a put waits for (with an in-sync
        set: every member of it; else the best slave), never moving back. A record past it is an unconfirmed tail
        that the member elected after a kill may not hold and then overwrites: what leaves this broker for another
        (the MQTT cluster's peers) stops there. None: no such bound (``async``, or an in-sync set of this master
        alone, when no other member may be elected)."""
        if self.mode != "sync":
            return None
        if self.insync is not None:
            need = self.insync.required()
            if not need:
                return None
            positions = self.positions()
            end = min(positions.get(m, -1) for m in need)
        else:
            end = self.best_acked()
        self._confirmed_end = max(self._confirmed_end, end)
        return self._confirmed_end

    def wait_confirmed(self, timeout):
        """Block this greenlet until the next slave ACK or ``timeout`` s."""
        self._data.set()
        self._acked.wait(timeout)

    def no_slave_refusal(self):
        """Why a ``sync`` put must be refused before it is written, or None: no slave could confirm it now (manual
        mode: none connected; ``ha: auto``: the in-sync set holds no slave). Writing it anyway would end in
        ``SLAVE_NOT_AVAILABLE`` with the message stored, and a client that retries would store it again. A slave
        lost while a put waits is ``wait_replicated``'s to answer (written, not confirmed)."""
        if self.mode != "sync":
            return None
        if self.insync is not None:
            if self.insync.required():
                return None
            return ("SLAVE_NOT_AVAILABLE: replication mode is sync and no slave is in sync with this master (ha: "
                    "auto): nothing was stored; retry once a slave is back in sync")
        if self.slaves:
            return None
        return ("SLAVE_NOT_AVAILABLE: replication mode is sync and no slave is connected: nothing was stored; retry "
                "once a slave is connected")

    def no_slave_short(self):
        """``no_slave_refusal`` in a few words (``Roles.writable``), or None when a sync put may be confirmed."""
        if self.no_slave_refusal() is None:
            return None
        return "sync: no in-sync member" if self.insync is not None else "sync: no slave connected"

    def wait_replicated(self, pos):
        """Block this greenlet until a slave's ACK covers ``pos`` (with an in-sync set: every member's);
        Unavailable otherwise."""
        if self.insync is not None:
            return self._wait_insync(pos)
        if not self.slaves:
            raise errors.Unavailable("SLAVE_NOT_AVAILABLE: replication mode is sync and no slave is connected; "
                                     "the message was written on the master but is not confirmed by a slave")
        self._data.set()
        deadline = time.monotonic() + self.sync_timeout_s
        while self.best_acked() < pos:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.Unavailable(
                    "FLUSH_SLAVE_TIMEOUT: no slave confirmed the message within %d ms (replication mode sync); "
                    "it was written on the master but is not confirmed by a slave" % (self.sync_timeout_s * 1000))
            if not self.slaves:
                raise errors.Unavailable("SLAVE_NOT_AVAILABLE: the slave disconnected before confirming the message "
                                         "(replication mode sync); it was written on the master only")
            self._acked.wait(min(remaining, 0.5))

    def _wait_insync(self, pos):
        insync = self.insync
        self._data.set()
        deadline = time.monotonic() + self.sync_timeout_s
        while not insync.confirmed(pos, self.positions()):
            if not insync.required():
                raise errors.Unavailable(
                    "SLAVE_NOT_AVAILABLE: replication mode is sync and no slave is in sync with this master (ha: "
                    "auto); the message was written on the master but is not confirmed by a slave")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                behind = sorted(m for m, p in self.positions().items() if m in insync.required() and p < pos)
                raise errors.Unavailable(
                    "FLUSH_SLAVE_TIMEOUT: the in-sync slaves %s did not all confirm the message within %d ms "
                    "(replication mode sync, ha: auto); it was written on the master but is not confirmed"
                    % (behind or sorted(insync.required()), self.sync_timeout_s * 1000))
            self._acked.wait(min(remaining, 0.5))
        insync.acknowledged(pos)

    def changed(self):
        """The in-sync set changed: sync puts look again at whom they wait for."""
        self._on_ack()

    def _on_ack(self):
        done, self._acked = self._acked, Event()
        done.set()

    # -- one slave -----------------------------------------------------------

    def _connection(self, sock, address, conn_id):
        return SlaveConnection(self, sock, address, conn_id)

    def serve_slave(self, sock, address, conn=None):
        """One slave's connection, from its HELLO to its end (``conn``: its connection on the core, whose
        per-address share a proved peer master leaves for ``MQTT_CLUSTER_PEERS_PER_ADDRESS``; it counts among the
        port's strangers until its proof checked out). Before that only the handshake's small frames are read
        (``REPLICATION_HANDSHAKE_FRAME_BYTES``)."""
        peer = "%s:%d" % address[:2]
        parser = rp.ReplicationParser(max_frame=replication_limits.REPLICATION_HANDSHAKE_FRAME_BYTES)
        try:
            shaken = self._handshake(sock, parser, address, peer)
            if shaken is None:
                return
            hello, slave_nonce, master_nonce = shaken
            parser.max_frame = None
            if conn is not None:
                conn.logged_in()  # proved: it leaves the strangers' count and deadline
            if isinstance(hello, (rp.Routes, rp.PeerCall)):  # another master of an MQTT cluster, not a slave
                if conn is not None and not self.core.reshare(conn, "replication peers",
                                                              mqttcluster_limits.MQTT_CLUSTER_PEERS_PER_ADDRESS):
                    why = "too many peer brokers from %s: the limit is %d per address" % (
                        address[0], mqttcluster_limits.MQTT_CLUSTER_PEERS_PER_ADDRESS)
                    log.warning("replication: refusing peer broker %d from %s: %s", hello.broker_id, peer, why)
                    send_event(sock, rp.ErrorFrame(ERR_REFUSED, why))
                    return
                send_event(sock, handshake.callee_proof(self.secret, master_nonce, slave_nonce, hello.broker_id))
                self.peer_handler(sock, parser, hello, peer)  # its MQTT follow, or its calls
                return
            refusal, agreed = self._check_hello(hello)
            if refusal is not None:
                log.warning("replication: refusing slave %d from %s: %s", hello.slave_id, peer, refusal)
                send_event(sock, rp.ErrorFrame(ERR_REFUSED, refusal))
                return
            send_event(sock, handshake.master_proof(self.secret, master_nonce, slave_nonce, hello.slave_id))
            store = self.store
            send_event(sock, rp.Epochs(agreed, store.written_position, tuple(store.epochs.entries)))
            state = SlaveState(hello.slave_id, peer, agreed)
            self.slaves[id(state)] = state
            log.info("replication: slave %d connected from %s: its log ends at %d, ours at %d, they agree up to %d%s",
                     hello.slave_id, peer, hello.start_position, store.written_position, agreed,
                     "" if agreed == hello.start_position else
                     " (it cuts the %d bytes after that)" % (hello.start_position - agreed))
            reader = gevent.spawn(self._read_acks, sock, parser, state)
            try:
                self._send_loop(sock, state, reader)
            except errors.CorruptRecord as exc:  # never shipped: the slave holds everything before it
                log.error("replication: slave %d (%s) cannot copy past commit-log position %s: %s",
                          state.slave_id, peer, exc.position, exc)
                send_event(sock, rp.ErrorFrame(exc.code, str(exc)))
            finally:
                reader.kill(block=False)
                self.slaves.pop(id(state), None)
                self._on_ack()
                log.info("replication: slave %d (%s) disconnected at position %d", state.slave_id, peer,
                         state.written)
        except (OSError, errors.RemoteProtocolError) as exc:
            log.info("replication: connection from %s ended: %s", peer, exc)
        finally:
            try:
                sock.close()
            except OSError:
                pass

    def _handshake(self, sock, parser, address, peer):
        """CHALLENGE; the slave's PROOF and HELLO, checked (``handshake``): ``(hello, slave nonce, master
        nonce)``, or None when the connection is to close (the reason logged, and sent in an ERROR when it is the
        slave's fault). All of it within REPLICATION_PROOF_TIMEOUT_S: nothing of the log leaves before."""
        deadline = time.monotonic() + replication_limits.REPLICATION_PROOF_TIMEOUT_S
        challenge = handshake.challenge(self.secret)
        try:
            send_event(sock, challenge)
            proof = self._expect(sock, parser, deadline, rp.Proof, peer)
            hello = self._expect(sock, parser, deadline, (rp.Hello, rp.Routes, rp.PeerCall), peer) \
                if proof is not None else None
        except errors.RemoteProtocolError as exc:
            log.warning("replication: refusing %s: bad handshake: %s", peer, exc)
            send_event(sock, rp.ErrorFrame(ERR_REFUSED, "bad replication handshake: %s" % exc))
            return None
        if hello is None:
            return None
        if isinstance(hello, (rp.Routes, rp.PeerCall)):  # a peer broker's MQTT follow or its calls: one proof
            who = "peer broker %d" % hello.broker_id
            refusal = handshake.check_peer(self.secret, challenge.nonce, proof, hello.broker_id)
            if refusal is None and self.peer_handler is None:
                refusal = "this broker serves no MQTT cluster peer (it has no MQTT port or no ZooKeeper)"
        else:
            who = "slave %d" % hello.slave_id
            refusal = handshake.check_slave(self.secret, challenge.nonce, proof, hello)
        if refusal is not None:
            guard = self.core.guard
            delay = guard.failed(address[0]) if guard is not None else 0.0
            log.warning("replication: refusing %s from %s before any log byte: %s", who, peer, refusal)
            if delay:
                gevent.sleep(delay)  # a guesser is slowed (the guard counts failures per address)
            send_event(sock, rp.ErrorFrame(errors.Unauthenticated.code, refusal))
            return None
        sock.settimeout(None)
        return hello, proof.nonce, challenge.nonce

    @staticmethod
    def _expect(sock, parser, deadline, kind, peer):
        """The next event, of type ``kind``; None when the peer closed, went silent past ``deadline`` or sent an
        ERROR (logged); RemoteProtocolError for anything else."""
        while True:
            event = parser.next_event()
            if isinstance(event, kind):
                return event
            if event is CLOSED:
                log.info("replication: %s closed the connection during the handshake", peer)
                return None
            if isinstance(event, rp.ErrorFrame):
                log.warning("replication: the slave at %s gave up the handshake (%d): %s", peer, event.code,
                            event.text)
                return None
            if event is not NEED_DATA:
                raise errors.RemoteProtocolError("expected %s, got %s" % (_names(kind),
                                                                          type(event).__name__.upper()), fatal=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.info("replication: %s did not finish the handshake within %.0f s; closing", peer,
                         replication_limits.REPLICATION_PROOF_TIMEOUT_S)
                return None
            sock.settimeout(remaining)
            try:
                parser.receive_data(sock.recv(65536))
            except TimeoutError:
                continue  # the deadline check above ends it

    def _check_hello(self, hello):
        """``(refusal or None, agreed position)`` for a slave's HELLO."""
        cfg, store = self.config, self.store
        if hello.broker_id != cfg.broker.id:
            return "broker id mismatch: this master is broker %d, the slave is configured as %d" % (
                cfg.broker.id, hello.broker_id), None
        if hello.segment_size != cfg.store.segment_size:
            return "segment size mismatch: the master uses %d-byte segments, the slave %d" % (
                cfg.store.segment_size, hello.segment_size), None
        agreed = agreed_position(store.epochs.entries, store.written_position, hello.epochs, hello.start_position)
        if agreed is None:
            return ("the slave's epoch history %s shares no epoch with this master's %s: the logs are unrelated; "
                    "reseed the slave from a copy of the master's data directory"
                    % (list(hello.epochs), store.epochs.entries)), None
        try:
            store.read_log(agreed, 1, self.upto)
        except errors.Moved as exc:
            return "position %d is below this master's log start %d (retention removed it): reseed the slave" % (
                agreed, exc.offset), None
        except ReplicationRefused as exc:
            return "position %d is not a record boundary of this master's log (%s)" % (agreed, exc), None
        except errors.CorruptRecord:
            pass  # a boundary all the same: the send loop ends the link there, naming the record
        return None, agreed

    def _send_loop(self, sock, state, reader):
        store = self.store
        last_hb = 0.0
        while not reader.dead and not self._stopping:
            view, nxt = store.read_log(state.sent, replication_limits.REPLICATION_READ_BYTES, self.upto)
            if len(view):
                send_event(sock, rp.Data(state.sent, view))
                view.release()
                state.sent = nxt
                now = time.monotonic()
                if now - last_hb >= HEARTBEAT_BUSY_S:
                    send_event(sock, self._heartbeat())
                    last_hb = now
                if now >= state.offsets_due:
                    self._send_offsets(sock, state, now)
                gevent.sleep(0)  # a far-behind slave must not starve the clients
                continue
            if nxt != state.sent:  # an empty blank tail: move on
                state.sent = nxt
                continue
            now = time.monotonic()
            if self._send_topics(sock, state):
                continue
            if now >= state.offsets_due or state.offsets_version is None:  # caught up: the whole table at once
                self._send_offsets(sock, state, now)
                continue  # it yielded: look at the log again before waiting for news of it
            if now - last_hb >= (self.heartbeat_s if state.sent >= store.written_position else HEARTBEAT_BUSY_S):
                send_event(sock, self._heartbeat())
                last_hb = now
            self._data.clear()
            self._data.wait(POLL_S)

    def _send_topics(self, sock, state):
        """The topic table and its topics' owners, when either changed since this link last sent them, and not
        while both are empty (a master without them sends what slaves from before TOPICS read). True if sent."""
        table = self.store.topics.table
        owners_version, owners = self.store.owned_topics()
        groups = self.store.groups  # the group settings (groups/table.py), once changed
        version = (table.version, owners_version, groups.version)
        if state.topics_version == version or not (table.entries or table.deleted or owners or groups.version):
            return False
        state.topics_version = version
        group_table = groups.to_json() if groups.version else None
        try:
            event = topics_codec.encode(table.to_json(), owners, group_table)
        except ValueError as exc:  # owners past what the frame holds (MAX_TOPIC_TABLE_BYTES): the table alone
            log.warning("replication: the topic owners are not sent to slave %s (%s): a promoted slave would not "
                        "count them", state.slave_id, exc)
            try:
                event = topics_codec.encode(table.to_json(), (), group_table)
            except ValueError:
                log.warning("replication: the group settings are not sent to slave %s: with the topic table they "
                            "pass MAX_TOPIC_TABLE_BYTES", state.slave_id)
                event = rp.Topics(table.encode())
        send_event(sock, event)
        return True

    def _send_offsets(self, sock, state, now):
        """The consumer offsets this link has not carried: the whole table the first time, then what changed; each
        entry with its owner (a frame with none owned goes in the form slaves from before owners read)."""
        state.offsets_due = now + OFFSETS_SYNC_S
        offsets = self.store.consumer_offsets
        if state.offsets_version is None:
            version, rows = offsets.snapshot(owners=True)
        else:
            rows, version = offsets.changes(state.offsets_version, owners=True)
        for event in offsets_frames(rows, snapshot=state.offsets_version is None):
            send_event(sock, event)  # encoding a full frame takes milliseconds: the clients go between frames
            gevent.sleep(0)
        state.offsets_version = version

    def _end(self):
        return self.store.written_position if self.upto == "written" else self.store.flushed_position

    def _heartbeat(self):
        store = self.store
        return rp.Heartbeat(self._end(), store.written_position, store.appended_messages())

    def _read_acks(self, sock, parser, state):
        """The slave's ACKs until the link ends. An ACK past what this link has sent, or durable past
        written, is a lie (it would acknowledge sync puts no replica holds): the link is closed."""
        try:
            while True:
                event = parser.next_event()
                if event is NEED_DATA:
                    parser.receive_data(sock.recv(65536))
                    continue
                if event is CLOSED:
                    return
                if isinstance(event, rp.Ack):
                    if event.written_position > state.sent or event.durable_position > event.written_position:
                        log.warning("replication: slave %d (%s) acked written %d, durable %d, but this link has "
                                    "sent up to %d; closing the link", state.slave_id, state.address,
                                    event.written_position, event.durable_position, state.sent)
                        return
                    self.heard_at = time.monotonic()
                    state.written = max(state.written, event.written_position)
                    state.durable = max(state.durable, event.durable_position)
                    self._on_ack()
                elif isinstance(event, rp.ErrorFrame):
                    log.warning("replication: slave %d reports error %d: %s", state.slave_id, event.code,
                                event.text)
                    return
                else:
                    log.warning("replication: slave %d (%s) sent %s, not an ACK; closing the link",
                                state.slave_id, state.address, type(event).__name__)
                    return
        except (OSError, errors.RemoteProtocolError) as exc:
            log.info("replication: link to slave %d (%s) ended: %s", state.slave_id, state.address, exc)

    def stats_values(self):
        """The master's ``stats`` summary ``(key, value)`` pairs, one ``replication_slave<N>`` per slave."""
        values = [("replication_port", self.port or 0), ("replication_mode", self.mode),
                  ("replication_slaves", len(self.slaves))]
        if self.strangers is not None:  # connections not proved yet, and those closed to make room for a newcomer
            values += [("replication_strangers", self.strangers.count),
                       ("replication_strangers_evicted", self.strangers.evicted)]
        end = self._end()
        for s in sorted(self.slaves.values(), key=lambda s: s.slave_id):
            row = ReplicaRow(str(s.address), s.written, s.durable, max(0, end - s.written))
            values.append(("replication_slave%d" % s.slave_id, format_replica(row)))
        return values


def _names(kind):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__.upper() for k in kinds)


class SlaveConnection(core.Connection):
    """A slave's connection on the replication port (the core's cap, ids and close apply to it too)."""

    log_prefix = "replication"

    def __init__(self, server, sock, address, conn_id):
        super().__init__(sock, address, conn_id, server.rules)
        self.server = server

    def serve(self):
        self.server.serve_slave(self.sock, self.address, self)
