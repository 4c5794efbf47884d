"""Idle connections hold no greenlet (the connection core parks them, ``Connection.parks``): as a client sees it,
every deadline still holds and a connection idle for long is served as soon as it sends."""

import socket
import threading
import time

from metaq.mqtt import wire
from tests.harness.acl import SECRETS, secured_config
from tests.harness.mqtt import Raw, mqtt_config, with_mqtt


#: Every close here is due within 1.5 s: no earlier than its deadline, and by this (a loaded machine may be late),
#: long before the socket's own 15 s.
LATE_S = 6.0


def _config(tmp_path):
    cfg = mqtt_config(tmp_path)
    cfg.setdefault("limits", {}).update(idle_timeout_s=1.0, request_timeout_s=1.0)
    return cfg


class CloseClock:
    """When the broker closed each socket, in seconds from when it was handed over (one thread each)."""

    def __init__(self):
        self.after = {}
        self._threads = []

    def watch(self, name, sock):
        started = time.monotonic()

        def wait():
            sock.settimeout(15)
            try:
                while sock.recv(100):
                    pass
            except OSError:
                pass
            self.after[name] = time.monotonic() - started

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        self._threads.append(t)

    def join(self):
        for t in self._threads:
            t.join(20)
        return self.after


def test_every_deadline_still_closes_and_a_long_idle_connection_is_served(broker_factory, tmp_path):
    b = broker_factory(_config(tmp_path))
    sub = Raw(b, wire.MQTT_311)
    assert sub.connect("sub", keep_alive=10).reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription("idle/#", 1),)))
    assert sub.read() == wire.Suback(1, (1,))
    pub = Raw(b, wire.MQTT_311)
    assert pub.connect("pub", keep_alive=10).reason_code == 0
    clock = CloseClock()
    silent = Raw(b, wire.MQTT_311)
    assert silent.connect("silent", keep_alive=1).reason_code == 0
    clock.watch("mqtt silent past 1.5 x keep-alive", silent.sock)
    partial = Raw(b, wire.MQTT_311)
    assert partial.connect("partial", keep_alive=60).reason_code == 0
    partial.send_bytes(wire.encode(wire.Publish("idle/x", b"never whole", 1, packet_id=1), wire.MQTT_311)[:5])
    clock.watch("mqtt half-sent PUBLISH", partial.sock)
    text = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    clock.watch("text silent", text)
    half = socket.create_connection(("127.0.0.1", b.port), timeout=10)
    half.sendall(b"vers")
    clock.watch("text half-sent request", half)
    after = clock.join()
    assert 1.4 <= after["mqtt silent past 1.5 x keep-alive"] < LATE_S, after
    for name in ("mqtt half-sent PUBLISH", "text silent", "text half-sent request"):
        assert 0.9 <= after[name] < LATE_S, after
    time.sleep(1.5)  # the subscriber and the publisher idle for 3 s in all, parked
    pub.send(wire.Publish("idle/x", b"after a long idle", 1, packet_id=7))
    assert pub.read() == wire.PubAck(7)
    got = sub.read()
    assert (got.topic, got.payload) == ("idle/x", b"after a long idle")
    log = b.log_text()
    assert log.count(": no request for 2 s; closing") == 1  # the MQTT client's 1.5 s, written rounded
    assert log.count(": no request for 1 s; closing") == 1  # the text client
    assert log.count(": a partial request for 1 s; closing") == 2


def test_a_parked_mqtt_connection_that_never_logs_in_is_closed_at_the_login_deadline(broker_factory, tmp_path):
    cfg = with_mqtt(secured_config(tmp_path))
    cfg["limits"] = dict(cfg.get("limits", {}), login_timeout_s=1.0, idle_timeout_s=600)
    b = broker_factory(cfg)
    clock = CloseClock()
    silent = Raw(b, wire.MQTT_311)  # connected, no CONNECT: parked as a stranger
    clock.watch("silent stranger", silent.sock)
    user = Raw(b, wire.MQTT_311)
    assert user.connect("alice-1", username="alice", password=SECRETS["alice"].encode(),
                        keep_alive=60).reason_code == 0
    assert 0.9 <= clock.join()["silent stranger"] < LATE_S
    assert "mqtt 127.0.0.1:" in b.log_text() and ": not logged in within 1 s; closing" in b.log_text()
    time.sleep(0.5)  # the logged-in one, parked past the login deadline, is held to its keep-alive only
    user.send(wire.PingReq())
    assert user.read() == wire.PingResp()


def test_a_partial_packet_after_or_behind_a_one_step_turn_gets_the_request_deadline_not_the_idle_one(broker_factory,
                                                                                                     tmp_path):
    """A device's and a subscriber's one-step turns (``Publishes.read``, ``Subscriptions.read_pubacks``) tell the
    next read nothing is buffered only when they took every byte (``Connection.receive``'s ``whole``): a partial
    packet behind whole ones in one read, or sent alone after such a turn, is a request begun, closed at the
    request deadline (1 s here), long before the idle one (60 s) or 1.5 x Keep Alive. A turn that said nothing
    buffered with a partial packet left fails this: the idle deadline would run instead."""
    cfg = mqtt_config(tmp_path)
    cfg.setdefault("limits", {}).update(idle_timeout_s=60.0, request_timeout_s=1.0)
    b = broker_factory(cfg)
    sub = Raw(b, wire.MQTT_311)
    assert sub.connect("sub-partial", keep_alive=60).reason_code == 0
    sub.send(wire.Subscribe(1, (wire.Subscription("part/#", 1),)))
    assert sub.read() == wire.Suback(1, (1,))
    clock = CloseClock()
    pubs = {}
    for name in ("behind", "after"):
        pub = pubs[name] = Raw(b, wire.MQTT_311)
        assert pub.connect("pub-" + name, keep_alive=60).reason_code == 0
        pub.send(wire.Publish("part/x", b"first", 1, packet_id=1))  # its plans and decisions made: one step next
        assert pub.read() == wire.PubAck(1)
    second = wire.encode(wire.Publish("part/x", b"second", 1, packet_id=2), wire.MQTT_311)
    third = wire.encode(wire.Publish("part/x", b"never whole", 1, packet_id=3), wire.MQTT_311)
    pubs["behind"].send_bytes(second + third[:5])  # a whole PUBLISH and a partial one in one write
    assert pubs["behind"].read() == wire.PubAck(2)
    pubs["after"].send_bytes(second)  # taken whole in one step, then a partial one alone
    assert pubs["after"].read() == wire.PubAck(2)
    time.sleep(0.2)
    pubs["after"].send_bytes(third[:5])
    got = []
    while len(got) < 4:
        p = sub.read()
        assert isinstance(p, wire.Publish)
        got.append(p)
    # the subscriber acknowledges the first three whole and begins the fourth's PUBACK in one write
    sub.send_bytes(b"".join(wire.encode(wire.PubAck(p.packet_id), wire.MQTT_311) for p in got[:3])
                   + wire.encode(wire.PubAck(got[3].packet_id), wire.MQTT_311)[:2])
    clock.watch("publisher, partial behind a whole PUBLISH", pubs["behind"].sock)
    clock.watch("publisher, partial after a one-step turn", pubs["after"].sock)
    clock.watch("subscriber, partial behind whole PUBACKs", sub.sock)
    after = clock.join()
    assert len(after) == 3 and all(seconds < LATE_S for seconds in after.values()), after  # (the watches begin
    # after the partial packets arrived: no lower bound here, test_every_deadline_still_closes... has it)
