"""The reader's turn (``mqtt/connection.py``): whatever a read brings, a part of a packet or several, each packet is
handled once, in the order sent; a packet other than PUBLISH among PUBLISHes is answered in its place; what follows a
DISCONNECT in the same read is not handled (docs/mqtt.md)."""

import socket
import time

import pytest

from metaq.client.consumer import Consumer
from metaq.mqtt import wire
from metaq.mqtt.records import partition_for
from tests.harness.broker import url_of
from tests.harness.mqtt import Raw, mqtt_config

pytestmark = pytest.mark.integration  # one broker for the module (a module fixture)

PARTITIONS = 2  # small_config's "*" topics


@pytest.fixture(scope="module")
def mqtt_broker(tmp_path_factory):
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("mqtt-turn")
    b = BrokerProcess(wd, mqtt_config(wd)).start()
    yield b
    b.kill()


def _connected(b, client_id, version=wire.MQTT_5):
    raw = Raw(b, version)
    assert raw.connect(client_id).reason_code == 0
    return raw


def _publish(name, body, packet_id, version=wire.MQTT_5):
    return wire.encode(wire.Publish(name, body, 1, False, False, packet_id), version)


def _stored(b, name, count, settle=0.0):
    """The bodies of MQTT topic ``name``'s messages in the order of the log, once ``count`` are visible (or after 10
    s); ``settle``: then that long more, for any that should not be there."""
    topic = name.split("/", 1)[0]
    partition = "%d-%d" % (b.config["broker"]["id"], partition_for(name, PARTITIONS))
    deadline = time.monotonic() + 10
    got, offset = [], 0
    with Consumer("g", brokers=[url_of(b)]) as consumer:
        while True:
            messages = consumer.fetch(topic, partition, offset, max_size=1 << 20)
            got += [m.body for m in messages if m.properties.get("MQTT_TOPIC") == name]
            offset = messages[-1].offset + 1 if messages else offset
            if len(got) >= count:
                if settle <= 0:
                    return got
                time.sleep(settle)
                settle = 0.0
                continue
            if time.monotonic() > deadline:
                return got
            if not messages:
                time.sleep(0.05)


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311], ids=["v5", "v311"])
def test_two_publishes_split_at_every_byte_are_each_handled_once_in_order(mqtt_broker, version):
    """Two QoS 1 PUBLISHes whose bytes come in two reads, cut at every byte of the pair (the fixed header, the
    remaining length, the topic, the packet id, the payload, between the two): each is acknowledged once, in order,
    and stored once."""
    name = "split%d/dev/1" % version
    raw = _connected(mqtt_broker, "split-%d" % version, version)
    pair_id, bodies = 1, []
    for cut in range(1, len(_publish(name, b"a", 1, version) + _publish(name, b"b", 2, version))):
        first, second = b"a%03d" % cut, b"b%03d" % cut
        data = _publish(name, first, pair_id, version) + _publish(name, second, pair_id + 1, version)
        raw.send_bytes(data[:cut])
        time.sleep(0.005)  # the broker reads the first part alone (its turn ends inside a packet or between)
        raw.send_bytes(data[cut:])
        assert [raw.read(), raw.read()] == [wire.PubAck(pair_id), wire.PubAck(pair_id + 1)]
        bodies += [first, second]
        pair_id += 2
    assert _stored(mqtt_broker, name, len(bodies), settle=0.2) == bodies
    raw.close()


def test_a_pingreq_between_publishes_is_answered_in_its_place(mqtt_broker):
    """PUBLISH, PINGREQ, PUBLISH, PINGREQ in one write: PUBACK, PINGRESP, PUBACK, PINGRESP, in that order, and both
    messages stored."""
    name = "ping/dev/1"
    raw = _connected(mqtt_broker, "ping-1")
    ping = wire.encode(wire.PingReq(), wire.MQTT_5)
    raw.send_bytes(_publish(name, b"one", 1) + ping + _publish(name, b"two", 2) + ping)
    assert [raw.read() for _ in range(4)] == [wire.PubAck(1), wire.PingResp(), wire.PubAck(2), wire.PingResp()]
    assert _stored(mqtt_broker, name, 2) == [b"one", b"two"]
    raw.close()


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311], ids=["v5", "v311"])
def test_a_disconnect_mid_turn_ends_it_after_the_publishes_before_it_and_before_those_after(mqtt_broker, version):
    """Two PUBLISHes, DISCONNECT, a third PUBLISH, in one write: the two are stored and acknowledged, the connection
    closes, the third is neither."""
    name = "midturn%d/dev/1" % version
    raw = _connected(mqtt_broker, "midturn-%d" % version, version)
    raw.send_bytes(_publish(name, b"one", 1, version) + _publish(name, b"two", 2, version)
                   + wire.encode(wire.Disconnect(wire.SUCCESS), version) + _publish(name, b"after", 3, version))
    assert [raw.read(), raw.read()] == [wire.PubAck(1), wire.PubAck(2)]
    assert raw.closed()
    assert _stored(mqtt_broker, name, 2, settle=0.3) == [b"one", b"two"]


def test_a_connection_taken_over_mid_turn_handles_nothing_after(mqtt_broker):
    """A connection whose client id another connection takes while its PUBLISHes are being read ends there: what it
    had acknowledged is stored, nothing after, and the new connection is served."""
    name = "takeover1/dev/1"
    old = _connected(mqtt_broker, "taken-1")
    old.send_bytes(_publish(name, b"before", 1))
    assert old.read() == wire.PubAck(1)
    new = _connected(mqtt_broker, "taken-1")
    assert old.read() == wire.Disconnect(wire.SESSION_TAKEN_OVER)
    try:
        old.send_bytes(_publish(name, b"late", 2))
    except OSError:
        pass
    assert old.closed()
    new.send_bytes(_publish(name, b"after", 1))
    assert new.read() == wire.PubAck(1)
    assert _stored(mqtt_broker, name, 2, settle=0.3) == [b"before", b"after"]
    new.close()


# -- the publisher's one-step turn: a read of plain PUBLISHes of a name staged before --------------------------------

def _staged(b, client_id, name, version=wire.MQTT_5):
    """A connection that published once to ``name`` (its staging plan and write decision kept): its next reads of
    plain PUBLISHes to it take the one-step turn (``Publishes.read``)."""
    raw = _connected(b, client_id, version)
    raw.send_bytes(_publish(name, b"first", 1, version))
    assert raw.read() == wire.PubAck(1)
    return raw


@pytest.mark.parametrize("version", [wire.MQTT_5, wire.MQTT_311], ids=["v5", "v311"])
def test_three_publishes_of_a_name_staged_before_split_at_every_byte_are_each_handled_once_in_order(mqtt_broker,
                                                                                                    version):
    """QoS 1, QoS 0, QoS 1 PUBLISHes of a name staged before, their bytes in two reads cut at every byte: the whole
    packets of a read are split from it in one step, a partial one at its end completed by the next read; each QoS 1
    is acknowledged once, in order, and every message stored once, in order."""
    name = "staged%d/dev/1" % version
    raw = _staged(mqtt_broker, "staged-%d" % version, name, version)
    bodies, packet_id = [b"first"], 2

    def three(k, pid):
        return (_publish(name, b"a%03d" % k, pid, version)
                + wire.encode(wire.Publish(name, b"b%03d" % k, 0), version) + _publish(name, b"c%03d" % k, pid + 1,
                                                                                       version))

    for cut in range(1, len(three(0, 1))):
        data = three(cut, packet_id)
        raw.send_bytes(data[:cut])
        time.sleep(0.005)  # the broker reads the first part alone
        raw.send_bytes(data[cut:])
        assert [raw.read(), raw.read()] == [wire.PubAck(packet_id), wire.PubAck(packet_id + 1)]
        bodies += [b"a%03d" % cut, b"b%03d" % cut, b"c%03d" % cut]
        packet_id += 2
    assert _stored(mqtt_broker, name, len(bodies), settle=0.2) == bodies
    raw.close()


def test_a_pingreq_between_publishes_of_a_name_staged_before_is_answered_in_its_place(mqtt_broker):
    """The one-step turn takes the PUBLISHes before a PINGREQ; the PINGREQ and what follows it are the general
    path's: PUBACK, PUBACK, PINGRESP, PUBACK, PINGRESP in that order."""
    name = "stagedping/dev/1"
    raw = _staged(mqtt_broker, "staged-ping", name)
    ping = wire.encode(wire.PingReq(), wire.MQTT_5)
    raw.send_bytes(_publish(name, b"one", 2) + _publish(name, b"two", 3) + ping + _publish(name, b"three", 4) + ping)
    assert [raw.read() for _ in range(5)] == [wire.PubAck(2), wire.PubAck(3), wire.PingResp(), wire.PubAck(4),
                                              wire.PingResp()]
    assert _stored(mqtt_broker, name, 4) == [b"first", b"one", b"two", b"three"]
    raw.close()


def test_a_close_mid_turn_stores_and_acknowledges_the_whole_publishes_before_it(mqtt_broker):
    """Two whole PUBLISHes of a name staged before and part of a third, then the client closes its side: the two are
    stored and acknowledged, the part is refused as a stream ended inside a packet (0x81) and not stored, and the
    broker serves the next connection."""
    name = "stagedclose/dev/1"
    raw = _staged(mqtt_broker, "staged-close", name)
    third = _publish(name, b"three", 4)
    raw.send_bytes(_publish(name, b"one", 2) + _publish(name, b"two", 3) + third[:len(third) - 2])
    raw.sock.shutdown(socket.SHUT_WR)
    assert [raw.read(), raw.read()] == [wire.PubAck(2), wire.PubAck(3)]
    assert raw.read() == wire.Disconnect(wire.MALFORMED_PACKET)
    assert raw.closed()
    assert _stored(mqtt_broker, name, 3, settle=0.3) == [b"first", b"one", b"two"]
    again = _staged(mqtt_broker, "staged-close", name)
    again.close()
