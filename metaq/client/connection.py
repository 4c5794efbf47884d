"""One pipelined text-protocol connection per broker, and a pool of them.

``BrokerConnection.request(event)`` assigns the opaque, queues the request's
bytes and returns a ``concurrent.futures.Future`` at once; many requests are in
flight on one socket and replies are matched by opaque.

Threads (plain stdlib, so they are greenlets when an application has
monkey-patched gevent): per connected socket one *writer* that joins every
queued request into one ``sendall`` (a burst of pipelined puts becomes one
write), and one *reader* that parses replies with ``TextParser`` and completes
the futures. One shared daemon *ticker* expires requests past their timeout and
sends the ``version`` heartbeat on idle connections.

Futures complete on the reader thread (or the ticker, for timeouts): a
callback added to them must return quickly.
"""

import heapq
import itertools
import logging
import socket
import threading
import time
import weakref
from concurrent.futures import Future

from metaq import limits
from metaq.auth import limits as auth_limits
from metaq.client import limits as client_limits
from metaq.client.security import resolve as resolve_security
from metaq.errors import ConnectionLost, MetaqError, RemoteProtocolError, RequestTimeout, Unauthenticated, os_reason
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)

__all__ = ["parse_url", "BrokerConnection", "ConnectionPool"]

log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1
#: Largest reply body accepted: a get returns at least one whole record however large (up to the
#: biggest put body + its 20-byte header), otherwise up to the transfer size.
DEFAULT_MAX_REPLY = max(limits.MAX_BODY_BYTES, limits.MAX_TRANSFER_BYTES) + 64 * 1024
_RECV_BYTES = 256 * 1024
_TICK_S = 0.05
_UNKNOWN = object()
_CALLER_ROUNDS = 4  # writes a requesting thread does for others before the writer thread takes over


def parse_url(url):
    """``"meta://host:port"`` (also ``host:port``, ``meta://[::1]:port``) -> ``(host, port)``; ValueError otherwise."""
    text = str(url).strip()
    if text.startswith("meta://"):
        text = text[len("meta://"):]
    elif "://" in text:
        raise ValueError("invalid broker url %r: expected meta://host:port" % (url,))
    text = text.split("?", 1)[0].rstrip("/")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("invalid broker url %r: expected meta://host:port" % (url,))
    return host, int(port)


class _Ticker:
    """One daemon thread for all connections: request timeouts and heartbeats."""

    def __init__(self):
        self._lock = threading.Lock()
        self._conns = weakref.WeakSet()
        self._thread = None

    def add(self, conn):
        with self._lock:
            self._conns.add(conn)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="metaq-conn-ticker", daemon=True)
                self._thread.start()

    def discard(self, conn):
        with self._lock:
            self._conns.discard(conn)

    def _run(self):
        while True:
            time.sleep(_TICK_S)
            with self._lock:
                conns = list(self._conns)
                if not conns:
                    self._thread = None
                    return
            now = time.monotonic()
            for conn in conns:
                try:
                    conn.tick(now)
                except Exception:  # keep ticking for the other connections
                    log.exception("connection tick failed for %s", conn.url)


_TICKER = _Ticker()


def _complete(target, result=None, error=None):
    """Deliver a reply (or ``error``) to a waiting Future or ``callback(reply, error)``; once only."""
    if target is None:
        return
    if not isinstance(target, Future):
        try:
            target(result, error)
        except Exception:
            log.exception("request callback %r failed", target)
        return
    if target.done():
        return
    try:
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(result)
    except Exception:  # InvalidStateError on a race with another completion
        log.debug("future already resolved", exc_info=True)


def _with_opaque(event, opaque):
    """``event`` with its opaque replaced (puts, the hot path, without ``_replace``)."""
    if type(event) is ev.Put:
        return ev.Put(event.topic, event.partition, event.flag, event.body, opaque, event.checksum, event.tx_key)
    if type(event) is IdempotentPut:
        return IdempotentPut(event.topic, event.partition, event.flag, event.body, opaque, event.checksum,
                                event.producer_id, event.sequence)
    return event._replace(opaque=opaque)


class BrokerConnection:
    """A pipelined connection to one broker (``meta://host:port``).

    ``connect_timeout`` bounds one connection attempt; ``request_timeout`` is
    the default per-request timeout; ``heartbeat_interval`` seconds without a
    request sends ``version`` (its timeout drops the connection; 0 disables).
    After a failed connection attempt the next one is allowed only after a
    backoff that doubles from ``initial_backoff`` up to ``max_backoff``;
    requests made meanwhile fail at once with ``ConnectionLost``.
    ``max_buffered`` bytes of unsent requests make ``request`` wait (at most its
    timeout) for the writer, so a fast producer cannot fill memory.
    ``security`` (``metaq.client.security``: a ClientSecurity, a credentials file, None for the environment):
    each new socket is wrapped in TLS when it says so, then authenticated before any request is written. A
    broker that refuses the credentials (or cannot prove it holds them) fails requests with
    ``Unauthenticated``, at once and without reconnecting, for ``limits.CLIENT_AUTH_RETRY_S``.
    """

    def __init__(self, url, *, connect_timeout=3.0, request_timeout=10.0, heartbeat_interval=10.0,
                 initial_backoff=0.1, max_backoff=2.0, max_reply_bytes=DEFAULT_MAX_REPLY,
                 max_buffered=8 << 20, io_timeout=30.0, security=None):
        self.url = url
        self.address = parse_url(url)
        self.security = resolve_security(security)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.heartbeat_interval = heartbeat_interval
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.max_reply_bytes = max_reply_bytes
        self.max_buffered = max_buffered
        self.io_timeout = io_timeout
        self._lock = threading.Lock()
        self._writable = threading.Condition(self._lock)  # writer: handed work / senders: room in the buffer
        self._connect_lock = threading.Lock()
        self._sock = None
        self._gen = 0  # incremented on every new socket; stale threads compare it
        self._pending = {}  # opaque -> Future (None for one-way requests)
        self._deadlines = []  # heap of (deadline, opaque)
        self._out = []
        self._out_bytes = 0
        self._writing = False  # some thread is writing ``_out`` to the socket
        self._handoff = False  # the writer thread is asked to take over the writing
        self._opaques = itertools.count(1)
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = None
        self._auth_error = None  # the broker refused our credentials: raised again until _retry_at
        self._last_write = time.monotonic()
        self._heartbeat = None
        self._timed_out = set()
        self._closed = False
        self._reader_ident = None
        #: Number of sockets opened so far (a reconnect increments it).
        self.connect_count = 0
        _TICKER.add(self)

    # -- public API -----------------------------------------------------------------------

    @property
    def connected(self):
        """True while a socket to the broker is open."""
        return self._sock is not None

    @property
    def closed(self):
        """True after ``close()``."""
        return self._closed

    @property
    def in_flight(self):
        """Number of requests waiting for their reply."""
        return len(self._pending)

    def reachable(self):
        """True when connected, or when a connection attempt (if the backoff allows one now) succeeds; never raises."""
        if self._sock is not None:
            return True
        if self._closed or time.monotonic() < self._retry_at:
            return False
        try:
            self._ensure_connected()
        except MetaqError:
            return False
        return True

    def request(self, event, timeout=None):
        """Send ``event`` (its opaque is replaced) and return a Future of the reply (``Result`` or ``Value``).

        The future fails with ``ConnectionLost`` (broker unreachable, or the
        connection dropped before the reply) or ``RequestTimeout`` (no reply in
        ``timeout`` seconds, default ``request_timeout``). Never blocks longer
        than ``connect_timeout`` (when a new connection is needed) plus the wait
        for buffer room.
        """
        future = Future()
        future.set_running_or_notify_cancel()
        timeout = self.request_timeout if timeout is None else timeout
        try:
            self._submit(event, future, timeout)
        except MetaqError as exc:  # unreachable, buffer full, or the credentials refused
            _complete(future, error=exc)
        return future

    def request_callback(self, event, callback, timeout=None):
        """Like ``request`` without a Future: ``callback(reply, error)`` is called once (exactly one is None).

        It runs on the reader thread, the ticker thread or (when the request
        cannot even be queued) the calling thread, and must return quickly.
        """
        timeout = self.request_timeout if timeout is None else timeout
        try:
            self._submit(event, callback, timeout)
        except MetaqError as exc:
            _complete(callback, error=exc)

    def call(self, event, timeout=None):
        """Send ``event`` and wait for its reply event; raises ``ConnectionLost`` / ``RequestTimeout``."""
        timeout = self.request_timeout if timeout is None else timeout
        future = self.request(event, timeout)
        try:
            return future.result(timeout + self.connect_timeout + 1.0)
        except TimeoutError:  # the ticker should have expired it already
            raise RequestTimeout("no reply from %s within %.1f s" % (self.url, timeout)) from None

    def send_oneway(self, event):
        """Write ``event`` without waiting for (or keeping) its reply; raises ``ConnectionLost`` when down."""
        self._submit(event, None, self.request_timeout)

    def close(self, drain_s=client_limits.CLIENT_CLOSE_DRAIN_S):
        """With one-way sends not answered yet, close as TCP does, within ``drain_s`` seconds: what was queued
        before (those sends, pipelined requests the writer thread has not written yet) is written, then this side's
        end is shut and the broker's answers to what is still unanswered are read until it closes its own: a broker
        stores every put it read before it sees the end, while one whose answer meets a closed socket stops reading
        the rest. Then the socket closes and every pending request fails with ``ConnectionLost``; later requests
        fail too. On the reader thread (a reply's callback) it does not wait: the broker may be waiting for its
        replies to be read."""
        deadline = time.monotonic() + drain_s
        self._closed = True
        _TICKER.discard(self)
        with self._lock:
            # only for one-way sends: a request with a waiter is told it failed, nothing of it is lost unseen
            if threading.get_ident() != self._reader_ident and None in self._pending.values():
                while (self._out or self._writing) and self._sock is not None and self._wait_until(deadline):
                    pass
                sock = self._sock
                if sock is not None and self._pending and not (self._out or self._writing):
                    try:
                        sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        sock = None
                    while sock is not None and self._sock is sock and self._wait_until(deadline):
                        pass
        with self._lock:
            gen = self._gen
        self._drop(gen, ConnectionLost("connection to %s closed by the client" % self.url))

    def _wait_until(self, deadline):
        """Wait (``_lock`` held) for the writer or the reader to move, a hundredth of a second at most; False once
        ``deadline`` passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self._writable.wait(min(left, 0.01))
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<BrokerConnection %s %s, %d in flight>" % (
            self.url, "connected" if self.connected else "down", len(self._pending))

    # -- sending --------------------------------------------------------------------------

    def _submit(self, event, waiter, timeout, reconnect=True):
        """Queue ``event`` with a fresh opaque, registering ``waiter`` (Future, callback, or None = one-way).

        A lone request (nothing else in flight) is written by the calling
        thread itself, without a thread switch. With requests in flight the
        writer thread writes: everything queued while it waits for its turn
        goes out in one ``sendall``, so pipelined requests are batched.
        """
        if reconnect:
            self._ensure_connected()
        deadline = time.monotonic() + timeout
        # On the reader thread (a reply callback sending more) never write or wait for room ourselves:
        # while we block, nobody reads the replies the broker is blocked writing.
        on_reader = threading.get_ident() == self._reader_ident
        with self._lock:
            while self._out_bytes >= self.max_buffered and self._sock is not None and not on_reader:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout("send buffer to %s stayed full for %.1f s" % (self.url, timeout))
                self._writable.wait(min(left, 1.0))
            sock = self._sock
            if sock is None:
                raise ConnectionLost("connection to %s lost: %s" % (self.url, self._last_error or "closed"))
            opaque = self._next_opaque()
            if type(event) is ev.Quit:
                data = serialize(event)
            else:
                data = serialize(_with_opaque(event, opaque))
                self._pending[opaque] = waiter
                if waiter is not None:
                    heapq.heappush(self._deadlines, (deadline, opaque))
            self._out.append(data)
            self._out_bytes += len(data)
            self._last_write = time.monotonic()
            if self._writing:
                return
            self._writing = True
            if len(self._pending) > 1 or on_reader:  # pipelining: let the writer thread batch what comes next
                self._handoff = True
                self._writable.notify_all()
                return
            gen = self._gen
        self._flush(sock, gen, _CALLER_ROUNDS)

    def _flush(self, sock, gen, rounds):
        """Write queued bytes (this thread owns ``_writing``); after ``rounds`` writes hand over to the writer
        thread."""
        for _ in range(rounds):
            with self._lock:
                if self._gen != gen:
                    return  # dropped; _drop reset the state
                if not self._out:
                    self._writing = False
                    return
                out = self._out
                self._out = []
                self._out_bytes = 0
                self._writable.notify_all()
            try:
                sock.sendall(out[0] if len(out) == 1 else b"".join(out))
            except OSError as exc:
                self._drop(gen, ConnectionLost("connection to %s lost while writing: %s" % (self.url, exc)))
                return
        with self._lock:
            if self._gen == gen:
                self._handoff = True
                self._writable.notify_all()

    def _next_opaque(self):
        opaque = next(self._opaques)
        while opaque >= _INT32_MAX or opaque in self._pending:
            if opaque >= _INT32_MAX:
                self._opaques = itertools.count(1)
            opaque = next(self._opaques)
        return opaque

    def _ensure_connected(self):
        if self._sock is not None:
            return
        if self._closed:
            raise ConnectionLost("connection to %s was closed" % self.url)
        if not self._connect_lock.acquire(timeout=self.connect_timeout + 1.0):
            raise ConnectionLost("timed out waiting for another thread connecting to %s" % self.url)
        try:
            if self._sock is None:
                self._connect()
        finally:
            self._connect_lock.release()

    def _connect(self):
        now = time.monotonic()
        if now < self._retry_at:
            if self._auth_error is not None:
                raise type(self._auth_error)(str(self._auth_error))
            raise ConnectionLost("cannot connect to %s (%s); next attempt in %.2f s" % (
                self.url, os_reason(self._last_error), self._retry_at - now))
        try:
            sock = self._open_socket()
        except Unauthenticated as exc:  # not a network trouble: no quick retries, the same answer meanwhile
            self._auth_error, self._last_error = exc, exc
            self._retry_at = time.monotonic() + max(self.max_backoff, client_limits.CLIENT_AUTH_RETRY_S)
            log.warning("%s (no new attempt for %.0f s)", exc, self._retry_at - time.monotonic())
            raise
        except (OSError, MetaqError) as exc:
            self._failures += 1
            delay = min(self.max_backoff, self.initial_backoff * 2 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay
            self._last_error = exc
            log.info("cannot connect to %s: %s (attempt %d, next in %.2f s)", self.url, exc, self._failures, delay)
            if isinstance(exc, ConnectionLost):
                raise
            raise ConnectionLost("cannot connect to %s: %s" % (self.url, os_reason(exc))) from exc
        self._auth_error = None
        if self._failures:
            log.info("reconnected to %s after %d failed attempts", self.url, self._failures)
        self._failures = 0
        self._retry_at = 0.0
        with self._lock:
            if self._closed:
                sock.close()
                raise ConnectionLost("connection to %s was closed" % self.url)
            self._gen += 1
            gen = self._gen
            self._sock = sock
            self.connect_count += 1
            self._last_write = time.monotonic()
            self._timed_out.clear()
        for target, name in ((self._write_loop, "writer"), (self._read_loop, "reader")):
            thread = threading.Thread(target=target, args=(sock, gen), daemon=True,
                                      name="metaq-%s-%s:%d" % (name, *self.address))
            thread.start()

    def _open_socket(self):
        """A connected socket: TCP, then TLS and the ``auth`` handshake when ``security`` asks for them."""
        sock = socket.create_connection(self.address, timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = self.security.wrap(sock, self.address[0], self.url)
            self.security.authenticate(sock, self.url, self.connect_timeout + auth_limits.AUTH_FAILURE_DELAY_S)
            sock.settimeout(self.io_timeout)
        except BaseException:
            sock.close()
            raise
        return sock

    def _write_loop(self, sock, gen):
        """The writer thread: takes over the writing when a requesting thread has written enough for others."""
        while True:
            with self._lock:
                while not self._handoff and self._gen == gen:
                    self._writable.wait(1.0)
                if self._gen != gen:
                    return
                self._handoff = False
            self._flush(sock, gen, 1 << 62)

    # -- receiving ------------------------------------------------------------------------

    def _read_loop(self, sock, gen):
        self._reader_ident = threading.get_ident()
        parser = TextParser(max_line=limits.MAX_LINE_BYTES, max_body=self.max_reply_bytes)
        reason = "closed by the broker"
        try:
            while self._gen == gen:
                try:
                    data = sock.recv(_RECV_BYTES)
                except socket.timeout:
                    continue
                parser.receive_data(data)
                if not self._dispatch(parser):
                    break
        except RemoteProtocolError as exc:
            reason = "unreadable reply: %s" % exc
            log.warning("connection to %s: %s", self.url, reason)
        except OSError as exc:
            reason = str(exc)
        self._drop(gen, ConnectionLost("connection to %s lost: %s" % (self.url, reason)))

    def _dispatch(self, parser):
        """Complete the futures of every whole reply buffered; False once the stream has ended."""
        while True:
            try:
                event = parser.next_event()
            except RemoteProtocolError as exc:
                if exc.fatal:
                    raise
                log.warning("connection to %s: unreadable reply (opaque %d): %s", self.url, exc.opaque, exc)
                continue
            if event is NEED_DATA:
                return True
            if event is CLOSED:
                return False
            opaque = getattr(event, "opaque", None)
            waiter = self._pending.pop(opaque, _UNKNOWN)  # atomic; a racing _drop fails it at most once more
            if waiter is not _UNKNOWN:
                _complete(waiter, event)
            else:
                level = logging.DEBUG if opaque in self._timed_out else logging.WARNING
                log.log(level, "connection to %s: ignoring a reply with unknown opaque %r: %.100r",
                        self.url, opaque, event)

    def _drop(self, gen, error):
        """Close socket ``gen`` (if still current) and fail its pending requests with ``error``."""
        with self._lock:
            if self._gen != gen or self._sock is None:
                return
            sock, self._sock = self._sock, None
            pending, self._pending = self._pending, {}
            self._deadlines = []
            self._out = []
            self._out_bytes = 0
            self._writing = self._handoff = False
            self._heartbeat = None
            self._last_error = error
            self._writable.notify_all()
        if not self._closed:
            log.info("%s (%d requests in flight failed)", error, len(pending))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        while True:  # popitem, like the reader's pop, is atomic: each waiter is completed exactly once
            try:
                _opaque, waiter = pending.popitem()
            except KeyError:
                break
            _complete(waiter, error=error)

    # -- timeouts and heartbeat (called by the ticker thread) -----------------------------

    def tick(self, now):
        expired = []
        with self._lock:
            heap = self._deadlines
            while heap and heap[0][0] <= now:
                _deadline, opaque = heapq.heappop(heap)
                future = self._pending.pop(opaque, None)
                if future is not None:
                    expired.append(future)
                    self._timed_out.add(opaque)
            if len(heap) > 2 * len(self._pending) + 1024:  # drop entries of answered requests
                self._deadlines = [item for item in heap if item[1] in self._pending]
                heapq.heapify(self._deadlines)
            if len(self._timed_out) > 10000:
                self._timed_out.clear()
            beat = (self.heartbeat_interval and self._sock is not None and self._heartbeat is None
                    and now - self._last_write >= self.heartbeat_interval)
        for future in expired:
            _complete(future, error=RequestTimeout("no reply from %s in time" % self.url))
        if beat:
            self._send_heartbeat()

    def _send_heartbeat(self):
        with self._lock:
            gen = self._gen
        timeout = min(self.request_timeout, max(self.heartbeat_interval * 2, 1.0))
        try:
            future = Future()
            future.set_running_or_notify_cancel()
            self._heartbeat = future
            self._submit(ev.Version(0), future, timeout, reconnect=False)
        except (ConnectionLost, RequestTimeout):
            self._heartbeat = None
            return

        def done(fut):
            self._heartbeat = None
            if isinstance(fut.exception(), RequestTimeout):
                self._drop(gen, ConnectionLost("heartbeat to %s timed out" % self.url))

        future.add_done_callback(done)


class ConnectionPool:
    """One ``BrokerConnection`` per broker url, created on first use; keyword args go to every connection."""

    def __init__(self, **connection_options):
        connection_options["security"] = resolve_security(connection_options.get("security"))  # read once
        self.connection_options = connection_options
        self._lock = threading.Lock()
        self._conns = {}
        self._closed = False

    def get(self, url):
        """The connection to ``url`` (not connected until its first request)."""
        with self._lock:
            if self._closed:
                raise ConnectionLost("connection pool is closed")
            conn = self._conns.get(url)
            if conn is None or conn.closed:
                conn = self._conns[url] = BrokerConnection(url, **self.connection_options)
            return conn

    def urls(self):
        """The urls with a connection in the pool."""
        with self._lock:
            return list(self._conns)

    def discard(self, url):
        """Close and forget the connection to ``url`` (if any)."""
        with self._lock:
            conn = self._conns.pop(url, None)
        if conn is not None:
            conn.close()

    def close(self):
        """Close every connection."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
