"""Master→slave replication over our own stream (``metaq.protocol.replication``; DESIGN §8).

Master: ``ReplicationServer`` listens on ``replication.port``; each slave
connection sends HELLO (its own log end), then the master streams its commit
log from there in DATA frames (``MessageStore.read_log``: up to the flushed end
in ``async`` mode, the written end in ``sync`` mode), HEARTBEATs its end while
idle, and reads the slave's ACKs. In ``sync`` mode a put is acknowledged only
once some slave's ACK covers the put's log end (``wait_replicated``).

Slave: ``SlaveLink`` connects to ``replication.slave_of``, HELLOs from its own
end, appends every DATA with ``append_replicated`` at the same positions,
flushes per its store's flush mode and ACKs. Any error or disconnection: it
closes and reconnects with a backoff, always resuming from its own end.
"""

import logging
import socket
import time

import gevent
from gevent.event import Event
from gevent.server import StreamServer

from metaq import errors, limits
from metaq.protocol import replication as rp
from metaq.store.replica import ReplicationRefused

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
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
            refusal = self._check_hello(hello)
            if refusal is not None:
                log.warning("replication: refusing slave %d from %s: %s", hello.slave_id, peer, refusal)
                _send_event(sock, rp.ErrorFrame(ERR_REFUSED, refusal))
                return
            state = SlaveState(hello.slave_id, peer, hello.start_position)
            self.slaves[id(state)] = state
            log.info("replication: slave %d connected from %s, starting at position %d (our end %d)",
                     hello.slave_id, peer, hello.start_position, self.store.written_position)
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
        cfg = self.broker.config
        if hello.broker_id != cfg.broker.id:
            return "broker id mismatch: this master is broker %d, the slave is configured as %d" % (
                cfg.broker.id, hello.broker_id)
        if hello.segment_size != cfg.store.segment_size:
            return "segment size mismatch: the master uses %d-byte segments, the slave %d" % (
                cfg.store.segment_size, hello.segment_size)
        if hello.start_position > self.store.written_position:
            return ("the slave's log ends at %d, past this master's end %d: it holds a tail this master never "
                    "had; promotion/rejoin (epoch handshake) is needed" % (
                        hello.start_position, self.store.written_position))
        try:
            self.store.read_log(hello.start_position, 1, self.upto)
        except errors.Moved as exc:
            return "position %d is below this master's log start %d (retention removed it): reseed the slave" % (
                hello.start_position, exc.offset)
        except ReplicationRefused as exc:
            return "position %d is not a record boundary of this master's log (%s)" % (hello.start_position, exc)
        return None

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
                if now - last_hb >= HEARTBEAT_S / 2:
                    _send_event(sock, rp.Heartbeat(self._end()))
                    last_hb = now
                gevent.sleep(0)  # a far-behind slave must not starve the clients
                continue
            if nxt != state.sent:  # an empty blank tail: move on
                state.sent = nxt
                continue
            now = time.monotonic()
            if now - last_hb >= HEARTBEAT_S:
                _send_event(sock, rp.Heartbeat(self._end()))
                last_hb = now
            self._data.clear()
            self._data.wait(POLL_S)

    def _end(self):
        return self.store.written_position if self.upto == "written" else self.store.flushed_position

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
    """The slave's side: keep one link to the master, copy its log, ACK."""

    def __init__(self, broker):
        self.broker = broker
        self.store = broker.store
        rcfg = broker.config.replication
        self.master = rcfg.slave_of
        self.host, self.port = rcfg.master_address()
        self.slave_id = rcfg.slave_id
        self.sync_flush = broker.config.store.flush == "sync"
        self.connected = False
        self.master_end = None
        self.last_error = None
        self.connects = 0
        self._sock = None
        self._greenlet = None
        self._stopping = False

    @property
    def lag_bytes(self):
        if self.master_end is None:
            return -1
        return max(0, self.master_end - self.store.written_position)

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
        _send_event(sock, rp.Hello(self.slave_id, cfg.broker.id, cfg.store.segment_size, start))
        parser = rp.ReplicationParser()
        self.connected = True
        self.connects += 1
        self.last_error = None
        log.info("replication link to master %s up: slave %d resuming from position %d", self.master,
                 self.slave_id, start)
        while not self._stopping:
            event = parser.next_event()
            if event is rp.NEED_DATA:
                data = sock.recv(RECV_BYTES)  # socket.timeout (an OSError) when the master is silent
                parser.receive_data(data)
                continue
            if event is rp.CLOSED:
                raise ConnectionError("the master closed the replication link")
            if isinstance(event, rp.Data):
                self._append(sock, event)
            elif isinstance(event, rp.Heartbeat):
                self.master_end = event.position
                _send_event(sock, rp.Ack(self.slave_id, store.written_position, store.flushed_position))
            elif isinstance(event, rp.ErrorFrame):
                raise errors.Unavailable("the master refused replication (%d): %s" % (event.code, event.text))
            else:
                raise errors.RemoteProtocolError("unexpected %s from the master" % type(event).__name__, fatal=True)

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
                "replication_connects %d" % self.connects]
