"""The transaction tests' broker stand-in (a small real store plus a manager, time injected, crashes simulated)
and what they put through it; the text protocol's transaction requests a test sends a real broker and reads the
answers of."""

import os

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import HEADER, iter_records
from metaq.transactions.wire import LocalTxId, XaTxId, parse_xa_error
from metaq.transactions.config import TxConfig
from metaq.transactions.follow import TxLog
from metaq.serving.putpath import BrokerWrites
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
        self.tx = TransactionManager.open(self.store, self.tx_config, now, BrokerWrites(self.store), force=force)
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
        return list(TxLog(self.store, None).read())


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
    return bytes(reply.body)


def xa_code(reply):
    """The XA code of a ``result 500`` (an XAException's body); fails the test on anything else."""
    assert isinstance(reply, ev.Result) and reply.code == 500, reply
    return parse_xa_error(reply.body)[0]


def tx_put(c, key, topic, partition, body):
    """A put of ``body`` into branch ``key`` on the text client ``c``, its checksum sent; the reply."""
    return c.call(ev.Put(topic, partition, 0, body, c.opaque(), metaq_checksum(body), key))


def tput(c, key, topic, partition, body):
    """``tx_put``, which must be journaled (``result 200`` with no offset yet: the commit gives it one)."""
    r = tx_put(c, key, topic, partition, body)
    assert ok(r) == b"-1 %d -1" % partition
    return r


def prepared_branch(c, key, n, qualifier="test-rm"):
    """XA branch ``key`` begun, ``n`` messages put (``<key>-<i>`` to topic ``tx``, partitions 0 and 1 in turn), ended
    and prepared (XA_OK)."""
    ok(tx(c, key, "BEGIN", 30, qualifier))
    for i in range(n):
        tput(c, key, "tx", i % 2, b"%s-%d" % (key.encode(), i))
    c.send(b"transaction %s s1 END 0\r\n" % key.encode())  # no reply
    assert ok(tx(c, key, "PREPARE")) == b"0"


def recovered(c, qualifier=None):
    """The keys RECOVER lists (of ``qualifier``'s branches, or all), sorted."""
    return sorted(k for k in ok(tx(c, "null", "RECOVER", 0, qualifier)).decode().split("\r\n") if k)


def payloads(c, topic, partition):
    """The bodies a get from offset 0 reads (none when the partition is empty)."""
    r = c.get(topic, partition, 0)
    if isinstance(r, ev.Result):
        assert r.code == 404, r
        return []
    return [rec.payload for rec, _ in iter_records(r.body)]
