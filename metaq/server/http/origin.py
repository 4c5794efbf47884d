"""Requests a browser was made to send: cross-site writes (CSRF) and DNS rebinding (docs/operating.md "The HTTP port").

A page on another site can make a visitor's browser send requests to the broker: a form or a ``no-cors`` fetch
``POST`` goes out without a preflight, with the credentials the browser holds for the broker (HTTP Basic it
cached for the dashboard); and a name the attacker controls can be made to resolve to the broker's address (DNS
rebinding), so that its page reads the broker's answers as its own. Neither needs the broker to trust anything.

``BrowserCheck(names)(environ)`` returns why a request is refused, or None:

* a write (any method but GET and HEAD) whose ``Sec-Fetch-Site`` says another site sent it, or whose ``Origin``
  is not the address the request was sent to (``Host``), or is ``null`` (a sandboxed or local page);
* a request for a ``Host`` that is not an IP address, ``localhost`` or one of ``names`` (this machine's host name,
  ``broker.host``/``http.host`` and ``http.allowed_hosts``): a name the broker does not go by is what a rebinding
  page uses. Checked for a request a browser marks as its own (``Sec-Fetch-Site`` or ``Origin``) and, when
  ``every_request`` (authentication off on a loopback port), for every request: a browser sends neither header
  with a plain-http page's own reads.

With authentication on, clients other than browsers (curl, the Python client, Prometheus) send neither header and
may use any name; a rebinding page gets no credentials (the browser holds none for its name).
Pure logic: no socket, no DNS.
"""

import ipaddress
from urllib.parse import urlsplit

_SAFE_METHODS = ("GET", "HEAD")
#: Liveness and readiness say nothing a page could use: probes (a kubelet's, a load balancer's) may name any host.
PROBES = ("/healthz", "/readyz")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value, scheme="http"):
    """``(name lowercased without a trailing dot, port)`` of a Host header or an origin's netloc (read by
    ``urllib.parse``); None when it cannot be read."""
    value = (value or "").strip()
    if not value or any(c in value for c in " /@\\?#"):
        return None
    try:
        parts = urlsplit("//" + value)
        name, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, a bracket not closed
        return None
    if not name:
        return None
    return name.rstrip("."), port if port is not None else _DEFAULT_PORTS.get(scheme, 80)


def _is_address(name):
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class BrowserCheck:
    """``names``: the names the broker goes by beside addresses and localhost (``http.allowed_hosts`` and this
    machine's); ``every_request``: check the Host of every request, not only of those a browser marks as its own
    (authentication off on a loopback port, ``make run``'s broker: a browser does not send ``Sec-Fetch-*`` to a
    plain-http name, so a rebinding page's reads look like any client's, and everything is readable there)."""

    def __init__(self, names=(), every_request=False, configured=()):
        names = {n.lower().rstrip(".") for n in names if n}
        self.any_name = "*" in names
        self.names = names | {"localhost"}
        self.configured = {n.lower().rstrip(".") for n in configured if n}  # http.allowed_hosts, by the operator
        self.every_request = every_request

    def known_name(self, name):
        return self.any_name or name in self.names or name.endswith(".localhost") or _is_address(name)

    def __call__(self, environ):
        """Why this request is refused (a sentence for the 403), or None."""
        scheme = environ.get("wsgi.url_scheme", "http")
        host = split_host(environ.get("HTTP_HOST"), scheme)
        site = (environ.get("HTTP_SEC_FETCH_SITE") or "").strip().lower()
        origin = environ.get("HTTP_ORIGIN")
        from_browser = bool(site or origin is not None)  # (Node's fetch sends Sec-Fetch-Mode alone: not a browser)
        if not from_browser and (not self.every_request or environ.get("PATH_INFO") in PROBES):
            return None
        if host is None or not self.known_name(host[0]):
            return ("a request for host %r, which is not a name of this broker: add the name to "
                    "http.allowed_hosts (a page reaching the broker under a name of its own is DNS rebinding)"
                    % (environ.get("HTTP_HOST") or "")[:100])
        if environ.get("REQUEST_METHOD") in _SAFE_METHODS or not from_browser:
            return None
        if site in ("cross-site", "same-site"):
            return "a write sent by a page of another site (Sec-Fetch-Site: %s): refused (cross-site request)" % site
        if origin is not None:
            parsed = urlsplit(origin.strip()) if origin.strip() != "null" else None
            theirs = split_host(parsed.netloc, parsed.scheme) if parsed and parsed.scheme in _DEFAULT_PORTS else None
            # a name the operator configured: the same name is the same site, whatever the port (a TLS-terminating
            # proxy in front: the page's origin is https on 443, the request here plain http)
            same = theirs is not None and (theirs == host or theirs[0] == host[0] in self.configured)
            if not same:
                return ("a write from origin %r to %s://%s: refused (cross-site request; the dashboard's own "
                        "pages are of the same origin)" % (origin[:100], scheme, environ.get("HTTP_HOST", "")[:100]))
        return None
