"""metaq-admin against a broker with authentication on (README "Admin commands", "Security"): every command that
changes something (reset-offsets --execute, dlq resend, topics create/alter/delete) is refused to a user without
the admin permission (exit 3, the broker's reason on stderr, nothing changed) and done for an admin; put and tail
need publish and subscribe on the topic.

The dead letter is made with raw remoting (CONSUMER_SEND_MSG_BACK, as tests/remoting/test_remoting_codes.py) while
the broker runs without authentication; the broker then restarts on the same data with a permissions file.
tests/remoting/test_admin_dlq_official.py makes one with the official client."""

import json
import os
import subprocess
import sys

from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.bodies import parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R
from tests.harness.acl import SECRETS, write_acl
from tests.harness.broker import consume_all, url_of
from tests.harness.rocketmq import send_v1

ADMIN = [sys.executable, "-m", "metaq.admincli"]


def make_dead_letter(broker):
    """One message of topic tR (tags P, keys K1) sent back twice by group CGR: with max_reconsume_times 1, dead."""
    with RemotingClient(broker.config["remoting"]["port"]) as rc:
        sent = send_v1(rc, "tR", b"poison", props={"TAGS": "P", "KEYS": "K1", "UNIQ_KEY": "U1"})
        back = {"offset": parse_offset_msg_id(sent.ext_fields["msgId"])[2], "group": "CGR", "delayLevel": -1,
                "originMsgId": "U1", "originTopic": "tR"}
        assert rc.call(R.CONSUMER_SEND_MSG_BACK, back).code == 0  # a negative delay level: a dead letter at once


def test_admin_commands_need_the_admin_permission_put_and_tail_need_pub_and_sub(broker_factory, tmp_path):
    cfg = rmq_config(tmp_path / "data", {"max_reconsume_times": 1, "send_back_delay_level": 0})
    b = broker_factory(cfg, workdir=tmp_path)
    make_dead_letter(b)
    with b.client() as c:
        for i in range(5):
            c.put_ok("orders", b"o%d" % i, 0)
        assert c.call(ev.CommitOffset("billing", "orders", 0, 4, c.opaque())).code == 200
    b.stop()
    b.config["security"] = {"acl_file": write_acl(tmp_path / "acl.yaml"), "acl_reload_s": 0.2}
    b.start()

    secrets = {}
    for user in SECRETS:
        secrets[user] = tmp_path / ("%s.secret" % user)
        secrets[user].write_text(SECRETS[user])
        secrets[user].chmod(0o600)

    def as_user(user, *args, expect=0, stdin=None):
        out = subprocess.run(ADMIN + ["--brokers", url_of(b), "--user", user, "--secret-file", str(secrets[user])]
                             + list(args), capture_output=True, text=True, timeout=60, input=stdin,
                             stdin=None if stdin is not None else subprocess.DEVNULL)
        assert out.returncode == expect, (user, args, out.returncode, out.stdout, out.stderr)
        return out

    def committed():
        with b.client() as c:
            assert c.auth("admin", SECRETS["admin"]).code == 200
            return c.call(ev.QueryOffset("billing", "orders", 0, c.opaque())).body

    def tr_bodies():
        with b.client() as c:
            assert c.auth("admin", SECRETS["admin"]).code == 200
            return [r.payload for p in range(4) for r in consume_all(c, "tR", p)]

    table = os.path.join(b.data_dir, "topics.json")

    def table_bytes():
        return open(table, "rb").read() if os.path.exists(table) else None

    # alice may produce and consume orders as group billing, but is no admin: each admin command refused
    reset = ["reset-offsets", "--group", "billing", "--topic", "orders", "--to-earliest"]
    for args in (reset, reset + ["--execute"], ["dlq", "list", "CGR"], ["dlq", "resend", "CGR"],
                 ["topics", "create", "fresh", "--partitions", "2"], ["topics", "alter", "orders", "--perm", "r"],
                 ["topics", "delete", "orders", "--yes"]):
        before = table_bytes()
        out = as_user("alice", *args, expect=3)
        assert "permission denied: user alice is not an admin" in out.stderr, (args, out.stderr)
        assert table_bytes() == before
    assert committed() == b"4"
    assert tr_bodies() == [b"poison"]  # nothing resent
    assert table_bytes() is None  # no topic created, altered or deleted

    # the admin user: the same commands work
    [row] = json.loads(as_user("admin", "--json", *reset).stdout)
    assert (row["current"], row["new"]) == (4, 0)
    as_user("admin", *(reset + ["--execute"]))
    assert committed() == b"0"
    [dead] = json.loads(as_user("admin", "--json", "dlq", "list", "CGR").stdout)
    assert (dead["id"], dead["topic"], dead["tags"], dead["keys"], dead["body"]) == ("U1", "tR", "P", "K1", "poison")
    [resent] = json.loads(as_user("admin", "--json", "dlq", "resend", "CGR").stdout)
    assert (resent["id"], resent["status"], resent["topic"]) == ("U1", "resent", "tR")
    assert tr_bodies() == [b"poison", b"poison"]
    as_user("admin", "topics", "create", "fresh", "--partitions", "2")
    as_user("admin", "topics", "alter", "fresh", "--perm", "r")
    assert json.load(open(table))["topics"]["fresh"]["perm"] == "r"
    as_user("admin", "topics", "delete", "fresh", "--yes")
    assert "fresh" not in json.load(open(table))["topics"]

    # put needs publish, tail needs subscribe, on the topic
    as_user("bob", "put", "orders", "--partition", "0", stdin="from bob\n")  # bob: orders pub
    out = as_user("bob", "tail", "orders", expect=3)  # ... and no sub
    assert "result 403 permission denied: user bob may not subscribe to topic orders\n" in out.stderr, out.stderr
    out = as_user("bob", "put", "payments", "--partition", "0", stdin="x\n", expect=3)
    assert "permission denied: user bob may not publish to topic payments; 0 of 1 stored" in out.stderr, out.stderr
    tail = as_user("reader", "tail", "orders", "--partition", "0").stdout  # reader: sub on every topic but payroll
    assert tail.splitlines()[-1].endswith("from bob"), tail
    out = as_user("reader", "put", "orders", stdin="x\n", expect=3)
    assert "user reader may not publish to topic orders" in out.stderr, out.stderr
    out = as_user("reader", "tail", "payroll", expect=3)  # denied to reader
    assert "user reader may not subscribe to topic payroll" in out.stderr, out.stderr
    as_user("alice", "put", "orders-eu", "--partition", "0", stdin="a\n")
    assert as_user("alice", "tail", "orders-eu").stdout.split()[-1] == "a"


def test_tail_and_put_without_credentials_say_the_401_first_and_only(broker_factory, tmp_path):
    """A broker with authentication on, asked with no credentials: the refusal is the first (and only) thing said,
    with how to give credentials, exit 3 (refused); not "no broker has messages of topic …" before it."""
    from tests.harness.acl import secured_config

    b = broker_factory(secured_config(tmp_path))
    for args in (["tail", "orders"], ["tail", "orders", "--partition", "0"], ["put", "orders"]):
        out = subprocess.run(ADMIN + ["--brokers", url_of(b)] + args, capture_output=True, text=True, timeout=60,
                             input="x\n")
        lines = out.stderr.splitlines()
        assert out.returncode == 3 and out.stdout == "", (args, out.returncode, out.stdout, out.stderr)
        assert len(lines) == 1 and "401 authentication required" in lines[0], (args, lines)
        assert "--credentials FILE" in lines[0] and "no broker" not in out.stderr, (args, lines)
