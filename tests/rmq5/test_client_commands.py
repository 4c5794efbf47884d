"""An admin asks a connected RocketMQ 5 client on its Telemetry stream (docs/rocketmq5.md "Asking a connected
client"), against a real broker process with grpcio over our generated messages: ``metaq-admin clients stack``
gets the client's thread stacks, ``clients verify`` has it consume one stored message and says how it went; a
client that never answers ends in 504, an unknown one in 404, questions past the pending limit in 503, a question
whose stream ends in 503; with authentication on only an admin may ask."""

import json
import queue
import threading
import time

import pytest

from metaq.rmq5 import limits as rmq5_limits
from metaq import admincli as admin
from metaq.admin.wire import ClientCommand, decode_body
from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.acl import SECRETS, write_acl
from tests.harness.broker import wait_for
from tests.rmq5.test_grpc_port import SERVICE, Client, code, credentials, message

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpc5clients")
    cfg = small_config(wd / "data", grpc={"port": free_port()}, store={"flush": "async", "flush_interval_ms": 20})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


class Connected:
    """A gRPC client with its Telemetry stream open (its Settings sent and answered); ``respond(command)`` gives
    the TelemetryCommand it answers each command from the broker with (None: it stays silent). ``asked``: every
    command it was sent."""

    def __init__(self, port, client_id, respond, metadata=None):
        self.client = Client(port, metadata=metadata or [("x-mq-client-id", client_id)])
        self.requests = queue.Queue()
        self.asked = []
        call = self.client.channel.stream_stream(SERVICE + "Telemetry",
                                                 request_serializer=lambda m: m.SerializeToString(),
                                                 response_deserializer=pb.TelemetryCommand.FromString)
        self.answers = call(iter(self.requests.get, None), metadata=self.client.metadata, timeout=60)
        self.requests.put(pb.TelemetryCommand(settings=pb.Settings(
            client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(group=pb.Resource(name="g")))))
        assert code(next(self.answers).status) == "OK"
        self.respond = respond
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            for command in self.answers:
                self.asked.append(command)
                answer = self.respond(command)
                for a in answer if isinstance(answer, list) else [] if answer is None else [answer]:
                    self.requests.put(a)
        except grpc.RpcError:
            pass

    def close(self):
        self.requests.put(None)
        self.thread.join(10)
        self.client.close()


def stacks(command):
    asked = command.print_thread_stack_trace_command
    return pb.TelemetryCommand(status=pb.Status(code=pb.OK), thread_stack_trace=pb.ThreadStackTrace(
        nonce=asked.nonce, thread_stack_trace='"main" RUNNABLE\n  at consume(Consumer.java:42)'))


def url(b):
    return "meta://127.0.0.1:%d" % b.port


def ask(capsys, b, *args):
    code_ = admin.main(["--brokers", url(b), "--json", "clients"] + list(args))
    out = capsys.readouterr()
    return code_, (json.loads(out.out) if out.out.strip() else None), out.err


def test_a_client_answers_a_stack_request_with_its_thread_stacks(broker, capsys):
    def wrong_nonce_first(command):  # an answer naming no question is ignored: the right nonce's is printed
        wrong = pb.TelemetryCommand(status=pb.Status(code=pb.OK), thread_stack_trace=pb.ThreadStackTrace(
            nonce="not-" + command.print_thread_stack_trace_command.nonce, thread_stack_trace="forged"))
        return [wrong, stacks(command)]

    c = Connected(broker.config["grpc"]["port"], "stack@1", wrong_nonce_first)
    try:
        rc, body, err = ask(capsys, broker, "stack", "stack@1")
        assert rc == admin.EXIT_OK, err
        assert body["status"] == "OK" and body["client"] == "stack@1"
        assert "Consumer.java:42" in body["thread_stack_trace"] and "forged" not in body["thread_stack_trace"]
        [asked] = c.asked
        assert asked.WhichOneof("command") == "print_thread_stack_trace_command"
        assert asked.print_thread_stack_trace_command.nonce  # the answer was matched by it
    finally:
        c.close()


def test_a_verify_request_delivers_the_stored_message_and_reports_the_clients_result(broker, capsys):
    sender = Client(broker.config["grpc"]["port"])
    m = message("verify-topic", b"check me", tag="T", keys=["k1"], props={"color": "red"})
    assert code(sender.send(m).status) == "OK"
    sender.close()
    outcome = {"code": pb.OK, "message": ""}

    def verify(command):
        asked = command.verify_message_command
        return pb.TelemetryCommand(status=pb.Status(code=outcome["code"], message=outcome["message"]),
                                   verify_message_result=pb.VerifyMessageResult(nonce=asked.nonce))

    c = Connected(broker.config["grpc"]["port"], "verify@1", verify)
    msg_id = m.system_properties.message_id
    try:
        wait_for(lambda: ask(capsys, broker, "verify", "verify@1", msg_id, "--topic", "verify-topic")[0]
                 == admin.EXIT_OK, timeout=10)  # once the key index holds the flushed message
        delivered = c.asked[-1].verify_message_command.message
        assert (delivered.topic.name, delivered.body, delivered.system_properties.message_id) == (
            "verify-topic", b"check me", msg_id)
        assert delivered.system_properties.tag == "T" and dict(delivered.user_properties) == {"color": "red"}
        rc, body, _ = ask(capsys, broker, "verify", "verify@1", msg_id, "--topic", "verify-topic")
        assert rc == admin.EXIT_OK and (body["status"], body["result"]) == ("OK", "CR_SUCCESS")

        for status, result in ((pb.FAILED_TO_CONSUME_MESSAGE, "CR_LATER"), (pb.MESSAGE_CORRUPTED, "CR_RETURN_NULL"),
                               (pb.VERIFY_FIFO_MESSAGE_UNSUPPORTED, None)):  # the proxy's reading of each
            outcome.update(code=status, message="listener said no")
            rc, body, _ = ask(capsys, broker, "verify", "verify@1", msg_id, "--topic", "verify-topic")
            assert rc == admin.EXIT_REFUSED
            assert (body["status"], body["result"], body["remark"]) == (pb.Code.Name(status), result,
                                                                       "listener said no")

        rc, _, err = ask(capsys, broker, "verify", "verify@1", "0" * 32, "--topic", "verify-topic")
        assert rc == admin.EXIT_REFUSED and "no message" in err
    finally:
        c.close()


def test_a_client_that_never_answers_ends_in_a_timeout_and_an_unknown_one_in_404(broker, capsys):
    c = Connected(broker.config["grpc"]["port"], "silent@1", lambda command: None)
    try:
        started = time.monotonic()
        rc, _, err = ask(capsys, broker, "stack", "silent@1", "--wait", "0.5")
        assert rc == admin.EXIT_REFUSED and "gave no answer within 0.500 s" in err
        assert 0.5 <= time.monotonic() - started < 5
        assert len(c.asked) == 1
    finally:
        c.close()
    for wait, ok in (("60", True), ("60.001", False)):  # GRPC_CLIENT_COMMAND_MAX_TIMEOUT_MS, and one past
        rc, _, err = ask(capsys, broker, "stack", "nobody@1", "--wait", wait)
        assert (rc == admin.EXIT_USAGE) != ok, (wait, err)
    assert rmq5_limits.GRPC_CLIENT_COMMAND_MAX_TIMEOUT_MS == 60_000
    rc, _, err = ask(capsys, broker, "stack", "nobody@1")
    assert rc == admin.EXIT_REFUSED and "no gRPC client nobody@1" in err
    # the stream ended: the client is no longer known
    wait_for(lambda: "no gRPC client silent@1" in ask(capsys, broker, "stack", "silent@1")[2], timeout=10)


def test_questions_past_the_pending_limit_are_refused_and_an_ended_stream_ends_its_questions(broker):
    limit = rmq5_limits.GRPC_MAX_PENDING_CLIENT_COMMANDS
    c = Connected(broker.config["grpc"]["port"], "busy@1", lambda command: None)
    texts = [broker.client() for _ in range(limit + 1)]
    try:
        for i, t in enumerate(texts[:limit]):  # the limit's worth of questions, all waiting
            t.send(b"client_command stack busy@1 * * 30000 %d\r\n" % i)
        wait_for(lambda: len(c.asked) == limit, timeout=10)
        refused = texts[limit].call(ClientCommand("stack", "busy@1", None, None, 30_000, 99))
        assert refused.code == 503 and b"GRPC_MAX_PENDING_CLIENT_COMMANDS" in bytes(refused.body)
        c.close()  # the stream ends: every waiting question is answered at once
        for t in texts[:limit]:
            r = t.read_event()
            assert r.code == 503 and b"stream ended before it answered" in bytes(r.body)
        # answered, no longer pending: a connected client is asked again
        d = Connected(broker.config["grpc"]["port"], "busy@1", stacks)
        try:
            r = texts[limit].call(ClientCommand("stack", "busy@1", None, None, 5_000, 100))
            assert r.code == 200 and decode_body(r.body)["status"] == "OK"
        finally:
            d.close()
    finally:
        for t in texts:
            t.close()


def test_with_authentication_on_only_an_admin_may_ask_a_client(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        c = Connected(cfg["grpc"]["port"], "auth@1", stacks, metadata=credentials("alice", SECRETS["alice"]))
        try:
            ask_ = ClientCommand("stack", "auth@1", None, None, 5_000, 1)
            with b.client() as anonymous:
                assert anonymous.call(ask_).code == 401
            with b.client() as alice:
                assert alice.auth("alice", SECRETS["alice"]).code == 200
                assert alice.call(ask_).code == 403
            with b.client() as root:
                assert root.auth("admin", SECRETS["admin"]).code == 200
                r = root.call(ask_)
                assert r.code == 200 and "Consumer.java:42" in decode_body(r.body)["thread_stack_trace"]
            assert len(c.asked) == 1  # the refused ones never reached the client
        finally:
            c.close()
    finally:
        b.kill()
