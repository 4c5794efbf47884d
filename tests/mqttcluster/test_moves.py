"""A device that moves between brokers while a third one publishes (docs/mqtt.md "A client id across the cluster"):
three masters of one ZooKeeper root (``Cluster``), publishers on broker 1 (the third) and on broker 2 (one of the two
the device moves between) sending QoS 1 (or 2) messages at a steady rate, each counted once its PUBACK (PUBCOMP)
came, and device X (a persistent session) moving between brokers 0 and 2 several times. Every acknowledged message
reaches X (QoS 2: no connection of X gets one twice): the taking broker's route holds X's filters before its CONNACK,
and the broker X left hands over what reached it for X after it gave the session up, up to where the taking broker's
own copies begin."""

import threading
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.harness.mqtt import V5, Paho
from tests.harness.mqttcluster import wait_routed

pytestmark = [pytest.mark.slow]

#: How long the publisher publishes, and how often X moves meanwhile.
LOAD_S, MOVES = 3.0, 4


def _device(broker):
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    return Paho(broker, "mover", V5, clean=False, properties=props)


class Publisher(threading.Thread):
    """PUBLISHes of ``load/t`` at QoS ``qos`` at a steady rate; ``acked``: the payloads whose PUBACK (QoS 2:
    PUBCOMP) came."""

    def __init__(self, broker, qos, name, rate=100):
        super().__init__(daemon=True)
        self.client = Paho(broker, "publisher-" + name)
        self.prefix, self.qos, self.rate, self.acked, self.stop = name.encode(), qos, rate, [], threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            payload = b"%s%d" % (self.prefix, i)
            info = self.client.c.publish("load/t", payload, self.qos)
            info.wait_for_publish(10)
            if info.is_published():
                self.acked.append(payload)
            i += 1
            time.sleep(1.0 / self.rate)


@pytest.mark.parametrize("qos", [1, 2])
def test_moves_between_brokers_lose_nothing_a_third_broker_acknowledged(cluster, qos):
    a, b, c = cluster[0], cluster[1], cluster[2]
    device = _device(a)
    assert device.subscribe("load/#", qos) == [qos]
    probe = Paho(b, "probe")
    wait_routed(device, lambda i: probe.publish("load/probe", b"p%d" % i, 1))
    received, lock = set(), threading.Lock()
    publishers = [Publisher(b, qos, "b"), Publisher(c, qos, "c", rate=20)]
    for publisher in publishers:
        publisher.start()
    devices = [device]
    try:
        for move in range(MOVES):
            time.sleep(LOAD_S / MOVES)
            old = devices[-1]
            new = _device(c if move % 2 == 0 else a)
            assert new.session_present
            old.c.loop_stop()  # told 0x8E: it must not connect again
            devices.append(new)
    finally:
        for publisher in publishers:
            publisher.stop.set()
            publisher.join(15)
    acked = set(publishers[0].acked) | set(publishers[1].acked)
    assert len(acked) > 150
    last = devices[-1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with lock:
            for d in devices:
                received.update(m.payload for m in d.messages)
                # QoS 2: a message this connection answered PUBREC to, whose PUBREL the next connection got, is the
                # device's; Paho hands it over only at the PUBREL, and a new Paho client does not know it
                with d.c._in_message_mutex:
                    received.update(m.payload for m in d.c._in_messages.values())
        if acked <= received:
            break
        time.sleep(0.2)
    lost = sorted(acked - received, key=lambda p: int(p[1:]))
    assert not lost, "%d of %d acknowledged messages never reached the device: %s..." % (
        len(lost), len(acked), lost[:20])
    if qos == 2:
        for d in devices:
            got = [m.payload for m in d.messages if m.topic == "load/t"]
            assert len(got) == len(set(got)), "a QoS 2 message delivered twice to one connection"
    last.close()
