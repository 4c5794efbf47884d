"""An HTTP request sent to a port that speaks another protocol: recognised by its first line, answered with one
HTTP response that a browser or curl shows as it is. Sans-IO: bytes in, bytes out.

MetaQ's text commands are lower-case words, so a line such as ``GET / HTTP/1.1`` can only be an HTTP client (a
browser, curl, a health checker) pointed at the text port instead of the HTTP port.
"""

import re

__all__ = ["is_http_request", "refusal", "http_url", "MAX_LOOK_BYTES"]

#: The request methods recognised (RFC 9110's, and HTTP/2's connection preface ``PRI * HTTP/2.0``).
METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE", b"PRI")
#: Bytes of a connection's first data looked at: a request line longer than this is not recognised.
MAX_LOOK_BYTES = 8192

_REQUEST_LINE = re.compile(rb"(?:%s) [!-~]+ HTTP/[0-9](?:\.[0-9])?\r?\n" % b"|".join(METHODS))


def is_http_request(data):
    """True when ``data`` (a connection's first bytes) begins with a whole HTTP request line."""
    return _REQUEST_LINE.match(bytes(data[:MAX_LOOK_BYTES])) is not None


def http_url(scheme, host, port):
    """``scheme://host:port/``, an IPv6 address in brackets."""
    return "%s://%s:%d/" % (scheme, "[%s]" % host if ":" in host else host, port)


def refusal(text):
    """A whole ``400 Bad Request`` HTTP/1.1 response whose plain-text body is ``text`` and a line end; it says the
    connection closes."""
    body = (text + "\n").encode("utf-8")
    head = ("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            "Connection: close\r\n\r\n" % len(body)).encode("ascii")
    return head + body
