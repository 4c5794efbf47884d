"""ZkCluster against a real ZooKeeper: MetaQ's broker/topic layout, watches and the cache."""

import threading
import time

import pytest

from metaq.client.cluster import ZkCluster, parse_broker_node, parse_num_parts
from metaq.client.message import Partition
from tests.harness.broker import wait_for
from tests.harness.registrar import Registrar


@pytest.fixture
def registrar(zk_connect):
    r = Registrar(zk_connect)
    yield r
    r.close()


def test_parse_helpers():
    assert parse_num_parts(b'{"numParts":10,"broker":"0-m"}') == 10
    assert parse_num_parts(b'{"broker":"0-m","numParts":3}') == 3
    assert parse_num_parts(b"4") == 4
    assert parse_num_parts(b"") is None and parse_num_parts(b"{}") is None and parse_num_parts(b"[1]") is None
    assert parse_broker_node("7-m") == (7, None)
    assert parse_broker_node("7-s2") == (7, 2)
    assert parse_broker_node("7") is None and parse_broker_node("x-m") is None


def test_reads_brokers_and_partitions(zk_connect, registrar):
    registrar.broker(1, "meta://127.0.0.1:1001")
    registrar.broker(2, "meta://127.0.0.1:1002")
    registrar.broker(2, "meta://127.0.0.1:2002", slave=1)
    registrar.topic("orders", 2, 3)
    registrar.topic("orders", 1, 2)
    registrar.topic("orders", 2, 3, slave=1, kinds=("topics-sub",))
    with ZkCluster(zk_connect) as cluster:
        assert cluster.broker_urls() == {1: "meta://127.0.0.1:1001", 2: "meta://127.0.0.1:1002"}
        assert cluster.broker_url(2) == "meta://127.0.0.1:1002"
        assert cluster.broker_url(3) is None
        expected = [Partition(1, 0), Partition(1, 1), Partition(2, 0), Partition(2, 1), Partition(2, 2)]
        assert cluster.publish_partitions("orders") == expected
        assert cluster.subscribe_partitions("orders") == expected  # the slave's copies are not counted twice
        assert cluster.publish_partitions("unknown") == []
        assert cluster.zk.connected and cluster.root == "/meta"


def test_legacy_topics_node_and_slave_only_broker(zk_connect, registrar):
    registrar.broker(3, "meta://127.0.0.1:1003")
    registrar.topic("old", 3, 4, kinds=(), legacy=True)
    registrar.broker(4, "meta://127.0.0.1:2004", slave=1)
    registrar.topic("replicated", 4, 2, slave=1, kinds=("topics-sub",))
    with ZkCluster(zk_connect) as cluster:
        assert cluster.publish_partitions("old") == [Partition(3, p) for p in range(4)]
        assert cluster.subscribe_partitions("old") == [Partition(3, p) for p in range(4)]
        assert cluster.broker_url(4) == "meta://127.0.0.1:2004"  # no master: the slave
        assert cluster.master_url(4) is None and cluster.slave_urls(4) == ["meta://127.0.0.1:2004"]
        assert cluster.master_url(3) == "meta://127.0.0.1:1003" and cluster.slave_urls(3) == []
        assert cluster.master_url(9) is None and cluster.slave_urls(9) == []
        assert 4 not in cluster.broker_urls()
        assert cluster.publish_partitions("replicated") == []  # nobody accepts writes
        assert cluster.subscribe_partitions("replicated") == [Partition(4, 0), Partition(4, 1)]


def test_custom_root(zk_connect):
    r = Registrar(zk_connect, root="/other/meta")
    try:
        r.broker(5, "meta://127.0.0.1:1005")
        r.topic("x", 5, 1)
        with ZkCluster(zk_connect, root="/other/meta") as cluster:
            assert cluster.publish_partitions("x") == [Partition(5, 0)]
        with ZkCluster(zk_connect) as cluster:
            assert cluster.publish_partitions("x") == []
    finally:
        r.close()


def test_watches_follow_brokers_and_topics(zk_connect, registrar):
    registrar.broker(1, "meta://127.0.0.1:1001")
    registrar.topic("live", 1, 2)
    events = []
    with ZkCluster(zk_connect) as cluster:
        unwatch = cluster.watch_topic("live", lambda: events.append(threading.current_thread().name))
        assert cluster.publish_partitions("live") == [Partition(1, 0), Partition(1, 1)]
        # a second broker comes up
        registrar.broker(2, "meta://127.0.0.1:1002")
        registrar.topic("live", 2, 1)
        assert wait_for(lambda: cluster.publish_partitions("live")[-1:] == [Partition(2, 0)])
        assert wait_for(lambda: events)
        assert all(name == "metaq-zk-refresh" for name in events)
        # broker 1 dies: its ephemeral nodes vanish
        registrar.remove_broker(1)
        assert wait_for(lambda: cluster.publish_partitions("live") == [Partition(2, 0)])
        assert wait_for(lambda: cluster.broker_urls() == {2: "meta://127.0.0.1:1002"})
        # a topic that did not exist at first is picked up once a broker registers it
        assert cluster.publish_partitions("later") == []
        registrar.topic("later", 2, 2)
        assert wait_for(lambda: cluster.publish_partitions("later") == [Partition(2, 0), Partition(2, 1)])
        # partition count change (a broker re-registers with new data)
        registrar.zk.set("/meta/brokers/topics-pub/later/2-m", b'{"numParts":3,"broker":"2-m"}')
        assert wait_for(lambda: len(cluster.publish_partitions("later")) == 3)
        # the master moves to a new address
        registrar.zk.set("/meta/brokers/ids/2/master", b"meta://127.0.0.1:3002")
        assert wait_for(lambda: cluster.broker_url(2) == "meta://127.0.0.1:3002")
        unwatch()
        count = len(events)
        registrar.remove_broker(2)
        assert wait_for(lambda: cluster.publish_partitions("live") == [])
        time.sleep(0.3)
        assert len(events) == count


def test_callback_may_read_the_cluster(zk_connect, registrar):
    registrar.broker(1, "meta://127.0.0.1:1001")
    registrar.topic("a", 1, 1)
    seen = []
    with ZkCluster(zk_connect) as cluster:
        # reading another, not yet cached topic from the callback must not deadlock
        cluster.watch_topic("a", lambda: seen.append(cluster.publish_partitions("b")))
        registrar.topic("b", 1, 2)
        registrar.topic("a", 1, 1, kinds=("topics",))
        registrar.broker(9, "meta://127.0.0.1:1009")
        assert wait_for(lambda: seen)


@pytest.mark.fault
@pytest.mark.slow
def test_survives_zookeeper_restart(own_zk):
    registrar = Registrar(own_zk.connect)
    registrar.broker(1, "meta://127.0.0.1:1001")
    registrar.topic("t", 1, 1)
    registrar.close()  # its ephemeral nodes go away with the session
    registrar = Registrar(own_zk.connect)
    cluster = ZkCluster(own_zk.connect, session_timeout=4.0)
    try:
        assert cluster.publish_partitions("t") == []
        registrar.broker(1, "meta://127.0.0.1:1001")
        registrar.topic("t", 1, 1)
        assert wait_for(lambda: cluster.publish_partitions("t") == [Partition(1, 0)])
        own_zk.kill()
        assert cluster.publish_partitions("t") == [Partition(1, 0)]  # the cache answers while ZooKeeper is down
        own_zk.start()
        registrar.close()
        registrar = Registrar(own_zk.connect)
        registrar.broker(2, "meta://127.0.0.1:1002")
        registrar.topic("t", 2, 1)
        assert wait_for(lambda: Partition(2, 0) in cluster.publish_partitions("t"), 30)
    finally:
        cluster.close()
        registrar.close()
