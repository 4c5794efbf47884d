"""Idempotent puts in the store (idempotence/state.py): dedup, restarts, kill -9, replication, cuts, snapshots."""

import os
import random

import pytest

from metaq import errors

from metaq.errors import ClientError
from metaq.idempotence.records import identity_in_attribute
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.properties import split_attribute
from metaq.idempotence.state import SNAPSHOT_FILE
from metaq.idempotence.window import ProducerTable

from tests.harness.store import NOW, open_store, read_all

PID = 424242


def flush(store):
    store.mark_flushed(store.flush_log())


def put(store, seq, body=None, pid=PID, partition=0, attribute=None, now=NOW):
    flag, data = encode_payload(body if body is not None else b"m%d" % seq, attribute)
    r, _pos, dup = store.put_idempotent("test", partition, flag, data, now + seq, pid, seq)
    return r, dup


def stored(store, partition=0):
    """``[(attribute the user sees, payload, (pid, seq))]`` of the partition, as a client decodes them."""
    out = []
    for form in read_all(store, "test", partition):
        flag = int.from_bytes(form[16:20], "big")
        attribute, payload = decode_payload(flag, form[20:])
        tags, _props, _remote = split_attribute(attribute)
        out.append((tags, payload, identity_in_attribute(attribute)))
    return out


def test_duplicate_is_not_stored_and_answers_the_original(tmp_path):
    s = open_store(tmp_path / "d")
    r0, dup0 = put(s, 0, attribute="color=red")
    r1, dup1 = put(s, 1)
    again, dup = put(s, 0, attribute="color=red")  # the same message again
    assert (dup0, dup1, dup) == (False, False, True)
    assert (again.msg_id, again.offset, again.log_end) == (r0.msg_id, r0.offset, r0.log_end)
    assert stored(s) == [("color=red", b"m0", (PID, 0)), (None, b"m1", (PID, 1))]
    assert s.idempotence.duplicates == 1 and s.idempotence.puts == 2
    s.close(NOW)


def test_a_resend_from_sequence_zero_past_the_window_stores_nothing_twice(tmp_path):
    """A retried Spark task sends its rows again from sequence 0: every one below the window is a duplicate."""
    s = open_store(tmp_path / "d")
    window = s.idempotence.table.window
    for seq in range(window + 1):
        put(s, seq, body=b"")
    end = s.written_position
    results = [put(s, seq, body=b"") for seq in range(window + 1)]
    assert s.written_position == end and s.idempotence.older_duplicates == 1
    assert all(r[-1] is True for r in results) and results[0][0].offset == -1 and results[1][0].offset == 1
    s.close(NOW)


@pytest.mark.parametrize("pid, seq", [(0, 0), (-1, 0), (2**63, 0), (1, -1), (1, 2**63), ("1", 0), (1, 0.0),
                                      (True, 0)])
def test_bad_identity_is_refused(tmp_path, pid, seq):
    s = open_store(tmp_path / "d")
    with pytest.raises(ClientError):
        s.put_idempotent("test", 0, 0, b"x", NOW, pid, seq)
    assert s.written_position == 0
    s.close(NOW)


def test_reserved_properties_in_the_attribute_are_refused(tmp_path):
    s = open_store(tmp_path / "d")
    with pytest.raises(ClientError, match="METAQ_PID"):
        put(s, 0, attribute="t\x02METAQ_PID\x015\x02")
    assert s.written_position == 0
    s.close(NOW)


def test_clean_restart_keeps_the_window(tmp_path):
    s = open_store(tmp_path / "d")
    first = [put(s, seq)[0] for seq in range(10)]
    s.close(NOW)
    assert os.path.exists(tmp_path / "d" / SNAPSHOT_FILE)
    s = open_store(tmp_path / "d")
    r, dup = put(s, 3)
    assert dup and r.offset == first[3].offset and r.msg_id == first[3].msg_id
    assert len(stored(s)) == 10
    s.close(NOW)


def test_kill_with_the_snapshot_older_than_the_records(tmp_path):
    s = open_store(tmp_path / "d")
    for seq in range(5):
        put(s, seq)
    flush(s)
    s.checkpoint(NOW)  # snapshot covers seq 0..4
    late = [put(s, seq)[0] for seq in range(5, 9)]
    flush(s)
    s.abandon()  # kill -9: the records after the snapshot are in the log only
    s = open_store(tmp_path / "d")
    r, dup = put(s, 7)
    assert dup and r.offset == late[2].offset
    assert put(s, 9)[1] is False
    assert len(stored(s)) == 10
    s.close(NOW)


def test_corrupt_snapshots_rebuild_from_the_log(tmp_path, caplog):
    s = open_store(tmp_path / "d")
    for seq in range(6):
        put(s, seq)
    s.close(NOW)
    root = tmp_path / "d"
    for name in (SNAPSHOT_FILE, SNAPSHOT_FILE + ".prev"):
        if (root / name).exists():
            data = bytearray((root / name).read_bytes())
            data[-1] ^= 0xFF
            (root / name).write_bytes(bytes(data))
    s = open_store(root)
    assert "unusable" in caplog.text
    assert s.idempotence.rebuilds == 1
    assert put(s, 4)[1] is True and put(s, 6)[1] is False
    s.close(NOW)


def test_snapshot_past_the_recovered_end_is_not_used(tmp_path):
    s = open_store(tmp_path / "d")
    for seq in range(3):
        put(s, seq)
    flush(s)
    s.checkpoint(NOW)
    good_end = s.written_position
    put(s, 3)
    flush(s)
    s.checkpoint(NOW)  # this snapshot covers seq 3 ...
    s.abandon()
    seg = sorted(os.listdir(tmp_path / "d" / "commitlog"))[-1]
    with open(tmp_path / "d" / "commitlog" / seg, "r+b") as f:  # ... whose record a disk then lost
        f.seek(good_end % 4096)
        f.write(b"\0" * 64)
    with pytest.raises(errors.CorruptLog, match="below the checkpoint position"):
        open_store(tmp_path / "d")  # it was on disk before: not a torn tail, refused unless forced
    s = open_store(tmp_path / "d", force_recovery=True)
    assert s.written_position == good_end
    assert put(s, 3)[1] is False  # stored (again): the log no longer holds it
    assert put(s, 2)[1] is True
    s.close(NOW)


def test_rebuild_equals_incremental(tmp_path):
    rng = random.Random(5)
    s = open_store(tmp_path / "d", segment_size=8192)
    seqs = {}
    for i in range(600):
        pid = rng.choice([1, 2, 3, 2**62])
        part = rng.randrange(4)
        if rng.random() < 0.3:
            s.put("test", part, 0, b"plain", NOW + i)
            continue
        seq = seqs.get((pid, part), 0)
        if rng.random() < 0.1 and seq > 3:
            seq -= rng.randint(1, 3)  # a resend
        else:
            seqs[(pid, part)] = seq + 1
        # a resend is the same message: its content follows from (pid, partition, seq)
        flag, data = encode_payload(b"x" * ((pid + 7 * part + seq) % 300), [None, "a", "b\x02K\x01v\x02"][seq % 3])
        s.put_idempotent("test", part, flag, data, NOW + i, pid, seq)
    incremental = s.idempotence.table
    rebuilt = ProducerTable()
    s.idempotence.table = rebuilt
    s.idempotence.rebuild(0)  # the follower hands the whole log over again
    s.follow_log(None)
    assert rebuilt.equal_to(incremental) and len(rebuilt) == len(incremental) > 0
    s.close(NOW)


def _replicate(master, slave):
    pos = slave.written_position
    while True:
        data, nxt = master.read_log(pos, 3000)
        if not len(data):
            return
        pos = slave.append_replicated(pos, data, NOW)


def test_slave_learns_from_replicated_records_and_a_cut_forgets(tmp_path):
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    for seq in range(4):
        put(master, seq)
    flush(master)
    _replicate(master, slave)
    cut_at = slave.written_position
    for seq in range(4, 8):
        put(master, seq)
    flush(master)
    _replicate(master, slave)
    assert slave.idempotence.table.equal_to(master.idempotence.table)
    r, dup = put(slave, 6)  # as a promoted slave would answer the resend
    assert dup and r.offset == 6
    slave.truncate_log(cut_at, NOW)  # a divergent tail cut at the handshake
    assert slave.idempotence.table.highest(PID, "test", 0) == 3
    assert put(slave, 6)[1] is False
    slave.close(NOW)
    slave = open_store(tmp_path / "s")
    assert slave.idempotence.table.highest(PID, "test", 0) == 6
    master.close(NOW)
    slave.close(NOW)


def test_a_snapshot_is_written_when_the_table_changed_or_the_log_grew(tmp_path, monkeypatch):
    import metaq.idempotence.state as idem_module

    monkeypatch.setattr(idem_module, "IDEMPOTENCE_SNAPSHOT_BYTES", 4096)
    s = open_store(tmp_path / "d", segment_size=1 << 16)
    assert s.idempotence.save() is False  # open wrote one; nothing changed since
    put(s, 0)
    assert s.idempotence.save() is True
    assert s.idempotence.save() is False
    s.put("test", 1, 0, b"x" * 2000, NOW)
    s.follow_log(None)  # the follower hands the records over (the broker: after each flush round)
    assert s.idempotence.save() is False  # the log grew less than the limit
    s.put("test", 1, 0, b"x" * 2000, NOW)
    s.follow_log(None)
    assert s.idempotence.save() is True  # one past it
    s.close(NOW)


def test_producer_ttl_setting(tmp_path):
    from metaq.errors import ConfigError
    from metaq.server.config import load_config

    with pytest.raises(ConfigError, match="producer_ttl_s"):
        open_store(tmp_path / "d", producer_ttl_s=0)
    s = open_store(tmp_path / "d", producer_ttl_s=1.5)
    assert s.idempotence.table.ttl_ms == 1500
    s.close(NOW)
    with pytest.raises(ConfigError, match="producer_ttl_s"):
        load_config(None, {"store": {"producer_ttl_s": -1.0}})
    assert load_config(None, {"store": {"producer_ttl_s": 60.0}}).store_config().producer_ttl_s == 60.0


def test_the_copy_captured_before_a_checkpoint_is_what_it_writes(tmp_path):
    """The flusher captures the table on the loop, then checkpoints in a worker while puts go on."""
    s = open_store(tmp_path / "d")
    for seq in range(3):
        put(s, seq)
    s.prepare_checkpoint()
    captured_at = s.written_position
    put(s, 3)  # after the capture, before the worker writes
    flush(s)
    s.checkpoint(NOW)
    u = ProducerTable()
    assert u.load((tmp_path / "d" / SNAPSHOT_FILE).read_bytes()) == captured_at
    assert u.highest(PID, "test", 0) == 2
    s.abandon()
    s = open_store(tmp_path / "d")  # the replay from the snapshot's position brings seq 3 back
    assert s.idempotence.table.highest(PID, "test", 0) == 3 and put(s, 3)[1] is True
    s.close(NOW)


def test_a_resend_with_other_content_under_a_stored_sequence_is_refused_not_taken_for_a_duplicate(tmp_path):
    """A Spark task whose rows came in another order would otherwise lose the rows it took for duplicates."""
    s = open_store(tmp_path / "d")
    put(s, 0, body=b"first")
    end = s.written_position
    from metaq.errors import ClientError

    with pytest.raises(ClientError, match="sequence 0 of producer .* was stored at offset 0 with other content"):
        put(s, 0, body=b"second")
    assert s.written_position == end and s.idempotence.different == 1
    assert put(s, 0, body=b"first")[1] is True  # the same message is still a duplicate
    s.close(NOW)
