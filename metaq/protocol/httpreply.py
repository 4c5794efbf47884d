"""The HTTP port's answers and what a route needs of its user, sans-IO (``server.http.routes`` serves them).

A ``Response`` is a status, a body and its headers; errors are JSON, ``{"code": <the text protocol's code>,
"error": "<message>"}``, with the same code as the HTTP status, except ``301`` (an offset out of range; the JSON
also has ``"offset"``: where to read from), answered with HTTP 416, and a code HTTP has no reason for, answered
with HTTP 500. The server's routes and the features' (admin, timers, trace) build their answers here.
"""

import json

from metaq import errors

__all__ = ["OPEN", "READ", "REASONS", "Response", "json_response", "error_response", "error_for"]

#: What a route needs of the request's user: nothing, or what ``stats`` needs (any authenticated user).
OPEN = "open"
READ = "read"

#: The reason phrase of each status the port answers with.
REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 411: "Length Required", 413: "Content Too Large",
            416: "Range Not Satisfiable", 500: "Internal Server Error", 503: "Service Unavailable",
            504: "Gateway Timeout", 507: "Insufficient Storage"}


class Response:
    """An answer: its status, body (bytes), content type and headers."""

    __slots__ = ("status", "body", "content_type", "headers")

    def __init__(self, status, body, content_type="application/json", headers=()):
        self.status = status
        self.body = body if isinstance(body, bytes) else body.encode("utf-8")
        self.content_type = content_type
        self.headers = list(headers)


def json_response(value, status=200):
    """A JSON answer of ``value``."""
    return Response(status, json.dumps(value, sort_keys=False) + "\n")


def error_response(code, message, status=None, **more):
    """A JSON error: ``code`` and ``message`` (and ``more``), HTTP ``status`` (``code`` unless given)."""
    doc = {"code": code, "error": message}
    doc.update(more)
    resp = json_response(doc, status or code)
    if code == 401:
        resp.headers.append(("WWW-Authenticate", 'Basic realm="metaq", charset="UTF-8"'))
    return resp


def error_for(exc):
    """The JSON reply of a MetaqError, with its text-protocol code (see the module doc)."""
    if isinstance(exc, errors.Moved):
        return error_response(301, str(exc) or "offset out of range", status=416, offset=exc.offset)
    code = exc.code
    return error_response(code, str(exc), status=code if code in REASONS else 500)
