"""Issue 66 point 6: masters under one ZooKeeper root with an MQTT port but no replication port cannot be one MQTT
service; each says so (a warning at its start, ``stats``, ``metaq-admin cluster``) and never logs that every peer
follows it."""

import json
import os

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.mqtt import with_mqtt
from tests.harness.replication import stats

OFF = "off (no replication port)"


def master(broker_factory, tmp_path, zk_connect, broker_id, rport=None):
    more = {"replication": {"port": rport}} if rport else {}
    cfg = with_mqtt(small_config(os.path.join(str(tmp_path / ("b%d" % broker_id)), "data"),
                                 zk={"connect": zk_connect, "session_timeout_ms": 4000}, **more))
    cfg["broker"]["id"] = broker_id
    return broker_factory(cfg, workdir=tmp_path / ("b%d" % broker_id))


def test_masters_without_a_replication_port_say_they_are_not_in_the_mqtt_cluster(broker_factory, tmp_path,
                                                                                 zk_connect, capsys):
    islands = [master(broker_factory, tmp_path, zk_connect, i) for i in (0, 1)]
    member = master(broker_factory, tmp_path, zk_connect, 2, rport=free_port())
    for b in islands:
        assert stats(b)["mqtt_cluster"] == OFF
        text = b.log_text()
        assert "mqtt cluster: %s: the other masters under this ZooKeeper root cannot follow this broker" % OFF in text
        assert "every peer" not in text
    assert stats(member)["mqtt_cluster"] == "on"
    wait_for(lambda: "no other master with a replication port under this ZooKeeper root" in member.log_text(), 15,
             "the member's hold ends saying there is nobody to wait for")
    assert "every peer" not in member.log_text()
    capsys.readouterr()
    assert admin.main(["--zk", zk_connect, "--json", "cluster"]) == admin.EXIT_OK
    rows = json.loads(capsys.readouterr().out)
    assert {r["broker"]: r["mqtt_cluster"] for r in rows} == {0: OFF, 1: OFF, 2: "on"}
    capsys.readouterr()
    assert admin.main(["--zk", zk_connect, "cluster"]) == admin.EXIT_OK
    assert OFF in capsys.readouterr().out
