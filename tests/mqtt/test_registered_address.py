"""The MQTT port in ZooKeeper (docs/mqtt.md "At scale"): every broker member with an MQTT port publishes its address
and TLS mode beside its other ports, and ``metaq-admin brokers`` lists them for a device fleet's provisioning: each
broker id's master and slaves, ``-`` for a member without the port, gone when a broker stops, and after a failover
the broker id's address is the new master's. Real broker processes and a real ZooKeeper."""

import json

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from tests.harness.ha import SESSION_MS, Group
from tests.harness.broker import wait_for
from tests.harness.mqtt import V5, Paho, mqtt_port, with_mqtt
from tests.harness.pki import Pki

pytestmark = pytest.mark.integration


def brokers(capsys, zk):
    """``metaq-admin --zk ZK --json brokers``'s rows, keyed by (broker, role)."""
    code = admin.main(["--zk", zk, "--json", "brokers"])
    out = capsys.readouterr()
    assert code == admin.EXIT_OK, out.err
    return {(r["broker"], r["role"]): r for r in json.loads(out.out)}


def mqtt_address(b):
    return "127.0.0.1:%d" % mqtt_port(b)


def group_with_mqtt(broker_factory, tmp_path, zk):
    """Broker id 7 as two members electing their master (ha: auto), each with an MQTT port of its own."""
    group = Group(broker_factory, tmp_path, zk, n=2, start=False)
    for b in group.members:
        with_mqtt(b.config)
        b.start()
    return group


def test_brokers_lists_each_members_mqtt_address_and_tls_mode(broker_factory, tmp_path, zk_connect, capsys):
    group = group_with_mqtt(broker_factory, tmp_path / "g", zk_connect)
    master = group.healthy()
    slave = 1 - master
    pki = Pki(tmp_path / "pki")
    zk = {"connect": zk_connect, "session_timeout_ms": SESSION_MS}
    tls = broker_factory(with_mqtt(small_config(tmp_path / "b2" / "data", broker={"id": 2}, zk=zk,
                                                security={"tls": pki.tls_config("on")})), workdir=tmp_path / "b2")
    rport, hport = free_port(), free_port()
    plain = broker_factory(small_config(tmp_path / "b3" / "data", broker={"id": 3}, zk=zk, remoting={"port": rport},
                                        http={"port": hport}), workdir=tmp_path / "b3")
    none = {"mqtt": None, "mqtt_tls": None, "remoting": None, "grpc": None, "http": None}
    want = {
        (2, "master"): dict(none, broker=2, role="master", url="meta://127.0.0.1:%d" % tls.port,
                            mqtt=mqtt_address(tls), mqtt_tls="on"),
        (3, "master"): dict(none, broker=3, role="master", url="meta://127.0.0.1:%d" % plain.port,
                            remoting="127.0.0.1:%d" % rport, http="127.0.0.1:%d" % hport),
        (7, "master"): dict(none, broker=7, role="master", url="meta://127.0.0.1:%d" % group.members[master].port,
                            mqtt=mqtt_address(group.members[master]), mqtt_tls="off"),
        (7, "slave %d" % slave): dict(none, broker=7, role="slave %d" % slave,
                                      url="meta://127.0.0.1:%d" % group.members[slave].port,
                                      mqtt=mqtt_address(group.members[slave]), mqtt_tls="off"),
    }
    wait_for(lambda: brokers(capsys, zk_connect) == want, 15, lambda: "the four members listed: %s"
             % brokers(capsys, zk_connect))
    # a device handed broker 7's master address connects there
    device = Paho(group.members[master], client_id="device-1", version=V5)
    assert device.connack == 0
    device.close()
    # the table for people: one line per member, "-" for a port it does not have
    assert admin.main(["--zk", zk_connect, "brokers"]) == admin.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["BROKER", "ROLE", "URL", "MQTT", "MQTT_TLS", "REMOTING", "GRPC", "HTTP"]
    assert lines[3].split() == ["3", "master", "meta://127.0.0.1:%d" % plain.port, "-", "-",
                                "127.0.0.1:%d" % rport, "-", "127.0.0.1:%d" % hport]
    # a broker stopped cleanly takes its MQTT address with it
    tls.stop()
    del want[(2, "master")]
    wait_for(lambda: brokers(capsys, zk_connect) == want, 15, lambda: "broker 2 gone: %s"
             % brokers(capsys, zk_connect))


@pytest.mark.slow
@pytest.mark.fault
def test_after_a_failover_the_broker_ids_mqtt_address_is_the_new_masters(broker_factory, tmp_path, zk_connect,
                                                                         capsys):
    group = group_with_mqtt(broker_factory, tmp_path, zk_connect)
    old = group.healthy()
    new = 1 - old
    wait_for(lambda: brokers(capsys, zk_connect).get((7, "master"), {}).get("mqtt")
             == mqtt_address(group.members[old]), 15, "the first master's address")
    group.members[old].kill()
    group.master(timeout=30, exclude=(old,))
    wait_for(lambda: set(brokers(capsys, zk_connect)) == {(7, "master")}
             and brokers(capsys, zk_connect)[(7, "master")]["mqtt"] == mqtt_address(group.members[new]), 30,
             lambda: "the new master's address alone: %s" % brokers(capsys, zk_connect))
