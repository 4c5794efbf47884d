"""Master→slave replication over our own stream (``metaq.protocol.replication``; DESIGN §8).

Master: ``ReplicationServer`` listens on ``replication.port``; each slave
connection sends HELLO (its own log end and epoch history); the master answers
EPOCHS (the position up to which the two logs agree, ``store.epochs.
agreed_position``, and its own history), then streams its commit log from
that position in DATA frames (``MessageStore.read_log``: up to the flushed end
in ``async`` mode, the written end in ``sync`` mode), HEARTBEATs its ends and
message count, and reads the slave's ACKs. In ``sync`` mode a put is
acknowledged only once some slave's ACK covers the put's log end
(``wait_replicated``).

Slave: ``SlaveLink`` connects to ``replication.slave_of``, HELLOs, cuts its log
to the agreed position if it ends past it (logging what it cut: a tail its
master never had), takes the master's epoch history, appends every DATA with
``append_replicated`` at the same positions, records the master's later epochs
as its copy reaches them, flushes per its store's flush mode and ACKs. Any
error or disconnection: it closes and reconnects with a backoff, always
resuming from its own end.

The cut runs on the event loop (with the store's background work held off by
``broker.store_lock``), not in a thread: no read may see the cut range while it
goes, and it happens once per divergence (a rejoining old master), costing one
checkpoint fsync.
"""

import logging
import socket
import time

import gevent
from gevent.event import Event
from gevent.server import StreamServer

from metaq import errors, limits
from metaq.protocol import replication as rp
from metaq.store.epochs import agreed_position
from metaq.store.replica import ReplicationRefused

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
#: While streaming, a heartbeat (the master's ends and message count) goes out this often: the slave's lag figures
#: are at most this old when the master dies.
HEARTBEAT_BUSY_S = 0.1
POLL_S = 0.02
HELLO_TIMEOUT_S = 10.0
#: A link that hears nothing (no DATA, no HEARTBEAT) for this long is considered dead.
LINK_TIMEOUT_S = 10.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0
RECV_BYTES = 1 << 20

#: MetaQ-style status codes sent in ERROR frames.
ERR_REFUSED = 409


def now_ms():
    return int(time.time() * 1000)


def _send_event(sock, event):
    for part in rp.frame_parts(event):
        sock.sendall(part)


class SlaveState:
    """What the master knows about one connected slave."""

    def __init__(self, slave_id, address, start):
        self.slave_id = slave_id
        self.address = address
        self.sent = start
        self.written = start
        self.durable = start
        self.connected_at = time.time()


class ReplicationServer:
    """The master's side: one greenlet pair (sender, ack reader) per connected slave."""

    def __init__(self, broker):
        self.broker = broker
        self.store = broker.store
        rcfg = broker.config.replication
        self.mode = rcfg.mode
        self.sync_timeout_s = rcfg.sync_timeout_ms / 1000.0
        self.upto = "written" if self.mode == "sync" else "flushed"
        self.host = broker.config.broker.host
        self.port = rcfg.port
        self.slaves = {}  # id(conn state) -> SlaveState
        self._data = Event()  # new log bytes may be there
        self._acked = Event()  # replaced on each ACK; sync-mode puts wait on it
        self._server = None

    def start(self):
        self._server = StreamServer((self.host, self.port), self._handle, backlog=64)
        self._server.start()
        self.port = self._server.server_port
        log.info("replication (%s mode) listening on %s:%d", self.mode, self.host, self.port)

    def stop(self):
        if self._server is not None:
            self._server.stop(timeout=1.0)

    def notify(self):
        """New bytes were written or flushed: wake the senders."""
        self._data.set()

    # -- sync mode ---------------------------------------------------------

    def best_acked(self):
        return max((s.written for s in self.slaves.values()), default=-1)

    def wait_replicated(self, pos):
        """Block this greenlet until a slave's ACK covers ``pos``; Unavailable otherwise."""
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

    def _on_ack(self):
        done, self._acked = self._acked, Event()
        done.set()

    # -- one slave -----------------------------------------------------------

    def _handle(self, sock, address):
        peer = "%s:%d" % address[:2]
        parser = rp.ReplicationParser()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = self._read_hello(sock, parser)
            if hello is None:
                return
            refusal, agreed = self._check_hello(hello)
            if refusal is not None:
                log.warning("replication: refusing slave %d from %s: %s", hello.slave_id, peer, refusal)
                _send_event(sock, rp.ErrorFrame(ERR_REFUSED, refusal))
                return
            store = self.store
            _send_event(sock, rp.Epochs(agreed, store.written_position, tuple(store.epochs.entries)))
            state = SlaveState(hello.slave_id, peer, agreed)
            self.slaves[id(state)] = state
            log.info("replication: slave %d connected from %s: its log ends at %d, ours at %d, they agree up to %d%s",
                     hello.slave_id, peer, hello.start_position, store.written_position, agreed,
                     "" if agreed == hello.start_position else
                     " (it cuts the %d bytes after that)" % (hello.start_position - agreed))
            reader = gevent.spawn(self._read_acks, sock, parser, state)
            try:
                self._send_loop(sock, state, reader)
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

    def _read_hello(self, sock, parser):
        sock.settimeout(HELLO_TIMEOUT_S)
        while True:
            event = parser.next_event()
            if isinstance(event, rp.Hello):
                sock.settimeout(None)
                return event
            if event is rp.CLOSED:
                return None
            if event is not rp.NEED_DATA:
                raise errors.RemoteProtocolError("expected HELLO, got %s" % type(event).__name__, fatal=True)
            try:
                parser.receive_data(sock.recv(65536))
            except TimeoutError:
                return None

    def _check_hello(self, hello):
        """``(refusal or None, agreed position)`` for a slave's HELLO."""
        cfg, store = self.broker.config, self.store
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
        return None, agreed

    def _send_loop(self, sock, state, reader):
        store = self.store
        last_hb = 0.0
        while not reader.dead and not self.broker.stopping:
            view, nxt = store.read_log(state.sent, limits.REPLICATION_READ_BYTES, self.upto)
            if len(view):
                _send_event(sock, rp.Data(state.sent, view))
                view.release()
                state.sent = nxt
                now = time.monotonic()
                if now - last_hb >= HEARTBEAT_BUSY_S:
                    _send_event(sock, self._heartbeat())
                    last_hb = now
                gevent.sleep(0)  # a far-behind slave must not starve the clients
                continue
            if nxt != state.sent:  # an empty blank tail: move on
                state.sent = nxt
                continue
            now = time.monotonic()
            if now - last_hb >= (HEARTBEAT_S if state.sent >= store.written_position else HEARTBEAT_BUSY_S):
                _send_event(sock, self._heartbeat())
                last_hb = now
            self._data.clear()
            self._data.wait(POLL_S)

    def _end(self):
        return self.store.written_position if self.upto == "written" else self.store.flushed_position

    def _heartbeat(self):
        store = self.store
        return rp.Heartbeat(self._end(), store.written_position, store.appended_messages())

    def _read_acks(self, sock, parser, state):
        while True:
            event = parser.next_event()
            if event is rp.NEED_DATA:
                data = sock.recv(65536)
                parser.receive_data(data)
                continue
            if event is rp.CLOSED:
                return
            if isinstance(event, rp.Ack):
                state.written = max(state.written, event.written_position)
                state.durable = max(state.durable, event.durable_position)
                self._on_ack()
            elif isinstance(event, rp.ErrorFrame):
                log.warning("replication: slave %d reports error %d: %s", state.slave_id, event.code, event.text)
                return

    def stats_lines(self):
        lines = ["replication_port %d" % (self.port or 0), "replication_mode %s" % self.mode,
                 "replication_slaves %d" % len(self.slaves)]
        end = self._end()
        for s in sorted(self.slaves.values(), key=lambda s: s.slave_id):
            lines.append("replication_slave%d %s acked %d durable %d lag_bytes %d"
                         % (s.slave_id, s.address, s.written, s.durable, max(0, end - s.written)))
        return lines


class SlaveLink:
    """The slave's side: keep one link to the master, agree on where the logs agree, copy its log, ACK."""

    def __init__(self, broker, master=None, slave_id=None):
        self.broker = broker
        self.store = broker.store
        rcfg = broker.config.replication
        self.master = master or rcfg.slave_of
        host, _sep, port = self.master.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.slave_id = slave_id if slave_id is not None else rcfg.slave_id
        self.sync_flush = broker.config.store.flush == "sync"
        self.connected = False
        self.master_end = None  # the master's replicable end, last heard
        self.master_written = None  # its written end, last heard (what "caught up" means)
        self.master_count = None  # messages in its log up to that end
        self.last_error = None
        self.connects = 0
        self.handshakes = 0
        self.cut_bytes = 0
        self.pending_epochs = []  # the master's entries past our end: recorded as our copy reaches them
        self._pool = gevent.get_hub().threadpool
        self._sock = None
        self._greenlet = None
        self._stopping = False

    @property
    def lag_bytes(self):
        """The master's written end (last heard) minus ours; -1 before the first contact."""
        if self.master_written is None:
            return -1
        return max(0, self.master_written - self.store.written_position)

    @property
    def lag_messages(self):
        """Messages the master had (last heard) that we do not; -1 before the first contact."""
        if self.master_count is None:
            return -1
        return max(0, self.master_count - self.store.appended_messages())

    def caught_up(self):
        return self.master_written is not None and self.store.written_position >= self.master_written

    def start(self):
        self._greenlet = gevent.spawn(self._run)

    def stop(self):
        self._stopping = True
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=2.0)

    def _run(self):
        delay = BACKOFF_MIN_S
        while not self._stopping:
            started = time.monotonic()
            try:
                self._session()
            except (OSError, errors.MetaqError) as exc:
                self.last_error = str(exc)
                if self.connected:
                    log.warning("replication link to master %s lost: %s; reconnecting", self.master, exc)
                else:
                    log.info("replication: cannot reach master %s: %s; retrying in %.1f s", self.master, exc, delay)
            finally:
                self.connected = False
                if self._sock is not None:
                    try:
                        self._sock.close()
                    except OSError:
                        pass
                    self._sock = None
            if self._stopping:
                return
            if time.monotonic() - started > 5.0:
                delay = BACKOFF_MIN_S
            gevent.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _session(self):
        sock = self._sock = socket.create_connection((self.host, self.port), timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(LINK_TIMEOUT_S)
        store = self.store
        cfg = self.broker.config
        start = store.written_position
        _send_event(sock, rp.Hello(self.slave_id, cfg.broker.id, cfg.store.segment_size, start,
                                   tuple(store.epochs.entries)))
        parser = rp.ReplicationParser()
        self._handshake(self._next_event(sock, parser))
        self.connected = True
        self.connects += 1
        self.last_error = None
        log.info("replication link to master %s up: slave %d resuming from position %d (epoch %d)", self.master,
                 self.slave_id, store.written_position, store.epochs.epoch)
        while not self._stopping:
            event = self._next_event(sock, parser)
            if isinstance(event, rp.Data):
                self._append(sock, event)
            elif isinstance(event, rp.Heartbeat):
                self.master_end, self.master_written, self.master_count = event
                _send_event(sock, rp.Ack(self.slave_id, store.written_position, store.flushed_position))
            else:
                raise errors.RemoteProtocolError("unexpected %s from the master" % type(event).__name__, fatal=True)

    def _next_event(self, sock, parser):
        while True:
            event = parser.next_event()
            if event is rp.NEED_DATA:
                parser.receive_data(sock.recv(RECV_BYTES))  # socket.timeout (an OSError) when the master is silent
                continue
            if event is rp.CLOSED:
                raise ConnectionError("the master closed the replication link")
            if isinstance(event, rp.ErrorFrame):
                raise errors.Unavailable("the master refused replication (%d): %s" % (event.code, event.text))
            return event

    def _handshake(self, event):
        """The master's EPOCHS: cut our log where the two agree, take its epoch history."""
        if not isinstance(event, rp.Epochs):
            raise errors.RemoteProtocolError("expected EPOCHS, got %s" % type(event).__name__, fatal=True)
        store = self.store
        end, agreed = store.written_position, event.agreed_position
        if agreed > end:
            raise errors.RemoteProtocolError("the master says our logs agree up to %d, past our end %d"
                                             % (agreed, end), fatal=True)
        if agreed < end:
            self._cut(agreed, event)
        self.pending_epochs = self._pool.apply(store.epochs.adopt, (event.epochs, agreed))
        self.master_written = max(self.master_written or 0, event.master_end)
        self.handshakes += 1
        if self.broker.read_refusal is not None:
            self.broker.read_refusal = None
            log.info("replication: epoch handshake with master %s done (log end %d, epoch %d): serving reads",
                     self.master, store.written_position, store.epochs.epoch)

    def _cut(self, position, event):
        store, broker = self.store, self.broker
        ours = list(store.epochs.entries)
        broker.flusher.wait_flushed(store.written_position)  # no flush of the range in flight
        with broker.store_lock:  # nor a checkpoint or a segment built ahead
            report = store.truncate_log(position, now_ms())
        self.cut_bytes += report.bytes
        per_partition = ", ".join("%s-%d: %d messages" % (t, p, n) for (t, p), (n, _b) in
                                  sorted(report.partitions.items())) or "no messages"
        log.warning("replication: epoch handshake with master %s: the logs agree up to position %d; CUT our tail "
                    "of %d bytes, %d messages (%s) that the master never had (our epochs %s, the master's %s)",
                    self.master, position, report.bytes, report.records, per_partition, ours, list(event.epochs))
        broker.waiters.notify_all()

    def _append(self, sock, event):
        store, broker = self.store, self.broker
        before = len(store.known_topics()) if broker.registry is not None else 0
        try:
            end = store.append_replicated(event.position, event.data, now_ms(), self.broker.config.store.segment_size)
        except ReplicationRefused as exc:
            log.error("replication: refused a chunk at position %d: %s", event.position, exc)
            raise
        if self.master_end is None or end > self.master_end:
            self.master_end = end
        if self.master_written is None or end > self.master_written:
            self.master_written = end
        while self.pending_epochs and self.pending_epochs[0][1] <= end:
            epoch, start = self.pending_epochs.pop(0)
            self._pool.apply(store.epochs.learn, (epoch, start))
            log.info("replication: our copy reached epoch %d of the master (from position %d)", epoch, start)
        if self.sync_flush:
            broker.flusher.wait_flushed(end)
        else:
            broker.waiters.notify_all()
            if store.should_flush(now_ms()):
                broker.flusher.wake()
        if broker.registry is not None and len(store.known_topics()) != before:
            for topic in store.known_topics():
                broker.registry.topic_created(topic)
        _send_event(sock, rp.Ack(self.slave_id, store.written_position, store.flushed_position))

    def stats_lines(self):
        return ["replication_master %s" % self.master,
                "replication_slave_id %d" % self.slave_id,
                "replication_link %s" % ("connected" if self.connected else "down"),
                "replication_lag_bytes %d" % self.lag_bytes,
                "replication_lag_messages %d" % self.lag_messages,
                "replication_caught_up %s" % ("true" if self.caught_up() else "false"),
                "replication_connects %d" % self.connects,
                "replication_cut_bytes %d" % self.cut_bytes]
