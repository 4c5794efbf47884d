"""The MetaQ text-protocol server: one greenlet per connection on a gevent StreamServer.

Each burst of received bytes is parsed into as many frames as it holds; the
replies of that burst are written together with one send (``sendmsg`` of the records
straight from the maps when a get is among them: server/zerocopy.py; after one
shared flush wait in ``sync`` mode). Long-polling gets reply from their own
greenlet; every write holds the connection's write lock so replies never
interleave. Limits: line and body length (parser), connection count, idle
time and partial-request time.
"""

import logging
import socket
import time
from fcntl import ioctl
from termios import FIONREAD

import gevent
from gevent.event import Event
from gevent.lock import Semaphore
from gevent.queue import Queue

from metaq import errors, limits
from metaq.protocol import events as ev
from metaq.protocol.events import Put
from metaq.protocol.httpline import is_http_request, refusal as http_refusal
from metaq.priorities.wire import PriorityGet
from metaq.protocol.burst import encode_results
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, encode_result
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)
from metaq.serving import connections as core
from metaq.server.text.fastput import failed_replies
from metaq.store.gather import MappedRecords

log = logging.getLogger(__name__)

#: Requests whose reply holds the connection's reply budget (a burst's replies are sent before one of them).
_GETS = (ev.Get, ev.GetTags, ev.GetSql, PriorityGet)  # each waits for the reply budget (read_reply)

#: Replies up to this size (acks, results) are not counted against the reply budget one by one: a burst
#: holds at most a receive buffer's worth of requests, so their replies are bounded by it.
SMALL_REPLY = 4096

#: Buffers per sendmsg call (below IOV_MAX, 1024 on Linux).
IOV_BATCH = 1000

#: Over TLS (no sendmsg), buffers smaller than this are joined into writes of up to about this size (one TLS
#: record's worth); a larger one is written as it is.
TLS_JOIN_BYTES = 16 * 1024

def held_by(reply):
    """The reply-budget bytes a reply holds until sent: a get's data (a list of buffers) holds its size."""
    return sum(map(len, reply)) if type(reply) is list else 0




class Connection(core.Connection):
    """State of one client connection."""

    def __init__(self, sock, address, conn_id, front):
        super().__init__(sock, address, conn_id, front.rules)
        self.front = front
        self._reading = False  # a burst is being handled
        self._write_lock = Semaphore()
        self._children = set()
        # Replies that wait for a flush go through a queue and a writer greenlet, in
        # order, so the connection keeps parsing and appending while fsync runs.
        self._bursts = Queue()
        self._pending = 0
        self._idle = Event()  # set when no burst is waiting
        self._idle.set()
        self._room = Event()  # set while the backlog is small enough to read more requests
        self._room.set()
        self._writer = None
        self.parser = TextParser(max_line=front.max_line_bytes, max_body=front.max_body_bytes)
        self.max_transfer = front.dispatcher.max_transfer
        #: The zero-copy sender (server/zerocopy.py), or None: gets are gathered into buffers (TLS, or turned off).
        self.zero_copy = front.zero_copy if not self.tls else None
        self.parked = 0  # long-polling gets parked now (text.dispatch caps them)
        self.hang_up = False  # set by a handler whose reply must be the last (a failed auth)
        self._drain_at_close = False  # a refusal ends the connection: what the client still sends is read first
        self.dispatcher = front.dispatcher
        self.stats = front.stats
        self.flusher = front.flusher
        self.put_path = front.dispatcher.put_path  # a burst's acknowledgement waits in ``settle``
        self.fast_puts = front.fast_puts.take if front.fast_puts is not None else None

    def await_login(self, host, arrived):
        """Until it logs in, a request's body may be only ``limits.MAX_PRELOGIN_BODY_BYTES``."""
        super().await_login(host, arrived)
        self.parser.max_body = min(self.parser.max_body, limits.MAX_PRELOGIN_BODY_BYTES)

    def login_done(self):
        self.parser.max_body = self.front.max_body_bytes

    @property
    def busy(self):
        """A burst being handled, replies waiting for their flush, or requests answering from greenlets of
        their own (a shutdown lets them finish)."""
        return self._reading or self._pending > 0 or bool(self._children)

    # -- writing -----------------------------------------------------------

    def send(self, data, held=0):
        """Send one reply: bytes, or a list of buffers (a get's header and record views); then give back the
        ``held`` bytes of the reply budget it took."""
        try:
            self._send(data)
        finally:
            self.replies.release(held)
        if held and self.rates is not None and self.rates.acl.has_rates:
            self.pace("fetch", held)  # the records sent: the user's fetch rate

    def _send(self, data):
        if self.closed or not data:
            return
        if self.zero_copy is not None and type(data) is list and self._write_lock.locked():
            # Queued behind another reply's send (which may wait on the socket up to the idle timeout): this one
            # must not hold its maps meanwhile, nor be sent unchecked after a cut of the log.
            if not self._unpin(data):
                return
        with self._write_lock:
            try:
                if isinstance(data, list):
                    self._send_buffers(data)
                else:
                    # One send() mostly takes it all; gevent's sendall costs a Timeout object and a
                    # getsockopt per call, so it only takes the rest.
                    sent = self.sock.send(data)
                    if sent < len(data):
                        self.sock.sendall(memoryview(data)[sent:])
            except (OSError, socket.timeout) as exc:
                log.info("connection %s: send failed (%s); closing", self.peer, exc)
                self.close()

    def _unpin(self, bufs):
        """Copy a reply's records out of the maps (checked) before it waits; False when a cut of the log reached
        them since the read (the connection closes: they are never sent)."""
        try:
            self.zero_copy.unpin(bufs)
            return True
        except OSError as exc:
            log.info("connection %s: %s", self.peer, exc)
            self.close()
            return False

    def _unpin_burst(self, out):
        """``_unpin`` of every get's reply of a burst that waits (for a flush, or behind earlier bursts)."""
        if self.zero_copy is not None:
            for r in out:
                if type(r) is list and not self._unpin(r):
                    return

    def _send_buffers(self, bufs):
        """Scatter-gather send of every buffer, in order, without joining them."""
        if self.tls:
            self._send_buffers_tls(bufs)
            return
        if self.zero_copy is not None and any(type(b) is MappedRecords for b in bufs):
            try:
                self.zero_copy.send(self.sock, bufs)
            except ValueError as exc:  # a map let go under the reply (the store closed): as a failed send
                raise OSError(str(exc)) from None
            return
        i, n = 0, len(bufs)
        while i < n:
            sent = self.sock.sendmsg(bufs[i:i + IOV_BATCH])
            while sent and i < n:
                size = len(bufs[i])
                if sent >= size:
                    sent -= size
                    i += 1
                else:
                    bufs[i] = memoryview(bufs[i])[sent:]
                    sent = 0

    def _send_buffers_tls(self, bufs):
        """Every buffer, in order, over TLS (an SSL socket has no sendmsg): runs of small ones (acks, a get's
        header) joined into one write, a large one (a get's records, gathered per segment) written as it is —
        copying it again would cost more than its encryption (fresh pages for every copy)."""
        sendall = self.sock.sendall
        run, size = [], 0
        for buf in bufs:
            n = len(buf)
            if n >= TLS_JOIN_BYTES:
                if run:
                    sendall(run[0] if len(run) == 1 else b"".join(run))
                    run, size = [], 0
                sendall(buf)
                continue
            run.append(buf)
            size += n
            if size >= TLS_JOIN_BYTES:
                sendall(b"".join(run))
                run, size = [], 0
        if run:
            sendall(run[0] if len(run) == 1 else b"".join(run))

    def _send_replies(self, out):
        """Send a burst's replies with one call: joined bytes, or one buffer list when a get is among them."""
        if len(out) == 1:
            self.send(out[0], held_by(out[0]))
        elif any(type(r) is list for r in out):
            flat = []
            held = 0
            for r in out:
                if type(r) is list:
                    flat.extend(r)
                    held += held_by(r)
                else:
                    flat.append(r)
            self.send(flat, held)
        else:
            self.send(b"".join(out))

    # -- the reply budget (connections.ReplyBudget) ------------------------------

    def read_reply(self, max_size, read):
        """``read()``'s reply to a get, read once the connection holds room for ``max_size`` more reply bytes
        (a reply with data holds its size until sent); None when the connection closed meanwhile."""
        replies = self.replies
        if not replies.reserve(max_size, lambda: self.closed):
            return None
        try:
            reply = read()
        except BaseException:
            replies.release(max_size)
            raise
        replies.release(max_size - held_by(reply))
        return reply

    def spawn(self, func, *args, on_exit=None):
        """Run ``func(*args)`` in its own greenlet and send what it returns (long polls); ``on_exit()`` runs
        when that greenlet ends, however it ends (killed before it started included)."""

        def run():
            try:
                reply = func(*args)
                self.send(reply, held_by(reply))
            except errors.MetaqError as exc:
                log.warning("connection %s: %s", self.peer, exc)
            finally:
                self._children.discard(g)

        g = gevent.spawn(run)
        self._children.add(g)
        if on_exit is not None:
            g.rawlink(lambda _g: on_exit())

    # -- reading -----------------------------------------------------------

    def serve(self):
        try:
            data = self._receive()
            if data is not None and (self.tls_hello(data) or self._http_request(data)):
                return
            while data is not None and not self.closed:
                self._reading = True
                keep_open = self._process(data)
                self._reading = False
                if not keep_open or self.front.closing:
                    return
                data = self._receive()
        finally:
            self._idle.wait(self.request_timeout)  # every accepted put is answered before the close
            if self._drain_at_close:
                self._drain()
            if self.front.closing and self._children:  # replicated puts, a promotion (long polls answer at once)
                gevent.joinall(list(self._children), timeout=self.request_timeout)
            for g in list(self._children):
                g.kill(block=False)
            if self._writer is not None:
                self._writer.kill(block=False)
            self.close()

    def _http_request(self, data):
        """True when ``data``, the connection's first bytes, begin with an HTTP request line (an HTTP client reached
        the text port): it is answered once, in HTTP (400, naming the broker's HTTP port), what the client still
        sends is read and dropped (``_drain``), and the connection closes. Called once per connection."""
        if not is_http_request(data):
            return False
        self.stats.protocol_errors += 1
        log.info("connection %s: an HTTP request on the text port; answered with the HTTP port's address, closing",
                 self.peer)
        try:
            local_host = self.sock.getsockname()[0]
        except OSError:
            return True
        self.send(http_refusal(self.front.http_refusal(local_host)))
        self._drain()
        return True

    def _drain(self):
        """Shut our side and read what the peer still sends, at most ``CLOSE_DRAIN_BYTES`` within ``CLOSE_DRAIN_S``:
        closing with bytes unread would reset the connection, and the peer could lose the reply."""
        left = limits.CLOSE_DRAIN_BYTES
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(None)  # the last read's timeout may be short: the drain's own bounds it
            with gevent.Timeout(limits.CLOSE_DRAIN_S, False):
                while left > 0:
                    chunk = self.sock.recv(min(left, 64 * 1024))
                    if not chunk:
                        break
                    left -= len(chunk)
        except OSError:
            pass

    def _emit(self, out, durable, wait_pos, cuts=None):
        """Send a burst's replies now, or queue them behind earlier bursts / their flush. ``cuts``: the log's
        ``log_cuts`` read after the burst's first put whose acknowledgement waits (``wait_flushed``'s ``since``)."""
        if not wait_pos and not self._pending:
            if out:
                self._send_replies(out)
            return
        self._unpin_burst(out)  # it waits for a flush or behind earlier bursts: its gets hold no maps meanwhile
        if not self._pending and self._client_waits():
            # The client sent nothing more: it waits for these replies. Wait for the flush here
            # rather than hand the burst to the writer greenlet (one greenlet hop less per put);
            # whatever it sends meanwhile stays in the socket until the replies are out.
            self._after_flush(out, durable, wait_pos, cuts)
            if out:
                self._send_replies(out)
            return
        self._pending += 1
        self._idle.clear()
        self._bursts.put((out, durable, wait_pos, cuts))
        if self._writer is None:
            self._writer = gevent.spawn(self._write_bursts)
        if self._pending > limits.MAX_PENDING_BURSTS:
            self._room.clear()
            while self._pending > limits.MAX_PENDING_BURSTS // 2 and not self.closed:
                self._room.wait(1.0)

    def _client_waits(self):
        """True when nothing more is buffered or waiting in the socket (FIONREAD) after this burst."""
        if self.parser.buffered:
            return False
        if self.tls and self.sock.pending():  # decrypted bytes the SSL object holds, not yet read
            return False
        try:
            return ioctl(self.sock.fileno(), FIONREAD, b"\0\0\0\0") == b"\0\0\0\0"
        except OSError:
            return False

    def _write_bursts(self):
        while True:
            out, durable, wait_pos, cuts = self._bursts.get()
            if wait_pos:
                self._after_flush(out, durable, wait_pos, cuts)
            if out:
                self._send_replies(out)
            self._pending -= 1
            if self._pending <= limits.MAX_PENDING_BURSTS // 2:
                self._room.set()
            if not self._pending:
                self._idle.set()

    def _receive(self):
        data = self.receive()
        if data is not None:
            self.parser.receive_data(data)
        return data

    def _process(self, data):
        """Handle every complete frame buffered (the fast puts' bursts first, then each frame through the dispatcher; a
        put that waits for its flush: ``_awaits_flush``; large replies: ``_large_reply``); returns False when the
        connection must close."""
        out = []
        durable = []  # (index in ``out``, opaques) of put acks that wait for the flush
        wait_pos = 0
        cuts = None  # the log's truncations when the burst's first put that waits for its flush was written
        out_bytes = 0  # bytes of large non-get replies in ``out``
        keep_open = True
        parser = self.parser
        dispatcher = self.dispatcher
        put = dispatcher.put  # the hot path: puts skip the generic dispatch
        fast_puts = self.fast_puts  # hotter still: whole bursts of plain puts (fastput.py)
        turn = time.monotonic()
        while True:
            turn = core.share_loop(turn)  # a pipeline of costly requests lets the others run every MAX_TURN_MS
            if self.closed:  # meanwhile (a shutdown, the peer gone): nothing more is taken from this buffer
                keep_open = False
                break
            if fast_puts is not None:
                try:
                    first = not wait_pos
                    wait_pos = fast_puts(parser, out, durable, wait_pos, self.session)  # never yields
                    if first and wait_pos:
                        cuts = self.flusher.log_cuts
                except Exception:  # noqa: BLE001 - as below
                    log.exception("connection %s: unexpected error in a burst of puts", self.peer)
                    out.append(encode_result(500, b"internal error; see the broker log", 0))
                    keep_open = False
                    break
            try:
                event = parser.next_event()
            except errors.RemoteProtocolError as exc:
                self.stats.protocol_errors += 1
                out.append(encode_result(400, exc.reason.encode("utf-8", "replace"), exc.opaque))
                if exc.fatal:
                    log.info("connection %s: %s; closing", self.peer, exc.reason)
                    self._drain_at_close = True
                    keep_open = False
                    break
                continue
            if event is NEED_DATA or event is CLOSED or type(event) is ev.Quit:
                keep_open = event is NEED_DATA  # the buffer's whole frames are handled; else the client ended
                break
            if type(event) in _GETS and self.replies.would_wait(min(event.max_size, self.max_transfer)):
                # This burst's replies hold the connection's reply budget: send them before reading more
                # (a client that does not read them stops here, in the send, not in the broker's memory).
                self._emit(out, durable, wait_pos, cuts)
                out, durable, wait_pos = [], [], 0
            try:
                reply, pos = put(event, self) if type(event) is Put else dispatcher.handle(event, self)
            except Exception:  # noqa: BLE001 - the one place an unexpected error becomes a 500
                log.exception("connection %s: unexpected error handling %s", self.peer, type(event).__name__)
                out.append(encode_result(500, b"internal error; see the broker log", getattr(event, "opaque", 0)))
                keep_open = False
                break
            if reply is not None:
                out.append(reply)
            if self.hang_up:
                keep_open = False
                break
            if pos:
                wait_pos, cuts = self._awaits_flush(event, pos, out, durable, wait_pos, cuts)
            if type(reply) is bytes and len(reply) > SMALL_REPLY:
                out, durable, wait_pos, out_bytes = self._large_reply(out, durable, wait_pos, cuts,
                                                                      out_bytes + len(reply))
        self._emit(out, durable, wait_pos, cuts)
        return keep_open

    def _awaits_flush(self, event, pos, out, durable, wait_pos, cuts):
        """A step of ``_process``: the put ``event`` just answered (its reply last in ``out``) was written up to
        ``pos`` and is acknowledged only once that may be (``_after_flush``): its reply joins ``durable``. Returns
        the burst's ``(wait_pos, cuts)``: ``cuts`` read now when it is the burst's first such put (nothing yielded
        since the write)."""
        if not wait_pos:
            cuts = self.flusher.log_cuts
        durable.append((len(out) - 1, (event.opaque,)))
        return max(wait_pos, pos), cuts

    def _large_reply(self, out, durable, wait_pos, cuts, out_bytes):
        """A step of ``_process``: a large reply that is not a get's (stats, recover...) was added, ``out_bytes`` of
        them in the burst now; once they reach the reply budget the burst's replies go out before more requests are
        read, so unread replies stay within the budget whatever asked for them. Returns the burst's ``(out,
        durable, wait_pos, out_bytes)``: new and empty once sent."""
        if out_bytes < self.replies.limit:
            return out, durable, wait_pos, out_bytes
        self._emit(out, durable, wait_pos, cuts)
        return [], [], 0, 0

    def _after_flush(self, out, durable, wait_pos, cuts=None):
        """Wait until the burst's puts (up to ``wait_pos``) may be acknowledged (``PutPath.settle``: flushed per the
        flush mode, a slave's ACK per the replication mode, this broker still the master); otherwise each waiting
        put gets the error instead of its ack (500 for a failed flush, else its code): written, not acknowledged."""
        try:
            self.put_path.settle(wait_pos, cuts)
        except errors.MetaqError as exc:
            log.error("connection %s: %s", self.peer, exc)
            body = str(exc).encode("utf-8", "replace")
            code = exc.code if isinstance(exc, errors.Unavailable) else 500
            for i, opaques in durable:
                out[i] = failed_replies(opaques, body) if code == 500 else encode_results(code, body, opaques)
