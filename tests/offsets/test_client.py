"""Offset stores: ZooKeeper (MetaQ's node format), the broker's store, and a local JSON file."""

import json
import os
import threading

import pytest
from kazoo.client import KazooClient

from metaq import errors
from metaq.client.connection import ConnectionPool
from metaq.client.message import Partition
from metaq.client.offsets import (
    BrokerOffsetStore,
    LocalFileOffsetStore,
    ZkOffsetStore,
    format_zk_offset,
    parse_zk_offset,
)
from metaq.protocol import events as ev

P0, P1 = Partition(7, 0), Partition(7, 1)


@pytest.mark.parametrize("text, expected", [
    ("123-42", (42, 123)),
    ("-1-42", (42, -1)),  # msg id unknown
    ("-5-42", (42, -5)),  # a negative msg id
    ("-9223372036854775808-0", (0, -9223372036854775808)),
    ("42", (42, -1)),  # legacy plain offset
    ("0", (0, -1)),
    (b"77-3", (3, 77)),
    (" 8-9\n", (9, 8)),
])
def test_parse_zk_offset(text, expected):
    assert parse_zk_offset(text) == expected


@pytest.mark.parametrize("text", ["--5-42", "5--42", "-42", "", "-", "x-1", "1-x", "1-", "+1-2", "1-2-3", "1 - 2"])
def test_parse_zk_offset_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_zk_offset(text)


@pytest.mark.parametrize("offset, msg_id", [(0, -1), (42, 123), (42, -5), (2**62, -(2**63))])
def test_format_parse_round_trip(offset, msg_id):
    assert parse_zk_offset(format_zk_offset(offset, msg_id)) == (offset, msg_id)


@pytest.fixture
def zk(zk_connect):
    client = KazooClient(hosts=zk_connect, timeout=10)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


def test_zk_store_writes_metaq_nodes_and_reads_them_back(zk):
    store = ZkOffsetStore(zk, "/meta", "grp")
    assert store.load("topic1", P0) is None
    assert store.commit({("topic1", P0): (10, 555), ("topic1", P1): (3, -1)}) == 2
    assert zk.get("/meta/consumers/grp/offsets/topic1/7-0")[0] == b"555-10"
    assert zk.get("/meta/consumers/grp/offsets/topic1/7-1")[0] == b"-1-3"
    assert zk.get("/meta/consumers/grp/offsets/topic1/7-0")[1].ephemeralOwner == 0  # persistent
    fresh = ZkOffsetStore(zk, "/meta", "grp")
    assert fresh.load("topic1", P0) == 10
    assert fresh.load_entry("topic1", P1) == (3, -1)


def test_zk_store_commits_only_changed_partitions(zk):
    store = ZkOffsetStore(zk, "/meta", "grp")
    store.commit({("t", P0): (1, 1), ("t", P1): (2, 2)})
    versions = {p: zk.get("/meta/consumers/grp/offsets/t/" + str(p))[1].version for p in (P0, P1)}
    assert store.commit({("t", P0): (1, 1), ("t", P1): (5, 9)}) == 1
    assert zk.get("/meta/consumers/grp/offsets/t/7-0")[1].version == versions[P0]
    assert zk.get("/meta/consumers/grp/offsets/t/7-1")[1].version == versions[P1] + 1
    assert store.commit({("t", P0): (1, 1), ("t", P1): (5, 9)}) == 0


def test_zk_store_reads_legacy_and_negative_msg_id_values(zk):
    zk.create("/meta/consumers/grp/offsets/t/7-0", b"1234", makepath=True)
    zk.create("/meta/consumers/grp/offsets/t/7-1", b"-77-8", makepath=True)
    zk.create("/meta/consumers/grp/offsets/t/7-2", b"--5-42", makepath=True)
    store = ZkOffsetStore(zk, "/meta", "grp")
    assert store.load_entry("t", P0) == (1234, -1)
    assert store.load_entry("t", P1) == (8, -77)
    assert store.load("t", Partition(7, 2)) is None  # unreadable: logged and treated as never committed


def test_zk_store_after_a_load_skips_an_unchanged_commit(zk):
    zk.create("/meta/consumers/grp/offsets/t/7-0", b"3-4", makepath=True)
    store = ZkOffsetStore(zk, "/meta", "grp")
    assert store.load("t", P0) == 4
    assert store.commit({("t", P0): (4, 3)}) == 0


def test_zk_store_rejects_a_bad_group(zk):
    with pytest.raises(errors.ClientError):
        ZkOffsetStore(zk, "/meta", "bad/group")


def test_local_file_store_round_trip_and_format(tmp_path):
    path = tmp_path / "sub" / "offsets.json"
    store = LocalFileOffsetStore(path, "grp")
    assert store.load("t", P0) is None
    store.commit({("t", P0): (5, 50), ("u", P1): (1, -1)})
    data = json.loads(path.read_text())
    assert data == {"grp": {"t": {"7-0": {"offset": 5, "msg_id": 50}}, "u": {"7-1": {"offset": 1, "msg_id": -1}}}}
    other = LocalFileOffsetStore(path, "other")  # a second group in the same file keeps the first one's offsets
    other.commit({("t", P0): (9, 90)})
    assert LocalFileOffsetStore(path, "grp").load_entry("t", P0) == (5, 50)
    assert LocalFileOffsetStore(path, "other").load("t", P0) == 9
    assert [n for n in os.listdir(path.parent) if n.endswith(".tmp")] == []


def test_local_file_store_concurrent_groups_lose_nothing(tmp_path):
    path = tmp_path / "offsets.json"

    def work(group):
        store = LocalFileOffsetStore(path, group)
        for i in range(30):
            store.commit({("t", P0): (i, i)})

    threads = [threading.Thread(target=work, args=("g%d" % n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    data = json.loads(path.read_text())
    assert {g: data[g]["t"]["7-0"]["offset"] for g in data} == {"g0": 29, "g1": 29, "g2": 29, "g3": 29}


def test_local_file_store_reports_a_corrupt_file(tmp_path):
    path = tmp_path / "offsets.json"
    path.write_text("{not json")
    with pytest.raises(errors.ClientError, match="not valid JSON"):
        LocalFileOffsetStore(path, "grp").load("t", P0)


def test_broker_store_round_trip(broker):
    url = "meta://127.0.0.1:%d" % broker.port
    pool = ConnectionPool()
    try:
        with broker.client() as c:
            c.put_ok("topic1", b"x", partition=0)
        store = BrokerOffsetStore(pool, lambda broker_id: url, "grp")
        assert store.load("topic1", P0) is None
        assert store.commit({("topic1", P0): (1, 99), ("topic1", P1): (0, -1)}) == 2
        assert store.commit({("topic1", P0): (1, 99), ("topic1", P1): (0, -1)}) == 0
        fresh = BrokerOffsetStore(pool, lambda broker_id: url, "grp")
        assert fresh.load("topic1", P0) == 1
        assert fresh.load("topic1", P1) == 0
        assert BrokerOffsetStore(pool, lambda broker_id: url, "grp2").load("topic1", P0) is None
        with broker.client() as c:  # what the broker answers a raw client
            r = c.call(ev.QueryOffset("grp", "topic1", 0, 5))
            assert (r.code, r.body) == (200, b"1")
    finally:
        pool.close()


def test_broker_store_unknown_broker_is_an_error():
    pool = ConnectionPool()
    try:
        store = BrokerOffsetStore(pool, lambda broker_id: None, "grp")
        with pytest.raises(errors.ConnectionLost):
            store.load("t", P0)
    finally:
        pool.close()
