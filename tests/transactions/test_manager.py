"""TransactionManager on a real store: the state machine, every XA error code, timeouts, owners, heuristics."""

from itertools import pairwise

import pytest

from metaq.errors import ConfigError, InvalidPartition, InvalidTopic, TransactionError
from metaq.protocol.checksum import metaq_checksum
from metaq.transactions.wire import (XA_HEURCOM, XA_HEURRB, XA_OK, XA_RBROLLBACK, XA_RBTIMEOUT, XA_RDONLY, XAER_DUPID,
                                     XAER_INVAL, XAER_NOTA, XAER_PROTO, XAER_RMERR)
from metaq.store.record import FIXED_OVERHEAD, RecordTooLarge
from metaq.transactions.config import TxConfig
from metaq.transactions.state import REMEMBER_MS
from tests.harness.store import NOW
from tests.harness.tx import TxBroker, local, xid


def xa_code(fn, *args):
    with pytest.raises(TransactionError) as info:
        fn(*args)
    return info.value.xa_code


def put(b, txid, data, partition=0, owner="c1", topic="test", now=NOW):
    return b.tx.put(txid, owner, topic, partition, 0, data, metaq_checksum(data), now)


# -- local transactions -------------------------------------------------------------------------------------


def test_local_commit_makes_every_message_visible_each_partition_contiguous(tx_broker):
    b = tx_broker
    b.store.put("test", 1, 0, b"before", NOW)
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    sent = [(0, b"a0"), (1, b"a1"), (0, b"b0"), (2, b"a2"), (1, b"b1"), (0, b"c0")]
    for partition, data in sent:
        assert put(b, t, data, partition) == partition
        b.store.put("test", 3, 0, b"noise", NOW)  # other traffic between the transactional puts
    assert b.all_messages() == {0: [], 1: [b"before"], 2: [], 3: [b"noise"] * 6}  # nothing before the commit
    results = b.commit(t, "c1")
    assert [r.partition for r in results] == [0, 0, 0, 1, 1, 2]  # grouped by partition, first seen first
    for prev, r in pairwise(results):
        assert r.log_end > prev.log_end
        if r.partition == prev.partition:
            assert r.offset == prev.offset + 1
    assert b.all_messages() == {0: [b"a0", b"b0", b"c0"], 1: [b"before", b"a1", b"b1"], 2: [b"a2"],
                                3: [b"noise"] * 6}
    # one append run: each record starts where the previous one ended, nothing else in between
    for prev, r in pairwise(results):
        assert r.log_end - prev.log_end == FIXED_OVERHEAD + len(b"test") + 2
    assert len({r.msg_id for r in results}) == 6
    assert b.tx.stats()["committed"] == 1 and b.tx.stats()["open"] == 0
    again = b.tx.commit(t, "c1", True, NOW)  # a repeated commit is answered with the commit made, appends nothing
    assert again.empty and again.confirm_end == results[-1].log_end and b.tx.apply_commit(again, NOW) == []
    assert b.all_messages()[0] == [b"a0", b"b0", b"c0"] and b.tx.stats()["committed"] == 1


def test_local_rollback_shows_nothing_and_a_later_commit_is_told_it_was_rolled_back(tx_broker):
    b = tx_broker
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    put(b, t, b"x", 0)
    put(b, t, b"y", 1)
    b.tx.rollback(t, "c1", NOW)
    assert b.all_messages() == {0: [], 1: [], 2: [], 3: []}
    assert xa_code(b.tx.commit, t, "c1", True, NOW) == XA_RBROLLBACK
    assert b.tx.rollback(t, "c1", NOW) is None  # a retried rollback: done already
    assert xa_code(b.tx.commit, t, "c2", True, NOW) == XAER_NOTA  # another connection learns nothing of it
    assert xa_code(b.tx.begin, t, "c1", 0, NOW) == XAER_DUPID  # a finished key is not reused
    assert b.tx.stats()["rolled_back"] == 1


def test_local_transaction_belongs_to_its_connection(tx_broker):
    b = tx_broker
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    assert xa_code(put, b, t, b"x", 0, "c2") == XAER_NOTA
    assert xa_code(b.tx.commit, t, "c2", True, NOW) == XAER_NOTA
    assert xa_code(b.tx.rollback, t, "c2", NOW) == XAER_NOTA
    put(b, t, b"x", 0, "c1")
    b.commit(t, "c1")
    assert b.messages("test", 0) == [b"x"]


def test_late_commit_of_an_old_key_never_completes_a_newer_transaction(tx_broker):
    b = tx_broker
    old, new = local(1), local(2)
    b.tx.begin(old, "c1", 0, NOW)
    put(b, old, b"old", 0)
    b.commit(old, "c1")
    b.tx.begin(new, "c1", 0, NOW)
    put(b, new, b"new", 0)
    late = b.tx.commit(old, "c1", True, NOW)  # the delayed duplicate: answered as committed, appends nothing
    assert late.empty and b.tx.apply_commit(late, NOW) == []
    assert b.messages("test", 0) == [b"old"]
    b.tx.rollback(new, "c1", NOW)
    assert b.messages("test", 0) == [b"old"]


def test_commit_in_flight_is_applied_once_even_when_commit_is_repeated(tx_broker):
    b = tx_broker
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    put(b, t, b"x", 0)
    plan1 = b.tx.commit(t, "c1", True, NOW)
    plan2 = b.tx.commit(t, "c1", True, NOW)  # the same request again while the journal is being fsynced
    assert xa_code(b.tx.rollback, t, "c1", NOW) == XAER_PROTO
    assert xa_code(put, b, t, b"late", 0) == XAER_PROTO
    b.tx.flush_journal()
    assert len(b.tx.apply_commit(plan1, NOW)) == 1
    assert b.tx.apply_commit(plan2, NOW) == []
    assert b.messages("test", 0) == [b"x"]


def test_commit_of_a_branch_without_puts_is_empty(tx_broker):
    b = tx_broker
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    plan = b.tx.commit(t, "c1", True, NOW)
    assert plan.empty and b.tx.apply_commit(plan, NOW) == []
    assert not b.tx.needs_flush


def test_prepare_of_a_local_transaction_is_rmerr(tx_broker):
    b = tx_broker
    b.tx.begin(local(1), "c1", 0, NOW)
    assert xa_code(b.tx.prepare, local(1), "c1", NOW) == XAER_RMERR
    assert xa_code(b.tx.commit, local(1), "c1", False, NOW) == XAER_PROTO  # two-phase of an unprepared branch


# -- XA -------------------------------------------------------------------------------------------------------


def test_xa_two_phase_commit(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x, None, 30, NOW)
    put(b, x, b"one", 0, None)
    put(b, x, b"two", -1, None, topic="other")  # the "*" pattern: one partition
    assert b.tx.recover() == []
    assert b.tx.prepare(x, None, NOW) == XA_OK
    assert b.tx.needs_flush
    b.tx.flush_journal()
    assert not b.tx.needs_flush
    assert b.tx.recover() == [x.key] and b.tx.recover("uq1") == [x.key] and b.tx.recover("other") == []
    info = b.tx.in_doubt()
    assert [(i.key, i.state, i.puts, i.bytes, i.prepared_ms, i.qualifier) for i in info] == \
        [(x.key, "prepared", 2, 6, NOW, "uq1")]
    b.commit(x, None, one_phase=False)
    assert b.messages("test", 0) == [b"one"] and b.messages("other", 0) == [b"two"]
    assert b.tx.recover() == [] and b.tx.in_doubt() == []
    again = b.tx.commit(x, None, False, NOW)  # a coordinator's retry: answered with the commit made
    assert again.empty and again.confirm_end > 0 and b.messages("test", 0) == [b"one"]
    assert xa_code(b.tx.rollback, x, None, NOW) == XAER_PROTO  # committed: it cannot be rolled back


def test_xa_branch_is_global_and_accepts_one_phase_commit_when_unprepared(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x.key, "c1", 0, NOW)  # the key text works too
    put(b, x, b"a", 1, "c2")  # another connection may work on an XA branch
    b.commit(x, "c3", one_phase=True)
    assert b.messages("test", 1) == [b"a"]


def test_xa_error_codes(tx_broker):
    b = tx_broker
    x = xid(1)
    assert xa_code(put, b, x, b"x") == XAER_NOTA
    assert xa_code(b.tx.prepare, x, None, NOW) == XAER_NOTA
    assert xa_code(b.tx.commit, x, None, False, NOW) == XAER_NOTA
    assert xa_code(b.tx.rollback, x, None, NOW) == XAER_NOTA
    assert xa_code(b.tx.forget, x, NOW) == XAER_NOTA
    assert xa_code(b.tx.begin, "XID:1:zz::q", None, 0, NOW) == XAER_INVAL
    assert xa_code(b.tx.begin, "null", None, 0, NOW) == XAER_INVAL
    assert xa_code(b.tx.begin, x, None, -1, NOW) == XAER_INVAL
    b.tx.begin(x, None, 0, NOW)
    assert xa_code(b.tx.begin, x, None, 0, NOW) == XAER_DUPID
    put(b, x, b"x")
    assert xa_code(b.tx.commit, x, None, False, NOW) == XAER_PROTO  # two-phase commit of an unprepared branch
    assert b.tx.prepare(x, None, NOW) == XA_OK
    assert xa_code(b.tx.prepare, x, None, NOW) == XAER_PROTO
    assert xa_code(put, b, x, b"more") == XAER_PROTO
    assert xa_code(b.tx.commit, x, None, True, NOW) == XAER_PROTO  # one-phase commit of a prepared branch
    b.tx.rollback(x, None, NOW)
    assert b.messages("test", 0) == []
    assert b.tx.rollback(x, None, NOW) is None  # a retried rollback: answered with the decision
    assert xa_code(b.tx.commit, x, None, False, NOW) == XA_RBROLLBACK
    assert xa_code(b.tx.prepare, x, None, NOW) == XAER_PROTO


def test_prepare_of_an_empty_branch_is_read_only_and_finishes_it(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    assert b.tx.prepare(x, None, NOW) == XA_RDONLY
    assert not b.tx.needs_flush  # nothing to fsync
    assert b.tx.recover() == []
    assert b.tx.commit(x, None, False, NOW).empty  # a read-only branch is finished: its commit has nothing to do
    assert xa_code(put, b, x, b"x") == XAER_PROTO


def test_limits_refuse_the_put_and_store_nothing(tmp_path):
    b = TxBroker(tmp_path / "d", TxConfig(max_puts_per_tx=2, max_tx_bytes=10))
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    put(b, t, b"12345")
    assert xa_code(put, b, t, b"123456") == XAER_RMERR  # 11 bytes > max_tx_bytes
    put(b, t, b"67890")
    assert xa_code(put, b, t, b"") == XAER_RMERR  # a third message > max_puts_per_tx
    b.commit(t, "c1")
    assert b.messages("test", 0) == [b"12345", b"67890"]
    b.tx.begin(local(2), "c1", 0, NOW)
    with pytest.raises(RecordTooLarge):
        put(b, local(2), b"x" * 5000)  # cannot fit a 4 KiB test segment
    with pytest.raises(InvalidTopic):
        b.tx.put(local(2), "c1", "no topic!", 0, 0, b"x", -1, NOW)
    with pytest.raises(InvalidPartition):
        put(b, local(2), b"x", 4)
    b.crash()


def test_open_transactions_at_the_broker_limit_and_one_past(tmp_path):
    b = TxBroker(tmp_path / "d", TxConfig(max_open=3))
    for n in range(1, 4):
        b.tx.begin(local(n), "c%d" % n, 0, NOW)  # at the limit
    with pytest.raises(TransactionError, match=r"too many open transactions on the broker: the limit is 3 "
                                               r"\(transactions.max_open\)") as info:
        b.tx.begin(xid(4), None, 0, NOW)  # one past
    assert info.value.xa_code == XAER_RMERR
    put(b, local(1), b"kept", owner="c1")
    b.tx.rollback(local(2), "c2", NOW)  # a place is freed
    b.tx.begin(local(5), "c5", 0, NOW)
    b.commit(local(1), "c1")
    assert b.messages("test", 0) == [b"kept"]
    b.crash()


def test_bytes_held_by_all_open_transactions_at_the_limit_and_one_past(tmp_path):
    b = TxBroker(tmp_path / "d", TxConfig(max_tx_bytes=1024, max_held_bytes=2000))
    b.tx.begin(local(1), "c1", 0, NOW)
    b.tx.begin(local(2), "c2", 0, NOW)
    put(b, local(1), b"a" * 1000, owner="c1")
    put(b, local(2), b"b" * 1000, owner="c2")  # 2000: exactly the limit, each branch within its own
    with pytest.raises(TransactionError, match=r"open transactions hold 2000 bytes: 1 more would pass the "
                                               r"limit 2000 \(transactions.max_held_bytes\)") as info:
        put(b, local(1), b"c", owner="c1")  # one byte past
    assert info.value.xa_code == XAER_RMERR
    b.commit(local(2), "c2")  # what a finished transaction held is free again
    put(b, local(1), b"c" * 24, owner="c1")
    b.commit(local(1), "c1")
    assert b.messages("test", 0) == [b"b" * 1000, b"a" * 1000, b"c" * 24]  # nothing of the refused put
    b.crash()


def test_prepared_transactions_kept_across_a_restart_count_toward_the_held_bytes(tmp_path):
    b = TxBroker(tmp_path / "d", TxConfig(max_tx_bytes=1500, max_held_bytes=1500))
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    put(b, x, b"p" * 1500, owner=None)
    assert b.tx.prepare(x, None, NOW) == XA_OK
    b.restart()
    b.tx.begin(local(2), "c2", 0, NOW)
    assert xa_code(put, b, local(2), b"q", 0, "c2") == XAER_RMERR  # the prepared branch still holds 1500
    b.commit(x, None, one_phase=False)
    put(b, local(2), b"q", owner="c2")
    b.crash()


def test_held_bytes_limit_must_fit_one_transaction():
    with pytest.raises(ConfigError, match="max_held_bytes"):
        TxConfig(max_tx_bytes=4096, max_held_bytes=1024).validate()


def test_a_topic_limit_refuses_the_transactional_put_never_the_commit(tmp_path):
    """The partitions a transaction writes are held at its put: topics created meanwhile cannot fail its commit."""
    from metaq.errors import TopicLimit

    b = TxBroker(tmp_path / "d", max_topics=1)
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    put(b, x, b"held", partition=0, owner=None, topic="new1")  # the first topic: the limit
    assert b.tx.prepare(x, None, NOW) == XA_OK
    b.tx.begin(local(2), "c2", 0, NOW)
    with pytest.raises(TopicLimit, match="limits.max_topics"):
        put(b, local(2), b"refused", partition=0, owner="c2", topic="new2")  # one past: refused at the put
    b.commit(x, None, one_phase=False)  # the prepared branch commits: its partition was held
    assert b.messages("new1", 0) == [b"held"]
    b.crash()


def test_a_prepared_branch_holds_its_new_partition_across_a_restart(tmp_path):
    b = TxBroker(tmp_path / "d", max_topics=1)
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    put(b, x, b"held", partition=0, owner=None, topic="new1")
    assert b.tx.prepare(x, None, NOW) == XA_OK
    b.restart()  # new1 has no data yet: the prepared branch takes its place again at recovery
    b.store.put("test", 0, 0, b"other traffic", NOW)  # a topic named in the config is never refused
    with pytest.raises(Exception, match="limits.max_topics"):
        b.store.put("new2", 0, 0, b"would take the place", NOW)
    b.commit(x, None, one_phase=False)
    assert b.messages("new1", 0) == [b"held"]
    b.crash()


def test_config_is_validated():
    with pytest.raises(ConfigError, match="journal_flush"):
        TxConfig(journal_flush="always").validate()
    with pytest.raises(ConfigError, match="default_timeout_s"):
        TxConfig(max_timeout_s=10, default_timeout_s=20).validate()
    with pytest.raises(ConfigError, match="max_puts_per_tx"):
        TxConfig(max_puts_per_tx=10**9).validate()


# -- timeouts and owners -------------------------------------------------------------------------------------


def test_timeout_rolls_back_and_is_answered_rbtimeout(tx_broker):
    b = tx_broker
    x, y, t = xid(1), xid(2), local(1)
    b.tx.begin(x, None, 5, NOW)
    b.tx.begin(y, None, 5, NOW)
    b.tx.begin(t, "c1", 0, NOW)  # default 60 s
    for txid, owner in ((x, None), (y, None), (t, "c1")):
        put(b, txid, b"x", 0, owner)
    assert b.tx.prepare(y, None, NOW + 4999) == XA_OK  # prepared branches never time out
    assert b.tx.expire(NOW + 4999) == []
    assert b.tx.expire(NOW + 5000) == [x.key]
    assert xa_code(put, b, x, b"x", 0, None, "test", NOW + 5001) == XA_RBTIMEOUT
    assert xa_code(b.tx.prepare, x, None, NOW + 5001) == XA_RBTIMEOUT
    assert xa_code(b.tx.commit, x, None, True, NOW + 5001) == XA_RBTIMEOUT
    assert xa_code(b.tx.rollback, x, None, NOW + 5001) == XA_RBTIMEOUT
    assert xa_code(b.tx.begin, x, None, 0, NOW + 5001) == XAER_DUPID
    # the local one: no timer call needed, the deadline is checked on use
    assert xa_code(b.tx.commit, t, "c1", True, NOW + 60_000) == XA_RBTIMEOUT
    assert b.tx.stats()["timed_out"] == 2
    b.tx.expire(NOW + 60_000 + REMEMBER_MS)  # forgotten after a while
    assert xa_code(b.tx.commit, x, None, True, NOW + 60_000 + REMEMBER_MS) == XAER_NOTA
    b.commit(y, None, one_phase=False, now=NOW + 10**7)
    assert b.messages("test", 0) == [b"x"]


def test_timeout_is_capped_by_the_configuration(tmp_path):
    b = TxBroker(tmp_path / "d", TxConfig(max_timeout_s=10, default_timeout_s=3))
    b.tx.begin(xid(1), None, 3600, NOW)
    b.tx.begin(xid(2), None, 0, NOW)
    assert {i.key: i.timeout_s for i in b.tx.in_doubt()} == {xid(1).key: 10, xid(2).key: 3}
    assert b.tx.expire(NOW + 3000) == [xid(2).key]
    assert b.tx.expire(NOW + 10_000) == [xid(1).key]
    b.crash()


def test_owner_close_rolls_back_only_that_connections_local_transactions(tx_broker):
    b = tx_broker
    a1, a2, c1, x = local(1, "sa"), local(2, "sa"), local(1, "sc"), xid(1)
    b.tx.begin(a1, "A", 0, NOW)
    b.tx.begin(a2, "A", 0, NOW)
    b.tx.begin(c1, "C", 0, NOW)
    b.tx.begin(x, "A", 0, NOW)
    for txid, owner in ((a1, "A"), (a2, "A"), (c1, "C"), (x, "A")):
        put(b, txid, txid.key.encode(), 0, owner)
    plan = b.tx.commit(a2, "A", True, NOW)  # committing: decided, so it is not rolled back
    assert b.tx.owner_closed("A", NOW) == [a1.key]
    b.tx.flush_journal()
    b.tx.apply_commit(plan, NOW)
    b.commit(c1, "C")
    b.commit(x, None)
    assert sorted(b.messages("test", 0)) == sorted([a2.key.encode(), c1.key.encode(), x.key.encode()])
    assert b.tx.owner_closed("A", NOW) == []
    assert xa_code(b.tx.commit, a1, "A", True, NOW) == XA_RBROLLBACK


# -- heuristics ---------------------------------------------------------------------------------------------


def test_heuristic_commit_then_commit_rollback_and_forget(tx_broker):
    b = tx_broker
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    put(b, x, b"h", 2, None)
    assert xa_code(b.tx.heuristic, x.key, True, NOW) == XAER_PROTO  # only prepared branches
    b.tx.prepare(x, None, NOW)
    plan = b.tx.heuristic(x.key, True, NOW)
    assert b.messages("test", 2) == []  # nothing appended before the journal is durable
    b.tx.flush_journal()
    results = b.tx.apply_commit(plan, NOW)
    assert [r.partition for r in results] == [2] and b.messages("test", 2) == [b"h"]
    assert b.tx.recover() == [x.key]
    assert [(i.key, i.state) for i in b.tx.in_doubt()] == [(x.key, "heuristic-commit")]
    assert xa_code(b.tx.commit, x, None, False, NOW) == XA_HEURCOM
    assert xa_code(b.tx.rollback, x, None, NOW) == XA_HEURCOM
    assert xa_code(put, b, x, b"x") == XAER_PROTO
    assert xa_code(b.tx.begin, x, None, 0, NOW) == XAER_DUPID
    b.tx.forget(x, NOW)
    assert b.tx.recover() == []
    assert xa_code(b.tx.forget, x, NOW) == XAER_NOTA
    assert b.tx.commit(x, None, False, NOW).empty  # forgotten, but its commit is remembered for REMEMBER_MS
    assert b.messages("test", 2) == [b"h"]


def test_heuristic_rollback_survives_a_restart_until_forget(tx_broker):
    b = tx_broker
    x, y = xid(1), xid(2)
    for t in (x, y):
        b.tx.begin(t, None, 0, NOW)
        put(b, t, t.key.encode(), 0, None)
        b.tx.prepare(t, None, NOW)
    assert b.tx.heuristic(x.key, False, NOW) is None
    assert xa_code(b.tx.heuristic, x.key, True, NOW) == XAER_NOTA
    b.tx.flush_journal()
    report = b.restart()
    assert report.heuristic_kept == 1 and report.prepared_kept == 1
    assert b.tx.recover() == sorted([x.key, y.key])
    assert xa_code(b.tx.commit, x, None, False, NOW) == XA_HEURRB
    assert xa_code(b.tx.rollback, x, None, NOW) == XA_HEURRB
    b.tx.forget(x, NOW)
    b.restart()
    assert b.tx.recover() == [y.key]
    b.commit(y, None, one_phase=False)
    assert b.messages("test", 0) == [y.key.encode()]


def test_stats_and_in_doubt(tx_broker):
    b = tx_broker
    b.tx.begin(local(1), "c", 7, NOW)
    put(b, local(1), b"abc", 0, "c")
    b.tx.begin(xid(1), None, 0, NOW)
    put(b, xid(1), b"x", 0, None)
    b.tx.prepare(xid(1), None, NOW + 5)
    s = b.tx.stats()
    assert (s["open"], s["prepared"], s["committing"], s["heuristic"]) == (1, 1, 0, 0)
    assert s["journal_bytes"] > 0
    info = {i.key: i for i in b.tx.in_doubt()}
    assert info[local(1).key].state == "active" and info[local(1).key].timeout_s == 7
    assert info[local(1).key].begun_ms == NOW and info[xid(1).key].prepared_ms == NOW + 5


def test_commit_results_name_their_topic(tx_broker):
    b = tx_broker
    t = local(1)
    b.tx.begin(t, "c1", 0, NOW)
    put(b, t, b"a", 1)
    put(b, t, b"b", 0, topic="other")
    results = b.commit(t, "c1")
    assert [(r.topic, r.partition, r.offset) for r in results] == [("test", 1, 0), ("other", 0, 0)]
    assert results[0].log_end < results[1].log_end < b.store.written_position  # DONE follows them in the log
