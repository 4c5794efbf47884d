"""The topic table in the store (topics/table.py, state.py, retention.py): files and time only."""

import json
import os

import pytest

from metaq.errors import ClientError, StoreError, TopicForbidden, TopicLimit, UnknownTopic
from metaq.store.record import FIXED_OVERHEAD
from metaq.topics.table import TOPICS_FILE, parse_settings
from tests.harness.store import HOUR_MS, NOW, open_store, read_all


def table_of(tmp_path):
    with open(os.path.join(str(tmp_path), TOPICS_FILE)) as f:
        return json.load(f)


def test_create_survives_a_restart_before_any_put(tmp_path):
    s = open_store(tmp_path)
    s.topics.create("orders", {"partitions": "3", "perm": "r", "ordered": "1"})
    s.close(NOW)
    s = open_store(tmp_path)
    assert s.partitions_of("orders") == 3
    with pytest.raises(TopicForbidden, match="not writable"):
        s.put("orders", 0, 0, b"x", NOW)
    assert [r["name"] for r in s.topics.describe() if r["source"] == "table"] == ["orders"]
    s.close(NOW)


def test_a_crash_after_the_table_named_a_topic_before_the_store_made_it(tmp_path):
    """Hand-made: the table written (a create's first step), the store never got to create anything."""
    s = open_store(tmp_path)
    s.close(NOW)
    with open(os.path.join(str(tmp_path), TOPICS_FILE), "w") as f:
        json.dump({"format": 1, "version": 1, "deleted": {},
                   "topics": {"fresh": {"partitions": 2, "perm": "rw", "ordered": False}}}, f)
    s = open_store(tmp_path)
    assert s.partitions_of("fresh") == 2
    assert s.put("fresh", 1, 0, b"first", NOW).offset == 0
    s.close(NOW)


def test_a_crash_after_the_tombstone_before_the_files_went(tmp_path):
    """Hand-made: the table says deleted (a delete's first step), the index files are still there."""
    s = open_store(tmp_path)
    for i in range(3):
        s.put("test", 1, 0, b"m%d" % i, NOW)
    s.put("other", 0, 0, b"stays", NOW)
    s.close(NOW)
    assert os.path.isdir(os.path.join(str(tmp_path), "index", "test", "1"))
    with open(os.path.join(str(tmp_path), TOPICS_FILE), "w") as f:
        json.dump({"format": 1, "version": 1, "topics": {}, "deleted": {"test": {"1": 3}}}, f)
    s = open_store(tmp_path)
    assert not os.path.exists(os.path.join(str(tmp_path), "index", "test"))
    with pytest.raises(UnknownTopic, match="no such topic test"):
        s.read("test", 1, 0, 1000)
    with pytest.raises(UnknownTopic, match="no such topic test"):
        s.put("test", 1, 0, b"x", NOW)
    assert len(read_all(s, "other", 0)) == 1
    s.topics.create("test", {"partitions": "4"})
    assert s.put("test", 1, 0, b"again", NOW).offset == 3  # past the deleted topic's offsets
    assert s.put("test", 0, 0, b"again", NOW).offset == 0
    s.close(NOW)


def test_an_unreadable_table_refuses_to_open(tmp_path):
    s = open_store(tmp_path)
    s.close(NOW)
    with open(os.path.join(str(tmp_path), TOPICS_FILE), "w") as f:
        f.write("{not json")
    with pytest.raises(StoreError, match="topics.json cannot be read"):
        open_store(tmp_path)


@pytest.mark.parametrize("values, message", [
    ({"partitions": "0"}, "partitions must be 1..1024"),
    ({"partitions": "1025"}, "partitions must be 1..1024"),
    ({"partitions": "x"}, "partitions must be a number"),
    ({"perm": "rwx"}, "perm must be one of"),
    ({"ordered": "maybe"}, "ordered must be 0 or 1"),
    ({"retention_hours": "-1"}, "retention_hours must be above 0"),
    ({"retention_hours": "nan"}, "finite"),
    ({"retention_bytes": "0"}, "retention_bytes must be at least 1"),
    ({"colour": "red"}, "unknown topic setting colour"),
])
def test_bad_settings_are_refused(values, message):
    with pytest.raises(ClientError, match=message):
        parse_settings(dict({"partitions": "1"}, **values) if "partitions" not in values else values)


def test_refusals_change_nothing(tmp_path):
    s = open_store(tmp_path, max_topics=8, max_partitions=10)
    s.topics.create("kept", {"partitions": "2"})
    before = table_of(tmp_path)
    for call, message in [
        (lambda: s.topics.create("kept", {}), "exists"),
        (lambda: s.topics.create("a*", {}), "patterns"),
        (lambda: s.topics.create("SCHEDULE_TOPIC_XXXX", {}), "system topic"),
        (lambda: s.topics.delete("%DLQ%g"), "system topic"),
        (lambda: s.topics.delete("unknown"), "no such topic"),
        (lambda: s.topics.alter("kept", {"partitions": "1"}), "can only grow"),
        (lambda: s.topics.create("big", {"partitions": "9"}), "limits.max_partitions"),
    ]:
        with pytest.raises((ClientError, TopicLimit), match=message):
            call()
        assert table_of(tmp_path) == before
    assert s.partitions_of("kept") == 2
    s.topics.create("big", {"partitions": "8"})  # 10 partitions: at the limit
    s.close(NOW)


def test_retention_by_age_moves_the_first_offset_only_of_its_topic(tmp_path):
    s = open_store(tmp_path)
    s.topics.create("short", {"retention_hours": "1"})
    for i in range(4):
        s.put("short", 0, 0, b"s%d" % i, NOW + i * HOUR_MS)
        s.put("other", 0, 0, b"o%d" % i, NOW + i * HOUR_MS)
    s.mark_flushed(s.flush_log())
    report = s.retention(NOW + 3 * HOUR_MS + HOUR_MS // 2)
    assert report.raised_min_offsets[("short", 0)] == 3  # stored at NOW+3h: the only one within the last hour
    assert s.min_offset("short", 0) == 3 and s.min_offset("other", 0) == 0
    assert len(read_all(s, "other", 0)) == 4
    s.close(NOW + 4 * HOUR_MS)
    s = open_store(tmp_path, now=NOW + 10 * HOUR_MS)  # applied at open: later, and everything is older
    assert s.min_offset("short", 0) == 4
    s.close(NOW)


def test_retention_by_size_keeps_the_newest_bytes_per_partition(tmp_path):
    s = open_store(tmp_path)
    size = FIXED_OVERHEAD + len("sized") + 10
    s.topics.create("sized", {"partitions": "2", "retention_bytes": str(2 * 3 * size)})  # 3 records a partition
    for i in range(5):
        s.put("sized", 0, 0, b"%010d" % i, NOW)
    s.put("sized", 1, 0, b"%010d" % 99, NOW)
    s.mark_flushed(s.flush_log())
    s.retention(NOW)
    assert s.min_offset("sized", 0) == 2 and s.min_offset("sized", 1) == 0
    s.topics.alter("sized", {"retention_bytes": "1"})  # smaller than one record: the newest is kept
    s.retention(NOW)
    assert s.min_offset("sized", 0) == 4
    s.close(NOW)


def test_retention_deletes_the_index_files_wholly_below_the_new_first_offset(tmp_path):
    s = open_store(tmp_path, segment_size=1 << 20)  # index files of 64 units (the harness's index_file_units)
    s.topics.create("short", {"retention_hours": "1"})
    for _ in range(200):
        s.put("short", 0, 0, b"m", NOW)
    s.put("short", 0, 0, b"young", NOW + 2 * HOUR_MS)
    s.mark_flushed(s.flush_log())
    pdir = os.path.join(str(tmp_path), "index", "short", "0")
    assert len(os.listdir(pdir)) == 4  # units 0..63, 64..127, 128..191, 192..255
    report = s.retention(NOW + 2 * HOUR_MS)
    assert s.min_offset("short", 0) == 200
    assert sorted(os.listdir(pdir)) == ["%020d" % (16 * 192)]  # the three files wholly below 200 went
    assert len(report.deleted_index_files) == 3
    s.close(NOW)


def test_perm_none_refuses_puts_and_reads(tmp_path):
    s = open_store(tmp_path)
    s.topics.create("sealed", {"partitions": "1"})
    s.put("sealed", 0, 0, b"before", NOW)
    s.topics.alter("sealed", {"perm": "-"})
    with pytest.raises(TopicForbidden, match="not writable"):
        s.put("sealed", 0, 0, b"x", NOW)
    with pytest.raises(TopicForbidden, match="not readable"):
        s.read("sealed", 0, 0, 1000)
    s.topics.alter("sealed", {"perm": "rw"})
    assert len(read_all(s, "sealed", 0)) == 1  # nothing was lost meanwhile
    s.close(NOW)


def test_rocketmq_system_topics_cannot_be_created(tmp_path):
    s = open_store(tmp_path)
    for name in ("RMQ_SYS_TRANS_HALF_TOPIC", "%RETRY%g"):
        with pytest.raises(ClientError, match="system topic"):
            s.topics.create(name, {})
    assert not os.path.exists(os.path.join(str(tmp_path), TOPICS_FILE)) or table_of(tmp_path)["topics"] == {}
    s.close(NOW)


def test_a_topics_retention_deletes_no_segment(tmp_path):
    """Per-topic retention moves the first offset; only the broker's retention deletes commit-log segments."""
    s = open_store(tmp_path)  # 4 KiB segments
    s.topics.create("short", {"retention_hours": "1"})
    for i in range(100):
        s.put("short", 0, 0, b"%03d" % i + b"x" * 100, NOW)
    s.mark_flushed(s.flush_log())
    log_dir = os.path.join(str(tmp_path), "commitlog")
    segments = sorted(os.listdir(log_dir))
    assert len(segments) > 2
    report = s.retention(NOW + 2 * HOUR_MS)
    assert s.min_offset("short", 0) == 100  # every message older than the hour: none is served
    assert report.deleted_segments == [] and report.freed_bytes == 0
    assert sorted(os.listdir(log_dir)) == segments
    s.close(NOW)
