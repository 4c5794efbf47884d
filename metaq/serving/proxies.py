"""Clients behind a reverse proxy (docs/security.md "Behind a proxy"): whose word on a client's address is taken,
and the PROXY header read off a socket.

``TrustedProxies.real_address(peer, claimed)`` is the one decision: a claimed client address (a PROXY header's, a
WebSocket upgrade's ``X-Forwarded-For``, read by ``forwarded_client``) replaces the peer's only when the peer is in
``security.trusted_proxies``.
The connection core asks it once per connection, before anything counts or logs the address, so the per-address
caps and shares, the cooldowns, the allow-list, logs and ``stats`` all see the client's address.
"""

import ipaddress
import socket
import time

from metaq.serving import limits as serving_limits
from metaq.auth.acl import address_in
from metaq.protocol.proxyheader import ProxyHeaderError, parse

__all__ = ["TrustedProxies", "read_header", "ProxyHeaderError"]


class TrustedProxies:
    """``security.trusted_proxies`` (networks) and ``security.proxy_protocol`` (the listeners that require a PROXY
    header from them)."""

    __slots__ = ("networks", "listeners")

    def __init__(self, networks=(), listeners=()):
        self.networks = tuple(ipaddress.ip_network(n, strict=False) for n in networks)
        self.listeners = frozenset(listeners)

    def trusts(self, host):
        """True when the peer ``host`` (text) is a trusted proxy."""
        return bool(self.networks) and address_in(host, self.networks)

    def real_address(self, peer, claimed):
        """The address to take for a connection from ``peer`` (``(host, port)``) that claims to carry ``claimed``
        (``(host, port)``, or None: it names none): ``claimed`` when ``peer`` is a trusted proxy, else ``peer``."""
        if claimed is None or not isinstance(peer, tuple) or not self.trusts(peer[0]):
            return peer
        return claimed

    def forwarded_client(self, peer, values):
        """The client an ``X-Forwarded-For`` names (``values``: the header's values, in order, as bytes) on a
        connection from ``peer`` (``(host, port)``): ``(host, 0)``, the rightmost hop that is no trusted proxy (the
        leftmost when all are), to hand to ``real_address``; None when ``peer`` is no trusted proxy (its header is
        not read) or there is no header. Raises ValueError (why) for more than ``limits.FORWARDED_MAX_HOPS`` hops or
        a hop that is no IP address (a trusted proxy's header must be right)."""
        if not values or not isinstance(peer, tuple) or not self.trusts(peer[0]):
            return None
        hops = b",".join(values).decode("latin-1").split(",")
        if len(hops) > serving_limits.FORWARDED_MAX_HOPS:
            raise ValueError("%d hops, more than %d (FORWARDED_MAX_HOPS)"
                             % (len(hops), serving_limits.FORWARDED_MAX_HOPS))
        hosts = [_hop(h) for h in hops]
        client = next((h for h in reversed(hosts) if not self.trusts(h)), hosts[0])
        return client, 0

    def requires_header(self, listener_name, peer):
        """True when a connection from ``peer`` on ``listener_name`` must begin with a PROXY header."""
        return listener_name in self.listeners and isinstance(peer, tuple) and self.trusts(peer[0])


def _hop(text):
    """The IP address of one ``X-Forwarded-For`` hop (``1.2.3.4``, ``1.2.3.4:80``, ``2001:db8::1``,
    ``[2001:db8::1]:80``), as text; ValueError for anything else."""
    hop = text.strip()
    host = hop
    if hop.startswith("[") and "]" in hop:
        host = hop[1:hop.index("]")]
    elif hop.count(":") == 1:
        host = hop.split(":", 1)[0]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError("the hop %r is no IP address" % hop[:64]) from None


def read_header(sock, deadline_s):
    """The client address of the PROXY header at the start of ``sock`` (None: the header names none), reading no
    byte past it, within ``deadline_s`` however the bytes trickle; raises ``ProxyHeaderError`` (malformed, too long,
    not complete in time, closed before its end)."""
    before = sock.gettimeout()
    try:
        return _read(sock, deadline_s)
    finally:
        sock.settimeout(before)


def _read(sock, deadline_s):
    taken = b""
    until = time.monotonic() + deadline_s
    while True:
        left = until - time.monotonic()
        if left <= 0:
            raise ProxyHeaderError("no complete PROXY header within %g s" % deadline_s)
        sock.settimeout(left)
        try:
            seen = sock.recv(4096, socket.MSG_PEEK)
        except socket.timeout:
            raise ProxyHeaderError("no complete PROXY header within %g s" % deadline_s) from None
        except OSError as exc:
            raise ProxyHeaderError("closed in its PROXY header: %s" % exc) from None
        if not seen:
            raise ProxyHeaderError("closed before the end of its PROXY header")
        parsed = parse(taken + seen)
        want = len(seen) if parsed is None else parsed[0] - len(taken)
        _take(sock, want)
        if parsed is not None:
            return parsed[1]
        taken += seen


def _take(sock, n):
    """Consumes ``n`` bytes already seen by a peek (they are in the socket's buffer: no wait)."""
    while n > 0:
        got = sock.recv(n)
        if not got:
            raise ProxyHeaderError("closed in its PROXY header")
        n -= len(got)
