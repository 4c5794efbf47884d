"""``make cluster`` fails over by itself: the local cluster elects each broker id's master through ZooKeeper
(``ha: auto``), so a killed master's devices are served again within seconds with no command typed."""

import os
import signal
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.client import devcluster
from tests.harness.broker import wait_for
from tests.harness.devcluster import free_base
from tests.harness.mqtt import Paho

pytestmark = [pytest.mark.slow, pytest.mark.fault]

#: What the issue asks of the local cluster: a killed master's devices back with their sessions within this.
BACK_WITHIN_S = 10.0


class At:
    """A member as the MQTT harness takes it: its MQTT port."""

    def __init__(self, entry):
        self.config = {"mqtt": {"port": entry["ports"]["mqtt"]}}


def _persistent(device_id, entry):
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    return Paho(At(entry), device_id, clean=False, properties=props, connect=False)


def _master_of(brokers, broker_id):
    found = [b for b in brokers if b["broker_id"] == broker_id and devcluster.role_now(b["ports"]["text"]) == "master"]
    return found[0] if len(found) == 1 else None


def test_a_killed_masters_device_is_back_with_its_session_within_seconds(tmp_path, zk_connect):
    root = str(tmp_path / "cluster")
    state = devcluster.start(root, 3, 1, free_base(6), zk_connect=zk_connect, say=lambda text: None)
    brokers = state["brokers"]
    try:
        assert state["ha"] == "auto"
        master = wait_for(lambda: _master_of(brokers, 0), 20, "broker 0 elects a master")
        mate = next(b for b in brokers if b["broker_id"] == 0 and b is not master)
        publisher_at = wait_for(lambda: _master_of(brokers, 1), 20, "broker 1 elects a master")
        device = _persistent("device-7", master).connect()
        assert device.subscribe("plant/#", 1) == [1]
        publisher = Paho(At(publisher_at), "publisher")
        wait_for(lambda: publisher.publish("plant/ping", b"ping", 1) and device.wait_messages(1, 1.0), 20,
                 "broker 1's messages reach the device on broker 0")
        device.settle()
        device.close()  # the device goes away with its session kept, as it would at the master's death

        os.kill(master["pid"], signal.SIGKILL)
        killed = time.monotonic()
        sent = []
        for i in range(20):  # published on broker 1 while broker 0 has no master
            publisher.publish("plant/reading", b"r-%d" % i, 1)
            sent.append(b"r-%d" % i)
            time.sleep(0.1)

        def back():
            again = _persistent("device-7", mate)
            try:
                again.connect(timeout=2.0)
            except (AssertionError, OSError):
                again.close()
                return None
            if again.connack != 0:
                again.close()
                return None
            return (again,)
        again = wait_for(back, BACK_WITHIN_S + 5,
                         "the device connects to the member elected in the killed one's place")[0]
        took = time.monotonic() - killed
        assert again.session_present, "the session came back with the device"
        assert took < BACK_WITHIN_S, "the device was back %.1f s after the kill" % took
        wanted = set(sent)
        wait_for(lambda: wanted <= {m.payload for m in again.wait_messages(len(sent), 1.0)}, 20,
                 lambda: "every reading published meanwhile reaches the device: missing %s"
                 % sorted(wanted - {m.payload for m in again.messages}))
        again.close()
        publisher.close()
    finally:
        devcluster.stop(root, say=lambda text: None)
