"""A server-side WebSocket connection (RFC 6455) over a plain or TLS socket, as a byte stream (wsproto, sans-IO).

``WsStream`` stands where the socket stood: the connection above it (MQTT's) reads and writes bytes and never learns
that they travel in WebSocket frames. Its first ``recv`` reads the HTTP upgrade request (``WS_MAX_HANDSHAKE_BYTES``
at most, whole within ``WS_HANDSHAKE_TIMEOUT_S`` of the accept, or ``request_timeout_s`` when shorter) and answers
it: 101 with the subprotocol chosen, or an HTTP refusal saying why (a wrong path 404, no subprotocol it speaks 400,
an origin not allowed 403, not a WebSocket upgrade 400/426), then the end of the stream. From a trusted proxy
(``security.trusted_proxies``) the request's ``X-Forwarded-For`` names the client
(``TrustedProxies.forwarded_client``), handed to ``claim`` (the connection core's) before anything else is decided:
a header that is no list of addresses is refused 400, a client the core refuses (its share, the allow-list) 403;
from any other peer it is not read. After the upgrade, every binary frame's payload is handed up as it arrives,
however the peer split or packed its packets; each ``sendall`` leaves as one binary frame, its header written here
(``wsframe.binary_header``).

The common frame (one whole binary message, masked, within the bound) is unmasked in one call for every such frame
a read holds (``wsframe.frames``, in C); every other frame (a control frame, a fragment, a text frame, any frame a
rule refuses) goes, its bytes exactly, to wsproto, which answers or refuses it as it would in a stream of its own.

What a client may not do, each closing with its code and one log line: a text frame (1003: the stream is binary), an
unmasked frame or any other framing error (1002, wsproto's), a frame declaring more than ``max_frame`` bytes (1009,
at its header, before its payload), more than ``WS_MAX_FRAGMENTS`` frames in one message, control frames past
``WS_CONTROL_FRAMES_PER_S``, or more than ``WS_CONTROL_FRAMES_WITHOUT_DATA`` of them with no MQTT bytes between (a
client that only pings holds its connection's greenlet for no longer) (1008). Nothing of a read that broke a rule
is handed up. A close with a code or reason RFC 6455 forbids is answered 1002; a valid close is answered in kind.
Sends hold a lock, so a PONG or a CLOSE never lands inside another writer's frame. ``try_send`` writes a frame
without waiting (the MQTT connection's replies from the reader's turn): what the socket does not take of it is kept
and written before any other frame.
"""

import logging
import socket
import time

from gevent.lock import Semaphore
from gevent.socket import socket as GeventSocket
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionState, ConnectionType
from wsproto.events import (AcceptConnection, BytesMessage, CloseConnection, Ping, Pong, RejectConnection,
                            RejectData, Request, TextMessage)
from wsproto.extensions import Extension
from wsproto.frame_protocol import CloseReason
from wsproto.handshake import H11Handshake
from wsproto.utilities import ProtocolError, RemoteProtocolError

from metaq.serving import limits as serving_limits
from metaq.protocol.wsframe import binary_header, frames

__all__ = ["WsRules", "WsStream"]

log = logging.getLogger(__name__)

#: Bytes asked of one recv() of the socket beneath.
RECV_BYTES = 256 * 1024

_END_OF_HEAD = b"\r\n\r\n"


class WsRules:
    """What one WebSocket listener accepts: its ``path``, the ``subprotocols`` it speaks (the first the client offers
    is chosen), the ``origins`` a browser page may come from (None: any), the largest frame payload (``max_frame``),
    the seconds from the accept by which the upgrade request must be whole (``handshake_s``), the trusted proxies
    whose ``X-Forwarded-For`` names the client (``proxies``, a ``TrustedProxies``; None: nobody's)."""

    __slots__ = ("path", "subprotocols", "origins", "max_frame", "handshake_s", "proxies")

    def __init__(self, path, subprotocols, origins, max_frame, handshake_s=serving_limits.WS_HANDSHAKE_TIMEOUT_S,
                 proxies=None):
        self.handshake_s = handshake_s
        self.proxies = proxies
        self.path = path
        self.subprotocols = tuple(subprotocols)
        self.origins = frozenset(o.rstrip("/").lower() for o in origins) if origins else None
        self.max_frame = max_frame


class _FrameBound(Extension):
    """Refuses a frame at its header when it declares more than ``most`` payload bytes (wsproto's per-header hook; never
    offered to nor negotiated with the peer: it sets no reserved bit)."""

    name = "metaq-frame-bound"

    def __init__(self, most):
        self.most = most

    def enabled(self):
        return True

    def offer(self):
        return False

    def frame_inbound_header(self, proto, opcode, rsv, payload_length):
        if payload_length > self.most:
            return CloseReason.MESSAGE_TOO_BIG
        return super().frame_inbound_header(proto, opcode, rsv, payload_length)


class WsStream:
    """One WebSocket connection as a byte stream (see the module doc). It offers what the connection core and the MQTT
    connection use of a socket: ``recv``, ``send``, ``sendall``, ``try_send``, ``settimeout``, ``fileno``,
    ``setsockopt``, ``pending``, ``close``. ``claim`` (set by the front-end once its connection is made): the
    connection core's ``claim`` for it, given the client an ``X-Forwarded-For`` names, returning why not or None."""

    layered = True  # read and written only through this object, all the socket holds taken at once (connections.py)
    __slots__ = ("sock", "rules", "address", "peer", "claim", "subprotocol", "_started", "_head", "_hs", "_ws",
                 "_ready", "_eof", "_timeout", "_send_lock", "_frames", "_tokens", "_tokens_at", "_in", "_owed",
                 "_fragmented", "_controls", "_raw", "_rest")

    def __init__(self, sock, rules, address, started):
        self.sock = sock
        self.rules = rules
        self.address = address  # the peer's (host, port)
        self.peer = "%s:%s" % address[:2] if isinstance(address, tuple) else str(address)  # for log lines
        self.claim = None
        self.subprotocol = None  # the one chosen, once the handshake is done
        self._started = started  # monotonic time of the accept: the handshake's deadline runs from it
        self._head = bytearray()  # the upgrade request's bytes so far
        self._hs = H11Handshake(ConnectionType.SERVER)
        self._ws = None  # the frames' wsproto Connection, once upgraded
        self._ready = []  # payload bytes decoded, not yet returned by recv
        self._eof = False
        self._timeout = None
        self._send_lock = Semaphore()
        self._frames = 0  # frames of the message under way
        self._tokens = float(serving_limits.WS_CONTROL_FRAMES_PER_S)  # control frames the peer may still send now
        self._tokens_at = started
        self._in = None  # a frame's bytes not yet whole (a bytearray), kept for the next read
        self._owed = 0  # bytes of the frame wsproto is reading still to be handed to it
        self._fragmented = False  # a message in fragments under way (wsproto's: no frame is common meanwhile)
        self._controls = 0  # control frames since the last MQTT bytes
        # a plain socket's underlying non-blocking one: a send tried there first, never waiting (None: TLS)
        self._raw = getattr(sock, "_sock", None) if type(sock) is GeventSocket else None
        self._rest = None  # what the socket did not take of a frame ``try_send`` began: written before any other

    # -- reading ---------------------------------------------------------------

    def recv(self, nbytes):
        """Up to ``nbytes`` of the binary frames' payload, waiting for them; b"" at the end (the peer closed, the
        handshake refused or a rule broken: already answered). The timeout bounds the whole call, as a socket's
        (socket.timeout); before the upgrade, the handshake's deadline bounds it too."""
        now = time.monotonic()
        deadline = None if self._timeout is None else now + self._timeout
        while not self._ready:
            if self._eof:
                return b""
            upgrade_by = None if self._ws is not None else self._started + self.rules.handshake_s
            until = deadline if upgrade_by is None or (deadline is not None and deadline < upgrade_by) else upgrade_by
            if until is not None:
                left = until - time.monotonic()
                if left <= 0:
                    if until is deadline:
                        self.sock.settimeout(self._timeout)
                        raise socket.timeout("timed out")
                    log.info("mqtt %s: WebSocket upgrade not finished within %.1f s (WS_HANDSHAKE_TIMEOUT_S, or "
                             "request_timeout_s when shorter); closing", self.peer, self.rules.handshake_s)
                    self._eof = True
                    return b""
                self.sock.settimeout(left)
            try:
                data = self.sock.recv(RECV_BYTES)
            except socket.timeout:
                continue  # whichever deadline passed: said above
            if not data:
                self._eof = True
                return b""
            if self._ws is None:
                self._upgrade(data)
            else:
                self._frames_in(data)
        self.sock.settimeout(self._timeout)
        ready = self._ready
        data = ready[0] if len(ready) == 1 else b"".join(ready)
        if len(data) > nbytes:
            self._ready = [data[nbytes:]]
            return data[:nbytes]
        self._ready = []
        return data

    def _upgrade(self, data):
        """The upgrade request's bytes ``data``: once whole, answered (accepted or refused); frames follow it."""
        self._head += data
        end = self._head.find(_END_OF_HEAD)
        if end < 0:
            if len(self._head) > serving_limits.WS_MAX_HANDSHAKE_BYTES:
                self._refuse(431, "the upgrade request is longer than %d bytes (WS_MAX_HANDSHAKE_BYTES)"
                             % serving_limits.WS_MAX_HANDSHAKE_BYTES)
            return
        head, rest = bytes(self._head[:end + 4]), bytes(self._head[end + 4:])
        self._head = None
        try:
            self._hs.receive_data(head)
            request = next((e for e in self._hs.events() if isinstance(e, Request)), None)
        except RemoteProtocolError as exc:
            hint = exc.event_hint
            status = hint.status_code if isinstance(hint, RejectConnection) else 400
            self._refuse(status, "not a WebSocket upgrade: %s" % exc)
            return
        if request is None:
            self._refuse(400, "not a WebSocket upgrade request")
            return
        why = self._client(request) or self._refusal(request)
        if why is not None:
            self._refuse(*why)
            return
        self._send(self._hs.send(AcceptConnection(subprotocol=self.subprotocol)))
        self._hs = None  # (the HTTP layer's state: not kept for the connection's life)
        self._ws = WsConnection(ConnectionType.SERVER, [_FrameBound(self.rules.max_frame)])
        if rest:
            self._frames_in(rest)

    def _client(self, request):
        """``(status, why)`` when the client a trusted proxy's ``X-Forwarded-For`` names is refused, else None (the
        client claimed, or no header the broker reads)."""
        values = [v for k, v in request.extra_headers if k == b"x-forwarded-for"]
        proxies = self.rules.proxies
        if not values or proxies is None or self.claim is None:
            return None
        try:
            client = proxies.forwarded_client(self.address, values)
        except ValueError as exc:
            return 400, "X-Forwarded-For from a trusted proxy: %s" % exc
        if client is None:
            return None
        refusal = self.claim(client)
        if refusal is not None:
            return 403, "the client %s named by X-Forwarded-For: %s" % (client[0], refusal)
        self.address = client
        self.peer = "%s:%s" % client
        return None

    def _refusal(self, request):
        """``(status, why)`` when the upgrade ``request`` is refused, else None (``subprotocol`` chosen)."""
        rules = self.rules
        path = request.target.split("?", 1)[0]
        if path != rules.path:
            return 404, "no WebSocket endpoint at %s (this port's path is %s: mqtt.ws_path)" % (path[:200], rules.path)
        origin = next((v for k, v in request.extra_headers if k == b"origin"), None)
        if rules.origins is not None and origin is not None:
            name = origin.decode("latin-1").rstrip("/").lower()
            if name not in rules.origins:
                return 403, "origin %s is not in mqtt.ws_allowed_origins" % name[:200]
        chosen = next((p for p in request.subprotocols if p in rules.subprotocols), None)
        if chosen is None:
            offered = ", ".join(request.subprotocols)[:200] or "none"
            return 400, ("the WebSocket subprotocol must be one of %s (Sec-WebSocket-Protocol); offered: %s"
                         % (", ".join(rules.subprotocols), offered))
        self.subprotocol = chosen
        return None

    def _refuse(self, status, why):
        """Answer the upgrade with HTTP ``status`` and ``why`` as its body; the stream ends."""
        log.info("mqtt %s: WebSocket upgrade refused (%d): %s", self.peer, status, why)
        body = (why + "\n").encode("utf-8", "replace")
        try:
            if self._hs is not None and self._hs.state is ConnectionState.CONNECTING:
                out = self._hs.send(RejectConnection(status_code=status, has_body=True, headers=[
                    (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body)),
                    (b"connection", b"close")]))
                out += self._hs.send(RejectData(data=body, body_finished=True))
            else:
                out = b"HTTP/1.1 %d Refused\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
                    status, len(body), body)
        except ProtocolError:  # the HTTP layer got no request line to answer (a stream of garbage)
            out = b"HTTP/1.1 %d Refused\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
                status, len(body), body)
        self._send(out)
        self._eof = True

    def _frames_in(self, data):
        """The frames' bytes ``data``: the common frames' payloads kept for ``recv``, each other frame's bytes, and
        no more, handed to wsproto (its events: ``_frames_arrived``), a frame not yet whole kept for the next."""
        if self._in is not None:
            self._in += data
            buf, self._in = self._in, None
        else:
            buf = data
        pos, end = 0, len(buf)
        while pos < end and not self._eof:
            owed = self._owed
            if owed:
                upto = pos + owed if owed < end - pos else end
                self._owed = owed - (upto - pos)
                self._ws.receive_data(buf[pos:upto])
                pos = upto
                self._frames_arrived()
                continue
            payload, pos, head, length = frames(buf, pos, -1 if self._fragmented else self.rules.max_frame)
            if payload:
                self._ready.append(payload)
                self._controls = 0
            if not head:
                break
            first = buf[pos]
            if first & 0x0F in (1, 2):  # a message's first frame: the message is whole in it with FIN set
                self._fragmented = not first & 0x80
            elif first & 0x8F == 0x80:  # a final continuation
                self._fragmented = False
            self._owed = head + length
        if pos < end and not self._eof:  # kept in place: a frame trickled in costs its bytes once, not once a read
            if type(buf) is not bytearray:
                self._in = bytearray(buf[pos:])
            else:
                if pos:
                    del buf[:pos]
                self._in = buf

    def _frames_arrived(self):
        """The events of the frames received so far: payload kept for ``recv``, PINGs answered, rules applied."""
        ws = self._ws
        for event in ws.events():
            if isinstance(event, BytesMessage):
                if event.data:
                    self._ready.append(bytes(event.data))
                    self._controls = 0
                if event.message_finished:
                    self._frames = 0
                elif event.frame_finished:
                    self._frames += 1
                    if self._frames >= serving_limits.WS_MAX_FRAGMENTS:
                        self._close(CloseReason.POLICY_VIOLATION, "more than %d frames in one message "
                                    "(WS_MAX_FRAGMENTS)" % serving_limits.WS_MAX_FRAGMENTS)
                        return
            elif isinstance(event, (Ping, Pong)):
                if time.monotonic() - self._tokens_at > serving_limits.WS_CONTROL_QUIET_S:
                    self._controls = 0  # the last one long ago: a library's keep-alive ping, not a flood
                self._controls += 1
                if self._controls > serving_limits.WS_CONTROL_FRAMES_WITHOUT_DATA:
                    self._close(CloseReason.POLICY_VIOLATION, "more than %d control frames with no MQTT bytes between "
                                "(WS_CONTROL_FRAMES_WITHOUT_DATA)" % serving_limits.WS_CONTROL_FRAMES_WITHOUT_DATA)
                    return
                if not self._control_budget():
                    self._close(CloseReason.POLICY_VIOLATION, "more than %d control frames a second "
                                "(WS_CONTROL_FRAMES_PER_S)" % serving_limits.WS_CONTROL_FRAMES_PER_S)
                    return
                if isinstance(event, Ping):
                    self._send_frame(event.response())
            elif isinstance(event, TextMessage):
                self._close(CloseReason.UNSUPPORTED_DATA, "a text frame (MQTT over WebSocket is binary)")
                return
            elif isinstance(event, CloseConnection):
                if ws.state is ConnectionState.OPEN:  # not the peer's close: a framing error wsproto found
                    self._close(event.code, event.reason or "framing error")
                else:
                    self._send_frame(event.response())
                    self._eof = True
                return

    def _control_budget(self):
        """One control frame taken from the peer's budget: False when none is left."""
        now = time.monotonic()
        rate = serving_limits.WS_CONTROL_FRAMES_PER_S
        self._tokens = min(float(rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _close(self, code, why):
        """End the stream for a broken rule: a close frame with ``code`` and one log line."""
        code = int(code)
        if code == CloseReason.MESSAGE_TOO_BIG:
            why = "a frame longer than %d bytes (mqtt.max_packet_bytes + WS_FRAME_MARGIN_BYTES)" % self.rules.max_frame
        log.info("mqtt %s: WebSocket closed %d: %s", self.peer, code, why)
        self._ready = []  # nothing after a broken rule is handed up
        if self._ws.state is ConnectionState.OPEN:
            self._send_frame(CloseConnection(code=code, reason=why[:120]))
        self._eof = True

    def pending(self):
        """Payload decoded and not yet returned, or bytes held by the layer beneath (TLS): what a parked connection's
        read watcher would not see; before the upgrade, 1 as well: a connection in its handshake does not park, so the
        handshake's deadline (which the core does not know) bounds its wait in ``recv``."""
        if self._ready or self._ws is None:
            return 1
        inner = getattr(self.sock, "pending", None)
        return inner() if inner is not None else 0

    # -- writing ---------------------------------------------------------------

    def sendall(self, data):
        """``data`` as one binary frame (nothing before the upgrade nor after a close), after the rest of a frame
        ``try_send`` began (``data`` empty: that rest alone)."""
        if not data and self._rest is None:
            return
        ws = self._ws
        if ws is None or ws.state is not ConnectionState.OPEN:
            raise BrokenPipeError("the WebSocket is closed")
        with self._send_lock:
            out = binary_header(len(data)) + data if data else b""
            rest = self._rest
            if rest is not None:
                self._rest = None
                out = rest + out
            raw = self._raw
            if raw is not None:  # what the socket takes now, without gevent's waiting send around it
                try:
                    sent = raw.send(out)
                except BlockingIOError:
                    sent = 0
                if sent == len(out):
                    return
                out = out[sent:]
            self.sock.sendall(out)

    def try_send(self, data):
        """``data`` (2 bytes or more) as one binary frame written now, never waiting: ``len(data)`` when the whole frame
        went; 0 when none of it did (the socket's buffer full, another send under way, or the rest of an earlier frame
        still unsent); None when it cannot go that way (TLS beneath, not open); else a number between 1 and
        ``len(data) - 1``: the frame was begun and its rest is kept (``unsent``), written before anything else this
        stream sends (``sendall``, an empty one for that rest alone). A failed send raises OSError."""
        raw = self._raw
        ws = self._ws
        if raw is None or ws is None or ws.state is not ConnectionState.OPEN:
            return None
        lock = self._send_lock
        if not lock.acquire(blocking=False):
            return 0
        try:
            rest = self._rest
            if rest is not None:
                try:
                    n = raw.send(rest)
                except BlockingIOError:
                    return 0
                if n < len(rest):
                    self._rest = rest[n:]
                    return 0
                self._rest = None
            out = binary_header(len(data)) + data
            try:
                n = raw.send(out)
            except BlockingIOError:
                return 0
            size = len(data)
            if n == len(out):
                return size
            if n <= 0:
                return 0
            self._rest = out[n:]
            return max(1, min(size - 1, n - (len(out) - size)))
        finally:
            lock.release()

    @property
    def unsent(self):
        """True while the rest of a frame ``try_send`` began is still to be written."""
        return self._rest is not None

    def send(self, data):
        self.sendall(data)
        return len(data)

    def _send_frame(self, event):
        try:
            self._send(self._ws.send(event))
        except ProtocolError:  # a state that sends nothing more
            pass

    def _send(self, out):
        try:
            with self._send_lock:
                rest = self._rest
                if rest is not None:  # a frame begun goes on before this one
                    self._rest = None
                    out = rest + out
                self.sock.sendall(out)
        except OSError:
            self._eof = True

    # -- the rest ----------------------------------------------------------------

    def settimeout(self, timeout):
        self._timeout = timeout
        self.sock.settimeout(timeout)

    def fileno(self):
        return self.sock.fileno()

    def setsockopt(self, *args):
        self.sock.setsockopt(*args)

    def close(self):
        """A close frame (1000) when it can leave now without waiting, then the socket closed."""
        ws = self._ws
        if ws is not None and ws.state is ConnectionState.OPEN and self._send_lock.acquire(blocking=False):
            try:
                self.sock.settimeout(0.0)
                self.sock.sendall((self._rest or b"") + ws.send(CloseConnection(code=CloseReason.NORMAL_CLOSURE)))
            except (OSError, ProtocolError):
                pass
            finally:
                self._send_lock.release()
        try:
            self.sock.close()
        except OSError:
            pass
