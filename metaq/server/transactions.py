"""The ``transaction`` command and transactional puts, served over ``metaq.tx.TransactionManager``.

The manager is pure (files and state); this module adds what needs the event
loop: journal fsyncs in gevent's thread pool before a prepare, commit or
rollback is answered (policy ``transactions.journal_flush``), the commit's
appends on the loop right after the COMMIT record is durable, the store flush
wait in ``sync`` mode, wake-ups for long-polling consumers, the timeout sweep,
journal maintenance and the rollback of a closed connection's local
transactions.

Our extensions to MetaQ's types (for ``metaq-admin``): ``HEURISTIC_COMMIT`` and
``HEURISTIC_ROLLBACK`` decide a prepared XA branch by hand; the client's later
commit or rollback then gets XA_HEURCOM / XA_HEURRB until FORGET.
"""

import logging
import time

import gevent

from metaq import errors
from metaq.protocol.text import encode_result
from metaq.server.text.dispatch import error_reply
from metaq.protocol.xa import XA_OK, XAER_INVAL, XAER_RMERR, check_qualifier, parse_tx_key
from metaq.tx.manager import TransactionManager

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
MAINTAIN_INTERVAL_S = 5.0


def now_ms():
    return int(time.time() * 1000)


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

    # -- requests ---------------------------------------------------------------

    def put(self, e, conn):
        """A transactional put: journaled now, appended at commit. Reply ``-1 <partition> -1``."""
        txid = self._txid(e.tx_key)
        partition = self.manager.put(txid, conn.conn_id, e.topic, e.partition, e.flag, e.body, e.checksum, now_ms())
        self.stats.on_put(e.topic, len(e.body))
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
        txid = self._txid(e.tx_key)
        owner = conn.conn_id
        now = now_ms()
        if kind == "BEGIN":
            if txid.is_xa and e.unique_qualifier and e.unique_qualifier != txid.unique_qualifier:
                raise errors.TransactionError(XAER_INVAL, "uniqueQualifier %s does not match the branch %s"
                                              % (e.unique_qualifier, txid.key))
            self.manager.begin(txid, None if txid.is_xa else owner, e.timeout, now)
            self._count_begin(txid)
            return encode_result(200, b"", e.opaque)
        if kind == "PREPARE":
            code = self.manager.prepare(txid, owner, now)
            if code != XA_OK:
                return encode_result(200, b"%d" % code, e.opaque)
            self._reply_later(conn, e.opaque, self._durable_reply, encode_result(200, b"%d" % code, e.opaque))
            return None
        if kind in ("COMMIT_ONE_PHASE", "COMMIT_TWO_PHASE"):
            plan = self.manager.commit(txid, owner, kind == "COMMIT_ONE_PHASE", now)
            self._reply_later(conn, e.opaque, self._finish_commit, plan, e.opaque)
            return None
        if kind == "ROLLBACK":
            self.manager.rollback(txid, owner, now)
            self.stats.tx_rollback += 1
            self._reply_later(conn, e.opaque, self._durable_reply, encode_result(200, b"", e.opaque))
            return None
        if kind == "FORGET":
            self.manager.forget(txid, now)
            return encode_result(200, b"", e.opaque)
        if kind in ("HEURISTIC_COMMIT", "HEURISTIC_ROLLBACK"):
            plan = self.manager.heuristic(txid.key, kind == "HEURISTIC_COMMIT", now)
            self._reply_later(conn, e.opaque, self._finish_heuristic, txid.key, plan, e.opaque)
            return None
        raise errors.TransactionError(XAER_RMERR, "unsupported transaction type %s" % kind)

    def connection_closed(self, conn_id):
        rolled = self.manager.owner_closed(conn_id, now_ms())
        if rolled:
            log.info("rolled back %d local transactions of a closed connection: %s", len(rolled), ", ".join(rolled))
            self.stats.tx_rollback += len(rolled)
            self._flush_later()

    # -- durability ---------------------------------------------------------------

    def _reply_later(self, conn, opaque, func, *args):
        """Run ``func`` in a greenlet of its own and send its reply if the connection is still open.

        Not a child of the connection: a commit whose COMMIT record is written completes even
        when its client disconnects meanwhile.
        """

        def run():
            try:
                reply = func(*args)
            except errors.MetaqError as exc:
                reply = error_reply(exc, opaque)
            conn.send(reply)

        gevent.spawn(run)

    def _txid(self, key):
        txid = parse_tx_key(key)
        if txid is None:
            raise errors.TransactionError(XAER_INVAL, "this request needs a transaction id, not null")
        return txid

    def _count_begin(self, txid):
        if txid.is_xa:
            self.stats.tx_xa_begin += 1
        else:
            self.stats.tx_begin += 1

    def _flush_journal(self):
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
            self._flush_journal()
        except errors.MetaqError as exc:
            log.error("%s", exc)

    def _durable_reply(self, reply):
        self._flush_journal()
        return reply

    def _finish_commit(self, plan, opaque):
        """After the COMMIT record is durable: append, wait for the store in sync mode, wake consumers, reply."""
        try:
            self._complete_commit(plan)
        except errors.MetaqError as exc:
            return error_reply(exc, opaque)
        return encode_result(200, b"", opaque)

    def _complete_commit(self, plan):
        """Journal durable, appends, published (blocks this greenlet); raises TransactionError."""
        try:
            self._flush_journal()
            results = self.manager.apply_commit(plan, now_ms())
        except errors.MetaqError as exc:
            log.warning("commit of %s not completed: %s", getattr(plan, "key", plan), exc)
            if not isinstance(exc, errors.TransactionError):
                exc = errors.TransactionError(XAER_RMERR, "commit not completed (it will be, on retry or restart): "
                                              "%s" % exc)
            raise exc from None
        self.stats.tx_commit += 1
        self._publish(results)

    # -- for the remoting port's half messages (metaq.server.remoting.send) -------

    def commit_now(self, txid, owner):
        """One-phase commit of a local transaction from the caller's greenlet (blocks until published)."""
        self._complete_commit(self.manager.commit(txid, owner, True, now_ms()))

    def rollback_now(self, txid, owner):
        """Roll back a local transaction from the caller's greenlet (blocks until the journal is durable)."""
        self.manager.rollback(txid, owner, now_ms())
        self.stats.tx_rollback += 1
        self._flush_journal()

    def _finish_heuristic(self, key, plan, opaque):
        """An operator's decision: journal durable (off the loop), then a commit's appends, then the reply."""
        log.warning("operator decided transaction %s by hand: %s", key, "rollback" if plan is None else "commit")
        if plan is None:
            return self._durable_reply(encode_result(200, b"", opaque))
        return self._finish_commit(plan, opaque)

    def _publish(self, results):
        """Make committed messages visible: wait for the store flush in sync mode, then wake long polls."""
        if not results:
            return
        if self.sync_flush:
            self.flusher.wait_flushed(max(r.log_end for r in results))
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
