"""The transaction journal in the commit log (``metaq.transactions.follow``): its records are ``%TX%`` messages,
replayed at open, snapshotted, followed by a slave's manager, cut with the log, taken over at a promotion, and an
older broker's journal directory migrated into it. Real stores, no network."""

import os
import shutil

import pytest

from metaq.errors import TransactionError
from metaq.protocol.checksum import crc32
from metaq.transactions import records as R
from metaq.transactions.config import TxConfig
from metaq.protocol.journaltopic import TX_TOPIC
from metaq.transactions.limits import TX_LEARN_BATCH, TX_LEARN_BATCH_BYTES
from metaq.store.journals import JournalFollow
from metaq.transactions.follow import SNAPSHOT_FLAG, TX_JOURNAL, LogReplay
from metaq.transactions.journal import journal_path
from metaq.serving.putpath import BrokerWrites
from metaq.transactions.state import TransactionManager
from metaq.transactions.wire import XA_OK, XAER_RMFAIL
from tests.harness.store import NOW, open_store
from tests.harness.tx import TxBroker, body, fill, local, xid


def prepared(b, n, puts=2):
    x = xid(n)
    b.tx.begin(x, None, 0, NOW)
    fill(b, x, None, puts)
    assert b.tx.prepare(x, None, NOW) == XA_OK
    return x


# -- LogReplay (pure) ------------------------------------------------------------------------------------------

def put(key, data=b"d"):
    return R.Put(key, "test", 0, 0, -1, data)


def test_a_complete_snapshot_replaces_what_came_before_and_an_incomplete_one_is_ignored():
    a, b = "XID:1:0a:01:q", "XID:1:0b:01:q"
    replay = LogReplay()
    replay.apply(0, 0, put(a))
    replay.apply(10, 0, R.Prepare(a, 1, 1, 0))
    replay.apply(20, SNAPSHOT_FLAG, R.Snapshot(2, 0))  # cut short (a full disk): ignored
    replay.apply(30, SNAPSHOT_FLAG, put(b))
    replay.apply(40, 0, put(b, b"live"))  # an ordinary record: the snapshot never ends
    assert sorted(replay.state.branches) == [a, b] and replay.snapshot_at is None
    assert [p.data for p in replay.state.branches[b].puts] == [b"live"]
    replay.apply(50, SNAPSHOT_FLAG, R.Snapshot(3, 0))  # a complete one: b alone is live in it
    replay.apply(60, SNAPSHOT_FLAG, put(b, b"live"))
    replay.apply(70, SNAPSHOT_FLAG, R.SnapEnd(1))
    assert sorted(replay.state.branches) == [b] and replay.snapshot_at == 50
    replay.apply(80, SNAPSHOT_FLAG, R.SnapEnd(1))  # the end of a snapshot whose start retention deleted
    replay.apply(90, SNAPSHOT_FLAG, R.Snapshot(4, 0))
    replay.apply(100, SNAPSHOT_FLAG, R.SnapEnd(5))  # a count that does not match: not taken
    assert sorted(replay.state.branches) == [b] and replay.snapshot_at == 50


# -- the journal in the log --------------------------------------------------------------------------------------

def test_the_journal_is_the_logs_and_a_restart_replays_it(tx_broker):
    b = tx_broker
    x = prepared(b, 1)
    types = [type(rec).__name__ for _pos, _flag, rec in b.journal()]
    assert types == ["Put", "Put", "Prepare"]
    assert not os.path.exists(b.journal_dir)  # no files of its own
    b.restart()
    assert b.tx.recover() == [x.key]
    b.commit(x, one_phase=False)
    assert sorted(b.messages("test", 0) + b.messages("test", 1)) == sorted([body(x, 0), body(x, 1)])
    assert [type(rec).__name__ for _p, _f, rec in b.journal()][-2:] == ["Commit", "Done"]


def test_a_snapshot_is_written_once_the_log_grew_a_segment_and_moves_the_retention_floor_once_durable(tmp_path):
    b = TxBroker(tmp_path / "d")
    try:
        x = prepared(b, 1)
        first = b.tx.retention_floor()
        assert first == b.journal()[0][0] and not b.tx.wants_maintenance
        while not b.tx.wants_maintenance:  # other traffic: the log grows past a segment
            b.store.put("test", 3, 0, b"o" * 1000, NOW)
        b.tx.maintain(NOW)
        assert b.tx.retention_floor() == first and not b.tx.wants_maintenance  # its end is not durable yet
        b.store.mark_flushed(b.store.flush_log())  # now it is: retention may delete what lies before it
        assert b.tx.retention_floor() > first + b.store.config.segment_size and not b.tx.wants_maintenance
        snap = [(flag, type(rec).__name__) for _p, flag, rec in b.journal() if flag & SNAPSHOT_FLAG]
        assert snap == [(SNAPSHOT_FLAG, "Snapshot"), (SNAPSHOT_FLAG, "Put"), (SNAPSHOT_FLAG, "Put"),
                        (SNAPSHOT_FLAG, "Prepare"), (SNAPSHOT_FLAG, "SnapEnd")]
        snap_at = [pos for pos, _flag, rec in b.journal() if type(rec) is R.Snapshot][0]
        assert b.tx.retention_floor() == snap_at
        b.restart()
        assert b.tx.recover() == [x.key] and b.tx.retention_floor() == snap_at
    finally:
        b.crash()


# -- a slave's manager -----------------------------------------------------------------------------------------

def replica_of(b, tmp_path):
    """A slave's store and manager over a copy of ``b``'s log (what replication leaves: the same bytes)."""
    b.tx.flush_journal()
    b.store.mark_flushed(b.store.flush_log())
    b.store.checkpoint(NOW)
    copy = str(tmp_path / "slave")
    shutil.copytree(b.data_dir, copy)
    store = open_store(copy, NOW)
    return store, TransactionManager.open(store, TxConfig(), NOW, BrokerWrites(store), master=False)


def test_a_slave_manager_writes_nothing_and_a_promotion_takes_the_branches_over(tx_broker, tmp_path):
    b = tx_broker
    x = prepared(b, 1)
    b.tx.begin(local(1), "c1", 0, NOW)
    fill(b, local(1), "c1", 1)  # never prepared: its client was the old master's
    committed = prepared(b, 2)
    b.commit(committed, one_phase=False)
    b.tx.put_half(7, "test", 2, 0, b"half", "PG", "T7", -1, 10, NOW, None)
    b.tx.half_checked(7, NOW + 1)
    store, slave = replica_of(b, tmp_path)
    try:
        assert slave.replica and slave.recover() == []  # its branches are the master's until it takes over
        slave.begin(xid(9), None, 0, NOW)
        with pytest.raises(TransactionError) as info:
            slave.put(xid(9), None, "test", 0, 0, b"x", -1, NOW)
        assert info.value.xa_code == XAER_RMFAIL and "slave" in str(info.value)
        report = slave.take_over(NOW)
        assert (report.prepared_kept, report.rolled_back) == (2, 1)  # the XA branch and the half message
        assert not slave.replica and slave.recover() == [x.key]
        [half] = slave.halves()  # a RocketMQ half message, its check count kept: asked about again
        assert (half.number, half.checks, half.data) == (7, 1, b"half")
        assert slave.commit(committed, None, False, NOW).empty  # the old master's decision, answered as made
        plan = slave.commit(x, None, False, NOW)
        assert len(slave.apply_commit(plan, NOW)) == 2
    finally:
        store.abandon()


def test_a_cut_drops_the_branches_of_the_cut_tail_and_keeps_the_rest(tx_broker):
    b = tx_broker
    kept = prepared(b, 1)
    agreed = b.store.written_position
    cut = prepared(b, 2)  # the deposed master's tail: the new master never had it
    b.tx.follow_master()
    assert b.tx.replica and b.tx.recover() == []
    assert b.tx.journal_end > agreed
    b.store.truncate_log(agreed, NOW)
    # nothing of the journal ends past the cut: a promotion's flush of it does not wait for a position the log
    # reaches again only with other records
    assert b.tx.journal_end <= agreed
    report = b.tx.take_over(NOW)
    assert report.prepared_kept == 1 and b.tx.recover() == [kept.key]
    assert cut.key not in [i.key for i in b.tx.in_doubt()]


# -- an older broker's journal directory ---------------------------------------------------------------------

def test_an_older_brokers_journal_is_migrated_into_the_log_once(tmp_path):
    key = "XID:1:0a:0b:q"
    tx_dir = tmp_path / "data" / "transactions"
    os.makedirs(tx_dir)
    recs = [R.Put(key, "test", 0, 0, -1, b"from an old broker"), R.Prepare(key, 1, 1, 0, "alice")]
    with open(journal_path(str(tx_dir), 1), "wb") as f:
        for rec in recs:
            payload = b"".join(R.encode(rec))
            f.write(R.HEADER.pack(len(payload), crc32(payload)) + payload)
    b = TxBroker(tmp_path / "data")
    try:
        assert b.tx.recover() == [key] and not os.path.exists(tx_dir)
        assert [type(rec).__name__ for _p, _f, rec in b.journal()] == ["Snapshot", "Put", "Prepare", "SnapEnd"]
        b.restart()
        assert b.tx.recover() == [key] and b.tx.user_of(key) == (True, "alice")
        assert len(b.journal()) == 4  # not migrated twice
    finally:
        b.crash()


def test_a_slave_removes_an_older_brokers_journal_rather_than_keep_branches_that_are_not_its_masters(tmp_path):
    tx_dir = tmp_path / "data" / "transactions"
    os.makedirs(tx_dir)
    key = "XID:1:0c:0d:q"
    with open(journal_path(str(tx_dir), 1), "wb") as f:
        for rec in (R.Put(key, "test", 0, 0, -1, b"stale"), R.Prepare(key, 1, 1, 0)):
            payload = b"".join(R.encode(rec))
            f.write(R.HEADER.pack(len(payload), crc32(payload)) + payload)
    store = open_store(str(tmp_path / "data"), NOW)
    try:
        slave = TransactionManager.open(store, TxConfig(), NOW, BrokerWrites(store), master=False)
        assert not os.path.exists(tx_dir) and slave.take_over(NOW).prepared_kept == 0 and slave.recover() == []
    finally:
        store.abandon()


# -- the journal's subscriber: what one step of the log follower learns ------------------------------------------

def follower_of(b, limit=TX_LEARN_BATCH, max_bytes=TX_LEARN_BATCH_BYTES):
    """A slave's subscriber of ``%TX%`` over ``b``'s log from its start, the records it learns collected in order."""
    learned = []
    follow = JournalFollow(b.store, TX_JOURNAL, lambda pos, flag, rec: learned.append(rec), lambda upto: None,
                           lambda: None, limit, max_bytes)
    follow.replicating = True
    return follow, learned


def step(b, follow, max_bytes=None):
    b.store.follower.step(b.store.flushed_position, b.store.written_position, max_bytes, only=follow)


def journal_of_puts(b, n):
    """``n`` PUT records of one branch in ``%TX%``; their log spans."""
    x = xid(1)
    b.tx.begin(x, None, 0, NOW)
    fill(b, x, None, n)
    spans = b.store.record_spans(TX_TOPIC, 0, 0, b.store.written_position, n + 1)
    assert len(spans) == n
    return spans


@pytest.mark.parametrize("records", [4, 5])
def test_a_slave_learns_at_most_its_batch_of_records_a_step_at_the_limit_and_one_past(tx_broker, records):
    b = tx_broker
    spans = journal_of_puts(b, records)
    follow, learned = follower_of(b, limit=4)
    step(b, follow)
    assert len(learned) == 4
    if records == 4:
        assert follow.position == b.store.written_position
    else:  # the fifth waits for the next step, where it starts
        assert follow.position == spans[4][1]
        step(b, follow)
    assert follow.position == b.store.written_position
    assert [r.data for r in learned] == [body(xid(1), i) for i in range(records)]


def test_a_slave_learns_at_most_its_batch_of_bytes_a_step_and_one_record_at_least(tx_broker):
    b = tx_broker
    spans = journal_of_puts(b, 3)
    follow, learned = follower_of(b, max_bytes=spans[0][2] + spans[1][2])  # two records' bytes exactly
    step(b, follow)
    assert len(learned) == 2 and follow.position == spans[2][1]
    follow, learned = follower_of(b, max_bytes=spans[0][2] - 1)  # less than one record: one all the same
    step(b, follow)
    assert len(learned) == 1 and follow.position == spans[1][1]


def test_a_slave_learns_every_record_through_steps_of_the_log_followers_byte_budget(tx_broker):
    """A step walks a budget of log bytes: the records past it are learned by the next steps, none passed over."""
    b = tx_broker
    journal_of_puts(b, 6)
    follow, learned = follower_of(b)
    steps = 0
    while follow.position < b.store.written_position:
        step(b, follow, max_bytes=1)  # the records starting in the first byte: one a step
        steps += 1
    assert steps == 6 and [r.data for r in learned] == [body(xid(1), i) for i in range(6)]


# -- snapshots written in steps ---------------------------------------------------------------------------------

def live(state):
    """What a replay state holds: each live branch's state and messages, and the heuristic outcomes."""
    return ({k: (br.state, [p.data for p in br.puts], br.user) for k, br in state.branches.items()},
            {k: h.commit for k, h in state.heuristic.items()})


def replays(b):
    """``(the log replayed without its snapshots, the log from its last snapshot on as retention leaves it)``."""
    whole = R.ReplayState(1 << 62)
    for _pos, flag, rec in b.journal():
        if not flag & SNAPSHOT_FLAG:
            whole.apply(rec)
    b.store.mark_flushed(b.store.flush_log())  # the snapshot's end durable: the floor moves to it
    at = b.tx.retention_floor()
    tail = LogReplay(on_anomaly=pytest.fail)  # a record that fits no branch of the snapshot fails the test
    for pos, flag, rec in b.journal():
        if pos >= at:
            tail.apply(pos, flag, rec)
    assert tail.snapshot_at == at
    return whole, tail.state


@pytest.mark.parametrize("branches", [3, 4])
def test_a_snapshot_is_written_in_steps_of_its_limit_at_the_limit_and_one_past(tx_broker, branches):
    b = tx_broker
    for n in range(branches):
        prepared(b, n, puts=1)
    pauses = []
    b.tx.maintain(NOW, pause=lambda: pauses.append(b.store.written_position), step=3)
    assert len(pauses) == (branches > 3)  # two steps past the limit, a pause between them
    assert [type(rec).__name__ for _p, flag, rec in b.journal() if flag & SNAPSHOT_FLAG] == \
        ["Snapshot"] + ["Put", "Prepare"] * branches + ["SnapEnd"]
    whole, snapshot = replays(b)
    assert live(snapshot) == live(whole) and len(whole.branches) == branches
    keys = b.tx.recover()
    b.restart()
    assert b.tx.recover() == keys and len(keys) == branches


def test_branches_changed_between_a_snapshots_steps_replay_to_their_state(tx_broker):
    """Requests served between two steps change branches the snapshot wrote and branches it has not written yet
    (each of those goes into it as it is before the change): the snapshot and the records after its start, as
    retention leaves the log, are the branches the manager holds."""
    b = tx_broker
    written, growing, to_prepare, to_roll_back, to_commit, untouched, forgotten = [xid(n) for n in range(1, 8)]
    for x in (written, growing, to_prepare, to_roll_back, to_commit, untouched, forgotten):
        b.tx.begin(x, None, 0, NOW, user="alice")
        fill(b, x, None, 1)
    assert b.tx.prepare(written, None, NOW) == XA_OK and b.tx.prepare(forgotten, None, NOW) == XA_OK
    assert b.tx.prepare(to_commit, None, NOW) == XA_OK and b.tx.prepare(untouched, None, NOW) == XA_OK
    b.tx.heuristic(forgotten.key, False, NOW)  # an outcome the snapshot writes last
    fresh = local(1)

    def requests():  # between the first step (written, growing) and the next ones
        b.tx.put(growing, None, "test", 1, 0, b"after its step", -1, NOW)
        assert b.tx.prepare(to_prepare, None, NOW) == XA_OK
        b.tx.rollback(to_roll_back, None, NOW)
        b.commit(to_commit, one_phase=False)
        b.tx.forget(forgotten, NOW)
        b.tx.begin(fresh, "c1", 0, NOW)
        fill(b, fresh, "c1", 2)

    steps = []
    b.tx.maintain(NOW, pause=lambda: (steps.append(1), len(steps) == 1 and requests()), step=2)
    assert len(steps) == 1  # the requests wrote the keys they changed into it: one step more (untouched)
    flags = [flag & SNAPSHOT_FLAG for _p, flag, _rec in b.journal()]
    assert 0 in flags[flags.index(SNAPSHOT_FLAG):]  # ordinary records among the snapshot's
    whole, snapshot = replays(b)
    assert live(snapshot) == live(whole)
    assert set(whole.branches) == {written.key, growing.key, to_prepare.key, untouched.key, fresh.key}
    assert not whole.heuristic
    assert [p.data for p in whole.branches[growing.key].puts][-1] == b"after its step"
    assert {i.key: i.state for i in b.tx.in_doubt()} == {k: br.state for k, br in whole.branches.items()}
    b.restart()  # the unprepared ones roll back; the prepared ones are kept
    assert b.tx.recover() == sorted([written.key, to_prepare.key, untouched.key])
    assert b.tx.recovery.anomalies == 0
    assert b.tx.commit(to_commit, None, False, NOW).empty  # remembered as committed


def test_a_snapshot_left_incomplete_between_its_steps_is_ignored(tx_broker):
    """A change of role between two steps (a demotion) leaves the snapshot without its end: replay ignores it."""
    b = tx_broker
    keys = [prepared(b, n, puts=1).key for n in range(3)]
    before = b.tx.retention_floor()
    b.tx.maintain(NOW, pause=b.tx.follow_master, step=2)
    assert [type(rec).__name__ for _p, flag, rec in b.journal() if flag & SNAPSHOT_FLAG][-1] != "SnapEnd"
    assert b.tx.retention_floor() == before
    b.tx.take_over(NOW)
    b.restart()
    assert b.tx.recover() == sorted(keys) and b.tx.retention_floor() == before
