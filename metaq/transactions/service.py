"""The protocol-neutral transaction service over ``metaq.transactions.state.TransactionManager``.

Front-ends (the text ``transaction`` command: ``metaq.transactions.text``; RocketMQ half messages:
``metaq.server.remoting.send``, whose check-back is ``metaq.transactions.remoting``) turn their requests
into these calls and format their own replies.
The manager is pure (files and state); this module adds what needs the event
loop: journal fsyncs in gevent's thread pool before a prepare, commit or
rollback is answered (policy ``transactions.journal_flush``), the commit's
appends on the loop right after the COMMIT record is durable, the store flush
wait in ``sync`` mode, wake-ups for long-polling consumers, the timeout sweep,
journal maintenance and the rollback of a closed connection's local
transactions.

"""

import logging

import gevent

from metaq import errors
from metaq.transactions.wire import XAER_INVAL, XAER_RMERR, parse_tx_key
from metaq.transactions.state import TransactionManager
from metaq.server.clock import now_ms

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
MAINTAIN_INTERVAL_S = 5.0


class TxService:
    def __init__(self, store, config, flusher, waiters, stats):
        self.store = store
        self.flusher = flusher
        self.waiters = waiters
        self.stats = stats
        self.sync_flush = config.store.flush == "sync"
        cfg = config.transactions
        self.flush_policy = cfg.journal_flush
        self.manager = TransactionManager.open(store, config.tx_config(), now_ms())
        self._tasks = []
        self._pool = gevent.get_hub().threadpool

    def start(self):
        self._tasks = [gevent.spawn(self._sweep_loop), gevent.spawn(self._maintain_loop)]

    def stop(self):
        gevent.killall(self._tasks, block=True, timeout=2.0)
        try:
            self.manager.close(now_ms())
        except OSError as exc:
            log.error("closing the transaction journal: %s", exc)

    # -- what a front-end asks ---------------------------------------------------------

    def txid(self, key):
        """The transaction id of a request's key; TransactionError for a missing (``null``) one."""
        txid = parse_tx_key(key)
        if txid is None:
            raise errors.TransactionError(XAER_INVAL, "this request needs a transaction id, not null")
        return txid

    def put(self, tx_key, owner, topic, partition, flag, body, checksum):
        """A transactional put, after its front-end's ``PutPath.check_write``: journaled now, appended at commit;
        returns the partition chosen."""
        partition = self.manager.put(self.txid(tx_key), owner, topic, partition, flag, body, checksum, now_ms())
        self.stats.on_put(topic, len(body))
        return partition

    def begin(self, txid, owner, timeout, unique_qualifier=None, user=None):
        """``owner``: the connection (binds a local branch); ``user``: who begins it (``Guard.owner``; None with
        authentication off), the only one but an admin who may act on it later (``metaq.transactions.text``)."""
        if txid.is_xa and unique_qualifier and unique_qualifier != txid.unique_qualifier:
            raise errors.TransactionError(XAER_INVAL, "uniqueQualifier %s does not match the branch %s"
                                          % (unique_qualifier, txid.key))
        self.manager.begin(txid, None if txid.is_xa else owner, timeout, now_ms(), user)
        if txid.is_xa:
            self.stats.tx_xa_begin += 1
        else:
            self.stats.tx_begin += 1

    def rollback(self, txid, owner):
        """Roll back now; the caller makes it durable with ``flush_journal`` (from a greenlet of its own)."""
        self.manager.rollback(txid, owner, now_ms())
        self.stats.tx_rollback += 1

    def decided_by_hand(self, key, commit):
        """An operator's HEURISTIC decision: the commit plan (None for a rollback)."""
        plan = self.manager.heuristic(key, commit, now_ms())
        log.warning("operator decided transaction %s by hand: %s", key, "commit" if commit else "rollback")
        return plan

    def connection_closed(self, conn_id):
        rolled = self.manager.owner_closed(conn_id, now_ms())
        if rolled:
            log.info("rolled back %d local transactions of a closed connection: %s", len(rolled), ", ".join(rolled))
            self.stats.tx_rollback += len(rolled)
            self._flush_later()

    # -- durability ---------------------------------------------------------------

    def flush_journal(self):
        """Make the journal durable per policy (fsync in a pool thread; the loop keeps serving)."""
        if self.flush_policy == "commit" and self.manager.needs_flush:
            try:
                self._pool.apply(self.manager.flush_journal)
            except OSError as exc:
                raise errors.TransactionError(XAER_RMERR, "the transaction journal could not be flushed: %s"
                                              % exc) from None

    def _flush_later(self):
        if self.flush_policy == "commit":
            gevent.spawn(self._flush_quietly)

    def _flush_quietly(self):
        try:
            self.flush_journal()
        except errors.MetaqError as exc:
            log.error("%s", exc)

    def attach_writes(self, check_writable, confirm):
        """The put path's ``check_writable()`` (a slave, a deposed master, a full disk: raises) and
        ``confirm(log_end)`` (sync replication, the lease), which commits go through like puts."""
        self._check_writable, self._confirm = check_writable, confirm

    _check_writable = _confirm = None

    def complete_commit(self, plan):
        """Journal durable, appends, published, confirmed (blocks this greenlet); raises TransactionError, or
        Unavailable when written but not confirmed (sync replication, ha: auto's lease)."""
        if plan.confirm_end:  # a retried commit already done: the answer is the first one's, once confirmed
            self._publish_end(plan.confirm_end)
            if self._confirm is not None:
                self._confirm(plan.confirm_end)
            return
        try:
            self.flush_journal()
            if self._check_writable is not None:
                self._check_writable()  # nothing yields from here to the appends
            results = self.manager.apply_commit(plan, now_ms())
        except errors.MetaqError as exc:
            log.warning("commit of %s not completed: %s", getattr(plan, "key", plan), exc)
            if not isinstance(exc, errors.TransactionError):
                exc = errors.TransactionError(XAER_RMERR, "commit not completed (it will be, on retry or restart): "
                                              "%s" % exc)
            raise exc from None
        self.stats.tx_commit += 1
        self._publish(results)
        if results and self._confirm is not None:
            self._confirm(max(r.log_end for r in results))

    # -- for the remoting port's half messages (metaq.server.remoting.send) -------

    def commit_now(self, txid, owner, one_phase=True):
        """Commit a local transaction (one phase) or a half message (``one_phase=False``: it is prepared) from
        the caller's greenlet (blocks until published)."""
        self.complete_commit(self.manager.commit(txid, owner, one_phase, now_ms()))

    def rollback_now(self, txid, owner):
        """Roll back a local transaction from the caller's greenlet (blocks until the journal is durable)."""
        self.rollback(txid, owner)
        self.flush_journal()

    def rollback_quietly(self, txid, owner):
        """Roll back now if it is still there (its journal made durable later); never raises."""
        try:
            self.rollback(txid, owner)
        except errors.TransactionError as exc:
            log.warning("rolling back %s: %s", txid.key, exc)
            return
        self._flush_later()

    def _publish(self, results):
        """Make committed messages visible: wait for the store flush in sync mode, then wake long polls."""
        if results:
            self._publish_end(max(r.log_end for r in results))

    def _publish_end(self, log_end):
        if self.sync_flush:
            self.flusher.wait_flushed(log_end)
        else:
            self.waiters.notify_all()  # commits are rare: waking every long poll to re-check is cheap
            if self.store.should_flush(now_ms()):
                self.flusher.wake()

    # -- background ---------------------------------------------------------------

    def _sweep_loop(self):
        while True:
            gevent.sleep(SWEEP_INTERVAL_S)
            rolled = self.manager.expire(now_ms())
            if rolled:
                log.info("timed out and rolled back: %s", ", ".join(rolled))
                self.stats.tx_rollback += len(rolled)
                self._flush_later()
            if self.flush_policy == "interval" and self.manager.needs_flush:
                self._pool.apply(self.manager.flush_journal)

    def _maintain_loop(self):
        while True:
            gevent.sleep(MAINTAIN_INTERVAL_S)
            if not self.manager.wants_maintenance:
                continue
            try:
                self._pool.apply(self.manager.maintain, (now_ms(),))
            except (OSError, errors.MetaqError) as exc:
                log.warning("transaction journal maintenance failed: %s", exc)
