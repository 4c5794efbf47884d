"""XA on metaq: ``XAResource``, an XA resource manager with the DB-API two-phase-commit interface.

    with XAResource(brokers=["meta://127.0.0.1:8123"]) as rm:
        xid = rm.xid(1, "order-42", "metaq")
        rm.tpc_begin(xid)
        rm.send(Message("orders", b"a"))
        rm.tpc_prepare()             # phase one (after the database's tpc_prepare)
        rm.tpc_commit()              # phase two
        rm.tpc_recover()             # [Xid, ...] prepared and not decided yet: commit or roll back each

Errors, ids and the branch machinery are shared with local transactions
(:mod:`metaq.client.transactions`).
"""

import logging

from metaq.errors import RequestTimeout, TransactionError
from metaq.transactions import wire
from metaq.client.producer import Producer
from metaq.client.transactions import (ROLLED_BACK, TX_REQUEST_TIMEOUT, UNSAFE_IN_IDS, Branch, Xid, XaError,
                                       as_xa_error, default_unique_qualifier, new_session_id, rollback_code,
                                       timeout_seconds)

__all__ = ["XAResource", "Xid", "XaError"]

log = logging.getLogger(__name__)


class XAResource:
    """An XA resource manager on metaq brokers, with the DB-API two-phase-commit interface (PEP 249, as in psycopg).

    Give ``brokers`` (``["meta://host:port", ...]``) or ``zk_connect``.
    ``unique_qualifier`` names this resource in every branch id (default
    ``XAMessageProducer-<hostname>``): ``tpc_recover`` lists only branches with
    it, so a coordinator restarted with the same qualifier finds its in-doubt
    branches. ``timeout`` (seconds) is sent with BEGIN: a branch not prepared
    by then is rolled back by the broker (0: the broker's default).

    Each branch lives on one broker: the one with the lowest broker id among
    those that answer (ZooKeeper: registered). Which broker carries every topic
    a branch will use cannot be known at ``tpc_begin``, so the choice is simply
    deterministic; a topic that broker does not have is created there by the
    first put (or the put fails). One thread at a time, like a DB connection.
    """

    def __init__(self, brokers=None, zk_connect=None, *, unique_qualifier=None, timeout=60, zk_root="/meta",
                 selector=None, request_timeout=TX_REQUEST_TIMEOUT, connect_timeout=3.0, zk_session_timeout=10.0,
                 security=None):
        qualifier = default_unique_qualifier() if unique_qualifier is None else unique_qualifier
        if not isinstance(qualifier, str) or not qualifier or UNSAFE_IN_IDS.search(qualifier):
            raise ValueError("unique_qualifier %r must be a non-empty str without whitespace or ':'" % (qualifier,))
        self.unique_qualifier = qualifier
        self.timeout = timeout_seconds(timeout)
        self.request_timeout = request_timeout
        self.session_id = new_session_id()
        self._producer = Producer(zk_connect=zk_connect, brokers=brokers, zk_root=zk_root, selector=selector,
                                  send_timeout=request_timeout, connect_timeout=connect_timeout,
                                  zk_session_timeout=zk_session_timeout, security=security)
        self._where = {}  # branch key -> url where tpc_recover found it
        self._xid = None
        self._branch = None
        self._state = None  # "active", "prepared", "rdonly" or "failed" (only a rollback is left)

    # -- ids and brokers ------------------------------------------------------------------

    def xid(self, format_id, gtrid, bqual):
        """An ``Xid`` to pass to ``tpc_begin`` (gtrid and bqual: str or bytes, at most 64 bytes)."""
        return Xid(format_id, gtrid, bqual)

    @property
    def current_xid(self):
        """The branch begun by ``tpc_begin`` and not committed or rolled back yet, or None."""
        return self._xid

    @property
    def broker_id(self):
        """The broker of the current branch, or None."""
        return self._branch.broker_id if self._branch is not None else None

    def _resource_broker(self):
        """``(broker_id, url)`` branches begin on: the lowest broker id that answers (ZooKeeper: registered)."""
        found, errors = self._producer.discovery.resource_brokers()
        if not found:
            raise XaError(wire.XAER_RMFAIL, "no broker is available: %s" % ("; ".join(errors) or "none registered"))
        return min(found)

    def _branch_on(self, xid, url):
        return Branch(self._producer.connection(url), None, xid.key(self.unique_qualifier), self.session_id,
                       self.request_timeout)

    # -- the current branch ---------------------------------------------------------------

    def _need(self, action, *states):
        if self._state not in states:
            now = "no branch" if self._xid is None else "branch %s is %s" % (self._xid, self._state)
            raise XaError(wire.XAER_PROTO, "%s: not allowed now (%s)" % (action, now))

    def _clear(self):
        self._xid = self._branch = self._state = None

    def tpc_begin(self, xid):
        """Begin branch ``xid`` (an ``Xid`` or a ``(format_id, gtrid, bqual)`` tuple) with BEGIN on one broker."""
        xid = xid if isinstance(xid, Xid) else Xid(*xid)
        self._need("tpc_begin", None)
        bid, url = self._resource_broker()
        branch = self._branch_on(xid, url)
        branch.broker_id = bid
        branch.begin(self.timeout, self.unique_qualifier)
        self._xid, self._branch, self._state = xid, branch, "active"

    def send(self, message):
        """Send ``message`` inside the current branch (a transactional put to a partition of the branch's broker).

        Returns ``SendResult(True, partition, -1, -1)``; raises XaError when the
        put failed, and the branch can then only roll back (``tpc_prepare`` and
        ``tpc_commit`` roll it back and raise XA_RBROLLBACK).
        """
        self._need("send", "active")
        producer, branch = self._producer, self._branch
        put = producer.make_put(message)
        partition = producer.choose_partition_on(branch.broker_id, message)
        future = producer.new_future()
        branch.put(put, partition, self.request_timeout, future, message)
        result = future.result(self.request_timeout + 10.0)
        if not result.success:
            raise as_xa_error(result.error, "put in %s" % branch.tx_key, wire.XA_RBTIMEOUT)
        return result

    def _abort(self, why):
        """Roll the current branch back (best effort, once); it stays current ("failed") until
        ``tpc_rollback`` or ``tpc_commit``. The XaError to raise."""
        branch = self._branch
        if not branch.aborted:
            branch.aborted = True
            branch.quiet("ROLLBACK")
        self._state = "failed"
        return XaError(rollback_code(branch.failure), "branch %s rolled back: %s" % (branch.tx_key, why))

    def tpc_prepare(self):
        """Phase one: END (fire and forget) then PREPARE; returns the vote, XA_OK (0) or XA_RDONLY (3): a branch
        without messages is read-only, finished at once, and a later ``tpc_commit()`` does nothing.
        On failure the branch can only roll back (``tpc_rollback()``)."""
        self._need("tpc_prepare", "active")
        branch = self._branch
        if branch.failure is not None:
            raise self._abort("a send failed: %s" % branch.failure)
        branch.end()
        try:
            body = branch.command("PREPARE", unknown=wire.XA_RBTIMEOUT)
        except XaError as exc:
            if exc.xa_code == wire.XA_RBTIMEOUT and isinstance(exc.__cause__, RequestTimeout):
                self._abort("no answer to PREPARE")  # make the answer true: it may have been prepared after all
            self._state = "failed"
            raise
        vote = body.strip()
        if vote not in (b"%d" % wire.XA_OK, b"%d" % wire.XA_RDONLY):
            branch.failure = XaError(wire.XAER_RMERR, "PREPARE %s: unexpected answer %r" % (branch.tx_key, body[:100]))
            self._abort("unexpected answer to PREPARE")
            raise branch.failure
        self._state = "rdonly" if vote == b"%d" % wire.XA_RDONLY else "prepared"
        return int(vote)

    def tpc_commit(self, xid=None):
        """Commit. Without ``xid``: the current branch, one-phase if it was not prepared, two-phase if it was
        (nothing for a read-only one). With ``xid`` (recovery, no branch in progress): two-phase commit of that
        prepared branch, on the broker ``tpc_recover`` found it on. XAER_RMFAIL: the outcome is unknown."""
        if xid is not None:
            self._resolve(xid, "COMMIT_TWO_PHASE", "tpc_commit(xid)")
            return
        self._need("tpc_commit", "active", "prepared", "rdonly", "failed")
        state, branch = self._state, self._branch
        if state == "rdonly":
            self._clear()
            return
        if state == "failed" or branch.failure is not None:
            error = self._abort("it failed before the commit: %s" % (branch.failure or "prepare failed"))
            self._clear()
            raise error
        if state == "active":
            branch.end()
        self._clear()
        branch.command("COMMIT_ONE_PHASE" if state == "active" else "COMMIT_TWO_PHASE")

    def tpc_rollback(self, xid=None):
        """Roll back the current branch, or (recovery, no branch in progress) the branch ``xid``."""
        if xid is not None:
            self._resolve(xid, "ROLLBACK", "tpc_rollback(xid)")
            return
        self._need("tpc_rollback", "active", "prepared", "rdonly", "failed")
        state, branch = self._state, self._branch
        self._clear()
        if state == "rdonly":
            return
        if state == "active":
            branch.end()
        try:
            branch.command("ROLLBACK")
        except XaError as exc:
            if exc.xa_code in ROLLED_BACK or (state != "prepared" and exc.xa_code == wire.XAER_NOTA):
                log.info("%s (counts as rolled back)", exc)
                return
            raise

    def tpc_forget(self, xid):
        """FORGET a heuristically completed branch (after a commit or rollback raised XA_HEUR*)."""
        self._resolve(xid, "FORGET", "tpc_forget")

    def _resolve(self, xid, tx_type, action):
        """Recovery: ``tx_type`` for branch ``xid`` on the broker that holds it."""
        xid = xid if isinstance(xid, Xid) else Xid(*xid)
        self._need(action, None)
        key = xid.key(self.unique_qualifier)
        url = self._where.get(key)
        if url is None:
            try:
                self.tpc_recover()
            except XaError as exc:
                log.info("locating %s: %s", key, exc)
            url = self._where.get(key)
        self._branch_on(xid, url or self._resource_broker()[1]).command(tx_type)
        self._where.pop(key, None)

    def tpc_recover(self):
        """``[Xid]`` of the prepared (and heuristically completed) branches of this ``unique_qualifier``,
        from every broker (RECOVER). XaError XAER_RMFAIL when a broker did not answer: the list would be partial."""
        found, errors, seen = [], [], set()
        for url in self._producer.discovery.every_url():
            branch = Branch(self._producer.connection(url), None, "null", self.session_id, self.request_timeout)
            try:
                body = branch.command("RECOVER", qualifier=self.unique_qualifier)
            except XaError as exc:
                errors.append("%s: %s" % (url, exc))
                continue
            for key in body.decode("utf-8", "replace").split():
                try:
                    parsed = wire.parse_tx_key(key)
                except TransactionError:
                    log.warning("RECOVER from %s: ignoring %r", url, key[:200])
                    continue
                if isinstance(parsed, wire.XaTxId) and parsed.unique_qualifier == self.unique_qualifier:
                    self._where[key] = url
                    if key not in seen:
                        seen.add(key)
                        found.append(Xid(parsed.format_id, parsed.gtrid, parsed.bqual))
        if errors:
            raise XaError(wire.XAER_RMFAIL, "recover: %s" % "; ".join(errors))
        return found

    def close(self):
        """Close the connections. A branch in progress stays on its broker (prepared ones come back in
        ``tpc_recover``; unprepared ones roll back when their timeout expires)."""
        if self._xid is not None and self._state != "rdonly":
            log.warning("XAResource closed with branch %s %s", self._xid, self._state)
        self._clear()
        self._producer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<XAResource %s, branch %s %s>" % (self.unique_qualifier, self._xid, self._state)
