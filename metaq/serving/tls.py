"""TLS on the broker's listeners and on the slave's link to its master (docs/security.md).

``security.tls.mode``:

* ``off``: plaintext everywhere. A TLS hello (first byte 0x16) on a plaintext port is logged and closed by
  the front-end that reads it (``connections.Connection.tls_hello``): one check per connection.
* ``on``: every listener (the replication port too unless ``tls.replication`` is false) speaks TLS only.
  The connection core peeks at the first byte of each accepted socket: a TLS hello is answered with the
  handshake, which must finish within the handshake deadline; anything else is refused (the text port in
  plaintext, ``result 400 ... requires TLS``; the others just close).
* ``permissive`` (migration): TLS and plaintext on the same port; the first byte tells them apart (0x16, a
  TLS handshake record, can start neither a text command nor a plausible RocketMQ or replication frame).

The server's context comes from gevent's ``ssl``; each accepted connection speaks TLS through memory BIOs
over its plain gevent socket (``tlsio.BioTls``: one recv takes many records, one sendall a whole reply).
The slave's context is the stdlib's (``socket.create_connection`` there is gevent's once the entry point
monkey-patched, and the stdlib's ``ssl`` with it). TLS 1.2 is the oldest version either end accepts.
"""

import logging
import socket
import ssl as std_ssl
import time

from gevent import ssl as gevent_ssl

from metaq import errors, limits
from metaq.serving.tlsio import BioTls, HandshakeTimeout

log = logging.getLogger(__name__)

__all__ = ["TlsPolicy", "server_context", "client_context", "TLS_HANDSHAKE_BYTE", "TLS_SOCKETS"]

#: Listeners that are plaintext whatever ``security.tls.mode`` says (MQTT over ``ws://``: ``mqtt.ws_port``), and
#: listeners that are TLS only whenever it is not off (``wss://``: ``mqtt.wss_port``).
PLAINTEXT_LISTENERS = frozenset({"mqtt-ws"})
TLS_LISTENERS = frozenset({"mqtt-wss"})

#: The first byte of a TLS record carrying a handshake message (a ClientHello opens every TLS connection).
TLS_HANDSHAKE_BYTE = b"\x16"

#: What a socket wrapped in TLS is, on the server (gevent's) and on the slave (the stdlib's, maybe patched).
TLS_SOCKETS = (BioTls, gevent_ssl.SSLSocket, std_ssl.SSLSocket)

#: The answer to plaintext on a port that requires TLS (the text port answers it in plaintext, then closes).
PLAINTEXT_REFUSAL = "this port requires TLS (security.tls.mode on): connect with TLS, or ask for mode permissive"

#: The listener a ``tls.replication: false`` keeps in plaintext.
REPLICATION_LISTENER = "replication"


def _no_password():
    return b""  # an encrypted key fails to load (never a prompt on the terminal)


def _readable(path, setting):
    """``path``'s bytes (at most MAX_TLS_FILE_BYTES), or a ConfigError naming ``setting`` and the reason."""
    try:
        with open(path, "rb") as f:
            data = f.read(limits.MAX_TLS_FILE_BYTES + 1)
    except OSError as exc:
        raise errors.ConfigError("cannot read %s %s: %s" % (setting, path, exc.strerror)) from None
    if len(data) > limits.MAX_TLS_FILE_BYTES:
        raise errors.ConfigError("%s %s is larger than %d bytes (limits.MAX_TLS_FILE_BYTES): not a PEM file"
                                 % (setting, path, limits.MAX_TLS_FILE_BYTES))
    if b"-----BEGIN " not in data:
        raise errors.ConfigError("%s %s holds no PEM block (-----BEGIN ...): not a PEM file" % (setting, path))
    return data


def _load_chain(ctx, tls):
    _readable(tls.cert, "security.tls.cert")
    _readable(tls.key, "security.tls.key")
    try:
        ctx.load_cert_chain(tls.cert, tls.key, password=_no_password)
    except (std_ssl.SSLError, OSError) as exc:
        raise errors.ConfigError("security.tls.cert %s and security.tls.key %s are not a usable certificate "
                                 "and its (unencrypted) private key: %s" % (tls.cert, tls.key, _reason(exc))) from None


def _load_ca(ctx, path):
    data = _readable(path, "security.tls.ca")
    try:
        ctx.load_verify_locations(cadata=data.decode("ascii", "replace"))
    except (std_ssl.SSLError, OSError, ValueError) as exc:
        raise errors.ConfigError("security.tls.ca %s holds no usable CA certificate: %s"
                                 % (path, _reason(exc))) from None


def _reason(exc):
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)


def server_context(tls):
    """The listeners' context for ``tls`` (the ``security.tls`` section); a ConfigError names a bad file."""
    ctx = gevent_ssl.SSLContext(gevent_ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = gevent_ssl.TLSVersion.TLSv1_2
    # No TLS 1.2 renegotiation: a client could make the broker redo handshakes at will, and a send would then
    # have to read (one greenlet writes replies while another reads requests on the same socket).
    ctx.options |= gevent_ssl.OP_NO_RENEGOTIATION
    _load_chain(ctx, tls)
    if tls.verify_clients:
        _load_ca(ctx, tls.ca)
        ctx.verify_mode = gevent_ssl.CERT_REQUIRED
    return ctx


def client_context(tls):
    """The slave's context for its link: trusts ``ca`` (or the system's CAs when none is given), checks that
    the master's certificate names the address in ``replication.slave_of``, and presents this broker's own
    certificate, so that a master with ``verify_clients`` accepts it."""
    ctx = std_ssl.SSLContext(std_ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = std_ssl.TLSVersion.TLSv1_2
    if tls.ca:
        _load_ca(ctx, tls.ca)
    else:
        ctx.load_default_certs(std_ssl.Purpose.SERVER_AUTH)
    _load_chain(ctx, tls)
    return ctx


class TlsPolicy:
    """What the connection core does with each accepted socket: ``mode`` and the server context."""

    def __init__(self, tls):
        self.mode = tls.mode
        self.replication = tls.replication
        self._tls = tls
        self.context = server_context(tls) if tls.mode != "off" else None  # a bad file stops the start here
        self._alpn_contexts = {}

    def context_for(self, alpn=()):
        """The server context of a listener whose protocol is negotiated by ALPN (``alpn``: the protocol names it
        speaks, ``("h2",)`` for gRPC, whose clients require it); the shared context for the others, which offer
        none (a browser offered h2 on the HTTP port would otherwise speak HTTP/2 to an HTTP/1.1 server)."""
        if not alpn:
            return self.context
        ctx = self._alpn_contexts.get(alpn)
        if ctx is None:
            ctx = self._alpn_contexts[alpn] = server_context(self._tls)
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def mode_for(self, listener_name):
        """``off``, ``on`` or ``permissive`` for the listener called ``listener_name``."""
        if self.mode == "off" or listener_name in PLAINTEXT_LISTENERS or (
                listener_name == REPLICATION_LISTENER and not self.replication):
            return "off"
        if listener_name in TLS_LISTENERS:
            return "on"
        return self.mode

    def secure(self, mode, sock, idle_s, request_s, server_first=False, alpn=()):
        """``(socket to serve, None)``: the TLS socket once its handshake is done, or (permissive) ``sock`` itself
        for a plaintext peer; ``(None, why)`` when the connection must end (``sock`` is then closed, and ``why`` is
        ``PLAINTEXT_REFUSAL`` for plaintext on a TLS-only port: the caller answers it before closing).

        ``server_first`` (replication: the master's CHALLENGE opens the exchange): a plaintext peer says nothing
        before the broker does, so mode ``on`` goes straight to the handshake (a plaintext slave then fails it
        by its deadline), and ``permissive`` takes a peer silent for ``limits.TLS_DETECT_WAIT_S`` as plaintext.
        ``alpn``: the listener's ALPN protocols (``context_for``)."""
        deadline_s = min(limits.TLS_HANDSHAKE_TIMEOUT_S, request_s)
        started = time.monotonic()
        if server_first and mode == "on":
            return self._handshake(sock, deadline_s, started, alpn)
        if server_first:
            try:
                sock.settimeout(limits.TLS_DETECT_WAIT_S)
                first = sock.recv(1, socket.MSG_PEEK)
            except socket.timeout:
                return sock, None  # silent: a plaintext slave waiting for the CHALLENGE
            except OSError as exc:
                return None, "closed before its first byte: %s" % exc
            if not first:
                return None, ""
            if first != TLS_HANDSHAKE_BYTE:
                return sock, None
            return self._handshake(sock, deadline_s, time.monotonic(), alpn)
        try:
            # A TLS client speaks first, at once; a plaintext client on a permissive port may open its
            # connection and wait before its first request, as it may on a plaintext port.
            sock.settimeout(idle_s if mode == "permissive" else deadline_s)
            first = sock.recv(1, socket.MSG_PEEK)
        except OSError as exc:  # socket.timeout included
            return None, ("no first byte within %.0f s" % (idle_s if mode == "permissive" else deadline_s)
                          if isinstance(exc, socket.timeout) else "closed before its first byte: %s" % exc)
        if not first:
            return None, ""  # closed before saying anything: nothing to log
        if first != TLS_HANDSHAKE_BYTE:
            if mode == "permissive":
                return sock, None
            _drain(sock, deadline_s)  # what the peer sent is read before the answer and the close: a close with unread
            return None, PLAINTEXT_REFUSAL  # bytes would reset the connection and could lose the answer
        if mode == "permissive":
            started = time.monotonic()  # the handshake's own deadline starts at its first byte
        return self._handshake(sock, deadline_s, started, alpn)

    def _handshake(self, sock, deadline_s, started, alpn=()):
        """The server side of the TLS handshake on ``sock``, to be finished ``deadline_s`` after ``started``."""
        try:
            return BioTls.handshake(self.context_for(alpn), sock, deadline_s, started), None
        except HandshakeTimeout:
            _close(sock)
            return None, "TLS handshake not finished within %.0f s" % deadline_s
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            _close(sock)
            return None, "TLS handshake failed: %s" % _reason(exc)


def _drain(sock, timeout_s):
    """Read what the peer has sent so far (at most a small buffer), without waiting; then the answer's sends
    may take ``timeout_s``."""
    try:
        sock.settimeout(0.0)
        sock.recv(limits.TLS_PLAINTEXT_DRAIN_BYTES)
    except OSError:
        pass
    sock.settimeout(timeout_s)


def _close(sock):
    try:
        sock.close()
    except OSError:
        pass
