"""MQTT over WebSocket (docs/mqtt.md "Over WebSocket"): Paho's websockets transport against TCP clients both ways,
takeover across the two, wss://, and every rule a hostile WebSocket client meets, each with its limit."""

import socket
import struct
import threading
import time

from metaq.serving import limits as serving_limits
from metaq.client.local import free_port, small_config
from metaq.mqtt import wire
from metaq.protocol.stream import NEED_DATA
from tests.harness.mqtt import V311, Paho, Raw, mqtt_config, with_mqtt
from tests.harness.broker import wait_for
from tests.harness.pki import Pki
from tests.harness.replication import stats
from tests.harness.websocket import BINARY, CLOSE, CONTINUATION, PING, PONG, TEXT, RawWs, frame

#: A broker config's small packet bound: the frame bound is it plus WS_FRAME_MARGIN_BYTES.
MAX_PACKET = 4096


def ws_broker(broker_factory, tmp_path, **mqtt):
    return broker_factory(mqtt_config(tmp_path, ws_port=free_port(), **mqtt))


def ws(broker):
    return broker.config["mqtt"]["ws_port"], broker.config["mqtt"].get("ws_path", "/mqtt")


class WsMqtt(RawWs):
    """A raw WebSocket client speaking MQTT 5 in binary frames (our codec)."""

    def __init__(self, broker, **kw):
        super().__init__(ws(broker)[0], **kw)
        self.parser = wire.MqttParser(wire.MQTT_5, sender="server")

    def connect(self, client_id="raw", will=None, **request):
        status, head, _ = self.upgrade(**request)
        assert status == 101, head
        self.send(frame(BINARY, wire.encode(wire.Connect(wire.MQTT_5, client_id, will=will), wire.MQTT_5)))
        return self.read()

    def read(self):
        """The next MQTT packet from the binary frames."""
        while True:
            p = self.parser.next_event()
            if p is not NEED_DATA:
                return p
            op, payload = self._frame()
            if op == PONG:  # (an answer to a PING of ours)
                continue
            assert op == BINARY, (op, payload)
            self.parser.receive_data(payload)

    def _frame(self):
        head = self._exactly(2)
        n = head[1] & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._exactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._exactly(8))[0]
        return head[0] & 0x0F, self._exactly(n)

    def _exactly(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "closed"
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


# -- real clients ---------------------------------------------------------------------------------------------------


def test_paho_websocket_and_tcp_both_ways_qos_retained_will_and_shared(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path)
    page = Paho(b, "page", websocket=ws(b))
    device = Paho(b, "device", version=V311)
    assert page.subscribe("fleet/+/state", 2) == [2]
    assert device.subscribe("fleet/+/cmd", 2) == [2]
    for qos in (0, 1, 2):
        device.publish("fleet/d1/state", b"s%d" % qos, qos)
        page.publish("fleet/d1/cmd", b"c%d" % qos, qos)
    assert sorted(m.payload for m in page.wait_messages(3)) == [b"s0", b"s1", b"s2"]
    assert sorted(m.payload for m in device.wait_messages(3)) == [b"c0", b"c1", b"c2"]
    device.publish("fleet/d2/config", b"kept", 1, ).wait_for_publish()
    device.c.publish("fleet/d2/config", b"kept", 1, retain=True).wait_for_publish(10)
    late = Paho(b, "late-page", websocket=ws(b))
    late.subscribe("fleet/d2/config", 1)
    assert [(m.payload, m.retain) for m in late.wait_messages(1)] == [(b"kept", True)]
    # a page's will, seen by a device on TCP when the page's connection drops
    will_page = Paho(b, "will-page", websocket=ws(b), will={"topic": "fleet/pages/gone", "payload": b"bye", "qos": 1})
    device.subscribe("fleet/pages/#", 1)
    will_page.c._sock.close()  # (the network goes, no DISCONNECT)
    will_page.c.loop_stop()
    assert any(m.payload == b"bye" for m in device.wait_messages(4))
    # one shared group with a member on each transport: each message goes to one of them
    a, d = Paho(b, "share-ws", websocket=ws(b)), Paho(b, "share-tcp")
    a.subscribe("$share/g/jobs/#", 1)
    d.subscribe("$share/g/jobs/#", 1)
    for i in range(20):
        device.publish("jobs/x", b"%d" % i, 1)
    deadline = time.monotonic() + 10
    while len(a.messages) + len(d.messages) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    got = sorted(int(m.payload) for m in a.messages + d.messages)
    assert got == list(range(20))


def test_a_device_on_tcp_and_a_page_on_websocket_take_one_client_id_over(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path)
    tcp = Raw(b)
    assert tcp.connect("same-id").reason_code == 0
    page = WsMqtt(b)
    assert page.connect("same-id").reason_code == 0
    other = WsMqtt(b)
    assert other.connect("other-id").reason_code == 0
    wait_for(lambda: stats(b)["mqtt_connections"] == "2", 10, "TCP's and WebSocket's counted alike")
    assert isinstance(tcp.read(), wire.Disconnect)  # 0x8E session taken over
    assert tcp.read() is None
    again = Raw(b)
    assert again.connect("same-id").reason_code == 0
    assert page.close_code() == 1000  # the page's connection taken over: a normal WebSocket close after DISCONNECT


def test_wss_is_the_brokers_tls_and_ws_stays_plaintext(broker_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    cfg = mqtt_config(tmp_path, wss_port=free_port(), ws_port=free_port())
    cfg["security"] = {"tls": pki.tls_config("on")}
    b = broker_factory(cfg)
    page = Paho(b, "wss-page", connect=False, websocket=(cfg["mqtt"]["wss_port"], "/mqtt"))
    page.c.tls_set(ca_certs=str(pki.ca))
    page.connect()
    page.subscribe("t/#", 1)
    page.publish("t/x", b"over wss", 1)
    assert [m.payload for m in page.wait_messages(1)] == [b"over wss"]
    plain_page = Paho(b, "ws-page", websocket=ws(b))  # ws:// beside it, with security.tls on: plaintext
    plain_page.publish("t/y", b"over ws", 1)
    assert [m.payload for m in page.wait_messages(2)] == [b"over wss", b"over ws"]
    plain = RawWs(cfg["mqtt"]["wss_port"])  # plaintext on the wss port: no HTTP answer, closed
    plain.send(b"GET /mqtt HTTP/1.1\r\n\r\n")
    assert plain.read_to_end()[:4] != b"HTTP"


# -- the upgrade --------------------------------------------------------------------------------------------------


def test_upgrade_refusals_say_why(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path, ws_allowed_origins=["https://dash.example.com"])
    port = ws(b)[0]
    status, _, body = RawWs(port).upgrade(protocols=None)
    assert status == 400 and b"subprotocol must be one of mqtt, mqttv3.1" in body
    status, _, body = RawWs(port).upgrade(protocols="wamp, chat")
    assert status == 400 and b"offered: wamp, chat" in body
    status, _, body = RawWs(port).upgrade(path="/other")
    assert status == 404 and b"mqtt.ws_path" in body
    status, _, body = RawWs(port).upgrade(origin="https://evil.example.net")
    assert status == 403 and b"mqtt.ws_allowed_origins" in body
    status, head, _ = RawWs(port).upgrade(origin="https://dash.example.com", protocols="mqttv3.1")
    assert status == 101 and "Sec-WebSocket-Protocol: mqttv3.1" in head
    status, head, _ = RawWs(port).upgrade(protocols="mqtt")  # no Origin: not a browser page
    assert status == 101
    r = RawWs(port)
    r.send(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n")  # a plain HTTP GET
    status, _, body = r.answer()
    assert status in (400, 426) and b"not a WebSocket upgrade" in body
    r = RawWs(port)
    r.send(b"GET /mqtt HTTP/1.1\r\nX-Pad: " + b"a" * serving_limits.WS_MAX_HANDSHAKE_BYTES)
    assert r.answer()[0] == 431
    assert Raw(b).connect("still-serving").reason_code == 0


def test_a_trickled_or_unfinished_upgrade_is_closed_by_its_deadline(broker_factory, tmp_path):
    cfg = mqtt_config(tmp_path, ws_port=free_port())
    cfg.setdefault("limits", {}).update(request_timeout_s=1.0)
    b = broker_factory(cfg)
    r = RawWs(ws(b)[0])
    started = time.monotonic()
    request = b"GET /mqtt HTTP/1.1\r\nHost: x\r\n"
    try:
        for byte in request * 10:  # a byte at a time, never the blank line
            r.send(bytes([byte]))
            time.sleep(0.05)
    except OSError:  # closed by the deadline
        pass
    assert r.read_to_end() == b""
    assert 0.9 < time.monotonic() - started < 3
    silent = RawWs(ws(b)[0])
    started = time.monotonic()
    assert silent.read_to_end() == b"" and time.monotonic() - started < 3


# -- frames ---------------------------------------------------------------------------------------------------------


def test_packets_split_over_and_packed_into_frames(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path)
    c = WsMqtt(b)
    assert c.connect().reason_code == 0
    sub = wire.encode(wire.Subscribe(1, (wire.Subscription("a/#", 1),)), wire.MQTT_5)
    pub = wire.encode(wire.Publish("a/b", b"x" * 300, qos=1, packet_id=2), wire.MQTT_5)
    ping = wire.encode(wire.PingReq(), wire.MQTT_5)
    c.send(frame(BINARY, sub + pub[:5], fin=False) + frame(CONTINUATION, pub[5:100], fin=False)
           + frame(CONTINUATION, pub[100:] + ping))
    got = [c.read() for _ in range(4)]
    kinds = sorted(type(p).__name__ for p in got)
    assert kinds == ["PingResp", "PubAck", "Publish", "Suback"], kinds


def acked_at_once(broker_factory, tmp_path):
    """A broker with ``flush: async``: a burst's PUBACKs go at once, from the reader's turn when the socket takes
    them."""
    return broker_factory(with_mqtt(small_config(tmp_path / "data", store={"flush": "async"}),
                                    ws_port=free_port()))


def test_a_burst_of_qos1_publishes_is_acknowledged_in_order_in_one_frame_a_read(broker_factory, tmp_path):
    b = acked_at_once(broker_factory, tmp_path)
    c = WsMqtt(b)
    assert c.connect().reason_code == 0
    publishes = [wire.encode(wire.Publish("a/b", b"x" * 100, qos=1, packet_id=i), wire.MQTT_5) for i in range(1, 33)]
    c.send(b"".join(frame(BINARY, p) for p in publishes))
    ids, frames = [], 0
    while len(ids) < 32:
        op, payload = c._frame()
        assert op == BINARY
        frames += 1
        c.parser.receive_data(payload)
        while (p := c.parser.next_event()) is not NEED_DATA:
            ids.append(p.packet_id)
    assert ids == list(range(1, 33)) and frames <= 4  # one frame a read of the burst


def test_replies_and_deliveries_the_socket_takes_in_part_arrive_whole_and_in_order(broker_factory, tmp_path):
    b = acked_at_once(broker_factory, tmp_path)
    c = WsMqtt(b)
    c.parser = wire.MqttParser(wire.MQTT_311, sender="server")  # 3.1.1: a client past its window waits, not closed
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    assert c.upgrade()[0] == 101
    c.send(frame(BINARY, wire.encode(wire.Connect(wire.MQTT_311, "slow"), wire.MQTT_311)))
    assert c.read().reason_code == 0
    c.send(frame(BINARY, wire.encode(wire.Subscribe(1, (wire.Subscription("a/#", 1),)), wire.MQTT_311)))
    c.read()
    bursts, each = 6, 16
    out = [b"".join(frame(BINARY, wire.encode(wire.Publish("a/b", bytes([n % 256]) * 4000, qos=1, packet_id=n),
                                              wire.MQTT_311)) for n in range(k * each + 1, (k + 1) * each + 1))
           for k in range(bursts)]
    sender = threading.Thread(target=lambda: [c.send(burst) for burst in out], daemon=True)
    sender.start()
    time.sleep(1.0)  # nothing read meanwhile: the broker's socket fills, its writes are taken in part
    acked, delivered = [], []
    while len(acked) < bursts * each or len(delivered) < bursts * each:
        p = c.read()
        if isinstance(p, wire.PubAck):
            acked.append(p.packet_id)
        else:
            assert p.payload == bytes([p.payload[0]]) * 4000
            delivered.append(p.payload[0])
            c.send(frame(BINARY, wire.encode(wire.PubAck(p.packet_id), wire.MQTT_311)))
    sender.join(5)
    n = bursts * each
    assert acked == list(range(1, n + 1)) and delivered == [i % 256 for i in range(1, n + 1)]


def test_a_frame_past_the_bound_is_refused_at_its_header(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path, max_packet_bytes=MAX_PACKET)
    bound = MAX_PACKET + serving_limits.WS_FRAME_MARGIN_BYTES
    at = WsMqtt(b)
    assert at.connect().reason_code == 0
    pings = wire.encode(wire.PingReq(), wire.MQTT_5) * (bound // 2)
    at.send(frame(BINARY, pings))  # at the bound: taken (every PINGREQ answered)
    assert isinstance(at.read(), wire.PingResp)
    past = WsMqtt(b)
    assert past.connect().reason_code == 0
    past.send(frame(BINARY, b"", declared=bound + 1)[:14])  # the header only: refused before any payload
    assert past.close_code() == 1009
    huge = WsMqtt(b)
    assert huge.connect().reason_code == 0
    huge.send(frame(BINARY, b"", declared=2 ** 62)[:14])
    assert huge.close_code() == 1009
    after = WsMqtt(b)  # behind a common frame in one read: the run unmasked stops at the header past the bound
    assert after.connect().reason_code == 0
    after.send(frame(BINARY, wire.encode(wire.PingReq(), wire.MQTT_5)) + frame(BINARY, b"", declared=bound + 1)[:14])
    assert after.close_code() == 1009


def test_framing_rules_each_close_with_its_code_alone_and_behind_common_frames(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path)
    ping = wire.encode(wire.PingReq(), wire.MQTT_5)
    masked = frame(BINARY, ping)
    bad = [(frame(BINARY, ping, mask=False), 1002),  # unmasked client frame
           (bytes([masked[0] | 0x40]) + masked[1:], 1002),  # a reserved bit (no extension negotiated)
           (bytes([0x83]) + masked[1:], 1002),  # an opcode RFC 6455 reserves
           (b"\x82\xfe\x00\x02" + b"\0" * 4 + ping, 1002),  # a length in 2 bytes where 1 suffices
           (frame(TEXT, b"hello"), 1003)]
    cases = bad + [(masked * 3 + data, code) for data, code in bad]  # the same behind a run of common frames
    cases += [(frame(CLOSE, struct.pack("!H", 999)), 1002),  # a close code RFC 6455 forbids
              (frame(CLOSE, struct.pack("!H", 1005)), 1002),  # one only an endpoint may use locally
              (frame(CLOSE, struct.pack("!H", 1016)), 1002),  # an unassigned one of RFC 6455's range
              (frame(CLOSE, struct.pack("!H", 1000) + b"\xff\xfe"), 1007),  # a reason that is not UTF-8
              (frame(CLOSE, struct.pack("!H", 1000) + b"bye"), 1000)]  # a valid close: answered in kind
    watcher = Raw(b)
    assert watcher.connect("watcher").reason_code == 0
    watcher.send(wire.Subscribe(1, (wire.Subscription("gone/#", 1),)))
    assert isinstance(watcher.read(), wire.Suback)
    for i, (data, code) in enumerate(cases):
        c = WsMqtt(b)
        assert c.connect("c%d" % i, will=wire.Will("gone/c%d" % i, b"lost", 1)).reason_code == 0
        c.send(data)
        got = c.frames()
        assert [struct.unpack("!H", p[:2])[0] for op, p in got if op == CLOSE] == [code], data
        assert BINARY not in [op for op, _ in got], got  # nothing of a read that broke a rule is handed up
        will = watcher.read()  # the will of a connection closed for a broken rule, as for a network failure
        assert (will.topic, will.payload) == ("gone/c%d" % i, b"lost"), will
        watcher.send(wire.PubAck(will.packet_id))


def test_fragments_per_message_are_bounded(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path)
    ping = wire.encode(wire.PingReq(), wire.MQTT_5)
    at = WsMqtt(b)
    assert at.connect().reason_code == 0
    most = serving_limits.WS_MAX_FRAGMENTS
    at.send(frame(BINARY, ping[:1], fin=False) + frame(CONTINUATION, b"", fin=False) * (most - 2)
            + frame(CONTINUATION, ping[1:]))
    assert isinstance(at.read(), wire.PingResp)  # WS_MAX_FRAGMENTS frames: one message
    past = WsMqtt(b)
    assert past.connect().reason_code == 0
    past.send(frame(BINARY, ping[:1], fin=False) + frame(CONTINUATION, b"", fin=False) * (most - 1)
              + frame(CONTINUATION, ping[1:]))
    assert past.close_code() == 1008


def test_control_frames_are_budgeted(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path)
    rate, apart = serving_limits.WS_CONTROL_FRAMES_PER_S, serving_limits.WS_CONTROL_FRAMES_WITHOUT_DATA
    pingreq = frame(BINARY, wire.encode(wire.PingReq(), wire.MQTT_5))
    assert apart < rate
    burst = (frame(PING, b"p") * apart + pingreq) * (rate // apart) + frame(PING, b"p") * (rate % apart) + pingreq
    at = WsMqtt(b)
    assert at.connect().reason_code == 0
    at.send(burst)
    assert all(isinstance(at.read(), wire.PingResp) for _ in range(rate // apart + 1))  # every PING answered
    past = WsMqtt(b)
    assert past.connect().reason_code == 0
    past.send(burst[:-len(pingreq)] + frame(PING, b"p"))
    got = past.frames()
    assert [op for op, _ in got].count(PONG) == rate
    assert got[-1][0] == CLOSE and struct.unpack("!H", got[-1][1][:2])[0] == 1008
    assert b"WS_CONTROL_FRAMES_PER_S" in got[-1][1]


def test_a_client_that_only_pings_is_closed_past_the_control_frames_without_data(broker_factory, tmp_path):
    b = ws_broker(broker_factory, tmp_path)
    apart = serving_limits.WS_CONTROL_FRAMES_WITHOUT_DATA
    at = WsMqtt(b)
    assert at.connect().reason_code == 0
    at.send(frame(PING, b"p") * (apart - 1) + frame(PONG, b"q"))  # PINGs and unasked PONGs alike
    at.send(frame(BINARY, wire.encode(wire.PingReq(), wire.MQTT_5)))
    assert isinstance(at.read(), wire.PingResp)  # at the limit: served, and MQTT bytes start the count again
    time.sleep(1.0)  # (the rate's bucket full again)
    at.send(frame(PING, b"p") * apart + frame(BINARY, wire.encode(wire.PingReq(), wire.MQTT_5)))
    assert isinstance(at.read(), wire.PingResp)
    past = WsMqtt(b)
    assert past.connect().reason_code == 0
    started = time.monotonic()
    for _ in range(apart + 1):  # a trickle within the rate: the count, not the rate, ends it
        past.send(frame(PING, b"p"))
        time.sleep(0.03)
    got = past.frames()
    assert [op for op, _ in got].count(PONG) == apart
    assert got[-1][0] == CLOSE and struct.unpack("!H", got[-1][1][:2])[0] == 1008
    assert b"WS_CONTROL_FRAMES_WITHOUT_DATA" in got[-1][1] and time.monotonic() - started < 5
