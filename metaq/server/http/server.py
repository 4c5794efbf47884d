"""The HTTP port's listener: gevent's WSGI handler driven per connection accepted by the connection core.

The port does not run a ``gevent.pywsgi.WSGIServer`` of its own: its listener is opened with
``ConnectionCore.listen("http", ...)``, so the one connection cap, the per-address cap, the allow-list, TLS
(``security.tls.mode``) and the deadlines apply to it as to every port. For each accepted connection the core
calls ``HttpConnection.serve``, which runs one ``pywsgi.WSGIHandler`` (HTTP/1.1, keep-alive, chunked bodies)
over a reader that takes its bytes through ``Connection.receive``: no request for ``idle_timeout_s`` closes the
connection, and a request begun must be complete (request line, headers and body) within
``request_timeout_s`` of its first byte, so a slow-loris client is dropped. The request line
(``limits.HTTP_MAX_REQUEST_LINE``, 414), the header lines (``limits.HTTP_MAX_HEADER_BYTES``, 431) and the body
(``limits.HTTP_MAX_BODY_BYTES``: 413 from the Content-Length, before reading it; routes.py) are bounded.
Replies are bounded too (``UnsentReplies``): what clients have not read, in all, and how long one may take to.
"""

import email.errors
import json
import logging
import re
import socket
import time

from gevent import pywsgi

from metaq import limits
from metaq.server.http import limits as http_limits
from metaq.serving.connections import Connection, share_loop
from metaq.server.http.routes import Dropped

log = logging.getLogger(__name__)


class BadFraming(ValueError):
    """The request's body is framed in a way a proxy could read otherwise (``framing_error``)."""


class HeadTooLarge(Exception):
    """The request's header lines passed ``limits.HTTP_MAX_HEADER_BYTES``."""


class RequestState:
    """What ``Connection.receive`` asks of a parser: inside a request (its deadline applies), how many requests
    completed (each restarts that deadline) and the bytes received not yet read (the broker-wide budget of
    unfinished requests counts them)."""

    __slots__ = ("in_frame", "completed", "reader")

    def __init__(self):
        self.in_frame = False
        self.completed = 0
        self.reader = None  # the ConnReader: its buffer

    @property
    def buffered(self):
        return len(self.reader.buf) if self.reader is not None else 0


class ConnReader:
    """A file-like reader (``readline``, ``read``) over ``Connection.receive``: what pywsgi reads requests from.

    It counts the bytes of each request's head (request line and headers) and raises ``HeadTooLarge`` past
    the limit; a connection that ends inside a request raises ``Dropped`` (never a truncated request handed
    on as if whole); one that ends between requests reads as the end of the stream.
    """

    def __init__(self, conn, state, max_head=http_limits.HTTP_MAX_HEADER_BYTES + http_limits.HTTP_MAX_REQUEST_LINE):
        self.conn = conn
        self.state = state
        self.max_head = max_head
        self.buf = bytearray()
        self.eof = False
        self.stopped = False
        self.closed = False
        self.in_head = False
        self.head_bytes = 0
        self.turn = time.monotonic()  # when this connection's turn of the event loop began (share_loop)

    def start_request(self):
        """A request's head begins (pywsgi reads its request line next): where a pipeline of requests already
        received lets the other connections run every MAX_TURN_MS (as ``_fill`` does within one request)."""
        self.turn = share_loop(self.turn)
        self.in_head = True
        self.head_bytes = 0
        self.state.in_frame = bool(self.buf)

    def head_done(self):
        self.in_head = False

    def request_done(self):
        """The request has been read whole (its body included): the request deadline restarts."""
        self.state.completed += 1
        self.state.in_frame = False

    def stop(self):
        """Read nothing more (a refused request whose body is not to be read: the connection closes after the
        answer; pywsgi's discard of the unread body then ends at once)."""
        self.eof = self.stopped = True
        self.state.in_frame = False
        self.buf.clear()

    def _fill(self):
        if self.eof:
            return False
        # A client that keeps the socket full (pipelined requests, an endless chunked body) never makes a receive
        # wait, and a greenlet that never waits never lets the others run: every MAX_TURN_MS it lets them.
        self.turn = share_loop(self.turn)
        asked = time.monotonic()
        data = self.conn.receive(http_limits.HTTP_RECV_BYTES)
        now = time.monotonic()
        if now - asked > WAITED_S:  # the receive waited for the peer (the others ran): a new turn begins
            self.turn = now
        if not data:
            self.eof = True
            return False
        self.state.in_frame = True
        self.buf += data
        return True

    def _take(self, n):
        out = bytes(self.buf[:n])
        del self.buf[:n]
        if self.in_head:
            self.head_bytes += n
            if self.head_bytes > self.max_head:
                raise HeadTooLarge()
        return out

    def _ended(self):
        if self.state.in_frame or self.buf or self.stopped:
            raise Dropped("the connection ended inside a request")
        return b""

    def readline(self, limit=-1):
        start = 0
        while True:
            i = self.buf.find(b"\n", start)
            if i >= 0 and (limit is None or limit < 0 or i < limit):
                return self._take(i + 1)
            if limit is not None and 0 <= limit <= len(self.buf):
                return self._take(limit)
            start = len(self.buf)
            if not self._fill():
                return self._ended()

    def read(self, n=-1):
        if n is None or n < 0:
            while self._fill():
                pass
            return self._take(len(self.buf))
        while len(self.buf) < n:
            if not self._fill():
                if not self.buf:
                    return self._ended()
                break
        return self._take(min(n, len(self.buf)))

    def close(self):
        self.closed = True


_400 = (b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n")
_DIGITS = re.compile(r"[0-9]{1,19}\Z")
#: The e-mail parser's defects that mean a header line was not one (not those of a multipart Content-Type with no
#: body: a form's POST is well formed).
_BROKEN_LINES = (email.errors.MissingHeaderBodySeparatorDefect, email.errors.FirstHeaderLineIsContinuationDefect)


def framing_error(headers):
    """Why a request's framing is refused (RFC 9112), or None: Transfer-Encoding with Content-Length (pywsgi would
    silently drop the latter), either one twice, a Content-Length that is not plain digits (``int()`` takes
    ``+10`` and ``1_0``), or a header name with white space (``Content-Length : 5`` would be ignored): a proxy in
    front that reads such a request otherwise sees another request boundary (request smuggling)."""
    if any(isinstance(d, _BROKEN_LINES) for d in headers.defects):  # a line that is no header ("Content-Length :
        return "a malformed header line"  # 5") ends the headers for the parser: the rest would be read as the body
    names = headers.keys()
    if any(name != name.strip() or " " in name or "\t" in name for name in names):
        return "a header name with white space"
    lengths = headers.get_all("content-length") or []
    codings = headers.get_all("transfer-encoding") or []
    if len(lengths) > 1 or len(codings) > 1:
        return "the body's framing given twice"
    if lengths and codings:
        return "Transfer-Encoding with a Content-Length"
    if lengths and not _DIGITS.match(lengths[0].strip()):
        return "Content-Length %r is not a number" % lengths[0][:40]
    return None


#: A receive that took longer than this waited for its bytes (the loop ran other greenlets meanwhile).
WAITED_S = 0.0005

_431 = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n")


class UnsentReplies:
    """The HTTP port's replies produced but not yet taken by the kernel, in all (``held`` bytes), and the rules
    that bound them: past ``limit`` a new request is answered 503 at once, its reply never produced
    (``Handler.run_application``), and a reply must be taken within ``send_s`` seconds or its connection closes.
    A reply is produced and handed to its send without the loop running another request, so what is held stays
    below ``limit`` plus one reply."""

    __slots__ = ("limit", "send_s", "held", "refused")

    def __init__(self, limit=http_limits.MAX_HTTP_UNSENT_BYTES, send_s=limits.REQUEST_TIMEOUT_S):
        self.limit = limit
        self.send_s = send_s
        self.held = 0
        self.refused = 0  # requests answered 503 because of it

    def full(self):
        return self.held > self.limit


_503 = json.dumps({"code": 503, "error": "the HTTP port's clients hold too many unread replies "
                   "(limits.max_http_unsent_bytes): try again"}).encode()


class Handler(pywsgi.WSGIHandler):
    """pywsgi's handler, reading through the connection's ConnReader (see the module doc)."""

    def read_requestline(self):
        self.rfile.start_request()
        return super().read_requestline()

    def MessageClass(self, *args):  # noqa: N802 - pywsgi's name
        """The request's headers, as pywsgi parses them; a request whose framing a proxy in front could read
        otherwise than pywsgi does (``framing_error``) is refused with a 400 before its body is read."""
        headers = super().MessageClass(*args)
        reason = framing_error(headers)
        if reason is not None:
            raise BadFraming("%s: refused (RFC 9112: a proxy could frame it otherwise)" % reason)
        return headers

    def get_environ(self):
        self.rfile.head_done()
        env = super().get_environ()
        conn = self.metaq_conn
        env["wsgi.url_scheme"] = "https" if conn.tls else "http"
        env["metaq.session"] = conn.session
        env["metaq.request_done"] = self.rfile.request_done
        env["metaq.stop_reading"] = self.rfile.stop
        env["metaq.pace"] = conn.pace  # the user's rates (Connection.pace, Guard.pace): a get's reply waits
        return env

    def run_application(self):
        """The route's answer, or a small 503 when the port's unread replies are past their budget."""
        unsent = self.metaq_unsent
        if not unsent.full():
            return super().run_application()
        unsent.refused += 1
        self.start_response("503 Service Unavailable", [("Content-Type", "application/json"),
                                                        ("Content-Length", str(len(_503))), ("Retry-After", "1")])
        self.result = [_503]
        try:
            self.process_result()
        finally:
            self.result = None

    def _sendall(self, data):
        """Send counted in the port's unread replies, within their deadline (a client that does not read is
        closed after ``send_s``, its reply let go)."""
        unsent, n = self.metaq_unsent, len(data)
        unsent.held += n
        self.socket.settimeout(unsent.send_s)
        try:
            super()._sendall(data)
        except OSError as exc:
            if isinstance(exc, socket.timeout) or "timed out" in str(exc):  # (gevent's TLS: an SSLError)
                log.info("http %s: a reply of %d bytes not read within %.0f s; closing", self.metaq_conn.peer, n,
                         unsent.send_s)
                raise Dropped("a reply not read within %.0f s" % unsent.send_s) from None
            raise
        finally:
            unsent.held -= n

    def _handle_client_error(self, ex):
        """A request pywsgi could not parse: one log line (through the log's flood filter; pywsgi would print a
        traceback to stderr for some) and a 400 or 431; the connection closes."""
        if isinstance(ex, Dropped):
            return None
        if isinstance(ex, HeadTooLarge):
            body = (b'{"code": 431, "error": "the request headers pass %d bytes '
                    b'(limits.HTTP_MAX_HEADER_BYTES)"}' % http_limits.HTTP_MAX_HEADER_BYTES)
            return "431", (_431 % len(body)) + body
        reason = getattr(ex, "formatted_message", None) or str(ex) or type(ex).__name__
        log.info("http %s: a malformed request: %s", self.metaq_conn.peer, reason[:200])
        body = json.dumps({"code": 400, "error": "malformed request: %s" % reason[:200]}).encode("utf-8")
        return "400", (_400 % len(body)) + body

    def handle_error(self, t, v, tb):
        """An exception out of the application: a connection that ended inside the request's body (``Dropped``)
        is closed without an answer; anything else is one log line with its traceback and a 500."""
        if t is not None and issubclass(t, Dropped):
            self.close_connection = True
            return
        log.error("http %s: internal error answering %r", self.metaq_conn.peer, getattr(self, "requestline", ""),
                  exc_info=(t, v, tb))
        self._send_error_response_if_possible(500)


class HttpConnection(Connection):
    """One connection of the HTTP port."""

    paces_receive = False  # each request proves its own user: a put charges its body (routes.Request.pace)

    log_prefix = "http"

    def __init__(self, sock, address, conn_id, rules, wsgi, unsent):
        super().__init__(sock, address, conn_id, rules)
        self.parser = RequestState()  # Connection.receive: the request deadline while inside a request
        self.wsgi = wsgi
        self.unsent = unsent

    @property
    def busy(self):
        return self.parser.in_frame

    def serve(self):
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, http_limits.HTTP_SEND_BUFFER_BYTES)
        except OSError as exc:
            log.debug("http %s: SO_SNDBUF not set: %s", self.peer, exc)
        reader = self.parser.reader = ConnReader(self, self.parser)
        handler = Handler(self.sock, self.address, self.wsgi, rfile=reader)
        handler.metaq_conn = self
        handler.metaq_unsent = self.unsent
        try:
            handler.handle()
        except Dropped:
            pass
        except OSError as exc:
            log.debug("http %s: %s", self.peer, exc)


class _LogAdapter:
    """pywsgi's access and error logs, to the logging module (access lines at DEBUG)."""

    def __init__(self, level):
        self.level = level

    def write(self, line):
        log.log(self.level, "%s", line.rstrip())

    def flush(self):
        pass


class HttpFrontEnd:
    """The HTTP port: a listener on the connection core whose connections run the WSGI ``app``."""

    def __init__(self, core, app, unsent):
        self.core = core
        self.app = app
        self.unsent = unsent
        self.listener = None
        # not started: it only carries the application, the base environ and the logs for the handler
        self.wsgi = pywsgi.WSGIServer(("127.0.0.1", 0), app, log=_LogAdapter(logging.DEBUG),
                                      error_log=_LogAdapter(logging.ERROR))

    @property
    def port(self):
        return self.listener.port if self.listener is not None else None

    def listen(self, host, port):
        self.listener = self.core.listen("http", host, port, self._connection, refuse=refuse)
        self.wsgi.environ.update({"SERVER_NAME": host, "SERVER_PORT": str(self.listener.port)})
        return self.listener

    def _connection(self, sock, address, conn_id):
        return HttpConnection(sock, address, conn_id, self.core.rules, self.wsgi, self.unsent)

    def connection_count(self):
        return self.core.count("http")


def refuse(sock, reason, code=503):
    """The HTTP port's refusal of a connection (past a cap: 503; plaintext on a TLS-only port: 400), then closed."""
    body = json.dumps({"code": code, "error": reason}).encode()
    sock.sendall(b"HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d"
                 b"\r\n\r\n%s" % (code, b"Service Unavailable" if code == 503 else b"Bad Request", len(body), body))

