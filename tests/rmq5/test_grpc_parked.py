"""gRPC long polls against a real broker process (docs/rocketmq5.md "Limits of the gRPC port"): a ReceiveMessage or
PullMessage the client resets (or whose connection ends) stops waiting at once, its place among the broker's parked
long polls free again; a user's parked receives and pulls count against its ``parked_gets`` quota (half of
``limits.max_parked_gets`` by default), so one user's long polls never take every place another user's text get
needs."""

import time

import pytest

from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from tests.harness.acl import SECRETS, login, write_acl
from tests.harness.broker import wait_for
from tests.rmq5.test_grpc_port import SERVICE, Client, code, credentials, message
from tests.rmq5.test_pop_grpc import ack, receive
from tests.rmq5.test_pull_grpc import mq

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

MAX_PARKED = 20  # limits.max_parked_gets here: every user's parked_gets quota is half, 10
QUOTA = MAX_PARKED // 2
TOPIC, GROUP = "orders-parked", "billing"


@pytest.fixture
def broker(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()}, limits={"max_parked_gets": MAX_PARKED},
                       store={"flush": "async", "flush_interval_ms": 20},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    return broker_factory(cfg)


@pytest.fixture
def alice(broker):
    c = Client(broker.config["grpc"]["port"], metadata=credentials("alice", SECRETS["alice"]))
    assert code(c.send(message(TOPIC, b"first")).status) == "OK"  # the topic exists, its one message consumed
    _st, got = receive(c, GROUP, TOPIC)
    assert code(ack(c, GROUP, TOPIC, *got).status) == "OK"
    yield c
    c.close()


def parked(broker):
    with login(broker, "admin") as admin:
        return int(admin.stats_dict()["parked_gets"])


def parked_of(broker, user):
    with login(broker, "admin") as admin:
        rows = stats_codec.parse_quotas(admin.stats("quotas").encode())
    return {r.user: (r.used, r.limit) for r in rows if r.quota == "parked_gets"}.get(user)


def start_receive(c, poll_ms=30_000):
    """A ReceiveMessage long poll, started and not read: the call (``cancel()`` resets its stream)."""
    request = pb.ReceiveMessageRequest(group=pb.Resource(name=GROUP), batch_size=8,
                                       message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=-1))
    request.invisible_duration.FromMilliseconds(10_000)
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    call = c.channel.unary_stream(SERVICE + "ReceiveMessage", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.ReceiveMessageResponse.FromString)
    return call(request, metadata=c.metadata, timeout=poll_ms / 1000.0 + 10)


def start_pull(c, poll_ms=30_000):
    """A PullMessage long poll at the end of queue 0 (past the one message), started and not read."""
    request = pb.PullMessageRequest(group=pb.Resource(name=GROUP), message_queue=mq(TOPIC, 0), offset=1,
                                    batch_size=8)
    request.long_polling_timeout.FromMilliseconds(poll_ms)
    call = c.channel.unary_stream(SERVICE + "PullMessage", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.PullMessageResponse.FromString)
    return call(request, metadata=c.metadata, timeout=poll_ms / 1000.0 + 10)


def text_long_poll(broker, user, wait_ms=300):
    """A text long-poll get of ``user`` on an empty partition: its reply (a Value once the wait ends, 503 when no
    place was free)."""
    with login(broker, user) as text:
        return text.call(ev.Get("tq-parked-text", "g", 0, 0, 4096, 7, wait_ms))


def test_reset_receives_and_pulls_leave_their_places_at_once_and_take_nothing(broker, alice):
    calls = [start_receive(alice) for _ in range(QUOTA - 1)] + [start_pull(alice)]
    wait_for(lambda: parked(broker) == QUOTA, timeout=10, what="the long polls parked")
    for call in calls:
        call.cancel()  # RST_STREAM: the client gave up
    # well before the 30 s long polls would have ended by themselves
    wait_for(lambda: parked(broker) == 0, timeout=5, what="the reset long polls to leave their places")
    assert parked_of(broker, "alice") == (0, QUOTA)
    assert code(alice.send(message(TOPIC, b"after")).status) == "OK"
    st, got = receive(alice, GROUP, TOPIC, poll_ms=2000)  # none of the reset receives took it
    assert code(st) == "OK" and [m.body for m in got] == [b"after"] and got[0].system_properties.delivery_attempt == 1


def test_open_and_reset_in_a_loop_on_one_connection_holds_no_place(broker, alice):
    for _ in range(200):  # each reset as soon as it is opened
        start_receive(alice).cancel()
    wait_for(lambda: parked(broker) == 0, timeout=5, what="every reset receive gone")
    assert text_long_poll(broker, "reader").code != 503


def test_a_users_parked_receives_stop_at_its_quota_and_another_users_text_get_still_parks(broker, alice):
    calls = [start_receive(alice) for _ in range(QUOTA - 1)] + [start_pull(alice)]  # at the quota
    try:
        wait_for(lambda: parked_of(broker, "alice") == (QUOTA, QUOTA), timeout=10, what="alice at her quota")
        st, _got = receive(alice, GROUP, TOPIC, poll_ms=5000)  # one past: at once
        assert code(st) == "TOO_MANY_REQUESTS" and "quota parked_gets of user alice is %d" % QUOTA in st.message
        pulled = start_pull(alice)
        status = next(iter(pulled)).status
        assert code(status) == "TOO_MANY_REQUESTS" and "parked_gets" in status.message
        t0 = time.monotonic()
        reply = text_long_poll(broker, "reader", wait_ms=300)  # parked, not refused: answered at its wait's end
        assert reply.code != 503 and time.monotonic() - t0 >= 0.25
    finally:
        for call in calls:
            call.cancel()
    wait_for(lambda: parked(broker) == 0, timeout=5, what="the places freed")


def test_a_closed_connection_ends_its_parked_receives(broker, alice):
    other = Client(broker.config["grpc"]["port"], metadata=alice.metadata)
    calls = [start_receive(other) for _ in range(3)]
    wait_for(lambda: parked(broker) == 3, timeout=10, what="three parked")
    other.close()  # the channel's connection ends
    wait_for(lambda: parked(broker) == 0, timeout=5, what="the closed connection's receives gone")
    assert all(call.done() for call in calls)
