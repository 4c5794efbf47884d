"""A two-member ``sync`` group whose master is killed (-9) (docs/cluster.md "Which shapes keep serving"; docs/mqtt.md
"What survives what"): the member elected in its place has no in-sync member, so it may write nothing until the old
one rejoins as its slave and catches up. Meanwhile it tells devices the truth (CONNACK 0x88 Server unavailable, MQTT
3.1.1 0x03; ``stats`` and ``metaq-admin cluster``: ``writable no (sync: no in-sync member)``), and the wills of the
killed master's connections wait in the sessions' log: published once it may write again, each once, to
subscribers on another broker of the MQTT cluster."""

import json
import time

import pytest

from metaq import admincli as admin
from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.ha import Group
from tests.harness.mqtt import V311, Paho, Raw, mosquitto_pub, with_mqtt
from tests.harness.mqttcluster import cluster_config, wait_routed
from tests.harness.replication import caught_up, stats

pytestmark = [pytest.mark.slow, pytest.mark.fault]

NO_INSYNC = "no (sync: no in-sync member)"
HOUR = {"session_expiry_interval": 3600}


def _sync_pair(broker_factory, tmp_path, zk_connect, **mqtt):
    """A two-member ``sync`` group (broker id 7) with MQTT ports, healthy: ``(group, master, slave)``."""
    group = Group(broker_factory, tmp_path, zk_connect, n=2, mode="sync", start=False)
    for member in group.members:
        with_mqtt(member.config, **mqtt)
        member.start()
    first = group.healthy(40)
    return group, first, 1 - first


def _wills(sub):
    with sub.got:
        return sorted((m.topic, m.payload) for m in sub.messages if m.topic.startswith("will/dev"))


def test_the_wills_of_a_killed_sync_master_with_one_slave_are_published_once_it_may_write_again(
        broker_factory, tmp_path, zk_connect):
    b = broker_factory(cluster_config(tmp_path / "b", 0, zk_connect), workdir=tmp_path / "b")
    group, first, second = _sync_pair(broker_factory, tmp_path, zk_connect)
    old, new = group.members[first], group.members[second]
    wait_for(lambda: stats(old).get("mqtt_cluster_peers_up") == "1", 30, "A follows B")
    watcher = Paho(b, "watcher", version=V311, clean=False)  # on the other broker of the MQTT cluster
    assert watcher.subscribe("will/#", 1) == [1]
    wait_routed(watcher, lambda i: mosquitto_pub(old, "will/probe", "p%d" % i, 0))
    devices = []
    for client_id, version, props in (("dev-5", wire.MQTT_5, {}), ("dev-311", wire.MQTT_311, {}),
                                      ("dev-kept", wire.MQTT_5, HOUR)):
        d = Raw(old, version)
        ack = d.connect(client_id, clean_start=not props, properties=props,
                        will=wire.Will("will/" + client_id, b"gone-" + client_id.encode(), 1))
        assert ack.reason_code == 0, ack
        devices.append(d)
    caught_up(old, new)  # the wills' records are on the slave
    assert (stats(old)["replication_writable"], stats(new)["replication_writable"]) == ("yes", "no (slave)")
    old.kill()
    for d in devices:
        d.close()
    group.master(40, exclude=(first,))
    wait_for(lambda: stats(new)["replication_writable"] == NO_INSYNC, 10, "the new master writes nothing")
    device = Raw(new)  # told the truth: its session could not be saved there
    ack = device.connect("dev-kept", clean_start=False, properties=dict(HOUR))
    assert (ack.reason_code, ack.session_present) == (wire.SERVER_UNAVAILABLE, False), ack
    assert "no slave is in sync" in ack.properties["reason_string"]
    time.sleep(2.0)
    assert _wills(watcher) == [] and stats(new)["mqtt_wills_published"] == "0"  # not yet: it may not write
    old.start()  # rejoins as the new master's slave; once in sync, the new master may write
    wait_for(lambda: stats(new)["replication_writable"] == "yes", 60, "the old member back in sync")
    want = sorted(("will/" + c, b"gone-" + c.encode()) for c in ("dev-5", "dev-311", "dev-kept"))
    wait_for(lambda: _wills(watcher) == want, 30, lambda: "the three wills at the other broker: %s"
             % _wills(watcher))
    time.sleep(2.0)  # none comes twice
    assert _wills(watcher) == want
    assert (stats(new)["mqtt_wills_published"], stats(old)["mqtt_wills_published"]) == ("3", "0")


def test_a_sync_master_whose_only_slave_is_gone_refuses_devices_and_says_why(broker_factory, tmp_path, zk_connect,
                                                                               capsys):
    """The other half of the shape: the slave is killed; once it is out of the in-sync set (``ha: auto``: behind
    for ``insync_lag_ms``) the master has no in-sync member and refuses every CONNECT until the slave is back in
    sync; past ``mqtt.unconfirmable_grace_s`` it closes the connections holding a session (MQTT 5: DISCONNECT
    0x9C)."""
    group, first, second = _sync_pair(broker_factory, tmp_path, zk_connect, unconfirmable_grace_s=0.5)
    master, slave = group.members[first], group.members[second]
    device = Raw(master)
    ack = device.connect("dev", clean_start=False, properties=dict(HOUR))
    assert ack.reason_code == 0, ack
    slave.kill()
    wait_for(lambda: stats(master)["replication_writable"] == NO_INSYNC, 20, "the master writes nothing")
    device.sock.settimeout(5.0)
    assert device.read() == wire.Disconnect(wire.USE_ANOTHER_SERVER)  # its session could not be saved
    kept = Raw(master)  # nor that of a new connection
    ack = kept.connect("dev", clean_start=False, properties=dict(HOUR))
    assert (ack.reason_code, ack.session_present) == (wire.SERVER_UNAVAILABLE, False), ack
    assert "no slave is in sync" in ack.properties["reason_string"]
    assert kept.closed()
    clean = Raw(master)  # a clean one would get nothing: nothing may be written here, its peers' copies neither
    assert clean.connect("reader").reason_code == wire.SERVER_UNAVAILABLE
    v311 = Raw(master, wire.MQTT_311)
    assert v311.connect("reader-311").reason_code == 0x03  # Server unavailable
    assert v311.closed()
    capsys.readouterr()
    admin.main(["--zk", zk_connect, "--json", "cluster"])  # exit status 1 while the dead slave is registered
    rows = json.loads(capsys.readouterr().out)
    assert [r["writable"] for r in rows if r["role"] == "master"] == [NO_INSYNC], rows
    slave.start()
    wait_for(lambda: stats(master)["replication_writable"] == "yes", 60, "the slave back in sync")
    again = Raw(master)
    ack = again.connect("dev", clean_start=False, properties=dict(HOUR))
    assert (ack.reason_code, ack.session_present) == (0, True), ack
    again.close()
