"""A priority topic in the store (topics/table.py): its settings, its levels' sub-queues ``<topic>%P<k>`` answered
with its partitions and permissions, and the refusals. Files and time only."""

import pytest

from metaq.priorities import limits as priorities_limits
from metaq.errors import ClientError, TopicForbidden, TopicLimit
from metaq.topics.table import parse_settings
from tests.harness.store import HOUR_MS, NOW, open_store, read_all


@pytest.mark.parametrize("values, message", [
    ({"priorities": "1"}, "priorities must be 0"),
    ({"priorities": str(priorities_limits.MAX_PRIORITY_LEVELS + 1)}, "priorities must be 0"),
    ({"priorities": "x"}, "must be a number"),
    ({"priority_max_wait_ms": "0"}, "priority_max_wait_ms must be 1"),
    ({"priority_max_wait_ms": str(priorities_limits.MAX_PRIORITY_MAX_WAIT_MS + 1)}, "priority_max_wait_ms must be 1"),
])
def test_bad_priority_settings_are_refused(values, message):
    with pytest.raises(ClientError, match=message):
        parse_settings(dict({"partitions": "1"}, **values))


def test_the_limits_are_accepted():
    s = parse_settings({"partitions": "1", "priorities": str(priorities_limits.MAX_PRIORITY_LEVELS),
                        "priority_max_wait_ms": str(priorities_limits.MAX_PRIORITY_MAX_WAIT_MS)})
    assert ((s.priorities, s.max_wait_ms)
            == (priorities_limits.MAX_PRIORITY_LEVELS, priorities_limits.MAX_PRIORITY_MAX_WAIT_MS))
    assert (parse_settings({"partitions": "1", "priorities": "2"}).max_wait_ms
            == priorities_limits.DEFAULT_PRIORITY_MAX_WAIT_MS)


def test_levels_are_partitions_of_their_own_that_survive_a_restart(tmp_path, caplog):
    s = open_store(tmp_path)
    s.topics.create("jobs", {"partitions": "2", "priorities": "3"})
    assert s.partitions_of("jobs%P1") == s.partitions_of("jobs%P2") == 2
    s.put("jobs%P2", 1, 0, b"high", NOW)
    s.put("jobs", 1, 0, b"low", NOW)
    s.close(NOW)
    s = open_store(tmp_path)
    assert [r[-4:] for r in read_all(s, "jobs%P2", 1)] == [b"high"]
    assert [r[-3:] for r in read_all(s, "jobs", 1)] == [b"low"]
    assert not [r for r in s.topics.describe() if "%P" in r["name"]]  # the levels are not topics of their own
    assert "jobs%P2" not in s.known_topics() and "jobs" in s.known_topics()
    assert [r["priorities"] for r in s.topics.describe() if r["name"] == "jobs"] == [3]
    assert "from the data directory" not in caplog.text  # a level is its topic's, not a topic of its own
    s.close(NOW)


def test_the_topics_permissions_hold_for_its_levels(tmp_path):
    s = open_store(tmp_path)
    s.topics.create("jobs", {"partitions": "1", "priorities": "2"})
    s.put("jobs%P1", 0, 0, b"before", NOW)
    s.topics.alter("jobs", {"perm": "-"})
    with pytest.raises(TopicForbidden, match="not writable"):
        s.put("jobs%P1", 0, 0, b"x", NOW)
    with pytest.raises(TopicForbidden, match="not readable"):
        s.read("jobs%P1", 0, 0, 1000)
    s.close(NOW)


def test_refusals(tmp_path):
    s = open_store(tmp_path)
    s.topics.create("jobs", {"partitions": "1", "priorities": "3"})
    for call, message in [
        (lambda: s.topics.create("jobs%P1", {}), "internal name"),
        (lambda: s.topics.alter("jobs", {"priorities": "2"}), "can only grow"),
        (lambda: s.topics.alter("jobs", {"priorities": "0"}), "can only grow"),
        (lambda: s.topics.delete("jobs"), "not supported yet"),
    ]:
        with pytest.raises(ClientError, match=message):
            call()
    assert s.topics.alter("jobs", {"priorities": "4"}).priorities == 4
    assert s.partitions_of("jobs%P3") == 1
    s.close(NOW)


def test_the_topics_retention_bounds_every_level(tmp_path):
    s = open_store(tmp_path)
    s.topics.create("short", {"retention_hours": "1", "priorities": "3"})
    for i in range(4):
        for name in ("short", "short%P2"):
            s.put(name, 0, 0, b"m%d" % i, NOW + i * HOUR_MS)
    s.mark_flushed(s.flush_log())
    report = s.retention(NOW + 3 * HOUR_MS + HOUR_MS // 2)
    assert report.raised_min_offsets[("short", 0)] == report.raised_min_offsets[("short%P2", 0)] == 3
    s.close(NOW + 4 * HOUR_MS)


def test_each_level_counts_against_the_topic_and_partition_limits(tmp_path):
    s = open_store(tmp_path, max_topics=2, max_partitions=3)
    s.topics.create("jobs", {"partitions": "1", "priorities": "4"})
    s.put("jobs%P1", 0, 0, b"x", NOW)  # a second topic, a second partition
    with pytest.raises(TopicLimit, match="limits.max_topics"):
        s.put("jobs%P2", 0, 0, b"x", NOW)  # a third topic: past max_topics, refused and nothing stored
    assert s.max_offset("jobs%P2", 0) == 0
    s.close(NOW)
