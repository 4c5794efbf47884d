"""Where a gRPC SendMessage is answered (docs/rocketmq5.md "Sends"), against real broker processes: a send that
cannot wait is answered on its connection's reader, one that may wait (a flush, a user's produce rate) in a
greenlet of its own, and either way the answers are the same and a waiting send stalls neither the other calls of
its connection nor other connections."""

import threading
import time

import pytest

from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.acl import DEFAULT_USERS, SECRETS, write_acl
from tests.rmq5.test_grpc_port import Client, code, credentials, message

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

MAX_BODY = 4096


def _broker(wd, flush, **sections):
    wd.mkdir(parents=True, exist_ok=True)
    cfg = small_config(wd / "data", grpc={"port": free_port()}, store={"flush": flush, "flush_interval_ms": 20},
                       limits={"max_body_bytes": MAX_BODY}, **sections)
    return BrokerProcess(wd, cfg).start()


def _requests():
    """``(rpc, request bytes, metadata or None)``: sends that store and sends refused every way a send is."""
    def send(*messages):
        return pb.SendMessageRequest(messages=messages).SerializeToString()

    out = []
    for i in range(6):
        out.append(("SendMessage", send(message("tq-turn", b"body %d" % i, tag="a", keys=["k%d" % i],
                                                message_id="ID%d" % i)), None))
    out += [
        ("SendMessage", send(message("tq-turn", b"f1", group="g1", message_id="F1"),
                             message("tq-turn", b"f2", group="g1", message_id="F2")), None),
        ("SendMessage", send(message("tq-turn", b"", message_id="EMPTY")), None),
        ("SendMessage", send(message("tq-turn", b"x" * (MAX_BODY + 1), message_id="LARGE")), None),
        ("SendMessage", send(message("tq-turn", b"a", message_id="M1"), message("tq-other", b"b", message_id="M2")),
         None),
        ("SendMessage", send(message("no spaces allowed", b"a", message_id="ILLEGAL")), None),
        ("SendMessage", send(), None),
        ("SendMessage", send(message("tq-turn", b"anonymous", message_id="ANON")), [("x-mq-date-time", "x")]),
        ("SendMessage", b"\xff\xff\xff", None),
    ]
    return out


def _answers(port, requests):
    """Each request's answer over one channel: ``(status code, details, response bytes)``."""
    c = Client(port)
    out = []
    try:
        for rpc, data, metadata in requests:
            call = c.channel.unary_unary("/apache.rocketmq.v2.MessagingService/" + rpc)
            try:
                answer = call(data, metadata=c.metadata if metadata is None else metadata, timeout=10)
                out.append((grpc.StatusCode.OK, None, answer))
            except grpc.RpcError as exc:
                out.append((exc.code(), exc.details(), None))
    finally:
        c.close()
    return out


def test_a_send_answered_on_the_reader_equals_one_answered_from_its_greenlet(tmp_path):
    """The same requests to two fresh brokers: ``async`` flush answers them on the reader, ``sync`` flush (a send
    waits for its flush) from a greenlet each; every answer is the same, byte for byte."""
    requests = _requests()
    answers = {}
    for flush in ("async", "sync"):
        b = _broker(tmp_path / flush, flush)
        try:
            answers[flush] = _answers(b.config["grpc"]["port"], requests)
        finally:
            b.kill()
    assert answers["async"] == answers["sync"]
    got = [pb.SendMessageResponse.FromString(a) if a is not None else s for s, _d, a in answers["async"]]
    assert [code(r.status) for r in got[:7]] == ["OK"] * 7
    assert [code(r.status) for r in got[7:12]] == ["MESSAGE_BODY_EMPTY", "MESSAGE_BODY_TOO_LARGE", "ILLEGAL_TOPIC",
                                                  "ILLEGAL_TOPIC", "MESSAGE_CORRUPTED"]
    assert code(got[12].status) == "CLIENT_ID_REQUIRED" and got[13] == grpc.StatusCode.INTERNAL


@pytest.mark.slow
def test_a_paced_send_waits_without_stalling_its_connection_or_another(tmp_path):
    """alice's produce rate delays her sends (in their greenlets); bob's sends on the same connection, and on
    another, are answered at once meanwhile."""
    users = {name: dict(entry) for name, entry in DEFAULT_USERS.items()}
    users["alice"]["quotas"] = {"produce_bytes_per_s": 2048}
    b = _broker(tmp_path, "async", security={"acl_file": write_acl(tmp_path / "acl.yaml", users=users)})
    shared, other = Client(b.config["grpc"]["port"]), Client(b.config["grpc"]["port"])
    try:
        body = b"x" * MAX_BODY
        alice = credentials("alice", SECRETS["alice"])
        first = shared.send(message("orders", body), message("orders", body), metadata=alice).status
        assert code(first) == "OK"  # she owes ~3 s of her rate now
        done = {}

        def paced():
            started = time.monotonic()
            st = shared.send(message("orders", body), message("orders", body), metadata=alice).status
            done["alice"] = (code(st), time.monotonic() - started)

        t = threading.Thread(target=paced)
        t.start()
        time.sleep(0.3)  # alice's send is waiting for her rate
        assert "alice" not in done
        bob = credentials("bob", SECRETS["bob"])
        for client in (shared, other):
            started = time.monotonic()
            assert code(client.send(message("orders", b"bob's"), metadata=bob).status) == "OK"
            assert time.monotonic() - started < 1.5  # not behind alice's wait of ~3 s
        assert "alice" not in done
        t.join(30)
        assert done["alice"][0] == "OK" and done["alice"][1] >= 2.0
    finally:
        shared.close()
        other.close()
        b.kill()
