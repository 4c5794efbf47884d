"""The text protocol's ``transaction`` command and transactional puts over the neutral ``TxService``.

Requests that must wait for the journal (prepare, commit, rollback, a heuristic decision) answer from a
greenlet of their own, not a child of the connection: a commit whose COMMIT record is written completes
even when its client disconnects meanwhile.

Our extensions to MetaQ's types (for ``metaq-admin``): ``HEURISTIC_COMMIT`` and
``HEURISTIC_ROLLBACK`` decide a prepared XA branch by hand; the client's later
commit or rollback then gets XA_HEURCOM / XA_HEURRB until FORGET.
"""

import gevent

from metaq import errors
from metaq.protocol.text import encode_result
from metaq.protocol.xa import XA_OK, XAER_RMERR, check_qualifier
from metaq.server.flusher import now_ms
from metaq.server.text.dispatch import error_reply


class TextTransactions:
    def __init__(self, tx):
        self.tx = tx
        self.manager = tx.manager

    def put(self, e, conn):
        """A transactional put: journaled now, appended at commit. Reply ``-1 <partition> -1``."""
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
            keys = self.manager.recover(e.unique_qualifier)
            return encode_result(200, "\r\n".join(keys).encode(), e.opaque)
        tx = self.tx
        txid = tx.txid(e.tx_key)
        owner = conn.conn_id
        if kind == "BEGIN":
            tx.begin(txid, owner, e.timeout, e.unique_qualifier)
            return encode_result(200, b"", e.opaque)
        if kind == "PREPARE":
            code = self.manager.prepare(txid, owner, now_ms())
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
        if kind in ("HEURISTIC_COMMIT", "HEURISTIC_ROLLBACK"):
            plan = tx.decided_by_hand(txid.key, kind == "HEURISTIC_COMMIT")
            self._reply_later(conn, e.opaque, self._finish_heuristic, plan, e.opaque)
            return None
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
