"""A shared group's member that does not take its turn (docs/mqtt.md "Shared subscriptions"): its client stopped
reading, so a send to it waits and its delivery takes nothing more. The message whose turn is its is taken by
another member at that member's next look: when the next message is published, or ``MQTT_TOPIC_RESCAN_S`` (a
second) later when none is. Each message goes to one member. A real broker; the member that stops reading is a raw
socket with a small receive buffer, the other a paho-mqtt client."""

import collections
import socket
import time

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt import wire
from metaq.protocol.stream import CLOSED, NEED_DATA
from tests.harness.mqtt import Paho, mqtt_config, mqtt_port

BODY = 200 * 1024  # the fill: a member that does not read blocks once its socket and reply budget are full
MAX_FILL = 200
#: How late past MQTT_TOPIC_RESCAN_S the other member may take it on a machine shared with other tests.
SLACK_S = 0.5


def _stuck_member(b):
    """A member of ``$share/g/one/#`` (QoS 0: no window) whose client reads nothing after its SUBACK."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", mqtt_port(b)))
    s.sendall(wire.encode(wire.Connect(wire.MQTT_5, "stuck"), wire.MQTT_5)
              + wire.encode(wire.Subscribe(1, (wire.Subscription("$share/g/one/#", 0),)), wire.MQTT_5))
    return s


def _drain(s):
    """The PUBLISH payloads the stuck member's socket holds, read until it is quiet for a second."""
    parser = wire.MqttParser(wire.MQTT_5, sender="server")
    s.settimeout(1.0)
    out = []
    while True:
        p = parser.next_event()
        if p is CLOSED:
            return out
        if p is NEED_DATA:
            try:
                data = s.recv(1 << 20)
            except socket.timeout:
                return out
            parser.receive_data(data)
        elif isinstance(p, wire.Publish):
            out.append(bytes(p.payload))


def test_a_member_that_does_not_take_its_turn_has_its_message_taken_by_another(broker_factory, tmp_path):
    cfg = mqtt_config(tmp_path)
    cfg["topics"].insert(0, {"name": "one", "partitions": 1})  # one partition: one cursor, one turn order
    b = broker_factory(cfg)
    reader = Paho(b, "reader")
    reader.subscribe("$share/g/one/#", qos=0)
    stuck = _stuck_member(b)
    time.sleep(0.5)  # its CONNECT and SUBSCRIBE are in
    sent = []
    with b.client() as c:
        def put(payload):
            c.put_ok("one", payload)
            sent.append(payload)

        # fill: the members take turns until the stuck one's sends wait; from then on the reader gets one message
        # per publish (the one before it, its turn passed on), where before it got one in two
        streak = 0
        for i in range(MAX_FILL):
            n = len(reader.messages)
            put(b"x" * BODY + b"%d" % i)
            got = len(reader.wait_messages(n + 1, timeout=0.2))
            streak = streak + 1 if got > n else 0
            if streak == 5:
                break
        assert streak == 5, "the stuck member's sends never waited after %d messages" % len(sent)
        time.sleep(mqtt_limits.MQTT_TOPIC_RESCAN_S + SLACK_S)  # the last one passed on is taken meanwhile
        # nothing else published: the reader takes the stuck member's message a second later
        for k in range(2):
            n = len(reader.messages)
            started = time.monotonic()
            put(b"alone%d" % k)
            got = reader.wait_messages(n + 1, timeout=10)
            took = time.monotonic() - started
            assert [m.payload for m in got[n:]] == [b"alone%d" % k]
            assert took <= mqtt_limits.MQTT_TOPIC_RESCAN_S + SLACK_S, took
        # the next message published lets it go at once (and is itself the next one waiting)
        n = len(reader.messages)
        started = time.monotonic()
        put(b"first")
        time.sleep(0.1)
        put(b"second")
        got = reader.wait_messages(n + 1, timeout=10)
        took = time.monotonic() - started
        assert got[n].payload == b"first" and took < mqtt_limits.MQTT_TOPIC_RESCAN_S, took
        assert reader.wait_messages(n + 2, timeout=10)[n + 1].payload == b"second"
    held = _drain(stuck)  # what the stuck member's socket held: the messages it took before its sends waited
    delivered = collections.Counter([m.payload for m in reader.messages] + held)
    assert sorted(delivered) == sorted(sent) and max(delivered.values()) == 1, (  # none lost, none twice
        len(reader.messages), len(held), len(sent))
    stuck.close()
