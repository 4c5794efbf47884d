"""Who began a transaction branch: the optional owner at the end of PREPARE, COMMIT and HEURISTIC records,
read from journals written before owners existed, kept across restarts and checkpoints, bounded."""

import os

import pytest

from metaq import limits
from metaq.errors import TransactionError
from metaq.protocol.checksum import crc32
from metaq.transactions.wire import XA_HEURCOM, XA_OK, XAER_INVAL
from metaq.transactions import records as R
from metaq.transactions.config import TxConfig
from metaq.transactions.journal import Journal, journal_path
from metaq.transactions.state import EVERYONE, HALF_OWNER, half_txid
from tests.harness.store import NOW
from tests.harness.tx import TxBroker, body, fill, local, xid

KEY = "XID:1:6162:63:uq"
#: Records as the broker wrote them before owners existed (bytes taken from that version's encoder).
OLD_PREPARE = bytes.fromhex("02000000000000000500000000000000040000003c00105849443a313a363136323a36333a7571")
OLD_HEURISTIC = bytes.fromhex("0600000000000000090100105849443a313a363136323a36333a7571")
OLD_COMMIT = bytes.fromhex("0300000000000000060000010000000000000000000200105849443a313a363136323a36333a7571"
                           "00000000000000010000000000000002")


def test_records_without_an_owner_decode_as_before():
    assert R.decode(OLD_PREPARE) == R.Prepare(KEY, 5, 4, 60, None)
    assert R.decode(OLD_HEURISTIC) == R.Heuristic(KEY, 9, True, None)
    assert R.decode(OLD_COMMIT) == R.Commit(KEY, 6, 1 << 40, False, (1, 2), None)
    # and a record with no owner is still written byte for byte as before (an older broker reads it)
    assert b"".join(R.encode(R.Prepare(KEY, 5, 4, 60))) == OLD_PREPARE
    assert b"".join(R.encode(R.Heuristic(KEY, 9, True))) == OLD_HEURISTIC
    assert b"".join(R.encode(R.Commit(KEY, 6, 1 << 40, False, (1, 2)))) == OLD_COMMIT


@pytest.mark.parametrize("rec", [R.Prepare(KEY, 5, 4, 60, "alice"), R.Commit(KEY, 6, 7, True, (3,), "b@x.org"),
                                 R.Heuristic(KEY, 9, False, "u" * limits.MAX_TX_OWNER_BYTES)])
def test_owner_round_trips_through_a_journal(tmp_path, rec):
    payload = b"".join(R.encode(rec))
    assert R.decode(payload) == rec and payload.endswith(rec.owner.encode())
    j, _r, _rep = Journal.open(str(tmp_path), 1 << 20)
    j.append(rec)
    j.close()
    j, recs, _rep = Journal.open(str(tmp_path), 1 << 20)
    assert recs == [rec]
    j.close()


def test_owner_length_is_bounded_both_ways():
    too_long = "u" * (limits.MAX_TX_OWNER_BYTES + 1)
    with pytest.raises(R.RecordError, match="owner of 129 bytes"):
        R.encode(R.Prepare(KEY, 1, 2, 3, too_long))
    with pytest.raises(R.RecordError, match="owner of 0 bytes"):
        R.encode(R.Heuristic(KEY, 1, True, ""))
    with pytest.raises(R.RecordError, match="exceeds its limit 128"):
        R.decode(OLD_PREPARE + R.STR.pack(len(too_long)) + too_long.encode())
    with pytest.raises(R.RecordError, match="empty owner"):
        R.decode(OLD_HEURISTIC + R.STR.pack(0))
    with pytest.raises(R.RecordError, match="ends inside a field"):
        R.decode(OLD_PREPARE + R.STR.pack(5) + b"ali")
    with pytest.raises(R.RecordError, match="stray bytes"):
        R.decode(OLD_PREPARE + R.STR.pack(5) + b"alice" + b"!")
    with pytest.raises(R.RecordError, match="not UTF-8"):
        R.decode(OLD_PREPARE + R.STR.pack(2) + b"\xff\xfe")


def journal_records(b):
    """Every record of the journal of ``b`` (read from the log as recovery reads them)."""
    return [rec for _pos, _flag, rec in b.journal()]


def _frame(payload):
    return R.HEADER.pack(len(payload), crc32(payload)) + payload


def test_an_old_journal_recovers_its_prepared_branch_without_owner(tmp_path):
    """A journal written before owners: the prepared branch comes back, owned by nobody (an admin's to decide)."""
    tx_dir = tmp_path / "data" / "transactions"
    os.makedirs(tx_dir)
    put = b"".join(R.encode(R.Put(KEY, "test", 0, 0, -1, b"from an old broker")))
    with open(journal_path(str(tx_dir), 1), "wb") as f:
        f.write(_frame(put) + _frame(OLD_PREPARE))
    b = TxBroker(tmp_path / "data")
    try:
        assert (b.tx.recovery.prepared_kept, b.tx.recovery.anomalies) == (1, 0)
        assert b.tx.user_of(KEY) == (True, None)
        assert b.tx.recover() == [KEY] and b.tx.recover(user="alice") == [] and b.tx.recover(user=None) == [KEY]
        assert [(i.key, i.state, i.user) for i in b.tx.in_doubt()] == [(KEY, "prepared", None)]
        b.commit(KEY, one_phase=False)
        assert b.messages("test", 0) == [b"from an old broker"]
    finally:
        b.crash()


def test_owner_survives_restart_and_heuristic(tx_broker):
    b = tx_broker
    mine, theirs, local_one = xid(1), xid(2), local(1)
    b.tx.begin(mine, None, 0, NOW, user="alice")
    b.tx.begin(theirs, None, 0, NOW, user="bob")
    b.tx.begin(local_one, "conn-1", 0, NOW, user="alice")
    fill(b, mine, None, 2)
    fill(b, theirs, None, 1)
    fill(b, local_one, "conn-1", 1)
    assert b.tx.prepare(mine, None, NOW) == XA_OK and b.tx.prepare(theirs, None, NOW) == XA_OK
    assert b.tx.user_of(local_one) == (True, "alice") and b.tx.user_of(xid(9)) == (False, None)
    assert b.tx.recover(user="alice") == [mine.key] and b.tx.recover(user="bob") == [theirs.key]
    b.tx.flush_journal()
    b.restart()
    assert b.tx.user_of(mine) == (True, "alice") and b.tx.user_of(theirs) == (True, "bob")
    assert b.tx.user_of(local_one) == (False, None)  # unprepared: rolled back by the restart
    assert b.tx.recover(user="alice") == [mine.key] and b.tx.recover(user=EVERYONE) == sorted([mine.key, theirs.key])
    assert {i.key: i.user for i in b.tx.in_doubt()} == {mine.key: "alice", theirs.key: "bob"}

    # an operator's decision keeps the owner: the outcome is still bob's (to forget) after a restart
    plan = b.tx.heuristic(theirs.key, True, NOW)
    b.tx.flush_journal()
    b.tx.apply_commit(plan, NOW)
    b.restart()
    assert b.tx.user_of(theirs) == (True, "bob") and b.tx.recover(user="bob") == [theirs.key]
    assert b.tx.recover(user="alice") == [mine.key]
    with pytest.raises(TransactionError) as info:
        b.commit(theirs, one_phase=False)
    assert info.value.xa_code == XA_HEURCOM
    b.tx.forget(theirs, NOW)
    assert b.tx.user_of(theirs) == (True, "bob")  # its commit is remembered a while: still bob's to ask about
    b.commit(mine, one_phase=False)
    assert sorted(b.messages("test", 0) + b.messages("test", 1)) == sorted(
        [body(mine, 0), body(mine, 1), body(theirs, 0)])


def test_a_one_phase_commit_left_incomplete_keeps_its_owner_in_commit(tx_broker):
    """COMMIT carries the owner: a commit recovery finishes is not left ownerless (it never saw a PREPARE)."""
    b = tx_broker
    x = xid(3)
    b.tx.begin(x, None, 0, NOW, user="alice")
    fill(b, x, None, 1)
    b.tx.commit(x, None, True, NOW)  # COMMIT journaled, then the crash before anything is appended
    b.tx.flush_journal()
    assert [(type(r).__name__, r.owner) for r in journal_records(b) if type(r) is not R.Put] == [("Commit", "alice")]
    b.crash()
    b.open()
    assert b.tx.recovery.commits_completed == 1 and b.messages("test", 0) == [body(x, 0)]


def test_a_checkpoint_keeps_the_owners(tmp_path):
    """``maintain`` writes the live branches again as a snapshot: owners included."""
    b = TxBroker(tmp_path / "data", tx=TxConfig(journal_file_size=1024))
    try:
        kept, decided = xid(1), xid(2)
        for x, user in ((kept, "alice"), (decided, "bob")):
            b.tx.begin(x, None, 0, NOW, user=user)
            fill(b, x, None, 3, 100)
            b.tx.prepare(x, None, NOW)
        b.tx.heuristic(decided.key, False, NOW)
        for n in range(1, 9):  # local commits roll the journal past its first files
            b.tx.begin(local(n), "c1", 0, NOW, user="carol")
            fill(b, local(n), "c1", 2, 100)
            b.commit(local(n), "c1")
        b.tx.flush_journal()
        before = b.tx.retention_floor()
        b.tx.maintain(NOW)  # a snapshot of the live branches at the log end
        b.tx.flush_journal()
        assert b.tx.retention_floor() > before
        b.restart()
        assert b.tx.user_of(kept) == (True, "alice") and b.tx.user_of(decided) == (True, "bob")
        assert b.tx.recover(user="bob") == [decided.key] and b.tx.recover(user="carol") == []
    finally:
        b.crash()


def test_begin_refuses_an_owner_name_past_the_limit(tx_broker):
    with pytest.raises(TransactionError) as info:
        tx_broker.tx.begin(xid(1), None, 0, NOW, user="u" * (limits.MAX_TX_OWNER_BYTES + 1))
    assert info.value.xa_code == XAER_INVAL and "1 to 128 bytes" in str(info.value)
    assert tx_broker.tx.user_of(xid(1)) == (False, None)


def held(b):
    """``{user: live branches}`` as the transactions quota reads it, checked against the admin's view of them."""
    live = {}
    for info in b.tx.in_doubt():
        if info.state in ("active", "prepared", "committing") and info.user is not None:
            live[info.user] = live.get(info.user, 0) + 1
    assert b.tx.by_user() == live
    assert {u: b.tx.held_by(u) for u in ("alice", "bob", "carol")} == {u: live.get(u, 0)
                                                                       for u in ("alice", "bob", "carol")}
    return live


def test_the_branches_a_user_holds_are_counted_through_every_end_and_replay(tx_broker):
    """``held_by`` (each BEGIN's quota check) follows begin, prepare, commit, rollback, a closed connection, a
    read-only end, a half message, a heuristic decision, a restart, a demotion and a promotion."""
    b = tx_broker
    committed, rolled, read_only, prepared_one = xid(1), xid(2), xid(3), xid(4)
    for x, user in ((committed, "alice"), (rolled, "alice"), (read_only, "alice"), (prepared_one, "bob")):
        b.tx.begin(x, None, 0, NOW, user=user)
    b.tx.begin(local(1), "conn-1", 0, NOW, user="alice")
    for x in (committed, rolled, prepared_one):
        fill(b, x, None, 1)
    fill(b, local(1), "conn-1", 1)
    b.tx.put_half(7, "test", 2, 0, b"half", "PG", "T7", -1, 10, NOW, "bob")
    assert held(b) == {"alice": 4, "bob": 2}
    assert b.tx.prepare(committed, None, NOW) == XA_OK and b.tx.prepare(prepared_one, None, NOW) == XA_OK
    assert held(b) == {"alice": 4, "bob": 2}  # prepared branches are held as open ones are
    b.commit(committed, one_phase=False)
    b.tx.rollback(rolled, None, NOW)
    b.tx.prepare(read_only, None, NOW)  # no puts: ended read-only
    assert held(b) == {"alice": 1, "bob": 2}
    b.tx.owner_closed("conn-1", NOW)
    assert held(b) == {"bob": 2}
    b.tx.begin(xid(5), None, 0, NOW, user="carol")
    fill(b, xid(5), None, 1)  # never prepared: the restart rolls it back
    assert held(b) == {"bob": 2, "carol": 1}
    b.tx.flush_journal()
    b.restart()  # replay: the prepared branch and the half message are bob's still
    assert held(b) == {"bob": 2}
    b.tx.heuristic(prepared_one.key, False, NOW)
    assert held(b) == {"bob": 1}
    b.tx.follow_master()  # a slave: its branches are the master's (in its replica state), none held here
    assert held(b) == {}
    b.tx.take_over(NOW)  # promoted: the half message is bob's again
    assert held(b) == {"bob": 1}
    b.tx.commit(half_txid(7), HALF_OWNER, False, NOW)
    assert held(b) == {"bob": 1}  # committing is still held, until its messages are in
    b.commit(half_txid(7), HALF_OWNER, one_phase=False)
    assert held(b) == {}
