"""The one authorization check of the broker, used by every front-end (docs/security.md).

``Guard`` holds the parsed permissions file (``metaq.auth.acl``), reloads it when it changes (a bad new
version is logged and the old one kept, as RocketMQ keeps its last good ``plain_acl.yml``) and answers:

* ``admit(host)``: may this address connect at all (the global allow-list)? The connection core asks it
  for every accepted socket, on every listener but replication (which proves a secret of its own).
* ``require(session, action, kind, name)``: may this connection's user publish to / subscribe to a topic,
  consume as a group, or do an admin operation? ``Unauthenticated`` (401) when no user has proved itself
  yet, ``Forbidden`` (403) when the user may not. With authentication off it lets everything through.

A ``Session`` is one connection's security state: its peer address, whether it came over TLS, and the
user it proved (text: the ``auth`` handshake; remoting: each signed request names and proves its user).
Users are looked up by name at every check, so a reloaded file's revocations apply to open connections at
once.
"""

import collections
import logging
import os
import stat
import time

import gevent

from metaq import errors
from metaq.auth import limits as auth_limits
from metaq.auth import proofs
from metaq.auth.acl import ADMIN, PUB, SUB, failure_prefix, parse_acl
from metaq.auth.quotas import RATE_OF, Quotas
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.protocol.journaltopic import GROUP_COPY_PREFIXES
from metaq.priorities.wire import is_level_topic, split_level
from metaq.server.config import read_yaml
from metaq.timers.records import TIMER_TOPIC
from metaq.protocol.journaltopic import MQTT_INBOX_TOPIC, MQTT_SESSIONS_TOPIC, POP_TOPIC, TX_TOPIC

log = logging.getLogger(__name__)

__all__ = ["Guard", "Session", "PUB", "SUB", "ADMIN"]


class Session:
    """One connection's security state (see the module doc)."""

    __slots__ = ("host", "tls", "user", "nonce", "nonce_user", "nonce_at", "logged_in", "on_login", "counted")

    def __init__(self, host, tls=False):
        self.host = host
        self.tls = tls
        self.user = None  # the name of the user this connection proved, or None
        self.logged_in = False  # a user has proved itself on this connection (once true, stays true)
        self.on_login = None  # called once, when logged_in turns true (the connection core's strangers count)
        self.counted = None  # the user whose connections quota this connection counts in (Guard.authenticated)
        self.nonce = None  # the text handshake's server nonce, while one is outstanding
        self.nonce_user = None
        self.nonce_at = 0.0


def _file_state(path):
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read_acl(path):
    """The parsed file at ``path`` (a ConfigError names what is wrong); runs in a worker thread. A file others
    may read or write is refused: it holds every user's secret."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise errors.ConfigError("cannot read security.acl_file %s: %s" % (path, exc.strerror)) from None
    if st.st_mode & (stat.S_IRWXO):
        raise errors.ConfigError("security.acl_file %s has mode %04o: other users may read or change every user's "
                                 "secret. chmod 600 it (or 640 for a group of operators)"
                                 % (path, stat.S_IMODE(st.st_mode)))
    size = st.st_size
    if size > auth_limits.MAX_ACL_FILE_BYTES:
        raise errors.ConfigError("security.acl_file %s is %d bytes: the limit is %d (limits.MAX_ACL_FILE_BYTES)"
                                 % (path, size, auth_limits.MAX_ACL_FILE_BYTES))
    return _file_state(path), parse_acl(read_yaml(path), "security.acl_file %s" % path)


class Guard:
    """See the module doc. ``security``: the configuration's ``security:`` section."""

    def __init__(self, security, broker_limits=None):
        """``broker_limits``: the configured broker-wide limits the quotas divide (``metaq.auth.quotas``), by
        quota name."""
        self.path = security.acl_file
        self.reload_s = security.acl_reload_s
        self.enabled = self.path is not None
        self.tls = security.tls.mode != "off"
        self.acl = None
        self.file_state = None
        self.reloads = 0
        self.reload_error = None  # the last failed reload's reason, until a good one
        self._failures = collections.OrderedDict()  # host or prefix -> deque of failure times (monotonic)
        self._decoy = os.urandom(32)  # an unknown user's proof is checked against it: the same work as a known one's
        self._loop = None
        #: the quota decision over the current file (``quotas.check(user, name, current)``; docs/security.md "Quotas")
        self.quotas = Quotas(lambda: self.acl if self.enabled else None, broker_limits)
        self._connected = {}  # user -> connections logged in as it (its connections quota)
        self.on_change = []  # callables, run after each reload (``PutPath.changed``: decisions kept are asked again)
        if self.enabled:
            self.file_state, self.acl = _read_acl(self.path)  # a bad file stops the broker's start
            log.info("authentication on: %d users from %s", len(self.acl.users), self.path)

    # -- the file --------------------------------------------------------------

    def start(self):
        if self.enabled and self._loop is None:
            self._loop = gevent.spawn(self._watch)

    def stop(self):
        if self._loop is not None:
            self._loop.kill(block=False)
            self._loop = None

    def _watch(self):
        pool = gevent.get_hub().threadpool
        while True:
            gevent.sleep(self.reload_s)
            try:
                self.reload(pool.apply(_file_state, (self.path,)), pool)
            except OSError as exc:
                self._reload_failed("cannot read it: %s" % exc.strerror)

    def reload(self, state=None, pool=None):
        """Read the file again if it changed (``state``: its inode, size and mtime); True when reloaded."""
        if state is not None and state == self.file_state:
            return False
        try:
            state, acl = pool.apply(_read_acl, (self.path,)) if pool is not None else _read_acl(self.path)
        except errors.ConfigError as exc:
            self._reload_failed(str(exc))
            return False
        self.acl, self.file_state, self.reload_error = acl, state, None
        self.reloads += 1
        for callback in self.on_change:
            callback()
        log.info("security.acl_file %s reloaded: %d users", self.path, len(acl.users))
        return True

    def _reload_failed(self, reason):
        if reason != self.reload_error:
            log.error("security.acl_file %s not reloaded, the previous version stays in force: %s", self.path, reason)
        self.reload_error = reason

    # -- connections -----------------------------------------------------------

    def session(self, host, tls=False):
        return Session(host, tls)

    def acting_for(self, name, host):
        """A session of user ``name`` (None: authentication off) from ``host`` that proved nothing now: what the
        broker writes with on behalf of a client whose connection, which proved it, is gone (an MQTT will a new
        master publishes). ``require`` asks the user's permissions and address as for the client's own session."""
        session = Session(host)
        session.user = name
        return session

    def admit(self, host):
        """None when ``host`` may connect, else why not (the global allow-list)."""
        if self.acl is None or self.acl.address_allowed(host):
            return None
        return "address %s is not in the allow-list of security.acl_file" % host

    def user(self, name):
        """The current ``acl.User`` called ``name``, or None."""
        return self.acl.user(name) if self.acl is not None else None

    def check_login(self, name, proof_matches):
        """The one login decision of every port: the ``acl.User`` called ``name`` when ``proof_matches(secret)``
        (the port's check of the client's proof against that secret) is true, else None. An unknown user's proof
        is checked against a random secret, so a reply takes the same work whether the user exists or not."""
        user = self.user(name)
        matched = proof_matches(user.secret if user is not None else self._decoy)
        return user if user is not None and matched else None

    def login_with_secret(self, session, name, secret, port):
        """The login of a client that sends its user's secret as it is (HTTP Basic, an MQTT CONNECT's password): the
        secret checked against the file (``check_login``, in constant time), a failure counted and its answer slowed
        as the text handshake's is (``failed``), logged for ``port`` and raised as Unauthenticated; on success the
        session is the user's (``authenticated``, which may still refuse the user's address or quota)."""
        if self.check_login(name, lambda on_file: proofs.same_secret(secret, on_file)) is None:
            delay = self.failed(session.host)  # a guesser's answers slow down, as on the text port
            if delay:
                gevent.sleep(delay)
            log.warning("%s authentication failed from %s: %s", port, session.host, self.login_failure(name, "secret"))
            raise errors.Unauthenticated("authentication failed: unknown user or wrong secret")
        self.authenticated(session, name)

    def login_failure(self, name, proof):
        """For the broker's log only (a reply never tells): ``unknown user <name>`` or ``wrong <proof> for user
        <name>``."""
        return "unknown user %s" % name if self.user(name) is None else "wrong %s for user %s" % (proof, name)

    def authenticated(self, session, name):
        """Mark ``session`` as ``name``'s (after a proof); Unauthenticated if that user may not come from there."""
        user = self.user(name)
        if user is None or not user.allowed_from(session.host):
            raise errors.Unauthenticated("authentication failed: user %s may not connect from %s"
                                         % (name, session.host))
        if session.counted != name:  # the user's connections quota: counted once per connection and user
            self.quotas.check(name, "connections", self._connected.get(name, 0))
            self.connection_closed(session)
            self._connected[name] = self._connected.get(name, 0) + 1
            session.counted = name
        session.user = name
        if not session.logged_in:
            session.logged_in = True
            hook, session.on_login = session.on_login, None  # once: and the session no longer keeps its connection
            if hook is not None:
                hook()

    def connection_closed(self, session):
        """The connection of ``session`` ended (the connection core's close hook), or logs in as another user:
        it no longer counts in its user's connections quota."""
        name = session.counted if session is not None else None
        if name is None:
            return
        session.counted = None
        n = self._connected.get(name, 0) - 1
        if n > 0:
            self._connected[name] = n
        else:
            self._connected.pop(name, None)

    def pace(self, session, kind, nbytes):
        """The one pacing point of every port (docs/architecture.md "Pacing"): charge ``nbytes`` of ``kind``
        (``"produce"``: bytes received from the user; ``"fetch"``: bytes of records sent to it, over any protocol) to
        the user of ``session`` (a connection's session, or anything with its ``user``: a gRPC call), and return the
        seconds its reads (or writes) of that kind must wait before they go on, as its rate says (``Quotas.pace``: a
        token bucket per user, over all its connections); 0 for no user or no rate. ``nbytes`` 0 charges nothing
        and tells what the user still owes: a read about to start waits that long first. Callers delay, never
        refuse, and wait only in a greenlet of the paced user's own."""
        user = session.user if session is not None else None
        if not user or self.acl is None or not self.acl.has_rates:
            return 0.0
        return self.quotas.pace(user, kind, nbytes, time.monotonic())

    def paced(self, session, kind):
        """True when the user of ``session`` has a rate of ``kind`` now (its bytes of that kind pass ``pace``): a
        read path that shares its work between users (MQTT's fan-out, a publisher's direct deliveries) leaves such
        a user's reads to the user's own greenlet."""
        user = session.user if session is not None else None
        if not user or self.acl is None or not self.acl.has_rates or not self.enabled:
            return False
        return self.quotas.rate(user, RATE_OF[kind]) is not None

    def connected(self):
        """``{user: connections logged in as it}`` (stats)."""
        return dict(self._connected)

    # -- the check -------------------------------------------------------------

    def require(self, session, action, kind=None, name=None):
        """Raise unless the session's user may ``action`` (PUB, SUB: on ``kind`` "topic"/"group" ``name``;
        ADMIN: an admin operation). Nothing is checked with authentication off."""
        if not self.enabled:
            return
        user = self.current_user(session)
        if action == ADMIN:
            if not user.admin:
                raise errors.Forbidden("permission denied: user %s is not an admin (the admin role is needed)"
                                       % user.name)
            return
        ruled = name
        if kind == "topic" and name is not None and is_level_topic(name):
            ruled = split_level(name)[0]  # a priority level is its topic's: granted or denied with it
        if kind == "topic" and name in (SCHEDULE_TOPIC, TIMER_TOPIC, TX_TOPIC, POP_TOPIC, MQTT_SESSIONS_TOPIC,
                                        MQTT_INBOX_TOPIC) \
                and not user.admin:
            # whole messages of every topic with a delay or a transaction, devices' sessions: only an admin's
            raise errors.Forbidden("permission denied: %s is the broker's internal topic (admin only)" % name)
        if kind == "topic" and name is not None and name.startswith(GROUP_COPY_PREFIXES) and not user.admin:
            # copies of the messages of every topic the group consumed, whatever this user may read: a RocketMQ
            # consumer pulls its group's retry topic on the remoting port (remoting/acl.py: checked as the group,
            # each message as its own topic), everything else is an admin's
            raise errors.Forbidden("permission denied: %s holds copies of messages of the topics its group consumed "
                                   "(admin only; a group's RocketMQ consumers pull its %%RETRY%% topic)" % name)
        if not user.may(action, kind, ruled):
            raise errors.Forbidden("permission denied: user %s may not %s %s %s" % (
                user.name, "publish to" if action == PUB else ("consume as" if kind == "group" else "subscribe to"),
                kind, name))

    def current_user(self, session):
        """The session's ``acl.User``; Unauthenticated when there is none (or it was removed by a reload)."""
        name = session.user if session is not None else None
        if name is None:
            raise errors.Unauthenticated("authentication required: send auth <user> <opaque> first "
                                         "(docs/security.md)")
        user = self.user(name)
        if user is None or not user.allowed_from(session.host):
            raise errors.Unauthenticated("user %s is no longer allowed (the permissions file changed): "
                                         "authenticate again" % name)
        return user

    def is_admin(self, session):
        """True with authentication off, or when the session's user has the admin role."""
        if not self.enabled:
            return True
        name = session.user if session is not None else None
        user = self.user(name) if name is not None else None
        return user is not None and user.admin

    def owner(self, session):
        """The name transactions begun on this session belong to (None with authentication off)."""
        return session.user if self.enabled and session is not None else None

    def visible_to(self, session):
        """A ``(kind, name) -> bool`` of the topics and groups the session's user may subscribe to or consume as
        (what ``stats`` tables show it), or None when it may see everything (authentication off, an admin)."""
        if not self.enabled or self.is_admin(session):
            return None
        return lambda kind, name: self.allows(session, SUB, kind, name)

    def allows(self, session, action, kind, name):
        """``require``'s answer as a bool (listings and filters: nothing refused, just not shown or served)."""
        try:
            self.require(session, action, kind, name)
            return True
        except errors.MetaqError:
            return False

    def known_to(self, session):
        """A ``topic -> bool`` of the topics the session's user may publish to or subscribe to (what a topic list
        shows it), or None when it may know them all (authentication off, an admin)."""
        if not self.enabled or self.is_admin(session):
            return None
        return lambda name: self.allows(session, SUB, "topic", name) or self.allows(session, PUB, "topic", name)

    # -- the text handshake (docs/security.md: auth) ---------------------------

    def challenge(self, session, name, now=None):
        """Step one of ``auth``: a fresh server nonce for ``name`` (given even for an unknown user, so that
        the reply does not tell which names exist)."""
        session.nonce = proofs.new_nonce()
        session.nonce_user = name
        session.nonce_at = time.monotonic() if now is None else now
        return session.nonce

    def answer(self, session, name, client_nonce, proof, now=None):
        """Step two: check the client's proof over the outstanding nonce; returns the server's proof.

        Raises Unauthenticated (the connection is then closed) for no outstanding nonce, an expired one, another
        user's, an unknown user or a wrong proof. The nonce is used up either way."""
        now = time.monotonic() if now is None else now
        nonce, nonce_user, issued = session.nonce, session.nonce_user, session.nonce_at
        session.nonce = session.nonce_user = None
        if nonce is None:
            raise errors.Unauthenticated("authentication failed: no nonce outstanding: send auth <user> <opaque> "
                                         "first, then auth <user> <client nonce> <proof> <opaque>")
        if now - issued > auth_limits.AUTH_NONCE_TTL_S:
            raise errors.Unauthenticated("authentication failed: the nonce expired (valid for %.0f s): ask for a "
                                         "new one" % auth_limits.AUTH_NONCE_TTL_S)
        if nonce_user != name:
            raise errors.Unauthenticated("authentication failed: the nonce was given to user %s, not %s"
                                         % (nonce_user, name))
        user = self.check_login(name, lambda secret: proofs.same(
            proof, proofs.text_proof(secret, "client", name, nonce, client_nonce)))
        if user is None:
            log.warning("authentication failed from %s: %s", session.host, self.login_failure(name, "proof"))
            raise errors.Unauthenticated("authentication failed: unknown user or wrong secret")
        self.authenticated(session, name)
        return proofs.text_proof(user.secret, "server", name, nonce, client_nonce)

    # -- slowing guessers --------------------------------------------------------

    def failed(self, host, now=None):
        """Count one failed authentication from ``host`` and from its network (``failure_prefix``); returns the
        seconds to wait before answering it: a delay once either has failed too often in the window."""
        now = time.monotonic() if now is None else now
        over = self._count_failure(host, auth_limits.AUTH_FAILURES_BEFORE_DELAY, now)
        prefix = failure_prefix(host)
        if prefix is not None and prefix != host:
            over = self._count_failure(prefix, auth_limits.AUTH_PREFIX_FAILURES_BEFORE_DELAY, now) or over
        while len(self._failures) > auth_limits.MAX_AUTH_FAILURE_ADDRESSES:
            self._failures.popitem(last=False)
        return auth_limits.AUTH_FAILURE_DELAY_S if over else 0.0

    def _count_failure(self, key, allowed, now):
        times = self._failures.pop(key, None) or collections.deque(maxlen=allowed + 1)
        while times and now - times[0] > auth_limits.AUTH_FAILURE_WINDOW_S:
            times.popleft()
        times.append(now)
        self._failures[key] = times
        return len(times) > allowed

    @property
    def failing_addresses(self):
        """Addresses whose recent failures are remembered (at most ``limits.MAX_AUTH_FAILURE_ADDRESSES``)."""
        return len(self._failures)

    def status(self):
        """What ``stats`` shows: ``(auth on|off, tls on|off)``."""
        return ("on" if self.enabled else "off"), ("on" if self.tls else "off")
