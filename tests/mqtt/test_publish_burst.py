"""The PUBLISHes one TCP write brings are stored as one burst (``limits.MQTT_PUBLISH_BURST``): every one stored, in
the order sent, each QoS 1 acknowledged in that order; a bad or refused packet among them is answered as alone, with
the PUBLISHes before it stored and acknowledged (docs/mqtt.md)."""

import time

import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.client.consumer import Consumer
from metaq.mqtt import wire
from metaq.mqtt.records import partition_for, record_data
from tests.harness.broker import url_of
from tests.harness.mqtt import Raw, mqtt_config

pytestmark = pytest.mark.integration  # one broker for the module (a module fixture)

PARTITIONS = 2  # small_config's "*" topics


@pytest.fixture(scope="module")
def mqtt_broker(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("mqtt-burst")
    b = BrokerProcess(wd, mqtt_config(wd)).start()
    yield b
    b.kill()


def _connected(b, client_id, version):
    raw = Raw(b, version)
    assert raw.connect(client_id).reason_code == 0
    return raw


def _publishes(name, bodies, qos, version, first_id=1):
    return b"".join(wire.encode(wire.Publish(name, body, qos, False, False, first_id + k if qos else None), version)
                    for k, body in enumerate(bodies))


def _stored(b, name, count):
    """``[(body, MQTT QoS)]`` of the messages of MQTT topic ``name``, in the order of the log, once ``count`` are
    visible (QoS 0 ones at the next flush: the broker's ``flush: sync``) or after 10 s."""
    topic = name.split("/", 1)[0]
    partition = "%d-%d" % (b.config["broker"]["id"], partition_for(name, PARTITIONS))
    deadline = time.monotonic() + 10
    got, offset = [], 0
    with Consumer("g", brokers=[url_of(b)]) as consumer:
        while True:
            messages = consumer.fetch(topic, partition, offset, max_size=1 << 20)
            got += [(m.body, m.properties["MQTT_QOS"]) for m in messages if m.properties.get("MQTT_TOPIC") == name]
            offset = messages[-1].offset + 1 if messages else offset
            if len(got) >= count or time.monotonic() > deadline:
                return got
            if not messages:
                time.sleep(0.05)


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311], ids=["v5", "v311"])
def test_a_burst_of_qos1_publishes_in_one_write_is_stored_in_order_and_each_acknowledged(mqtt_broker, version):
    name = "burst%d/dev/1" % version
    bodies = [b"m%03d" % k for k in range(60)]  # within the default Receive Maximum (64)
    raw = _connected(mqtt_broker, "burst-%d" % version, version)
    raw.send_bytes(_publishes(name, bodies, 1, version))
    acks = [raw.read() for _ in bodies]
    assert acks == [wire.PubAck(k + 1) for k in range(len(bodies))]
    assert _stored(mqtt_broker, name, len(bodies)) == [(body, "1") for body in bodies]
    raw.close()


@pytest.mark.parametrize("count", [mqtt_limits.MQTT_PUBLISH_BURST, mqtt_limits.MQTT_PUBLISH_BURST + 1],
                         ids=["at", "past"])
def test_the_burst_limit_at_and_one_past_stores_every_publish_in_order(mqtt_broker, count):
    name = "limit%d/t" % count
    bodies = [b"q%04d" % k for k in range(count)]
    raw = _connected(mqtt_broker, "limit-%d" % count, wire.MQTT_5)
    raw.send_bytes(_publishes(name, bodies, 0, wire.MQTT_5) + wire.encode(wire.PingReq(), wire.MQTT_5))
    assert raw.read() == wire.PingResp()  # answered after every PUBLISH before it was handled
    assert _stored(mqtt_broker, name, count) == [(body, "0") for body in bodies]
    raw.close()


def test_qos_0_1_2_and_retained_publishes_in_one_write_keep_their_order(mqtt_broker):
    name = "mixed/t"
    v = wire.MQTT_5
    sent = [wire.Publish(name, b"a", 1, False, False, 1), wire.Publish(name, b"b", 0),
            wire.Publish(name, b"c", 2, False, False, 2), wire.Publish(name, b"d", 1, False, False, 3),
            wire.Publish(name, b"e", 1, True, False, 4), wire.Publish(name, b"f", 0)]
    raw = _connected(mqtt_broker, "mixed", v)
    raw.send_bytes(b"".join(wire.encode(p, v) for p in sent) + wire.encode(wire.PingReq(), v))
    got = [raw.read() for _ in range(5)]  # a PINGRESP does not wait for the flush the acknowledgements wait for
    assert [p for p in got if p != wire.PingResp()] == [wire.PubAck(1), wire.PubRec(2), wire.PubAck(3),
                                                         wire.PubAck(4)]
    assert [body for body, _qos in _stored(mqtt_broker, name, 6)] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    raw.send(wire.PubRel(2))
    assert raw.read() == wire.PubComp(2)
    raw.close()


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311], ids=["v5", "v311"])
def test_a_malformed_packet_after_good_ones_in_one_write_is_refused_after_they_are_stored_and_acknowledged(
        mqtt_broker, version):
    name = "malformed%d/t" % version
    bodies = [b"ok%d" % k for k in range(10)]
    qos3 = bytes((0x36, 5)) + len(b"x").to_bytes(2, "big") + b"x\x00\x0b"  # QoS 3: a Malformed Packet
    raw = _connected(mqtt_broker, "malformed-%d" % version, version)
    raw.send_bytes(_publishes(name, bodies, 1, version) + qos3 + _publishes(name, [b"after"], 1, version, 12))
    assert [raw.read() for _ in bodies] == [wire.PubAck(k + 1) for k in range(len(bodies))]
    if version == wire.MQTT_5:
        assert raw.read() == wire.Disconnect(wire.MALFORMED_PACKET)
    assert raw.closed()
    assert _stored(mqtt_broker, name, len(bodies)) == [(body, "1") for body in bodies]  # none after the bad one


def test_a_refused_publish_in_a_burst_is_answered_in_its_place(mqtt_broker):
    name = "refusal/t"
    v = wire.MQTT_5
    raw = _connected(mqtt_broker, "refusal", v)
    bad = wire.encode(wire.Publish("$SYS/t", b"x", 1, False, False, 3), v)  # the broker's name: 0x90
    raw.send_bytes(_publishes(name, [b"1", b"2"], 1, v) + bad + _publishes(name, [b"4", b"5"], 1, v, 4))
    acks = [raw.read() for _ in range(5)]
    assert [a.packet_id for a in acks] == [1, 2, 3, 4, 5]
    assert [a.reason_code for a in acks] == [0, 0, wire.TOPIC_NAME_INVALID, 0, 0]
    assert _stored(mqtt_broker, name, 4) == [(b"1", "1"), (b"2", "1"), (b"4", "1"), (b"5", "1")]
    raw.close()


def test_a_publish_too_large_for_a_segment_in_a_burst_is_refused_alone(mqtt_broker):
    name = "large/t"
    v = wire.MQTT_5
    big = b"x" * (mqtt_broker.config["store"]["segment_size"] + 1)  # within max_packet_bytes, past a segment
    raw = _connected(mqtt_broker, "large", v)
    raw.send_bytes(_publishes(name, [b"1", b"2", big, b"4", b"5"], 1, v))
    acks = [raw.read() for _ in range(5)]
    assert [a.packet_id for a in acks] == [1, 2, 3, 4, 5]
    assert [a.reason_code for a in acks] == [0, 0, wire.IMPLEMENTATION_SPECIFIC_ERROR, 0, 0]
    assert _stored(mqtt_broker, name, 4) == [(b"1", "1"), (b"2", "1"), (b"4", "1"), (b"5", "1")]
    raw.close()


@pytest.mark.parametrize("extra", [0, 1], ids=["at", "past"])
def test_the_burst_bytes_limit_at_and_one_past_stores_every_publish_in_order(mqtt_broker, extra):
    name, client_id, v = "bytes%d/t" % extra, "bytes-%d" % extra, wire.MQTT_5
    size = len(record_data(name, b"", 1, client_id, {})[1])  # a record's bytes beside its payload
    bodies = [bytes([65 + k]) * 60000 for k in range(16)]
    last = mqtt_limits.MQTT_PUBLISH_BURST_BYTES + extra - sum(size + len(b) for b in bodies) - size
    bodies.append(b"z" * last)
    assert sum(len(record_data(name, b, 1, client_id, {})[1]) for b in bodies) == \
        mqtt_limits.MQTT_PUBLISH_BURST_BYTES + extra
    raw = _connected(mqtt_broker, client_id, v)
    raw.send_bytes(_publishes(name, bodies + [b"after"], 1, v))
    assert [raw.read() for _ in range(len(bodies) + 1)] == [wire.PubAck(k + 1) for k in range(len(bodies) + 1)]
    assert _stored(mqtt_broker, name, len(bodies) + 1) == [(b, "1") for b in bodies + [b"after"]]
    raw.close()
