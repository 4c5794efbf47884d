"""Where a gRPC AckMessage is answered (docs/rocketmq5.md "Receives"), against real broker processes: with
authentication off an ack never waits (its record is written in the call) and is answered on its connection's
reader; with it on, in a greenlet of its own. Either way the answers are the same."""

import threading
import time

import pytest

from metaq.auth import limits as auth_limits
from tests.harness.acl import SECRETS, write_acl
from tests.harness.grpc_turns import grpc_broker, inline_and_spawned
from tests.rmq5.test_grpc_port import Client, code, credentials, message
from tests.rmq5.test_pop_grpc import receive

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

TOPIC, GROUP = "orders-ackturn", "billing"


def _acks(port, metadata):
    """Four messages sent and received, then acks of every kind: ``[(top code, [(message id, code, text)])]`` with
    each receipt handle named by its place (handles hold deadlines, which differ from broker to broker)."""
    c = Client(port, metadata=metadata)
    try:
        assert code(c.send(*[message(TOPIC, b"m%d" % i, message_id="ID%d" % i) for i in range(4)]).status) == "OK"
        st, got = receive(c, GROUP, TOPIC, batch=4)
        assert code(st) == "OK" and len(got) == 4
        got.sort(key=lambda m: m.body)
        handles = [m.system_properties.receipt_handle for m in got]

        def ack(*pairs):
            request = pb.AckMessageRequest(group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC),
                                           entries=[pb.AckMessageEntry(message_id=i, receipt_handle=h)
                                                    for i, h in pairs])
            r = c.unary("AckMessage", request, pb.AckMessageResponse)

            def named(text):
                for n, h in enumerate(handles):
                    text = text.replace(h, "<%d>" % n)
                return text
            return code(r.status), [(e.message_id, named(e.receipt_handle), code(e.status), named(e.status.message))
                                    for e in r.entries]

        out = [ack(("ID0", handles[0])),
               ack(("ID0", handles[0]), ("ID1", handles[1])),  # a repeated ack is OK
               ack(("BAD", "not-a-handle")),
               ack(("ID2", handles[2]), ("BAD", "not-a-handle"), ("ID3", handles[3]))]
        st, again = receive(c, GROUP, TOPIC, batch=4)
        out.append((code(st), len(again)))  # every message acknowledged: none comes back
        try:  # a request that does not parse
            c.channel.unary_unary("/apache.rocketmq.v2.MessagingService/AckMessage")(b"\xff\xff\xff",
                                                                                    metadata=c.metadata, timeout=10)
        except grpc.RpcError as exc:
            out.append(exc.code())
        return out
    finally:
        c.close()


def test_an_ack_answered_on_the_reader_equals_one_answered_from_its_greenlet(tmp_path):
    """The same acks to two fresh brokers: authentication off answers them on the reader, on (alice's credentials)
    from a greenlet each; every answer is the same."""
    inline, spawned = inline_and_spawned(tmp_path, _acks, "ack@1@1@x", credentials)
    assert inline == spawned
    assert [a[0] for a in inline[:4]] == ["OK", "OK", "INVALID_RECEIPT_HANDLE", "MULTIPLE_RESULTS"]
    assert inline[4] == ("MESSAGE_NOT_FOUND", 0) and inline[5] == grpc.StatusCode.INTERNAL


def _ack_request(*handles):
    return pb.AckMessageRequest(group=pb.Resource(name=GROUP), topic=pb.Resource(name=TOPIC),
                                entries=[pb.AckMessageEntry(message_id="x", receipt_handle=h) for h in handles])


@pytest.mark.slow
def test_an_ack_that_waits_stalls_neither_its_connection_nor_another(tmp_path):
    """Authentication on: acks signed with a wrong secret, past the failures an address may make, each wait
    ``limits.AUTH_FAILURE_DELAY_S`` (in their greenlets); alice's acks on the same connection, and on another, are
    answered meanwhile."""
    b = grpc_broker(tmp_path, security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    port = b.config["grpc"]["port"]
    shared, other = Client(port), Client(port)
    try:
        alice = lambda: credentials("alice", SECRETS["alice"])  # noqa: E731 - signed now, each call
        wrong = lambda: credentials("alice", "not-alices-secret-0000")  # noqa: E731
        assert code(shared.send(*[message(TOPIC, b"m%d" % i) for i in range(2)], metadata=alice()).status) == "OK"
        st, got = receive(shared, GROUP, TOPIC, batch=2, metadata=alice())
        assert code(st) == "OK" and len(got) == 2
        for _ in range(auth_limits.AUTH_FAILURES_BEFORE_DELAY):
            refused = shared.unary("AckMessage", _ack_request("x"), pb.AckMessageResponse, metadata=wrong())
            assert code(refused.status) == "UNAUTHORIZED"
        done = {}

        def delayed():
            started = time.monotonic()
            for _ in range(3):
                r = shared.unary("AckMessage", _ack_request("x"), pb.AckMessageResponse, metadata=wrong())
            done["wrong"] = (code(r.status), time.monotonic() - started)

        t = threading.Thread(target=delayed)
        t.start()
        time.sleep(0.3)  # the first delayed ack waits
        for client, m in zip((shared, other), got, strict=True):
            r = client.unary("AckMessage", _ack_request(m.system_properties.receipt_handle), pb.AckMessageResponse,
                             metadata=alice())
            assert code(r.status) == "OK"
        assert "wrong" not in done  # alice's acks were not behind the delayed ones
        t.join(30)
        assert done["wrong"][0] == "UNAUTHORIZED" and done["wrong"][1] >= 2 * auth_limits.AUTH_FAILURE_DELAY_S
    finally:
        shared.close()
        other.close()
        b.kill()
