"""metaq-admin against real brokers and a real ZooKeeper."""

import json
import os
import subprocess
import sys
import time

from kazoo.client import KazooClient

from metaq.protocol import events as ev
from metaq.client.local import small_config

ADMIN = [sys.executable, "-m", "metaq.admincli"]


def admin(*args, expect=0):
    out = subprocess.run(ADMIN + list(args), capture_output=True, text=True, timeout=60)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


def start_zk_broker(broker_factory, zk_connect, broker_id):
    b = broker_factory(start=False)
    b.config = small_config(os.path.join(str(b.workdir), "data"), zk={"connect": zk_connect},
                            topics=[{"name": "orders", "partitions": 2}, {"name": "*", "partitions": 1}])
    b.config["broker"]["id"] = broker_id
    b.data_dir = b.config["broker"]["data_dir"]
    return b.start()


def wait_registered(zk, n, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if zk.exists("/meta/brokers/topics-pub/orders") and \
                len(zk.get_children("/meta/brokers/topics-pub/orders")) == n:
            return
        time.sleep(0.05)
    raise AssertionError("brokers did not register")


def test_admin_reports_topics_partitions_groups_and_zk(broker_factory, zk_connect):
    b1 = start_zk_broker(broker_factory, zk_connect, 1)
    b2 = start_zk_broker(broker_factory, zk_connect, 2)
    zk = KazooClient(hosts=zk_connect)
    zk.start(15)
    try:
        wait_registered(zk, 2)
        with b1.client() as c:
            for _ in range(5):
                c.put_ok("orders", b"x" * 10, 0)
            c.put_ok("orders", b"y", 1)
            assert c.call(ev.CommitOffset("direct", "orders", 0, 2, c.opaque())).code == 200
        with b2.client() as c:
            for _ in range(3):
                c.put_ok("orders", b"z", 1)
        # a consumer group as MetaQ clients leave it in ZooKeeper: one msgId-offset node, one legacy node, an owner
        zk.create("/meta/consumers/billing/offsets/orders/1-0", b"123-4", makepath=True)
        zk.create("/meta/consumers/billing/offsets/orders/2-1", b"1", makepath=True)
        zk.create("/meta/consumers/billing/owners/orders/1-0", b"billing_host-1", makepath=True, ephemeral=True)

        topics = json.loads(admin("--zk", zk_connect, "--json", "topics").stdout)
        orders = [t for t in topics if t["topic"] == "orders"][0]
        assert orders == {"topic": "orders", "brokers": "1,2", "partitions": 4, "messages": 9, "bytes": orders["bytes"],
                          "perm": "rw", "ordered": False, "retention_hours": None, "retention_bytes": None,
                          "priorities": 0, "source": "config"}  # the topic table's columns: a config file's topic
        assert orders["bytes"] > 9

        parts = json.loads(admin("--zk", zk_connect, "--json", "partitions", "orders").stdout)
        assert [(p["partition"], p["min_offset"], p["max_offset"]) for p in parts] == [
            ("1-0", 0, 5), ("1-1", 0, 1), ("2-1", 0, 3)]

        groups = json.loads(admin("--zk", zk_connect, "--json", "groups").stdout)
        by_key = {(g["group"], g["partition"]): g for g in groups}
        assert by_key[("billing", "1-0")]["committed"] == 4 and by_key[("billing", "1-0")]["lag"] == 1
        assert by_key[("billing", "1-0")]["owner"] == "billing_host-1"
        assert by_key[("billing", "2-1")]["committed"] == 1 and by_key[("billing", "2-1")]["lag"] == 2
        assert by_key[("direct", "1-0")] == {"group": "direct", "kind": "offsets", "topic": "orders",
                                            "partition": "1-0", "owner": "", "committed": 2, "max_offset": 5,
                                            "lag": 3, "in_flight": None, "store": "broker"}

        table = admin("--zk", zk_connect, "groups", "billing").stdout
        lines = table.splitlines()
        assert lines[0].split() == ["GROUP", "KIND", "TOPIC", "PARTITION", "OWNER", "COMMITTED", "MAX_OFFSET", "LAG",
                                    "IN_FLIGHT", "STORE"]
        assert lines[2].split() == ["billing", "offsets", "orders", "1-0", "billing_host-1", "4", "5", "1", "-",
                                    "zookeeper"]
        assert len(lines) == 4  # header, rule, two partitions

        tree = admin("--zk", zk_connect, "zk").stdout
        assert "/meta/brokers/ids/1/master" in tree and "meta://127.0.0.1:%d" % b1.port in tree

        stats = json.loads(admin("--brokers", "meta://127.0.0.1:%d" % b2.port, "--json", "stats").stdout)
        assert {"broker": 2, "url": "meta://127.0.0.1:%d" % b2.port, "key": "cmd_put", "value": "3"} in stats
    finally:
        zk.stop()


def test_admin_unreachable_broker_and_usage_errors(broker):
    out = admin("--brokers", "meta://127.0.0.1:%d,meta://127.0.0.1:1" % broker.port, "topics", expect=1)
    assert "127.0.0.1:1" in out.stderr
    assert out.stdout.splitlines()[0].split()[0] == "TOPIC"  # what could be read is still shown
    out = admin("topics", expect=2)
    assert "--zk" in out.stderr
    out = admin("--zk", "127.0.0.1:1", "--timeout", "1", "topics", expect=1)
    assert "ZooKeeper" in out.stderr


def test_admin_promote_bad_targets(broker):
    out = admin("--timeout", "1", "promote", "127.0.0.1:1", expect=1)
    assert "promote 127.0.0.1:1" in out.stderr and "connect" in out.stderr
    out = admin("promote", "no-port-here", expect=1)
    assert "invalid broker url" in out.stderr
    out = admin("promote", "127.0.0.1:%d" % broker.port, expect=3)  # a standalone broker is no slave
    assert "refused the promotion (400): not a slave" in out.stderr
    with broker.client() as c:
        c.put_ok("t-x", b"still accepted")  # nothing changed on it
    out = admin("promote", expect=2)
    assert "HOST:PORT" in out.stderr


def test_admin_offset_at_gives_each_partitions_first_offset_at_a_time(broker):
    from datetime import datetime, timezone

    from tests.harness.broker import url_of

    with broker.client() as c:
        for _ in range(3):
            c.put_ok("t-adm", b"early", 0)
        c.put_ok("t-adm", b"early", 1)
        time.sleep(0.05)
        between = int(time.time() * 1000)
        time.sleep(0.05)
        c.put_ok("t-adm", b"late", 0)
        c.put_ok("t-adm", b"late", 0)
    url = url_of(broker)
    iso = datetime.fromtimestamp(between / 1000, timezone.utc).isoformat().replace("+00:00", "Z")
    for when in (str(between), iso):
        rows = json.loads(admin("--brokers", url, "--json", "offset-at", "t-adm", when).stdout)
        assert [(r["partition"], r["offset"], r["min_offset"], r["max_offset"]) for r in rows] == [
            ("7-0", 3, 0, 5), ("7-1", 1, 0, 1)]  # 7-1 got nothing since: its end
        assert {r["time_ms"] for r in rows} == {between}
    table = admin("--brokers", url, "offset-at", "t-adm", "0").stdout
    assert table.splitlines()[0].split() == ["TOPIC", "PARTITION", "TIME_MS", "OFFSET", "MIN_OFFSET", "MAX_OFFSET"]
    for bad in ("yesterday", "-5", "2026-13-01T00:00:00Z"):
        out = admin("--brokers", url, "offset-at", "t-adm", bad, expect=2)
        assert "not a time" in out.stderr or "Unix epoch" in out.stderr, out.stderr


def test_topics_hides_the_brokers_internal_topics_unless_all(broker):
    from metaq.client import Message, Producer

    url = "meta://127.0.0.1:%d" % broker.port
    admin("--brokers", url, "topics", "create", "urgent", "--priorities", "3")
    with broker.client() as c:
        c.put_ok("orders", b"x")
        assert c.put_prio("urgent", b"y", 2).code == 200  # stored in the level's topic urgent%P2
    with Producer(brokers=[url]) as p:
        assert p.send(Message("orders", b"later", delay_level=3)).success  # SCHEDULE_TOPIC_XXXX
        assert p.send(Message("orders", b"timed", delay=3600)).success  # %TIMER%
    # %TX%, %POP%, %MQTT% and %MQTTIN%: the transaction and per-message acknowledgement journals, the MQTT sessions'
    # log and the MQTT cluster's inbox, on every broker
    internal = {"SCHEDULE_TOPIC_XXXX", "%TIMER%", "%TX%", "%POP%", "%MQTT%", "%MQTTIN%", "urgent%P2"}

    out = admin("--brokers", url, "topics")
    names = [line.split()[0] for line in out.stdout.splitlines()[2:] if line.strip()]
    assert names == ["orders", "urgent"]
    assert out.stderr == "metaq-admin: 7 internal topics not shown (--all shows them)\n"
    rows = {r["topic"]: r for r in json.loads(admin("--brokers", url, "--json", "topics").stdout)}
    assert set(rows) == {"orders", "urgent"}
    assert rows["urgent"]["messages"] == 1  # its level's message counts in its row

    out = admin("--brokers", url, "topics", "--all")
    names = [line.split()[0] for line in out.stdout.splitlines()[2:] if line.strip()]
    assert names == sorted(internal | {"orders", "urgent"}) and out.stderr == ""
    rows = {r["topic"]: r for r in json.loads(admin("--brokers", url, "--json", "topics", "--all").stdout)}
    assert set(rows) == internal | {"orders", "urgent"}
    assert (rows["urgent"]["messages"], rows["urgent%P2"]["messages"]) == (0, 1)  # each as it is
