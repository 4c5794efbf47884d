"""The text protocol's ``transaction`` command and transactional puts over the neutral ``TxService``.

Requests that must wait for the journal (prepare, commit, rollback, a heuristic decision) answer from a
greenlet of their own, not a child of the connection: a commit whose COMMIT record is written completes
even when its client disconnects meanwhile.

Our extensions to MetaQ's types (for ``metaq-admin``): ``HEURISTIC_COMMIT`` and
``HEURISTIC_ROLLBACK`` decide a prepared XA branch by hand; the client's later
commit or rollback then gets XA_HEURCOM / XA_HEURRB until FORGET.

With authentication on (docs/security.md) every branch belongs to the user who began it (``Guard.owner``,
journaled with the branch, so a prepared branch keeps its owner across a restart). Only that user or an
admin may put into it, PREPARE, COMMIT, ROLLBACK or FORGET it: anyone else is answered ``403`` (Forbidden),
not XAER_NOTA, so that a coordinator holding the wrong credentials fails loudly instead of taking another
user's branch for finished. RECOVER lists only the caller's own branches (an admin's: all of them); the
HEURISTIC decisions are the admin's alone. A branch with no owner (begun with authentication off, or
journaled by an older broker) is an admin's to decide.
"""

import gevent

from metaq import errors
from metaq.protocol.text import encode_result
from metaq.transactions.wire import XA_OK, XAER_RMERR, check_qualifier
from metaq.clock import now_ms
from metaq.auth.acl import ADMIN
from metaq.protocol.text import error_reply
from metaq.transactions.state import EVERYONE


class TextTransactions:
    def __init__(self, tx, guard):
        """``guard``: the broker's one authorization check (``server.guard``), for the owner checks."""
        self.tx = tx
        self.manager = tx.manager
        self.guard = guard

    def _check_owner(self, conn, txid):
        """Forbidden unless the connection's user began the branch ``txid`` or is an admin (auth on only).

        An unknown branch passes: the manager answers XAER_NOTA as for anyone."""
        guard = self.guard
        if not guard.enabled or guard.is_admin(conn.session):
            return
        found, user = self.manager.user_of(txid)
        caller = guard.owner(conn.session)
        if found and user != caller:
            raise errors.Forbidden("permission denied: user %s may not act on transaction %s: it belongs to "
                                   "another user (only the user who began it, or an admin, may)" % (caller, txid.key))

    def _recover_scope(self, conn):
        """Whose branches RECOVER lists: everyone's (auth off, or an admin), else the caller's own."""
        guard = self.guard
        if not guard.enabled or guard.is_admin(conn.session):
            return EVERYONE
        return guard.owner(conn.session)

    def put(self, e, conn):
        """A transactional put: journaled now, appended at commit. Reply ``-1 <partition> -1``.

        The dispatcher checked PUB on the topic already; here the branch's owner."""
        self._check_owner(conn, self.tx.txid(e.tx_key))
        partition = self.tx.put(e.tx_key, conn.conn_id, e.topic, e.partition, e.flag, e.body, e.checksum)
        return encode_result(200, b"-1 %d -1" % partition, e.opaque)

    def handle(self, e, conn):
        """One ``transaction`` request: the reply, or None when a spawned greenlet will send it."""
        kind = e.tx_type
        if kind == "END":
            return None
        if kind == "RECOVER":
            if e.unique_qualifier:
                check_qualifier(e.unique_qualifier)
            keys = self.manager.recover(e.unique_qualifier, self._recover_scope(conn))
            return encode_result(200, "\r\n".join(keys).encode(), e.opaque)
        tx = self.tx
        txid = tx.txid(e.tx_key)
        owner = conn.conn_id
        if kind == "BEGIN":
            tx.begin(txid, owner, e.timeout, e.unique_qualifier, self.guard.owner(conn.session))
            return encode_result(200, b"", e.opaque)
        if kind in ("HEURISTIC_COMMIT", "HEURISTIC_ROLLBACK"):
            self.guard.require(conn.session, ADMIN)
            plan = tx.decided_by_hand(txid.key, kind == "HEURISTIC_COMMIT")
            self._reply_later(conn, e.opaque, self._finish_heuristic, plan, e.opaque)
            return None
        self._check_owner(conn, txid)
        if kind == "PREPARE":
            code = tx.prepare(txid, owner)
            if code != XA_OK:
                return encode_result(200, b"%d" % code, e.opaque)
            self._reply_later(conn, e.opaque, self._durable_reply, encode_result(200, b"%d" % code, e.opaque))
            return None
        if kind in ("COMMIT_ONE_PHASE", "COMMIT_TWO_PHASE"):
            plan = self.manager.commit(txid, owner, kind == "COMMIT_ONE_PHASE", now_ms())
            self._reply_later(conn, e.opaque, self._finish_commit, plan, e.opaque)
            return None
        if kind == "ROLLBACK":
            tx.rollback(txid, owner)
            self._reply_later(conn, e.opaque, self._durable_reply, encode_result(200, b"", e.opaque))
            return None
        if kind == "FORGET":
            self.manager.forget(txid, now_ms())
            return encode_result(200, b"", e.opaque)
        raise errors.TransactionError(XAER_RMERR, "unsupported transaction type %s" % kind)

    @staticmethod
    def _reply_later(conn, opaque, func, *args):
        """Run ``func`` in a greenlet of its own and send its reply (dropped if the connection has closed)."""

        def run():
            try:
                reply = func(*args)
            except errors.MetaqError as exc:
                reply = error_reply(exc, opaque)
            conn.send(reply)

        gevent.spawn(run)

    def _durable_reply(self, reply):
        self.tx.flush_journal()
        return reply

    def _finish_commit(self, plan, opaque):
        """After the COMMIT record is durable: append, wait for the store in sync mode, wake consumers, reply."""
        try:
            self.tx.complete_commit(plan)
        except errors.MetaqError as exc:
            return error_reply(exc, opaque)
        return encode_result(200, b"", opaque)

    def _finish_heuristic(self, plan, opaque):
        """An operator's decision: journal durable (off the loop), then a commit's appends, then the reply."""
        if plan is None:
            return self._durable_reply(encode_result(200, b"", opaque))
        return self._finish_commit(plan, opaque)
