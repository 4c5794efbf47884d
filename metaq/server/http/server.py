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
"""

import json
import logging

from gevent import pywsgi

from metaq import limits
from metaq.server.connections import Connection

log = logging.getLogger(__name__)


class Dropped(OSError):
    """The connection ended (a deadline passed, the peer went) in the middle of a request: no reply."""


class HeadTooLarge(Exception):
    """The request's header lines passed ``limits.HTTP_MAX_HEADER_BYTES``."""


class RequestState:
    """What ``Connection.receive`` asks of a parser: inside a request (its deadline applies) and how many
    requests completed (each restarts that deadline)."""

    __slots__ = ("in_frame", "completed")

    def __init__(self):
        self.in_frame = False
        self.completed = 0


class ConnReader:
    """A file-like reader (``readline``, ``read``) over ``Connection.receive``: what pywsgi reads requests from.

    It counts the bytes of each request's head (request line and headers) and raises ``HeadTooLarge`` past
    the limit; a connection that ends inside a request raises ``Dropped`` (never a truncated request handed
    on as if whole); one that ends between requests reads as the end of the stream.
    """

    def __init__(self, conn, state, max_head=limits.HTTP_MAX_HEADER_BYTES + limits.HTTP_MAX_REQUEST_LINE):
        self.conn = conn
        self.state = state
        self.max_head = max_head
        self.buf = bytearray()
        self.eof = False
        self.stopped = False
        self.closed = False
        self.in_head = False
        self.head_bytes = 0

    def start_request(self):
        """A request's head begins (pywsgi reads its request line next)."""
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
        data = self.conn.receive()
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


_431 = (b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n")


class Handler(pywsgi.WSGIHandler):
    """pywsgi's handler, reading through the connection's ConnReader (see the module doc)."""

    def read_requestline(self):
        self.rfile.start_request()
        return super().read_requestline()

    def MessageClass(self, *args):  # noqa: N802 - pywsgi's name
        """The request's headers, as pywsgi parses them; notes a request framed twice (Transfer-Encoding and
        Content-Length: pywsgi silently drops the latter) before pywsgi sees it, for routes.Router to refuse."""
        headers = super().MessageClass(*args)
        self.metaq_framed_twice = "transfer-encoding" in headers and "content-length" in headers
        return headers

    def get_environ(self):
        self.rfile.head_done()
        env = super().get_environ()
        conn = self.metaq_conn
        env["wsgi.url_scheme"] = "https" if conn.tls else "http"
        env["metaq.session"] = conn.session
        env["metaq.request_done"] = self.rfile.request_done
        env["metaq.stop_reading"] = self.rfile.stop
        env["metaq.framed_twice"] = getattr(self, "metaq_framed_twice", False)
        return env

    def _handle_client_error(self, ex):
        if isinstance(ex, Dropped):
            return None
        if isinstance(ex, HeadTooLarge):
            body = (b'{"code": 431, "error": "the request headers pass %d bytes '
                    b'(limits.HTTP_MAX_HEADER_BYTES)"}' % limits.HTTP_MAX_HEADER_BYTES)
            return "431", (_431 % len(body)) + body
        return super()._handle_client_error(ex)


class HttpConnection(Connection):
    """One connection of the HTTP port."""

    log_prefix = "http"

    def __init__(self, sock, address, conn_id, rules, wsgi):
        super().__init__(sock, address, conn_id, rules)
        self.parser = RequestState()  # Connection.receive: the request deadline while inside a request
        self.wsgi = wsgi

    @property
    def busy(self):
        return self.parser.in_frame

    def serve(self):
        reader = ConnReader(self, self.parser)
        handler = Handler(self.sock, self.address, self.wsgi, rfile=reader)
        handler.metaq_conn = self
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

    def __init__(self, core, app):
        self.core = core
        self.app = app
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
        return HttpConnection(sock, address, conn_id, self.core.rules, self.wsgi)

    def connection_count(self):
        return self.core.count("http")


def refuse(sock, reason, code=503):
    """The HTTP port's refusal of a connection (past a cap: 503; plaintext on a TLS-only port: 400), then closed."""
    body = json.dumps({"code": code, "error": reason}).encode()
    sock.sendall(b"HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d"
                 b"\r\n\r\n%s" % (code, b"Service Unavailable" if code == 503 else b"Bad Request", len(body), body))

