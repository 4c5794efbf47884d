"""Where is my message, against real brokers (docs/operating.md "Where is my message"): one message put over
RocketMQ's remoting port, consumed by group A and not B (their committed offsets), received and acknowledged by POP
group C, left in flight by POP group E, dead-lettered by POP group G, retried and dead-lettered by group D's
send-backs, and traced by a RocketMQ client's message-trace records; ``metaq-admin trace`` and ``GET /api/trace``
show each fact. Bad ids are answered clearly, the result count is bounded, a user who may not read the topic is
refused."""

import json
import subprocess
import sys
import time

from metaq.pop import limits as pop_limits
from metaq.trace import limits as trace_limits
from metaq import admincli as admin
from metaq.client.local import rmq_config, small_config
from metaq.client.raw import RemotingClient
from metaq.client.pop import SimpleConsumer
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.bodies import create_offset_msg_id, decode_stored_messages, parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from metaq.trace.records import TRACE_TOPIC, encode_pub, encode_sub_after, encode_sub_before
from tests.harness.acl import SECRETS, secured_config
from tests.harness.broker import wait_for
from tests.harness.http import request, with_http
from tests.harness.rocketmq import pull, send_v1

UNIQ = "0A0B0C0D00002A9F0000000000000007"  # a RocketMQ client's msgId shape
ADMIN = [sys.executable, "-m", "metaq.admincli"]


def url(b):
    return "meta://127.0.0.1:%d" % b.port


def cli_json(capsys, b, *args):
    code = admin.main(["--brokers", url(b), "--json", "trace"] + list(args))
    out = capsys.readouterr()
    assert code == admin.EXIT_OK, (code, out.err)
    return json.loads(out.out)


def commit(b, group, topic, offset):
    with b.client() as c:
        assert c.call(ev.CommitOffset(group, topic, 0, offset, 1)).code == 200


def test_trace_shows_where_a_message_is_and_what_each_group_did_with_it(broker_factory, tmp_path, capsys):
    config = with_http(rmq_config(tmp_path / "data", {"max_reconsume_times": 1, "send_back_delay_level": 0},
                                  topics=[{"name": "tW", "partitions": 1}, {"name": "tK", "partitions": 1}],
                                  store={"flush": "async", "flush_interval_ms": 50}))
    b = broker_factory(config, workdir=tmp_path)
    port = b.config["remoting"]["port"]
    with b.client() as c:
        before_id = c.put_ok("tW", b"before", 0)[0]  # a text put: offset 0, a metaq id
    with RemotingClient(port) as rc:
        # the trace topic is there as RocketMQ's broker with traceTopicEnable has it, though the topics are listed
        route = json.loads(rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": TRACE_TOPIC}).body)
        assert route["queueDatas"][0]["writeQueueNums"] == 1 and route["queueDatas"][0]["perm"] == 6
        sent = send_v1(rc, "tW", b"hello", queue=0, props={"TAGS": "TagW", "KEYS": "order-7", "UNIQ_KEY": UNIQ,
                                                           "colour": "blue"})
        assert sent.code == C.SUCCESS
        offset_id = sent.ext_fields["msgId"]
        physical = parse_offset_msg_id(offset_id)[2]
        # group D: consumed it, failed it twice: a retry, then (max_reconsume_times 1) a dead letter
        back = {"offset": physical, "group": "D", "delayLevel": 0, "originMsgId": UNIQ, "originTopic": "tW"}
        assert rc.call(R.CONSUMER_SEND_MSG_BACK, back).code == C.SUCCESS
        [retry] = decode_stored_messages(pull(rc, "%RETRY%D", 0, 0).body)
        assert rc.call(R.CONSUMER_SEND_MSG_BACK, dict(back, offset=retry.physical_offset)).code == C.SUCCESS
        # the client's message trace: its send, group D's two attempts, the last one failed
        now = int(time.time() * 1000)
        body = (encode_pub(now, "PG", "tW", UNIQ, "TagW", "order-7", "127.0.0.1:%d" % port, 5, 3, offset_id)
                + encode_sub_before(now + 10, "D", "req-1", UNIQ, 0, "order-7")
                + encode_sub_after("req-1", UNIQ, 7, False, "order-7", 2, now + 17))
        traced = send_v1(rc, TRACE_TOPIC, body.encode(), props={"KEYS": "%s order-7" % UNIQ})
        assert traced.code == C.SUCCESS
    commit(b, "A", "tW", 2)  # past it
    commit(b, "B", "tW", 1)  # not yet
    commit(b, "D", "tW", 2)
    with SimpleConsumer(url(b), "C", "tW") as pc:
        got = pc.receive(8)
        assert sorted(r.message.body for r in got) == [b"before", b"hello"]
        assert pc.ack(*got) == [None, None]
    with SimpleConsumer(url(b), "E", "tW", invisible_ms=600_000) as pe:
        assert len(pe.receive(8)) == 2
    with SimpleConsumer(url(b), "G", "tW", invisible_ms=pop_limits.POP_MIN_INVISIBLE_MS) as pg:
        for _ in range(pop_limits.POP_MAX_ATTEMPTS + 1):  # never acked: past its attempts it is a dead letter
            pg.receive(8)
            time.sleep(pop_limits.POP_MIN_INVISIBLE_MS / 1000 + 0.03)
        assert pg.receive(8) == []

    def traced_whole():
        [m] = cli_json(capsys, b, offset_id)
        return m if m["traces"] and m["dead_letters"] else None

    m = wait_for(traced_whole, 20, "the trace records indexed")
    # where it is stored
    assert (m["topic"], m["partition"], m["offset"], m["position"]) == ("tW", 0, 1, physical)
    assert (m["tags"], m["keys"], m["uniq_key"], m["offset_msg_id"]) == ("TagW", "order-7", UNIQ, offset_id)
    assert m["properties"]["colour"] == "blue" and m["born_host"].startswith("127.0.0.1:")
    assert m["size"] > 5 and m["store_ms"] >= m["born_ms"] > 0 and m["broker"] == 7
    # committed offsets: A and D past it, B not
    assert [(c["group"], c["offset"], c["consumed"]) for c in m["consumers"]] == \
        [("A", 2, True), ("B", 1, False), ("D", 2, True)]
    # POP: C acknowledged it, E holds it, G's attempts ran out
    pop = {p["group"]: p for p in m["pop"]}
    assert pop["C"]["state"] == "acknowledged"
    assert (pop["E"]["state"], pop["E"]["attempt"], pop["E"]["redelivered"]) == ("in_flight", 1, False)
    assert pop["E"]["invisible_until_ms"] > time.time() * 1000 + 500_000
    assert pop["G"]["state"] == "dead_lettered"
    # group D's retry and dead letter, and G's dead letter
    assert [(r["group"], r["topic"], r["reconsume_times"]) for r in m["retries"]] == [("D", "%RETRY%D", 1)]
    assert sorted((d["group"], d["topic"]) for d in m["dead_letters"]) == [("D", "%DLQ%D"), ("G", "%DLQ%G")]
    assert m["copies_complete"] is True
    # the client's trace records, oldest first
    assert [(t["type"], t.get("group"), t.get("success")) for t in m["traces"]] == \
        [("Pub", "PG", True), ("SubBefore", "D", None), ("SubAfter", None, False)]
    assert m["traces"][0]["offset_msg_id"] == offset_id and m["traces"][1]["retry_times"] == 0

    # the same in the table a person reads
    assert admin.main(["--brokers", url(b), "trace", offset_id]) == admin.EXIT_OK
    table = capsys.readouterr().out
    for fact in ("stored:", "TagW", "order-7", UNIQ, "acknowledged", "in_flight", "dead_lettered", "%RETRY%D",
                 "%DLQ%D", "%DLQ%G", "SubAfter", "colour=blue"):
        assert fact in table, (fact, table)

    # the same over HTTP; found by the client's msgId and by key within the topic too
    doc = request(b, "GET", "/api/trace?id=%s" % offset_id).json()
    [h] = doc["messages"]
    assert (h["offset"], h["uniq_key"], doc["more"]) == (1, UNIQ, False)
    assert {p["group"]: p["state"] for p in h["pop"]} == {"C": "acknowledged", "E": "in_flight", "G": "dead_lettered"}
    assert [t["type"] for t in h["traces"]] == ["Pub", "SubBefore", "SubAfter"]
    assert request(b, "GET", "/api/trace?id=%s&topic=tW" % UNIQ).json()["messages"][0]["position"] == physical
    assert request(b, "GET", "/api/trace?key=order-7&topic=tW").json()["messages"][0]["position"] == physical

    # a metaq id, within its topic
    [first] = cli_json(capsys, b, str(before_id), "--topic", "tW")
    assert (first["offset"], first["msg_id"], first["uniq_key"]) == (0, before_id, None)
    assert {p["group"]: p["state"] for p in first["pop"]}["C"] == "acknowledged"

    # bad ids: malformed (exit 2 / 400, nothing asked), well formed but no such message (exit 3 / 404)
    assert admin.main(["--brokers", url(b), "trace", "not-an-id"]) == admin.EXIT_USAGE
    assert "not a message id" in capsys.readouterr().err
    bad = request(b, "GET", "/api/trace?id=not-an-id")
    assert bad.status == 400 and "not a message id" in bad.json()["error"]
    nowhere = create_offset_msg_id("127.0.0.1", port, physical + 1)
    assert admin.main(["--brokers", url(b), "trace", nowhere]) == admin.EXIT_REFUSED
    assert "no broker has message %s" % nowhere in capsys.readouterr().err
    missing = request(b, "GET", "/api/trace?id=%s" % nowhere)
    assert missing.status == 404 and "names no record" in missing.json()["error"]
    assert admin.main(["--brokers", url(b), "trace", str(before_id)]) == admin.EXIT_USAGE  # a metaq id needs --topic
    assert "--topic" in capsys.readouterr().err


def test_trace_answers_at_most_the_limit_of_messages(broker_factory, tmp_path, capsys):
    b = broker_factory(with_http(small_config(tmp_path / "data", topics=[{"name": "tK", "partitions": 1}],
                                              store={"flush": "async", "flush_interval_ms": 50})), workdir=tmp_path)
    most = trace_limits.TRACE_MAX_RESULTS
    with b.client() as c:
        for i in range(most):
            c.put_ok("tK", b"m%d" % i, 0, attribute="\x02KEYS\x01many")

    def page():
        doc = request(b, "GET", "/api/trace?key=many&topic=tK&max=%d" % most).json()
        return doc if len(doc.get("messages", ())) == most else None

    at = wait_for(page, 15, "the keys indexed")
    assert at["more"] is False
    with b.client() as c:
        c.put_ok("tK", b"one more", 0, attribute="\x02KEYS\x01many")
    past = wait_for(lambda: (lambda d: d if d["more"] else None)(page()), 15, "the last key indexed")
    assert len(past["messages"]) == most and past["messages"][0]["offset"] == most  # newest first
    refused = request(b, "GET", "/api/trace?key=many&topic=tK&max=%d" % (most + 1))
    assert refused.status == 400 and "TRACE_MAX_RESULTS" in refused.json()["error"]
    assert admin.main(["--brokers", url(b), "trace", "--key", "many", "--topic", "tK", "--max", str(most + 1)]) \
        == admin.EXIT_USAGE
    capsys.readouterr()
    shown = cli_json(capsys, b, "--key", "many", "--topic", "tK", "--max", str(most))
    assert len(shown) == most and all(m["more"] for m in shown)


def test_only_a_user_who_may_read_the_topic_traces_its_messages(broker_factory, tmp_path):
    b = broker_factory(with_http(secured_config(tmp_path)), workdir=tmp_path)
    with b.client() as c:
        assert c.auth("alice", SECRETS["alice"]).code == 200
        msg_id = c.put_ok("orders", b"o-1", 0)[0]
    secrets = {}
    for user in ("alice", "bob"):
        secrets[user] = tmp_path / ("%s.secret" % user)
        secrets[user].write_text(SECRETS[user])
        secrets[user].chmod(0o600)

    def trace_as(user):
        return subprocess.run(ADMIN + ["--brokers", url(b), "--user", user, "--secret-file", str(secrets[user]),
                                       "--json", "trace", str(msg_id), "--topic", "orders"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    for user, group in (("alice", "billing"), ("reader", "audit")):  # each consumed it, as its own group
        with b.client() as c:
            assert c.auth(user, SECRETS[user]).code == 200
            assert c.call(ev.CommitOffset(group, "orders", 0, 1, 1)).code == 200
    secrets["reader"] = tmp_path / "reader.secret"
    secrets["reader"].write_text(SECRETS["reader"])
    secrets["reader"].chmod(0o600)
    ok = trace_as("alice")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0]["msg_id"] == msg_id
    # a tenant is told of the groups it may consume as, not another's: alice's billing, not the reader's audit
    assert [g["group"] for g in json.loads(ok.stdout)[0]["consumers"]] == ["billing"]
    seen = trace_as("reader")
    assert seen.returncode == 0, seen.stderr
    assert sorted(g["group"] for g in json.loads(seen.stdout)[0]["consumers"]) == ["audit", "billing"]
    refused = trace_as("bob")  # bob may publish to orders, not read it
    assert refused.returncode == admin.EXIT_REFUSED, refused.stderr
    assert "user bob may not subscribe to topic orders" in refused.stderr, refused.stderr
    assert "o-1" not in refused.stdout
    path = "/api/trace?id=%d&topic=orders" % msg_id
    assert request(b, "GET", path, user="alice", secret=SECRETS["alice"]).status == 200
    denied = request(b, "GET", path, user="bob", secret=SECRETS["bob"])
    assert denied.status == 403 and "may not subscribe to topic orders" in denied.json()["error"]
    assert request(b, "GET", path).status == 401
