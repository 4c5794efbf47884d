"""Pull consumers over gRPC against a real broker process, with grpcio and our generated messages: PullMessage (a
server stream: a status, the messages, next_offset) from an offset, its long poll, its filters and batch limit,
UpdateOffset / GetOffset across a restart and across protocols, QueryOffset's policies, permissions, bad input."""

import threading
import time

import pytest

from metaq.rmq5 import limits as rmq5_limits
from metaq.client.local import BrokerProcess, free_port, rmq_config, small_config
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode
from metaq.rmq5.records import group_queue
from tests.harness.acl import SECRETS, write_acl
from tests.rmq5.test_grpc_port import SERVICE, Client, code, credentials, message

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

CLIENT = "pull@1@1@x"
QUEUES = 4  # t* topics have 4 partitions (small_config)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpcpull")
    cfg = small_config(wd / "data", grpc={"port": free_port()}, store={"flush": "async", "flush_interval_ms": 20})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


@pytest.fixture
def client(broker):
    c = Client(broker.config["grpc"]["port"], metadata=(("x-mq-client-id", CLIENT),))
    yield c
    c.close()


def mq(topic, queue):
    return pb.MessageQueue(topic=pb.Resource(name=topic), id=queue)


def pull(c, group, topic, queue, offset, batch=8, poll_ms=0, expression=None, metadata=None, timeout=10):
    """The whole PullMessage stream: ``(status, [message], next_offset or None)``, its shape checked."""
    request = pb.PullMessageRequest(group=pb.Resource(name=group), message_queue=mq(topic, queue), offset=offset,
                                    batch_size=batch)
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    if expression is not None:
        request.filter_expression.CopyFrom(expression)
    call = c.channel.unary_stream(SERVICE + "PullMessage", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.PullMessageResponse.FromString)
    responses = list(call(request, metadata=c.metadata if metadata is None else metadata, timeout=timeout))
    kinds = [r.WhichOneof("content") for r in responses]
    assert kinds[0] == "status" and kinds.count("status") == 1  # the proxy's shape: the status first
    assert kinds.count("next_offset") <= 1 and "next_offset" not in kinds[:-1]  # next_offset last, if any
    nxt = responses[-1].next_offset if kinds[-1] == "next_offset" else None
    return responses[0].status, [r.message for r in responses if r.WhichOneof("content") == "message"], nxt


def one_queue(c, topic, bodies, tag=None, props=None):
    """Send ``bodies`` to one queue of ``topic`` (one message group); its id."""
    sent = c.send(*[message(topic, b, tag=tag, group="g", props=props) for b in bodies])
    assert code(sent.status) == "OK"
    return group_queue("g", QUEUES)


def update(c, group, topic, queue, offset, metadata=None):
    return c.unary("UpdateOffset", pb.UpdateOffsetRequest(group=pb.Resource(name=group), message_queue=mq(topic, queue),
                                                          offset=offset), pb.UpdateOffsetResponse, metadata)


def get(c, group, topic, queue, metadata=None):
    return c.unary("GetOffset", pb.GetOffsetRequest(group=pb.Resource(name=group), message_queue=mq(topic, queue)),
                   pb.GetOffsetResponse, metadata)


def query(c, topic, queue, policy, timestamp_ms=None, metadata=None):
    request = pb.QueryOffsetRequest(message_queue=mq(topic, queue), query_offset_policy=policy)
    if timestamp_ms is not None:
        request.timestamp.FromMilliseconds(timestamp_ms)
    return c.unary("QueryOffset", request, pb.QueryOffsetResponse, metadata)


def test_a_pull_reads_from_its_offset_and_names_the_next_one(client):
    q = one_queue(client, "tp-read", [b"m%d" % i for i in range(5)], tag="TagA")
    st, got, nxt = pull(client, "g-read", "tp-read", q, 0, batch=3)
    assert code(st) == "OK" and [m.body for m in got] == [b"m0", b"m1", b"m2"] and nxt == 3
    m = got[1].system_properties
    assert got[1].topic.name == "tp-read" and m.queue_id == q and m.queue_offset == 1 and m.tag == "TagA"
    assert not m.HasField("receipt_handle") and m.message_group == "g"
    st, got, nxt = pull(client, "g-read", "tp-read", q, 3, batch=3)
    assert [m.body for m in got] == [b"m3", b"m4"] and nxt == 5
    st, none, nxt = pull(client, "g-read", "tp-read", q, 5)
    assert code(st) == "MESSAGE_NOT_FOUND" and none == [] and nxt == 5
    st, again, _nxt = pull(client, "other-group", "tp-read", q, 1, batch=1)
    assert [m.body for m in again] == [b"m1"]  # an offset read: nothing is taken from anyone


def test_a_long_poll_is_woken_by_a_put_and_ends_at_its_timeout(client):
    q = group_queue("g", QUEUES)
    t0 = time.monotonic()
    st, none, nxt = pull(client, "g-poll", "tp-poll", q, 0, poll_ms=500, timeout=40)
    # its own 500 ms, not the call's budget (40 s less the reserve)
    assert code(st) == "MESSAGE_NOT_FOUND" and nxt == 0 and 0.45 <= time.monotonic() - t0 < 15
    result = {}

    def poll():
        result["pull"] = pull(client, "g-poll", "tp-poll", q, 0, poll_ms=30000, timeout=40)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    sent_at = time.monotonic()
    one_queue(client, "tp-poll", [b"wake"])
    thread.join(40)
    st, got, nxt = result["pull"]
    assert code(st) == "OK" and [m.body for m in got] == [b"wake"] and nxt == 1
    assert result["at"] - sent_at < 15  # woken by the put, not at the end of its 30 s


def test_tag_and_sql_filters_serve_only_matching_messages_and_pass_the_others(client):
    sent = client.send(message("tp-filter", b"a", tag="TagA", group="g", props={"n": "5"}),
                       message("tp-filter", b"b", tag="TagB", group="g", props={"n": "50"}),
                       message("tp-filter", b"c", group="g", props={"n": "7"}),
                       message("tp-filter", b"d", tag="TagB", group="g", props={"n": "70"}))
    assert code(sent.status) == "OK"
    q = group_queue("g", QUEUES)
    tags = pb.FilterExpression(type=pb.TAG, expression="TagA || TagC")
    st, got, nxt = pull(client, "g-f", "tp-filter", q, 0, expression=tags)
    assert code(st) == "OK" and [m.body for m in got] == [b"a"]
    st, none, nxt = pull(client, "g-f", "tp-filter", q, nxt, expression=tags)
    assert code(st) == "MESSAGE_NOT_FOUND" and none == [] and nxt == 4  # past the unwanted ones
    st, got, nxt = pull(client, "g-f", "tp-filter", q, 0, expression=pb.FilterExpression(type=pb.SQL,
                                                                                         expression="n < 10"))
    assert [m.body for m in got] == [b"a", b"c"]
    st, _none, nxt = pull(client, "g-f", "tp-filter", q, 0, expression=pb.FilterExpression(type=pb.SQL,
                                                                                           expression="n <"))
    assert code(st) == "ILLEGAL_FILTER_EXPRESSION" and nxt is None  # a refusal is its status alone


def test_a_pull_serves_at_most_grpc_pull_max_batch_messages(client):
    n = rmq5_limits.GRPC_PULL_MAX_BATCH
    q = one_queue(client, "tp-batch", [b"%d" % i for i in range(n + 8)])
    st, got, nxt = pull(client, "g-b", "tp-batch", q, 0, batch=n)  # at the limit
    assert code(st) == "OK" and len(got) == n and nxt == n
    st, got, nxt = pull(client, "g-b", "tp-batch", q, 0, batch=n + 1)  # one past: served as the limit
    assert len(got) == n and nxt == n
    st, _none, nxt = pull(client, "g-b", "tp-batch", q, 0, batch=0)
    assert code(st) == "BAD_REQUEST" and nxt is None


def test_bad_queues_offsets_and_names_get_the_protocols_codes(client):
    q = one_queue(client, "tp-bad", [b"x", b"y"])
    st, none, nxt = pull(client, "g-bad", "tp-bad", q, 9)
    assert code(st) == "ILLEGAL_OFFSET" and none == [] and nxt == 2  # past the end: where to pull from
    st, none, nxt = pull(client, "g-bad", "tp-bad", q, -5)
    assert code(st) == "ILLEGAL_OFFSET" and nxt == 0
    assert code(pull(client, "g-bad", "tp-bad", QUEUES, 0)[0]) == "BAD_REQUEST"  # no such queue
    assert code(pull(client, "g-bad", "no spaces", 0, 0)[0]) == "ILLEGAL_TOPIC"
    assert code(pull(client, "bad group!", "tp-bad", q, 0)[0]) == "ILLEGAL_CONSUMER_GROUP"
    assert code(update(client, "g-bad", "tp-bad", q, -1).status) == "ILLEGAL_OFFSET"
    assert code(update(client, "g-bad", "tp-bad", QUEUES, 1).status) == "BAD_REQUEST"
    assert code(get(client, "g-never", "tp-bad", q).status) == "OFFSET_NOT_FOUND"
    assert code(query(client, "tp-bad", q, pb.TIMESTAMP).status) == "BAD_REQUEST"  # TIMESTAMP without one


def test_query_offset_by_policy_and_timestamp(client):
    q = one_queue(client, "tp-query", [b"early0", b"early1", b"early2"])
    time.sleep(0.05)
    between = int(time.time() * 1000)
    time.sleep(0.05)
    one_queue(client, "tp-query", [b"late0", b"late1"])
    assert query(client, "tp-query", q, pb.BEGINNING).offset == 0
    assert query(client, "tp-query", q, pb.END).offset == 5
    r = query(client, "tp-query", q, pb.TIMESTAMP, between)
    assert code(r.status) == "OK" and r.offset == 3
    assert [m.body for m in pull(client, "g-q", "tp-query", q, r.offset)[1]] == [b"late0", b"late1"]
    assert query(client, "tp-query", q, pb.TIMESTAMP, between + 3_600_000).offset == 5  # none after it: the end


def remoting_offset(b, group, topic, queue):
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        r = rc.call(RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue})
    return int(r.ext_fields["offset"]) if r.code == 0 else None


def test_offsets_survive_a_restart_and_are_shared_with_the_text_and_remoting_protocols(tmp_path):
    cfg = rmq_config(tmp_path / "data", grpc={"port": free_port()})
    b = BrokerProcess(tmp_path, cfg).start()
    c = Client(cfg["grpc"]["port"], metadata=(("x-mq-client-id", CLIENT),))
    try:
        with b.client() as text:
            for i in range(6):
                text.put_ok("tp-cross", b"text%d" % i, partition=2)
            text.call(ev.CommitOffset("g-text", "tp-cross", 2, 4, text.opaque()))
        st, got, nxt = pull(c, "g-grpc", "tp-cross", 2, 0)
        assert code(st) == "OK" and [m.body for m in got] == [b"text%d" % i for i in range(6)] and nxt == 6
        assert got[0].system_properties.message_id  # metaq's id for a message sent without one
        assert get(c, "g-text", "tp-cross", 2).offset == 4  # a text commit, read over gRPC
        assert code(update(c, "g-grpc", "tp-cross", 2, 5).status) == "OK"
        assert code(update(c, "g-far", "tp-cross", 2, 1000).status) == "OK"  # past the end: stored as the end
        with b.client() as text:
            assert text.call(ev.QueryOffset("g-grpc", "tp-cross", 2, text.opaque())).body == b"5"
        assert remoting_offset(b, "g-grpc", "tp-cross", 2) == 5  # what a RocketMQ 4 consumer starts from
        b.stop()
        b.start()
        assert get(c, "g-grpc", "tp-cross", 2).offset == 5
        assert get(c, "g-far", "tp-cross", 2).offset == 6
        with b.client() as text:
            assert text.call(ev.QueryOffset("g-grpc", "tp-cross", 2, text.opaque())).body == b"5"
    finally:
        c.close()
        b.kill()


def test_without_subscribe_permission_pulls_and_offsets_are_forbidden(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    b = BrokerProcess(tmp_path, cfg).start()
    c = Client(cfg["grpc"]["port"])
    try:
        alice = credentials("alice", SECRETS["alice"])
        q = group_queue("g", 2)  # other topics have 2 partitions (small_config)
        assert code(c.send(message("orders", b"hers", group="g"), metadata=alice).status) == "OK"
        st, got, _nxt = pull(c, "billing", "orders", q, 0, metadata=alice)
        assert code(st) == "OK" and [m.body for m in got] == [b"hers"]
        assert code(update(c, "billing", "orders", q, 1, metadata=alice).status) == "OK"
        assert get(c, "billing", "orders", q, metadata=alice).offset == 1
        bob = credentials("bob", SECRETS["bob"])  # may publish to orders, not subscribe
        st, none, nxt = pull(c, "billing", "orders", q, 0, metadata=bob)
        assert code(st) == "FORBIDDEN" and none == [] and nxt is None
        assert code(update(c, "billing", "orders", q, 0, metadata=bob).status) == "FORBIDDEN"
        assert code(get(c, "billing", "orders", q, metadata=bob).status) == "FORBIDDEN"
        assert code(query(c, "orders", q, pb.END, metadata=bob).status) == "FORBIDDEN"
        assert code(query(c, "orders", 7, pb.END, metadata=bob).status) == "FORBIDDEN"  # not told the queue is none
        assert code(pull(c, "not-billing", "orders", q, 0, metadata=alice)[0]) == "FORBIDDEN"  # billing only
        assert get(c, "billing", "orders", q, metadata=alice).offset == 1  # bob's commit changed nothing
    finally:
        c.close()
        b.kill()
