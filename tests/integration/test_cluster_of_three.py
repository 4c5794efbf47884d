"""Three brokers in one ZooKeeper, as ``metaq-cluster`` starts them (issue 56, points 5 and 6): the Python producer
spreads a topic over every broker and a consumer group rebalances over all of them, RocketMQ 4 and 5 routes list
every broker, ``metaq-admin cluster`` shows each broker's role, addresses, topics and MQTT load, and ``metaq-admin
tail`` and the HTTP API say which broker holds what. Real broker processes, a real ZooKeeper."""

import json
import urllib.request

import pytest

from metaq import admincli as cli
from metaq.client import Message, Producer
from metaq.client.consumer import Consumer
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode as C
from tests.harness.broker import wait_for
from tests.harness.collector import Collector
from tests.harness.devcluster import LocalCluster
from tests.harness.mqtt import V311, Paho, close_all
from tests.harness.rocketmq import require_official_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "spread"
N = 60
IDS = [0, 1, 2]


@pytest.fixture(scope="module")
def three(tmp_path_factory, zk_server):
    """Brokers 0, 1 and 2 (4 partitions a topic each) with N messages of TOPIC sent by the Python producer."""
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), 3, zk_server.chroot())
    try:
        with Producer(zk_connect=cluster.zk_connect) as producer:
            wait_for(lambda: len(producer.discovery.broker_urls()) == 3, 20, "three brokers registered")
            cluster.sent = [producer.send(Message(TOPIC, b"m%02d" % i), timeout=30) for i in range(N)]
        yield cluster
    finally:
        cluster.stop()


def _admin(capsys, *args):
    code = cli.main(list(args))
    out = capsys.readouterr()
    assert code == 0, out
    return out.out


def test_the_python_producer_spreads_a_topic_over_every_broker(three):
    assert all(r.success for r in three.sent), [r.error for r in three.sent if not r.success]
    per_broker = {}
    for r in three.sent:
        per_broker.setdefault(r.partition.broker_id, set()).add(r.partition.partition)
    assert sorted(per_broker) == IDS and all(len(parts) == 4 for parts in per_broker.values()), per_broker


def test_a_consumer_group_rebalances_over_every_broker(three, tmp_path):
    every = {(b, p) for b in IDS for p in range(4)}
    got = Collector()
    first = Consumer("g3", zk_connect=three.zk_connect, consumer_id="c1", long_poll_ms=500, recover_dir=tmp_path / "1")
    second = Consumer("g3", zk_connect=three.zk_connect, consumer_id="c2", long_poll_ms=500,
                      recover_dir=tmp_path / "2")
    try:
        first.subscribe(TOPIC, got).start()
        second.subscribe(TOPIC, got).start()
        assert sorted(m.body for m in got.wait_for(N, timeout=60)) == sorted(b"m%02d" % i for i in range(N))

        def owned(c):
            return {(p.broker_id, p.partition) for p in c.assignment().get(TOPIC, ())}

        wait_for(lambda: owned(first) | owned(second) == every and not owned(first) & owned(second), 30,
                 lambda: "the 12 partitions shared: %s / %s" % (owned(first), owned(second)))
        assert len(owned(first)) == len(owned(second)) == 6
        second.close()
        wait_for(lambda: owned(first) == every, 30, lambda: "the survivor owns all: %s" % owned(first))
    finally:
        first.close()
        second.close()


def _route(port, topic=TOPIC):
    with RemotingClient(port) as rc:
        r = rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert r.code == C.SUCCESS, r
        body = json.loads(r.body)
    queues = {q["brokerName"]: q["writeQueueNums"] for q in body["queueDatas"]}
    return {b["brokerName"]: (b["brokerAddrs"], queues[b["brokerName"]]) for b in body["brokerDatas"]}


def test_rocketmq_4_routes_list_every_broker_on_every_broker(three):
    want = {"metaq-%d" % b: ({"0": "127.0.0.1:%d" % three.port(b, "remoting")}, 4) for b in IDS}
    for b in IDS:
        wait_for(lambda b=b: _route(three.port(b, "remoting")) == want, 15,
                 lambda b=b: "every broker in %s" % _route(three.port(b, "remoting")))
        # a topic no broker holds yet: every broker, with the asked broker's partition count (the first send to
        # a broker creates it there), as the Python producer spreads a new topic
        assert _route(three.port(b, "remoting"), "fresh%d" % b) == want


def test_the_official_rocketmq_4_producer_sends_to_every_broker(three, tmp_path):
    """It sends again what failed, as an application does (``APP_RETRIES``: the client's own defect at start)."""
    require_official_client()
    from bench.rocketmq_peer import APP_RETRIES, run_peer

    lines = run_peer(tmp_path / "producer", "produce", "--ns", "127.0.0.1:%d" % three.port(1, "remoting"),
                     "--topic", "rmq4", "--count", 24, *APP_RETRIES)
    assert sum(1 for line in lines if "msg_id" in line) == 24
    with cli_view(three) as view:
        held = {b for b, topic, _p, mn, mx in view.partitions() if topic == "rmq4" and mx > mn}
    assert held == set(IDS)


class cli_view:
    """metaq-admin's ClusterView of the cluster, closed at the end."""

    def __init__(self, cluster):
        self.view = cli.ClusterView(cluster.zk_connect, brokers=())

    def __enter__(self):
        return self.view

    def __exit__(self, *exc):
        self.view.close()


@pytest.mark.parametrize("topic", [TOPIC, "fresh"])
def test_rocketmq_5_query_route_lists_every_broker(three, topic):
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("metaq.rmq5.messages_pb2")
    want = {("metaq-%d" % b, 0, "127.0.0.1", three.port(b, "grpc")): [0, 1, 2, 3] for b in IDS}
    for b in IDS:
        channel = grpc.insecure_channel("127.0.0.1:%d" % three.port(b, "grpc"))
        try:
            call = channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute",
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=pb.QueryRouteResponse.FromString)
            r = call(pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=[("x-mq-client-id", "t@1")],
                     timeout=10)
        finally:
            channel.close()
        assert r.status.code == pb.OK, r.status
        seen = {}
        for q in r.message_queues:
            [address] = q.broker.endpoints.addresses
            seen.setdefault((q.broker.name, q.broker.id, address.host, address.port), []).append(q.id)
        assert seen == want


def test_admin_cluster_shows_each_brokers_role_addresses_topics_and_mqtt_load(three, capsys):
    device = Paho(three.as_broker(2), client_id="dev-1", version=V311, clean=False)
    try:
        device.c.subscribe("sensors/#", 1)
        wait_for(lambda: device.subacks, 10, "SUBACK")
        rows = json.loads(_admin(capsys, "--zk", three.zk_connect, "--json", "cluster"))
    finally:
        close_all()
    assert [(r["broker"], r["member"], r["role"], r["url"]) for r in rows] == [
        (b, "master", "master", three.url(b)) for b in IDS]
    for r in rows:
        b = r["broker"]
        assert (r["mqtt"], r["remoting"], r["grpc"]) == tuple("127.0.0.1:%d" % three.port(b, n)
                                                             for n in ("mqtt", "remoting", "grpc"))
        assert TOPIC in r["topics"].split(",")
        assert "peers=" in r["routes"] and "peers_up=" in r["routes"], r  # the broker's MQTT cluster links
    assert [(r["mqtt_connections"], r["mqtt_sessions"]) for r in rows] == [(0, 0), (0, 0), (1, 1)]
    assert [r["writable"] for r in rows] == ["yes"] * len(IDS)  # masters with no slave: nothing to wait for
    table = _admin(capsys, "--zk", three.zk_connect, "cluster")
    assert table.splitlines()[0].split()[:5] == ["BROKER", "MEMBER", "ROLE", "WRITABLE", "URL"]


def test_cluster_routes_column_shows_the_brokers_mqtt_cluster_stats():
    class View:
        def stats(self, url):
            return {"mqtt_connections": "2", "mqtt_cluster_links": "2", "mqtt_cluster_routes": "5"}

        def stats_of(self, url, item):
            return []

    member = {"broker": 4, "role": "master", "url": "meta://h:1", "mqtt": None, "remoting": None, "grpc": None,
              "http": "h:8180"}
    rows, columns = cli.cluster_rows(View(), [member])
    assert columns[-1] == "routes" and rows[0]["routes"] == "links=2 routes=5"
    assert rows[0]["http"] == "h:8180" and columns.index("http") < columns.index("topics")
    assert (rows[0]["mqtt_connections"], rows[0]["mqtt_sessions"], rows[0]["topics"]) == (2, None, None)


def test_admin_tail_names_the_broker_of_each_message(three, capsys):
    out = _admin(capsys, "--zk", three.zk_connect, "tail", TOPIC, "--max", str(N))
    lines = out.splitlines()
    assert len(lines) == N
    where = {line.split()[0] for line in lines}  # "<broker>-<partition>"
    assert where == {"%d-%d" % (b, p) for b in IDS for p in range(4)}
    sent = {("%d-%d" % (r.partition.broker_id, r.partition.partition), r.offset) for r in three.sent}
    assert {(line.split()[0], int(line.split()[1])) for line in lines} == sent


def _http(cluster, b, path, data=None):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (cluster.port(b, "http"), path), data=data,
                                 method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_the_http_api_says_which_broker_holds_what(three):
    for b in IDS:
        topic = _http(three, b, "/api/topics/%s" % TOPIC)
        held = sum(1 for r in three.sent if r.partition.broker_id == b)
        assert topic["broker_id"] == b and sum(p["messages"] for p in topic["partitions"]) == held
        listed = {t["topic"]: t for t in _http(three, b, "/api/topics")["topics"]}
        assert listed[TOPIC]["broker_id"] == b
        put = _http(three, b, "/api/topics/%s/messages?partition=1" % TOPIC, data=b"over http to %d" % b)
        assert (put["broker_id"], put["partition"]) == (b, 1)
        got = _http(three, b, "/api/topics/%s/partitions/1/messages?offset=%d" % (TOPIC, put["offset"]))
        assert got["broker_id"] == b and len(got["messages"]) == 1
