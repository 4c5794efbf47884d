"""Transactional messages over gRPC against a real broker process (grpcio over our generated messages): a
TRANSACTION send stores a half message, invisible until EndTransaction commits it (once) or rolls it back; one left
undecided is checked back with a RecoverOrphanedTransactionCommand on the producer's Telemetry stream, and the
client's EndTransaction answer (SOURCE_SERVER_CHECK) commits it."""

import queue
import time

import pytest

from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.broker import wait_for
from tests.rmq5.test_grpc_port import Client, code, message, stored

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

CHECK_MS = 300  # the check-back: a round every 300 ms, a half message due 600 ms after it was stored
TIMEOUT_MS = 600


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpc5tx")
    cfg = small_config(wd / "data", grpc={"port": free_port()}, store={"flush": "async", "flush_interval_ms": 20},
                       remoting={"transaction_check_interval_ms": CHECK_MS, "transaction_timeout_ms": TIMEOUT_MS,
                                 "transaction_check_max": 50})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


@pytest.fixture
def client(broker):
    c = Client(broker.config["grpc"]["port"])
    yield c
    c.close()


def half(topic, body, tag="T"):
    m = message(topic, body, tag=tag, keys=["k-" + body.decode()], props={"color": "blue"})
    m.system_properties.message_type = pb.TRANSACTION
    return m


def end(client, topic, entry, resolution, source=pb.SOURCE_CLIENT):
    return client.unary("EndTransaction", pb.EndTransactionRequest(
        topic=pb.Resource(name=topic), message_id=entry.message_id, transaction_id=entry.transaction_id,
        resolution=resolution, source=source), pb.EndTransactionResponse)


def bodies(broker, topic):
    return sorted(rec.payload for recs in stored(broker, topic).values() for rec in recs)


def test_a_committed_transaction_is_stored_once_and_a_rolled_back_one_never(broker, client):
    r = client.send(half("tx-commit", b"one"))
    assert code(r.status) == "OK", r.status
    [entry] = r.entries
    assert entry.transaction_id and entry.message_id
    time.sleep(0.1)
    assert bodies(broker, "tx-commit") == []  # a half message is invisible
    assert code(end(client, "tx-commit", entry, pb.COMMIT).status) == "OK"
    assert bodies(broker, "tx-commit") == [b"one"]
    # ended: a second commit finds nothing, and stores nothing twice
    again = end(client, "tx-commit", entry, pb.COMMIT)
    assert code(again.status) == "INTERNAL_SERVER_ERROR" and "cannot found transaction data" in again.status.message
    assert bodies(broker, "tx-commit") == [b"one"]

    [rolled] = client.send(half("tx-commit", b"two")).entries
    assert code(end(client, "tx-commit", rolled, pb.ROLLBACK).status) == "OK"
    time.sleep(0.1)
    assert bodies(broker, "tx-commit") == [b"one"]
    assert code(end(client, "tx-commit", rolled, pb.COMMIT).status) == "INTERNAL_SERVER_ERROR"


def test_end_transaction_refuses_what_names_no_half_message(broker, client):
    [entry] = client.send(half("tx-forged", b"x")).entries
    forged = pb.SendResultEntry(message_id=entry.message_id, transaction_id=entry.transaction_id + "0")
    assert code(end(client, "tx-forged", forged, pb.COMMIT).status) == "INTERNAL_SERVER_ERROR"
    assert code(end(client, "tx-other", entry, pb.COMMIT).status) == "INTERNAL_SERVER_ERROR"  # another topic
    blank = pb.SendResultEntry(message_id=entry.message_id, transaction_id=" ")
    assert code(end(client, "tx-forged", blank, pb.COMMIT).status) == "INVALID_TRANSACTION_ID"
    assert bodies(broker, "tx-forged") == []
    assert code(end(client, "tx-forged", entry, pb.ROLLBACK).status) == "OK"  # still pending until here


def test_an_undecided_transaction_is_checked_back_on_telemetry_and_the_answer_commits_it(broker, client):
    requests = queue.Queue()
    call = client.channel.stream_stream("/apache.rocketmq.v2.MessagingService/Telemetry",
                                        request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=pb.TelemetryCommand.FromString)
    answers = call(iter(requests.get, None), metadata=client.metadata, timeout=30)
    try:
        requests.put(pb.TelemetryCommand(settings=pb.Settings(
            client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="tx-check")]))))
        assert code(next(answers).status) == "OK"
        sent_at = time.monotonic()
        [entry] = client.send(half("tx-check", b"orphan")).entries
        command = next(answers)  # the check-back, once the half message is due
        assert time.monotonic() - sent_at >= TIMEOUT_MS / 1000.0 - 0.1
        assert command.WhichOneof("command") == "recover_orphaned_transaction_command"
        asked = command.recover_orphaned_transaction_command
        assert asked.transaction_id == entry.transaction_id
        m = asked.message
        assert (m.topic.name, m.body, m.system_properties.message_id) == ("tx-check", b"orphan", entry.message_id)
        assert m.system_properties.tag == "T" and list(m.system_properties.keys) == ["k-orphan"]
        assert m.system_properties.message_type == pb.TRANSACTION and dict(m.user_properties) == {"color": "blue"}
        assert bodies(broker, "tx-check") == []
        answer = end(client, "tx-check", pb.SendResultEntry(message_id=m.system_properties.message_id,
                                                            transaction_id=asked.transaction_id),
                     pb.COMMIT, pb.SOURCE_SERVER_CHECK)
        assert code(answer.status) == "OK"
        assert bodies(broker, "tx-check") == [b"orphan"]
    finally:
        requests.put(None)


def test_a_half_message_nobody_answers_is_rolled_back_after_the_last_check(tmp_path):
    """No producer publishes to its topic: each round still counts as a check, and after
    ``remoting.transaction_check_max`` of them the half message is rolled back, never stored."""
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       remoting={"transaction_check_interval_ms": 100, "transaction_timeout_ms": 0,
                                 "transaction_check_max": 2})
    b = BrokerProcess(tmp_path, cfg).start()
    c = Client(b.config["grpc"]["port"])
    try:
        [entry] = c.send(half("tx-lost", b"lost")).entries
        pending = end(c, "tx-lost", entry, pb.TRANSACTION_RESOLUTION_UNSPECIFIED)  # leaves it waiting
        assert code(pending.status) == "OK"
        wait_for(lambda: code(end(c, "tx-lost", entry, pb.TRANSACTION_RESOLUTION_UNSPECIFIED).status)
                 == "INTERNAL_SERVER_ERROR", 10, "the half message rolled back")
        assert bodies(b, "tx-lost") == []
    finally:
        c.close()
        b.kill()
