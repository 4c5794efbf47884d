"""One check-back round on the server (``metaq.transactions.remoting.CheckBack.run_round``) over a real
transaction manager and fake producer connections: who is asked, what counts, the round's limit."""

from types import SimpleNamespace

import pytest

from metaq.protocol.rocketmq.bodies import decode_stored_message
from metaq.protocol.rocketmq.remoting import RequestCode
from metaq.transactions.remoting import CheckBack
from metaq.server.remoting.clients import ProducerRegistry
from tests.harness.store import NOW
from tests.harness.tx import TxBroker

CFG = SimpleNamespace(transaction_check_interval_ms=1000, transaction_timeout_ms=0, transaction_check_max=2)


class FakeTx:
    """What CheckBack uses of the TxService, over an in-process manager."""

    def __init__(self, manager):
        self.manager = manager
        self.flushes = 0

    def rollback(self, txid, owner):
        self.manager.rollback(txid, owner, NOW)

    def flush_journal(self):
        self.flushes += 1
        self.manager.flush_journal()


class Producer:
    def __init__(self, user=None, room=True):
        self.closed = False
        self.session = SimpleNamespace(user=user) if user else None
        self.room = room
        self.sent = []

    def send_request(self, code, fields, body=b""):
        if self.room:
            self.sent.append((code, fields, body))
        return self.room


@pytest.fixture
def broker(tmp_path):
    b = TxBroker(tmp_path / "data")
    yield b
    b.crash()


def make(broker, limit=10):
    tx, producers = FakeTx(broker.tx), ProducerRegistry(120.0)
    return CheckBack(tx, producers, CFG, lambda: ("127.0.0.1", 9876), limit), tx, producers


def half(broker, number, user=None, group="PG"):
    broker.tx.put_half(number, "test", 1, 0, b"half %d" % number, group, "T%d" % number, -1, 100, NOW, user)


def test_a_round_asks_a_producer_of_the_group_with_the_stored_message(broker):
    cb, tx, producers = make(broker)
    mine, theirs = Producer(), Producer()
    producers.heartbeat(mine, ["PG"], 0.0)
    producers.heartbeat(theirs, ["OTHER"], 0.0)
    half(broker, 7)
    cb.run_round(NOW)
    [(code, fields, body)] = mine.sent
    assert code == RequestCode.CHECK_TRANSACTION_STATE and theirs.sent == []
    assert (fields["tranStateTableOffset"], fields["transactionId"], fields["topic"]) == ("7", "T7", "test")
    msg, _end = decode_stored_message(body)
    assert (msg.body, msg.queue_id, msg.queue_offset, msg.properties["PGROUP"]) == (b"half 7", 1, 7, "PG")
    assert broker.tx.half(7).checks == 1 and cb.counts["checks_sent"] == 1


def test_an_unsent_check_counts_and_the_last_round_rolls_back(broker):
    cb, tx, producers = make(broker)
    full = Producer(room=False)  # its queue of our requests is full (a producer that does not read)
    producers.heartbeat(full, ["PG"], 0.0)
    half(broker, 1)
    half(broker, 2, group="NOBODY")
    for _ in range(2):
        cb.run_round(NOW)
    assert cb.counts["checks_unsent"] == 4 and [h.checks for h in broker.tx.halves()] == [2, 2]
    assert tx.flushes == 0
    plan = cb.run_round(NOW)
    assert sorted(plan.give_up) == [1, 2] and broker.tx.halves() == [] and tx.flushes == 1
    assert broker.restart().prepared_kept == 0  # the rollbacks are journaled


def test_a_round_checks_at_most_its_limit_and_the_rest_wait(broker):
    cb, tx, producers = make(broker, limit=2)
    p = Producer()
    producers.heartbeat(p, ["PG"], 0.0)
    for n in (1, 2, 3):
        half(broker, n)
    plan = cb.run_round(NOW)
    assert (plan.check, plan.deferred, len(p.sent)) == ([1, 2], 1, 2)
    assert [h.checks for h in broker.tx.halves()] == [1, 1, 0]


def test_with_authentication_only_the_senders_connections_are_asked(broker):
    cb, tx, producers = make(broker)
    bob, alice = Producer(user="bob"), Producer(user="alice")
    producers.heartbeat(bob, ["PG"], 0.0)
    half(broker, 1, user="alice")
    cb.run_round(NOW)
    assert bob.sent == [] and cb.counts["checks_unsent"] == 1
    producers.heartbeat(alice, ["PG"], 0.0)
    cb.run_round(NOW)
    assert len(alice.sent) == 1 and bob.sent == []


class Failing(Producer):
    """A producer connection whose first request fails (a bug, a message that cannot be encoded)."""

    def send_request(self, code, fields, body=b""):
        if not self.sent and not getattr(self, "failed", False):
            self.failed = True
            raise RuntimeError("boom")
        return super().send_request(code, fields, body)


def test_a_check_that_fails_stops_no_other_check_and_no_later_round(broker):
    cb, tx, producers = make(broker)
    conn = Failing()
    producers.heartbeat(conn, ["PG"], 0.0)
    half(broker, 1)
    half(broker, 2)
    cb.run_round(NOW)  # the first check raises: counted, logged, the second is still sent
    assert cb.counts["checks_failed"] == 1 and len(conn.sent) == 1
    cb.run_round(NOW + 10_000)
    assert len(conn.sent) == 3  # both asked again in the next round


def test_a_half_message_stored_with_more_properties_than_rocketmq_carries_is_still_asked_about(tmp_path):
    from metaq.protocol.message import encode_payload
    broker = TxBroker(tmp_path / "big", segment_size=1 << 20)
    cb, tx, producers = make(broker)
    conn = Producer()
    producers.heartbeat(conn, ["PG"], 0.0)
    flag, data = encode_payload(b"big", "t" * 40_000)  # an attribute no send may store now: an older record's
    broker.tx.put_half(9, "test", 1, flag, data, "PG", "T9", -1, 100, NOW, None)
    cb.run_round(NOW)
    [(_code, _fields, body)] = conn.sent
    msg, _end = decode_stored_message(body)
    assert msg.body == b"big" and msg.properties["METAQ_TRIMMED_PROPERTIES"] == "1" and "TAGS" not in msg.properties
    assert msg.properties["PGROUP"] == "PG" and cb.counts["checks_failed"] == 0
    broker.crash()
