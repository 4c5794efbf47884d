"""The transaction check-back: every ``remoting.transaction_check_interval_ms`` the broker asks a producer of
each due half message's group for its state (CHECK_TRANSACTION_STATE, 39, oneway) and rolls back those
checked ``remoting.transaction_check_max`` times already.

What is due and what is given up is decided by ``metaq.transactions.policy.plan_round`` (pure, RocketMQ's rules);
this module runs the rounds on the event loop: each check is journaled (``half_checked``: the count survives
a restart), then sent to the group's next connection (``ProducerRegistry.pick``) with the half message in
stored format as its body. With authentication on only a connection of the user who sent the half message is
asked (the body is that user's message). The producer answers with END_TRANSACTION
(``fromTransactionCheck=true``), handled like any other (``metaq.server.remoting.send.RemotingSender.end_transaction``).
A check finds no connection, or one whose queue of our requests is full (``limits.MAX_PENDING_NOTIFIES``): it
still counts, as in RocketMQ, and the message waits for the next round.
"""

import logging

import gevent

from metaq import errors
from metaq.protocol.rocketmq.bodies import create_offset_msg_id
from metaq.protocol.rocketmq.headers import check_transaction_fields
from metaq.protocol.rocketmq.mapping import half_message, stored_message_bytes
from metaq.protocol.rocketmq.remoting import RequestCode
from metaq.clock import now_ms
from metaq.transactions.policy import GRPC_GROUP_PREFIX, plan_round
from metaq.transactions.state import HALF_ID_BASE, HALF_OWNER, half_txid

log = logging.getLogger(__name__)


class CheckBack:
    """``tx``: the TxService; ``producers``: the ProducerRegistry; ``store_host()``: ``(ip, remoting port)``."""

    def __init__(self, tx, producers, remoting_config, store_host, limit):
        self.tx = tx
        self.producers = producers
        self.store_host = store_host
        self.interval_s = remoting_config.transaction_check_interval_ms / 1000.0
        self.timeout_ms = remoting_config.transaction_timeout_ms
        self.check_max = remoting_config.transaction_check_max
        self.limit = limit
        self.counts = {"checks_sent": 0, "checks_unsent": 0, "checks_failed": 0, "given_up": 0, "rounds": 0}
        self._task = None

    def start(self):
        self._task = gevent.spawn(self._loop)

    def stop(self):
        if self._task is not None:
            self._task.kill(block=False)

    def _loop(self):
        while True:
            gevent.sleep(self.interval_s)
            try:
                self.run_round(now_ms())
            except errors.MetaqError as exc:  # the journal cannot be written: the next round tries again
                log.error("transaction check-back round stopped: %s", exc)
            except Exception:  # noqa: BLE001 - a round's bug must not end every later round
                log.exception("transaction check-back round failed; the next round tries again")

    def run_round(self, now):
        """One round (blocks this greenlet for one journal flush when it rolled something back)."""
        manager = self.tx.manager
        if manager.replica:  # a slave: the master asks its producers
            return
        plan = plan_round([h for h in manager.halves() if not h.group.startswith(GRPC_GROUP_PREFIX)], now,
                          self.timeout_ms, self.check_max, self.limit)  # gRPC's: its Telemetry streams ask
        self.counts["rounds"] += 1
        for number in plan.give_up:
            self.tx.rollback(half_txid(number), HALF_OWNER)
            self.counts["given_up"] += 1
            log.info("half message %d rolled back: no answer after %d check-backs", number, self.check_max)
        for number in plan.check:
            half = manager.half_checked(number, now)
            try:
                self._check(half)
            except Exception as exc:  # noqa: BLE001 - one half message that cannot be asked about stops no other
                self.counts["checks_failed"] += 1
                log.error("half message %d: its check-back could not be sent (%s: %s); it is asked again next round",
                          number, type(exc).__name__, exc)
        if plan.deferred:
            log.info("transaction check-back: %d due half messages left for the next round (the limit is %d a "
                     "round)", plan.deferred, self.limit)
        if plan.give_up:
            self.tx.flush_journal()
        return plan

    def _check(self, half):
        conn = self.producers.pick(half.group, _usable_by(half.user))
        if conn is None or not conn.send_request(RequestCode.CHECK_TRANSACTION_STATE, *self._request(half)):
            self.counts["checks_unsent"] += 1
            log.info("half message %d (check %d): no producer of group %s to ask; it waits for the next round",
                     half.number, half.checks, half.group)
            return
        self.counts["checks_sent"] += 1

    def _request(self, half):
        """``(extFields, body)`` of the CHECK_TRANSACTION_STATE for ``half``."""
        ip, port = self.store_host()
        physical = HALF_ID_BASE + half.number
        msg = half_message(half.topic, half.partition, half.number, physical, half.flag, half.data, half.stored_ms,
                           (ip, port), half.group)
        fields = check_transaction_fields(half.number, physical, half.transaction_id,
                                          create_offset_msg_id(ip, port, physical), half.topic)
        return fields, stored_message_bytes(msg)


def _usable_by(user):
    """With authentication on, only a connection of the half message's sender is asked about it."""
    if user is None:
        return lambda conn: True
    return lambda conn: conn.session is not None and conn.session.user == user
