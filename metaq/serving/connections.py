"""The connection core: every listener of the broker accepts through it, once.

A front-end (text, remoting, replication; later HTTP) does not open its own
server socket. It asks the core for a listener (``ConnectionCore.listen``),
giving how to make one of its connections and how to turn one away. The core
then applies the same rules to every accepted socket:

* **One cap across all listeners**: ``max_connections`` (by default what the
  open-files limit leaves after the descriptors kept for the store, the replication
  port's headroom and an MQTT cluster's links: ``ServerConfig.fd_reserve``). The
  connection past the cap is refused in its listener's own words (the text port
  answers ``result 503``; the others just close) and closed. A listener may
  have headroom past the cap (the replication port: ``ServerConfig.replication_headroom``,
  an MQTT cluster's peers' links in included), so that clients filling the cap cannot
  lock a slave or a peer out.
* **Cooldowns** (``penalize``, ``Penalties``): an address a front-end cut for abuse (the gRPC port's floods) is
  refused on that listener for a while, before anything is counted or made for it.
* **Behind a proxy** (``security.trusted_proxies``, ``security.proxy_protocol``, ``metaq.serving.proxies``): on a
  listener named there, a connection from a trusted proxy must begin with a PROXY header (v1 or v2, before any TLS
  hello), read within the handshake deadline before anything is counted; the client's address it names is the
  connection's ``address`` from then on, for every rule below and every front-end. Other peers are served as they
  are (their bytes are never read as a header). A front-end that learns the client later (a WebSocket upgrade's
  ``X-Forwarded-For``) hands it to ``claim``, which moves the connection's address and shares there.
* ``TCP_NODELAY`` (replies are small; no Nagle delay).
* **TLS** (``security.tls``, ``metaq.serving.tls``): with mode ``on`` or ``permissive`` the first byte of each
  accepted socket is peeked at; a TLS hello gets the handshake (within ``limits.TLS_HANDSHAKE_TIMEOUT_S``, or
  ``request_timeout_s`` when shorter) before the listener makes its connection, so every front-end (and any
  listener to come) reads and writes through the TLS socket without knowing; plaintext on a TLS-only port
  is refused. Connections in their handshake count against the cap.
* **Connection ids**, unique across listeners: the owner of a connection's
  local transactions, whichever protocol it speaks.
* **Deadlines**: a connection with no request for ``idle_timeout_s`` is closed,
  and a request begun must be complete within ``request_timeout_s`` of its
  first byte, however slowly its bytes trickle in (``Connection.receive``); a front-end with
  ``idle_bounds_partial`` (MQTT's Keep Alive) also closes one whose bytes stop inside a request for the idle time.
* **No greenlet while idle** (``Connection.parks``, opt-in per front-end: MQTT): a connection with no partial
  request and nothing buffered ends its greenlet instead of waiting in ``recv``; a read watcher on the loop
  serves it again, in a new greenlet, when bytes arrive, and one shared ``IdleWheel`` (not a timer per
  connection) holds its idle and login deadlines. Writes (an MQTT delivery) do not need the reading greenlet.
* **Close hooks** (``on_close``): what must happen when any connection ends
  (the transaction service rolls back its local transactions...).
* **Orderly close** at shutdown (``shutdown``): stop accepting on every
  listener and tell the connections that can be told (``Connection.drain``: HTTP/2's GOAWAY), close the idle
  connections, give the busy ones a grace period to finish, then close the rest.

A check that applies to every connection (an address allow-list, TLS, a
handshake) belongs here, once, not in each front-end.

Long because every listener's rules (the cap, the shares, TLS, strangers, deadlines, parking and the turns of woken
connections) act on the same connection's state, which no other module may hold.
"""

import collections
import errno
import functools
import itertools
import logging
import math
import socket
import time
from fcntl import ioctl
from termios import FIONREAD

import gevent
from gevent.event import Event
from gevent.server import StreamServer

from metaq import limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.errors import ConfigError
from metaq.auth.acl import failure_prefix
from metaq.serving.proxies import ProxyHeaderError, TrustedProxies, read_header
from metaq.serving.tls import PLAINTEXT_REFUSAL, TLS_HANDSHAKE_BYTE, TLS_SOCKETS

log = logging.getLogger(__name__)

#: A stream layered over the socket that takes all the socket holds in one ``recv`` and says what it holds
#: (``pending``) has this class attribute true: TLS through memory BIOs (``tlsio.BioTls``), a WebSocket over a plain or
#: TLS socket (``wsio.WsStream``, loaded with a front-end that listens for WebSockets). A connection on one is read and
#: written only through it (``Connection.tls``), and parks as a plain one does.
LAYERED = "layered"

#: Bytes asked of one recv().
RECV_BYTES = 256 * 1024

#: Bytes asked of one read of a TLS socket: the most one TLS record carries. A read returns one record at most,
#: and asking for more costs an allocation of the size asked for (then shrunk) at every read.
TLS_RECORD_BYTES = 16 * 1024

#: At most one "refused a connection" line per listener this often (a flood of refusals must not become a
#: flood of log lines filling the disk); the next line says how many were refused in between.
REFUSAL_LOG_INTERVAL_S = 1.0


#: How long ``share_loop`` sleeps: a timer, so that the loop polls the sockets before this greenlet goes on
#: (``gevent.sleep(0)`` runs the greenlets already ready and comes back without polling: a connection that keeps
#: its socket full would keep the others waiting until the loop's next periodic timer).
TURN_PAUSE_S = 0.0001


_pauses = 0  # share_loop's pauses since the process began (``turn_pauses``)


def share_loop(started):
    """Let the other connections run once ``limits.MAX_TURN_MS`` have passed since ``started``
    (``time.monotonic()``), so that one connection's pipeline of costly requests does not hold the event loop for
    a whole receive buffer; returns when this turn started (``started`` if it goes on)."""
    global _pauses
    now = time.monotonic()
    if now - started < limits.MAX_TURN_MS / 1000.0:
        return started
    _pauses += 1
    gevent.sleep(TURN_PAUSE_S)
    return time.monotonic()


def turn_pauses():
    """How many times ``share_loop`` paused a turn in this process (stat ``loop_turn_pauses``): a loop that waits
    for each item and still pauses after each one (its turn not started again after the wait) shows here."""
    return _pauses


def turn_after(started, polls):
    """``share_loop(started)`` for a loop that may wait between two of its calls (a blocking read, a send to a full
    socket, an Event): when the loop polled since ``polls`` (``loop_polls()`` as the last call returned) this greenlet
    gave it away and the others ran, so the turn starts again now, without a pause. Returns ``(started, polls)``
    for the next call."""
    if loop_polls() != polls:
        return time.monotonic(), loop_polls()
    started = share_loop(started)
    return started, loop_polls()


def loop_polls():
    """How many times the event loop has polled its sockets so far (``turn_after``). A loop that sees it change
    across a wait (a blocking read) gave the loop away there, the other connections ran: its turn starts again, or
    it would pause on ``share_loop``'s timer after every item that came more than ``limits.MAX_TURN_MS`` after the
    last. A read served at once from the socket's buffer does not change it."""
    return gevent.get_hub().loop.iteration


#: What ``Connection.receive`` returns to a connection that parks (``Connection.parks``): its ``serve`` returns at
#: once without ending the connection; the core serves it again, in a new greenlet, when bytes arrive, when it
#: closes or when its idle or login deadline passes.
PARKED = object()

#: How finely the idle wheel tells deadlines apart: a parked connection closes at most this late.
WHEEL_TICK_S = 0.1

#: A linger this much shorter than ``park_after_s`` still waits on the connection's kept timer (``_linger_timer``):
#: the linger that begins as a connection goes idle is ``park_after_s`` less the microseconds since its last read.
LINGER_SLACK_S = 0.001

_PARKING = -1  # Connection.parked_key: receive() returned PARKED, the core has not armed its watcher yet
_WOKEN = -2  # Connection.parked_key: its watcher saw bytes (or the end): the next receive reads, it does not park
_monotonic = time.monotonic
_getcurrent = gevent.getcurrent
_get_hub = gevent.get_hub


class IdleWheel:
    """The deadlines of parked connections, one timer for all of them (not one per connection): each connection
    in the bucket of the tick its deadline falls in; every ``tick`` the buckets whose time came are handed to
    ``expire(conn)``. The timer runs only while some connection is parked."""

    __slots__ = ("tick", "_buckets", "_next", "_timer", "_expire")

    def __init__(self, expire, tick=WHEEL_TICK_S):
        self.tick = tick
        self._expire = expire
        self._buckets = {}  # tick number -> set of connections whose deadline falls in it
        self._next = 0  # the first tick number not swept yet
        self._timer = None

    def __len__(self):
        return sum(len(b) for b in self._buckets.values())

    def add(self, conn, deadline):
        """Hold ``conn`` until ``deadline`` (monotonic); returns its key for ``remove``."""
        if not self._buckets:
            self._next = int(time.monotonic() / self.tick)
            if self._timer is None:
                self._timer = gevent.get_hub().loop.timer(self.tick, self.tick)
            self._timer.start(self._sweep)
        key = max(math.ceil(deadline / self.tick), self._next)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = set()
        bucket.add(conn)
        return key

    def remove(self, conn, key):
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.discard(conn)
            if not bucket:
                del self._buckets[key]
                if not self._buckets:
                    self._timer.stop()

    def _sweep(self):
        now_key = int(time.monotonic() / self.tick)
        buckets = self._buckets
        while self._next <= now_key and buckets:
            bucket = buckets.pop(self._next, None)
            self._next += 1
            for conn in bucket or ():
                try:
                    self._expire(conn)
                except Exception:  # noqa: BLE001 - one connection's failure must not stop the others' deadlines
                    log.exception("%s %s: ending a parked connection failed", conn.log_prefix, conn.peer)
        self._next = max(self._next, now_key + 1)
        if not buckets:
            self._timer.stop()


class _Server(StreamServer):
    """gevent's StreamServer, without its close of the socket when the handler returns: a parked connection
    outlives the greenlet of its accept (``ConnectionCore.accept`` closes whatever it does not keep)."""

    def do_close(self, sock, *args):
        pass


class Listener:
    """One listening port of the broker: its name (``text``, ``remoting``...), address and connection maker."""

    def __init__(self, name, host, port, make, refuse, backlog, headroom=0, guarded=True, server_first=False,
                 alpn=(), strangers=None):
        self.name = name
        #: the ``Strangers`` its connections count in until their front-end says they proved themselves (the
        #: replication port's, apart from the logins'), or None: the core's rules decide (``_strangers_of``)
        self.strangers = strangers
        self.alpn = alpn  # the protocols its TLS handshake offers by ALPN (gRPC's "h2"): TlsPolicy.context_for
        self.server_first = server_first  # the broker speaks first (replication's CHALLENGE): see TlsPolicy.secure
        self.guarded = guarded  # the guard's address allow-list applies (replication proves a secret instead)
        self.headroom = headroom  # connections this listener may still take once the cap is reached
        self.host = host
        self.requested_port = port
        self.make = make  # make(sock, address, conn_id) -> Connection
        self.refuse = refuse  # refuse(sock, reason) sends the listener's refusal, or None: just close
        self.backlog = backlog
        self.tls = "off"  # off, on or permissive: set by the core (TlsPolicy.mode_for)
        self.port = None
        self._server = None

    def start(self, accept):
        self._server = _Server((self.host, self.requested_port), functools.partial(accept, self),
                                    backlog=self.backlog)
        try:
            self._server.start()
        except OSError as exc:
            raise bind_error(self.name, self.host, self.requested_port, exc) from None
        self.port = self._server.server_port

    def close(self):
        if self._server is not None:
            self._server.close()


def _readable(conn):
    """A parked connection's read watcher fired (a plain function: a bound method would be made at every park)."""
    conn.served_by.wake(conn, True)


#: The setting each listener's port comes from, for the message when it cannot bind.
PORT_SETTINGS = {"text": "broker.port (--port)", "remoting": "remoting.port (--remoting-port)",
                 "replication": "replication.port (--replication-port)", "http": "http.port (--http-port)",
                 "mqtt": "mqtt.port (--mqtt-port)", "mqtt-ws": "mqtt.ws_port", "mqtt-wss": "mqtt.wss_port"}


def bind_error(name, host, port, exc):
    """A ConfigError in the user's terms for an OSError binding ``host:port`` (else ``exc`` itself)."""
    setting = PORT_SETTINGS.get(name, "%s.port" % name)
    if exc.errno == errno.EADDRINUSE:
        return ConfigError("%s:%d is already in use (another metaq-server, or another program: `ss -ltnp` "
                           "shows which); choose another %s, or 0 for any free port" % (host, port, setting))
    if exc.errno == errno.EACCES:
        return ConfigError("cannot listen on %s:%d: permission denied (ports below 1024 need root); "
                           "choose another %s" % (host, port, setting))
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError("cannot listen on %s:%d: %s is not an address of this machine (broker.host, --host)"
                           % (host, port, host))
    return exc


#: How often a connection waiting for room in the partial-request budget looks again.
PARTIAL_WAIT_S = 0.05


class Strangers:
    """Connections not yet logged in, on the ports where authentication is on (the guard's, when enabled): they
    must log in within ``login_s``, at most ``cap`` of them in all and ``per_address`` from one address, and
    their unfinished requests hold at most ``partial_limit`` bytes in all. Counted apart from logged-in
    connections, so strangers never fill the connection cap or the users' budget of unfinished requests.

    At the cap in all a new connection is not simply refused (every new connection is a stranger until it logs in:
    strangers at the cap would lock every user out): ``room`` names the stranger to close for it, the oldest of the
    address holding the most, once open ``eviction_age_s`` (``limits.STRANGER_EVICTION_AGE_S``). An attacker's
    connection and a user's look the same until credentials arrive, so age and the address's share decide: a user
    who logs in within that age is never closed, and an attacker closes its own connections first."""

    __slots__ = ("login_s", "cap", "per_address", "eviction_age_s", "count", "partial_limit", "partial_bytes",
                 "evicted", "by_share", "_from", "_waiting", "_tiers")

    def __init__(self, login_s, cap, per_address, eviction_age_s=limits.STRANGER_EVICTION_AGE_S,
                 partial_limit=limits.MAX_PRELOGIN_PARTIAL_BYTES, by_share=False):
        """``by_share``: also close, for a new connection from an address that would still hold fewer than the one
        holding the most, that one's oldest at any age (the replication port, where a slave or a peer proves itself
        within milliseconds: many addresses each at their share can then never keep every stranger young)."""
        self.by_share = by_share
        self.login_s = login_s
        self.cap = cap
        self.per_address = per_address
        self.eviction_age_s = eviction_age_s
        self.count = 0  # connections not yet logged in now
        self.partial_limit = partial_limit
        self.partial_bytes = 0  # what their unfinished requests hold now (Connection.receive keeps it)
        self.evicted = 0  # strangers closed to make room for a new connection, since the start
        self._from = {}  # host -> connections not yet logged in from it
        self._waiting = {}  # host -> {connection: when it arrived (monotonic)}, oldest first: those ``room`` may close
        self._tiers = {}  # n -> {host: None}: the hosts with n in _waiting, in the order they came to n

    def room(self, host, now):
        """``(refusal, victim)`` for one more connection from ``host`` at ``now`` (monotonic): a refusal (why not)
        or None; with strangers at the cap, ``victim`` is the stranger to close first (else None): the oldest one
        of the address that holds the most (of those that came to hold that many first), once open
        ``eviction_age_s``. Its own address's share is never taken from others: a new connection past
        ``per_address`` is refused. Most often the first address it looks at serves (addresses come to a tier
        oldest first), not a scan of them all: a flood of new connections at the cap costs little each."""
        if self._from.get(host, 0) >= self.per_address:
            return ("too many connections not yet logged in from %s: the limit is %d per address"
                    % (host, self.per_address)), None
        if self.count < self.cap:
            return None, None
        victim = victim_host = None
        for n in sorted(self._tiers, reverse=True):  # (at most per_address tiers; most often the first serves)
            for held in self._tiers[n]:
                conn, arrived = next(iter(self._waiting[held].items()))
                if now - arrived >= self.eviction_age_s:
                    victim, victim_host = conn, held
                    break
            if victim is not None:
                break
        if victim is None and self.by_share and self._tiers:
            most = max(self._tiers)
            if self._from.get(host, 0) + 1 < most:
                victim_host = next(iter(self._tiers[most]))
                victim = next(iter(self._waiting[victim_host]))
        if victim is None:
            return "too many connections not yet logged in: the limit is %d" % self.cap, None
        self.evicted += 1
        self.unwait(victim_host, victim)  # never named twice, though it leaves the count only once closed
        return None, victim

    def arrive(self, host):
        self.count += 1
        self._from[host] = self._from.get(host, 0) + 1

    def wait(self, host, conn, now):
        """``conn``, counted from ``host`` (``arrive``), waits to log in from ``now``: ``room`` may close it."""
        waiting = self._waiting.setdefault(host, {})
        waiting[conn] = now
        self._retier(host, len(waiting) - 1, len(waiting))

    def unwait(self, host, conn):
        """``room`` may no longer close ``conn`` (it stays counted): its handshake ended, or it is being closed."""
        waiting = self._waiting.get(host)
        if waiting is None or waiting.pop(conn, None) is None:
            return
        self._retier(host, len(waiting) + 1, len(waiting))
        if not waiting:
            del self._waiting[host]

    def _retier(self, host, was, now):
        if was:
            tier = self._tiers[was]
            del tier[host]
            if not tier:
                del self._tiers[was]
        if now:
            self._tiers.setdefault(now, {})[host] = None

    def leave(self, host, conn=None):
        """One connection from ``host`` is no longer a stranger (``conn``: the one ``wait`` named)."""
        self.count -= 1
        left = self._from[host] - 1
        if left:
            self._from[host] = left
        else:
            del self._from[host]
        self.unwait(host, conn)

    def move(self, was, host, conn):
        """``conn``, counted from ``was``, is from ``host`` (a trusted proxy named its client:
        ``ConnectionCore.claim``): counted there from now on, its wait keeping its start; returns why not (``host``
        holds its share of strangers), else None."""
        if self._from.get(host, 0) >= self.per_address:
            return ("too many connections not yet logged in from %s: the limit is %d per address"
                    % (host, self.per_address))
        since = self._waiting.get(was, {}).get(conn)
        self.leave(was, conn)
        self.arrive(host)
        if since is not None:
            self.wait(host, conn, since)
        return None

    def held_by(self, host):
        """Connections not yet logged in from ``host``."""
        return self._from.get(host, 0)


class _Handshake:
    """A stranger in its TLS handshake, before its connection is made: what ``Strangers.room`` may close."""

    __slots__ = ("sock", "address")
    conn_id = None

    def __init__(self, sock, address):
        self.sock = sock
        self.address = address

    def close(self):
        self.sock.close()  # its handshake, waiting on the socket, fails: the core's accept ends it


class HandshakeRate:
    """How many TLS handshakes each address may start: a token bucket per address, ``per_s`` a second and bursts
    of ``2 * per_s``, at most ``limits.MAX_TLS_RATE_ADDRESSES`` addresses remembered (the longest idle forgotten
    first: an address forgotten starts with a full bucket). Time is passed in."""

    __slots__ = ("per_s", "burst", "refused", "_buckets")

    def __init__(self, per_s):
        self.per_s = per_s
        self.burst = 2 * per_s
        self.refused = 0
        self._buckets = collections.OrderedDict()  # host -> [tokens, when last filled]

    @property
    def addresses(self):
        """Addresses whose rate is remembered now."""
        return len(self._buckets)

    def take(self, host, now):
        """True (one token taken) when ``host`` may start a handshake at ``now`` (monotonic seconds)."""
        bucket = self._buckets.pop(host, None)
        if bucket is None:
            bucket = [float(self.burst), now]
        else:
            bucket[0] = min(self.burst, bucket[0] + (now - bucket[1]) * self.per_s)
            bucket[1] = now
        self._buckets[host] = bucket
        while len(self._buckets) > limits.MAX_TLS_RATE_ADDRESSES:
            self._buckets.popitem(last=False)
        if bucket[0] < 1.0:
            self.refused += 1
            return False
        bucket[0] -= 1.0
        return True


class Penalties:
    """Addresses a listener refuses for a while: each cut for abuse (``cut``: a gRPC connection ended for flooding)
    is refused new connections on that listener for a cooldown, ``base_s`` at its first cut, doubled at each cut
    while it keeps being cut, up to ``max_s``; an address that goes ``max_s`` past its cooldown uncut starts again
    at ``base_s``. At most ``limit`` addresses are remembered (the one cut longest ago forgotten first). Keyed by
    ``(listener name, host)``, an IPv6 host taken as its /64 (``acl.failure_prefix``: one host holds a whole /64,
    so cutting its /128 would cost it nothing); time is passed in."""

    __slots__ = ("limit", "max_s", "refused", "_cut")

    def __init__(self, limit=rmq5_limits.MAX_PENALIZED_ADDRESSES, max_s=rmq5_limits.GRPC_FLOOD_PENALTY_MAX_S):
        self.limit = limit
        self.max_s = max_s
        self.refused = 0  # connections refused for a cooldown, since the start
        self._cut = collections.OrderedDict()  # (listener, host) -> [cuts in a row, cooldown end (monotonic)]

    def __len__(self):
        return len(self._cut)

    @staticmethod
    def _key(key):
        return key[0], failure_prefix(key[1], 32) or key[1]

    def cut(self, key, base_s, now):
        """``key`` was cut at ``now``: its cooldown (seconds) from now, longer than the last one's if that ended
        less than ``max_s`` ago (``base_s`` past ``max_s``: ``base_s`` each time)."""
        key = self._key(key)
        entry = self._cut.pop(key, None)
        cuts = 1 if entry is None or now - entry[1] >= self.max_s else entry[0] + 1
        cooldown = max(base_s, min(base_s * 2.0 ** min(cuts - 1, 32), self.max_s))
        self._cut[key] = [cuts, now + cooldown]
        while len(self._cut) > self.limit:
            self._cut.popitem(last=False)
        return cooldown

    def refusal(self, key, now):
        """None when ``key`` may connect at ``now``, else why not."""
        key = self._key(key)
        entry = self._cut.get(key)
        if entry is None or now >= entry[1]:
            return None
        self.refused += 1
        return "%s was cut for flooding: refused for %.1f s more (cut %d times in a row)" % (key[1], entry[1] - now,
                                                                                            entry[0])


class ConnectionLimits:
    """What every connection may take: its deadlines (seconds) with no request under way and for a request
    once begun, and the reply bytes it may have read from the store but not yet handed to the kernel;
    ``strangers``: the rules of connections not yet logged in (``Strangers``), or None."""

    __slots__ = ("idle_s", "request_s", "reply_bytes", "partial_limit", "partial_bytes", "strangers")

    def __init__(self, idle_s, request_s, reply_bytes=limits.MAX_REPLY_BYTES,
                 partial_limit=limits.MAX_PARTIAL_REQUEST_BYTES, strangers=None):
        self.idle_s = idle_s
        self.request_s = request_s
        self.reply_bytes = reply_bytes
        self.partial_limit = partial_limit  # the bytes of unfinished requests every connection holds, in all
        self.partial_bytes = 0  # what they hold now (Connection.receive keeps it)
        self.strangers = strangers


class ReplyBudget:
    """The reply bytes one connection holds: read from the store, not yet taken by the kernel.

    A reader of the store (a get, a pull, a long poll woken by an append) ``reserve``s the most it may
    read before it reads, ``release``s what it did not use, and the writer ``release``s the rest once the
    reply is sent. A reservation waits while the connection already holds ``limit`` bytes, so a client
    that never reads its replies stops the reads (and, as the reader waits, the parsing of its
    requests) instead of growing the broker's memory. One reservation is always let through when
    nothing is held: a record larger than the limit is still served whole.
    """

    __slots__ = ("limit", "held", "_room")

    def __init__(self, limit):
        self.limit = limit
        self.held = 0
        self._room = None  # an Event once a reservation waited (most connections never wait: none is made)

    def would_wait(self, nbytes):
        return self.held > 0 and self.held + nbytes > self.limit

    def reserve(self, nbytes, closed):
        """Take ``nbytes`` of the budget, waiting for room; False when ``closed()`` became true meanwhile."""
        while self.would_wait(nbytes):
            if closed():
                return False
            if self._room is None:
                self._room = Event()
            self._room.clear()
            self._room.wait(1.0)
        self.held += nbytes
        return True

    def release(self, nbytes):
        if nbytes:
            self.held -= nbytes
            if self._room is not None:
                self._room.set()

    def wake(self):
        """Wake every waiting reservation (the connection closed: they see ``closed()`` and give up)."""
        if self._room is not None:
            self._room.set()


class Connection:
    """What every front-end's connection shares: its socket, peer, id, deadlines, receive and close.

    A subclass implements ``serve()`` (read and answer until the connection ends), sets ``parser``
    (a ``protocol.stream.StreamParser``: the request deadline applies while it is inside a frame) and
    sets or computes ``busy`` (a shutdown lets it finish).

    A subclass that sets ``parks`` holds no greenlet while idle: ``receive`` returns ``PARKED`` instead of
    waiting when no request is under way and nothing is buffered, and its ``serve`` must then return at once,
    without ending anything; the core calls ``serve`` again, in a new greenlet, when bytes arrive, when the
    connection closes or when a deadline passes (``receive`` then returns the bytes, or None: the end). So
    ``serve`` is one turn, called many times; only the turn that ends the connection ends it.
    """

    #: Its attributes in slots, not a per-object dict: a broker holds tens of thousands of connections, most idle
    #: (a subclass adds its own ``__slots__`` to keep it so, or gets a dict for its own attributes).
    __slots__ = ("sock", "raw_sock", "address", "conn_id", "closed", "idle_timeout", "request_timeout", "replies",
                 "session", "tls", "tls_bio", "_request_deadline", "_progress_seen", "_rules", "_pool", "_partial",
                 "_stranger", "_login_deadline", "rates", "_idle_until", "parked_key", "served_by", "share_key",
                 "read_watcher", "linger_watcher", "linger_timer", "_readable", "__weakref__")

    #: The connection's sans-IO parser, or None (a connection that reads its own way).
    parser = None

    #: True: no greenlet while idle (see the class doc); the front-end's ``serve`` handles ``PARKED``.
    parks = False
    #: A connection that ``parks`` waits this long idle in its greenlet before it parks: a client that sends again
    #: within it (one that is busy) is read at once, without a park and a new greenlet per request.
    park_after_s = 0.0

    #: True: inside a request under way, no bytes for the idle time also close the connection (the network failed:
    #: MQTT's Keep Alive); a request arriving steadily is held to the request deadline only. False: only that.
    idle_bounds_partial = False

    #: True: the bytes ``receive`` reads are its session's user's, charged to its produce rate there (``pace``).
    #: False for a port whose user is a request's (HTTP Basic per request, gRPC credentials per call): each request
    #: charges its own bytes, so one connection's requests of several users are each their user's.
    paces_receive = True

    #: How this connection's log lines start ("connection 1.2.3.4:5", "remoting 1.2.3.4:5").
    log_prefix = "connection"

    def __init__(self, sock, address, conn_id, rules):
        self.sock = sock
        self.address = address
        self.conn_id = conn_id
        self.closed = False
        self.idle_timeout = rules.idle_s
        self.request_timeout = rules.request_s
        self.replies = ReplyBudget(rules.reply_bytes)
        self.session = None  # the guard's Session (metaq.server.guard), set by the core once made
        # True: read and written only through its socket object (TLS, or a WebSocket: ``LAYERED``), never by
        # descriptor
        self.tls_bio = getattr(type(sock), LAYERED, False)
        self.tls = self.tls_bio or isinstance(sock, TLS_SOCKETS)
        # a plain socket's underlying non-blocking one (gevent's ``_sock``), what a read or write that must not wait
        # uses; None for TLS (an SSL socket is read and written through itself)
        self.raw_sock = None if self.tls else getattr(sock, "_sock", sock)
        self._request_deadline = None  # monotonic time by which the request under way must be complete
        self._progress_seen = None  # ``progress`` when that deadline was set
        self._rules = rules
        self._pool = rules  # whose budget of unfinished requests it draws on: the users' (rules) or the strangers'
        self._partial = 0  # this connection's share of self._pool.partial_bytes
        self._stranger = None  # the host it counts under in rules.strangers while it has not logged in
        self._login_deadline = None  # monotonic time by which it must log in, while a stranger
        self.rates = None  # the Guard, set by the core with authentication on: its pace(session, kind, nbytes)
        self._idle_until = None  # monotonic time by which a request must begin (set when it went idle)
        # The core's, for parking and the end (front-ends leave them alone):
        self.parked_key = None  # while parked: its key in the core's IdleWheel (_PARKING: being parked)
        self.served_by = None  # the ConnectionCore serving it
        self.share_key = None  # what it counts under in the core's per-address share
        self.read_watcher = None  # while parked: the loop's read watcher on its socket
        self.linger_watcher = None  # its lingers' read watcher (``_linger_timer``), from its first until it closes
        self.linger_timer = None  # its lingers' kept timer (``_linger_timer``), from its first until it closes
        self._readable = False  # ``receive`` saw the socket readable (a linger or a wake): it reads at once

    @property
    def peer(self):
        """Its peer address for log lines, "host:port" (made when asked: most connections never write one)."""
        address = self.address
        return "%s:%s" % address[:2] if isinstance(address, tuple) else str(address)

    @property
    def in_request(self):
        """True while a request has begun but not yet fully arrived (the parser is inside a frame)."""
        return self.parser is not None and self.parser.in_frame

    @property
    def progress(self):
        """A number that grows whenever a request completes (the parser's ``completed``): the request deadline
        starts again from there, so a client that streams whole requests is never cut off."""
        return self.parser.completed if self.parser is not None else 0

    #: True while the connection has a request to finish (a shutdown waits for it); a subclass sets it
    #: or makes it a property.
    busy = False

    def serve(self):
        raise NotImplementedError

    def drain(self):
        """The broker is shutting down (``ConnectionCore.stop_accepting``, before long polls are answered, the idle
        connections close and the busy ones get their grace): a front-end whose protocol announces it (HTTP/2's
        GOAWAY) does so here; the others have nothing to say."""

    def await_login(self, host, arrived):
        """Count this connection as a stranger from ``host`` (the core, on a port with authentication on): it
        must log in within ``strangers.login_s`` of when it ``arrived`` (monotonic: accepted, its TLS handshake
        included); ``logged_in`` ends that."""
        strangers = self._rules.strangers
        self._stranger = host
        self._login_deadline = arrived + strangers.login_s
        self._pool = strangers
        strangers.wait(host, self, arrived)
        if self.session is not None:
            self.session.on_login = self.logged_in

    def logged_in(self):
        """Its user proved itself (``Guard.authenticated``): it leaves the strangers' count, deadline and budget."""
        if self._stranger is None:
            return
        strangers = self._rules.strangers
        strangers.leave(self._stranger, self)
        self._stranger = self._login_deadline = None
        strangers.partial_bytes -= self._partial
        self._rules.partial_bytes += self._partial
        self._pool = self._rules
        self.login_done()

    def login_done(self):
        """What a front-end's connection lifts once logged in (the text port: its smaller body limit)."""

    def moved_to(self, address):
        """Its client is at ``address`` (``ConnectionCore.claim``): its log lines, guard session and strangers'
        count say so from now on; returns why not (that address holds its share of strangers), else None."""
        if self._stranger is not None:
            refusal = self._rules.strangers.move(self._stranger, address[0], self)
            if refusal is not None:
                return refusal
            self._stranger = address[0]
        self.address = address
        if self.session is not None:
            self.session.host = address[0]
        return None

    def _login_left(self):
        """Seconds left to log in (None: no login deadline); closes nothing itself."""
        if self._login_deadline is None:
            return None
        return self._login_deadline - time.monotonic()

    def _log_login_deadline(self):
        log.info("%s %s: not logged in within %.0f s; closing", self.log_prefix, self.peer,
                 self._rules.strangers.login_s)

    def receive(self, nbytes=RECV_BYTES, whole=False):  # noqa: C901 - every read of a busy connection, one call
        """The next bytes from the peer, or None when the connection is over (closed, reset, a deadline passed);
        ``PARKED`` (a connection that ``parks``, idle): nothing yet, its ``serve`` returns (see the class doc).
        ``whole``: the caller knows its parser holds no byte (it took every byte of its last read in whole frames),
        so no frame is begun and the parser is not asked (``in_frame``).

        Between requests it waits until the idle deadline (at least 1 ms: past it, what already arrived is still
        read, else the connection ends), and a request held before is whole now; a connection that ``parks`` first
        lingers ``park_after_s`` (less what it has been idle so far) and parks when nothing came. Inside a request
        it waits until the request deadline (``_request_wait``). Each of a busy connection's reads is one call:
        the wait between requests, and the common linger's, is worked out here, not in a function of its own."""
        if self.closed:
            return None
        if self._login_deadline is not None and self._login_left() <= 0:
            self._log_login_deadline()
            return None
        parser = self.parser
        in_request = not whole and parser is not None and parser.in_frame
        if not in_request:
            silent = False
            self._request_deadline = None
            if self._partial:  # the request it held is whole now
                self._pool.partial_bytes -= self._partial
                self._partial = 0
            if self._idle_until is None:  # idle from here (until bytes arrive): the whole idle time (no arithmetic)
                timeout = self.idle_timeout
                self._idle_until = _monotonic() + timeout
            else:
                timeout = self._idle_until - _monotonic()
            if timeout > 0 and self.parks and self.served_by is not None:
                # the linger (``_linger_timer``); its common case, a busy connection gone idle just now on a plain
                # socket, waits on its kept timer with no question asked
                timer = self.linger_timer
                if not (timer is not None and timeout == self.idle_timeout and self.parked_key is None
                        and not self.tls and self.park_after_s < timeout and self.linger_watcher is not None):
                    timer = self._linger_timer(timeout)
                    if timer is PARKED:
                        return PARKED
                if timer is not None:
                    watcher = self.linger_watcher
                    kept = timer is self.linger_timer
                    switch = _getcurrent().switch
                    try:
                        watcher.start(switch, True)
                        if kept:
                            timer.again(switch, False)  # (from now: the loop's time is brought up to date first)
                        else:
                            timer.start(switch, False)
                        came = _get_hub().switch()  # True: readable (or the end); False: the time passed
                    except OSError:  # closed meanwhile: the read meets it
                        came = True
                    finally:
                        watcher.stop()
                        timer.stop()
                        if not kept:
                            timer.close()
                        if self.closed:
                            self._close_linger_watcher()
                    if came is False:
                        self.parked_key = _PARKING
                        return PARKED
                    self._readable = True
            if timeout < 0.001:
                timeout = 0.001
        else:
            timeout, silent = self._request_wait()
            if timeout is None:
                return None
        by_login = False
        if self._login_deadline is not None:
            timeout, by_login = self._login_bound(timeout)
        # The timeout becomes the socket's (its sends until the next read wait as long). A plain socket's is set only
        # when it differs (a busy connection's is the whole idle time, read after read); one seen readable (a linger
        # or a wake) is read at once on gevent's underlying non-blocking socket, and the waiting way when nothing is
        # there after all (a spurious wake).
        sock = self.sock
        try:
            if self.tls:
                data = self._tls_receive(timeout, nbytes)
            else:
                if sock.timeout != timeout:
                    sock.settimeout(timeout)
                if self._readable:
                    self._readable = False
                    try:
                        data = self.raw_sock.recv(nbytes)
                    except BlockingIOError:
                        data = sock.recv(nbytes)
                else:
                    data = sock.recv(nbytes)
        except OSError as exc:  # socket.timeout included
            return self._receive_failed(exc, nbytes, by_login, silent, in_request)
        self._idle_until = self.parked_key = None
        if self.rates is not None and data and self.paces_receive and self.rates.acl.has_rates:
            self.pace("produce", len(data))
        return data

    def _login_bound(self, timeout):
        """``(timeout, by_login)`` of a receive of a connection still to log in: ``timeout`` cut to the login
        deadline when that comes first (``by_login``), as it stands now (lingering or waiting for room in the budget
        took some of it)."""
        login_left = self._login_left()
        if login_left < timeout:
            return max(0.001, login_left), True
        return timeout, False

    def _tls_receive(self, timeout, nbytes):
        """A TLS socket's read within ``timeout``: one record, and the records already arrived after it (a BioTls
        read takes every record already arrived itself); OSError as the socket raises it."""
        sock = self.sock
        sock.settimeout(timeout)
        if self.tls_bio:
            return sock.recv(nbytes)
        data = sock.recv(TLS_RECORD_BYTES)
        return self._more_tls(data, nbytes) if data else data

    def _request_wait(self):
        """``(timeout, silent)`` of a receive inside a request: until the request deadline, which each bit of
        progress moves on (``silent``: bounded by the idle time instead, when ``idle_bounds_partial``);
        ``(None, False)`` when the deadline passed or the partial request finds no room in the budget."""
        now, progress = time.monotonic(), self.progress
        if self._request_deadline is None or progress != self._progress_seen:
            self._request_deadline, self._progress_seen = now + self.request_timeout, progress
        elif now >= self._request_deadline:  # a peer that never lets the socket empty never meets the timeout
            log.info("%s %s: a partial request for %.0f s; closing", self.log_prefix, self.peer,
                     self.request_timeout)
            return None, False
        if not self._hold_partial():
            return None, False
        timeout = max(0.001, self._request_deadline - now)
        if self.idle_bounds_partial and self.idle_timeout < timeout:  # the next bytes within the idle time
            return self.idle_timeout, True
        return timeout, False

    def _receive_failed(self, exc, nbytes, by_login, silent, in_request):
        """What a receive whose ``recv`` raised ``exc`` returns: None (the connection is over, the reason logged
        unless the peer simply went), or the receive again when it timed out at a login deadline that a login
        meanwhile lifted (a gRPC call's login): then it is held to its other deadlines only."""
        if isinstance(exc, socket.timeout) or (self.tls and "timed out" in str(exc)):  # gevent's TLS timeout
            if by_login and self._login_deadline is None:
                return self.receive(nbytes)
            if self._login_left() is not None and self._login_left() <= 0:  # (an SSLError "...timed out")
                self._log_login_deadline()
            elif silent:
                log.info("%s %s: no bytes of a request begun for %.0f s; closing", self.log_prefix, self.peer,
                         self.idle_timeout)
            elif in_request:
                log.info("%s %s: a partial request for %.0f s; closing", self.log_prefix, self.peer,
                         self.request_timeout)
            else:
                log.info("%s %s: no request for %.0f s; closing", self.log_prefix, self.peer, self.idle_timeout)
        elif exc.errno not in (errno.ECONNRESET, errno.EBADF, errno.ENOTCONN):
            log.info("%s %s: receive failed: %s", self.log_prefix, self.peer, exc)
        return None

    def _linger_timer(self, timeout):
        """Between requests, a connection that ``parks`` (its idle deadline ``timeout`` seconds away, not passed):
        the timer its linger waits on (the receive's wait, with ``linger_watcher``); PARKED when it parks now; None
        when it does not linger: the receive reads (at once, ``_readable``, when its watcher saw bytes or the end: a
        wake), or waits as any read (TLS holding a record, or bytes already in the kernel: ``_may_park``). It
        lingers ``park_after_s``, less what it has been idle so far (at most until the idle deadline), in its
        greenlet, and parks when nothing came. The connection's one read watcher for it (``linger_watcher``) is made
        at its first linger and kept until it closes, the core's read watcher while it is parked: a busy connection
        lingers between every two packets, a device's connection parks after each. Its timer is kept as long
        (``linger_timer``, ``park_after_s`` long: the linger that begins as the connection goes idle, the receive's
        common case, which does not call this); a shorter linger (idle for a while already) has a timer of its own,
        which the receive closes after its wait."""
        if self.parked_key == _WOKEN:  # its watcher saw bytes (or the end)
            self._readable = True
            return None
        seconds = self.park_after_s - (self.idle_timeout - timeout)  # less what it has been idle so far
        # a plain socket's linger needs no look first: its wait returns at once when bytes are in the kernel
        if not ((seconds > 0 and not self.tls) or self._may_park()):
            return None
        if seconds <= 0:
            self.parked_key = _PARKING  # (the core's read watcher while parked is its linger watcher)
            return PARKED
        if seconds > timeout:
            seconds = timeout
        timer = self.linger_timer
        kept = seconds >= self.park_after_s - LINGER_SLACK_S
        if self.linger_watcher is None or (timer is None and kept):
            loop = gevent.get_hub().loop
            if self.linger_watcher is None:
                self.linger_watcher = loop.io(self.sock.fileno(), 1)
            if timer is None:
                timer = self.linger_timer = loop.timer(self.park_after_s, self.park_after_s)
        return timer if kept else gevent.get_hub().loop.timer(seconds)

    def _close_linger_watcher(self):
        watcher, self.linger_watcher = self.linger_watcher, None
        if watcher is not None:
            watcher.stop()
            watcher.close()
        timer, self.linger_timer = self.linger_timer, None
        if timer is not None:
            timer.stop()
            timer.close()

    def _may_park(self):
        """True when nothing is buffered that a read watcher on the socket would not see: no TLS plaintext or
        record held (gevent's TLS socket: never known, never parked) and nothing arrived in the kernel yet (read
        now, in this greenlet, rather than parked and woken at once)."""
        sock = self.sock
        if self.tls and (not self.tls_bio or sock.pending()):
            return False
        try:
            return ioctl(sock.fileno(), FIONREAD, b"\0\0\0\0") == b"\0\0\0\0"
        except OSError:
            return False

    def deadline(self):
        """When a parked connection must be looked at again: its idle deadline, or its login deadline if sooner."""
        if self._login_deadline is not None and self._login_deadline < self._idle_until:
            return self._login_deadline
        return self._idle_until

    def pace(self, kind, nbytes, wait=True):
        """Wait as the user's rate of ``kind`` says after ``nbytes`` (``Guard.pace``: a client over its rate is
        delayed, not refused); only this connection's greenlet waits. The wait does not count against the
        request deadline. ``wait`` False: charge only, the user's next read waits for them (a POP receive, whose
        messages' invisible time runs from their take, waits what is owed before it takes: ``pace(kind, 0)``)."""
        if self.rates is None or not self.rates.acl.has_rates:
            return
        delay = self.rates.pace(self.session, kind, nbytes)
        if delay > 0 and wait:
            gevent.sleep(delay)
            self._request_deadline = None

    def _more_tls(self, data, nbytes):
        """``data`` and the TLS records already arrived after it, up to ``nbytes`` in all, read without waiting:
        a TLS read returns one record (16 KiB at most), where a plaintext read takes all the kernel holds; a
        burst of pipelined requests is handled as one, as it is without TLS."""
        sock = self.sock
        parts, size = [data], len(data)
        sock.settimeout(0.0)
        try:
            while size < nbytes:
                if not sock.pending() and ioctl(sock.fileno(), FIONREAD, b"\0\0\0\0") == b"\0\0\0\0":
                    break  # nothing more arrived (cheaper than the SSLWantReadError a read would raise)
                chunk = sock.recv(min(nbytes - size, TLS_RECORD_BYTES))
                if not chunk:
                    break
                parts.append(chunk)
                size += len(chunk)
        except OSError:  # ssl.SSLWantReadError: nothing more now; a real failure shows at the next receive
            pass
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def tls_hello(self, data):
        """True (and one log line) when ``data``, the first bytes of a plaintext connection, open a TLS hello: a
        client configured for TLS reached a port without it. The front-end closes the connection. Called once
        per connection, on its first bytes; 0x16 can start no text command, and as the first byte of a length
        it would make a frame far past any frame limit."""
        if self.tls or data[:1] != TLS_HANDSHAKE_BYTE:
            return False
        log.warning("%s %s: a TLS hello on a plaintext port (security.tls.mode is off for it); closing",
                    self.log_prefix, self.peer)
        return True

    def _hold_partial(self):
        """Account the bytes of this connection's unfinished request in the broker-wide budget; while that is past
        ``partial_limit``, read nothing more (wait) until there is room: False when the request deadline or a
        stranger's login deadline passed (or the connection closed) meanwhile."""
        pool = self._pool
        held = getattr(self.parser, "buffered", 0)
        pool.partial_bytes += held - self._partial
        self._partial = held
        if pool.partial_bytes <= pool.partial_limit or not held:
            return True
        log.warning("%s %s: unfinished requests %shold %d bytes on the broker (%s %d): this one waits",
                    self.log_prefix, self.peer, "of connections not yet logged in " if pool is not self._rules else "",
                    pool.partial_bytes, "MAX_PARTIAL_REQUEST_BYTES" if pool is self._rules
                    else "MAX_PRELOGIN_PARTIAL_BYTES", pool.partial_limit)
        while pool.partial_bytes > pool.partial_limit:
            if self.closed or pool is not self._pool:
                return not self.closed  # logged in meanwhile: the users' budget now
            if time.monotonic() >= self._request_deadline:
                return False
            if self._login_deadline is not None and time.monotonic() >= self._login_deadline:
                self._log_login_deadline()
                return False
            gevent.sleep(PARTIAL_WAIT_S)
        return True

    def close(self):
        if self.closed:
            return
        self.closed = True
        self._pool.partial_bytes -= self._partial
        self._partial = 0
        if self._stranger is not None:
            self._rules.strangers.leave(self._stranger, self)
            self._stranger = None
        self.replies.wake()
        if self.parked_key is not None and self.served_by is not None:
            self.served_by.wake(self)  # before the socket closes: its watcher stopped, its end run in a new greenlet
        if self.linger_watcher is None or not self.linger_watcher.active:  # (else its lingering greenlet does)
            self._close_linger_watcher()
        try:
            self.sock.close()
        except OSError:
            pass


def close_with_grace(ending, grace_s):
    """Close the connections ``ending``: the idle ones now, the busy ones (a request being answered) when they are
    done or ``grace_s`` has passed, whichever comes first."""
    for conn in ending:
        if not conn.busy:
            conn.close()
    deadline = time.monotonic() + grace_s
    while any(c.busy and not c.closed for c in ending) and time.monotonic() < deadline:
        gevent.sleep(0.01)
    for conn in ending:
        conn.close()


class ConnectionCore:
    """The broker's listeners and every connection open on them."""

    def __init__(self, max_connections, rules, max_per_address=None, guard=None, tls=None,
                 handshakes_per_address_s=limits.TLS_HANDSHAKES_PER_ADDRESS_S, proxies=None):
        self.max_connections = max_connections
        #: The trusted proxies (``metaq.serving.proxies.TrustedProxies``): whose PROXY header names the client.
        self.proxies = proxies if proxies is not None else TrustedProxies()
        self.proxy_refused = 0  # connections from a trusted proxy closed for a bad or late PROXY header
        #: The broker's TlsPolicy (metaq.serving.tls), or None: plaintext on every listener.
        self.tls = tls
        self.handshakes = HandshakeRate(handshakes_per_address_s)  # TLS handshakes started, per address
        self._handshaking = 0  # accepted sockets in their TLS handshake (counted against the cap)
        #: The broker's Guard (metaq.server.guard): the address allow-list and each connection's Session.
        self.guard = guard
        #: Most connections one peer address may hold (None: no cap but ``max_connections``).
        self.max_per_address = max_per_address
        self.rules = rules
        self._per_address = {}  # peer host -> connections it holds (on listeners without headroom)
        self.penalties = Penalties()  # addresses cut for abuse, refused on a listener for a cooldown (``penalize``)
        self._refusals = {}  # (listener name, what) -> [refused since the last log line, when that line was written]
        self.closing = False
        self._listeners = []
        self._open = {}  # conn_id -> Connection
        self._listener_of = {}  # conn_id -> Listener
        self._named = {}  # listener name -> its open connections (``count``: asked by every ``stats``)
        self._ids = itertools.count(1)
        self._close_hooks = []
        self._wheel = IdleWheel(self.wake)  # the deadlines of parked connections
        self._turners = []  # greenlets kept waiting for a woken connection's turn (``_serve_turn``), last idle last

    def listen(self, name, host, port, make, refuse=None, backlog=1024, headroom=0, guarded=True, server_first=False,
               alpn=(), strangers=None):
        """Start accepting on ``host:port`` (0: any free port); returns the started Listener. ``guarded``: the
        guard's address allow-list applies to it (not to replication, whose peers prove a shared secret);
        ``server_first``: its protocol has the broker speak first (a plaintext peer sends nothing until then);
        ``alpn``: the protocols its TLS handshake negotiates (gRPC's clients require "h2"); ``strangers``: a
        ``Strangers`` of its own its connections count in until they prove themselves (``Connection.logged_in``;
        the connections' rules must hold the same one), whatever the guard says."""
        listener = Listener(name, host, port, make, refuse, backlog, headroom, guarded, server_first, alpn,
                            strangers)
        if self.tls is not None:
            listener.tls = self.tls.mode_for(name)
        listener.start(self.accept)
        self._listeners.append(listener)
        return listener

    def on_close(self, hook):
        """Call ``hook(conn)`` after any connection of any listener has ended."""
        self._close_hooks.append(hook)

    def count(self, name=None):
        """Open connections, on one listener or on all."""
        if name is None:
            return len(self._open)
        return self._named.get(name, 0)

    def connections(self, name=None):
        """The open connections, of the listener(s) called ``name`` or of all."""
        return [c for cid, c in list(self._open.items())
                if name is None or getattr(self._listener_of.get(cid), "name", None) == name]

    def next_id(self):
        """A connection id for a connection the core did not accept (an internal client)."""
        return next(self._ids)

    # -- accepting -------------------------------------------------------------

    def accept(self, listener, sock, address):
        """One accepted socket of ``listener``: refused past the cap, else served until it ends or parks (its
        greenlet); the socket is closed unless a connection keeps it."""
        try:
            self._accept(listener, sock, address)
        except BaseException:
            sock.close()
            raise

    def _accept(self, listener, sock, address):
        if self.proxies.requires_header(listener.name, address):
            address = self._unproxied(listener, sock, address)
            if address is None:
                return
        admitted, host = self._admit(listener, sock, address)
        if not admitted:
            return
        strangers = self._strangers_of(listener)
        stranger = address[0] if host is not None and strangers is not None else None
        arrived = time.monotonic()
        if stranger is not None:  # counted, and its login deadline running, from here: a TLS handshake included
            strangers.arrive(stranger)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if listener.tls != "off":
            sock = self._secured(listener, sock, address, host, stranger, arrived)
            if sock is None:
                return
        conn_id, conn = self._connection(listener, sock, address, host, stranger, arrived)
        conn.served_by = self
        conn.share_key = host
        self._open[conn_id] = conn
        self._listener_of[conn_id] = listener
        self._named[listener.name] = self._named.get(listener.name, 0) + 1
        self._turn(conn)

    def _unproxied(self, listener, sock, address):
        """The client's address the PROXY header of a trusted proxy's connection names (``address``, the proxy's,
        when it names none: the proxy's own check), read before anything is counted for it; None (closed, counted
        in ``proxy_refused``, logged) while closing, past the connection cap, or for a header malformed, too long or
        not complete within the handshake deadline (the login deadline when shorter)."""
        if self.closing:
            sock.close()
            return None
        if len(self._open) + self._handshaking >= self.max_connections + listener.headroom:
            self._refuse(listener, sock, address, "too many connections: the limit is %d"
                         % (self.max_connections + listener.headroom))
            return None
        deadline_s = min(limits.TLS_HANDSHAKE_TIMEOUT_S, self.rules.request_s)
        if self._checks_login(listener):
            deadline_s = min(deadline_s, self.rules.strangers.login_s)
        self._handshaking += 1
        try:
            claimed = read_header(sock, deadline_s)
        except ProxyHeaderError as exc:
            self.proxy_refused += 1
            sock.close()
            self._log_refusal(listener, address, exc, "closed, for its PROXY header,")
            return None
        finally:
            self._handshaking -= 1
        return self.proxies.real_address(address, claimed)

    def claim(self, conn, claimed):
        """``conn``, open on this core, says it carries the client ``claimed`` (``(host, port)``: a WebSocket upgrade's
        ``X-Forwarded-For``). When its peer is a trusted proxy (``TrustedProxies.real_address``) that address becomes
        the connection's: the allow-list is asked, and its per-address share, strangers' count and guard session
        move there. Returns None, or why not (the client's share is full, the allow-list refuses it): the caller
        then closes the connection."""
        address = self.proxies.real_address(conn.address, claimed)
        if address == conn.address:
            return None
        host, listener = address[0], self._listener_of.get(conn.conn_id)
        if self.guard is not None and listener is not None and listener.guarded:
            refusal = self.guard.admit(host)
            if refusal is not None:
                return refusal
        shared = conn.share_key is not None and not isinstance(conn.share_key, tuple)  # (not a headroom port's)
        if shared and self.max_per_address is not None and self._per_address.get(host, 0) >= self.max_per_address:
            return "too many connections from %s: the limit is %d per address" % (host, self.max_per_address)
        refusal = conn.moved_to(address)
        if refusal is None and shared:
            self._forget(conn.share_key)
            self._per_address[host] = self._per_address.get(host, 0) + 1
            conn.share_key = host
        return refusal

    def _admit(self, listener, sock, address):
        """``(admitted, host)``: a socket refused (and closed) while closing, past the connection cap, from an
        address in its cooldown on this listener (``penalize``), past its address's share or by the guard,
        ``(False, None)``; else counted in its address's share (``host``, None
        for an address that is no IP address)."""
        if self.closing:
            sock.close()
            return False, None
        if len(self._open) + self._handshaking >= self.max_connections + listener.headroom:
            self._refuse(listener, sock, address, "too many connections: the limit is %d"
                         % (self.max_connections + listener.headroom))
            return False, None
        if not isinstance(address, tuple):
            return True, None
        # A listener with headroom of its own (replication) counts its peers apart, against a small cap of
        # its own: a client filling its address's share elsewhere cannot lock a slave on that host out, and
        # one host cannot take the headroom.
        if self.penalties:  # an address in its cooldown: closed before anything is counted or made
            refusal = self.penalties.refusal((listener.name, address[0]), time.monotonic())
            if refusal is not None:
                self._refuse(listener, sock, address, refusal)
                return False, None
        host = (listener.name, address[0]) if listener.headroom else address[0]
        cap = limits.HEADROOM_PER_ADDRESS if listener.headroom else self.max_per_address
        held = self._per_address.get(host, 0)
        if cap is not None and held >= cap:
            self._refuse(listener, sock, address, "too many connections from %s: the limit is %d per address"
                         % (address[0], cap))
            return False, None
        if self.guard is not None and listener.guarded:
            refusal = self.guard.admit(address[0])
            if refusal is None and self._checks_login(listener):
                refusal = self._make_room(listener, address[0])
            if refusal is not None:
                self._refuse(listener, sock, address, refusal)
                return False, None
        elif listener.strangers is not None:
            refusal = self._make_room(listener, address[0])
            if refusal is not None:
                self._refuse(listener, sock, address, refusal)
                return False, None
        self._per_address[host] = held + 1
        return True, host

    def _secured(self, listener, sock, address, host, stranger, arrived):
        """The TLS socket of an admitted one after its handshake; None (its share and stranger count given back,
        the socket closed) past the address's handshake rate or when the handshake failed."""
        strangers = self._strangers_of(listener)
        if host is not None and listener.guarded and not self.handshakes.take(address[0], time.monotonic()):
            self._forget(host)
            if stranger is not None:
                strangers.leave(stranger)
            sock.close()
            self._log_refusal(listener, address, "too many TLS handshakes from %s: the limit is %d a second"
                              % (address[0], self.handshakes.per_s), "closed before its handshake")
            return None
        sock = self._secure(listener, sock, address, stranger, arrived)
        if sock is None:
            self._forget(host)
            if stranger is not None:
                strangers.leave(stranger)
        return sock

    def _connection(self, listener, sock, address, host, stranger, arrived):
        """``(id, connection)``: the listener's connection on ``sock``, with its guard session and rates and, for a
        stranger, its login deadline; when making it fails, its share and stranger count are given back and the
        socket closed."""
        conn_id = next(self._ids)
        try:
            conn = listener.make(sock, address, conn_id)
            if self.guard is not None:
                conn.session = self.guard.session(address[0] if isinstance(address, tuple) else str(address),
                                                  isinstance(sock, TLS_SOCKETS))
                if self.guard.enabled and listener.guarded:
                    conn.rates = self.guard
            if stranger is not None:
                conn.await_login(stranger, arrived)  # from here it leaves the count when it logs in or closes
                stranger = None
        except BaseException:
            self._forget(host)
            if stranger is not None:
                self._strangers_of(listener).leave(stranger)
            sock.close()
            raise
        return conn_id, conn

    def _turn(self, conn):
        """Serve ``conn`` in this greenlet until it ends (then its end: the per-address share, the close, the close
        hooks) or parks (then its read watcher and deadline are armed and this greenlet ends)."""
        parks = False
        try:
            conn.serve()
            if conn.parked_key == _PARKING and not conn.closed:
                watcher, conn.linger_watcher = conn.linger_watcher, None  # one watcher for its lingers and parks
                if watcher is None:
                    watcher = gevent.get_hub().loop.io(conn.sock.fileno(), 1)
                conn.read_watcher = watcher
                conn.parked_key = self._wheel.add(conn, conn.deadline())
                watcher.start(_readable, conn)
                parks = True
        finally:
            if not parks:
                conn.parked_key = None
                if conn.read_watcher is not None:  # (armed when parking failed half way)
                    conn.read_watcher.close()
                    conn.read_watcher = None
                self._forget(conn.share_key)
                conn.share_key = None
                conn.close()
                self._open.pop(conn.conn_id, None)
                listener = self._listener_of.pop(conn.conn_id, None)
                if listener is not None:
                    self._named[listener.name] -= 1
                for hook in self._close_hooks:
                    try:
                        hook(conn)
                    except Exception:  # noqa: BLE001 - one hook's failure must not skip the others
                        log.exception("%s %s: a close hook failed", conn.log_prefix, conn.peer)

    def wake(self, conn, readable=False):
        """Serve the parked ``conn`` again, in a greenlet of its own: bytes arrived (``readable``: its watcher; that
        turn reads them, even the end of the stream, rather than park again), its deadline passed or it is closing
        (then that turn ends it). Nothing for a connection not parked."""
        key = conn.parked_key
        if key is None or key == _WOKEN:
            return
        conn.parked_key = _WOKEN if readable else None
        if key == _PARKING:  # its turn has not returned yet: it sees the close itself
            return
        watcher, conn.read_watcher = conn.read_watcher, None
        watcher.stop()
        if conn.closed or conn.linger_watcher is not None:
            watcher.close()
        else:
            conn.linger_watcher = watcher  # its turn lingers on it, and parks on it again
        self._wheel.remove(conn, key)
        self._serve_turn(conn)

    def _serve_turn(self, conn):
        """Run the woken ``conn``'s turn (``_turn``) in a greenlet kept from an earlier turn, else in a new one (which
        is kept after, up to ``limits.MAX_IDLE_TURN_GREENLETS`` idle): a device's connection, woken for each message,
        makes and ends no greenlet per message. A kept greenlet holds no connection between turns."""
        turners = self._turners
        if turners:
            gevent.get_hub().loop.run_callback(turners.pop().switch, conn)
        else:
            gevent.spawn(self._turns, [conn])  # (in a list it empties: its arguments are kept as long as it runs)

    def _turns(self, first):
        """A turn greenlet: the turn of the connection in ``first``, then, while fewer than
        ``limits.MAX_IDLE_TURN_GREENLETS`` wait, the turn of each connection ``_serve_turn`` hands it. Anything else
        switching into a waiting one ends it."""
        conn = first.pop()
        hub = gevent.get_hub()
        me = gevent.getcurrent()
        turners = self._turners
        while True:
            self._turn(conn)
            if len(turners) >= limits.MAX_IDLE_TURN_GREENLETS:
                return
            conn = None  # (no connection held while it waits)
            turners.append(me)
            try:
                conn = hub.switch()
            finally:
                if not isinstance(conn, Connection) and me in turners:
                    turners.remove(me)
            if not isinstance(conn, Connection):
                log.warning("a turn greenlet was woken by %r; it ends", conn)
                return

    def turners(self):
        """Greenlets kept waiting for a woken connection's turn now."""
        return len(self._turners)

    def parked(self):
        """Connections parked now (holding no greenlet)."""
        return len(self._wheel)

    def _strangers_of(self, listener):
        """The ``Strangers`` a new connection of ``listener`` counts in, or None: the listener's own (replication:
        until its secret is proved), else the logins' when ``_checks_login``."""
        if listener.strangers is not None:
            return listener.strangers
        return self.rules.strangers if self._checks_login(listener) else None

    def _checks_login(self, listener):
        """True when connections of ``listener`` are strangers until they log in (authentication on, a guarded
        port: text, remoting, HTTP; replication proves its own secret)."""
        return (self.rules.strangers is not None and self.guard is not None and self.guard.enabled
                and listener.guarded)

    def _make_room(self, listener, host):
        """None when a new stranger from ``host`` may wait to log in, else why not (``Strangers.room``); the
        stranger it names to make room is closed here, one log line a second saying so."""
        strangers = self._strangers_of(listener)
        refusal, victim = strangers.room(host, time.monotonic())
        if victim is not None:
            victim.close()  # leaves the strangers' count now; its greenlet (or a parked one's new turn) ends it
            self._log_refusal(self._listener_of.get(victim.conn_id, listener), victim.address,
                              "not yet logged in, the oldest of the address holding the most, closed to make room for "
                              "a new connection: strangers at their limit of %d" % strangers.cap, "evicted")
        return refusal

    def _secure(self, listener, sock, address, stranger, arrived):
        """The socket to serve once TLS is settled (``TlsPolicy.secure``), or None: refused, failed, closed. A
        ``stranger`` (its host; it ``arrived`` then) waits for its first byte and handshake no longer than its
        login deadline, and may meanwhile be closed to make room (``Strangers.room``) as any stranger may."""
        idle_s, request_s = self.rules.idle_s, self.rules.request_s
        strangers, handshake = self._strangers_of(listener), None
        if stranger is not None:
            idle_s, request_s = min(idle_s, strangers.login_s), min(request_s, strangers.login_s)
            handshake = _Handshake(sock, address)
            strangers.wait(stranger, handshake, arrived)
        self._handshaking += 1
        try:
            secured, why = self.tls.secure(listener.tls, sock, idle_s, request_s, listener.server_first,
                                           listener.alpn)
        finally:
            self._handshaking -= 1
            if handshake is not None:
                strangers.unwait(stranger, handshake)
        if secured is not None and self.closing:
            secured.close()
            return None
        if secured is None:
            if why == PLAINTEXT_REFUSAL:
                self._refuse(listener, sock, address, why, code=400)
            else:
                sock.close()
                if why:
                    self._log_refusal(listener, address, why, "closed")
        return secured

    def reshare(self, conn, share, cap):
        """``conn`` leaves its address's share for the share named ``share`` of the same address, held to ``cap``
        (the replication port: a peer that proved the secret counts apart from the strangers of its host); False,
        nothing changed, when that share is full."""
        key = conn.share_key
        if key is None:
            return True
        host = key[1] if isinstance(key, tuple) else key
        moved = (share, host)
        if self._per_address.get(moved, 0) >= cap:
            return False
        self._forget(key)
        self._per_address[moved] = self._per_address.get(moved, 0) + 1
        conn.share_key = moved
        return True

    def _forget(self, host):
        if host is not None:
            left = self._per_address[host] - 1
            if left:
                self._per_address[host] = left
            else:
                del self._per_address[host]

    def penalize(self, listener, host, base_s):
        """``host`` was cut for abuse on the listener named ``listener`` (a gRPC flood): its new connections there
        are refused (``_admit``) for a cooldown that grows while it keeps being cut (``Penalties``), nothing when
        ``base_s`` is 0; the cooldown, in seconds."""
        if not base_s:
            return 0.0
        return self.penalties.cut((listener, host), base_s, time.monotonic())

    def penalty_counts(self):
        """``(refused, penalized)``: connections refused for a cooldown since the start, and the addresses (an IPv6
        /64 each) remembered as cut now (at most ``MAX_PENALIZED_ADDRESSES``)."""
        return self.penalties.refused, len(self.penalties)

    def count_from(self, host, listener=None):
        """Connections the peer address ``host`` holds against ``max_per_address`` (or, with the name of a listener
        that has headroom, against that listener's own per-address cap)."""
        return self._per_address.get((listener, host) if listener else host, 0)

    def _refuse(self, listener, sock, address, reason, code=None):
        """Turn ``sock`` away in the listener's words (``code``: other than its usual one) and close it. On a port
        that speaks TLS a refusal before the handshake just closes: the peer expects TLS, not plaintext."""
        if listener.refuse is not None and (listener.tls == "off" or code is not None):
            try:
                if code is None:
                    listener.refuse(sock, reason)
                else:
                    listener.refuse(sock, reason, code)
            except OSError:
                pass
        sock.close()
        self._log_refusal(listener, address, reason)

    def _log_refusal(self, listener, address, reason, what="refused"):
        """One line per listener and ``what`` (refused; closed in its TLS handshake) per ``REFUSAL_LOG_INTERVAL_S``
        at most, counting those in between."""
        seen = self._refusals.setdefault((listener.name, what), [0, -REFUSAL_LOG_INTERVAL_S])
        seen[0] += 1
        now = time.monotonic()
        if now - seen[1] >= REFUSAL_LOG_INTERVAL_S:
            more = " and %d more since the last such line" % (seen[0] - 1) if seen[0] > 1 else ""
            log.warning("%s a connection from %s on the %s port: %s (%d connections open)%s", what,
                        address[0] if isinstance(address, tuple) else address, listener.name, reason,
                        len(self._open), more)
            seen[0], seen[1] = 0, now

    # -- shutting down ---------------------------------------------------------

    def close_listener(self, listener):
        """Stop one listener and close the connections it accepted (a front-end stopping while the broker runs)."""
        listener.close()
        if listener in self._listeners:
            self._listeners.remove(listener)
        for cid, conn in list(self._open.items()):
            if self._listener_of.get(cid) is listener:
                conn.close()

    def stop_accepting(self, keep=()):
        """No new connection on any listener; those named in ``keep`` stay open (see ``shutdown``). The connections
        of the others are told (``Connection.drain``: HTTP/2's GOAWAY, no new streams), before the broker answers
        what its connections wait for."""
        self.closing = True
        for listener in list(self._listeners):
            if listener.name not in keep:
                listener.close()
        for cid, conn in list(self._open.items()):
            if self._listener_of[cid].name not in keep:
                conn.drain()
        gevent.sleep(0)  # what the drains send leaves before the broker goes on (the idle connections close)

    def shutdown(self, grace_s, keep=()):
        """Orderly close: no new connections, idle ones closed now, busy ones given ``grace_s`` to finish.

        Listeners named in ``keep`` (replication: slaves must get what the finishing requests write) are
        left to their front-end's own stop (``close_listener``)."""
        self.stop_accepting(keep)
        close_with_grace([c for cid, c in list(self._open.items()) if self._listener_of[cid].name not in keep],
                         grace_s)
