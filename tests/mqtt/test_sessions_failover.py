"""Persistent sessions, shared groups' read positions and retained messages survive a failover (docs/mqtt.md "What
survives what"): the slave copies the sessions' log (``%MQTT%``) with everything else and follows it into its own
session table; promoted, it resumes a device's session with what was published while the device was offline, a
shared group goes on where it stopped, and the retained messages are kept. A slave refuses a CONNECT that needs a
persistent session (it could not keep it), naming the master when it knows its MQTT address (``ha: auto``)."""

import os
import time

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from metaq.mqtt import wire
from metaq.mqtt.records import partition_for
from tests.harness.broker import wait_for
from tests.harness.faults import LinkProxy
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


def _ha_pair(broker_factory, tmp_path, zk, mode="sync", **mqtt):
    """A two-member ``ha: auto`` group with MQTT ports, started: ``(group, master, slave)`` once the slave follows
    (``sync``: in the master's in-sync set)."""
    group = Group(broker_factory, tmp_path, zk, n=2, mode=mode, start=False)
    for b in group.members:
        with_mqtt(b.config, **mqtt)
        b.start()
    master = group.healthy()
    return group, master, 1 - master


def _published(broker, name, payload):
    """How many records of MQTT topic ``name`` in ``broker``'s log end with ``payload`` (its metaq topic: 2
    partitions)."""
    with broker.client() as c:
        r = c.get_records(name.split("/")[0], partition_for(name, 2), 0)
    return sum(1 for x in r if bytes(x.data).endswith(payload)) if isinstance(r, list) else 0


def test_a_master_stopped_in_an_ha_group_publishes_its_wills_before_handing_over(broker_factory, tmp_path,
                                                                                  zk_connect):
    group, m, s = _ha_pair(broker_factory, tmp_path, zk_connect)
    master, slave = group.members[m], group.members[s]
    device = Raw(master, wire.MQTT_311)  # connected when the master stops
    assert device.connect("dev-311", will=wire.Will("status/dev-311", b"gone-311", 1)).reason_code == 0
    delayed = Raw(master)  # its connection lost, its will waiting for its delay
    assert delayed.connect("dev-5", will=wire.Will("status/dev-5", b"gone-5", 1,
                                                    properties={"will_delay_interval": 60}),
                           properties=dict(HOUR)).reason_code == 0
    delayed.close()
    wait_for(lambda: stats(master)["mqtt_delayed_wills"] == "1", 10, "the will waiting for its delay")
    assert master.stop() == 0
    assert "was not published" not in master.log_text()
    group.master(exclude=(m,))
    assert _published(slave, "status/dev-311", b"gone-311") == 1
    assert _published(slave, "status/dev-5", b"gone-5") == 1
    wait_for(lambda: stats(slave)["replication_role"] == "master", 10, "the slave elected")
    assert stats(slave)["mqtt_wills_published"] == "0"  # published by the old master, not again


def test_a_new_master_publishes_the_wills_of_the_connections_that_ended_with_a_killed_one(broker_factory, tmp_path,
                                                                                         zk_connect):
    group, m, s = _ha_pair(broker_factory, tmp_path, zk_connect, mode="async")  # one member left takes writes
    master, slave = group.members[m], group.members[s]
    old = Raw(master, wire.MQTT_311)
    assert old.connect("dev-311", will=wire.Will("status/dev-311", b"gone-311", 1)).reason_code == 0
    late = Raw(master)  # MQTT 5, Will Delay 2 s: published 2 s after the new master took it over
    assert late.connect("dev-5", will=wire.Will("status/dev-5", b"gone-5", 1, properties={"will_delay_interval": 2}),
                        properties=dict(HOUR)).reason_code == 0
    back = Raw(master)  # reconnects to the new master with its session within its delay: no will
    assert back.connect("dev-back", will=wire.Will("status/dev-back", b"gone-back", 1,
                                                   properties={"will_delay_interval": 8}),
                        properties=dict(HOUR)).reason_code == 0
    polite = Raw(master)  # DISCONNECT 0x00: its will is dropped, on the new master too
    assert polite.connect("dev-polite", will=wire.Will("status/dev-polite", b"gone-polite", 1)).reason_code == 0
    polite.send(wire.Disconnect())
    assert polite.closed()
    caught_up(master, slave)
    master.kill()
    group.master(exclude=(m,))
    resumed, present = _resume(slave, "dev-back")
    assert present
    wait_for(lambda: _published(slave, "status/dev-311", b"gone-311") == 1, 10, "the 3.1.1 device's will")
    wait_for(lambda: _published(slave, "status/dev-5", b"gone-5") == 1, 10, "the delayed will")
    time.sleep(8)  # past the resumed device's delay
    assert _published(slave, "status/dev-back", b"gone-back") == 0
    assert _published(slave, "status/dev-polite", b"gone-polite") == 0
    assert _published(slave, "status/dev-311", b"gone-311") == 1 and _published(slave, "status/dev-5", b"gone-5") == 1
    resumed.close()
    master.start()  # rejoins as a slave: publishes nothing
    group.following(s, [m])
    assert stats(master)["mqtt_wills_published"] == "0"


#: The isolated master's bound (``replication.max_isolation_ms``) and the room past it for the check's period
#: (``MQTT_ROLE_CHECK_S``) and a loaded machine.
ISOLATION_MS = 1000
SLACK_S = 3.0
#: What the new master may lack of the old one's session records at the cut: one save interval and the replication
#: lag (async: a flush every 100 ms, then the copy).
BEHIND_S = 2.0
BACKLOG = 3000


def _read_slowly(raw, got, until):
    """Read ``raw``'s PUBLISHes (each acknowledged, 10 ms apart) into ``got`` (payload -> monotonic time first read)
    until ``until()`` or the connection ends; returns the packet that is not a PUBLISH (a DISCONNECT, None:
    closed), or ``"timeout"``."""
    raw.sock.settimeout(1.0)
    while not until():
        try:
            p = raw.read()
        except OSError:
            continue
        if not isinstance(p, wire.Publish):
            return p
        got.setdefault(p.payload, time.monotonic())
        try:
            raw.send(wire.PubAck(p.packet_id))
        except OSError:  # the broker closed: what it sent before is still read
            pass
        time.sleep(0.01)
    return "timeout"


def test_an_isolated_master_closes_its_sessions_at_once_and_a_resumed_one_is_sent_again_little(
        broker_factory, tmp_path, zk_server):
    chroot = zk_server.chroot()
    group = Group(broker_factory, tmp_path, chroot, n=2, mode="async", start=False,
                  sections={"store": {"flush_interval_ms": 100}}, max_isolation_ms=ISOLATION_MS)
    zk_proxies, links = [], []
    try:
        for i, b in enumerate(group.members):
            zk_proxies.append(LinkProxy(("127.0.0.1", zk_server.port)).start())
            links.append(LinkProxy(("127.0.0.1", group.replication_port(i))).start())
            b.config["zk"].update(connect=zk_proxies[i].address + chroot[chroot.index("/"):], session_timeout_ms=8000)
            b.config["replication"]["advertised_address"] = links[i].address
            with_mqtt(b.config)
            b.start()
        m = group.master()
        s = 1 - m
        group.following(m, [s])
        master, slave = group.members[m], group.members[s]
        device = Raw(master)  # MQTT 5, persistent, reading a backlog slowly
        assert not device.connect("dev", clean_start=False,
                                  properties=dict(HOUR, receive_maximum=5)).session_present
        device.send(wire.Subscribe(1, (wire.Subscription("dev/#", 1),)))
        assert device.read() == wire.Suback(1, (1,))
        old = Raw(master, wire.MQTT_311)  # MQTT 3.1.1, persistent, idle
        assert old.connect("dev-311", clean_start=False).reason_code == 0
        old.send(wire.Subscribe(1, (wire.Subscription("other/#", 1),)))
        assert old.read() == wire.Suback(1, (1,))
        publisher = Raw(master)
        assert publisher.connect("publisher").reason_code == 0
        for start in range(0, BACKLOG, 50):  # QoS 1, 50 at a time
            publisher.send_bytes(b"".join(wire.encode(wire.Publish("dev/t", b"m%d" % i, 1, packet_id=1 + i - start),
                                                      wire.MQTT_5) for i in range(start, start + 50)))
            assert [publisher.read().reason_code for _ in range(50)] == [0] * 50
        caught_up(master, slave)
        first = {}
        assert _read_slowly(device, first, lambda: len(first) >= 100) == "timeout"
        t_cut = zk_proxies[m].cut(blackhole=True)
        links[m].cut(blackhole=True)
        end = _read_slowly(device, first, lambda: time.monotonic() > t_cut + 30)
        t_closed = time.monotonic()
        assert end == wire.Disconnect(wire.USE_ANOTHER_SERVER), end
        assert t_closed - t_cut <= ISOLATION_MS / 1000.0 + SLACK_S, t_closed - t_cut
        assert device.closed()
        old.sock.settimeout(SLACK_S)
        assert old.read() is None  # MQTT 3.1.1: closed, without a DISCONNECT
        again = Raw(master)  # and it serves no persistent session while it may not save it
        assert again.connect("dev", clean_start=False, properties=dict(HOUR)).reason_code == wire.USE_ANOTHER_SERVER
        group.master(timeout=60.0, exclude=(m,))
    finally:
        for p in zk_proxies + links:
            p.heal()
    group.following(s, [m], timeout=60.0)
    resumed = Raw(slave)
    ack = resumed.connect("dev", clean_start=False, properties=dict(HOUR))
    assert ack.reason_code == 0 and ack.session_present
    again = {}
    _read_slowly_done = _read_quickly(resumed, again)
    assert _read_slowly_done
    assert set(first) | set(again) >= {b"m%d" % i for i in range(BACKLOG)}  # at least once
    sent_again = sorted(first[p] - t_cut for p in set(first) & set(again))
    print("\nisolated master: %d messages read before it closed (%.2f s after the cut), %d sent again by the new "
          "master (first read %.2f s to %.2f s from the cut)" % (len(first), t_closed - t_cut, len(sent_again),
                                                                 sent_again[0] if sent_again else 0,
                                                                 sent_again[-1] if sent_again else 0))
    # sent again: only what the old master delivered after the new one's copy of the session, until it closed
    assert all(-BEHIND_S <= t <= t_closed - t_cut for t in sent_again), sent_again
    for p in zk_proxies + links:
        p.close()


def _read_quickly(raw, got):
    """Read ``raw``'s PUBLISHes (acknowledged) into ``got`` until 2 s pass without one; True."""
    raw.sock.settimeout(2.0)
    while True:
        try:
            p = raw.read()
        except OSError:
            return True
        assert isinstance(p, wire.Publish), p
        got.setdefault(p.payload, time.monotonic())
        raw.send(wire.PubAck(p.packet_id))
