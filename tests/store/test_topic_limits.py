"""Issue 15 point 5: max_topics / max_partitions (quota.py), at the limit and one past it."""

import random

import pytest

from metaq import errors
from metaq.store.config import TopicSpec
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
    for i in range(200):
        try:
            s.put("flood-%08x" % rng.getrandbits(32), -1, 0, b"x", NOW)
            created += 1
        except errors.TopicLimit:
            refused += 1
    assert (created, refused) == (50, 150)
    s.close(NOW)
