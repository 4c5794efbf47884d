"""Topic names and patterns, partition ranges, illegal names, config checks, message ids, record layout."""

import os
from itertools import pairwise

import pytest

from metaq import errors
from metaq.protocol.checksum import crc32, metaq_checksum
from metaq.protocol.message import HEADER, encode_payload
from metaq.protocol.msgid import id_timestamp_ms
from metaq.store import msgid
from metaq.store.config import StoreConfig, TopicSpec
from metaq.store.record import (BLANK_MAGIC, MESSAGE_MAGIC, PREFIX, check_record, decode_record, encode_record,
                                metaq_offset, tag_hash)
from tests.harness.store import NOW, open_store

ILLEGAL = ["../x", "a/b", ".", "..", "", "x" * 201, "a b", "a\0b", "/abs", "t*", "tab\t", "ü"]


def test_exact_names_win_over_patterns_and_patterns_match_in_order(data_dir):
    topics = [TopicSpec("t*", 2), TopicSpec("test", 5), TopicSpec("tea*", 7), TopicSpec("*x", 3)]
    s = open_store(data_dir, topics=topics)
    assert s.partitions_of("test") == 5
    assert s.partitions_of("team") == 2  # "t*" comes before "tea*"
    assert s.partitions_of("box") == 3
    with pytest.raises(errors.UnknownTopic, match="The server does not accept topic other"):
        s.partitions_of("other")
    assert s.known_topics() == ["test"]
    s.close(NOW)


def test_a_put_to_a_new_topic_matching_a_pattern_creates_it(data_dir):
    s = open_store(data_dir)
    assert s.partition_keys() == []
    r = s.put("tnew", 1, 0, b"hi", NOW)
    assert (r.partition, r.offset) == (1, 0)
    assert s.partition_keys() == [("tnew", 1)] and "tnew" in s.known_topics()
    assert os.path.isdir(os.path.join(str(data_dir), "index", "tnew", "1"))
    s.close(NOW)
    s = open_store(data_dir)
    assert s.partition_keys() == [("tnew", 1)] and s.max_offset("tnew", 1) == 1
    s.close(NOW)


@pytest.mark.parametrize("partition", [-2, 2, 100])
def test_partition_out_of_range_is_refused(data_dir, partition):
    s = open_store(data_dir)
    with pytest.raises(errors.InvalidPartition):
        s.put("tnew", partition, 0, b"x", NOW)
    assert s.written_position == 0
    s.close(NOW)


@pytest.mark.parametrize("name", ILLEGAL)
def test_illegal_topic_names_are_refused_and_nothing_leaves_the_data_dir(tmp_path, name):
    data_dir = tmp_path / "data"
    s = open_store(data_dir, topics=[TopicSpec("*", 2)])
    before = sorted(os.listdir(str(tmp_path)))
    with pytest.raises(errors.InvalidTopic):
        s.put(name, 0, 0, b"x", NOW)
    with pytest.raises(errors.InvalidTopic):
        s.partitions_of(name)
    with pytest.raises((errors.InvalidTopic, errors.NotFound)):
        s.read(name, 0, 0, 100)
    assert sorted(os.listdir(str(tmp_path))) == before
    assert os.listdir(os.path.join(str(data_dir), "index")) == []
    assert s.written_position == 0
    s.close(NOW)


def test_stray_index_directories_with_illegal_names_are_ignored(data_dir):
    s = open_store(data_dir)
    s.put("test", 0, 0, b"x", NOW)
    s.close(NOW)
    os.makedirs(os.path.join(str(data_dir), "index", "bad name", "0"))
    os.makedirs(os.path.join(str(data_dir), "index", "test", "x"))
    s = open_store(data_dir)
    assert s.partition_keys() == [("test", 0)]
    s.close(NOW)


@pytest.mark.parametrize("kwargs, words", [
    (dict(broker_id=1024), "broker_id"),
    (dict(broker_id=-1), "broker_id"),
    (dict(flush="sometimes"), "flush"),
    (dict(segment_size=10), "segment_size"),
    (dict(index_file_units=0), "index_file_units"),
    (dict(disk_danger_ratio=1.5), "disk_danger_ratio"),
    (dict(retention_hours=0), "retention_hours"),
    (dict(topics=[TopicSpec("a/b", 1)]), "topics"),
    (dict(topics=[TopicSpec("ok", 0)]), "partitions"),
])
def test_bad_config_is_a_config_error_naming_the_setting(tmp_path, kwargs, words):
    with pytest.raises(errors.ConfigError, match=words):
        StoreConfig(str(tmp_path), **kwargs)


def test_id_layout_and_monotonicity():
    gen = msgid.IdGenerator(5)
    a = gen.next_id(1303895660503 + 1000)
    assert a == (1000 << 22) | (5 << 12)
    assert id_timestamp_ms(a) == 1303895660503 + 1000
    ids = [gen.next_id(1303895660503 + 1000) for _ in range(5000)]  # sequence overflow borrows a ms
    assert all(x < y for x, y in pairwise([a] + ids))
    assert gen.next_id(0) > ids[-1]  # the clock going back keeps the max
    with pytest.raises(errors.ConfigError):
        msgid.IdGenerator(1024)
    seeded = msgid.IdGenerator(1, last_id=ids[-1])  # a lower broker id never goes below the seed
    assert seeded.next_id(0) > ids[-1]


def test_record_layout_has_the_metaq_form_as_suffix():
    flag, data = encode_payload(b"hello", "tag1")
    rec = encode_record("topic", 3, 42, NOW, NOW - 5, 12346, flag, data)
    assert len(rec) == 42 + 5 + 20 + len(data)
    total, magic, crc, part, qoff, sts, bts, tlen = PREFIX.unpack_from(rec)
    assert (total, magic, part, qoff, sts, bts, tlen) == (len(rec), MESSAGE_MAGIC, 3, 42, NOW, NOW - 5, 5)
    assert crc == crc32(rec[12:]) and MESSAGE_MAGIC != BLANK_MAGIC
    suffix = rec[metaq_offset(5):]
    assert suffix == HEADER.pack(len(data), metaq_checksum(data), 12346, flag) + data
    assert check_record(rec, 0, len(rec)) == len(rec)
    assert check_record(rec, 0, len(rec) - 1) == 0
    r = decode_record(rec, 0)
    assert (r.topic, r.partition, r.queue_offset, r.msg_id, r.flag, r.data) == ("topic", 3, 42, 12346, flag, data)
    assert r.tag_hash == metaq_checksum(b"tag1") == tag_hash(flag, data)
    assert tag_hash(0, b"\0\0\0\4tag1") == 0 and tag_hash(1, b"\xff\xff\xff\xff") == 0


@pytest.mark.parametrize("steps", [
    [(1000, 3), (1000, 4), (1000, 1)],  # one millisecond, runs after runs
    [(1000, 4090), (1000, 20), (1000, 5000)],  # a run stopped at the sequence's end, the next borrowing a ms
    [(2000, 5), (1000, 5), (3000, 2)],  # the clock going back keeps the max
])
def test_take_gives_the_ids_next_id_would(steps):
    """``take`` (a burst's run of ids in one call) hands out exactly what as many ``next_id`` calls would, and a
    ``give_back`` of the unused tail returns them to the next call."""
    taker, stepper = msgid.IdGenerator(7), msgid.IdGenerator(7)
    for i, (ms, count) in enumerate(steps):
        first, n = taker.take(1303895660503 + ms, count)
        assert 1 <= n <= count
        expected = [stepper.next_id(1303895660503 + ms) for _ in range(n)]
        assert [first + k for k in range(n)] == expected
        if i == 1 and n > 1:
            taker.give_back(1)
            stepper = msgid.IdGenerator(7, last_id=expected[-2])
    assert taker.next_id(0) == stepper.next_id(0)
