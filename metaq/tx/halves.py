"""RocketMQ half messages: their keys, their owner and how the transaction manager shows one (``HalfMessage``);
the operations are ``TransactionManager``'s (``put_half``, ``half``, ``halves``, ``half_checked``).

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

from metaq.protocol.xa import LocalTxId

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


def half_view(b):
    """The HalfMessage of branch ``b`` (a records.Branch with a HALF record)."""
    put, half = b.puts[0], b.half
    return HalfMessage(b.key, half_number(b.key), put.topic, put.partition, put.flag, put.data, half.stored_ms,
                       half.checks, half.immunity_ms, half.group, half.transaction_id, b.user)
