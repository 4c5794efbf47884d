"""Review of the stepped journal snapshot (e2446a7): a COMMIT journaled between two steps of a snapshot reaches
the state before it, which, in a log retention has cut, lacks the branch's first PUTs."""

from metaq.transactions import records as R
from metaq.transactions.follow import SNAPSHOT_FLAG, LogReplay
from metaq.transactions.wire import XA_OK
from tests.harness.store import HOUR_MS, NOW
from tests.harness.tx import TxBroker, body, fill, xid


def put(key, data):
    return R.Put(key, "test", 0, 0, -1, data)


def test_a_commit_between_two_steps_of_a_snapshot_replays_from_a_log_that_lacks_the_branchs_first_put():
    """The log as retention leaves it: it starts in the segment of the snapshot, after the branch's first PUT
    (its segment deleted) and before its second. The branch goes into the snapshot whole, then commits between two
    steps: the snapshot is complete and holds the commit; the state before it holds half the branch."""
    a = "XID:1:0a:01:q"
    replay = LogReplay()
    replay.apply(100, 0, put(a, b"1"))  # the first record of the log: PUT 0 of a was in a deleted segment
    replay.apply(200, SNAPSHOT_FLAG, R.Snapshot(1, 0))
    replay.apply(300, SNAPSHOT_FLAG, put(a, b"0"))  # a's first step
    replay.apply(400, SNAPSHOT_FLAG, put(a, b"1"))
    replay.apply(500, 0, R.Commit(a, 2, 50, True, (7, 8)))  # served between two steps
    replay.apply(600, 0, R.Done(a, 3, 700))
    replay.apply(800, SNAPSHOT_FLAG, R.SnapEnd(2))
    assert replay.snapshot_at == 200 and replay.state.branches == {}
    assert replay.state.decided[a][0] == R.COMMITTED


def test_a_broker_restarts_after_retention_once_a_branch_committed_between_two_steps_of_a_snapshot(tmp_path):
    b = TxBroker(tmp_path / "d", retention_hours=1.0)
    try:
        seg = b.store.config.segment_size
        a = xid(1)
        b.tx.begin(a, None, 0, NOW)
        fill(b, a, None, 1)  # PUT 0 of a
        first = b.store.written_position // seg
        while b.store.written_position // seg == first:  # other traffic: the log goes on in a new segment
            b.store.put("test", 3, 0, b"o" * 1000, NOW)
        b.tx.put(a, None, "test", 1, 0, body(a, 1), -1, NOW)  # PUT 1 of a, in the new segment
        other = xid(2)
        b.tx.begin(other, None, 0, NOW)
        fill(b, other, None, 1)
        assert b.tx.prepare(other, None, NOW) == XA_OK
        steps = []
        # a first, then (between the steps) a committed, then the other branch: the snapshot ends
        b.tx.maintain(NOW, pause=lambda: steps.append(1) or b.commit(a), step=1)
        assert steps == [1]
        puts = [pos for pos, flag, rec in b.journal() if type(rec) is R.Put and not flag & SNAPSHOT_FLAG
                and rec.key == a.key]
        b.tx.flush_journal()
        b.store.mark_flushed(b.store.flush_log())  # the snapshot's end durable: the floor moves to it
        floor = b.tx.retention_floor()
        assert puts[0] // seg < puts[1] // seg == floor // seg  # the snapshot starts in the segment of PUT 1
        b.store.checkpoint(NOW)
        assert b.store.retention(NOW + 10 * HOUR_MS).deleted_segments
        assert puts[0] < b.store._log.start <= puts[1]  # PUT 0 of a deleted, PUT 1 kept
        b.restart()  # was: CorruptLog "COMMIT of ... lists 2 ids for 1 messages"
        assert b.tx.recover() == [other.key]
    finally:
        if b.store is not None and not b.store._closed:
            b.crash()


def test_a_commit_just_before_a_snapshot_in_its_segment_replays_from_a_log_that_lacks_the_branchs_first_put():
    """The same without steps (older than e2446a7): the COMMIT lies before the snapshot, in the segment it starts
    in, after the branch's second PUT; the first PUT's segment is deleted. The state before the snapshot, which the
    snapshot replaces whole, raises all the same."""
    a = "XID:1:0a:01:q"
    replay = LogReplay()
    replay.apply(100, 0, put(a, b"1"))  # the first record of the log: PUT 0 of a was in a deleted segment
    replay.apply(150, 0, R.Commit(a, 2, 50, True, (7, 8)))
    replay.apply(160, 0, R.Done(a, 3, 170))
    replay.apply(200, SNAPSHOT_FLAG, R.Snapshot(1, 0))
    replay.apply(300, SNAPSHOT_FLAG, R.SnapEnd(0))
    assert replay.snapshot_at == 200 and replay.state.branches == {}


def test_a_break_no_complete_snapshot_replaces_is_raised_at_the_end_of_the_replay():
    """The state in use broke (a COMMIT naming more messages than the branch holds) and no complete snapshot came
    after it: the log is corrupt, and ``finish`` says so, as the replay did before; one a snapshot replaces is not."""
    import pytest
    from metaq.errors import CorruptLog

    a = "XID:1:0a:01:q"
    replay = LogReplay()
    replay.apply(100, 0, put(a, b"1"))
    replay.apply(150, 0, R.Commit(a, 2, 50, True, (7, 8)))
    replay.apply(200, SNAPSHOT_FLAG, R.Snapshot(1, 0))  # a snapshot begun, never ended
    with pytest.raises(CorruptLog, match="lists 2 ids"):
        replay.finish()
    replay.apply(300, SNAPSHOT_FLAG, R.SnapEnd(0))
    replay.finish()  # replaced whole: nothing to raise
