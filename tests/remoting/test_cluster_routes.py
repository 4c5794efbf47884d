"""Routes across brokers (issue 44, point 4): with ZooKeeper, a RocketMQ route (remoting GET_ROUTEINFO_BY_TOPIC and
GET_BROKER_CLUSTER_INFO, gRPC QueryRoute) lists every broker of the cluster holding the topic, its master as broker
id 0 and its slaves after, so RocketMQ clients spread over the brokers and follow an automatic failover. Real broker
processes and a real ZooKeeper."""

import json

import pytest

from metaq.client.local import free_port, small_config
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode as C
from tests.harness.broker import wait_for
from tests.harness.ha import SESSION_MS, Group
from tests.harness.replication import stats
from tests.harness.rocketmq import require_official_client, send_v1

pytestmark = pytest.mark.integration


def route(port, topic="tC"):
    """``{broker name: (brokerAddrs, queue count)}`` of ``topic``'s route as the broker on ``port`` gives it."""
    with RemotingClient(port) as rc:
        r = rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert r.code == C.SUCCESS, r
        body = json.loads(r.body)
    queues = {q["brokerName"]: q["writeQueueNums"] for q in body["queueDatas"]}
    return {b["brokerName"]: (b["brokerAddrs"], queues[b["brokerName"]]) for b in body["brokerDatas"]}


def cluster(port):
    with RemotingClient(port) as rc:
        info = json.loads(rc.call(R.GET_BROKER_CLUSTER_INFO).body)
    return {name: b["brokerAddrs"] for name, b in info["brokerAddrTable"].items()}


def rport(b):
    return b.config["remoting"]["port"]


def raddr(b):
    return "127.0.0.1:%d" % rport(b)


def put(b, topic="tC"):
    with RemotingClient(rport(b)) as rc:
        assert send_v1(rc, topic, b"x").code == C.SUCCESS


def standalone(broker_factory, tmp_path, zk, broker_id, grpc=False):
    wd = tmp_path / ("b%d" % broker_id)
    more = {"grpc": {"port": free_port()}} if grpc else {}
    cfg = small_config(wd / "data", broker={"id": broker_id}, remoting={"port": free_port()},
                       zk={"connect": zk, "session_timeout_ms": SESSION_MS}, **more)
    return broker_factory(cfg, workdir=wd)


@pytest.fixture
def two(broker_factory, tmp_path, zk_connect):
    """Brokers 1 and 2, each a master with a remoting and a gRPC port, both holding topic tC."""
    pair = [standalone(broker_factory, tmp_path, zk_connect, i, grpc=True) for i in (1, 2)]
    for b in pair:
        put(b)
    return pair


def test_every_broker_routes_to_both_brokers_of_the_cluster(two):
    one, other = two
    want = {"metaq-1": ({"0": raddr(one)}, 4), "metaq-2": ({"0": raddr(other)}, 4)}
    for b in two:
        wait_for(lambda b=b: route(rport(b)) == want, 10, lambda b=b: "both brokers in %s" % route(rport(b)))
        assert cluster(rport(b)) == {"metaq-1": {"0": raddr(one)}, "metaq-2": {"0": raddr(other)}}
    # a topic only broker 2 holds: broker 1 names it, and itself (its topic table accepts every t* topic)
    put(other, "tOnly2")
    wait_for(lambda: "metaq-2" in route(rport(one), "tOnly2"), 10, "broker 2's topic in broker 1's route")
    assert route(rport(one), "tOnly2") == {"metaq-1": ({"0": raddr(one)}, 4), "metaq-2": ({"0": raddr(other)}, 4)}


def test_grpc_query_route_lists_both_brokers_with_their_endpoints(two):
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("metaq.rmq5.messages_pb2")
    one, other = two
    wait_for(lambda: len(route(rport(one))) == 2, 10, "both brokers registered")
    channel = grpc.insecure_channel("127.0.0.1:%d" % one.config["grpc"]["port"])
    try:
        call = channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute",
                                   request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=pb.QueryRouteResponse.FromString)
        r = call(pb.QueryRouteRequest(topic=pb.Resource(name="tC")), metadata=[("x-mq-client-id", "t@1")], timeout=10)
    finally:
        channel.close()
    assert r.status.code == pb.OK, r.status
    seen = {}
    for q in r.message_queues:
        [address] = q.broker.endpoints.addresses
        seen.setdefault((q.broker.name, q.broker.id, address.host, address.port), []).append(q.id)
        assert q.permission == pb.READ_WRITE
    assert seen == {("metaq-1", 0, "127.0.0.1", one.config["grpc"]["port"]): [0, 1, 2, 3],
                    ("metaq-2", 0, "127.0.0.1", other.config["grpc"]["port"]): [0, 1, 2, 3]}


def test_the_official_producer_spreads_its_sends_over_both_brokers(two, tmp_path):
    """The RocketMQ 4 client, given broker 1 alone as its name server, sends round-robin over the route's
    eight queues: both brokers take messages. It sends again what failed, as an application does (``APP_RETRIES``:
    the client's own defect at start)."""
    require_official_client()
    from bench.rocketmq_peer import APP_RETRIES, run_peer
    one, other = two
    wait_for(lambda: all(len(route(rport(b))) == 2 for b in two), 10, "both brokers registered")
    before = [int(stats(b)["log_end_position"]) for b in two]
    lines = run_peer(tmp_path / "producer", "produce", "--ns", raddr(one), "--topic", "tC", "--count", 16, *APP_RETRIES)
    assert sum(1 for line in lines if "msg_id" in line) == 16
    after = [int(stats(b)["log_end_position"]) for b in two]
    assert after[0] > before[0] and after[1] > before[1], (before, after)


@pytest.mark.slow
@pytest.mark.fault
def test_routes_name_the_slaves_and_follow_a_failover(broker_factory, tmp_path, zk_connect):
    """Broker 7 is an ha: auto pair, broker 1 a master alone: broker 1's route names broker 7's elected master
    as 0 and its slave after; once that master is killed, the one elected in its place."""
    g = Group(broker_factory, tmp_path, zk_connect, n=2, mode="async", remoting=True)
    solo = standalone(broker_factory, tmp_path, zk_connect, 1)
    first = g.master()
    second = 1 - first
    g.following(first, [second])
    put(g.members[first])
    put(solo)
    pair = lambda: route(rport(solo)).get("metaq-7")  # noqa: E731
    want = ({"0": g.remoting(first), str(second + 1): g.remoting(second)}, 4)
    wait_for(lambda: pair() == want, 15, lambda: "broker 7's master and slave in %s" % route(rport(solo)))
    assert route(rport(solo))["metaq-1"] == ({"0": raddr(solo)}, 4)
    wait_for(lambda: route(rport(g.members[second]))["metaq-7"] == want, 10, "the slave's own route")
    assert route(rport(g.members[second]))["metaq-1"] == ({"0": raddr(solo)}, 4)

    g.members[first].kill()
    assert g.master(timeout=SESSION_MS / 1000.0 * 3 + 10, exclude=(first,)) == second
    want = ({"0": g.remoting(second)}, 4)
    wait_for(lambda: pair() == want, 15, lambda: "the new master in %s" % route(rport(solo)))
    assert cluster(rport(solo))["metaq-7"] == {"0": g.remoting(second)}
