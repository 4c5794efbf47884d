"""metaq-admin promises the other admin tests leave out (README "Admin commands"): `put` to an unreachable
broker exits 1, `tail` never commits an offset, `--shift-by` leaves a partition without a committed offset
alone, and a RocketMQ client registered by heartbeat is a live member for `reset-offsets`."""

import json
import subprocess
import sys

import pytest

from metaq.client.local import rmq_config, small_config
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.broker import url_of, wait_for

ADMIN = [sys.executable, "-m", "metaq.admincli"]


def admin(*args, expect=0, stdin=None):
    out = subprocess.run(ADMIN + list(args), capture_output=True, input=stdin, timeout=60)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


@pytest.mark.integration  # the admin process tries a TCP connection (to a port nobody listens on)
def test_put_to_an_unreachable_broker_exits_1_and_says_so():
    out = admin("--brokers", "meta://127.0.0.1:1", "--timeout", "1", "put", "orders", stdin=b"lost\n", expect=1)
    assert b"cannot connect to meta://127.0.0.1:1" in out.stderr, out.stderr
    assert b"0 of 1 stored" in out.stderr, out.stderr


def test_tail_never_commits_an_offset(broker):
    url = url_of(broker)
    with broker.client() as c:
        for i in range(3):
            c.put_ok("orders", b"m%d" % i, 0)
    admin("--brokers", url, "tail", "orders")
    admin("--brokers", url, "tail", "orders", "--from", "1", "--max", "1")
    admin("--brokers", url, "tail", "orders", "--follow", "--max", "3")
    with broker.client() as c:
        # the group tail's gets name has no committed offset on any partition
        for p in range(2):
            reply = c.call(ev.QueryOffset("metaq-admin-tail", "orders", p, c.opaque()))
            assert reply.code == 404, (p, reply)
    # and the broker's offset table holds nothing for any group (reset-offsets of tail's group: "a typo?")
    out = admin("--brokers", url, "reset-offsets", "--group", "metaq-admin-tail", "--topic", "orders",
                "--to-earliest", expect=3)
    assert b"has no committed offsets" in out.stderr


def test_shift_by_leaves_a_partition_without_a_committed_offset_alone(broker_factory, tmp_path):
    b = broker_factory(config=small_config(str(tmp_path / "data"), topics=[{"name": "orders", "partitions": 2}]))
    url = url_of(b)
    base = ["--json", "--brokers", url, "reset-offsets", "--group", "g", "--topic", "orders", "--shift-by", "-1"]
    with b.client() as c:
        for p in (0, 1):
            for i in range(4):
                c.put_ok("orders", b"m%d" % i, p)
    with b.client() as c:
        assert c.call(ev.CommitOffset("g", "orders", 0, 3, c.opaque())).code == 200
    rows = {r["partition"]: r for r in json.loads(admin(*base).stdout)}
    assert (rows["7-0"]["current"], rows["7-0"]["new"]) == (3, 2)
    assert (rows["7-1"]["current"], rows["7-1"]["new"]) == (None, None)
    assert "left alone" in rows["7-1"]["note"]
    wait_for(lambda: b"conn-" not in admin(*base).stderr, what="the committing text connection to close")
    admin(*(base + ["--execute"]))
    with b.client() as c:
        assert c.call(ev.QueryOffset("g", "orders", 0, c.opaque())).body == b"2"
        still = c.call(ev.QueryOffset("g", "orders", 1, c.opaque()))
    assert still.code == 404, still  # no offset was made up for partition 1


def _heartbeat(rc, client_id, group, topic):
    body = json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0, "unitMode": False,
        "subscriptionDataSet": [{"topic": topic, "subString": "*", "subVersion": "1"}]}]}).encode()
    assert rc.call(R.HEART_BEAT, body=body).code == C.SUCCESS


def test_a_rocketmq_client_registered_by_heartbeat_is_a_live_member_of_reset_offsets(broker_factory, tmp_path):
    b = broker_factory(config=rmq_config(str(tmp_path / "data"), topics=[{"name": "orders", "partitions": 1}]))
    url = url_of(b)
    with b.client() as c:
        for i in range(5):
            c.put_ok("orders", b"m%d" % i, 0)
        assert c.call(ev.CommitOffset("rg", "orders", 0, 4, c.opaque())).code == 200
    reset = ["--brokers", url, "reset-offsets", "--group", "rg", "--topic", "orders", "--to-earliest", "--execute"]
    wait_for(lambda: b"conn-" not in admin(*reset[:-1]).stderr, what="the committing text connection to close")
    rc = RemotingClient(b.config["remoting"]["port"])
    try:
        _heartbeat(rc, "rmq-client-1", "rg", "orders")
        out = admin(*reset, expect=3)
        assert b"live members" in out.stderr and b"remoting rmq-client-1" in out.stderr, out.stderr
        with b.client() as c:
            assert c.call(ev.QueryOffset("rg", "orders", 0, c.opaque())).body == b"4"  # nothing changed
    finally:
        rc.close()
    # its connection closed: no longer a member, the reset goes through
    wait_for(lambda: b"rmq-client-1" not in admin(*reset[:-1]).stderr, what="the closed client to be forgotten")
    admin(*reset)
    with b.client() as c:
        assert c.call(ev.QueryOffset("rg", "orders", 0, c.opaque())).body == b"0"
