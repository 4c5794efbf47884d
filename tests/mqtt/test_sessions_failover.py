"""Persistent sessions, shared groups' read positions and retained messages survive a failover (docs/mqtt.md "What
survives what"): the slave copies the sessions' log (``%MQTT%``) with everything else and follows it into its own
session table; promoted, it resumes a device's session with what was published while the device was offline, a
shared group goes on where it stopped, and the retained messages are kept. A slave refuses a CONNECT that needs a
persistent session (it could not keep it), naming the master when it knows its MQTT address (``ha: auto``)."""

import os

import pytest

from metaq.admin import cli as admin
from metaq.client.local import free_port, small_config
from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.ha import Group
from tests.harness.mqtt import V311, Paho, Raw, mqtt_port, with_mqtt
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
    worker = Raw(m)  # the only member of shared group w, persistent: the group's position is kept when it leaves
    assert not worker.connect("worker", clean_start=False, properties=dict(HOUR)).session_present
    worker.send(wire.Subscribe(1, (wire.Subscription("$share/w/jobs/#", 1),)))
    assert worker.read() == wire.Suback(1, (1,))
    worker.send(wire.Disconnect())
    worker.close()
    _publish(m, 2)  # while it is offline; PUBACK once the slave holds them (sync)
    _publish(m, 2, topic="jobs/x", start=10)  # while group w has no member
    pub = Raw(m)
    assert pub.connect("retainer").reason_code == 0
    pub.send(wire.Publish("kept/x", b"retained", 1, retain=True, packet_id=1))
    assert pub.read() == wire.PubAck(1)  # once the slave holds the message and its retained record
    caught_up(m, s)
    wait_for(lambda: stats(s).get("mqtt_sessions_offline") == "2", 10, "the slave learned the sessions")
    assert stats(s)["mqtt_shared_groups_kept"] == "1"
    _slave_refuses_persistent_sessions(s, None)  # a manual slave knows only the master's replication address
    assert stats(s)["mqtt_session_records"] == "0"
    m.kill()
    code = admin.main(["promote", "127.0.0.1:%d" % s.port, "--force"])
    assert code == admin.EXIT_OK, capsys.readouterr().err
    wait_for(lambda: stats(s)["replication_role"] == "master", 10, "promoted")
    raw, present = _resume(s, "dev1")
    assert present
    assert _payloads(raw, 2) == [b"m0", b"m1"]
    worker, present = _resume(s, "worker")
    assert present
    assert _payloads(worker, 2) == [b"m10", b"m11"]  # group w went on where it stopped
    raw.send(wire.Subscribe(2, (wire.Subscription("kept/#", 1),)))
    assert raw.read() == wire.Suback(2, (1,))
    p = raw.read()
    assert (p.topic, p.payload, p.retain) == ("kept/x", b"retained", True)


def _slave_refuses_persistent_sessions(s, master_mqtt):
    """A persistent session asked of slave ``s`` is refused, naming ``master_mqtt`` (None: no reference); a clean
    session is served."""
    v5 = Raw(s)
    ack = v5.connect("reader", clean_start=False, properties=dict(HOUR))
    assert (ack.reason_code, ack.properties.get("server_reference")) == (wire.USE_ANOTHER_SERVER, master_mqtt)
    assert v5.closed()
    resumes = Raw(s)  # Clean Start 0 for a session the slave's table holds: a resume it could not keep
    assert resumes.connect("dev1", clean_start=False).reason_code == wire.USE_ANOTHER_SERVER
    old = Raw(s, wire.MQTT_311)
    assert old.connect("reader-311", clean_start=False).reason_code == 0x03  # Server unavailable
    assert old.closed()
    clean = Paho(s, "reader")  # a clean session keeps nothing: served, it reads what the slave holds
    assert clean.connack == 0 and clean.subscribe("dev/#", 1) == [1]
    clean311 = Paho(s, "reader-311", version=V311)
    assert clean311.connack == 0
    clean.close()
    clean311.close()


def test_an_ha_auto_slave_names_the_masters_mqtt_address(broker_factory, tmp_path, zk_connect):
    group = Group(broker_factory, tmp_path, zk_connect, n=2, mode="async", start=False)
    for b in group.members:
        with_mqtt(b.config)
    for b in group.members:
        b.start()
    master = group.master()
    slave = 1 - master
    group.following(master, [slave])
    m, s = group.members[master], group.members[slave]
    raw = Raw(m)
    assert not raw.connect("dev1", clean_start=False, properties=dict(HOUR)).session_present
    raw.send(wire.Disconnect())
    raw.close()
    wait_for(lambda: stats(s).get("mqtt_sessions_offline") == "1", 10, "the slave learned the session")
    _slave_refuses_persistent_sessions(s, "127.0.0.1:%d" % mqtt_port(m))
