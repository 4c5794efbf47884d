"""RocketMQ half messages in the transaction manager (a mixin of ``TransactionManager``; no clock, no I/O but
the journal).

A half message is a local branch of one message that, unlike a text ``transaction``, belongs to no
connection: its send journals PUT then HALF (``records.Half``), which makes it PREPARED at once, so it is
kept across restarts (recovery keeps prepared branches), never times out and is not rolled back when its
connection closes. It ends by ``commit(key, HALF_OWNER, False, …)`` or ``rollback(key, HALF_OWNER, …)``:
its producer's END_TRANSACTION, from any connection, or the check-back giving up
(``metaq.tx.checkback`` decides, ``metaq.server.remoting.checkback`` asks). Each check-back sent is
journaled with ``half_checked`` (the count survives a restart, as RocketMQ keeps it in the message).

Text front-ends name their owner by connection id (an int), so no text command can end a half message:
``HALF_OWNER`` is a string.
"""

from typing import NamedTuple, Optional

from metaq.protocol.xa import XAER_NOTA, XAER_RMERR, LocalTxId
from metaq.errors import TransactionError
from metaq.tx import records as R

#: The owner of every half branch (no connection id equals it).
HALF_OWNER = "rocketmq-half"
#: The session of half messages' keys: ``TX:rmq:<number>``.
HALF_SESSION = "rmq"


def half_txid(number):
    """The transaction id of half message ``number``."""
    return LocalTxId(HALF_SESSION, number)


def half_number(key):
    """The number of a half message's key, None for any other key."""
    prefix = "TX:%s:" % HALF_SESSION
    if key.startswith(prefix) and key[len(prefix):].isdigit():
        return int(key[len(prefix):])
    return None


class HalfMessage(NamedTuple):
    """A pending half message as the front-end and the check-back see it."""

    key: str
    number: int
    topic: str
    partition: int
    flag: int
    data: bytes
    stored_ms: int
    checks: int
    immunity_ms: int  # -1: the broker's transaction timeout
    group: str
    transaction_id: str
    user: Optional[str]


def _view(b):
    put, half = b.puts[0], b.half
    return HalfMessage(b.key, half_number(b.key), put.topic, put.partition, put.flag, put.data, half.stored_ms,
                       half.checks, half.immunity_ms, half.group, half.transaction_id, b.user)


class HalfMessages:
    """The half-message operations of ``TransactionManager`` (which sets ``self._halves``, key -> Branch)."""

    def put_half(self, number, topic, partition, flag, data, group, transaction_id, immunity_ms, limit, now_ms,
                 user=None):
        """Journal half message ``number`` (PUT, HALF); returns its partition (chosen now when -1).

        XAER_RMERR when ``limit`` half messages are pending already; the errors of ``begin`` and ``put``
        otherwise. The caller makes the journal durable (``flush_journal``) before acknowledging the send."""
        if len(self._halves) >= limit:
            raise TransactionError(XAER_RMERR, "too many half messages waiting for their end: the limit is %d "
                                   "(remoting.max_half_messages)" % limit)
        txid = half_txid(number)
        self.begin(txid, HALF_OWNER, 0, now_ms, user)
        try:
            partition = self.put(txid, HALF_OWNER, topic, partition, flag, data, None, now_ms)
            rec = R.Half(txid.key, now_ms, now_ms, 0, immunity_ms, group, transaction_id, user)
            self._write(rec)
        except BaseException:
            if txid.key in self._branches:
                self.rollback(txid, HALF_OWNER, now_ms)
            raise
        b = self._branches[txid.key]
        self._by_owner.pop(HALF_OWNER, None)  # a half branch is no connection's (begin indexed it)
        b.state, b.half, b.prepared_ms, b.deadline_ms, b.timeout_s = R.PREPARED, rec, now_ms, None, 0
        self._halves[b.key] = b
        return partition

    def half(self, number):
        """The pending half message ``number`` (a HalfMessage), or None."""
        b = self._halves.get(half_txid(number).key)
        return _view(b) if b is not None else None

    def halves(self):
        """Every half message waiting for its end (HalfMessage; not one being committed), oldest first."""
        return [_view(b) for b in self._halves.values() if b.state == R.PREPARED]

    @property
    def half_count(self):
        return len(self._halves)

    def half_checked(self, number, now_ms):
        """Journal one more check-back of half message ``number`` (no fsync needed: a crash that loses it
        only allows one more check); returns the HalfMessage after it. XAER_NOTA when it is not pending."""
        b = self._halves.get(half_txid(number).key)
        if b is None:
            raise TransactionError(XAER_NOTA, "no half message %d is pending" % number)
        rec = b.half._replace(now_ms=now_ms, checks=b.half.checks + 1)
        self._write(rec)
        b.half = rec
        return _view(b)

    def _keep_half(self, b):
        """Recovery: a prepared branch rebuilt with a HALF record is a pending half message again."""
        if b.half is None:
            return
        b.owner = HALF_OWNER
        self._halves[b.key] = b
