"""ConsumerOffsets: the broker-side group offsets and their state file."""

import pytest

from metaq import limits
from metaq.errors import ClientError, InvalidTopic
from metaq.store.files import DataDir
from metaq.offsets.table import ConsumerOffsets


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


# -- what the replication stream carries (snapshot/changes on a master, replace/replicate on a slave) ---------------

def test_changes_since_a_version_each_key_once_oldest_first(tmp_path):
    _d, o = fresh(tmp_path)
    v0, rows = o.snapshot()
    assert (v0, rows) == (0, []) and o.changes(v0) == ([], 0)
    o.commit("g", "t", 0, 1, 1000, max_offset=9)
    o.commit("g", "t", 1, 2, 1001, max_offset=9)
    v1, rows = o.snapshot()
    assert rows == [("g", "t", 0, 1, 1000), ("g", "t", 1, 2, 1001)] and v1 == o.version == 2
    o.commit("h", "t", 0, 3, 1002, max_offset=9)
    o.commit("g", "t", 0, 4, 1003, max_offset=9)  # changed again: listed once, with its latest value, last
    changed, v2 = o.changes(v1)
    assert changed == [("h", "t", 0, 3, 1002), ("g", "t", 0, 4, 1003)] and v2 == 4
    assert o.changes(v2) == ([], 4)
    assert o.changes(0)[0] == [("g", "t", 1, 2, 1001), ("h", "t", 0, 3, 1002), ("g", "t", 0, 4, 1003)]
    with pytest.raises(ClientError):
        o.commit("g", "t", 0, 99, 1004, max_offset=9)  # a refused commit is no change
    assert o.changes(v2) == ([], 4)


def test_replace_makes_the_table_exactly_the_masters_and_is_saved(tmp_path):
    d, o = fresh(tmp_path)
    o.commit("mine", "t", 0, 7, 1000, max_offset=9)  # committed on this broker only: the master's table wins
    o.commit("g", "t", 0, 1, 1000, max_offset=9)
    o.save()
    o.replace([("g", "t", 0, 12, 2000), ("h", "u", 3, 0, 2001)])  # past our end: kept (a query clamps it)
    assert o.entries() == [("g", "t", 0, 12, 2000), ("h", "u", 3, 0, 2001)]
    assert o.query("mine", "t", 0) is None
    assert o.save() is True
    again = ConsumerOffsets(d)
    assert again.load() == 2 and again.entries() == o.entries()
    version = o.version
    o.replace([])  # an empty master table empties ours, and that is saved too
    assert o.entries() == [] and o.version > version and o.save() is True
    assert ConsumerOffsets(d).load() == 0
    # a replaced table is what this broker sends on if it becomes a master: its changes list every entry
    o.replace([("g", "t", 0, 3, 5)])
    assert o.changes(version)[0] == [("g", "t", 0, 3, 5)]


def test_replace_past_the_limit_is_refused_and_changes_nothing(tmp_path):
    d = DataDir(str(tmp_path))
    d.create()
    o = ConsumerOffsets(d, max_entries=2)
    o.replace([("g1", "t", 0, 1, 1), ("g2", "t", 0, 1, 1)])  # at the limit
    with pytest.raises(ValueError, match="3 committed offsets exceed the limit of 2"):
        o.replace([("g%d" % i, "t", 0, 1, 1) for i in range(3)])
    assert [e[0] for e in o.entries()] == ["g1", "g2"]


def test_replicate_takes_the_masters_word_and_skips_new_keys_past_the_limit(tmp_path):
    d = DataDir(str(tmp_path))
    d.create()
    o = ConsumerOffsets(d, max_entries=2)
    o.commit("g1", "t", 0, 5, 1000, max_offset=9)
    assert o.replicate([("g1", "t", 0, 2, 900)]) == 0  # the master's value wins, even a lower one
    assert o.query("g1", "t", 0) == 2
    assert o.replicate([("g2", "t", 0, 1, 1), ("g3", "t", 0, 1, 1), ("g1", "t", 0, 3, 2)]) == 1  # g3: one past
    assert o.entries() == [("g1", "t", 0, 3, 2), ("g2", "t", 0, 1, 1)]
    assert o.save() is True and ConsumerOffsets(d).load() == 2


def test_a_query_never_answers_past_the_partition_end(tmp_path):
    """A slave holds offsets copied from a master ahead of its log, and a cut shortens a log under its offsets:
    the answer is the partition's end, so nothing written there later is skipped."""
    from tests.harness.store import NOW, open_store

    s = open_store(tmp_path / "data")
    try:
        puts = [s.put("test", 0, 0, b"m%d" % i, NOW) for i in range(5)]
        s.commit_offset("g", "test", 0, 5, NOW)
        assert s.query_offset("g", "test", 0) == 5
        s.consumer_offsets.replicate([("g", "test", 1, 40, NOW), ("g", "test", 2, 0, NOW)])
        assert s.query_offset("g", "test", 1) == 0 == s.max_offset("test", 1)  # ahead of this log: its end
        assert s.query_offset("g", "test", 2) == 0
        s.truncate_log(puts[2].log_end, NOW)  # the last two messages cut (a rejoin's divergent tail)
        assert s.max_offset("test", 0) == 3 and s.query_offset("g", "test", 0) == 3
        assert s.consumer_offsets.query("g", "test", 0) == 5  # kept as committed: the store only clamps the answer
        s.put("test", 0, 0, b"new", NOW)
        assert s.query_offset("g", "test", 0) == 4
        assert s.query_offset("nobody", "test", 0) is None
    finally:
        s.close(NOW)


def test_clamp_moves_only_offsets_past_their_end_and_the_change_is_saved_and_replicated(tmp_path):
    d, o = fresh(tmp_path)
    o.replace([("g", "t", 0, 15, 1000), ("g", "t", 1, 3, 1001), ("h", "gone", 0, 7, 1002)])
    o.save()
    version = o.version
    ends = {("t", 0): 10, ("t", 1): 10}
    assert o.clamp(lambda topic, p: ends.get((topic, p))) == 1  # a topic not held (None) is left alone
    assert o.entries() == [("g", "t", 0, 10, 1000), ("g", "t", 1, 3, 1001), ("h", "gone", 0, 7, 1002)]
    changed, _v = o.changes(version)
    assert changed == [("g", "t", 0, 10, 1000)]  # a slave of the new master is told
    assert o.save() is True
    again = ConsumerOffsets(d)
    again.load()
    assert again.query("g", "t", 0) == 10
    assert o.clamp(lambda topic, p: ends.get((topic, p))) == 0  # nothing past its end any more


def test_owners_go_to_a_slave_and_its_counts_are_the_masters(tmp_path):
    """The master lists each entry with its owner; the slave's replace/replicate take them, so its held() counts
    (the consumer_offsets quota's) are the master's, and are saved for a restart."""
    master_dir = DataDir(str(tmp_path / "m"))
    master_dir.create()
    master = ConsumerOffsets(master_dir)
    master.commit("g", "t", 0, 1, 1000, max_offset=9, owner="alice")
    master.commit("g", "t", 1, 1, 1000, max_offset=9, owner="alice")
    master.commit("h", "t", 0, 1, 1000, max_offset=9, owner="bob")
    master.commit("n", "t", 0, 1, 1000, max_offset=9)  # no user: no owner
    v1, rows = master.snapshot(owners=True)
    assert rows == [("g", "t", 0, 1, 1000, "alice"), ("g", "t", 1, 1, 1000, "alice"), ("h", "t", 0, 1, 1000, "bob"),
                    ("n", "t", 0, 1, 1000, None)]
    slave_dir = DataDir(str(tmp_path / "s"))
    slave_dir.create()
    slave = ConsumerOffsets(slave_dir)
    slave.commit("old", "t", 0, 1, 1000, max_offset=9, owner="carol")  # from its own time as a master: goes
    slave.replace(rows)
    assert slave.held() == master.held() == {"alice": 2, "bob": 1}
    master.commit("h", "t", 1, 4, 1001, max_offset=9, owner="alice")
    master.commit("g", "t", 0, 5, 1002, max_offset=9, owner="bob")  # alice's still: the owner is who made it
    changed, _v2 = master.changes(v1, owners=True)
    assert changed == [("h", "t", 1, 4, 1001, "alice"), ("g", "t", 0, 5, 1002, "alice")]
    assert slave.replicate(changed) == 0
    assert slave.held() == master.held() == {"alice": 3, "bob": 1}
    slave.replicate([("h", "t", 0, 2, 1003, "alice"), ("g", "t", 1, 2, 1003, None)])  # the master's word, even here
    assert slave.held() == {"alice": 3}
    assert slave.save() is True
    again = ConsumerOffsets(slave_dir)
    assert again.load() == 5 and again.held() == {"alice": 3}
    again.replace([("g", "t", 0, 1, 1)])  # five fields (a master from before owners): no owner
    assert again.held() == {}


def test_a_loaded_owner_no_user_can_have_is_dropped(tmp_path, caplog):
    d, o = fresh(tmp_path)
    o.commit("g", "t", 0, 1, 1000, max_offset=9, owner="u" * limits.MAX_TX_OWNER_BYTES)  # at the limit
    o.commit("h", "t", 0, 1, 1000, max_offset=9, owner="v" * (limits.MAX_TX_OWNER_BYTES + 1))  # one past
    o.save()
    again = ConsumerOffsets(d)
    assert again.load() == 2 and again.held() == {"u" * limits.MAX_TX_OWNER_BYTES: 1}
    assert "ignored the owner" in caplog.text
