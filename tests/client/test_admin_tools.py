"""metaq-admin put, tail, reset-offsets against real brokers (and a real ZooKeeper): README "Admin commands"."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from metaq.client.consumer import Consumer
from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.broker import url_of, wait_for

ADMIN = [sys.executable, "-m", "metaq.admincli"]


def admin(*args, expect=0, stdin=None):
    out = subprocess.run(ADMIN + list(args), capture_output=True, input=stdin, timeout=60)
    assert out.returncode == expect, (out.returncode, out.stdout, out.stderr)
    return out


def json_lines(out):
    return [json.loads(line) for line in out.stdout.decode().splitlines() if line.strip()]


def test_put_three_lines_then_tail_reads_them_back(broker):
    url = url_of(broker)
    data = b"first\nsecond \xff\x00\x01 bytes\r\nthird\n"
    put = json_lines(admin("--brokers", url, "--json", "put", "orders", "--partition", "0", "--attribute", "a1",
                           stdin=data))
    assert [p["offset"] for p in put] == [0, 1, 2] and {p["partition"] for p in put} == {"7-0"}
    got = json_lines(admin("--brokers", url, "--json", "tail", "orders"))
    import base64
    assert [base64.b64decode(m["body_base64"]) for m in got] == [b"first", b"second \xff\x00\x01 bytes", b"third"]
    assert got[1]["body"] == "second \\xff\\x00\\x01 bytes"  # one safe line per message
    assert {m["attribute"] for m in got} == {"a1"}
    text = admin("--brokers", url, "tail", "orders", "--from", "1", "--max", "1").stdout.decode()
    assert text.splitlines() == ["7-0 1 a1 - second \\xff\\x00\\x01 bytes"]
    raw = json_lines(admin("--brokers", url, "--json", "put", "orders", "--raw", "--key", "k1", stdin=b"a\nb\n"))
    assert len(raw) == 1


def test_put_refused_by_the_broker_says_how_many_were_stored(broker):
    big = b"x" * (300 * 1024)  # over the test broker's max_body_bytes (256 KiB)
    out = admin("--brokers", url_of(broker), "put", "orders", "--partition", "0", stdin=b"ok\n" + big + b"\nafter\n",
                expect=3)
    assert b"message 2 of 3 failed" in out.stderr and b"1 of 3 stored" in out.stderr
    with broker.client() as c:
        assert c.call(ev.Offset("orders", "g", 0, 99, c.opaque())).body == b"1"


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `nohup ... &` without job control starts it


@pytest.mark.parametrize("sig, started", [(signal.SIGINT, "as usual"), (signal.SIGTERM, "as usual"),
                                          (signal.SIGINT, "with SIGINT ignored")])
def test_tail_follow_sees_a_message_put_after_it_started_and_exits_0_on_sigint(broker, sig, started):
    url = url_of(broker)
    topic = "news-%s-%s" % (sig.name, started.split()[0])  # a topic of its own: the broker is shared
    with broker.client() as c:
        c.put_ok(topic, b"old", 0)
    proc = subprocess.Popen(ADMIN + ["--brokers", url, "tail", topic, "--follow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            preexec_fn=_ignore_sigint if started != "as usual" else None)
    try:
        assert proc.stdout.readline().split()[-1] == b"old"
        assert b"following " + topic.encode() in proc.stderr.readline()
        with broker.client() as c:
            c.put_ok(topic, b"fresh news", 1)
        assert proc.stdout.readline().decode().split(" ", 4)[-1].strip() == "fresh news"
        proc.send_signal(sig)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("tail --follow did not stop on %s (started %s)" % (sig.name, started))
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_reset_offsets_refuses_bad_input(broker):
    url = url_of(broker)
    out = admin("--brokers", url, "reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--to-latest",
                expect=2)
    assert b"not allowed with argument" in out.stderr
    out = admin("--brokers", url, "reset-offsets", "--group", "g", "--topic", "t", "--to-offset", "ten", expect=2)
    assert b"invalid int value" in out.stderr
    out = admin("--brokers", url, "reset-offsets", "--group", "g", "--topic", "nosuch", "--to-earliest", expect=3)
    assert b"no broker has topic nosuch" in out.stderr
    with broker.client() as c:
        c.put_ok("tq", b"m", 0)
    out = admin("--brokers", url, "reset-offsets", "--group", "nobody", "--topic", "tq", "--to-earliest", expect=3)
    assert b"group nobody has no committed offsets for topic tq" in out.stderr


def _consume(group, count, **where):
    got, done = [], threading.Event()

    def handle(m):
        got.append(m.body)
        if len(got) >= count:
            done.set()

    c = Consumer(group, commit_interval=0.2, long_poll_ms=500, **where)
    c.subscribe("orders", handle)
    c.start()
    return c, got, done


def _two_batches(client):
    first = [b"a%d" % i for i in range(5)]
    second = [b"b%d" % i for i in range(5)]
    for body in first:
        client.put_ok("orders", body, 0)
    last_ms = int(time.time() * 1000)
    wait_for(lambda: int(time.time() * 1000) > last_ms + 1, what="the clock to move")
    between = int(time.time() * 1000)
    wait_for(lambda: int(time.time() * 1000) > between + 1, what="the clock to move")
    for body in second:
        client.put_ok("orders", body, 0)
    return first, second, between


@pytest.mark.parametrize("home", ["broker", "zk"])
def test_reset_to_datetime_makes_a_real_group_resume_exactly_there(broker_factory, zk_connect, home, tmp_path):
    if home == "zk":
        b = broker_factory(start=False)
        b.config = small_config(os.path.join(str(tmp_path), "zkdata"), zk={"connect": zk_connect},
                                topics=[{"name": "orders", "partitions": 1}, {"name": "*", "partitions": 1}])
        b.data_dir = b.config["broker"]["data_dir"]
        b.start()
        where, target = {"zk_connect": zk_connect}, ["--zk", zk_connect]
    else:
        b = broker_factory(config=small_config(str(tmp_path / "data"), topics=[{"name": "orders", "partitions": 1}]))
        where, target = {"brokers": [url_of(b)]}, ["--brokers", url_of(b)]
    with b.client() as client:
        first, second, between = _two_batches(client)
    c, got, done = _consume("billing", 10, **where)
    assert done.wait(30)
    c.close()
    assert got == first + second
    reset = ["--json"] + target + ["reset-offsets", "--group", "billing", "--topic", "orders", "--to-datetime",
                                   str(between)]
    plan = json.loads(admin(*reset).stdout)  # a dry run
    assert [(r["current"], r["new"], r["store"]) for r in plan] == [(10, 5, "zookeeper" if home == "zk" else "broker")]
    assert json.loads(admin(*reset).stdout)[0]["current"] == 10  # nothing changed
    live, got2, _ = _consume("billing", 1, **where)  # a live member: refused without --force
    try:
        out = admin(*(reset + ["--execute"]), expect=3)
        assert b"live members" in out.stderr
    finally:
        live.close()
    assert got2 == []
    admin(*(reset + ["--execute"]))
    c, got, done = _consume("billing", 6, **where)
    with b.client() as client:
        client.put_ok("orders", b"sentinel", 0)
    assert done.wait(30)
    c.close()
    assert got == second + [b"sentinel"]  # resumed at the first of the second batch: none skipped, none repeated


def test_reset_offsets_forms_and_force(broker_factory, tmp_path):
    b = broker_factory(config=small_config(str(tmp_path / "data"), topics=[{"name": "orders", "partitions": 1}]))
    url = url_of(b)
    with b.client() as c:
        for i in range(10):
            c.put_ok("orders", b"m%d" % i, 0)
        assert c.call(ev.CommitOffset("g", "orders", 0, 4, c.opaque())).code == 200
        base = ["--json", "--brokers", url, "reset-offsets", "--group", "g", "--topic", "orders"]
        for form, new, note in ((["--to-earliest"], 0, ""), (["--to-latest"], 10, ""), (["--to-offset", "7"], 7, ""),
                                (["--to-offset", "70"], 10, "clamped from 70"), (["--shift-by", "-2"], 2, ""),
                                (["--shift-by", "-20"], 0, "clamped from -16")):
            row = json.loads(admin(*(base + form)).stdout)[0]
            assert (row["current"], row["new"], row["note"]) == (4, new, note), form
        # this connection committed for g and is still open: a live member; --force applies anyway
        out = admin(*(base + ["--to-offset", "7", "--execute"]), expect=3)
        assert b"text conn-" in out.stderr
        admin(*(base + ["--to-offset", "7", "--execute", "--force"]))
        assert c.call(ev.QueryOffset("g", "orders", 0, c.opaque())).body == b"7"


def test_tail_of_a_topic_the_broker_refuses_to_read_exits_3_with_its_reason(broker):
    url = url_of(broker)
    admin("--brokers", url, "topics", "create", "wonly", "--partitions", "1", "--perm", "w")
    admin("--brokers", url, "put", "wonly", stdin=b"kept\n")
    out = admin("--brokers", url, "tail", "wonly", expect=3)  # a refusal, not "unreachable" (1)
    assert b"topic wonly is not readable (perm w)" in out.stderr, out.stderr
