"""The consumer with ZooKeeper: a broker that registers itself, group membership, ZK offsets, broadcast."""

import time

import pytest
from kazoo.client import KazooClient

from metaq.client.consumer import Consumer
from metaq.client.local import small_config
from metaq.client.message import Partition
from tests.harness.broker import wait_for as wait_until
from tests.harness.collector import Collector


@pytest.fixture
def zk_broker(broker_factory, tmp_path, zk_connect):
    """A broker registered in ZooKeeper (under the test's chroot) with topic1 created on it."""
    b = broker_factory(small_config(tmp_path / "data", zk={"connect": zk_connect}))
    with b.client() as c:
        c.put_ok("topic1", b"create", 0)
    zk = KazooClient(hosts=zk_connect, timeout=10)
    zk.start(timeout=15)
    wait_until(lambda: zk.exists("/meta/brokers/topics-sub/topic1/7-m"))
    b.zk = zk
    yield b
    zk.stop()
    zk.close()


def test_group_consumer_owns_partitions_and_commits_to_zookeeper(zk_broker, zk_connect, tmp_path):
    zk = zk_broker.zk
    with zk_broker.client() as c:
        sent = [c.put_ok("topic1", b"z%d" % i, i % 4) for i in range(12)]
    handler = Collector()
    consumer = Consumer("grp", zk_connect=zk_connect, consumer_id="c1", long_poll_ms=2000, recover_dir=tmp_path)
    consumer.subscribe("topic1", handler).start()
    try:
        assert sorted(m.body for m in handler.wait_for(13)) == sorted([b"create"] + [b"z%d" % i for i in range(12)])
        assert consumer.assignment() == {"topic1": [Partition(7, p) for p in range(4)]}
        assert zk.get_children("/meta/consumers/grp/ids") == ["grp_c1"]
        assert zk.get("/meta/consumers/grp/ids/grp_c1")[0] == b"topic1"
        assert zk.get("/meta/consumers/grp/owners/topic1/7-2")[0] == b"grp_c1"
    finally:
        consumer.close()
    last_id = {p: msg_id for msg_id, p, _offset in sent}  # the id of the last message put to each partition
    counts = {0: 4, 1: 3, 2: 3, 3: 3}  # 12 puts round robin, plus "create" on partition 0
    for p in range(4):
        assert zk.get("/meta/consumers/grp/offsets/topic1/7-%d" % p)[0] == b"%d-%d" % (last_id[p], counts[p])
    assert zk.get_children("/meta/consumers/grp/ids") == []  # left the group
    assert zk.get_children("/meta/consumers/grp/owners/topic1") == []

    with zk_broker.client() as c:
        c.put_ok("topic1", b"after-restart", 1)
    handler = Collector()
    with Consumer("grp", zk_connect=zk_connect, consumer_id="c2", long_poll_ms=2000, recover_dir=tmp_path) as again:
        again.subscribe("topic1", handler).start()
        assert [m.body for m in handler.wait_for(1)] == [b"after-restart"]
        time.sleep(0.3)
        assert handler.bodies() == [b"after-restart"]


def test_legacy_offset_node_is_honoured(zk_broker, zk_connect, tmp_path):
    with zk_broker.client() as c:
        for i in range(5):
            c.put_ok("topic1", b"x%d" % i, 3)
    zk_broker.zk.create("/meta/consumers/legacy/offsets/topic1/7-3", b"3", makepath=True)  # pre-1.4 format
    handler = Collector()
    with Consumer("legacy", zk_connect=zk_connect, long_poll_ms=2000, recover_dir=tmp_path) as consumer:
        consumer.subscribe("topic1", handler).start()
        got = handler.wait_for(2 + 1)  # partition 0's "create" + offsets 3, 4 of partition 3
        time.sleep(0.2)
        assert sorted(m.body for m in got) == [b"create", b"x3", b"x4"]


def test_broadcast_with_zookeeper_gives_every_consumer_everything(zk_broker, zk_connect, tmp_path):
    with zk_broker.client() as c:
        for i in range(10):
            c.put_ok("topic1", b"b%d" % i)
    handlers = [Collector(), Collector()]
    consumers = [Consumer("bgrp", zk_connect=zk_connect, broadcast=True, consumer_id="c%d" % n, long_poll_ms=2000,
                          offsets_file=tmp_path / ("off%d.json" % n), recover_dir=tmp_path) for n in range(2)]
    try:
        for consumer, handler in zip(consumers, handlers, strict=True):
            consumer.subscribe("topic1", handler).start()
        for handler in handlers:
            handler.received_once([b"create"] + [b"b%d" % i for i in range(10)])
        assert zk_broker.zk.exists("/meta/consumers/bgrp/ids") is None  # no group coordination
        with zk_broker.client() as c:  # a topic's new messages reach both
            c.put_ok("topic1", b"later", 2)
        for handler in handlers:
            assert handler.wait_for(12)[-1].body == b"later"
    finally:
        for consumer in consumers:
            consumer.close()


def test_pull_with_zookeeper_finds_the_broker_without_start(zk_broker, zk_connect, tmp_path):
    with zk_broker.client() as c:
        msg_id, _p, _o = c.put_ok("topic1", b"pulled", 2, attribute="a")
    with Consumer("puller", zk_connect=zk_connect, recover_dir=tmp_path) as consumer:
        [msg] = consumer.fetch("topic1", "7-2", 0)
        assert (msg.body, msg.attribute, msg.id, msg.offset) == (b"pulled", "a", msg_id, 0)
        assert consumer.assignment() == {}
