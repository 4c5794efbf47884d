"""The protocol-neutral transaction service over ``metaq.transactions.state.TransactionManager``.

Front-ends (the text ``transaction`` command: ``metaq.transactions.text``; RocketMQ half messages:
``metaq.server.remoting.send``, whose check-back is ``metaq.transactions.remoting``) turn their requests
into these calls and format their own replies.
The manager is pure (the journal is ``%TX%`` in the log, and state); this module adds what needs the event
loop: the wait for the log's flush (and, in ``sync`` replication, for a slave's confirmation) before a prepare,
commit or rollback is answered (policy ``transactions.journal_flush``), the commit's appends on the loop right
after the COMMIT record is durable, the store flush wait in ``sync`` mode, wake-ups for long-polling consumers,
the timeout sweep, journal snapshots, the rollback of a closed connection's local transactions, and the role:
a slave's manager follows the master's records, a promoted one takes them over (``role_changed``).

"""

import functools
import itertools
import logging

import gevent

from metaq import errors
from metaq.transactions.wire import XAER_INVAL, XAER_RMERR, parse_tx_key
from metaq.transactions.policy import first_half_number
from metaq.transactions.state import TransactionManager
from metaq.clock import now_ms
from metaq.serving.putpath import BrokerWrites

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
MAINTAIN_INTERVAL_S = 5.0


class TxService:
    def __init__(self, store, config, flusher, waiters, stats, is_master=True, quotas=None):
        """``is_master``: whether this broker starts as the master (a slave's manager follows the log); ``quotas``:
        the guard's quota decision (``auth/quotas.py``), asked before a user holds one more transaction."""
        self.store = store
        self.quotas = quotas
        self.flusher = flusher
        self.waiters = waiters
        self.stats = stats
        self.sync_flush = config.store.flush == "sync"
        cfg = config.transactions
        self.flush_policy = cfg.journal_flush
        self.writes = BrokerWrites(store, waiters, flusher, self.sync_flush)  # commits' messages, the journal
        self.manager = TransactionManager.open(store, config.tx_config(), now_ms(), self.writes,
                                               master=is_master)
        self._tasks = []
        self._half_numbers = None  # the half messages' numbers, shared by every front-end that takes them

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
        self.check_quota(user)
        self.manager.begin(txid, None if txid.is_xa else owner, timeout, now_ms(), user)
        if txid.is_xa:
            self.stats.tx_xa_begin += 1
        else:
            self.stats.tx_begin += 1

    def check_quota(self, user):
        """XAER_RMERR naming the quota when ``user`` holds its ``transactions`` quota already (open and prepared
        transactions, XA branches and half messages together); nothing with authentication off."""
        if self.quotas is None or user is None:
            return
        try:
            self.quotas.check(user, "transactions", self.manager.held_by(user))
        except errors.QuotaExceeded as exc:
            raise errors.TransactionError(XAER_RMERR, str(exc)) from None

    def prepare(self, txid, owner):
        """PREPARE: XA_OK or XA_RDONLY; refused before anything is written where a put would be (a slave, a sync
        master with no slave: 503 saying nothing was stored). The caller makes it durable (``flush_journal``)."""
        if self._check_writable is not None:
            self._check_writable()
        return self.manager.prepare(txid, owner, now_ms())

    def rollback(self, txid, owner):
        """Roll back now; the caller makes it durable with ``flush_journal`` (from a greenlet of its own)."""
        self.manager.rollback(txid, owner, now_ms())
        self.stats.tx_rollback += 1

    def decided_by_hand(self, key, commit):
        """An operator's HEURISTIC decision: the commit plan (None for a rollback)."""
        plan = self.manager.heuristic(key, commit, now_ms())
        log.warning("operator decided transaction %s by hand: %s", key, "commit" if commit else "rollback")
        return plan

    def role_changed(self, slave_id):
        """A master turned slave follows the master's journal records; a slave turned master takes the branches it
        learned over (prepared ones kept, commits completed, unprepared ones rolled back: docs/replication.md
        "Transactions and failover")."""
        manager = self.manager
        if slave_id is not None:
            manager.follow_master()
            return
        if not manager.replica:
            return
        self.store.follow_now(manager.follow)  # every record the old master wrote that this one holds, learned
        report = manager.take_over(now_ms())
        log.info("transactions taken over as master: %d prepared kept, %d commits completed, %d rolled back",
                 report.prepared_kept, report.commits_completed, report.rolled_back)
        self._flush_later()

    def connection_closed(self, conn_id):
        if self.manager.replica:  # the branches are the master's, whose connections these ids are not
            return
        rolled = self.manager.owner_closed(conn_id, now_ms())
        if rolled:
            log.info("rolled back %d local transactions of a closed connection: %s", len(rolled), ", ".join(rolled))
            self.stats.tx_rollback += len(rolled)
            self._flush_later()

    # -- durability ---------------------------------------------------------------

    def flush_journal(self, since=None):
        """Make the journal durable per policy: the log flushed past its last record (this greenlet waits, the loop
        keeps serving), and in ``sync`` replication confirmed by a slave, as a put is (503 when none confirms).
        ``since``: the store's ``log_cuts`` read right after the caller's records were written (``wait_flushed``)."""
        if self.flush_policy != "commit":
            return
        end = self.manager.journal_end
        if self.manager.needs_flush:
            try:
                self.flusher.wait_flushed(end, since=since)
            except errors.Unavailable:
                raise
            except errors.MetaqError as exc:
                raise errors.TransactionError(XAER_RMERR, "the transaction journal could not be flushed: %s"
                                              % exc) from None
        if self._confirm is not None:
            self._confirm(end, since)

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
        if plan.branch is None:  # nothing to append: a read-only branch, or a retry of a commit already made
            if plan.confirm_end:  # made here: answered as the first was, once confirmed
                self._publish_end(plan.confirm_end)
                if self._confirm is not None:
                    self._confirm(plan.confirm_end)
            return
        try:
            if self._check_writable is not None:
                self._check_writable()  # nothing yields from here to the appends
            results = self.manager.apply_commit(plan, now_ms())  # COMMIT lies before them in the log: no wait
            cuts = self.store.log_cuts  # every wait below begins after another's yields: a cut since refuses it
        except errors.MetaqError as exc:
            log.warning("commit of %s not completed: %s", getattr(plan, "key", plan), exc)
            if not isinstance(exc, errors.TransactionError):
                exc = errors.TransactionError(XAER_RMERR, "commit not completed (it will be, on retry or restart): "
                                              "%s" % exc)
            raise exc from None
        self.stats.tx_commit += 1
        # DONE, and so the messages before it, durable per policy (sync replication: confirmed)
        self.flush_journal(cuts)
        self._publish(results, cuts)
        if results and self._confirm is not None and self.flush_policy != "commit":
            self._confirm(max(r.log_end for r in results), cuts)

    # -- for the remoting port's half messages (metaq.server.remoting.send) -------

    def next_half_number(self, now):
        """A new half message's number: one counter for every front-end (remoting, gRPC), started past the pending
        ones and the numbers an earlier run gave (``policy.first_half_number``)."""
        if self._half_numbers is None:
            self._half_numbers = itertools.count(first_half_number((h.number for h in self.manager.halves()), now))
        return next(self._half_numbers)

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

    def _publish(self, results, since=None):
        """Make committed messages visible: wait for the store flush in sync mode (which wakes their readers), else
        wake them by the put path's rule (``BrokerWrites.visible``)."""
        if results:
            self._publish_end(max(r.log_end for r in results), since, {(r.topic, r.partition) for r in results})

    def _publish_end(self, log_end, since=None, keys=None):
        """``keys``: the partitions written (None: not known, a retry of a commit made before: every reader looks
        again)."""
        if self.sync_flush:
            self.flusher.wait_flushed(log_end, since=since)
        else:
            self.writes.visible(keys if keys is not None else self.waiters.keys(), now_ms())

    # -- background ---------------------------------------------------------------

    def _sweep_loop(self):
        while True:
            gevent.sleep(SWEEP_INTERVAL_S)
            if self.manager.replica:  # a slave: the master times its branches out
                continue
            rolled = self.manager.expire(now_ms())
            if rolled:
                log.info("timed out and rolled back: %s", ", ".join(rolled))
                self.stats.tx_rollback += len(rolled)
                self._flush_later()
            if self.flush_policy == "interval" and self.manager.needs_flush:
                self.flusher.wake()

    def _maintain_loop(self):
        while True:
            gevent.sleep(MAINTAIN_INTERVAL_S)
            if not self.manager.wants_maintenance:
                continue
            # a snapshot of the live branches at the log end, in steps: other greenlets served between two
            self.manager.maintain(now_ms(), pause=functools.partial(gevent.sleep, 0))
