"""One owner of producer state (idempotence/state.py): the producers' table ends the same whether its records
arrive by the append (put_idem one at a time and the burst path), by replication (a slave's apply), by recovery
(a snapshot and the log after it, or a rebuild from the whole log) — and a cut leaves what the log up to it
taught."""

import os
import random

import pytest

from metaq.errors import MetaqError
from metaq.idempotence.burst import scan_idem_burst_py
from metaq.idempotence.state import PREVIOUS_SUFFIX, SNAPSHOT_FILE
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.text import serialize
from tests.harness.store import NOW, open_store

#: Producers idle this long in store time expire: the table's bounds are part of its state.
CONFIG = dict(segment_size=8192, producer_ttl_s=0.15)
STEP_MS = 7


def state(store):
    table = store.idempotence.table
    return table.contents(), table.evicted, table.expired


def message(pid, partition, seq):
    """A resend is the same message: its content follows from its identity."""
    return encode_payload(b"%d/%d/%d" % (pid, partition, seq) * (1 + seq % 5), [None, "a", "b\x02K\x01v\x02"][seq % 3])


def sends(rng, n):
    """``[(pid, partition, seq)]``: next sequences mostly, resends (of stored sequences, and of skipped ones: a
    gap filled), sequences that skip ahead; a few busy producers and some that go idle long enough to expire."""
    nexts, out = {}, []
    for _ in range(n):
        pid = rng.choice([1, 1, 1, 2, 2, 3, 4, 5, 2**62])
        partition = rng.randrange(4)
        key = (pid, partition)
        seq = nexts.get(key, 0)
        roll = rng.random()
        if roll < 0.12 and seq > 2:
            seq = rng.randrange(seq)  # a resend: a duplicate, or a gap's sequence now stored
        else:
            if roll < 0.2:
                seq += rng.randint(1, 3)  # skips ahead (a gap)
            nexts[key] = seq + 1
        out.append((pid, partition, seq))
    return out


def append_one_at_a_time(store, batch, now):
    for i, (pid, partition, seq) in enumerate(batch):
        flag, data = message(pid, partition, seq)
        store.put_idempotent("test", partition, flag, data, now + i * STEP_MS, pid, seq)
        if i % 5 == 0:
            store.put("test", partition, 0, b"plain", now + i * STEP_MS)  # records without an identity between


def append_as_burst(store, batch, now):
    """As the broker's burst path does: runs of one producer's next sequences in one step, the others alone."""
    buf = b"".join(serialize(IdempotentPut("test", partition, *message(pid, partition, seq), k,
                                           metaq_checksum(message(pid, partition, seq)[1]), pid, seq))
                   for k, (pid, partition, seq) in enumerate(batch))
    frames, data, stop = scan_idem_burst_py(buf, 0, len(buf), 1 << 20, 1024)
    assert stop == len(buf)
    i = 0
    while i < len(frames):
        j = i + 1
        while (j < len(frames) and frames[j][:2] == frames[i][:2] and frames[j][8] == frames[i][8]
               and frames[j][9] == frames[i][9] + j - i):
            j += 1
        taken, _runs = store.put_idempotent_run(frames[i:j], data, now)
        if taken:
            i += taken
            continue
        f = frames[i]
        i += 1
        try:
            store.put_idempotent_prepared("test", f[1], f[2], data[f[4]:f[4] + f[5]], now, f[8], f[9],
                                          f[6] & 0x7FFFFFFF)
        except MetaqError:
            pass  # a partition that does not exist: nothing stored, as on the general path


def replicate(master, slave):
    pos = slave.written_position
    while True:
        data, _next = master.read_log(pos, 3000)
        if not len(data):
            return
        pos = slave.append_replicated(pos, data, NOW)


def flush(store):
    store.mark_flushed(store.flush_log())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_append_replication_and_recovery_give_the_same_producer_state(tmp_path, seed):
    rng = random.Random(seed)
    master = open_store(tmp_path / "m", **CONFIG)
    now = NOW
    for k in range(8):  # batches, one at a time and as bursts, spread over time (producers expire)
        batch = sends(rng, 40)
        (append_one_at_a_time if k % 2 else append_as_burst)(master, batch, now)
        now += 40 * STEP_MS
        if k == 3:  # a snapshot covers the first half; the rest is in the log only
            flush(master)
            master.checkpoint(now)
            cut_at, at_cut = master.written_position, state(master)
    flush(master)
    appended = state(master)
    assert appended[0] and appended[2] > 0  # producers kept, and some expired

    slave = open_store(tmp_path / "s", **CONFIG)
    replicate(master, slave)
    assert state(slave) == appended

    master.abandon()  # kill -9: the open reads the snapshot, then replays the log after it
    master = open_store(tmp_path / "m", **CONFIG)
    assert master.idempotence.rebuilds == 0 and state(master) == appended
    master.close(now)
    for name in (SNAPSHOT_FILE, SNAPSHOT_FILE + PREVIOUS_SUFFIX):
        os.unlink(tmp_path / "m" / name)
    master = open_store(tmp_path / "m", **CONFIG)  # no snapshot: a rebuild from the whole log
    assert master.idempotence.rebuilds == 1 and state(master) == appended

    slave.truncate_log(cut_at, now)  # a cut: what the log up to it taught, nothing after
    assert state(slave) == at_cut
    for s in (master, slave):
        s.close(now)
