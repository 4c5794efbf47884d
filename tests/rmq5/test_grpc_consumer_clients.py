"""The gRPC port's consumer clients table per user, against a real broker process (docs/security.md "Quotas",
docs/rocketmq5.md "Limits of the gRPC port"): a user keeps the Settings of at most its ``consumer_clients`` quota
of consumer clients; one client more is refused RESOURCE_EXHAUSTED, naming the quota, while another user's clients
and their Settings stay; a client that ends (NotifyClientTermination) frees its place."""

import queue

import pytest

from metaq.rmq5 import limits as rmq5_limits
from metaq.client.local import free_port, small_config
from metaq.protocol import stats as stats_codec
from tests.harness.acl import SECRETS, login, write_acl
from tests.rmq5.test_grpc_port import SERVICE, Client, code, credentials

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

QUOTA = 3  # every user's consumer_clients quota in the permissions file
PARTITIONS = 2  # small_config's partitions of a topic such as orders


def signed(user, client_id):
    """``user``'s signed call metadata, as client ``client_id``."""
    signature = [kv for kv in credentials(user, SECRETS[user]) if kv[0] != "x-mq-client-id"]
    return [("x-mq-client-id", client_id)] + signature


class Consumer:
    """One consumer client's Telemetry stream: ``settings`` sends its Settings (FIFO, group billing) and returns
    the answer, or the RpcError that ended the stream."""

    def __init__(self, client, metadata):
        self.requests = queue.Queue()
        call = client.channel.stream_stream(SERVICE + "Telemetry", request_serializer=lambda m: m.SerializeToString(),
                                            response_deserializer=pb.TelemetryCommand.FromString)
        self.answers = call(iter(self.requests.get, None), metadata=metadata, timeout=60)

    def settings(self):
        self.requests.put(pb.TelemetryCommand(settings=pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.
                                                                   Subscription(group=pb.Resource(name="billing"),
                                                                                fifo=True))))
        try:
            return next(self.answers)
        except grpc.RpcError as exc:
            return exc

    def close(self):
        self.requests.put(None)
        self.answers.cancel()


def held(broker, user):
    """``(held, quota)`` of ``consumer_clients`` for ``user`` as ``stats quotas`` shows it."""
    with login(broker, "admin") as admin:
        rows = stats_codec.parse_quotas(admin.stats("quotas").encode())
    return {r.user: (r.used, r.limit) for r in rows if r.quota == "consumer_clients"}.get(user)


def assigned(c, metadata):
    """The queues QueryAssignment gives the client of ``metadata`` for orders as billing: every partition when its
    kept Settings asked for order, one "any queue" otherwise."""
    r = c.unary("QueryAssignment", pb.QueryAssignmentRequest(topic=pb.Resource(name="orders"),
                                                             group=pb.Resource(name="billing")),
                pb.QueryAssignmentResponse, metadata)
    assert code(r.status) == "OK", r.status
    return len(r.assignments)


@pytest.fixture
def secured(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml", quotas={"consumer_clients": QUOTA})})
    b = broker_factory(cfg)
    with login(b, "alice") as alice:
        assert alice.put("orders", b"x").code == 200  # the topic, with its partitions
    c = Client(cfg["grpc"]["port"])
    yield b, c
    c.close()


def test_a_user_keeps_its_quota_of_consumer_clients_and_one_more_is_refused_while_another_users_stay(secured):
    b, c = secured
    readers = Consumer(c, signed("reader", "reader@1"))
    alices = [Consumer(c, signed("alice", "alice@%d" % i)) for i in range(QUOTA + 1)]
    try:
        assert code(readers.settings().status) == "OK"
        for s in alices[:QUOTA]:  # at the quota: every client's Settings kept
            assert code(s.settings().status) == "OK"
        assert held(b, "alice") == (QUOTA, QUOTA)
        err = alices[QUOTA].settings()  # one past: refused, nothing of it kept
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "quota consumer_clients of user alice is %d" % QUOTA in err.details()
        assert held(b, "alice") == (QUOTA, QUOTA) and held(b, "reader") == (1, QUOTA)
        assert assigned(c, signed("reader", "reader@1")) == PARTITIONS  # the other user's Settings (FIFO) kept
        assert assigned(c, signed("alice", "alice@0")) == PARTITIONS  # and the user's own first one
        assert assigned(c, signed("alice", "alice@%d" % QUOTA)) == 1  # the refused one: the defaults
        ended = c.unary("NotifyClientTermination", pb.NotifyClientTerminationRequest(
            group=pb.Resource(name="billing")), pb.NotifyClientTerminationResponse, signed("alice", "alice@0"))
        assert code(ended.status) == "OK"
        assert held(b, "alice") == (QUOTA - 1, QUOTA)  # an ended client frees its place
        again = Consumer(c, signed("alice", "alice@%d" % QUOTA))
        alices.append(again)
        assert code(again.settings().status) == "OK"
        assert held(b, "alice") == (QUOTA, QUOTA)
    finally:
        for s in [readers] + alices:
            s.close()


def test_a_users_new_clients_never_push_out_another_users_live_settings_at_the_brokers_bound(monkeypatch):
    """The broker-wide bound with users: the oldest client is forgotten only when idle (GRPC_CLIENT_IDLE_MS), else
    the new one is refused; with authentication off it is forgotten as before (one tenant)."""
    from types import SimpleNamespace

    from metaq.rmq5.calls import ClientKey
    from metaq.rmq5.consumers import ConsumerClients
    from metaq.rmq5.wire import GrpcError, Status
    monkeypatch.setattr(rmq5_limits, "GRPC_MAX_CONSUMER_CLIENTS", 3)
    quotas = SimpleNamespace(check=lambda user, name, current, more=1: None)  # every user's share: the whole table
    service = ConsumerClients(SimpleNamespace(quotas=quotas))
    service.remember(ClientKey("bob", "b0"), True, 5, now=100.0)
    service.remember(ClientKey("alice", "a0"), True, 5, now=100.0)
    service.remember(ClientKey("alice", "a1"), True, 5, now=100.0)  # at the bound
    with pytest.raises(GrpcError) as refused:  # one more while bob's client lives: refused, bob's kept
        service.remember(ClientKey("alice", "a2"), True, 5, now=101.0)
    assert refused.value.status == Status.RESOURCE_EXHAUSTED and "GRPC_MAX_CONSUMER_CLIENTS" in str(refused.value)
    assert ClientKey("bob", "b0") in service and ClientKey("alice", "a2") not in service
    later = 100.0 + rmq5_limits.GRPC_CLIENT_IDLE_MS / 1000.0 + 1
    service.remember(ClientKey("alice", "a2"), True, 5, now=later)  # bob's idle since: forgotten
    assert ClientKey("bob", "b0") not in service
    assert service.held() == {"alice": 3}


def test_a_user_past_its_quota_forgets_its_own_idle_client_else_is_refused():
    """The user's share: at its quota a new client of the user takes the place of the user's own client heard from
    longest ago once that one is idle, never another user's."""
    from types import SimpleNamespace

    from metaq import errors
    from metaq.rmq5.calls import ClientKey
    from metaq.rmq5.consumers import ConsumerClients
    from metaq.rmq5.wire import GrpcError, Status

    def check(user, name, current, more=1):
        if current + more > 2:
            raise errors.QuotaExceeded(name, user, 2, "quota %s of user %s is 2" % (name, user))

    service = ConsumerClients(SimpleNamespace(quotas=SimpleNamespace(check=check)))
    for key in (ClientKey("bob", "b0"), ClientKey("alice", "a0"), ClientKey("alice", "a1")):
        service.remember(key, True, 5, now=100.0)  # alice at her quota of 2
    with pytest.raises(GrpcError) as refused:
        service.remember(ClientKey("alice", "a2"), True, 5, now=101.0)
    assert refused.value.status == Status.RESOURCE_EXHAUSTED and "consumer_clients of user alice" in str(refused.value)
    service.remember(ClientKey("alice", "a1"), True, 5, now=150.0)  # a known client: heard from again
    later = 100.0 + rmq5_limits.GRPC_CLIENT_IDLE_MS / 1000.0 + 1
    service.remember(ClientKey("alice", "a2"), True, 5, now=later)  # a0 idle: alice's own, forgotten
    assert set(service.clients()) == {ClientKey("bob", "b0"), ClientKey("alice", "a1"), ClientKey("alice", "a2")}
