"""With authentication on, a gRPC client is its user's and its client id's (docs/rocketmq5.md "Clients and their
ids"), against a real broker process: bob naming alice's ``x-mq-client-id`` names a client of his own, so his
Settings leave her maximum attempts as they were, his NotifyClientTermination leaves her auto-renewed messages
held, his producer stream does not take her transaction check-backs, and an admin asking that id is told both
users have it and names one as ``user/id``."""

import queue
import time

import pytest

from metaq import admincli as admin
from metaq.admin.wire import ClientCommand, decode_body
from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.acl import SECRETS, write_acl
from tests.rmq5.test_client_commands import Connected
from tests.rmq5.test_grpc_port import SERVICE, Client, code, credentials, message
from tests.rmq5.test_pop_grpc import ack, bodies, receive, settings
from tests.rmq5.test_renew_grpc import auto_receive, change, first_deadline
from tests.rmq5.test_transactions import half

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

RENEW_MS = 4000  # auto-renew's invisible duration: a round every second, a renewal 2 s before the deadline
CHECK_MS = 300  # the check-back: a round every 300 ms, a half message due 600 ms after it was stored
SHARED = "auth@1"  # the client id alice's clients use and bob names


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpc5isolation")
    cfg = small_config(wd / "data", grpc={"port": free_port(), "renew_invisible_ms": RENEW_MS},
                       store={"flush": "async", "flush_interval_ms": 20},
                       remoting={"transaction_check_interval_ms": CHECK_MS, "transaction_timeout_ms": 2 * CHECK_MS,
                                 "transaction_check_max": 50},
                       security={"acl_file": write_acl(wd / "acl.yaml")})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


def signed(user, client_id=SHARED):
    """The metadata of a call of ``user`` (signed with its secret) as client ``client_id``."""
    return [(k, client_id if k == "x-mq-client-id" else v) for k, v in credentials(user, SECRETS[user])]


@pytest.fixture
def clients(broker):
    """alice and bob, both as client ``SHARED``; ``other``: another client of alice's (same group)."""
    port = broker.config["grpc"]["port"]
    made = {"alice": Client(port, metadata=signed("alice")), "bob": Client(port, metadata=signed("bob")),
            "other": Client(port, metadata=signed("alice", "alice-other@1"))}
    yield made
    for c in made.values():
        c.close()


def test_another_users_settings_under_the_same_client_id_leave_her_maximum_attempts(clients):
    alice, bob = clients["alice"], clients["bob"]
    assert settings(alice, max_attempts=3).settings.backoff_policy.max_attempts == 3
    assert settings(bob, max_attempts=1).settings.backoff_policy.max_attempts == 1  # his own client's
    assert code(alice.send(message("orders-iso-set", b"retried")).status) == "OK"
    _st, got = receive(alice, "billing", "orders-iso-set", poll_ms=2000)
    assert bodies(got) == [b"retried"]
    assert code(change(alice, "billing", "orders-iso-set", got[0].system_properties.receipt_handle, 0).status) == "OK"
    # her Settings' 3 attempts hold: delivered a second time (bob's 1 would have dead-lettered it instead)
    _st, again = receive(alice, "billing", "orders-iso-set", poll_ms=3000)
    assert bodies(again) == [b"retried"] and again[0].system_properties.delivery_attempt == 2
    assert code(ack(alice, "billing", "orders-iso-set", again[0]).status) == "OK"


def test_another_users_termination_under_the_same_client_id_leaves_her_messages_renewed(clients):
    alice, bob, other = clients["alice"], clients["bob"], clients["other"]
    assert code(alice.send(message("orders-iso-renew", b"held")).status) == "OK"
    st, got = auto_receive(alice, "billing", "orders-iso-renew")
    assert code(st) == "OK" and bodies(got) == [b"held"]
    r = bob.unary("NotifyClientTermination", pb.NotifyClientTerminationRequest(group=pb.Resource(name="billing")),
                  pb.NotifyClientTerminationResponse)
    assert code(r.status) == "OK"  # his own client (holding nothing) ends
    # past her first deadline: still hers (renewed), never handed to her group's other consumer
    until = first_deadline(got[0]) / 1000.0 + 1.0
    while time.time() < until:
        _st, stolen = receive(other, "billing", "orders-iso-renew", poll_ms=500)
        assert stolen == []
    assert code(ack(alice, "billing", "orders-iso-renew", got[0]).status) == "OK"  # the delivery's handle acks it


def producer_stream(c, topic):
    """``c``'s Telemetry stream, its producer Settings for ``topic`` sent and answered: ``(requests, answers)``."""
    requests = queue.Queue()
    call = c.channel.stream_stream(SERVICE + "Telemetry", request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=pb.TelemetryCommand.FromString)
    answers = call(iter(requests.get, None), metadata=c.metadata, timeout=20)
    requests.put(pb.TelemetryCommand(settings=pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)]))))
    assert code(next(answers).status) == "OK"
    return requests, answers


def test_her_check_back_reaches_her_stream_after_another_user_registers_one_under_her_client_id(clients):
    alice, bob = clients["alice"], clients["bob"]
    hers, her_answers = producer_stream(alice, "orders-iso-tx")
    his, _his_answers = producer_stream(bob, "orders-iso-tx")  # after hers: it would have replaced it
    try:
        [entry] = alice.send(half("orders-iso-tx", b"undecided")).entries
        assert code(entry.status) == "OK"
        command = next(her_answers)  # the check-back, once the half message is due
        asked = command.recover_orphaned_transaction_command
        assert asked.transaction_id == entry.transaction_id and asked.message.body == b"undecided"
    finally:
        hers.put(None)
        his.put(None)


def stack_of(marker):
    def respond(command):
        return pb.TelemetryCommand(status=pb.Status(code=pb.OK), thread_stack_trace=pb.ThreadStackTrace(
            nonce=command.print_thread_stack_trace_command.nonce, thread_stack_trace=marker))
    return respond


def test_an_admin_asking_an_id_two_users_clients_have_is_told_the_users_and_names_one_as_user_slash_id(
        broker, tmp_path, capsys):
    port = broker.config["grpc"]["port"]
    a = Connected(port, "shared@1", stack_of("alices-stacks"), metadata=signed("alice", "shared@1"))
    b = Connected(port, "shared@1", stack_of("bobs-stacks"), metadata=signed("bob", "shared@1"))
    try:
        with broker.client() as root:
            assert root.auth("admin", SECRETS["admin"]).code == 200
            both = root.call(ClientCommand("stack", "shared@1", None, None, 5_000, 1))
            assert both.code == 400
            assert b"alice, bob" in bytes(both.body) and b"user/id" in bytes(both.body)
            assert not a.asked and not b.asked  # neither was asked
            for user in ("alice", "bob"):
                r = root.call(ClientCommand("stack", "%s/shared@1" % user, None, None, 5_000, 2))
                body = decode_body(r.body)
                assert r.code == 200 and (body["user"], body["client"]) == (user, "shared@1")
                assert body["thread_stack_trace"] == {"alice": "alices-stacks", "bob": "bobs-stacks"}[user]
            assert root.call(ClientCommand("stack", "carol/shared@1", None, None, 5_000, 3)).code == 404
        secret = tmp_path / "admin.secret"
        secret.write_text(SECRETS["admin"])
        secret.chmod(0o600)
        cli = ["--brokers", "meta://127.0.0.1:%d" % broker.port, "--user", "admin", "--secret-file", str(secret),
               "clients", "stack"]
        assert admin.main(cli + ["shared@1"]) == admin.EXIT_REFUSED
        assert "users alice, bob have the id shared@1" in capsys.readouterr().err
        assert admin.main(cli + ["bob/shared@1"]) == admin.EXIT_OK
        assert capsys.readouterr().out.startswith("client bob/shared@1 on broker ")
        b.close()
        with broker.client() as root:  # one user's client left with that id: its id alone names it
            assert root.auth("admin", SECRETS["admin"]).code == 200
            r = root.call(ClientCommand("stack", "shared@1", None, None, 5_000, 4))
            assert r.code == 200 and decode_body(r.body)["user"] == "alice"
    finally:
        a.close()
        b.close()
