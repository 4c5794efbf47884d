"""RocketMQ 4's plain ACL on the remoting port (docs/security.md): every request signed, every resource checked
by the broker's one ``Guard`` (``metaq.server.guard``), so a user may do the same on both protocols.

With authentication on (``security.acl_file``), every request must carry, as RocketMQ's ``AclClientRPCHook``
(Java) and ``ClientRPCHook`` (the C++ core of the ``rocketmq`` Python client) put them in ``extFields``:

* ``AccessKey``: the user's name in the permissions file;
* ``Signature``: Base64 of HMAC-SHA1(the user's secret, the values of every extField sorted by key, minus
  ``Signature`` and ``_UNIQUE_KEY_QUERY``, followed by the body) (``proofs.rocketmq_signature``). The C++
  client also sends (and signs) ``OnsChannel``, the Java one may send ``SecurityToken``: both are only signed.

The checks run in RocketMQ's order (``PlainPermissionManager.validate``): no AccessKey, unknown AccessKey or
wrong Signature (one answer for both, unlike RocketMQ's "No acl config for": a reply never tells whether a
user exists, and both take the same work, ``Guard.check_login``), then (ours) the user's address list, then
the resources the request code needs (``needs``). A refusal is what RocketMQ 4.9's broker answers for an
``AclException`` thrown by its RPC hook: ``SYSTEM_ERROR`` (1) with the remark
``org.apache.rocketmq.acl.common.AclException: <reason>`` (the mapping is ``dispatch.error_response``).
After a failed authentication (no, unknown or wrong key, or an address the user
may not come from) the answer is sent and the connection closed, the address's failure counted
(``guard.failed``: a guesser is slowed); a permission refusal leaves the connection open.

Each request names and proves its user, so one connection may carry requests of several users (the C++
client shares one connection between a producer and a consumer of one process): the check of a request
marks the connection's session with that request's user and is made, whole, before the next frame is read.

The name-server requests this port also answers (GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO:
``NAME_SERVER_CODES``) need no signature, as RocketMQ 4's name server checks none: a client with a wrong or
no key then gets the broker's clear AclException on its first send or pull instead of a bare "No route info
of this topic". What a route tells anyone who may connect (the global allow-list still applies): whether the
topic table accepts a topic name, its queue count, and this port's address.

Where we are stricter than RocketMQ 4.9 (the registry of served codes, ``protocol.rocketmq.requests``, lists
each code's needs): batch sends are checked like sends (RocketMQ 5 does too), offset and message look-ups need
SUB on their topic, a send-back needs SUB on the topic of the message it copies, END_TRANSACTION needs PUB on
the half message's topic, codes metaq does not serve need a valid signature before they are answered
REQUEST_CODE_NOT_SUPPORTED, and RocketMQ's bypasses are not taken (a global or per-user white address skipping
the signature; RMQ_SYS_TRACE_TOPIC open to any signed user). A ``%RETRY%<group>`` topic is governed by the
group's permission, as in RocketMQ (whose group permissions are kept as retry topics).
"""

import logging
from types import SimpleNamespace

import gevent

from metaq import errors
from metaq.auth import proofs
from metaq.auth.acl import ADMIN
from metaq.protocol.rocketmq import requests
from metaq.protocol.rocketmq.headers import EndTransactionHeader, decode_header
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.requests import ADMIN_CODES, NeedsContext, resource

log = logging.getLogger(__name__)

__all__ = ["ACL_EXCEPTION", "ADMIN_CODES", "NAME_SERVER_CODES", "RemotingAcl", "needs", "resource"]

#: What RocketMQ's broker puts before the reason of an ACL refusal (``Throwable.toString`` of AclException).
ACL_EXCEPTION = "org.apache.rocketmq.acl.common.AclException: "
ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
#: The name server's requests: answered without a signature (see the module doc; their declarations say so).
NAME_SERVER_CODES = requests.unsigned_codes()
#: Codes whose topic is the one of a stored record the request names by its log offset: a refusal never names it (it
#: would tell a user the topic of any offset it asks about).
RECORD_NAMED_CODES = frozenset({R.VIEW_MESSAGE_BY_ID, R.CONSUMER_SEND_MSG_BACK})
#: Characters of a client-given name shown in a refusal.
_SHOWN = 128


def _show(name):
    return name if len(name) <= _SHOWN else name[:_SHOWN] + "..."


def needs(cmd, record_topic=None, half_topic=None, reply_topic=None):
    """What ``cmd`` needs of its (already authenticated) user, as its declaration says
    (``protocol.rocketmq.requests.needs_of``, where the rules are listed): a list of distinct
    ``(action, kind, name)``; ``(ADMIN, None, None)`` for an admin code, nothing for a code not served. Raises
    ClientError for a request that names more than ``limits.MAX_ACL_RESOURCES_PER_REQUEST`` resources, and the
    decoders' RemoteProtocolError for a malformed one.

    ``record_topic(offset)``: the topic of the stored message at a commit-log offset (VIEW_MESSAGE_BY_ID,
    CONSUMER_SEND_MSG_BACK); ``half_topic(number)``: the topic of a waiting half message, or None;
    ``reply_topic``: the cluster's ``<cluster>_REPLY_TOPIC``, which a reply (SEND_REPLY_MESSAGE 324/325) needs PUB
    on, as the text ``reply`` does."""
    return requests.needs_of(cmd, NeedsContext(record_topic, half_topic, reply_topic))


class RemotingAcl:
    """The per-request check of the remoting port (see the module doc); only made with authentication on.

    ``store``: where a message's topic is read (``record_at``); ``half_topic(number)``: the sender's half
    messages."""

    def __init__(self, guard, store, half_topic, half_user=None, reply_topic=None):
        self.guard = guard
        self.reply_topic = reply_topic
        self.store = store
        self.half_topic = half_topic
        self.half_user = half_user  # half_user(number): who sent a waiting half message
        self.context = NeedsContext(self._record_topic, half_topic, reply_topic)  # what the needs look up
        self.refused = 0  # requests refused (authentication or permission)

    def check(self, cmd, conn):
        """Return the user's name (None for a name-server request) when ``cmd`` may go on; raise
        ``Unauthenticated`` (the caller answers and closes the connection) or ``Forbidden`` (answered, the
        connection goes on), both with RocketMQ's reason, or the header decoders' ClientError."""
        if cmd.code in NAME_SERVER_CODES:
            self._log_in_quietly(cmd, conn)
            return None
        try:
            name = self._authenticate(cmd, conn)
            self._authorize(cmd, conn, name)
        except (errors.Unauthenticated, errors.Forbidden):
            self.refused += 1
            raise
        return name

    def _log_in_quietly(self, cmd, conn):
        """A name-server request needs no signature, but one that carries a good one logs its connection in (a
        client's route queries keep their connection past the login deadline); a bad one is not counted."""
        ext = cmd.ext_fields
        name, signature = ext.get(ACCESS_KEY), ext.get(SIGNATURE)
        if not name or not signature or not self.guard.enabled or conn.session is None or conn.session.logged_in:
            return
        if self.guard.check_login(name, lambda secret: proofs.same(
                signature, proofs.rocketmq_signature(secret, ext, cmd.body))) is not None:
            try:
                self.guard.authenticated(conn.session, name)
            except (errors.Unauthenticated, errors.QuotaExceeded):
                pass  # an address the user may not come from, or its connections quota: its next signed request
                # is refused, naming why

    def _authenticate(self, cmd, conn):
        guard, session = self.guard, conn.session
        ext = cmd.ext_fields
        name = ext.get(ACCESS_KEY)
        if not name:  # the C++ client without credentials sends an empty one
            log.info("remoting %s: request code %d without an AccessKey refused", conn.peer, cmd.code)
            raise errors.Unauthenticated("No accessKey is configured (request code %d: sign requests with an "
                                         "AccessKey and a Signature; docs/security.md)" % cmd.code)
        signature = ext.get(SIGNATURE) or ""
        if guard.check_login(name, lambda secret: proofs.same(
                signature, proofs.rocketmq_signature(secret, ext, cmd.body))) is None:
            self._failed(conn, guard.login_failure(_show(name), "signature"))
            raise errors.Unauthenticated("Check signature failed for accessKey=%s" % _show(name))
        try:
            guard.authenticated(session, name)
        except errors.Unauthenticated as exc:
            self._failed(conn, str(exc))
            raise
        return name

    def _failed(self, conn, why):
        host = conn.session.host
        log.warning("remoting %s: authentication failed: %s", conn.peer, why)
        delay = self.guard.failed(host)
        if delay:
            gevent.sleep(delay)

    def copies_readable(self, conn, topic, signer):
        """``requests.copies_readable`` for a pull signed by ``signer`` (a connection may carry the requests of
        several users)."""
        return requests.copies_readable(self.guard, SimpleNamespace(user=signer, host=conn.session.host), topic)

    def _record_topic(self, offset):
        return self.store.record_at(offset).topic

    def _authorize(self, cmd, conn, name):
        guard, session = self.guard, conn.session
        for action, kind, what in requests.needs_of(cmd, self.context):
            if action == ADMIN:
                if not guard.is_admin(session):
                    raise errors.Forbidden("Need admin permission for request code=%d, but accessKey=%s is not"
                                           % (cmd.code, name) if cmd.code not in RECORD_NAMED_CODES else
                                           "No permission to read the message at that offset")
                continue
            try:
                guard.require(session, action, kind, what)
            except errors.Forbidden as exc:
                if cmd.code in RECORD_NAMED_CODES and kind == "topic":  # the topic is the stored record's
                    raise errors.Forbidden("No permission to read the message at that offset") from None
                raise errors.Forbidden("No default permission for %s:%s (%s)" % (kind, _show(what), exc)) from None
        if cmd.code == R.END_TRANSACTION and self.half_user is not None:  # and only its sender (or an admin)
            number = decode_header(EndTransactionHeader, cmd).tran_state_table_offset
            sender = self.half_user(number)
            if sender is not None and sender != name and not guard.is_admin(session):
                raise errors.Forbidden("No permission to end half message %d: another accessKey sent it" % number)
