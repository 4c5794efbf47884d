"""A gRPC connection's turn starts again when its read waited for the client (docs/limits.md): a connection whose
client sends a call now and then, each more than ``MAX_TURN_MS`` after the last, pauses for the other connections
only after requests held the loop that long, not after every read (``loop_turn_pauses``)."""

import time

import pytest

from metaq import limits
from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.replication import stats
from tests.rmq5.test_grpc_port import Client, code

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")

pytestmark = pytest.mark.integration

N = 40


def _pauses(b):
    return int(stats(b)["loop_turn_pauses"])


def test_a_connection_that_waits_for_each_call_does_not_pause_after_each(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()})
    b = BrokerProcess(tmp_path, cfg).start()
    c = Client(cfg["grpc"]["port"])
    try:
        assert code(c.route("turn-restart").status) == "OK"
        before = _pauses(b)
        for _ in range(N):  # one call at a time, a turn apart: the connection's read waits for each
            time.sleep(2 * limits.MAX_TURN_MS / 1000.0)
            beat = c.unary("Heartbeat", pb.HeartbeatRequest(client_type=pb.PRODUCER), pb.HeartbeatResponse)
            assert code(beat.status) == "OK"
        paused = _pauses(b) - before
        assert paused < N // 10, paused  # before: a pause after (nearly) every read
    finally:
        c.close()
        b.kill()
