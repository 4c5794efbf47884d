"""RocketMQ 5 credentials and routes with authentication on, against a real broker process (docs/security.md
"RocketMQ 5 (gRPC)"): a signature is accepted within ``limits.GRPC_AUTH_MAX_SKEW_MS`` of the broker's clock and
refused past it either way, and QueryRoute answers only for a topic the user may publish to or subscribe to."""

import time

import pytest

from metaq.rmq5 import limits as rmq5_limits
from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.acl import SECRETS, write_acl
from tests.rmq5.test_grpc_port import Client, code, credentials, message, signing_date

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

SKEW_S = rmq5_limits.GRPC_AUTH_MAX_SKEW_MS // 1000


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpc5auth")
    cfg = small_config(wd / "data", grpc={"port": free_port()}, store={"flush": "async", "flush_interval_ms": 20},
                       security={"acl_file": write_acl(wd / "acl.yaml")})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


@pytest.fixture
def client(broker):
    c = Client(broker.config["grpc"]["port"])
    yield c
    c.close()


def send_signed_at(client, at):
    """A send as alice, signed at ``at`` (seconds since the epoch): its status."""
    meta = credentials("alice", SECRETS["alice"], signing_date(at))
    return client.send(message("orders", b"dated"), metadata=meta).status


def test_a_signature_within_the_skew_is_accepted_and_one_past_it_either_way_is_unauthorized(client):
    now = time.time()
    margin = 30  # the broker's clock moves on between signing and checking: well inside the bound, well past it
    assert code(send_signed_at(client, now - SKEW_S + margin)) == "OK"
    assert code(send_signed_at(client, now + SKEW_S - margin)) == "OK"
    for at, way in ((now - SKEW_S - margin, "behind"), (now + SKEW_S + margin, "ahead of")):
        st = send_signed_at(client, at)
        assert code(st) == "UNAUTHORIZED"
        assert way in st.message and "GRPC_AUTH_MAX_SKEW_MS" in st.message and str(SKEW_S) in st.message


def test_a_captured_header_of_yesterday_is_refused_and_a_malformed_date_too(client):
    old = credentials("alice", SECRETS["alice"], signing_date(time.time() - 86400))
    st = client.send(message("orders", b"replayed"), metadata=old).status
    assert code(st) == "UNAUTHORIZED" and "behind" in st.message
    bad = [(k, "2026-11-26 12:00:00" if k == "x-mq-date-time" else v)
           for k, v in credentials("alice", SECRETS["alice"])]
    st = client.send(message("orders", b"odd"), metadata=bad).status
    assert code(st) == "UNAUTHORIZED" and "x-mq-date-time" in st.message


def route(client, user, topic):
    return client.unary("QueryRoute", pb.QueryRouteRequest(topic=pb.Resource(name=topic)), pb.QueryRouteResponse,
                        credentials(user, SECRETS[user])).status


def test_a_route_is_answered_only_for_a_topic_the_user_may_publish_to_or_subscribe_to(broker, client):
    assert code(client.send(message("payroll-route", b"x"), metadata=credentials("admin", SECRETS["admin"])).status) \
        == "OK"  # an existing topic bob may not use
    assert code(route(client, "bob", "orders")) == "OK"  # bob: publish only
    assert code(route(client, "reader", "orders")) == "OK"  # reader: subscribe only
    assert code(route(client, "admin", "payroll-route")) == "OK"
    # bob may neither publish to nor subscribe to these: the same answer for one that exists and one that does not
    existing, missing = route(client, "bob", "payroll-route"), route(client, "bob", "no-such-topic-route")
    assert code(existing) == code(missing) == "FORBIDDEN"
    assert existing.message.replace("payroll-route", "T") == missing.message.replace("no-such-topic-route", "T")
    assert code(route(client, "alice", "payroll")) == "FORBIDDEN"  # denied by name


def test_a_queue_assignment_of_a_topic_the_user_may_not_read_is_forbidden(client):
    request = pb.QueryAssignmentRequest(topic=pb.Resource(name="payroll"), group=pb.Resource(name="billing"))
    r = client.unary("QueryAssignment", request, pb.QueryAssignmentResponse, credentials("alice", SECRETS["alice"]))
    assert code(r.status) == "FORBIDDEN"
