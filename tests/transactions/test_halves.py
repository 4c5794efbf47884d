"""RocketMQ half messages in the transaction manager (``metaq.transactions.state``): journaled, kept across a kill -9
with their check count, owned by no connection, ended only through HALF_OWNER, bounded."""


import pytest

from metaq.transactions.wire import XA_OK, XAER_NOTA, XAER_PROTO, XAER_RMERR
from metaq.errors import InvalidTopic, TransactionError
from metaq.transactions import records as R
from metaq.transactions.config import TxConfig
from metaq.transactions.state import HALF_OWNER, half_number, half_txid
from metaq.transactions.follow import SNAPSHOT_FLAG
from tests.harness.store import NOW
from tests.harness.tx import TxBroker, local, xid


def put_half(b, number, body=b"half", group="PG", limit=10, now=NOW, immunity=-1, user=None):
    return b.tx.put_half(number, "test", 0, 0, body, group, "TXID%d" % number, immunity, limit, now, user)


def test_a_half_record_encodes_and_decodes_with_and_without_an_owner():
    for owner in (None, "alice"):
        rec = R.Half("TX:rmq:7", NOW + 5, NOW, 3, 60_000, "PG_ORDERS", "7F00000100002A9F", owner)
        assert R.decode(b"".join(R.encode(rec))) == rec


def test_a_half_message_survives_a_crash_with_its_check_count_and_commits_once(tx_broker):
    b = tx_broker
    assert put_half(b, 11, body=b"one", user="alice") == 0
    b.tx.flush_journal()
    assert b.tx.half_checked(11, NOW + 7000).checks == 1
    assert b.tx.half_checked(11, NOW + 8000).checks == 2  # not flushed: the page cache survives a kill -9
    report = b.restart()
    assert (report.rolled_back, report.prepared_kept) == (0, 1)
    [h] = b.tx.halves()
    assert (h.number, h.topic, h.partition, h.data, h.stored_ms, h.checks, h.group, h.transaction_id, h.user) == \
        (11, "test", 0, b"one", NOW, 2, "PG", "TXID11", "alice")
    assert b.messages("test", 0) == []
    plan = b.tx.commit(half_txid(11), HALF_OWNER, False, NOW + 9000)
    b.tx.flush_journal()
    assert len(b.tx.apply_commit(plan, NOW + 9000)) == 1
    assert b.tx.halves() == [] and b.tx.half(11) is None
    b.restart()
    assert b.tx.halves() == [] and len(b.messages("test", 0)) == 1


def test_text_transactions_keep_their_rules_and_cannot_touch_a_half_message(tx_broker):
    b = tx_broker
    put_half(b, 12)
    b.tx.begin(local(1), 5, 0, NOW)  # a text connection's local transaction (owner: connection id 5)
    b.tx.put(local(1), 5, "test", 1, 0, b"text", None, NOW)
    assert b.tx.owner_closed(5, NOW) == [local(1).key]  # its connection closed: rolled back, the half stays
    assert b.tx.expire(NOW + 10 ** 9) == []  # half messages never time out
    for owner in (5, None):
        with pytest.raises(TransactionError) as err:
            b.tx.commit(half_txid(12).key, owner, True, NOW)
        assert err.value.xa_code == XAER_NOTA
    with pytest.raises(TransactionError) as err:
        b.tx.rollback(half_txid(12).key, 5, NOW)
    assert err.value.xa_code == XAER_NOTA
    with pytest.raises(TransactionError) as err:  # prepared: only a two-phase commit
        b.tx.commit(half_txid(12), HALF_OWNER, True, NOW)
    assert err.value.xa_code == XAER_PROTO
    b.tx.begin(local(2), 6, 0, NOW)
    b.tx.put(local(2), 6, "test", 1, 0, b"active", None, NOW)
    b.tx.flush_journal()
    report = b.restart()
    assert (report.rolled_back, report.prepared_kept) == (1, 1)  # the active text transaction, the half kept
    assert [h.number for h in b.tx.halves()] == [12]
    b.tx.rollback(half_txid(12), HALF_OWNER, NOW)
    b.restart()
    assert b.tx.halves() == [] and b.messages("test", 0) == []


def test_pending_half_messages_are_bounded_at_the_limit_and_refused_one_past_it(tx_broker):
    b = tx_broker
    for n in range(1, 4):
        put_half(b, n, limit=3)
    assert b.tx.half_count == 3
    with pytest.raises(TransactionError) as err:
        put_half(b, 4, limit=3)
    assert err.value.xa_code == XAER_RMERR and "remoting.max_half_messages" in str(err.value)
    assert b.tx.half(4) is None and b.tx.stats()["prepared"] == 3
    b.tx.rollback(half_txid(1), HALF_OWNER, NOW)
    put_half(b, 4, limit=3)  # room again
    assert [h.number for h in b.tx.halves()] == [2, 3, 4]


def test_a_refused_half_message_leaves_nothing(tx_broker):
    b = tx_broker
    with pytest.raises(InvalidTopic):
        b.tx.put_half(5, "no/such topic", 0, 0, b"x", "PG", "T", -1, 10, NOW)
    assert b.tx.half_count == 0 and b.tx.stats()["open"] == 0
    assert b.restart().rolled_back == 0


def test_half_number_parses_only_half_keys():
    assert half_number(half_txid(123).key) == 123
    assert half_number(local(123).key) is None and half_number("TX:rmq:-1") is None


def test_a_checkpoint_keeps_half_messages_with_their_count(tmp_path):
    b = TxBroker(tmp_path / "d", TxConfig(journal_file_size=64 * 1024))
    put_half(b, 21, body=b"h" * 100)
    b.tx.half_checked(21, NOW + 1)
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    while not b.tx.wants_maintenance:  # the log grows a segment past the journal's first record
        b.tx.put(x, None, "test", 1, 0, b"f" * 3000, None, NOW)
    assert b.tx.prepare(x, None, NOW) == XA_OK
    b.tx.maintain(NOW)
    snap = [rec for _pos, flag, rec in b.journal() if flag & SNAPSHOT_FLAG]
    assert [r.checks for r in snap if type(r) is R.Half] == [1] and type(snap[-1]) is R.SnapEnd
    b.crash()
    b.open()
    [h] = b.tx.halves()
    assert (h.number, h.checks, h.data) == (21, 1, b"h" * 100)


def test_half_messages_count_as_open_transactions(tmp_path):
    b = TxBroker(tmp_path / "d", TxConfig(max_open=2))
    b.tx.begin(local(1), 5, 0, NOW)
    put_half(b, 1)
    with pytest.raises(TransactionError) as err:
        put_half(b, 2)
    assert err.value.xa_code == XAER_RMERR and "transactions.max_open" in str(err.value)
    assert b.tx.half_count == 1
    b.crash()
