"""The topic table with real brokers: metaq-admin topics create|alter|delete, permissions, precedence."""

import json
import os
import subprocess
import sys

from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.broker import url_of

ADMIN = [sys.executable, "-m", "metaq.admincli"]


def admin(broker, *args, expect=0):
    out = subprocess.run(ADMIN + ["--brokers", url_of(broker)] + list(args), capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


def listed(broker):
    return {r["topic"]: r for r in json.loads(admin(broker, "--json", "topics").stdout)}


def table_bytes(broker):
    with open(os.path.join(broker.data_dir, "topics.json"), "rb") as f:
        return f.read()


def test_create_alter_delete_and_recreate(broker_factory):
    b = broker_factory()
    admin(b, "topics", "create", "orders", "--partitions", "3", "--retention-hours", "2.5", "--ordered")
    row = listed(b)["orders"]
    assert (row["partitions"], row["perm"], row["ordered"], row["retention_hours"], row["source"]) == \
        (3, "rw", True, 2.5, "table")
    with b.client() as c:
        c.put_ok("orders", b"m0", 2)
        assert c.put("orders", b"m", 3).code == 400  # past the table's 3 partitions

    # fewer partitions: refused, the table unchanged
    before = table_bytes(b)
    out = admin(b, "topics", "alter", "orders", "--partitions", "2", expect=3)
    assert "partitions can only grow" in out.stderr and "strand" in out.stderr
    assert table_bytes(b) == before

    admin(b, "topics", "alter", "orders", "--perm", "r")
    with b.client() as c:
        r = c.put("orders", b"refused", 2)
        assert r.code == 403 and b"not writable" in r.body
        got = c.get("orders", 2, 0)
        assert isinstance(got, ev.Value)
    admin(b, "topics", "alter", "orders", "--perm", "w")
    with b.client() as c:
        r = c.get("orders", 2, 0)
        assert r.code == 403 and b"not readable" in r.body
        c.put_ok("orders", b"m1", 2)
    admin(b, "topics", "alter", "orders", "--perm", "rw", "--partitions", "4")
    assert listed(b)["orders"]["partitions"] == 4

    # delete: asks first (no terminal: refused), then with --yes
    out = admin(b, "topics", "delete", "orders", expect=2)
    assert "--yes" in out.stderr
    admin(b, "topics", "delete", "orders", "--yes")
    assert not os.path.exists(os.path.join(b.data_dir, "index", "orders"))
    with b.client() as c:
        r = c.put("orders", b"gone", 2)
        assert r.code == 400 and b"no such topic orders" in r.body
        r = c.get("orders", 2, 0)
        assert r.code == 400 and b"no such topic orders" in r.body
    assert "orders" not in listed(b)

    # a restart keeps it deleted; re-created, it starts past the deleted offsets
    b.stop()
    b.start()
    with b.client() as c:
        assert c.put("orders", b"gone", 2).code == 400
    admin(b, "topics", "create", "orders", "--partitions", "3")
    with b.client() as c:
        assert c.put_ok("orders", b"new", 2)[2] == 2  # offsets 0 and 1 belonged to the deleted topic
        assert c.put_ok("orders", b"new0", 0)[2] == 0
        got = c.get("orders", 2, 0)
        assert got.code == 301 and int(got.body) == 2


def test_bad_input_changes_nothing(broker_factory):
    b = broker_factory()
    admin(b, "topics", "create", "kept", "--partitions", "2")
    before = table_bytes(b)
    cases = [
        (["create", "bad/name"], "illegal topic name"),
        (["create", "zero", "--partitions", "0"], "partitions must be 1..1024"),
        (["create", "many", "--partitions", "1025"], "partitions must be 1..1024"),
        (["create", "neg", "--retention-hours", "-1"], "retention_hours must be above 0"),
        (["create", "negb", "--retention-bytes", "-5"], "retention_bytes must be at least 1"),
        (["create", "kept"], "exists"),
        (["delete", "unknown", "--yes"], "no such topic unknown"),
        (["delete", "SCHEDULE_TOPIC_XXXX", "--yes"], "system topic"),
        (["delete", "%RETRY%group", "--yes"], "system topic"),
        (["create", "%DLQ%group"], "system topic"),
        (["alter", "nothing", "--perm", "r"], "no such topic"),
    ]
    for args, message in cases:
        out = admin(b, "topics", *args, expect=3 if args[1] != "bad/name" else 3)
        assert message in out.stderr, (args, out.stderr)
        assert table_bytes(b) == before, args
    assert listed(b)["kept"]["partitions"] == 2


def test_table_respects_topic_and_partition_limits(broker_factory):
    b = broker_factory(small_config("/nonexistent", limits={"max_topics": 3, "max_partitions": 6}), start=False)
    b.config["broker"]["data_dir"] = b.data_dir = os.path.join(str(b.workdir), "data")
    b.start()
    admin(b, "topics", "create", "a", "--partitions", "2")
    admin(b, "topics", "create", "b", "--partitions", "3")
    out = admin(b, "topics", "create", "c", "--partitions", "2", expect=3)  # 7 partitions: one past
    assert "limits.max_partitions" in out.stderr
    admin(b, "topics", "create", "c", "--partitions", "1")  # 6: at the limit
    out = admin(b, "topics", "create", "d", "--partitions", "1", expect=3)  # a 4th topic
    assert "limits.max_topics" in out.stderr
    out = admin(b, "topics", "alter", "a", "--partitions", "3", expect=3)
    assert "limits.max_partitions" in out.stderr
    assert sorted(t for t in listed(b) if len(t) == 1) == ["a", "b", "c"]


def test_broker_without_topics_config_keeps_the_data_dirs_partitions(broker_factory):
    """Reproduces issue 19: a restart without the topics config dropped `test` from 4 partitions to 1."""
    cfg = small_config("/nonexistent", topics=[{"name": "test", "partitions": 4}, {"name": "*", "partitions": 1}])
    b = broker_factory(cfg, start=False)
    b.config["broker"]["data_dir"] = b.data_dir = os.path.join(str(b.workdir), "data")
    b.start()
    with b.client() as c:
        for p in range(4):
            c.put_ok("test", b"m%d" % p, p)
    assert listed(b)["test"]["source"] == "config"
    b.stop()
    del b.config["topics"]  # the built-in default: `*` with 1 partition
    b.start()
    assert "topic test: 4 partitions from the data directory" in b.log_text(since_start=True)
    with b.client() as c:
        got = c.get("test", 3, 0)
        assert isinstance(got, ev.Value) and b"m3" in got.body
        c.put_ok("test", b"again", 3)
    assert listed(b)["test"]["partitions"] == 4
    assert listed(b)["test"]["source"] == "data dir"


def first_offset(c, topic, partition):
    """Where a get from offset 0 is sent: the partition's first served offset (0 when nothing moved it)."""
    r = c.get(topic, partition, 0)
    return int(r.body) if isinstance(r, ev.Result) and r.code == 301 else 0


def test_per_topic_retention_by_age_and_size(broker_factory):
    from metaq.protocol.message import iter_records
    from metaq.store.record import FIXED_OVERHEAD
    from tests.harness.broker import wait_for

    cfg = small_config("/nonexistent", store={"retention_check_interval_s": 0.2})
    b = broker_factory(cfg, start=False)
    b.config["broker"]["data_dir"] = b.data_dir = os.path.join(str(b.workdir), "data")
    b.start()
    admin(b, "topics", "create", "short", "--retention-hours", "0.0003")  # about a second
    admin(b, "topics", "create", "sized", "--retention-bytes", "600")
    with b.client() as c:
        for i in range(5):
            c.put_ok("short", b"old%d" % i, 0)
            c.put_ok("long", b"keep%d" % i, 0)  # a pattern's topic: the broker's retention only
        for i in range(10):
            c.put_ok("sized", b"%03d" % i + b"x" * 97, 0)
        wait_for(lambda: first_offset(c, "short", 0) == 5, what="short's old messages to go")
        wait_for(lambda: first_offset(c, "sized", 0) > 0, what="sized to keep its newest bytes")
        kept = first_offset(c, "sized", 0)
        body = c.get("sized", 0, kept).body
        records = [rec for rec, _ in iter_records(body)]
        assert [r.data[:3] for r in records] == [b"%03d" % i for i in range(kept, 10)]  # the newest, in order
        record_size = FIXED_OVERHEAD + len("sized") + 100  # a message's bytes in the commit log
        assert len(records) == 600 // record_size  # the most of the newest that fit in 600 bytes
        got = c.get("long", 0, 0)
        assert [r.data for r, _ in iter_records(got.body)] == [b"keep%d" % i for i in range(5)]
        c.put_ok("short", b"young", 0)
        assert [r.data for r, _ in iter_records(c.get("short", 0, 5).body)] == [b"young"]
    b.stop()
    b.start()  # applied again at open: what went stays gone
    with b.client() as c:
        assert first_offset(c, "short", 0) >= 5
        assert first_offset(c, "sized", 0) == kept
        assert first_offset(c, "long", 0) == 0


def test_rocketmq_route_reports_perm_and_order_and_refuses_with_no_permission(broker_factory):
    from metaq.client.local import rmq_config
    from metaq.client.raw import RemotingClient
    from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode as C
    from tests.harness.rocketmq import pull, send_v1

    cfg = rmq_config("/nonexistent")
    b = broker_factory(cfg, start=False)
    b.config["broker"]["data_dir"] = b.data_dir = os.path.join(str(b.workdir), "data")
    b.start()
    admin(b, "topics", "create", "fifo", "--partitions", "2", "--ordered")
    with RemotingClient(cfg["remoting"]["port"]) as rc:
        route = json.loads(rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "fifo"}).body)
        [queues] = route["queueDatas"]
        assert (queues["perm"], queues["writeQueueNums"]) == (6, 2)
        assert route["orderTopicConf"] == "%s:2" % queues["brokerName"]
        assert send_v1(rc, "fifo", b"one").code == C.SUCCESS
    admin(b, "topics", "alter", "fifo", "--perm", "r")
    with RemotingClient(cfg["remoting"]["port"]) as rc:
        route = json.loads(rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "fifo"}).body)
        assert route["queueDatas"][0]["perm"] == 4  # READ only
        refused = send_v1(rc, "fifo", b"two")
        assert refused.code == C.NO_PERMISSION == 16 and "not writable" in refused.remark
        assert pull(rc, "fifo", 0, 0).code == C.SUCCESS
    admin(b, "topics", "alter", "fifo", "--perm", "w")
    with RemotingClient(cfg["remoting"]["port"]) as rc:
        route = json.loads(rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "fifo"}).body)
        assert route["queueDatas"][0]["perm"] == 2  # WRITE only
        refused = pull(rc, "fifo", 0, 0)
        assert refused.code == C.NO_PERMISSION and "not readable" in refused.remark


def test_slaves_take_the_masters_table_and_a_promoted_slave_keeps_it(broker_factory, tmp_path, capsys):
    from metaq import admincli as admin_main
    from metaq.client.local import free_port
    from tests.harness.broker import wait_for
    from tests.harness.replication import caught_up, master_config

    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    admin(m, "topics", "create", "orders", "--partitions", "3", "--retention-bytes", "5000")
    with m.client() as c:
        c.put_ok("orders", b"one", 2)
    caught_up(m, s)
    wait_for(lambda: listed(s).get("orders", {}).get("source") == "table", what="the slave to take the table")
    assert listed(s)["orders"]["retention_bytes"] == 5000
    out = admin(s, "topics", "create", "other", expect=3)  # a slave's table is its master's
    assert "changed on the master" in out.stderr
    admin(m, "topics", "alter", "orders", "--perm", "r")
    wait_for(lambda: listed(s)["orders"]["perm"] == "r", what="the slave to take the altered table")
    with open(os.path.join(s.data_dir, "topics.json")) as f:
        assert json.load(f)["topics"]["orders"]["perm"] == "r"

    m.kill()
    wait_for(lambda: admin_main.main(["promote", "127.0.0.1:%d" % s.port, "--force"]) == 0, what="promotion")
    capsys.readouterr()
    with s.client() as c:
        r = c.put("orders", b"two", 2)
        assert r.code == 403 and b"not writable" in r.body  # the table came along
        got = c.get("orders", 2, 0)
        assert isinstance(got, ev.Value) and b"one" in got.body
    admin(s, "topics", "alter", "orders", "--perm", "rw")
    with s.client() as c:
        assert c.put_ok("orders", b"two", 2)[2] == 1


def test_zookeeper_nodes_follow_create_alter_delete(broker_factory, zk_connect):
    from kazoo.client import KazooClient

    from tests.harness.broker import wait_for

    cfg = small_config("/nonexistent", zk={"connect": zk_connect})
    b = broker_factory(cfg, start=False)
    b.config["broker"]["data_dir"] = b.data_dir = os.path.join(str(b.workdir), "data")
    b.start()
    zk = KazooClient(hosts=zk_connect)
    zk.start(15)
    node = "/meta/brokers/topics-pub/orders/7-m"

    def num_parts():
        return json.loads(zk.get(node)[0])["numParts"] if zk.exists(node) else None
    try:
        admin(b, "topics", "create", "orders", "--partitions", "3")
        wait_for(lambda: num_parts() == 3, what="orders registered with 3 partitions")
        admin(b, "topics", "alter", "orders", "--partitions", "5")
        wait_for(lambda: num_parts() == 5, what="orders registered again with 5 partitions")
        admin(b, "topics", "delete", "orders", "--yes")
        wait_for(lambda: not zk.exists(node) and not zk.exists("/meta/brokers/topics/orders/7-m"),
                 what="orders' nodes removed")
    finally:
        zk.stop()
        zk.close()


def test_changes_need_admin_permission_and_listing_any_user(broker_factory, tmp_path):
    from tests.harness.acl import SECRETS, secured_config

    cfg = secured_config(tmp_path)
    b = broker_factory(cfg, workdir=tmp_path)
    secrets = {}
    for user in ("admin", "alice"):
        secrets[user] = tmp_path / ("%s.secret" % user)
        secrets[user].write_text(SECRETS[user])
        secrets[user].chmod(0o600)

    def as_user(user, *args, expect=0):
        return admin(b, "--user", user, "--secret-file", str(secrets[user]), *args, expect=expect)
    out = as_user("alice", "topics", "create", "orders", "--partitions", "2", expect=3)
    assert "(403)" in out.stderr
    assert not os.path.exists(os.path.join(b.data_dir, "topics.json"))
    as_user("admin", "topics", "create", "orders", "--partitions", "2")
    rows = {r["topic"]: r for r in json.loads(as_user("alice", "--json", "topics").stdout)}
    assert rows["orders"]["partitions"] == 2 and rows["orders"]["source"] == "table"
    out = as_user("alice", "topics", "delete", "orders", "--yes", expect=3)
    assert "(403)" in out.stderr


def test_readme_topic_commands_run_as_written(broker_factory):
    import re
    import shlex

    from tests.harness.docs import section as doc_section

    section = doc_section("concepts.md", "Topics: the table, create, alter, delete")
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)  # also run by test_readme_first_run
    b = broker_factory()
    lines = [line for line in block.splitlines() if line.startswith("metaq-admin ")]
    assert len(lines) == 4
    for line in lines:
        args = shlex.split(line.replace("meta://127.0.0.1:8123", url_of(b)))[1:]
        out = subprocess.run(ADMIN + args, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, (line, out.stdout, out.stderr)
    assert not os.path.exists(os.path.join(b.data_dir, "index", "orders"))
    with b.client() as c:
        assert c.put("orders", b"x", 0).code == 400  # the last command deleted it


def test_a_broker_finishes_a_delete_a_kill_interrupted(broker_factory):
    """The table's tombstone written, the broker killed before it removed the files (hand-made: the same files)."""
    b = broker_factory()
    with b.client() as c:
        for i in range(3):
            c.put_ok("doomed", b"m%d" % i, 0)
        c.put_ok("kept", b"k", 0)
    b.kill()
    assert os.path.isdir(os.path.join(b.data_dir, "index", "doomed"))
    with open(os.path.join(b.data_dir, "topics.json"), "w") as f:
        json.dump({"format": 1, "version": 1, "topics": {}, "deleted": {"doomed": {"0": 3}}}, f)
    b.start()
    assert not os.path.exists(os.path.join(b.data_dir, "index", "doomed"))
    with b.client() as c:
        assert c.get("doomed", 0, 0).code == 400
        assert b"k" in c.get("kept", 0, 0).body
    admin(b, "topics", "create", "doomed")
    with b.client() as c:
        assert c.put_ok("doomed", b"new", 0)[2] == 3
