"""The HTTP port's WSGI application: a route table, HTTP Basic authentication, JSON errors, bounded bodies.

A route's answer (``Response``, ``json_response``, ``error_response``) and what it needs of its user (``OPEN``,
``READ``) are ``protocol.httpreply``'s, so that the features' routes use them without importing the server.

A route is ``(method, pattern, needs, handler)``: ``pattern`` a path whose ``{name}`` parts are captured
(one path segment each), ``needs`` what the request's user must be allowed (``OPEN``: nothing, ``READ``:
what ``stats`` needs, i.e. any authenticated user; or a callable ``needs(guard, session, params)`` that calls
``guard.require``), ``handler(request)`` returns a ``Response``. Other parts of the broker (admin
operations) add routes with ``Router.add``: the seam for them.

Errors are JSON, ``{"code": <the text protocol's code>, "error": "<message>"}``, with the same code as the
HTTP status, except ``301`` (an offset out of range; the JSON also has ``"offset"``: where to read from),
answered with HTTP 416, and ``512`` (a corrupt record), answered with HTTP 500.
"""

import base64
import binascii
import logging
import re
from urllib.parse import parse_qs


from metaq import errors
from metaq.server.http import limits as http_limits
from metaq.protocol.httpreply import OPEN, READ, REASONS, Response, error_for, error_response
from metaq.server.http.origin import BrowserCheck

log = logging.getLogger(__name__)

class Dropped(OSError):
    """The connection ended (a deadline passed, the peer went) in the middle of a request: no reply."""


class Request:
    """One request: its method, path parameters, query, session, and its body read on demand (bounded)."""

    def __init__(self, environ, params):
        self.environ = environ
        self.method = environ["REQUEST_METHOD"]
        self.params = params
        self.query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True).items()}
        self.session = environ.get("metaq.session")
        self._body = None

    def arg(self, name, default=None, kind=str):
        """The query parameter ``name`` as ``kind`` (default when absent); ClientError for a bad value."""
        value = self.query.get(name)
        if value is None or value == "":
            return default
        try:
            return kind(value)
        except ValueError:
            raise errors.ClientError("query parameter %s: %r is not a valid %s" % (name, value, kind.__name__)) \
                from None

    def pace(self, kind, nbytes):
        """Wait as the user's rate of ``kind`` says after ``nbytes`` (``Connection.pace``: the reply is delayed in
        this connection's greenlet, never refused); nothing outside a connection (no pacer in the environ)."""
        pace = self.environ.get("metaq.pace")
        if pace is not None and nbytes:
            pace(kind, nbytes)

    def body(self):
        """The request body (already checked against ``limits.HTTP_MAX_BODY_BYTES`` by its Content-Length)."""
        if self._body is None:
            stream = self.environ["wsgi.input"]
            try:
                data = stream.read(http_limits.HTTP_MAX_BODY_BYTES + 1)  # chunked: no length was announced
            except OSError as exc:  # the body stopped arriving (pywsgi: "unexpected end of file"): no answer
                raise Dropped(str(exc)) from None
            if len(data) > http_limits.HTTP_MAX_BODY_BYTES:
                raise BodyTooLarge()
            self._body = data
            self.environ["metaq.body_read"] = True
        return self._body


class BodyTooLarge(Exception):
    pass


def _compile(pattern):
    regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
    return re.compile("^%s$" % regex)


class Router:
    """The route table and the WSGI application over it (see the module doc)."""

    def __init__(self, guard, open_metrics=True, browser_check=None):
        self.guard = guard
        self.open_metrics = open_metrics
        self.browser_check = browser_check or BrowserCheck()  # cross-site writes, DNS rebinding (origin.py)
        self.routes = []

    def add(self, method, pattern, needs, handler):
        self.routes.append((method, pattern, _compile(pattern), needs, handler))

    def match(self, method, path):
        """``(handler, needs, params)``, or a Response (404 no such path, 405 not that method)."""
        allowed = []
        for m, _pattern, regex, needs, handler in self.routes:
            found = regex.match(path)
            if found is None:
                continue
            if m != method and not (method == "HEAD" and m == "GET"):
                allowed.append(m)
                continue
            return handler, needs, found.groupdict()  # PATH_INFO is already unquoted
        if allowed:
            resp = error_response(405, "%s is not allowed on %s (allowed: %s)" % (method, path, ", ".join(allowed)))
            resp.headers.append(("Allow", ", ".join(allowed)))
            return resp
        return error_response(404, "no such path: %s" % path)

    def __call__(self, environ, start_response):
        resp = self.respond(environ)
        done = environ.get("metaq.request_done")
        if done is not None:
            done()
        if environ.get("metaq.body_read") is None and _has_body(environ) and \
                ("Connection", "close") not in resp.headers:
            # answered without reading the body (refused, no such path): the connection closes after the answer
            # rather than read and throw away a body that may never end (a chunked one has no length)
            resp.headers.append(("Connection", "close"))
        if ("Connection", "close") in resp.headers and environ.get("metaq.stop_reading") is not None:
            environ["metaq.stop_reading"]()  # the body is not read: the connection closes after the answer
        headers = [("Content-Type", resp.content_type), ("Content-Length", str(len(resp.body))),
                   ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff")] + resp.headers
        start_response("%d %s" % (resp.status, REASONS.get(resp.status, "Error")), headers)
        return [resp.body] if environ["REQUEST_METHOD"] != "HEAD" else [b""]

    def respond(self, environ):
        length = environ.get("CONTENT_LENGTH")
        coding = environ.get("HTTP_TRANSFER_ENCODING")
        if coding is not None and (length or coding.strip().lower() != "chunked"):
            # RFC 9112 6.1: a coding pywsgi does not frame by may be request smuggling (a proxy that reads it
            # otherwise sees another request boundary): refused, the body unread, the connection closed after the
            # answer (the server's handler refuses a Content-Length beside it, or either given twice, earlier)
            return _closing(error_response(400, "Transfer-Encoding %r: refused (only chunked, and never with a "
                                                "Content-Length)" % coding))
        if length:
            n = int(length)  # plain digits: the server's handler refused anything else
            if n > http_limits.HTTP_MAX_BODY_BYTES:
                return _closing(error_response(413, "the body is %d bytes: the limit is %d (limits.HTTP_MAX_BODY_BYTES)"
                                               % (n, http_limits.HTTP_MAX_BODY_BYTES)))
        refused = self.browser_check(environ)
        if refused is not None:
            log.info("http %s: %s", environ.get("REMOTE_ADDR"), refused)
            return error_response(403, refused)
        found = self.match(environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/"))
        if isinstance(found, Response):
            return found
        handler, needs, params = found
        request = Request(environ, params)
        try:
            self.authorize(request, needs)
            return handler(request)
        except BodyTooLarge:
            return _closing(error_response(413, "the body passes %d bytes (limits.HTTP_MAX_BODY_BYTES)"
                                           % http_limits.HTTP_MAX_BODY_BYTES))
        except errors.MetaqError as exc:
            return error_for(exc)

    def authorize(self, request, needs):
        """Check HTTP Basic credentials (when authentication is on) and what the route needs."""
        guard = self.guard
        if not guard.enabled or needs == OPEN:
            return
        session = request.session
        session.user = None  # HTTP is stateless: each request proves its user
        name, secret = _basic(request.environ.get("HTTP_AUTHORIZATION"))
        if name is None:
            raise errors.Unauthenticated("authentication required: send HTTP Basic credentials (user and secret)")
        guard.login_with_secret(session, name, secret, "http")
        if needs == READ:
            guard.current_user(session)
        else:
            needs(guard, session, request.params)


def _basic(header):
    """``(user, secret bytes)`` from an ``Authorization: Basic`` header, or ``(None, None)``."""
    if not header or not header.lower().startswith("basic "):
        return None, None
    try:
        raw = base64.b64decode(header[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None, None
    name, sep, secret = raw.partition(b":")
    if not sep:
        return None, None
    return name.decode("utf-8", "replace"), secret


def _has_body(environ):
    length = environ.get("CONTENT_LENGTH")
    return environ.get("HTTP_TRANSFER_ENCODING") is not None or (length is not None and length.strip("0 ") != "")


def _closing(resp):
    resp.headers.append(("Connection", "close"))
    return resp
