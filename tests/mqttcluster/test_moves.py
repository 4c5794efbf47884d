"""A device that moves between brokers while a third one publishes (docs/mqtt.md "A client id across the cluster"):
three masters of one ZooKeeper root (``Cluster``), publishers on broker 1 (the third) and on broker 2 (one of the two
the device moves between) sending QoS 1 (or 2) messages at a steady rate, each counted once its PUBACK (PUBCOMP)
came, and device X (a persistent session) moving between brokers 0 and 2 several times. Every acknowledged message
reaches X (QoS 2: no connection of X gets one twice): the taking broker's route holds X's filters before its CONNACK,
and the broker X left hands over what reached it for X after it gave the session up, up to where the taking broker's
own copies begin; a taking broker that already copies for X's filters (another session of its own holds them) starts X
past where the old one's handover stopped."""

import threading
import time
from collections import Counter

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.mqtt import limits as mqtt_limits
from tests.harness.mqtt import V5, Paho
from tests.harness.mqttcluster import wait_routed

pytestmark = [pytest.mark.slow]

#: How long the publisher publishes, and how often X moves meanwhile.
LOAD_S, MOVES = 3.0, 4


def _device(broker):
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    device = Paho(broker, "mover", V5, clean=False, properties=props, connect=False)
    device.c.reconnect_delay_set(3600, 3600)  # a connection taken over (0x8E) must not take the session back
    return device.connect()


class Publisher(threading.Thread):
    """PUBLISHes of ``load/t`` at QoS ``qos`` at a steady rate, and ``burst`` of them at once (all in flight together,
    within the broker's Receive Maximum) each time ``bursting`` is set; ``acked``: the payloads whose PUBACK (QoS 2:
    PUBCOMP) came."""

    def __init__(self, broker, qos, name, rate=100, burst=1):
        # past it the broker ends the connection, Paho sends them again
        assert burst <= mqtt_limits.MQTT_RECEIVE_MAXIMUM
        super().__init__(daemon=True)
        self.client = Paho(broker, "publisher-" + name, connect=False)
        self.client.c.max_inflight_messages_set(max(20, burst))
        self.client.connect()
        self.prefix, self.qos, self.rate, self.burst = name.encode(), qos, rate, burst
        self.acked, self.stop, self.bursting = [], threading.Event(), threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            n = self.burst if self.bursting.is_set() else 1
            self.bursting.clear()
            going = [b"%s%d" % (self.prefix, i + k) for k in range(n)]
            going = [(payload, self.client.c.publish("load/t", payload, self.qos)) for payload in going]
            i += n
            for payload, info in going:
                info.wait_for_publish(10)
                if info.is_published():
                    self.acked.append(payload)
            time.sleep(1.0 / self.rate)


def _moves(cluster, qos, publishers, targets, moves=MOVES, load_s=LOAD_S):
    """Device X subscribed on ``targets[0]``, moved between ``targets`` ``moves`` times while ``publishers`` publish;
    returns X's connections (each a Paho client) once every acknowledged message reached one of them (or 10 s), and
    the acknowledged payloads."""
    device = _device(targets[0])
    assert device.subscribe("load/#", qos) == [qos]
    probe = Paho(cluster[1], "probe")
    wait_routed(device, lambda i: probe.publish("load/probe", b"p%d" % i, 1))
    for publisher in publishers:
        publisher.start()
    devices = [device]
    try:
        for move in range(moves):
            time.sleep(load_s / moves)
            old = devices[-1]
            for publisher in publishers:
                publisher.bursting.set()
            new = _device(targets[(move + 1) % len(targets)])
            assert new.session_present
            old.c.loop_stop()  # told 0x8E: it must not connect again
            devices.append(new)
    finally:
        for publisher in publishers:
            publisher.stop.set()
            publisher.join(15)
    acked = set().union(*(p.acked for p in publishers))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not acked <= _received(devices):
        time.sleep(0.2)
    return devices, acked


def _received(devices):
    """The payloads X's connections got: handed to the application, or (QoS 2) answered PUBREC to, whose PUBREL the
    next connection got: Paho hands such a message over only at the PUBREL, and a new Paho client does not know it."""
    received = set()
    for d in devices:
        with d.got:
            received.update(m.payload for m in d.messages)
        with d.c._in_message_mutex:
            received.update(m.payload for m in d.c._in_messages.values())
    return received


def _lost(acked, devices):
    lost = sorted(acked - _received(devices), key=lambda p: (p[:1], int(p[1:])))
    return "%d of %d acknowledged messages never reached the device: %s..." % (len(lost), len(acked), lost[:20]) \
        if lost else None


@pytest.mark.parametrize("qos", [1, 2])
def test_moves_between_brokers_lose_nothing_a_third_broker_acknowledged(cluster, qos):
    a, b, c = cluster[0], cluster[1], cluster[2]
    devices, acked = _moves(cluster, qos, [Publisher(b, qos, "b"), Publisher(c, qos, "c", rate=20)], [a, c])
    assert len(acked) > 150
    problem = _lost(acked, devices)
    assert not problem, problem
    if qos == 2:
        for d in devices:
            got = [m.payload for m in d.messages if m.topic == "load/t"]
            assert len(got) == len(set(got)), "a QoS 2 message delivered twice to one connection"
    devices[-1].close()


def test_moves_to_brokers_that_already_follow_the_filters_deliver_each_qos2_message_once(cluster):
    """Brokers 0 and 2 each keep another session subscribed to X's filter, so the broker X moves to already copies for
    it: its copies may stand behind where the old holder's handover stopped (a burst on the old holder as X moves).
    Each acknowledged message reaches X once, across all its connections."""
    a, b, c = cluster[0], cluster[1], cluster[2]
    for i, broker in ((0, a), (2, c)):
        assert Paho(broker, "keeper-%d" % i, clean=False).subscribe("load/#", 1) == [1]
    devices, acked = _moves(cluster, 2, [Publisher(b, 2, "b"), Publisher(c, 2, "c", burst=60)], [a, c], moves=6)
    problem = _lost(acked, devices)
    assert not problem, problem
    handed = Counter(m.payload for d in devices for m in d.messages if m.topic == "load/t")
    twice = sorted((p for p, n in handed.items() if n > 1), key=lambda p: (p[:1], int(p[1:])))
    assert not twice, "%d QoS 2 messages of %d delivered twice to the device: %s" % (len(twice), len(acked), twice[:20])
    devices[-1].close()
