"""A large session's handover does not stall the brokers' other clients (docs/mqtt.md "A client id across the
cluster"): a device whose persistent session holds as many queued messages as a handover takes
(``MQTT_HANDOVER_MAX_MESSAGES``, about ``MQTT_HANDOVER_MAX_BYTES`` of them) connects to another broker; while
its holder builds the handover and the other broker parses and adopts it, a client of each broker is answered
promptly, and the device gets every message."""

import time

import pytest

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqtt import wire
from tests.harness.mqtt import Raw
from tests.harness.replication import stats
from tests.hostile.common import LoopProbe
from tests.mqttcluster.test_client_ids import _cluster

pytestmark = pytest.mark.slow

#: Messages queued for the session: a full handover, each MESSAGE_BYTES (together about MQTT_HANDOVER_MAX_BYTES).
MESSAGES = mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES
MESSAGE_BYTES = mqttcluster_limits.MQTT_HANDOVER_MAX_BYTES // MESSAGES - 100
#: A generous bound on one answer to another client while the handover is built and adopted (a noisy 2-core
#: machine; the steps themselves: tests/mqttcluster/test_units.py, the loop's turns while a handover is built,
#: parsed and adopted).
PROMPT_S = 1.0


def test_a_large_sessions_handover_leaves_other_clients_answered_promptly(broker_factory, tmp_path, zk_connect):
    b0, b1 = _cluster(broker_factory, tmp_path, zk_connect, n=2)
    device = Raw(b0)
    assert device.connect("big-session", clean_start=False,
                          properties={"session_expiry_interval": 600}).reason_code == 0
    device.send(wire.Subscribe(1, (wire.Subscription("bulk", 1),)))
    assert isinstance(device.read(), wire.Suback)
    device.close()
    with b0.client() as c:
        body = b"x" * MESSAGE_BYTES
        for _ in range(MESSAGES):
            assert c.put("bulk", body).code == 200
    with LoopProbe(b0.port) as holder, LoopProbe(b1.port) as taker:
        time.sleep(0.5)
        back = Raw(b1)
        ack = back.connect("big-session", clean_start=False, properties={"session_expiry_interval": 600})
        assert ack.reason_code == 0 and ack.session_present
        time.sleep(0.5)
    assert holder.latencies and taker.latencies and not holder.failures and not taker.failures
    assert holder.worst() < PROMPT_S and taker.worst() < PROMPT_S, (holder.worst(), taker.worst())
    got = 0
    while got < MESSAGES:
        m = back.read()
        assert m.payload == body
        back.send(wire.PubAck(m.packet_id))
        got += 1
    assert stats(b1)["mqtt_cluster_takeovers"] == "1"
