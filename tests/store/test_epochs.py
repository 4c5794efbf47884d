"""The epoch history (store/epochs.py): persistence, trimming, and where two logs agree."""

import pytest

from metaq.store.epochs import EpochHistory, agreed_position
from metaq.store.files import DataDir

from tests.harness.store import NOW, open_store


def history(tmp_path, log_end=0):
    dirs = DataDir(str(tmp_path))
    dirs.create()
    return EpochHistory(dirs).load(log_end)


def test_fresh_broker_is_epoch_0_from_0_and_the_file_is_written(tmp_path):
    h = history(tmp_path)
    assert h.entries == [(0, 0)] and h.epoch == 0 and not h.found and not h.led
    again = history(tmp_path)
    assert again.found and again.entries == [(0, 0)]


def test_begin_persists_and_numbers_are_never_reused(tmp_path):
    h = history(tmp_path)
    assert h.begin(100) == 1 and h.led
    assert h.begin(250) == 2
    assert history(tmp_path, 300).entries == [(0, 0), (1, 100), (2, 250)]
    h = history(tmp_path, 200)  # the log lost its end (say a power loss): epoch 2 is forgotten ...
    assert h.entries == [(0, 0), (1, 100)]
    assert h.begin(200) == 3  # ... but its number is not handed out again
    h.truncate(50)
    assert h.entries == [(0, 0)] and history(tmp_path, 50).entries == [(0, 0)]


def test_an_epoch_begun_at_the_same_position_replaces_an_empty_one(tmp_path):
    h = history(tmp_path)
    h.begin(100)
    h.begin(100)  # promoted twice without a write in between
    assert h.entries == [(0, 0), (2, 100)]


def test_a_damaged_file_counts_as_fresh(tmp_path):
    h = history(tmp_path)
    h.begin(10)
    with open(str(tmp_path / "epochs"), "r+b") as f:
        f.seek(14)
        f.write(b"X")
    assert history(tmp_path, 10).entries == [(0, 0)]


def test_adopt_and_learn(tmp_path):
    h = history(tmp_path)
    h.begin(100)  # our own epoch, which the new master never saw
    later = h.adopt([(0, 0), (2, 80), (4, 300)], 120)
    assert h.entries == [(0, 0), (2, 80)] and later == [(4, 300)] and not h.led and h.max_epoch == 4
    h.learn(4, 300)
    assert h.entries == [(0, 0), (2, 80), (4, 300)]
    with pytest.raises(ValueError):
        h.learn(3, 400)
    assert history(tmp_path, 400).entries == [(0, 0), (2, 80), (4, 300)]


@pytest.mark.parametrize("mine, my_end, theirs, their_end, agreed", [
    ([(0, 0)], 500, [(0, 0)], 300, 300),  # a slave behind
    ([(0, 0)], 300, [(0, 0)], 500, 300),  # a slave ahead (the master lost a tail): cut to the master's end
    ([(0, 0), (1, 200)], 500, [(0, 0)], 350, 200),  # old master (epoch 0 to 350) meets the promoted slave
    ([(0, 0), (1, 200)], 500, [(0, 0)], 150, 150),  # ... which had been ahead of it: nothing to cut
    ([(0, 0), (1, 200), (3, 400)], 900, [(0, 0), (1, 200), (2, 380)], 700, 380),  # diverged inside epoch 1
    ([(0, 0), (5, 200)], 900, [(0, 0), (5, 250)], 700, 200),  # same number, other start: no match by accident
    ([(1, 0)], 10, [(0, 0)], 10, None),  # unrelated logs
])
def test_agreed_position(mine, my_end, theirs, their_end, agreed):
    assert agreed_position(mine, my_end, theirs, their_end) == agreed


def test_store_keeps_the_history_and_truncate_log_trims_it(tmp_path):
    s = open_store(tmp_path / "d")
    assert s.epochs.entries == [(0, 0)]
    s.put("test", 0, 0, b"x" * 100, NOW)
    s.mark_flushed(s.flush_log())
    cut = s.written_position
    s.epochs.begin(cut)
    s.put("test", 0, 0, b"y" * 100, NOW)
    assert s.appended_messages() == 2
    s.truncate_log(0, NOW)
    assert s.epochs.entries == [(0, 0)] and s.appended_messages() == 0
    s.close(NOW)
    s = open_store(tmp_path / "d")
    assert s.epochs.entries == [(0, 0)] and s.epochs.max_epoch == 1
    s.close(NOW)
