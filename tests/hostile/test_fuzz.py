"""Issue 15 point 9: random and mangled bytes on every listener (text, remoting, replication, MQTT).

After each batch of hostile connections the broker must still answer ``version``, serve a message
acknowledged before the attack intact, and have logged no traceback. The fast run (a few hundred
cases a port) is in ``make test``; the long one is in the slow tier. Cases come from a seeded
generator, so a failure names a seed that replays it.
"""

import random
import socket

import pytest

from metaq.client.local import free_port, rmq_config
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol import replication as rp
from metaq.protocol.message import encode_payload
from metaq.protocol.rocketmq.remoting import RequestCode, encode_command, make_request
from metaq.protocol.text import serialize
from metaq.mqtt import wire as mqtt
from tests.harness.mqtt import Raw, with_mqtt

PAYLOAD = b"acknowledged before the attack \x00\xff" * 20

TEXT_FRAMES = [
    serialize(ev.Version(7)),
    serialize(ev.Stats(None, 3)),
    serialize(ev.Stats("transactions", 4)),
    serialize(ev.Get("fuzzed", "g", 0, 0, 1 << 20, 5)),
    serialize(ev.Get("fuzzed", "g", 1, 3, 4096, 6, 500)),
    serialize(ev.Offset("fuzzed", "g", 0, 0, 8)),
    serialize(ev.Put("fuzzed", 0, 0, b"hello fuzz", 9)),
    serialize(ev.Transaction("TX:1:1", "sess", "BEGIN", 10)),
    serialize(ev.Transaction("XID:1:2:3", "sess", "PREPARE", 11)),
    # the burst scanners' frames (C when built): a put with an attribute block, idempotent puts
    serialize(ev.Put("fuzzed", 1, *encode_payload(b"with attribute", "tag\x02k\x01v\x02"), 12)),
    serialize(IdempotentPut("fuzzed", 0, *encode_payload(b"idem", "k=v"), 13, -1, 77, 0)),
    serialize(IdempotentPut("fuzzed", 1, 0, b"idem plain", 14, -1, 2**63 - 1, 5)),
    serialize(ev.DelayedPut("fuzzed", 0, 0, b"later", 15, -1, 1)),
    serialize(ev.OffsetAt("fuzzed", 0, 1_600_000_000_000, 16)),
    b"quit\r\n",
]


def remoting_frames():
    def req(code, ext, body=b""):
        return encode_command(make_request(code, ext, body, 1, False, "JAVA", 373))

    return [
        req(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "fuzzed"}),
        req(RequestCode.HEART_BEAT, {}, b'{"clientID":"x","consumerDataSet":[],"producerDataSet":[]}'),
        req(RequestCode.PULL_MESSAGE, {"consumerGroup": "CG", "topic": "fuzzed", "queueId": 0, "queueOffset": 0,
                                       "maxMsgNums": 32, "sysFlag": 2, "commitOffset": -1,
                                       "suspendTimeoutMillis": 100, "subscription": "*", "subVersion": 0}),
        req(RequestCode.SEND_MESSAGE, {"producerGroup": "PG", "topic": "fuzzed", "defaultTopic": "TBW102",
                                       "defaultTopicQueueNums": 4, "queueId": 0, "sysFlag": 0,
                                       "bornTimestamp": 1, "flag": 0, "properties": "", "reconsumeTimes": 0},
            b"body"),
    ]


REPLICATION_FRAMES = [
    rp.serialize(rp.Proof("5a" * 16, "")) + rp.serialize(rp.Hello(1, 7, 1 << 20, 0)),
    rp.serialize(rp.Proof("5a" * 16, "ab" * 32)),
    rp.serialize(rp.Challenge(True, "5a" * 16)),
    rp.serialize(rp.Ack(1, 0, 0)),
    rp.serialize(rp.Heartbeat(0)),
    rp.serialize(rp.ErrorFrame(1, "no")),
]


MQTT_CONNECTS = [mqtt.encode(mqtt.Connect(mqtt.MQTT_5, "fuzz-5"), mqtt.MQTT_5),
                 mqtt.encode(mqtt.Connect(mqtt.MQTT_311, "fuzz-4"), mqtt.MQTT_311)]
#: The packets of a device and a subscriber, in the forms the parser's fast path splits and decodes (a PUBLISH of a
#: name already served, a PUBACK) and others; valid in either version but for the MQTT 5 properties.
MQTT_FRAMES = [
    mqtt.encode(mqtt.Publish("fuzzed/known", b"q1", 1, packet_id=3), mqtt.MQTT_311),
    mqtt.encode(mqtt.Publish("fuzzed/known", b"q0" * 70, 0), mqtt.MQTT_311),
    mqtt.encode(mqtt.Publish("fuzzed/known", b"q1", 1, packet_id=4), mqtt.MQTT_5),
    mqtt.encode(mqtt.Publish("fuzzed/known", b"p", 0, properties={"content_type": "t"}), mqtt.MQTT_5),
    mqtt.encode(mqtt.PubAck(1), mqtt.MQTT_5),
    mqtt.encode(mqtt.PubAck(2, 0x10), mqtt.MQTT_5),
    mqtt.encode(mqtt.Subscribe(5, (mqtt.Subscription("fuzzed/#", 1),)), mqtt.MQTT_311),
    mqtt.encode(mqtt.PingReq(), mqtt.MQTT_5),
]


def mangle(rng, frames):
    """One hostile input: pure noise, or valid frames with bytes flipped, cut, spliced or repeated."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.choice([1, 7, 64, 1000, 70_000]))
    data = bytearray(b"".join(rng.choice(frames) for _ in range(rng.randint(1, 4))))
    if kind == 1:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 2:
        data = data[:rng.randrange(len(data))]
    elif kind == 3:
        at = rng.randrange(len(data))
        data[at:at] = rng.randbytes(rng.randint(1, 300))
    elif kind == 4:
        at = rng.randrange(len(data))
        data[at:at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff", b"-1 ",
                                      b"99999999999999999999", b" "])
    return bytes(data)


def attack(port, data, rng):
    """One connection: send ``data``, maybe read a little of the answer, then leave (politely or not)."""
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(data)
        if rng.random() < 0.2:
            s.settimeout(0.05)
            try:
                s.recv(65536)
            except OSError:
                pass
        if rng.random() < 0.5:  # a reset instead of a close
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass  # the broker may close first: that is an answer too
    finally:
        s.close()


@pytest.fixture
def target(broker_factory, tmp_path):
    rport = free_port()
    broker = broker_factory(with_mqtt(rmq_config(tmp_path / "data", replication={"port": rport})))
    with broker.client() as c:
        c.put_ok("fuzzcheck", PAYLOAD, partition=0)
    ports = {"text": broker.port, "remoting": broker.config["remoting"]["port"], "replication": rport,
             "mqtt": broker.config["mqtt"]["port"]}
    return broker, ports


def still_well(broker):
    assert broker.proc.poll() is None, "the broker died:\n" + broker.log_text()[-3000:]
    with broker.client(timeout=10) as c:
        assert c.call(ev.Version(1)).code == 200
        assert [r.data for r in c.get_records("fuzzcheck", 0, 0)] == [PAYLOAD]
    device = Raw(broker)
    assert device.connect("fuzz-check").reason_code == 0
    device.send(mqtt.Publish("fuzzed/known", b"after", 1, packet_id=9))
    assert device.read() == mqtt.PubAck(9)
    device.close()
    log = broker.log_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 500:][:4000]


FRAMES = {"text": TEXT_FRAMES, "remoting": None, "replication": REPLICATION_FRAMES, "mqtt": MQTT_FRAMES}
LISTENERS = ["text", "remoting", "replication", "mqtt"]


def fuzz(broker, ports, listener, seed, cases):
    frames = FRAMES[listener] or remoting_frames()
    rng = random.Random("%s-%d" % (listener, seed))
    for i in range(cases):
        data = mangle(rng, frames)
        if listener == "mqtt" and rng.random() < 0.8:  # most after a good CONNECT, so the packets are parsed
            data = rng.choice(MQTT_CONNECTS) + data
        attack(ports[listener], data, rng)
        if i % 100 == 99:
            still_well(broker)
    still_well(broker)


@pytest.mark.parametrize("listener", LISTENERS)
def test_fuzz_each_listener_briefly(target, listener):
    broker, ports = target
    fuzz(broker, ports, listener, seed=1, cases=300)


@pytest.mark.slow
@pytest.mark.parametrize("listener", LISTENERS)
def test_fuzz_each_listener_long(target, listener):
    broker, ports = target
    for seed in range(2, 6):
        fuzz(broker, ports, listener, seed, cases=1500)
