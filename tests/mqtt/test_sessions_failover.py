"""Persistent sessions and retained messages survive a failover (docs/mqtt.md "What survives what"): the slave
copies the sessions' log (``%MQTT%``) with everything else and follows it into its own session table; promoted, it
resumes a device's session with what was published while the device was offline, and keeps the retained messages."""

import os

import pytest

from metaq.admin import cli as admin
from metaq.client.local import free_port, small_config
from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import Raw, with_mqtt
from tests.harness.replication import caught_up, master_config, stats
from tests.mqtt.test_persistent_sessions import HOUR, _payloads, _publish, _resume

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def test_a_promoted_slave_resumes_the_session(broker_factory, tmp_path, capsys):
    rport = free_port()
    m = broker_factory(with_mqtt(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=2000)),
                       workdir=tmp_path / "m")
    s = broker_factory(with_mqtt(small_config(os.path.join(str(tmp_path / "s"), "data"))), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: stats(m)["replication_slaves"] == "1", 10, "slave connected")
    raw = Raw(m)
    assert not raw.connect("dev1", clean_start=False, properties=dict(HOUR)).session_present
    raw.send(wire.Subscribe(1, (wire.Subscription("dev/#", 1),)))
    assert raw.read() == wire.Suback(1, (1,))
    raw.send(wire.Disconnect())
    raw.close()
    _publish(m, 2)  # while it is offline; PUBACK once the slave holds them (sync)
    pub = Raw(m)
    assert pub.connect("retainer").reason_code == 0
    pub.send(wire.Publish("kept/x", b"retained", 1, retain=True, packet_id=1))
    assert pub.read() == wire.PubAck(1)  # once the slave holds the message and its retained record
    caught_up(m, s)
    wait_for(lambda: stats(s).get("mqtt_sessions_offline") == "1", 10, "the slave learned the session")
    on_slave = Raw(s)  # a slave serves a persistent session from memory; only the master writes session records
    assert on_slave.connect("reader", clean_start=False, properties=dict(HOUR)).reason_code == 0
    on_slave.send(wire.Subscribe(1, (wire.Subscription("dev/#", 1),)))
    assert on_slave.read() == wire.Suback(1, (1,))
    assert stats(s)["mqtt_session_records"] == "0"
    m.kill()
    code = admin.main(["promote", "127.0.0.1:%d" % s.port, "--force"])
    assert code == admin.EXIT_OK, capsys.readouterr().err
    wait_for(lambda: stats(s)["replication_role"] == "master", 10, "promoted")
    raw, present = _resume(s, "dev1")
    assert present
    assert _payloads(raw, 2) == [b"m0", b"m1"]
    raw.send(wire.Subscribe(2, (wire.Subscription("kept/#", 1),)))
    assert raw.read() == wire.Suback(2, (1,))
    p = raw.read()
    assert (p.topic, p.payload, p.retain) == ("kept/x", b"retained", True)
