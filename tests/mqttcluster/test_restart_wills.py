"""The will a killed broker's connection left, when the broker comes back and its recovered copy of the session gives
way to the one the device made on another broker meanwhile (docs/mqtt.md "Which copy stands after a restart"): the
copy ends as the device's CONNECT there would have ended it on one broker. Clean Start 0 within the Will Delay
Interval: no will (MQTT 5.0 3.1.3.2.2; broker 1 the id's home, or another); Clean Start 1: the old session ended,
the will is published once; a will with no delay was due when the connection ended: the restarted broker publishes
it once, whatever the device did since."""

import time

import pytest

from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import Paho, Raw
from tests.harness.replication import stats
from tests.mqttcluster.test_client_ids import _cluster, _homed


def _reconnects(b, client_id, version, clean_start):
    """A connection of ``client_id`` to ``b`` keeping its session 600 s (MQTT 3.1.1: Clean Session 0), or None
    while the cluster still refuses it."""
    raw = Raw(b, version)
    props = {"session_expiry_interval": 600} if version == wire.MQTT_5 else {}
    ack = raw.connect(client_id, clean_start=clean_start, properties=props)
    if ack is None or ack.reason_code != 0:
        raw.close()
        return None
    return raw


def _will_after_restart(broker_factory, tmp_path, zk_connect, home, version, delay_s, clean_start):
    """Broker 1 holds a device's session with a will (``delay_s``) and is killed; the device connects to broker 2
    (``clean_start``); broker 1 restarts and its copy ends. The will messages each watcher (on brokers 2, 3, then
    1) received, ``[(watcher, topic, payload)]``, and how many wills the brokers published."""
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000})
    client_id = _homed(1, home, [1, 2, 3], "meter-will")[0]
    device = Raw(b1, version)
    will = wire.Will("will/" + client_id, b"gone", 1, False, {"will_delay_interval": delay_s} if delay_s else {})
    props = {"session_expiry_interval": 600} if version == wire.MQTT_5 else {}
    ack = device.connect(client_id, clean_start=False, properties=props, will=will)
    assert ack.reason_code == 0, ack
    b1.kill()  # the connection ends with the broker: its will is left in broker 1's log
    device.close()
    live = wait_for(lambda: _reconnects(b2, client_id, version, clean_start), 60,
                    "a connect once broker 1 left the cluster")
    watchers = [Paho(b, "watch-%d" % i) for i, b in enumerate((b2, b3))]
    for w in watchers:
        assert w.subscribe("will/#", qos=1) == [1]
    b1.start()
    wait_for(lambda: stats(b1).get("mqtt_cluster_members") == "3", 30, "broker 1 back")
    wait_for(lambda: stats(b1)["mqtt_sessions"] == "0", 30, "broker 1's recovered copy ended")
    watchers.append(Paho(b1, "watch-b1"))
    assert watchers[-1].subscribe("will/#", qos=1) == [1]
    time.sleep(3.0)
    got = [(i, m.topic, m.payload) for i, w in enumerate(watchers) for m in w.messages]
    published = sum(int(stats(b)["mqtt_wills_published"]) for b in (b1, b2, b3))
    live.close()
    return client_id, published, got


def _once(client_id, published, got):
    """The will was published once in the cluster, and no watcher got it twice. (That the watchers on the other
    brokers get what broker 1 publishes as it starts is tests/mqttcluster/test_restart_routes.py's.)"""
    assert published == 1, (published, got)
    assert all(topic == "will/" + client_id and payload == b"gone" for _w, topic, payload in got), got
    assert len({w for w, _t, _p in got}) == len(got), "a watcher got the will twice: %r" % got


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("home", [1, 3])
def test_a_recovered_copy_giving_way_to_a_clean_start_0_session_elsewhere_publishes_no_will(
        broker_factory, tmp_path, zk_connect, home):
    """Broker 2's live copy is registered with the home (Clean Start 0): broker 1 itself (the live holder's hold
    answers it there) or broker 3 (broker 1 is told by its drop once it answers, or the answer to its hold) ends
    broker 1's copy as a continued session: its delayed will is dropped."""
    _client_id, published, got = _will_after_restart(broker_factory, tmp_path, zk_connect, home, wire.MQTT_5, 120,
                                                     False)
    assert (published, got) == (0, []), "the will of a device that reconnected within its delay was published"


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("home", [1, 3])
def test_a_recovered_copy_giving_way_to_a_clean_start_1_session_elsewhere_publishes_its_will_once(
        broker_factory, tmp_path, zk_connect, home):
    """Clean Start 1 on broker 2 ended the old session (MQTT 5.0 3.1.2.5): the delayed will is due then, so
    broker 1 publishes it as its copy ends, once, without waiting for its 120 s delay; the home broker 1 (the live
    holder's hold tells it) or broker 3 (the CONNECT's registration did)."""
    _once(*_will_after_restart(broker_factory, tmp_path, zk_connect, home, wire.MQTT_5, 120, True))


@pytest.mark.slow
@pytest.mark.fault
def test_a_will_with_no_delay_is_published_once_at_the_restart_whatever_the_device_did_since(
        broker_factory, tmp_path, zk_connect):
    """MQTT 3.1.1 (no Will Delay): the will was due when the connection ended with the killed broker; broker 1
    publishes it once as it starts again (docs/mqtt.md "What survives what": the broker is killed), although the
    device resumed (Clean Session 0) on broker 2 meanwhile and broker 1's copy then gives way."""
    _once(*_will_after_restart(broker_factory, tmp_path, zk_connect, 1, wire.MQTT_311, 0, False))
