"""The epoch history (store/epochs.py): persistence, trimming, origins, and where two logs agree."""

import os

import pytest

from metaq.store import epochs as ep
from metaq.store.epochs import EPOCHS_MAGIC, EpochHistory, agreed_position
from metaq.store.files import DataDir

from tests.harness.store import NOW, open_store
from tests.harness.tmpfs import fill, tmpfs

ROOT = (0, 0, 0)


def history(tmp_path, log_end=0):
    dirs = DataDir(str(tmp_path))
    dirs.create()
    return EpochHistory(dirs).load(log_end)


def shape(entries):
    """The entries without their random origins."""
    return [(e, s) for e, s, _o in entries]


def test_fresh_broker_is_the_root_and_the_file_is_written(tmp_path):
    h = history(tmp_path)
    assert h.entries == [ROOT] and h.epoch == 0 and not h.found and not h.led
    again = history(tmp_path)
    assert again.found and again.entries == [ROOT]


def test_begin_persists_and_numbers_are_never_reused(tmp_path):
    h = history(tmp_path)
    assert h.begin(100) == 1 and h.led
    assert h.begin(250) == 2
    entries = history(tmp_path, 300).entries
    assert shape(entries) == [(0, 0), (1, 100), (2, 250)] and entries == h.entries
    h = history(tmp_path, 200)  # the log lost its end (say a power loss): epoch 2 is forgotten ...
    assert shape(h.entries) == [(0, 0), (1, 100)]
    assert h.begin(200) == 3  # ... but its number is not handed out again
    h.truncate(50)
    assert h.entries == [ROOT] and history(tmp_path, 50).entries == [ROOT]


def test_every_begun_epoch_has_its_own_origin(tmp_path):
    """Two brokers that begin "the same" epoch (number and start) still hold different entries."""
    a, b = history(tmp_path / "a"), history(tmp_path / "b")
    assert a.begin(0) == b.begin(0) == 1
    assert a.latest[:2] == b.latest[:2] == (1, 0)
    assert a.latest[2] != b.latest[2] and a.latest[2] > 0 and b.latest[2] > 0
    origins = {ep.new_origin() for _ in range(2000)}
    assert len(origins) == 2000 and min(origins) > 0 and max(origins) < 2 ** 63


def test_begin_with_a_number_assigned_elsewhere(tmp_path):
    h = history(tmp_path)
    assert h.begin(0, epoch=7) == 7 and h.max_epoch == 7
    with pytest.raises(ValueError, match="not above"):
        h.begin(10, epoch=7)  # a number this broker has already seen
    assert h.begin(10) == 8


def test_an_epoch_begun_at_the_same_position_replaces_an_empty_one(tmp_path):
    h = history(tmp_path)
    h.begin(100)
    h.begin(100)  # promoted twice without a write in between
    assert shape(h.entries) == [(0, 0), (2, 100)]


def test_a_damaged_file_counts_as_fresh(tmp_path):
    h = history(tmp_path)
    h.begin(10)
    with open(str(tmp_path / "epochs"), "r+b") as f:
        f.seek(14)
        f.write(b"X")
    assert history(tmp_path, 10).entries == [ROOT]


def test_a_file_from_before_origins_loads_with_origin_0(tmp_path):
    dirs = DataDir(str(tmp_path))
    dirs.create()
    dirs.write_state(dirs.epochs, EPOCHS_MAGIC, {"epochs": [[0, 0], [1, 100]], "max_epoch": 1, "led": True})
    h = EpochHistory(dirs).load(200)
    assert h.found and h.entries == [ROOT, (1, 100, 0)] and h.led
    assert h.begin(200) == 2 and h.latest[2] != 0
    stored = dirs.read_state(dirs.epochs, EPOCHS_MAGIC)
    assert stored["epochs"][:2] == [[0, 0, 0], [1, 100, 0]] and stored["epochs"][2][:2] == [2, 200]


def test_adopt_and_learn(tmp_path):
    h = history(tmp_path)
    h.begin(100)  # our own epoch, which the new master never saw
    later = h.adopt([ROOT, (2, 80, 11), (4, 300, 12)], 120)
    assert h.entries == [ROOT, (2, 80, 11)] and later == [(4, 300, 12)] and not h.led and h.max_epoch == 4
    h.learn((4, 300, 12))
    assert h.entries == [ROOT, (2, 80, 11), (4, 300, 12)]
    with pytest.raises(ValueError):
        h.learn((3, 400, 13))
    assert history(tmp_path, 400).entries == [ROOT, (2, 80, 11), (4, 300, 12)]


@pytest.mark.parametrize("master, master_end, slave, slave_end, agreed", [
    ([(1, 0, 9)], 500, [(1, 0, 9)], 300, 300),  # a slave behind
    ([(1, 0, 9)], 300, [(1, 0, 9)], 500, 300),  # a slave ahead (the master lost a tail): cut to the master's end
    ([(1, 0, 9)], 300, [ROOT], 0, 0),  # a fresh slave of a master
    ([(1, 0, 9)], 300, [(4, 0, 2)], 0, 0),  # any empty slave
    ([(1, 0, 9), (2, 200, 5)], 500, [(1, 0, 9)], 350, 200),  # old master (to 350) meets the promoted slave
    ([(1, 0, 9), (2, 200, 5)], 500, [(1, 0, 9)], 150, 150),  # ... which had been ahead of it: nothing to cut
    ([ROOT, (1, 200, 1), (3, 400, 3)], 900, [ROOT, (1, 200, 1), (2, 380, 2)], 700, 380),  # diverged in epoch 1
    ([ROOT, (5, 200, 1)], 900, [ROOT, (5, 250, 1)], 700, 200),  # same number, other start: no match by accident
    # issue 17: each began epoch 2 at 500 on its own; only the origin tells them apart
    ([(1, 0, 9), (2, 500, 77)], 600, [(1, 0, 9), (2, 500, 78)], 650, 500),
    ([(1, 0, 9)], 600, [(1, 0, 8)], 650, None),  # two brokers started fresh as masters: unrelated, refused
    ([(1, 0, 9)], 0, [(1, 0, 8)], 650, None),  # ... also when the master is the empty one: never cut to 0
    ([(1, 0, 4)], 10, [ROOT], 10, None),  # unrelated logs
])
def test_agreed_position(master, master_end, slave, slave_end, agreed):
    assert agreed_position(master, master_end, slave, slave_end) == agreed


def test_store_keeps_the_history_and_truncate_log_trims_it(tmp_path):
    s = open_store(tmp_path / "d")
    assert s.epochs.entries == [ROOT]
    s.put("test", 0, 0, b"x" * 100, NOW)
    s.mark_flushed(s.flush_log())
    cut = s.written_position
    s.epochs.begin(cut)
    s.put("test", 0, 0, b"y" * 100, NOW)
    assert s.appended_messages() == 2
    s.truncate_log(0, NOW)
    assert s.epochs.entries == [ROOT] and s.appended_messages() == 0
    s.close(NOW)
    s = open_store(tmp_path / "d")
    assert s.epochs.entries == [ROOT] and s.epochs.max_epoch == 1
    s.close(NOW)


@pytest.mark.root
def test_a_cut_on_a_full_disk_forgets_the_epochs_past_it_and_the_store_opens_again_on_the_full_disk(tmp_path):
    """A slave's epoch cut whose files meet ENOSPC: the history in memory loses the entries past the cut even so
    (the handshake after the failed link reads it), no checkpoint claims the cut tail, and a restart on the still
    full disk opens with the entries dropped again (their file could not be rewritten)."""
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "4m"):
        data = mnt / "d"
        s = open_store(data)
        for i in range(20):
            s.put("test", 0, 0, b"x%d" % i, NOW)
            if i == 9:
                cut = s.written_position  # the logs agree up to here
        s.mark_flushed(s.flush_log())
        s.epochs.begin(s.written_position)
        for i in range(20):
            s.put("test", 0, 0, b"y%d" % i, NOW)
        s.mark_flushed(s.flush_log())
        s.checkpoint(NOW)
        filler = fill(mnt)
        with pytest.raises(OSError):
            s.truncate_log(cut, NOW)
        assert shape(s.epochs.entries) == [(0, 0)] and s.written_position == cut
        assert s.max_offset("test", 0) == 10
        s.abandon()
        s = open_store(data)  # the full disk still: the epochs file (past the cut) is dropped in memory again
        assert shape(s.epochs.entries) == [(0, 0)] and s.written_position == cut
        assert s.max_offset("test", 0) == 10
        s.abandon()
        os.unlink(filler)
        s = open_store(data)
        assert shape(s.epochs.entries) == [(0, 0)] and s.max_offset("test", 0) == 10
        s.close(NOW)


@pytest.mark.root
def test_a_history_past_the_log_end_loads_on_a_full_disk(tmp_path):
    """Its entries past the end are dropped in memory even when the file cannot be rewritten (the next load drops
    them again): a broker whose epoch file a full disk left stale still starts."""
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "1m"):
        h = history(mnt)
        h.begin(1000)
        assert shape(h.entries) == [(0, 0), (1, 1000)]
        filler = fill(mnt)
        again = history(mnt, log_end=500)
        assert shape(again.entries) == [(0, 0)] and again.max_epoch == 1
        os.unlink(filler)
        assert shape(history(mnt, log_end=500).entries) == [(0, 0)]

