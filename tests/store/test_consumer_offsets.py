"""ConsumerOffsets: the broker-side group offsets and their state file."""

import pytest

from metaq.errors import ClientError, InvalidTopic
from metaq.store.files import DataDir
from metaq.store.offsets import ConsumerOffsets


def fresh(tmp_path):
    d = DataDir(str(tmp_path))
    d.create()
    return d, ConsumerOffsets(d)


def test_save_load_round_trip_only_when_changed(tmp_path):
    d, o = fresh(tmp_path)
    assert o.save() is False  # nothing to write
    o.commit("g", "t", 0, 5, 1000, max_offset=9)
    o.commit("g", "t", 1, 0, 1001, max_offset=0)
    o.commit("h", "u", 3, 9, 1002, max_offset=9)
    assert o.save() is True and o.save() is False
    again = ConsumerOffsets(d)
    assert again.load() == 3
    assert again.entries() == [("g", "t", 0, 5, 1000), ("g", "t", 1, 0, 1001), ("h", "u", 3, 9, 1002)]
    assert again.query("g", "t", 0) == 5 and again.query("g", "t", 2) is None


def test_out_of_range_and_bad_group_refused(tmp_path):
    _d, o = fresh(tmp_path)
    with pytest.raises(ClientError, match="0..4"):
        o.commit("g", "t", 0, 5, 1, max_offset=4)
    with pytest.raises(ClientError):
        o.commit("g", "t", 0, -1, 1, max_offset=4)
    with pytest.raises(InvalidTopic, match="group"):
        o.commit("a b", "t", 0, 1, 1, max_offset=4)
    assert o.entries() == []


def test_corrupt_file_is_ignored_with_a_warning(tmp_path, caplog):
    d, o = fresh(tmp_path)
    o.commit("g", "t", 0, 5, 1000, max_offset=9)
    o.save()
    with open(d.consumer_offsets, "r+b") as f:
        f.seek(20)
        f.write(b"\xff")
    again = ConsumerOffsets(d)
    assert again.load() == 0
    assert "consumer_offsets" in caplog.text


def test_committed_offsets_at_the_limit_and_one_past(tmp_path):
    d = DataDir(str(tmp_path))
    d.create()
    o = ConsumerOffsets(d, max_entries=3)
    for g in ("g1", "g2", "g3"):
        o.commit(g, "t", 0, 1, 1000, max_offset=9)  # at the limit
    with pytest.raises(ClientError, match="too many committed offsets on the broker: the limit is 3"):
        o.commit("g4", "t", 0, 1, 1000, max_offset=9)  # one past: a new entry
    o.commit("g1", "t", 0, 7, 1001, max_offset=9)  # an existing entry still moves
    assert [e[:4] for e in o.entries()] == [("g1", "t", 0, 7), ("g2", "t", 0, 1), ("g3", "t", 0, 1)]
