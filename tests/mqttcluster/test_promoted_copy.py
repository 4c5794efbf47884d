"""A promoted slave's copy of a session gives way to the live one (docs/mqtt.md "Which copy stands after a
restart"): broker 1 is a master with a slave, broker 0 a master alone. A device's session lives on broker 1's
master, which is killed; the device reconnects (Clean Start 0) to broker 0 while the slave, which learned the
session by following its master, is not promoted yet. Broker 0 is paused (SIGSTOP) while the slave is promoted and,
as the id's home, registers its own copy first; once broker 0 answers, the device's live session there stands (its
connection goes on, no DISCONNECT 0x8E) and the promoted broker's copy ends."""

import signal

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port
from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import Paho, Raw
from tests.harness.mqttcluster import cluster_config
from tests.harness.replication import caught_up, stats
from tests.mqttcluster.test_client_ids import _homed, _sessions_persist, _subscribe

pytestmark = [pytest.mark.slow, pytest.mark.fault]

#: How long the live connection is watched for a DISCONNECT once the two copies met.
QUIET_S = 2.0


def _read_all(raw, wait):
    """What ``raw`` receives within ``wait`` s: ``(packets, closed)``."""
    raw.sock.settimeout(wait)
    got = []
    try:
        while True:
            p = raw.read()
            if p is None:
                return got, True
            got.append(p)
    except TimeoutError:
        return got, False


def test_a_promoted_slaves_copy_gives_way_to_the_live_one(broker_factory, tmp_path, zk_connect, capsys):
    b0cfg = cluster_config(tmp_path / "b0", 0, zk_connect)
    b0cfg["zk"]["session_timeout_ms"] = 30000  # paused below: still a member when it answers again
    b0 = broker_factory(b0cfg, workdir=tmp_path / "b0")
    m1cfg = cluster_config(tmp_path / "m1", 1, zk_connect)
    m1 = broker_factory(m1cfg, workdir=tmp_path / "m1")
    s1cfg = cluster_config(tmp_path / "s1", 1, zk_connect)
    s1cfg["replication"] = {}
    s1 = broker_factory(s1cfg, workdir=tmp_path / "s1", extra_args=[
        "--slave-of", "127.0.0.1:%d" % m1cfg["replication"]["port"], "--slave-id", "1",
        "--replication-port", str(free_port())])
    for b in (b0, m1):
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_members") == "2", 30, "the cluster's members")
    client_id = _homed(1, 1, [0, 1], "meter-promoted")[0]
    first = Raw(m1)
    ack = first.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600})
    assert ack.reason_code == 0 and not ack.session_present, ack
    assert _subscribe(first, "t/old") == wire.Suback(1, (1,))
    first.send(wire.Disconnect())
    first.close()
    wait_for(lambda: stats(m1)["mqtt_connections"] == "0", 10, "the device gone from broker 1's master")
    caught_up(m1, s1)
    assert stats(s1)["mqtt_sessions"] == "1"  # the slave learned the session by following
    m1.kill()
    live, ack = wait_for(lambda: _sessions_persist(b0, client_id), 60, "a connect once broker 1 left the cluster")
    assert not ack.session_present  # its session stayed with broker 1: a new one here
    assert _subscribe(live, "t/new") == wire.Suback(1, (1,))
    wait_for(lambda: stats(s1)["replication_link"] == "down", 15, "the slave sees its master gone")
    b0.proc.send_signal(signal.SIGSTOP)  # slow to see the promotion: the promoted broker's hold comes first
    try:
        code = admin.main(["promote", "127.0.0.1:%d" % s1.port, "--force"])
        assert code == 0, capsys.readouterr()
        wait_for(lambda: stats(s1).get("mqtt_cluster_members") == "2", 30, "the promoted slave a member")
        wait_for(lambda: stats(s1)["mqtt_cluster_ids_homed"] == "1", 30, "the promoted broker's copy registered")
        assert stats(s1)["mqtt_sessions"] == "1"
    finally:
        b0.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: "0" in (stats(s1)["mqtt_sessions"], stats(b0)["mqtt_sessions"]), 30, "one copy left")
    got, closed = _read_all(live, QUIET_S)
    assert not closed and got == [], "the device's live session on broker 0 was ended: %r" % got
    assert (stats(b0)["mqtt_sessions"], stats(s1)["mqtt_sessions"]) == ("1", "0")  # the live copy stood
    Paho(b0, "publisher").publish("t/new", b"after", 1)
    live.sock.settimeout(10)
    got = live.read()
    assert isinstance(got, wire.Publish) and got.payload == b"after", got
    live.send(wire.PubAck(got.packet_id))
    live.send(wire.Disconnect())
    live.close()
