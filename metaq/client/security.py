"""A client's credentials and TLS settings (docs/security.md), and the ``auth`` handshake over a socket.

``ClientSecurity`` holds who the client is (``user`` and its ``secret``) and how it reaches brokers (TLS:
the ``ca`` that signed the brokers' certificates, or the system's store; a client ``cert``/``key`` to
present). Every client tool takes one (``security=``); given none, it reads the environment
(:meth:`ClientSecurity.from_env`), so existing code picks credentials up without a change:

    METAQ_CREDENTIALS   a credentials file (below); the other variables override what it says
    METAQ_USER          the user name
    METAQ_SECRET_FILE   a file holding the secret (mode 0600); or METAQ_SECRET, the secret itself
    METAQ_TLS           1/true/yes/on: connect over TLS (also implied by METAQ_TLS_CA or METAQ_TLS_CERT)
    METAQ_TLS_CA        PEM file of the CA(s) to verify brokers with (default: the system's store)
    METAQ_TLS_CERT      PEM client certificate to present (METAQ_TLS_KEY: its key, if not in the same file)
    METAQ_TLS_SERVER_NAME  the name to verify in the broker's certificate (default: the host of its url)
    METAQ_AUTH_OPTIONAL 1: accept a broker with authentication off (while rolling it out)

A credentials file (YAML, mode 0600: like ssh, a file holding a secret that group or others may read is
refused)::

    user: alice
    secret: "alice's secret"        # or secret_file: /path (relative paths: beside this file)
    tls:                            # or tls: true (system CA store); absent: plain TCP
      ca: ca.pem
      cert: alice.pem               # optional client certificate
      key: alice.key
      server_hostname: broker.example.com   # optional

``authenticate(sock, ...)`` runs the text ``auth`` handshake (``metaq.auth.proofs``) and checks the
broker's proof: a broker that cannot prove it holds the user's secret is refused like an impostor. The
secret is never in a ``repr``, an exception or a log line.
"""

import logging
import os
import ssl
import stat
import threading

import yaml

from metaq import errors, limits
from metaq.client import limits as client_limits
from metaq.auth import proofs
from metaq.protocol import events as ev
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)

__all__ = ["ClientSecurity", "TlsSocket", "resolve", "add_arguments", "from_cli", "read_private"]

log = logging.getLogger(__name__)

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
_FILE_KEYS = {"user", "secret", "secret_file", "tls", "auth_optional"}
_TLS_KEYS = {"ca", "cert", "key", "server_hostname"}
MAX_USER_CHARS = 128


def _flag(value, where):
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise errors.ConfigError("%s must be 1/true/yes/on or 0/false/no/off, got %r" % (where, value))


def read_private(path, what, max_bytes=client_limits.MAX_CREDENTIALS_FILE_BYTES):
    """The bytes of a file that holds a secret: refused (ConfigError) when group or others may read or write it,
    as ssh refuses such a private key, or when larger than ``max_bytes``."""
    path = os.path.expanduser(str(path))
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise errors.ConfigError("cannot read %s %s: %s" % (what, path, exc.strerror)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise errors.ConfigError("%s %s is not a regular file" % (what, path))
        if st.st_mode & 0o077:
            raise errors.ConfigError(
                "%s %s is accessible by group or others (mode %04o): refused, as ssh refuses such a private key; "
                "run chmod 600 %s" % (what, path, stat.S_IMODE(st.st_mode), path))
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise errors.ConfigError("%s %s is larger than %d bytes" % (what, path, max_bytes))
    return data


def _secret_from_file(path, what):
    secret = read_private(path, what).strip()
    if not secret:
        raise errors.ConfigError("%s %s is empty" % (what, path))
    return secret


class ClientSecurity:
    """Credentials and TLS settings of a client (see the module doc). ``tls`` is on when asked for, or when a
    ``ca`` or ``cert`` is given. ``optional``: accept brokers with authentication off (else refused)."""

    def __init__(self, user=None, secret=None, ca=None, cert=None, key=None, tls=False, server_hostname=None,
                 optional=False, source="arguments"):
        self.source = source
        if (user is None) != (secret is None):
            raise errors.ConfigError("%s: %s" % (source, "a user needs its secret (secret_file, METAQ_SECRET_FILE)"
                                                 if user is not None else "a secret was given without a user"))
        if user is not None:
            user = str(user)
            if not 0 < len(user) <= MAX_USER_CHARS or not user.isprintable() or any(c.isspace() for c in user):
                raise errors.ConfigError("%s: invalid user name %r (1-%d characters, no spaces)"
                                         % (source, user, MAX_USER_CHARS))
            secret = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
            if not 0 < len(secret) <= limits.MAX_SECRET_BYTES:
                raise errors.ConfigError("%s: the secret of user %s must be 1-%d bytes"
                                         % (source, user, limits.MAX_SECRET_BYTES))
        if key is not None and cert is None:
            raise errors.ConfigError("%s: a TLS key was given without its certificate" % source)
        self.user = user
        self._secret = secret
        self.ca, self.cert, self.key = ca, cert, key
        self.tls = bool(tls or ca or cert)
        self.server_hostname = server_hostname
        self.optional = bool(optional)
        self._context = self._make_context() if self.tls else None

    # -- making one ---------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path):
        """A credentials file (YAML; see the module doc); ConfigError naming what is wrong."""
        path = os.path.abspath(os.path.expanduser(str(path)))
        where = "credentials file %s" % path
        try:
            doc = yaml.safe_load(read_private(path, "credentials file"))
        except yaml.YAMLError as exc:
            raise errors.ConfigError("%s is not valid YAML: %s" % (where, exc)) from None
        if not isinstance(doc, dict):
            raise errors.ConfigError("%s: expected a mapping with user and secret (or secret_file), and tls" % where)
        unknown = sorted(set(map(str, doc)) - _FILE_KEYS)
        if unknown:
            raise errors.ConfigError("%s: unknown keys %s (known: %s)" % (where, ", ".join(unknown),
                                                                          ", ".join(sorted(_FILE_KEYS))))
        base = os.path.dirname(path)
        here = lambda p: None if p is None else os.path.join(base, os.path.expanduser(str(p)))  # noqa: E731
        secret = doc.get("secret")
        if doc.get("secret_file") is not None:
            if secret is not None:
                raise errors.ConfigError("%s: secret and secret_file are both set: keep one" % where)
            secret = _secret_from_file(here(doc["secret_file"]), "secret_file of %s" % where)
        tls = doc.get("tls") or False
        options = {}
        if isinstance(tls, dict):
            unknown = sorted(set(map(str, tls)) - _TLS_KEYS)
            if unknown:
                raise errors.ConfigError("%s: unknown tls keys %s (known: %s)" % (where, ", ".join(unknown),
                                                                                  ", ".join(sorted(_TLS_KEYS))))
            options = {k: here(tls.get(k)) for k in ("ca", "cert", "key")}
            options["server_hostname"] = tls.get("server_hostname")
            tls = True
        elif not isinstance(tls, bool):
            raise errors.ConfigError("%s: tls must be true, false or a mapping of %s" % (where, ", ".join(_TLS_KEYS)))
        return cls(doc.get("user"), secret, tls=tls, optional=_flag(doc.get("auth_optional", False), where),
                   source=where, **options)

    @classmethod
    def from_env(cls, environ=None):
        """The ``METAQ_*`` variables (see the module doc) over ``METAQ_CREDENTIALS``; nothing set: no credentials,
        no TLS."""
        env = os.environ if environ is None else environ
        get = lambda name: env.get(name) or None  # noqa: E731 - an empty variable counts as unset
        base = cls.from_file(get("METAQ_CREDENTIALS")) if get("METAQ_CREDENTIALS") else cls(source="environment")
        if get("METAQ_SECRET") and get("METAQ_SECRET_FILE"):
            raise errors.ConfigError("METAQ_SECRET and METAQ_SECRET_FILE are both set: keep one (the file)")
        secret = get("METAQ_SECRET")
        if get("METAQ_SECRET_FILE"):
            secret = _secret_from_file(get("METAQ_SECRET_FILE"), "METAQ_SECRET_FILE")
        tls = _flag(get("METAQ_TLS"), "METAQ_TLS") if get("METAQ_TLS") else None
        optional = _flag(get("METAQ_AUTH_OPTIONAL"), "METAQ_AUTH_OPTIONAL") if get("METAQ_AUTH_OPTIONAL") else None
        return base.overridden(get("METAQ_USER"), secret, tls, get("METAQ_TLS_CA"), get("METAQ_TLS_CERT"),
                          get("METAQ_TLS_KEY"), get("METAQ_TLS_SERVER_NAME"), optional, "environment")

    @classmethod
    def from_options(cls, credentials=None, user=None, secret=None, secret_file=None, tls=None, ca=None, cert=None,
                     key=None, server_hostname=None, optional=None, environ=None):
        """Explicit settings (a tool's flags, a Spark source's options) over a credentials file (``credentials``)
        or, without one, over the environment. A ``user`` given here needs its secret given here too."""
        base = cls.from_file(credentials) if credentials else cls.from_env(environ)
        if secret is not None and secret_file is not None:
            raise errors.ConfigError("give a secret or a secret file, not both")
        if secret_file is not None:
            secret = _secret_from_file(secret_file, "secret file")
        if user is not None and secret is None and user != base.user:
            raise errors.ConfigError("user %s was given without its secret (a secret file)" % user)
        return base.overridden(user, secret, tls, ca, cert, key, server_hostname, optional, "arguments")

    def overridden(self, user, secret, tls, ca, cert, key, server_hostname, optional, source):
        """A copy with the values given (not None) replacing this one's."""
        if user is not None and secret is None and user != self.user:
            raise errors.ConfigError("%s: user %s has no secret" % (source, user))
        if secret is not None and user is None and self.user is None:
            raise errors.ConfigError("%s: a secret was given without a user" % source)
        pick = lambda new, old: old if new is None else new  # noqa: E731
        changed = any(v is not None for v in (user, secret, tls, ca, cert, key, server_hostname, optional))
        if not changed:
            where = self.source
        elif self.source in ("environment", "arguments"):
            where = source
        else:
            where = "%s with %s" % (self.source, source)
        return ClientSecurity(pick(user, self.user), pick(secret, self._secret), pick(ca, self.ca),
                              pick(cert, self.cert), pick(key, self.key), pick(tls, self.tls),
                              pick(server_hostname, self.server_hostname), pick(optional, self.optional), where)

    # -- what it is ---------------------------------------------------------------------------

    @property
    def enabled(self):
        """True when there are credentials to offer."""
        return self.user is not None

    def __repr__(self):  # never the secret
        parts = ["user=%r, secret=<hidden>" % self.user] if self.user else ["no credentials"]
        parts.append("tls=%s" % ("on" if self.tls else "off"))
        parts.extend("%s=%r" % (k, getattr(self, k)) for k in ("ca", "cert", "key", "server_hostname")
                     if getattr(self, k) is not None)
        if self.optional:
            parts.append("optional")
        return "ClientSecurity(%s)" % ", ".join(parts)

    def __getstate__(self):  # an SSLContext cannot be pickled: made again where it is unpickled
        state = dict(self.__dict__)
        state["_context"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        if self.tls:
            self._context = self._make_context()

    # -- TLS ----------------------------------------------------------------------------------

    def _make_context(self):
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        except (OSError, ssl.SSLError) as exc:
            raise errors.ConfigError("%s: cannot load the CA file %s: %s" % (self.source, self.ca, exc)) from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            if self.key is not None:
                read_private(self.key, "TLS key")  # refused when group or others may read it
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ssl.SSLError) as exc:
                raise errors.ConfigError("%s: cannot load the client certificate %s (key %s): %s"
                                         % (self.source, self.cert, self.key or "in the same file", exc)) from None
        return ctx

    def ssl_context(self):
        """The client ``ssl.SSLContext`` (brokers verified against ``ca`` or the system's store), or None."""
        return self._context

    def wrap(self, sock, host, where):
        """``sock`` over TLS when TLS is on (the handshake runs now, within the socket's timeout), else ``sock``.
        A failed handshake is a ConnectionLost saying why."""
        if not self.tls:
            return sock
        name = self.server_hostname or host
        try:
            return TlsSocket(sock, self._context, name)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise errors.ConnectionLost("TLS: %s's certificate is not trusted for %s: %s (the CA to trust: --ca, "
                                        "METAQ_TLS_CA or tls.ca of the credentials file)"
                                        % (where, name, exc.verify_message or exc)) from None
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise errors.ConnectionLost("TLS handshake with %s failed: %s (does the broker have TLS on?)"
                                        % (where, exc or type(exc).__name__)) from None

    # -- the auth handshake -------------------------------------------------------------------

    def authenticate(self, sock, where, timeout):
        """Prove the user's secret to the broker on ``sock`` (connected, blocking) and check its proof in turn.

        Returns True when authenticated, False when there is nothing to do (no credentials, or a broker with
        authentication off while ``optional``). Raises ``Unauthenticated`` when the broker refuses the
        credentials or cannot prove it holds the secret, ``ConnectionLost`` when the connection fails."""
        if self.user is None:
            return False
        sock.settimeout(timeout)
        parser = TextParser(max_line=limits.MAX_LINE_BYTES, max_body=client_limits.MAX_AUTH_REPLY_BYTES)
        reply = _exchange(sock, parser, ev.Auth(self.user, None, None, 1), where)
        if reply.code == 200:
            nonce = bytes(reply.body).decode("ascii", "replace")
            client_nonce = proofs.new_nonce()
            proof = proofs.text_proof(self._secret, "client", self.user, nonce, client_nonce)
            reply = _exchange(sock, parser, ev.Auth(self.user, client_nonce, proof, 2), where)
        text = bytes(reply.body).decode("utf-8", "replace").strip()
        if reply.code == 200:
            if not proofs.same(reply.body, proofs.text_proof(self._secret, "server", self.user, nonce, client_nonce)):
                raise errors.Unauthenticated(
                    "%s could not prove it holds user %s's secret (a wrong proof): refusing it as an impostor, or a "
                    "broker whose permissions file has another secret for %s" % (where, self.user, self.user))
            log.debug("authenticated to %s as %s", where, self.user)
            return True
        if reply.code == 401:
            raise errors.Unauthenticated("%s refused the credentials of user %s (%s): %s"
                                         % (where, self.user, self.source, text))
        if reply.code == 400:  # authentication off (or a broker without it at all): it cannot prove anything
            if self.optional:
                log.warning("%s has authentication off (%s); connecting anyway (auth optional)", where, text)
                return False
            raise errors.Unauthenticated(
                "%s cannot prove it holds user %s's secret: it answered %d %s. Refusing it (an impostor, or a broker "
                "without security.acl_file; METAQ_AUTH_OPTIONAL=1 accepts such brokers)" % (where, self.user,
                                                                                            reply.code, text))
        if reply.code == 503:
            raise errors.Unavailable("%s refused the connection: %s" % (where, text))
        raise errors.BrokerError("%s answered auth with %d %s" % (where, reply.code, text))


class TlsSocket:
    """A client TLS connection over a plain socket, through memory BIOs (``SSLContext.wrap_bio``).

    Unlike ``ssl.SSLSocket`` it is safe with a reader thread and writer threads at once, and to close from any
    thread: OpenSSL's SSL object is not thread-safe, and an SSLSocket's SSL object keeps the descriptor number,
    so a thread still reading after another closed it reads whatever reuses that number (another connection,
    a file). Here every socket call goes through the plain socket (closed, it fails cleanly) and the SSL object
    is only touched under a lock, never held during socket I/O. The handshake runs in the constructor, within
    the socket's timeout. What a read makes the SSL object send (a TLS 1.3 key update) goes with the next write.
    """

    def __init__(self, sock, context, server_hostname):
        self.sock = sock
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_hostname)
        self._lock = threading.Lock()  # the SSL object and its BIOs
        self._send_lock = threading.Lock()  # records leave in the order they were made
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_pending()
                self._feed()
        self._send_pending()

    def _send_pending(self):
        data = self._out.read()
        if data:
            self.sock.sendall(data)

    def _feed(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise ssl.SSLEOFError("the peer closed the connection during the TLS handshake")
        self._in.write(data)

    def recv(self, size):
        """Up to ``size`` bytes of plaintext; b"" when the peer closed the connection."""
        while True:
            with self._lock:
                try:
                    return self._tls.read(size)
                except ssl.SSLWantReadError:
                    pass
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return b""
            data = self.sock.recv(max(size, 1 << 14))
            if not data:
                return b""
            with self._lock:
                self._in.write(data)

    def sendall(self, data):
        view = memoryview(data)
        with self._send_lock:
            while view:
                chunk, view = view[:client_limits.CLIENT_TLS_WRITE_BYTES], view[client_limits.CLIENT_TLS_WRITE_BYTES:]
                with self._lock:
                    while chunk:
                        chunk = chunk[self._tls.write(chunk):]
                    out = self._out.read()
                self.sock.sendall(out)

    def getpeercert(self, binary_form=False):
        return self._tls.getpeercert(binary_form)

    def version(self):
        return self._tls.version()

    def settimeout(self, timeout):
        self.sock.settimeout(timeout)

    def setsockopt(self, *args):
        self.sock.setsockopt(*args)

    def shutdown(self, how):
        self.sock.shutdown(how)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _exchange(sock, parser, request, where):
    """Send one request and read its one reply (a Result); ConnectionLost when the broker closes or is silent."""
    try:
        sock.sendall(serialize(request))
        while True:
            event = parser.next_event()
            if event is CLOSED:
                raise errors.ConnectionLost("%s closed the connection during authentication" % where)
            if event is not NEED_DATA:
                break
            parser.receive_data(sock.recv(65536))
    except errors.RemoteProtocolError as exc:
        raise errors.ConnectionLost("%s answered auth with an unreadable reply: %s" % (where, exc)) from None
    except OSError as exc:
        raise errors.ConnectionLost("authentication with %s failed: %s" % (where, exc or type(exc).__name__)) from None
    if not isinstance(event, ev.Result) or event.opaque != request.opaque:
        raise errors.ConnectionLost("%s answered auth with %.100r" % (where, event))
    return event


def resolve(security=None):
    """A ``ClientSecurity`` from what a caller passed: None (the environment), one already made, a credentials
    file's path, or a mapping of :meth:`ClientSecurity.from_options` arguments."""
    if security is None:
        return ClientSecurity.from_env()
    if isinstance(security, ClientSecurity):
        return security
    if isinstance(security, (str, os.PathLike)):
        return ClientSecurity.from_file(security)
    if isinstance(security, dict):
        return ClientSecurity.from_options(**security)
    raise TypeError("security must be a ClientSecurity, a credentials file path or a dict, got %r"
                    % type(security).__name__)


# -- command-line tools ------------------------------------------------------------------------


def add_arguments(parser):
    """The security flags every command-line tool takes (metaq-admin, metaq-spark-report)."""
    g = parser.add_argument_group("security", "credentials and TLS (default: $METAQ_CREDENTIALS, $METAQ_USER with "
                                  "$METAQ_SECRET_FILE, $METAQ_TLS, $METAQ_TLS_CA, $METAQ_TLS_CERT, $METAQ_TLS_KEY)")
    g.add_argument("--credentials", dest="sec_credentials", metavar="FILE", help="a credentials file (YAML: "
                   "user, secret or secret_file, tls: {ca, cert, key}; mode 0600)")
    g.add_argument("--user", dest="sec_user", metavar="NAME", help="authenticate as this user (its secret from "
                   "--secret-file)")
    g.add_argument("--secret-file", dest="sec_secret_file", metavar="FILE", help="the file holding the user's "
                   "secret (mode 0600)")
    g.add_argument("--tls", dest="sec_tls", action="store_true", default=None, help="connect over TLS (verified "
                   "with the system's CA store unless --ca)")
    g.add_argument("--ca", dest="sec_ca", metavar="FILE", help="verify brokers with this CA (PEM); implies --tls")
    g.add_argument("--cert", dest="sec_cert", metavar="FILE", help="present this client certificate (PEM); "
                   "implies --tls")
    g.add_argument("--key", dest="sec_key", metavar="FILE", help="the client certificate's key (PEM, mode 0600)")
    return parser


def from_cli(args):
    """The ``ClientSecurity`` of parsed ``add_arguments`` flags (the environment fills what they leave out)."""
    return ClientSecurity.from_options(credentials=args.sec_credentials, user=args.sec_user,
                                       secret_file=args.sec_secret_file, tls=args.sec_tls, ca=args.sec_ca,
                                       cert=args.sec_cert, key=args.sec_key)
