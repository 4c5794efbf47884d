"""What a producer's Telemetry Settings may make the broker keep, against a real broker process (docs/rocketmq5.md
"Limits of the gRPC port"): at most ``GRPC_MAX_TOPICS_PER_SETTINGS`` names a Settings (one more ends the stream
INVALID_ARGUMENT, nothing kept), each Settings replacing the names of the one before on its stream, at most the
user's ``producer_topics`` quota over its streams and ``GRPC_MAX_PRODUCER_TOPICS`` on the broker (past either
RESOURCE_EXHAUSTED); a stream's names go when it closes."""

import queue

import pytest

from metaq.rmq5 import limits as rmq5_limits
from metaq.client.local import free_port, small_config
from metaq.protocol import stats as stats_codec
from tests.harness.acl import SECRETS, login, write_acl
from tests.harness.broker import wait_for
from tests.rmq5.test_grpc_port import SERVICE, Client, code, credentials

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

PER_SETTINGS = rmq5_limits.GRPC_MAX_TOPICS_PER_SETTINGS
QUOTA = 1500  # every user's producer_topics quota in the permissions file


def producer_settings(prefix, count):
    return pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
        topics=[pb.Resource(name="%s-%d" % (prefix, i)) for i in range(count)])))


class Stream:
    """One producer's Telemetry stream: ``settings`` sends a Settings and returns its answer (or the RpcError that
    ended the stream)."""

    def __init__(self, client, metadata):
        self.requests = queue.Queue()
        call = client.channel.stream_stream(SERVICE + "Telemetry", request_serializer=lambda m: m.SerializeToString(),
                                            response_deserializer=pb.TelemetryCommand.FromString)
        self.answers = call(iter(self.requests.get, None), metadata=metadata, timeout=60)

    def settings(self, prefix, count):
        self.requests.put(producer_settings(prefix, count))
        try:
            return next(self.answers)
        except grpc.RpcError as exc:
            return exc

    def close(self):
        self.requests.put(None)
        self.answers.cancel()


def held(broker, user):
    """``(held, quota)`` of ``producer_topics`` for ``user`` as ``stats quotas`` shows it."""
    with login(broker, "admin") as admin:
        rows = stats_codec.parse_quotas(admin.stats("quotas").encode())
    return {r.user: (r.used, r.limit) for r in rows if r.quota == "producer_topics"}.get(user)


@pytest.fixture
def secured(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml", quotas={"producer_topics": QUOTA})})
    b = broker_factory(cfg)
    c = Client(cfg["grpc"]["port"])
    yield b, c
    c.close()


def test_a_settings_at_the_names_limit_is_answered_and_one_more_name_ends_the_stream_keeping_nothing(secured):
    b, c = secured
    at = Stream(c, credentials("alice", SECRETS["alice"]))
    past = Stream(c, credentials("alice", SECRETS["alice"]))
    try:
        assert code(at.settings("orders-at", PER_SETTINGS).status) == "OK"
        err = past.settings("orders-past", PER_SETTINGS + 1)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "GRPC_MAX_TOPICS_PER_SETTINGS" in err.details() and str(PER_SETTINGS) in err.details()
        assert held(b, "alice") == (PER_SETTINGS, QUOTA)  # nothing of the refused one kept
        assert code(at.settings("orders-at2", 3).status) == "OK"  # the other stream goes on
    finally:
        at.close()
        past.close()


def test_each_settings_replaces_the_names_before_and_a_closed_stream_leaves_none(secured):
    b, c = secured
    s = Stream(c, credentials("alice", SECRETS["alice"]))
    try:
        for round_ in range(10):  # ten Settings of 1,000 different names: the stream holds the last 1,000
            assert code(s.settings("orders-r%d" % round_, 1000).status) == "OK"
        assert held(b, "alice") == (1000, QUOTA)
    finally:
        s.close()
    wait_for(lambda: held(b, "alice") == (0, QUOTA), timeout=10, what="the closed stream's names forgotten")


def test_a_users_streams_hold_its_quota_and_one_name_more_is_refused_while_another_user_goes_on(secured):
    b, c = secured
    alice = credentials("alice", SECRETS["alice"])
    first, second, third = Stream(c, alice), Stream(c, alice), Stream(c, alice)
    bobs = Stream(c, credentials("bob", SECRETS["bob"]))
    try:
        assert code(first.settings("orders-q1", 1000).status) == "OK"
        assert code(second.settings("orders-q2", QUOTA - 1000).status) == "OK"  # at the quota
        assert held(b, "alice") == (QUOTA, QUOTA)
        err = third.settings("orders-q3", 1)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "quota producer_topics of user alice is %d" % QUOTA in err.details()
        assert code(bobs.settings("orders", 1).status) == "OK"  # another user's own share
        assert code(first.settings("orders-q1b", 1000).status) == "OK"  # a stream's own names replaced: room
    finally:
        for s in (first, second, third, bobs):
            s.close()


def test_the_broker_keeps_at_most_grpc_max_producer_topics_names_and_refuses_one_more(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()})
    broker_factory(cfg)
    c = Client(cfg["grpc"]["port"])
    full, count = divmod(rmq5_limits.GRPC_MAX_PRODUCER_TOPICS, PER_SETTINGS)
    streams = [Stream(c, c.metadata) for _ in range(full + 2)]
    try:
        for i in range(full):
            assert code(streams[i].settings("t%d" % i, PER_SETTINGS).status) == "OK"
        if count:
            assert code(streams[full].settings("t-rest", count).status) == "OK"
        err = streams[-1].settings("t-more", 1)  # one past the broker's bound
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "GRPC_MAX_PRODUCER_TOPICS" in err.details()
    finally:
        for s in streams:
            s.close()
        c.close()
