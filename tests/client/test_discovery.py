"""client/discovery.py without a network: stats replies, master/slave choice, partitions of an unknown topic."""

import pytest

from metaq import errors
from metaq.client.discovery import (DirectDiscovery, broker_id_from_stats, choose_read_url, open_discovery,
                                    partition_count_from_stats, unknown_topic_partitions)
from metaq.client.message import Partition
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec


def topic_figures(result_code, partitions):
    """A ``stats <topic>`` body as the broker writes it (through the codec)."""
    realtime = {name: "null" for name in stats_codec.REALTIME}
    return stats_codec.encode_topic(stats_codec.TopicFigures("t", result_code, partitions, 0, 0, realtime))


def stats(body, code=200):
    return ev.Result(code, body, 0)


def test_broker_id_and_partition_count_from_stats():
    assert broker_id_from_stats(stats(b"STATS\r\npid 1\r\nbroker_id 7\r\nEND\r\n")) == 7
    with pytest.raises(errors.BrokerError, match="stats answered 500"):
        broker_id_from_stats(stats(b"boom", 500))
    with pytest.raises(KeyError):
        broker_id_from_stats(stats(b"STATS\r\npid 1\r\nEND\r\n"))
    assert partition_count_from_stats(stats(topic_figures(0, 4))) == 4
    assert partition_count_from_stats(stats(topic_figures(1, 0))) == 0
    # a topic named like a stats item ("topics", "delay"...) gets that item back: no count, not an error
    topics_item = stats_codec.encode_topics([stats_codec.TopicRow("orders", None)])
    assert partition_count_from_stats(stats(topics_item)) == 0
    assert partition_count_from_stats(stats(b"nope", 404)) == 0


def test_read_url_prefers_a_reachable_master_then_a_reachable_slave():
    up = {"m", "s2"}.__contains__
    assert choose_read_url("m", ["s1", "s2"], up) == "m"
    assert choose_read_url("gone", ["s1", "s2"], up) == "s2"  # the first slave that answers
    assert choose_read_url(None, ["s1", "s2"], up) == "s2"  # master not registered
    assert choose_read_url("gone", ["s1"], up) == "s1"  # nobody answers: the first slave
    assert choose_read_url("gone", [], up) == "gone"  # no slave: the master anyway
    assert choose_read_url(None, [], up) is None


def test_unknown_topic_goes_to_every_broker_but_those_that_refused_it():
    assert unknown_topic_partitions("t", {9: "u9", 3: "u3"}, set()) == [Partition(3, -1), Partition(9, -1)]
    assert unknown_topic_partitions("t", [3, 9], {("t", 3), ("x", 9)}) == [Partition(9, -1)]


def test_open_discovery_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        open_discovery(pool=None)
    with pytest.raises(ValueError, match="exactly one"):
        open_discovery("127.0.0.1:1", ["meta://127.0.0.1:1"], pool=None)
    with pytest.raises(ValueError, match="empty"):
        open_discovery(brokers=[], pool=None)
    direct = open_discovery(brokers="meta://127.0.0.1:1, meta://127.0.0.1:2", pool=None)
    assert isinstance(direct, DirectDiscovery) and direct.every_url() == ["meta://127.0.0.1:1", "meta://127.0.0.1:2"]
    assert direct.cached("t") == [] and direct.url(1) is None  # nothing asked yet


class FakeConn:
    def __init__(self, replies):
        self.replies = replies

    def call(self, event, timeout=None):
        reply = self.replies.get(event.item)
        if isinstance(reply, Exception):
            raise reply
        return reply


class FakePool:
    def __init__(self, conns):
        self.conns = conns

    def get(self, url):
        return self.conns[url]


def test_direct_discovery_learns_ids_once_and_reports_the_silent():
    a = FakeConn({None: stats(b"STATS\r\nbroker_id 5\r\nEND\r\n"),
                  "t": stats(topic_figures(0, 2))})
    b = FakeConn({None: errors.ConnectionLost("refused")})
    d = DirectDiscovery(["meta://a:1", "meta://b:1"], FakePool({"meta://a:1": a, "meta://b:1": b}))
    found, problems = d.resource_brokers()
    assert found == [(5, "meta://a:1")] and problems == ["meta://b:1: refused"]
    assert d.broker_urls() == {5: "meta://a:1"} and d.master_url(5) == "meta://a:1"
    assert d.read_url(5, lambda url: False) == "meta://a:1"  # no slaves in a direct list
    assert d.subscribe_partitions("t") == [Partition(5, 0), Partition(5, 1)]


def test_zk_discovery_says_when_no_broker_is_registered():
    from metaq.client.discovery import ZkDiscovery

    class Cluster:
        root, urls = "/meta", {}

        def broker_urls(self):
            return dict(self.urls)

    cluster = Cluster()
    zk = ZkDiscovery(cluster)
    assert zk.why_none("orders") == "no broker is registered in ZooKeeper under /meta"
    cluster.urls = {0: "meta://127.0.0.1:8123"}
    assert zk.why_none("orders") == ""


def test_zk_discovery_spreads_a_topic_listed_by_some_brokers_over_the_others_until_they_refuse_it():
    from metaq.client.discovery import ZkDiscovery

    class Cluster:
        root, urls, listed = "/meta", {0: "meta://a:1", 1: "meta://b:1", 2: "meta://c:1"}, {}

        def broker_urls(self):
            return dict(self.urls)

        def publish_partitions(self, topic):
            return [Partition(bid, p) for bid, count in sorted(self.listed.items()) for p in range(count)]

        def watch_topic(self, topic, callback):
            self.changed = callback

    cluster = Cluster()
    zk = ZkDiscovery(cluster)
    assert zk.partitions("t") == [Partition(0, -1), Partition(1, -1), Partition(2, -1)]  # listed nowhere yet
    cluster.listed = {1: 2}
    cluster.changed()  # broker 1 made it on its first put
    assert zk.partitions("t") == [Partition(0, -1), Partition(1, 0), Partition(1, 1), Partition(2, -1)]
    zk.refuse("t", 2)  # broker 2 does not take the topic
    assert zk.partitions("t") == [Partition(0, -1), Partition(1, 0), Partition(1, 1)]
    cluster.listed = {0: 1, 1: 2}
    cluster.changed()
    assert zk.partitions("t") == [Partition(0, 0), Partition(1, 0), Partition(1, 1)]
