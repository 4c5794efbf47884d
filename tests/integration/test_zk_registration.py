"""Broker registration in ZooKeeper (MetaQ's layout), with a real ZooKeeper and real broker processes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from kazoo.client import KazooClient

from metaq.protocol.checksum import metaq_checksum
from metaq.client.local import small_config
from tests.harness.broker import wait_for

TOPICS = [{"name": "orders", "partitions": 4}, {"name": "audit", "partitions": 1}, {"name": "*", "partitions": 2}]


def zk_client(connect):
    zk = KazooClient(hosts=connect, timeout=10)
    zk.start(timeout=15)
    return zk


def node(zk, path):
    found = zk.exists(path)
    return zk.get(path)[0].decode() if found else None


def zk_broker(broker_factory, connect, broker_id=7, session_ms=4000, **zk_extra):
    def make(tmp):
        cfg = small_config(tmp, zk=dict({"connect": connect, "session_timeout_ms": session_ms}, **zk_extra),
                           topics=TOPICS)
        cfg["broker"]["id"] = broker_id
        return cfg
    b = broker_factory(start=False)
    b.config = make(os.path.join(str(b.workdir), "data"))
    b.data_dir = b.config["broker"]["data_dir"]
    return b.start()


def registered(zk, broker_id=7, topic="orders"):
    return zk.exists("/meta/brokers/topics-sub/%s/%d-m" % (topic, broker_id)) is not None


def test_broker_writes_metaq_layout(broker_factory, zk_connect):
    b = zk_broker(broker_factory, zk_connect)
    zk = zk_client(zk_connect)
    try:
        # topics register one after the other, in no set order: wait for both
        wait_for(lambda: registered(zk, topic="audit") and registered(zk, topic="orders"), what="registration")
        url = "meta://127.0.0.1:%d" % b.port
        assert node(zk, "/meta/brokers/ids/7") == url
        assert node(zk, "/meta/brokers/ids/7/master") == url
        assert zk.exists("/meta/brokers/ids/7/master").ephemeralOwner != 0
        with b.client() as c:
            checksum = c.stats_dict()["config_checksum"]
            assert c.stats_dict()["zookeeper"] == "connected"
        assert node(zk, "/meta/brokers/ids/7/master_config_checksum") == checksum
        assert node(zk, "/meta/brokers/topics/orders/7-m") == "4"
        assert node(zk, "/meta/brokers/topics/audit/7-m") == "1"
        for kind in ("topics-pub", "topics-sub"):
            assert json.loads(node(zk, "/meta/brokers/%s/orders/7-m" % kind)) == {"numParts": 4, "broker": "7-m"}
            assert zk.exists("/meta/brokers/%s/orders/7-m" % kind).ephemeralOwner != 0
    finally:
        zk.stop()


def test_new_topic_registers_on_first_put_and_clean_stop_unregisters(broker_factory, zk_connect):
    b = zk_broker(broker_factory, zk_connect)
    zk = zk_client(zk_connect)
    try:
        wait_for(lambda: registered(zk), what="registration")
        assert not zk.exists("/meta/brokers/topics-pub/fresh")
        with b.client() as c:
            c.put_ok("fresh", b"first")
        wait_for(lambda: registered(zk, topic="fresh"), what="the new topic's nodes")
        assert node(zk, "/meta/brokers/topics/fresh/7-m") == "2"
        assert b.stop() == 0
        # nothing of the broker's registration is left; its group's epoch record outlives it (docs/replication.md)
        assert zk.get_children("/meta/brokers/ids/7") == ["epochs"]
        for kind in ("topics", "topics-pub", "topics-sub"):
            assert zk.get_children("/meta/brokers/%s/orders" % kind) == []
            assert zk.get_children("/meta/brokers/%s/fresh" % kind) == []
        assert "unregistered broker 7" in b.log_text()
    finally:
        zk.stop()


def test_two_brokers_register_side_by_side(broker_factory, zk_connect):
    zk_broker(broker_factory, zk_connect, broker_id=1)
    zk_broker(broker_factory, zk_connect, broker_id=2)
    zk = zk_client(zk_connect)
    try:
        wait_for(lambda: registered(zk, 1) and registered(zk, 2), what="both brokers")
        assert sorted(zk.get_children("/meta/brokers/topics-pub/orders")) == ["1-m", "2-m"]
        assert sorted(zk.get_children("/meta/brokers/ids")) == ["1", "2"]
    finally:
        zk.stop()


@pytest.mark.slow
@pytest.mark.fault
def test_expired_session_reregisters(broker_factory, zk_connect):
    """Freeze the broker (SIGSTOP) past its session timeout: ZooKeeper expires it; after SIGCONT it registers again."""
    b = zk_broker(broker_factory, zk_connect, session_ms=4000)
    zk = zk_client(zk_connect)
    try:
        wait_for(lambda: registered(zk), what="registration")
        old_owner = zk.exists("/meta/brokers/ids/7/master").ephemeralOwner
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: zk.exists("/meta/brokers/ids/7/master") is None, timeout=20,
                     what="ZooKeeper to expire the frozen broker's session")
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)
        stat = wait_for(lambda: zk.exists("/meta/brokers/ids/7/master"), timeout=20, what="re-registration")
        assert stat.ephemeralOwner != old_owner
        wait_for(lambda: registered(zk) and registered(zk, topic="audit"), what="topics again")
        assert "session lost" in b.log_text()
        with b.client() as c:
            c.put_ok("orders", b"still serving")
    finally:
        zk.stop()


@pytest.mark.slow
@pytest.mark.fault
def test_zookeeper_restart_and_late_start(broker_factory, own_zk):
    """The broker starts while ZooKeeper is down (serves anyway), registers when it comes, and after a restart."""
    own_zk.stop()
    b = zk_broker(broker_factory, own_zk.connect, session_ms=4000, connection_timeout_ms=500)
    with b.client() as c:
        c.put_ok("orders", b"served without ZooKeeper")
        assert c.stats_dict()["zookeeper"] != "connected"
    assert "not reachable after" in b.log_text()
    own_zk.start()
    zk = zk_client(own_zk.connect)
    try:
        wait_for(lambda: registered(zk), timeout=30, what="late registration")
        zk.stop()
        own_zk.stop()
        time.sleep(1.0)
        own_zk.start()
        zk = zk_client(own_zk.connect)
        wait_for(lambda: registered(zk), timeout=30, what="registration after the restart")
        with b.client() as c:
            c.put_ok("brand-new", b"after restart")
            wait_for(lambda: c.stats_dict()["zookeeper"] == "connected", what="connected state")
        wait_for(lambda: registered(zk, topic="brand-new"), what="a new topic after the restart")
    finally:
        zk.stop()


def test_restart_after_kill_takes_over_its_stale_nodes(broker_factory, zk_connect):
    """kill -9 leaves ephemeral nodes until the session expires; the restarted broker (same address) replaces them."""
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    fixed = port.getsockname()[1]
    port.close()
    b = zk_broker(broker_factory, zk_connect, session_ms=30000)
    b.config["broker"]["port"] = fixed
    b.stop()
    b.start()
    zk = zk_client(zk_connect)
    try:
        wait_for(lambda: registered(zk), what="registration")
        def owner(path):  # None while the takeover has deleted the stale node and not yet written its own
            stat = zk.exists(path)
            return stat.ephemeralOwner if stat is not None else None

        old_owner = owner("/meta/brokers/ids/7/master")
        assert old_owner
        b.kill()
        b.start()
        wait_for(lambda: owner("/meta/brokers/ids/7/master") not in (None, old_owner), timeout=10,
                 what="the restarted broker to take over its nodes well before the 30 s session timeout")
        wait_for(lambda: owner("/meta/brokers/topics-pub/orders/7-m") not in (None, old_owner),
                 what="topic nodes taken over")
    finally:
        zk.stop()


LEGACY_PRODUCER = r'''
import socket, sys, zlib
from kazoo.client import KazooClient
connect, topic, payload = sys.argv[1], sys.argv[2], sys.argv[3].encode()
zk = KazooClient(hosts=connect); zk.start(timeout=15)
# MetaQ's contrib producers read only the legacy topic path and ids/<id>/master
children = zk.get_children("/meta/brokers/topics/" + topic)
node = sorted(c for c in children if c.endswith("-m"))[0]
broker_id, partitions = node[:-2], int(zk.get("/meta/brokers/topics/%s/%s" % (topic, node))[0].decode())
url = zk.get("/meta/brokers/ids/%s/master" % broker_id)[0].decode()
zk.stop()
host, port = url[len("meta://"):].rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(b"put %s %d %d 0 1\r\n" % (topic.encode(), partitions - 1, len(payload)) + payload)  # 6-token put
print(s.recv(4096).decode().strip().replace("\r\n", " | "))
'''


def test_legacy_contrib_producer_finds_the_broker_and_sends(broker_factory, zk_connect, tmp_path):
    b = zk_broker(broker_factory, zk_connect)
    zk = zk_client(zk_connect)
    try:
        wait_for(lambda: registered(zk), what="registration")
    finally:
        zk.stop()
    script = tmp_path / "legacy_producer.py"
    script.write_text(LEGACY_PRODUCER)
    out = subprocess.run([sys.executable, str(script), zk_connect, "orders", "hello from 2012"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("result 200 "), out.stdout
    with b.client() as c:
        recs = c.get_records("orders", 3, 0)
    assert [r.payload for r in recs] == [b"hello from 2012"]
    assert recs[0].checksum == metaq_checksum(b"hello from 2012")


def test_bad_zk_connect_string_is_a_clear_config_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "metaq.server", "--zk", "localhost", "--data-dir", str(tmp_path),
                          "--check-config"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "invalid --zk localhost" in out.stderr and "HOST:PORT" in out.stderr  # blamed on the flag given
