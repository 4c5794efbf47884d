"""A ``sync`` master whose only slave restarts (docs/mqtt.md "What survives what", ``mqtt.unconfirmable_grace_s``):
it refuses new CONNECTs at once, but keeps the connections holding a session or a will open for the grace, so a
routine slave restart closes no device and publishes no will. Past the grace it closes them (Use another server);
their clients were moved away, not lost: a will is published only if its client does not come back within the
grace once the master may write again."""

import time

import pytest

from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.ha import Group
from tests.harness.mqtt import V311, Paho, Raw, with_mqtt
from tests.harness.replication import stats

pytestmark = [pytest.mark.slow, pytest.mark.fault]

NO_INSYNC = "no (sync: no in-sync member)"
HOUR = {"session_expiry_interval": 3600}


def _sync_pair(broker_factory, tmp_path, zk_connect, grace_s):
    """A healthy two-member ``sync`` group with MQTT ports: ``(master, slave)``."""
    group = Group(broker_factory, tmp_path, zk_connect, n=2, mode="sync", start=False)
    for member in group.members:
        with_mqtt(member.config, unconfirmable_grace_s=grace_s)
        member.start()
    first = group.healthy(40)
    return group.members[first], group.members[1 - first]


def _device(broker, client_id, version=wire.MQTT_5, props=None):
    d = Raw(broker, version)
    ack = d.connect(client_id, clean_start=not props, properties=dict(props or {}),
                    will=wire.Will("will/" + client_id, b"gone-" + client_id.encode(), 1))
    assert ack.reason_code == 0, ack
    return d


def _wills(watcher):
    with watcher.got:
        return sorted(m.topic for m in watcher.messages if m.topic.startswith("will/"))


def test_a_slave_restart_within_the_grace_closes_no_device_and_publishes_no_will(broker_factory, tmp_path,
                                                                                  zk_connect):
    master, slave = _sync_pair(broker_factory, tmp_path, zk_connect, 60.0)
    watcher = Paho(master, "watcher", version=V311)  # a clean session without a will: not closed either way
    assert watcher.subscribe("will/#", 1) == [1]
    devices = [_device(master, "dev-kept", props=HOUR), _device(master, "dev-311", wire.MQTT_311)]
    slave.kill()
    wait_for(lambda: stats(master)["replication_writable"] == NO_INSYNC, 20, "the master writes nothing")
    refused = Raw(master)  # a new device is refused at once
    assert refused.connect("dev-new").reason_code == wire.SERVER_UNAVAILABLE
    slave.start()
    wait_for(lambda: stats(master)["replication_writable"] == "yes", 60, "the slave back in sync")
    for d in devices:  # still connected
        d.send(wire.PingReq())
        d.sock.settimeout(5.0)
        assert isinstance(d.read(), wire.PingResp)
    time.sleep(1.5)  # the master's pass over the wills once it may write again
    assert _wills(watcher) == [] and stats(master)["mqtt_wills_published"] == "0"
    assert Raw(master).connect("dev-new").reason_code == 0


def test_past_the_grace_devices_are_moved_away_and_a_will_waits_for_its_client_to_come_back(broker_factory, tmp_path,
                                                                                             zk_connect):
    master, slave = _sync_pair(broker_factory, tmp_path, zk_connect, 3.0)
    watcher = Paho(master, "watcher", version=V311)
    assert watcher.subscribe("will/#", 1) == [1]
    back, gone = _device(master, "dev-back", wire.MQTT_311), _device(master, "dev-gone", wire.MQTT_311)
    slave.kill()
    wait_for(lambda: stats(master)["replication_writable"] == NO_INSYNC, 20, "the master writes nothing")
    for d in (back, gone):
        d.sock.settimeout(10.0)
        assert d.closed()  # past the grace: closed (MQTT 5 would be told Use another server)
    slave.start()
    wait_for(lambda: stats(master)["replication_writable"] == "yes", 60, "the slave back in sync")
    again = _device(master, "dev-back", wire.MQTT_311)  # back within the grace: its will is not published
    wait_for(lambda: _wills(watcher) == ["will/dev-gone"], 15, lambda: "the will of the device that did not come "
             "back: %s" % _wills(watcher))
    time.sleep(1.0)
    assert _wills(watcher) == ["will/dev-gone"] and stats(master)["mqtt_wills_published"] == "1"
    again.close()


def test_a_fresh_sync_group_refuses_devices_until_its_slave_joins(broker_factory, tmp_path, zk_connect):
    group = Group(broker_factory, tmp_path, zk_connect, n=2, mode="sync", start=False)
    for member in group.members:
        with_mqtt(member.config)
    first = group.members[0]
    first.start()
    group.master(40)
    wait_for(lambda: stats(first)["replication_writable"] == NO_INSYNC, 20, "the lone master writes nothing")
    assert Raw(first).connect("dev").reason_code == wire.SERVER_UNAVAILABLE
    group.members[1].start()
    wait_for(lambda: stats(first)["replication_writable"] == "yes", 60, "its slave joined and in sync")
    assert Raw(first).connect("dev").reason_code == 0
