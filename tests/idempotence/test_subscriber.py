"""The idempotent producers' state as a subscriber of the log follower (store/follower.py): it learns what the log
holds once, whether the records come from the master's own puts, a replicated chunk, an open after a crash or a
rebuild; a cut rewinds it once; a damaged snapshot makes it learn the log again."""

import os

from metaq.idempotence.state import PREVIOUS_SUFFIX, SNAPSHOT_FILE
from metaq.idempotence.window import snapshot_position
from metaq.protocol.message import encode_payload
from tests.harness.store import NOW, open_store

PID = 77


def put(store, seq, pid=PID, partition=0):
    flag, data = encode_payload(b"m%d-%d" % (pid, seq), "k=v")
    r, _pos, dup = store.put_idempotent("test", partition, flag, data, NOW + seq, pid, seq)
    return r, dup


def fill(store, seqs, plain_every=3):
    """Idempotent puts of ``seqs`` (two producers, two partitions), plain puts between them."""
    for seq in seqs:
        put(store, seq, pid=PID + seq % 2, partition=seq % 2)
        if seq % plain_every == 0:
            store.put("test", 2, 0, b"plain %d" % seq, NOW + seq)


def state(store):
    table = store.idempotence.table
    return table.contents(), table.evicted, table.expired


def flush(store):
    store.mark_flushed(store.flush_log())


def replicate(master, slave):
    flush(master)  # a master sends what is durable
    pos = slave.written_position
    while True:
        data, _next = master.read_log(pos, 1500)
        if not len(data):
            return
        pos = slave.append_replicated(pos, data, NOW)


def spy(store, name):
    """Record every call of ``store.idempotence.<name>`` (the follower calls it through the instance)."""
    calls, real = [], getattr(store.idempotence, name)

    def recorded(*args):
        calls.append(args)
        return real(*args)

    setattr(store.idempotence, name, recorded)
    return calls


def covered(store):
    """The positions the snapshots on disk cover (the current one first; None for a missing one)."""
    out = []
    for name in (SNAPSHOT_FILE, SNAPSHOT_FILE + PREVIOUS_SUFFIX):
        path = os.path.join(store.dirs.root, name)
        out.append(snapshot_position(open(path, "rb").read()) if os.path.exists(path) else None)
    return out


def test_the_masters_own_records_are_never_handed_over_again(tmp_path):
    s = open_store(tmp_path / "d")
    learned = spy(s, "learn")
    fill(s, range(12))
    assert s.idempotence.position == s.written_position  # recorded by the put itself
    flush(s)
    s.follow_log(None)
    assert learned == []  # nothing past its position: the key index alone was stepped
    generation = s.idempotence.table.generation
    s.put("test", 1, 0, b"plain", NOW)
    s.follow_log(None)
    assert learned == [] and s.idempotence.position == s.written_position  # a plain put: passed, not even searched
    assert s.idempotence.table.generation == generation  # no change: no snapshot due for it
    s.close(NOW)


def test_a_step_for_idempotence_alone_leaves_the_other_subscribers(tmp_path):
    s = open_store(tmp_path / "d")
    fill(s, range(4))
    flush(s)
    s.follow_log(None)
    keys_at = s.keys.position
    s.put("test", 1, 0, b"plain", NOW)
    flush(s)
    s.follower.step(s.flushed_position, s.written_position, only=s.idempotence)
    assert s.idempotence.position == s.written_position and s.keys.position == keys_at
    s.follow_log(None)
    assert s.keys.position == s.flushed_position
    s.close(NOW)


def test_state_after_open_equals_state_after_append(tmp_path):
    s = open_store(tmp_path / "d", segment_size=8192)
    fill(s, range(0, 40))
    flush(s)
    s.checkpoint(NOW)  # a snapshot covers the first part; the rest is in the log only
    fill(s, range(40, 90))
    flush(s)
    appended = state(s)
    s.abandon()  # kill -9
    s = open_store(tmp_path / "d", segment_size=8192)
    assert state(s) == appended and s.idempotence.rebuilds == 0
    assert s.idempotence.position == s.written_position
    s.idempotence.rebuild(0)  # learn it all again in small steps, records and marks cut by the step's bound
    steps = 0
    while s.follow_log(700):
        steps += 1
    assert steps > 10 and state(s) == appended
    s.close(NOW)


def test_a_damaged_snapshot_rebuilds_from_the_log(tmp_path, caplog):
    s = open_store(tmp_path / "d")
    fill(s, range(20))
    appended = state(s)
    s.close(NOW)
    for name in (SNAPSHOT_FILE, SNAPSHOT_FILE + PREVIOUS_SUFFIX):
        path = tmp_path / "d" / name
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    s = open_store(tmp_path / "d")
    assert "unusable" in caplog.text and "rebuilt from the log" in caplog.text
    assert s.idempotence.rebuilds == 1 and state(s) == appended
    assert s.idempotence.position == s.written_position
    assert covered(s) == [s.written_position, None]  # the damaged ones deleted; the open's checkpoint wrote one
    assert put(s, 18, pid=PID, partition=0)[1] is True  # a resend is still a duplicate
    s.close(NOW)


def test_a_cut_rewinds_producer_state_exactly_once(tmp_path):
    master, slave = open_store(tmp_path / "m"), open_store(tmp_path / "s")
    fill(master, range(8))
    replicate(master, slave)
    slave.checkpoint(NOW)
    early = slave.written_position  # a snapshot covers up to here
    ends = [put(master, seq)[0].log_end for seq in range(8, 16)]
    cut_at = ends[3]  # after sequence 11
    replicate(master, slave)
    slave.checkpoint(NOW)  # a snapshot past the cut
    assert covered(slave) == [slave.written_position, early]
    assert state(slave) == state(master) and slave.idempotence.position == slave.written_position

    reference = open_store(tmp_path / "r")  # what the log up to the cut teaches
    pos = 0
    while pos < cut_at:
        data, _next = master.read_log(pos, min(1500, cut_at - pos))
        pos = reference.append_replicated(pos, data, NOW)
    at_cut = state(reference)

    cuts, learned = spy(slave, "cut"), spy(slave, "learn")
    slave.truncate_log(cut_at, NOW)
    assert cuts == [(cut_at,)]  # once
    assert state(slave) == at_cut and slave.idempotence.table.highest(PID, "test", 0) == 11
    assert slave.idempotence.position == slave.written_position == cut_at  # current at once
    assert learned and learned[0][1] + learned[0][2] == early  # learned again from the snapshot left
    assert covered(slave)[0] == cut_at  # the one past the cut deleted, the truncation's checkpoint wrote one
    del learned[:]
    slave.follow_log(None)
    assert learned == []  # nothing handed over twice
    replicate(master, slave)  # the master's tail again
    assert state(slave) == state(master) and cuts == [(cut_at,)]
    for s in (master, slave, reference):
        s.close(NOW)
