"""An ended MQTT connection is freed as soon as its last holder lets go, by reference counting: none of its parts keeps
it in a reference cycle (``Connection._let_go``, ``Delivery.stop``, ``FanMember.end``, a guard session's login hook
called once). Otherwise every connection of a fleet that goes away waits for the cyclic collector's full pass, which
walks every object of the broker. The real port over a real store and put path, a real connection over a socket pair;
no network."""

import gc
import re
import weakref

import gevent
import pytest
from gevent import socket as gsocket

from metaq.mqtt import wire
from metaq.mqtt.connection import Connection
from metaq.protocol.stream import NEED_DATA
from tests.harness.broker import wait_for
from tests.harness.http import request, with_http
from tests.harness.mqtt import Raw, mqtt_config
from tests.harness.mqttport import inprocess_port
from tests.server.test_inprocess import Parts, config


#: Devices of the fleet test: past what the default thresholds let grow between two full passes.
FLEET = 8000


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data"))
    yield p
    p.close()


class _Device:
    """The client's end of the socket pair: MQTT 5 packets sent, the broker's read."""

    def __init__(self, sock):
        self.sock = sock
        self.parser = wire.MqttParser(wire.MQTT_5, sender="server")

    def send(self, packet):
        self.sock.sendall(wire.encode(packet, wire.MQTT_5))

    def read(self):
        while True:
            p = self.parser.next_event()
            if p is not NEED_DATA:
                return p
            with gevent.Timeout(10):
                self.parser.receive_data(self.sock.recv(65536))


def _served_and_ended(port, client_id, subscriber):
    """A weak reference to a connection that logged in (a persistent session), with ``subscriber`` subscribed,
    published, got its message and acknowledged it, then went away, its end done."""
    ours, theirs = gsocket.socketpair()
    conn = Connection(ours, ("127.0.0.1", 1), 1, port)
    conn.session = port.guard.acting_for(None, "127.0.0.1")
    served = gevent.spawn(conn.serve)
    device = _Device(theirs)
    device.send(wire.Connect(wire.MQTT_5, client_id, clean_start=False, properties={"session_expiry_interval": 60}))
    assert device.read().reason_code == 0
    if subscriber:
        device.send(wire.Subscribe(1, (wire.Subscription("meters/1", 1),)))
        assert isinstance(device.read(), wire.Suback)
        device.send(wire.Publish("meters/1", b"42", 1, packet_id=2))
        got = {type(p): p for p in (device.read(), device.read())}
        assert got[wire.PubAck].packet_id == 2 and got[wire.Publish].payload == b"42"
        device.send(wire.PubAck(got[wire.Publish].packet_id))
    else:
        device.send(wire.Publish("meters/1", b"42", 1, packet_id=2))
        assert device.read() == wire.PubAck(2)
    theirs.close()
    served.join(10)
    assert served.dead and not port.connected_ids()
    freed = weakref.ref(conn)
    return freed


@pytest.mark.parametrize("subscriber", [False, True], ids=["device", "subscriber"])
def test_an_ended_connection_is_freed_without_the_cyclic_collector(parts, subscriber):
    port = inprocess_port(parts)
    gc.collect()
    gc.disable()
    try:
        freed = _served_and_ended(port, "meter-1", subscriber)
        gevent.sleep(0.1)  # a killed delivery greenlet ends
        assert freed() is None, "the ended connection is kept by: %s" % [type(r).__name__ for r in
                                                                        gc.get_referrers(freed())]
        assert "meter-1" in port.table.sessions  # its session stays, without it
    finally:
        gc.enable()


def _full_passes(broker):
    """The broker's cyclic collector's full passes so far (``/metrics``)."""
    text = request(broker, "GET", "/metrics").body.decode()
    return float(re.search(r'^python_gc_collections_total\{generation="2"\} (\S+)$', text, re.M).group(1))


def _connections(broker):
    with broker.client() as c:
        return int(c.stats_dict()["mqtt_connections"])


@pytest.mark.integration
@pytest.mark.slow
def test_a_fleet_connecting_and_going_away_costs_few_full_passes_of_the_collector(broker_factory, tmp_path):
    """A broker process: ``FLEET`` devices with persistent sessions connect, all held at once, then go away. Its
    heap grows by all their connections and sessions, and gives the connections back: at Python's default the
    collector would walk the whole heap every 70,000 objects kept (several full passes here); the broker's
    (``limits.GC_MIDDLE_PASSES_PER_FULL``) at most one."""
    b = broker_factory(with_http(mqtt_config(tmp_path)))
    before = _full_passes(b)
    fleet = []
    try:
        for i in range(FLEET):
            raw = Raw(b, wire.MQTT_311)
            assert raw.connect("meter-%d" % i, clean_start=False).reason_code == 0
            fleet.append(raw)
    finally:
        for raw in fleet:
            raw.close()
    wait_for(lambda: _connections(b) == 0, 30, what="every connection seen closed")
    assert _full_passes(b) - before <= 1
