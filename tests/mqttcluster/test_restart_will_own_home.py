"""A restarted broker that is the client id's own home: its recovered copy of a session gives way to the device's
live one elsewhere, and the will its killed connection left is not published, since the device connected again
(Clean Start 0) within the Will Delay Interval (MQTT 5.0 3.1.3.2.2), as on one broker."""

import time

import pytest

from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import Paho, Raw
from tests.harness.replication import stats
from tests.mqttcluster.test_client_ids import _cluster, _homed, _sessions_persist


@pytest.mark.slow
@pytest.mark.fault
def test_a_recovered_copy_giving_way_publishes_no_will_the_client_reconnected_within(
        broker_factory, tmp_path, zk_connect):
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000})
    client_id = _homed(1, 1, [1, 2, 3], "meter-will")[0]
    device = Raw(b1)
    ack = device.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600},
                         will=wire.Will("will/" + client_id, b"gone", 1, False, {"will_delay_interval": 120}))
    assert ack.reason_code == 0, ack
    b1.kill()  # the connection ends with the broker: its will (120 s delay) is left in broker 1's log
    device.close()
    live, _ack = wait_for(lambda: _sessions_persist(b2, client_id), 60, "a connect once broker 1 left the cluster")
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
    assert got == [], "the will of a device that reconnected within its delay was published: %r" % got
    live.close()
