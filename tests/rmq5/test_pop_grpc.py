"""Receiving over gRPC (POP) against a real broker process, with grpcio and our generated messages: QueryAssignment,
ReceiveMessage (a server stream), AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, the
filter expressions, the Settings' FIFO flag and maximum attempts, and the permission check."""

import threading
import time

import pytest

from metaq.client.local import BrokerProcess, free_port, small_config
from metaq.client.raw import TextClient
from tests.harness.acl import SECRETS, write_acl
from tests.rmq5.test_grpc_port import SERVICE, Client, code, credentials, message, stored

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

CLIENT = "pop@1@1@x"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpcpop")
    cfg = small_config(wd / "data", grpc={"port": free_port()}, store={"flush": "async", "flush_interval_ms": 20})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


@pytest.fixture
def client(broker):
    c = Client(broker.config["grpc"]["port"], metadata=(("x-mq-client-id", CLIENT),))
    yield c
    c.close()


def receive(c, group, topic, batch=8, invisible_ms=10_000, poll_ms=0, expression=None, metadata=None):
    """The whole ReceiveMessage stream: ``(status, [message], delivery timestamps)``."""
    request = pb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=batch,
                                       message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1))
    request.invisible_duration.FromMilliseconds(invisible_ms)
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    if expression is not None:
        request.filter_expression.CopyFrom(expression)
    call = c.channel.unary_stream(SERVICE + "ReceiveMessage", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.ReceiveMessageResponse.FromString)
    responses = list(call(request, metadata=c.metadata if metadata is None else metadata, timeout=10))
    statuses = [r.status for r in responses if r.WhichOneof("content") == "status"]
    assert len(statuses) == 1 and responses[0].WhichOneof("content") == "status"  # the proxy's shape: status first
    assert responses[-1].WhichOneof("content") == "delivery_timestamp"
    return statuses[0], [r.message for r in responses if r.WhichOneof("content") == "message"]


def ack(c, group, topic, *messages, handles=None):
    entries = [pb.AckMessageEntry(message_id=m.system_properties.message_id,
                                  receipt_handle=m.system_properties.receipt_handle) for m in messages]
    entries += [pb.AckMessageEntry(message_id="x", receipt_handle=h) for h in handles or ()]
    return c.unary("AckMessage", pb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                                                      entries=entries), pb.AckMessageResponse)


def settings(c, fifo=False, max_attempts=0, metadata=None):
    """Send a consumer's Settings on a Telemetry stream; the answer."""
    telemetry = c.channel.stream_stream(SERVICE + "Telemetry", request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=pb.TelemetryCommand.FromString)
    s = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(fifo=fifo))
    s.backoff_policy.max_attempts = max_attempts
    return next(telemetry(iter([pb.TelemetryCommand(settings=s)]), metadata=metadata or c.metadata, timeout=10))


def bodies(messages):
    return sorted(m.body for m in messages)


def test_received_messages_acked_are_not_delivered_again(client):
    sent = client.send(*[message("tq-ack", b"m%d" % i, tag="TagA", keys=["k%d" % i], props={"p": "v"})
                         for i in range(3)])
    assert code(sent.status) == "OK"
    st, got = receive(client, "g-ack", "tq-ack")
    assert code(st) == "OK" and bodies(got) == [b"m0", b"m1", b"m2"]
    m = got[0]
    sp = m.system_properties
    assert m.topic.name == "tq-ack" and sp.tag == "TagA" and sp.delivery_attempt == 1 and sp.receipt_handle
    assert m.user_properties["p"] == "v" and sp.message_id in {e.message_id for e in sent.entries}
    a = ack(client, "g-ack", "tq-ack", *got)
    assert code(a.status) == "OK" and [code(e.status) for e in a.entries] == ["OK"] * 3
    again = ack(client, "g-ack", "tq-ack", got[0], handles=["not-a-handle"])
    assert code(again.status) == "MULTIPLE_RESULTS"
    assert [code(e.status) for e in again.entries] == ["OK", "INVALID_RECEIPT_HANDLE"]  # a repeated ack is fine
    st, none = receive(client, "g-ack", "tq-ack", poll_ms=300)
    assert code(st) == "MESSAGE_NOT_FOUND" and none == []


def test_a_message_not_acked_comes_back_after_its_invisible_duration_with_attempt_2(client):
    client.send(message("tq-redeliver", b"once"))
    _st, first = receive(client, "g-re", "tq-redeliver", invisible_ms=500)
    assert bodies(first) == [b"once"]
    _st, hidden = receive(client, "g-re", "tq-redeliver")
    assert hidden == []  # invisible to the group meanwhile
    _st, second = receive(client, "g-re", "tq-redeliver", poll_ms=3000)  # the long poll ends when it expires
    assert bodies(second) == [b"once"] and second[0].system_properties.delivery_attempt == 2
    stale = ack(client, "g-re", "tq-redeliver", first[0])
    assert code(stale.status) == "INVALID_RECEIPT_HANDLE"  # the first delivery's handle no longer acks
    assert code(ack(client, "g-re", "tq-redeliver", second[0]).status) == "OK"


def test_change_invisible_duration_gives_a_new_handle_and_hides_the_message_longer(client):
    client.send(message("tq-change", b"slow"))
    _st, got = receive(client, "g-ch", "tq-change", invisible_ms=400)
    request = pb.ChangeInvisibleDurationRequest(group=pb.Resource(name="g-ch"), topic=pb.Resource(name="tq-change"),
                                                receipt_handle=got[0].system_properties.receipt_handle)
    request.invisible_duration.FromSeconds(30)
    r = client.unary("ChangeInvisibleDuration", request, pb.ChangeInvisibleDurationResponse)
    assert code(r.status) == "OK" and r.receipt_handle != got[0].system_properties.receipt_handle
    time.sleep(0.6)
    _st, none = receive(client, "g-ch", "tq-change")
    assert none == []  # past the first duration, still hidden
    assert code(client.unary("ChangeInvisibleDuration", request, pb.ChangeInvisibleDurationResponse).status) \
        == "INVALID_RECEIPT_HANDLE"  # the old handle is spent
    assert code(ack(client, "g-ch", "tq-change", handles=[r.receipt_handle]).status) == "OK"


def test_a_nack_wakes_a_receive_already_waiting_for_the_group(broker, client):
    """A receive long-polling when another consumer's nack makes a message visible sooner than any deadline it knew
    of gets it then, not at the end of its poll."""
    client.send(message("tq-nackwake", b"retry me"))
    _st, got = receive(client, "g-nw", "tq-nackwake", invisible_ms=60_000)
    other = Client(broker.config["grpc"]["port"], metadata=(("x-mq-client-id", "waiter@1@1@x"),))
    result = {}

    def wait():
        started = time.monotonic()
        result["got"] = receive(other, "g-nw", "tq-nackwake", poll_ms=8000)[1]
        result["s"] = time.monotonic() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        time.sleep(1.0)  # the other receive is waiting: nothing visible, the only deadline 60 s away
        request = pb.ChangeInvisibleDurationRequest(group=pb.Resource(name="g-nw"),
                                                    topic=pb.Resource(name="tq-nackwake"),
                                                    receipt_handle=got[0].system_properties.receipt_handle)
        request.invisible_duration.FromMilliseconds(0)  # a push consumer's nack
        assert code(client.unary("ChangeInvisibleDuration", request, pb.ChangeInvisibleDurationResponse).status) == "OK"
        waiter.join(15)
        assert [m.body for m in result["got"]] == [b"retry me"] and result["s"] < 5.0, result
        assert result["got"][0].system_properties.delivery_attempt == 2
    finally:
        waiter.join(15)
        other.close()


def test_forward_to_dead_letter_queue_copies_it_to_the_groups_dlq(broker, client):
    client.send(message("tq-dlq", b"poison"))
    _st, got = receive(client, "g-dead", "tq-dlq")
    r = client.unary("ForwardMessageToDeadLetterQueue", pb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name="g-dead"), topic=pb.Resource(name="tq-dlq"),
        receipt_handle=got[0].system_properties.receipt_handle, message_id=got[0].system_properties.message_id,
        delivery_attempt=1, max_delivery_attempts=16), pb.ForwardMessageToDeadLetterQueueResponse)
    assert code(r.status) == "OK"
    dead = [rec.payload for recs in stored(broker, "%DLQ%g-dead", 8).values() for rec in recs]
    assert dead == [b"poison"]
    _st, none = receive(client, "g-dead", "tq-dlq", poll_ms=200)
    assert none == []


def test_max_attempts_from_the_settings_sends_the_message_to_the_dlq_after_them(broker, client):
    answer = settings(client, max_attempts=2)
    assert answer.settings.backoff_policy.max_attempts == 2
    client.send(message("tq-attempts", b"twice"))
    for attempt in (1, 2):
        _st, got = receive(client, "g-att", "tq-attempts", invisible_ms=200, poll_ms=2000)
        assert [m.system_properties.delivery_attempt for m in got] == [attempt]
    _st, none = receive(client, "g-att", "tq-attempts", poll_ms=600)
    assert none == []
    assert [rec.payload for recs in stored(broker, "%DLQ%g-att", 8).values() for rec in recs] == [b"twice"]


def test_a_text_put_is_received_over_grpc(broker, client):
    with TextClient(broker.host, broker.port, 10) as text:
        assert text.put("tq-text", b"from-text", partition=2).code == 200
    _st, got = receive(client, "g-text", "tq-text")
    assert bodies(got) == [b"from-text"] and got[0].system_properties.queue_id == 2
    assert got[0].system_properties.message_id  # metaq's id when the producer named none


def test_two_receivers_of_one_partition_get_different_messages(client, broker):
    client.send(*[message("tq-two", b"%d" % i, group="one-group") for i in range(4)])  # one queue
    other = Client(broker.config["grpc"]["port"], metadata=(("x-mq-client-id", "other@1"),))
    try:
        _st, a = receive(client, "g-two", "tq-two", batch=2)
        _st, b = receive(other, "g-two", "tq-two", batch=2)
    finally:
        other.close()
    assert len(a) == 2 and len(b) == 2 and bodies(a + b) == [b"0", b"1", b"2", b"3"]


def test_a_fifo_group_gets_one_message_of_a_message_group_at_a_time_in_order(client):
    assert settings(client, fifo=True).settings.subscription.fifo is True
    try:
        client.send(*[message("tq-fifo", b"%d" % i, group="order-7") for i in range(3)])
        _st, first = receive(client, "g-fifo", "tq-fifo")
        assert bodies(first) == [b"0"]
        _st, blocked = receive(client, "g-fifo", "tq-fifo")
        assert blocked == []  # the group's next waits for the first's ack
        ack(client, "g-fifo", "tq-fifo", *first)
        _st, second = receive(client, "g-fifo", "tq-fifo")
        assert bodies(second) == [b"1"]
        assignment = client.unary("QueryAssignment", pb.QueryAssignmentRequest(
            topic=pb.Resource(name="tq-fifo"), group=pb.Resource(name="g-fifo")), pb.QueryAssignmentResponse)
        assert [a.message_queue.id for a in assignment.assignments] == [0, 1, 2, 3]  # a FIFO group: every queue
    finally:
        settings(client, fifo=False)


def test_query_assignment_gives_a_non_fifo_group_one_queue_of_any_id_per_broker(client):
    r = client.unary("QueryAssignment", pb.QueryAssignmentRequest(topic=pb.Resource(name="tq-assign"),
                                                                  group=pb.Resource(name="g-assign")),
                     pb.QueryAssignmentResponse)
    assert code(r.status) == "OK" and [a.message_queue.id for a in r.assignments] == [-1]
    assert r.assignments[0].message_queue.permission == pb.READ_WRITE
    bad_group, _none = receive(client, "", "tq-assign")
    assert code(bad_group) == "ILLEGAL_CONSUMER_GROUP"
    bad_topic, _none = receive(client, "g-assign", "no spaces")
    assert code(bad_topic) == "ILLEGAL_TOPIC"


def test_tag_and_sql_filters_deliver_only_matching_messages_and_skip_the_others(client):
    client.send(message("tq-filter", b"a", tag="TagA", props={"n": "5"}),
                message("tq-filter", b"b", tag="TagB", props={"n": "50"}),
                message("tq-filter", b"c", props={"n": "7"}))
    _st, tagged = receive(client, "g-tag", "tq-filter", expression=pb.FilterExpression(type=pb.TAG,
                                                                                       expression="TagA || TagC"))
    assert bodies(tagged) == [b"a"]
    _st, rest = receive(client, "g-tag", "tq-filter", poll_ms=200)
    assert rest == []  # the group's filtered-out messages were acknowledged, never delivered
    _st, sql = receive(client, "g-sql", "tq-filter", expression=pb.FilterExpression(type=pb.SQL,
                                                                                    expression="n < 10"))
    assert bodies(sql) == [b"a", b"c"]
    bad, _none = receive(client, "g-sql", "tq-filter", expression=pb.FilterExpression(type=pb.SQL,
                                                                                      expression="n <"))
    assert code(bad) == "ILLEGAL_FILTER_EXPRESSION"


def test_a_receive_passes_over_filter_rounds_batches_of_filtered_out_messages_and_no_more(client):
    from metaq.rmq5.receives import FILTER_ROUNDS
    wanted = pb.FilterExpression(type=pb.TAG, expression="Wanted")
    for topic, unwanted in (("tq-rounds-at", 4 * (FILTER_ROUNDS - 1)), ("tq-rounds-past", 4 * FILTER_ROUNDS)):
        client.send(*[message(topic, b"no%d" % i, tag="Other", group="g") for i in range(unwanted)])  # one queue
        client.send(message(topic, b"yes", tag="Wanted", group="g"))
    st, got = receive(client, "g-rounds", "tq-rounds-at", batch=4, expression=wanted)
    assert code(st) == "OK" and bodies(got) == [b"yes"]  # found in the last round, no long poll asked for
    st, none = receive(client, "g-rounds", "tq-rounds-past", batch=4, expression=wanted)
    assert code(st) == "MESSAGE_NOT_FOUND" and none == []  # every round filtered out: the call ends
    st, got = receive(client, "g-rounds", "tq-rounds-past", batch=4, expression=wanted)
    assert bodies(got) == [b"yes"]  # the next receive goes on past them


def test_without_subscribe_permission_a_receive_is_forbidden(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    b = BrokerProcess(tmp_path, cfg).start()
    c = Client(cfg["grpc"]["port"])
    try:
        alice = credentials("alice", SECRETS["alice"])
        assert code(c.send(message("orders", b"hers"), metadata=alice).status) == "OK"
        st, got = receive(c, "billing", "orders", metadata=alice)
        assert code(st) == "OK" and bodies(got) == [b"hers"]
        bob = credentials("bob", SECRETS["bob"])  # may publish to orders, not subscribe
        st, none = receive(c, "billing", "orders", metadata=bob)
        assert code(st) == "FORBIDDEN" and none == []
        denied = c.unary("AckMessage", pb.AckMessageRequest(
            group=pb.Resource(name="billing"), topic=pb.Resource(name="orders"),
            entries=[pb.AckMessageEntry(receipt_handle=got[0].system_properties.receipt_handle)]),
            pb.AckMessageResponse, bob)
        assert code(denied.status) == "FORBIDDEN"
        other_group, _none = receive(c, "not-billing", "orders", metadata=alice)
        assert code(other_group) == "FORBIDDEN"  # alice consumes as billing only
    finally:
        c.close()
        b.kill()


def test_consumer_settings_are_kept_for_at_most_grpc_max_consumer_clients(monkeypatch):
    from types import SimpleNamespace

    from metaq.rmq5 import limits as rmq5_limits
    from metaq.rmq5.calls import ClientKey
    from metaq.rmq5.consumers import CONSUMER_ATTEMPTS, ConsumerClients
    monkeypatch.setattr(rmq5_limits, "GRPC_MAX_CONSUMER_CLIENTS", 3)
    service = ConsumerClients(None)

    def call(client):
        return SimpleNamespace(metadata={"x-mq-client-id": client})

    for i in range(3):  # at the limit: every client's settings kept
        service.remember(ClientKey("", "c%d" % i), True, 5)  # authentication off: no user
    assert [service.settings_of(call("c%d" % i)).max_attempts for i in range(3)] == [5, 5, 5]
    service.remember(ClientKey("", "c3"), False, 2)  # one past: the one heard from longest ago is forgotten
    assert service.settings_of(call("c0")) == (False, CONSUMER_ATTEMPTS)
    assert service.settings_of(call("c1")).fifo is True and service.settings_of(call("c3")).max_attempts == 2
