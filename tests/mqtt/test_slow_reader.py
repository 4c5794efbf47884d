"""An MQTT subscriber that never reads its socket stops its own deliveries and does not grow the broker; the others
get everything (docs/mqtt.md "Subscribing")."""

import socket

from metaq.mqtt import wire
from tests.harness.mqtt import Paho, mqtt_config, mqtt_port

MESSAGES = 100
BODY = 160 * 1024  # 16 MB in all, past the reply budget (limits.max_reply_bytes, 4 MiB) four times over


def rss_anon_bytes(pid):
    """The process's anonymous resident memory (the log's mapped segments are file pages: not counted)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon for %d" % pid)


def test_a_subscriber_that_never_reads_does_not_grow_the_broker(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", mqtt_port(b)))
    stuck.sendall(wire.encode(wire.Connect(wire.MQTT_5, "stuck"), wire.MQTT_5)
                  + wire.encode(wire.Subscribe(1, (wire.Subscription("flood/#", 0),)), wire.MQTT_5))
    reader = Paho(b, "reader")
    reader.subscribe("flood/#", qos=0)
    before = rss_anon_bytes(b.proc.pid)
    with b.client() as c:
        for i in range(MESSAGES):
            c.put_ok("flood", bytes([i % 256]) * BODY)
    got = reader.wait_messages(MESSAGES, timeout=60)
    assert len(got) == MESSAGES and all(len(m.payload) == BODY for m in got)  # the stuck one holds nobody up
    grown = rss_anon_bytes(b.proc.pid) - before
    assert grown < 12 << 20, "the broker grew %d bytes for a subscriber that never reads" % grown
    stuck.close()
