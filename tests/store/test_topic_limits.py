"""Issue 15 point 5: max_topics / max_partitions (quota.py), at the limit and one past it."""

import random

import pytest

from metaq import errors, limits
from metaq.store.config import TopicSpec
from metaq.store.files import TOPIC_OWNERS_MAGIC
from tests.harness.store import NOW, open_store, payload_of, read_all


def _open(data_dir, **kw):
    kw.setdefault("topics", [TopicSpec("exact", 2), TopicSpec("*", 2)])
    return open_store(data_dir, segment_size=1 << 20, **kw)


def test_max_topics_at_the_limit_and_one_past_it(data_dir):
    s = _open(data_dir, max_topics=3)
    for t in ("t1", "t2", "t3"):  # at the limit
        s.put(t, 0, 0, b"first " + t.encode(), NOW)
    with pytest.raises(errors.TopicLimit, match="limits.max_topics") as refused:
        s.put("t4", 0, 0, b"x", NOW)
    assert refused.value.code == 400 and isinstance(refused.value, errors.UnknownTopic)
    s.put("t1", 1, 0, b"second partition of an existing topic", NOW)  # not a new topic
    s.put("t2", 0, 0, b"again", NOW)
    s.put("exact", 1, 0, b"named in the config: never refused", NOW)
    with pytest.raises(errors.TopicLimit):
        s.put("t5", -1, 0, b"x", NOW)
    assert s.max_offset("t4", 0) == 0
    s.close(NOW)
    s = _open(data_dir, max_topics=3)  # the count survives a restart (it is read from the data dir)
    with pytest.raises(errors.TopicLimit):
        s.put("t4", 0, 0, b"x", NOW)
    assert [payload_of(m) for m in read_all(s, "t2", 0)] == [b"first t2", b"again"]
    s.close(NOW)
    s = _open(data_dir, max_topics=5)  # raised by the operator: room again
    s.put("t4", 0, 0, b"now", NOW)
    s.close(NOW)


def test_max_partitions_at_the_limit_and_one_past_it(data_dir):
    s = _open(data_dir, max_partitions=5)
    for t, p in (("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0)):  # 5: at the limit
        s.put(t, p, 0, b"m", NOW)
    with pytest.raises(errors.TopicLimit, match="limits.max_partitions"):
        s.put("c", 1, 0, b"m", NOW)
    with pytest.raises(errors.TopicLimit, match="limits.max_partitions"):
        s.put("d", 0, 0, b"m", NOW)
    s.put("c", 0, 0, b"existing partitions keep working", NOW)
    assert s.max_offset("c", 0) == 2
    s.close(NOW)


def test_a_slave_mirrors_its_master_past_its_own_limits(data_dir, tmp_path):
    master = open_store(tmp_path / "master", segment_size=1 << 20, topics=[TopicSpec("*", 2)])
    for i in range(6):
        master.put("topic-%d" % i, i % 2, 0, b"m%d" % i, NOW)
    master.mark_flushed(master.flush_log())
    slave = open_store(tmp_path / "slave", segment_size=1 << 20, topics=[TopicSpec("*", 2)], max_topics=2,
                       max_partitions=2)
    pos = 0
    while True:
        data, nxt = master.read_log(pos, 1 << 20)
        if not len(data):
            break
        slave.append_replicated(pos, bytes(data), NOW, master_segment_size=1 << 20)
        pos = nxt
    slave.mark_flushed(slave.flush_log())
    assert [payload_of(m) for m in read_all(slave, "topic-5", 1)] == [b"m5"]
    with pytest.raises(errors.TopicLimit):  # promoted, it still takes no new topic past its limit
        slave.put("topic-new", 0, 0, b"x", NOW)
    slave.put("topic-3", 1, 0, b"existing", NOW)
    master.close(NOW)
    slave.close(NOW)


def test_a_flood_of_random_topics_stops_at_the_limit(data_dir):
    s = _open(data_dir, max_topics=50, max_partitions=1000)
    rng = random.Random(7)
    created = refused = 0
    for _ in range(200):
        try:
            s.put("flood-%08x" % rng.getrandbits(32), -1, 0, b"x", NOW)
            created += 1
        except errors.TopicLimit:
            refused += 1
    assert (created, refused) == (50, 150)
    s.close(NOW)


def test_topic_owners_go_to_a_slave_and_survive_its_restart(tmp_path, caplog):
    """The master lists each topic a user's put created with its owner and partitions (what its TOPICS frames
    carry); a slave's owners become exactly those, so its per-user counts (the topics and partitions quotas')
    are the master's, saved by its checkpoint for a restart. A saved owner no user can have is dropped."""
    allow = lambda user, quota, held, more: None  # noqa: E731 (no quota here: the counts are what is tested)
    master = _open(tmp_path / "m")
    for topic, user in (("orders-a", "alice"), ("orders-b", "alice"), ("orders", "bob")):
        master.claim_topic(topic, user, allow)
        master.put(topic, 0, 0, b"x", NOW)
    master.claim_topic("exact", "carol", allow)  # named in the configuration: no one's
    version, rows = master.owned_topics()
    assert rows == [("orders", "bob", 2), ("orders-a", "alice", 2), ("orders-b", "alice", 2)]
    slave = _open(tmp_path / "s")
    slave.claim_topic("mine", "carol", allow)  # from its own time as a master: goes
    slave.replace_topic_owners(rows)
    assert slave.topic_owners() == master.topic_owners() == {"alice": (2, 4), "bob": (1, 2)}
    before = slave.owned_topics()[0]
    slave.replace_topic_owners(list(rows))  # the same owners again: nothing to save
    assert slave.owned_topics()[0] == before
    slave.close(NOW)
    slave = _open(tmp_path / "s")
    assert slave.topic_owners() == {"alice": (2, 4), "bob": (1, 2)}
    slave.replace_topic_owners(rows[:1])  # the master's word, even when it is less
    assert slave.topic_owners() == {"bob": (1, 2)}
    slave.close(NOW)
    master.close(NOW)
    s = _open(tmp_path / "bad")
    most = limits.MAX_TX_OWNER_BYTES
    s.dirs.write_state(s.dirs.topic_owners, TOPIC_OWNERS_MAGIC, {"owners": [
        ["t1", "u" * most, 2], ["t2", "v" * (most + 1), 2], ["t3", "w", limits.MAX_PARTITIONS + 1]]})
    s.close(NOW, clean=False)
    s = _open(tmp_path / "bad")
    assert s.topic_owners() == {"u" * most: (1, 2)}  # at the limit; one past either is no one's
    assert "topic owners: ignored" in caplog.text
    s.close(NOW)
