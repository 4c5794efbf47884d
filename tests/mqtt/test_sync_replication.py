"""A PUBLISH to a ``sync`` master (docs/mqtt.md "Publishing"): its PUBACK waits for the slave's copy, and a put the
slave does not confirm within ``replication.sync_timeout_ms`` (written, not acknowledgeable) is answered 0x80 in
MQTT 5 and closed in MQTT 3.1.1. A real master and slave; the slave is frozen with SIGSTOP (connected but silent)."""

import os
import signal
import time

import pytest

from metaq.client.local import free_port, small_config
from metaq.mqtt import wire
from metaq.mqtt.records import message_of
from tests.harness.broker import consume_all, wait_for
from tests.harness.mqtt import Paho, Raw, with_mqtt
from tests.harness.replication import master_config, stats

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def _pair(broker_factory, tmp_path, sync_timeout_ms):
    """A ``sync`` master and its slave, both with the MQTT port; returned once the slave is connected."""
    rport = free_port()
    m = broker_factory(with_mqtt(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=sync_timeout_ms)),
                       workdir=tmp_path / "m")
    s = broker_factory(with_mqtt(small_config(os.path.join(str(tmp_path / "s"), "data"))), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: stats(m)["replication_slaves"] == "1", 10, "slave connected")
    return m, s


def test_a_puback_waits_until_the_sync_slave_has_the_message(broker_factory, tmp_path):
    m, s = _pair(broker_factory, tmp_path, sync_timeout_ms=20000)
    on_slave = Paho(s, "reader")  # a clean session on the slave: it sees what the slave holds
    assert on_slave.subscribe("sync/#", 1) == [1]
    device = Paho(m, "device")
    s.proc.send_signal(signal.SIGSTOP)  # connected but silent: it confirms nothing
    try:
        info = device.c.publish("sync/x", b"held", 1)
        time.sleep(2.0)
        assert not info.is_published()  # no PUBACK while the slave does not have it
        assert on_slave.messages == []
    finally:
        s.proc.send_signal(signal.SIGCONT)
    info.wait_for_publish(15)
    assert info.is_published()
    got = on_slave.wait_messages(1)  # the slave had it when the PUBACK came
    assert [(x.topic, x.payload) for x in got] == [("sync/x", b"held")]


def test_a_put_the_sync_slave_does_not_confirm_in_time_is_answered_0x80(broker_factory, tmp_path):
    m, s = _pair(broker_factory, tmp_path, sync_timeout_ms=1000)
    v5 = Raw(m)
    assert v5.connect("dev5").reason_code == 0
    v311 = Raw(m, wire.MQTT_311)
    assert v311.connect("dev311").reason_code == 0
    s.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        v5.send(wire.Publish("late/a", b"q1", 1, packet_id=1))
        v5.send(wire.Publish("late/b", b"q2", 2, packet_id=2))
        v311.send(wire.Publish("late/c", b"old", 1, packet_id=1))
        assert v5.read() == wire.PubAck(1, wire.UNSPECIFIED_ERROR)  # written, not confirmed: not acknowledged
        assert v5.read() == wire.PubRec(2, wire.UNSPECIFIED_ERROR)
        assert time.monotonic() - started >= 0.9  # the sync deadline passed first
        assert v311.closed()  # MQTT 3.1.1 has no negative acknowledgement: closed, the client resends
    finally:
        s.proc.send_signal(signal.SIGCONT)
    v5.send(wire.Publish("late/b", b"q2", 2, packet_id=2))  # its id was released with the 0x80: a new message
    assert v5.read() == wire.PubRec(2)
    v5.send(wire.PubRel(2))
    assert v5.read() == wire.PubComp(2)
    with m.client() as c:  # the unacknowledged puts were written on the master, as the 0x80 says can be
        stored = [message_of("late", rec.flag, rec.data).payload
                  for p in range(2)  # small_config: 2 partitions
                  for rec in consume_all(c, "late", p)]
    assert sorted(stored) == [b"old", b"q1", b"q2", b"q2"], stored
