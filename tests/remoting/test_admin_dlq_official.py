"""``metaq-admin dlq list|resend`` on dead letters the official RocketMQ client (rocketmq==0.4.4) made: README
"Admin commands". A push consumer whose handler fails one message until the broker moves it to ``%DLQ%<group>``;
the CLI lists it, resends it to its original topic (a consumer of the group gets it again, body, keys, tags and
user property intact), a second resend skips it, an unknown ``--id`` is refused."""

import json
import subprocess
import sys

import pytest

from bench.rocketmq_peer import finish_peer, run_peer, start_peer
from metaq.client.local import ns_of
from tests.harness.broker import consume_all, url_of, wait_for
from tests.harness.rocketmq import received, require_official_client

pytestmark = pytest.mark.slow

ADMIN = [sys.executable, "-m", "metaq.admincli"]
FAST = {"store": {"flush": "async", "flush_interval_ms": 50}}


@pytest.fixture(autouse=True)
def _official_client():
    require_official_client()


def admin(broker, *args, expect=0):
    out = subprocess.run(ADMIN + ["--brokers", url_of(broker)] + list(args), capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == expect, (args, out.returncode, out.stdout, out.stderr)
    return out


def dead_letters(broker, group):
    with broker.client() as text:
        first = text.get("%DLQ%" + group, 0, 0)
        return consume_all(text, "%DLQ%" + group, 0) if getattr(first, "code", 200) == 200 else []


def test_dlq_list_and_resend_of_a_message_the_official_client_failed(rmq_factory, tmp_path):
    b = rmq_factory(remoting={"max_reconsume_times": 1, "send_back_delay_level": 0}, **FAST)
    ns = ns_of(b)
    out = admin(b, "dlq", "list", "CGA", expect=3)  # nothing failed yet: no %DLQ%CGA anywhere
    assert "no broker has dead letters of group CGA" in out.stderr
    sent = [s for s in run_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tA", "--count", 3,
                                "--tags", "TagA") if "msg_id" in s]
    poison_id = sent[1]["msg_id"]  # m-1: its handler always fails
    stop = tmp_path / "stop"
    consumer = start_peer(tmp_path / "c1", "consume", "--ns", ns, "--topic", "tA", "--group", "CGA", "--fail", "m-1",
                          "--expect", 1000, "--timeout", 60, "--stop-file", str(stop))
    try:
        wait_for(lambda: dead_letters(b, "CGA"), 60, "m-1 in %DLQ%CGA")
    finally:
        stop.touch()
        lines = received(finish_peer(consumer))
    assert [m["reconsume_times"] for m in lines if m["body"] == "m-1"] == [0, 1]  # delivered, retried once: dead
    assert sorted(m["body"] for m in lines if m["body"] != "m-1") == ["m-0", "m-2"]

    # list: a table, and --json with every field
    table = admin(b, "dlq", "list", "CGA").stdout
    assert poison_id in table and "tA" in table and "m-1" in table, table
    [row] = json.loads(admin(b, "--json", "dlq", "list", "CGA").stdout)
    assert (row["id"], row["topic"], row["tags"], row["keys"], row["body"], row["resent"]) == \
        (poison_id, "tA", "TagA", "m-key-1", "m-1", False), row
    assert row["position"] == "%d-0-0" % row["broker"] and row["reconsume_times"] == 2

    # resend: back on tA; the group's next consumer gets it (and only it) with its body, keys, tags, property
    out = admin(b, "--json", "dlq", "resend", "CGA")
    [resent] = json.loads(out.stdout)
    assert (resent["id"], resent["status"], resent["topic"]) == (poison_id, "resent", "tA"), resent
    again = received(run_peer(tmp_path / "c2", "consume", "--ns", ns, "--topic", "tA", "--group", "CGA",
                              "--expect", 1, "--timeout", 60, "--linger", 1.0))
    assert [(m["body"], m["tags"], m["keys"], m["seq"], m["topic"], m["reconsume_times"]) for m in again] == \
        [("m-1", "TagA", "m-key-1", "1", "tA", 0)], again
    assert json.loads(admin(b, "--json", "dlq", "list", "CGA").stdout)[0]["resent"] is True

    # a second resend resends nothing: exit 0, says skipped
    out = admin(b, "dlq", "resend", "CGA")
    assert "skipped: already resent" in out.stdout, out.stdout
    assert [r["status"] for r in json.loads(admin(b, "--json", "dlq", "resend", "CGA").stdout)] == \
        ["skipped: already resent"]
    with b.client() as text:
        assert len([r for p in range(4) for r in consume_all(text, "tA", p) if r.payload == b"m-1"]) == 2

    # --id with an id no broker has: exit 3, says so, resends nothing
    out = admin(b, "dlq", "resend", "CGA", "--id", "NO-SUCH-ID", expect=3)
    assert "no dead letter of group CGA has id NO-SUCH-ID" in out.stderr, out.stderr
    # --id of the one already resent: skipped, not resent twice
    [row] = json.loads(admin(b, "--json", "dlq", "resend", "CGA", "--id", poison_id).stdout)
    assert (row["id"], row["status"]) == (poison_id, "skipped: already resent"), row
    with b.client() as text:
        assert len([r for p in range(4) for r in consume_all(text, "tA", p) if r.payload == b"m-1"]) == 2
