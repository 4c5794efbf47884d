"""The transaction tests' broker stand-in (a small real store plus a manager, time injected, crashes simulated)
and what they put through it."""

import os

from metaq.protocol import events as ev
from metaq.protocol.message import HEADER
from metaq.transactions.wire import LocalTxId, XaTxId
from metaq.transactions.config import TxConfig
from metaq.transactions.follow import TxLog
from metaq.transactions.state import TransactionManager
from tests.harness.store import NOW, open_store, payload_of, read_all


def local(n, session="s1"):
    return LocalTxId(session, n)


def xid(n, qualifier="uq1"):
    return XaTxId(1, b"gtrid-%d" % n, b"b", qualifier)


class TxBroker:
    """A store and a transaction manager over one data dir, reopened the way a restarted broker would."""

    def __init__(self, data_dir, tx=None, now=NOW, **store_overrides):
        self.data_dir = str(data_dir)
        self.tx_config = tx or TxConfig()
        self.store_overrides = store_overrides
        self.store = self.tx = None
        self.open(now)

    def open(self, now=NOW, force=None, **overrides):
        self.store = open_store(self.data_dir, now, **dict(self.store_overrides, **overrides))
        self.tx = TransactionManager.open(self.store, self.tx_config, now, force=force)
        return self.tx.recovery

    def crash(self):
        """As after a kill -9: nothing flushed or closed on purpose (the page cache survives)."""
        self.tx.abandon()
        self.store.abandon()

    def close(self, now=NOW):
        self.tx.close(now)
        self.store.close(now)

    def restart(self, now=NOW, crash=True, **kw):
        self.crash() if crash else self.close(now)
        return self.open(now, **kw)

    def commit(self, txid, owner=None, one_phase=True, now=NOW):
        """What the broker does for COMMIT: decide, fsync the journal, append."""
        plan = self.tx.commit(txid, owner, one_phase, now)
        if self.tx.needs_flush:
            self.tx.flush_journal()
        return self.tx.apply_commit(plan, now)

    def messages(self, topic, partition):
        return [payload_of(m) for m in read_all(self.store, topic, partition)]

    def all_messages(self, topic="test", partitions=4):
        return {p: self.messages(topic, p) for p in range(partitions)}

    @property
    def journal_dir(self):
        """Where an older broker kept its journal (migrated into the log at open)."""
        return os.path.join(self.data_dir, "transactions")

    def journal(self):
        """Every ``(position, flag, record)`` of the journal in the log (``%TX%``), as recovery reads them."""
        return list(TxLog(self.store).read())


def ids_in(b, topic="test", partitions=4):
    return [HEADER.unpack_from(m)[2] for p in range(partitions) for m in read_all(b.store, topic, p)]


def body(txid, i, size=40):
    return (b"%s-%03d-" % (txid.key.encode(), i)).ljust(size, b".")


def fill(b, txid, owner, n, size=40, partitions=(0, 1)):
    for i in range(n):
        b.tx.put(txid, owner, "test", partitions[i % len(partitions)], 0, body(txid, i, size), -1, NOW)


def tx(c, key, kind, timeout=0, qualifier=None):
    """One ``transaction`` request of session s1 on the text client ``c``; the reply."""
    return c.call(ev.Transaction(key, "s1", kind, c.opaque(), timeout, qualifier))


def ok(reply):
    """The body of a ``result 200``; fails the test on anything else."""
    assert isinstance(reply, ev.Result) and reply.code == 200, reply
    return reply.body
