"""The admin operations over the HTTP port (README "JSON API and HTTP put/get"): the same ``AdminOps`` as
``metaq-admin reset-offsets`` and ``dlq``, with a real broker and a RocketMQ dead letter made by send-back."""

from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.bodies import decode_stored_messages, parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.http import request, with_http
from tests.harness.rocketmq import pull, send_v1


def test_reset_offset_over_http_dry_run_then_execute_refused_while_live(broker_factory, tmp_path):
    b = broker_factory(with_http(rmq_config(tmp_path / "data")))
    with b.client() as c:
        for i in range(10):
            c.put_ok("t-reset", b"m%d" % i, partition=0)
        assert c.call(ev.CommitOffset("g", "t-reset", 0, 8, c.opaque())).code == 200  # c is now a live member
        path = "/api/groups/g/offsets/t-reset/0"
        dry = request(b, "POST", path + "?to=3")
        assert dry.status == 200, dry
        plan = dry.json()
        assert (plan["current"], plan["new"], plan["executed"], plan["clamped_from"]) == (8, 3, False, None)
        assert [m["kind"] for m in plan["live_members"]] == ["text"]
        assert c.call(ev.QueryOffset("g", "t-reset", 0, c.opaque())).body == b"8"  # a dry run changes nothing
        refused = request(b, "POST", path + "?to=3&execute=1")
        assert refused.status == 409 and "live member" in refused.json()["error"], refused
        done = request(b, "POST", path + "?to=99&execute=1&force=1")  # clamped to the end
        assert done.status == 200 and done.json()["new"] == 10 and done.json()["clamped_from"] == 99, done
        assert c.call(ev.QueryOffset("g", "t-reset", 0, c.opaque())).body == b"10"
    assert request(b, "POST", "/api/groups/g/offsets/t-reset/0?to=soon").status == 400
    assert request(b, "POST", "/api/groups/g/offsets/no-such-topic/0?to=0").status == 404
    group = request(b, "GET", "/api/groups/g").json()
    assert [(o["topic"], o["offset"]) for o in group["offsets"]] == [("t-reset", 10)]


def test_dead_letters_listed_and_resent_once_over_http(broker_factory, tmp_path):
    b = broker_factory(with_http(rmq_config(tmp_path / "data", remoting={"max_reconsume_times": 1,
                                                                           "send_back_delay_level": 0})))
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        sent = send_v1(rc, "tD", b"poison", props={"TAGS": "P", "UNIQ_KEY": "U1"})
        physical = parse_offset_msg_id(sent.ext_fields["msgId"])[2]
        back = {"offset": physical, "group": "CGD", "delayLevel": -1, "originMsgId": "U1", "originTopic": "tD"}
        assert rc.call(R.CONSUMER_SEND_MSG_BACK, back).code == C.SUCCESS  # straight to the dead letters
        listed = request(b, "GET", "/api/dlq/CGD")
        assert listed.status == 200, listed
        [letter] = listed.json()["dead_letters"]
        assert (letter["id"], letter["topic"], letter["body"], letter["resent"]) == ("U1", "tD", "poison", False)
        first = request(b, "POST", "/api/dlq/CGD/resend").json()
        assert [(r["id"], r["topic"]) for r in first["resent"]] == [("U1", "tD")]
        again = request(b, "POST", "/api/dlq/CGD/resend").json()
        assert again["resent"] == [] and again["skipped"][0]["reason"] == "already resent"
        resent = first["resent"][0]
        [msg] = decode_stored_messages(pull(rc, "tD", resent["partition"], resent["offset"]).body)
        assert msg.body == b"poison" and msg.properties["TAGS"] == "P"
    assert request(b, "GET", "/api/dlq/nobody").status == 404


def test_topics_created_altered_and_deleted_over_http(broker_factory, tmp_path):
    b = broker_factory(with_http(rmq_config(tmp_path / "data")))
    made = request(b, "PUT", "/api/topics/orders?partitions=3&retention_hours=24")
    assert made.status == 201, made
    table = {t["name"]: t for t in request(b, "GET", "/api/topic-table").json()["topics"]}
    assert table["orders"]["partitions"] == 3 and table["orders"]["retention_hours"] == 24
    with b.client() as c:
        c.put_ok("orders", b"o", partition=2)  # the third partition exists
    assert request(b, "PATCH", "/api/topics/orders?partitions=2").status == 400  # never fewer: refused
    altered = request(b, "PATCH", "/api/topics/orders?perm=r")
    assert altered.status == 200, altered
    with b.client() as c:
        r = c.put("orders", b"refused", partition=0)
        assert r.code == 403 and b"not writable" in r.body, r
    assert request(b, "PUT", "/api/topics/orders?partitions=3").status == 400  # exists already
    assert request(b, "PATCH", "/api/topics/orders?color=blue").status == 400  # unknown setting
    gone = request(b, "DELETE", "/api/topics/orders")
    assert gone.status == 200 and gone.json()["deleted"] is True, gone
    with b.client() as c:
        r = c.put("orders", b"after", partition=0)
        assert r.code == 400 and b"deleted" in r.body, r
    assert request(b, "DELETE", "/api/topics/orders").status in (400, 404)
    assert request(b, "DELETE", "/api/topics/SCHEDULE_TOPIC_XXXX").status == 400


def test_timers_listed_and_cancelled_over_http(broker_factory, tmp_path):
    """``GET /api/timers`` lists what ``metaq-admin timers list`` lists; ``DELETE /api/timers/{id}`` cancels as the
    text ``cancel`` does, and says what happened to a delivered, cancelled or unknown id; nothing else changes."""
    import time

    from metaq.client.local import small_config
    from metaq.timers.limits import MAX_TIMER_LIST
    from tests.harness.broker import consume_all, wait_for
    from tests.harness.timers import put_at_ok, timers

    b = broker_factory(with_http(small_config(tmp_path / "data")))
    year = int(time.time() * 1000) + 365 * 86_400_000
    with b.client() as c:
        far = [put_at_ok(c, "t-later", b"far-%d" % i, "@%d" % (year + i))[0] for i in range(3)]
        other = put_at_ok(c, "t-other", b"other", "@%d" % (year + 9))[0]
        soon = put_at_ok(c, "t-later", b"soon", "+10")[0]
        wait_for(lambda: len(consume_all(c, "t-later", 0)) == 1, 20, "the soon one delivered")
        wait_for(lambda: len(timers(c)) == 4, 20, "indexed")
        listed = request(b, "GET", "/api/timers?topic=t-later")
        assert listed.status == 200, listed
        assert [(t["id"], t["due_ms"], t["topic"]) for t in listed.json()["timers"]] == [
            (far[i], year + i, "t-later") for i in range(3)]
        assert [t["id"] for t in request(b, "GET", "/api/timers?max=2").json()["timers"]] == far[:2]
        assert request(b, "GET", "/api/timers?max=%d" % MAX_TIMER_LIST).status == 200  # the limit
        assert request(b, "GET", "/api/timers?max=%d" % (MAX_TIMER_LIST + 1)).status == 400  # one past
        assert request(b, "GET", "/api/timers?max=0").status == 400
        done = request(b, "DELETE", "/api/timers/%d" % far[1])
        assert (done.status, done.json()) == (200, {"id": far[1], "outcome": "cancelled"})
        for msg_id, word in ((far[1], "cancelled"), (soon, "delivered"), (12345, "unknown")):
            again = request(b, "DELETE", "/api/timers/%d" % msg_id)
            assert (again.status, again.json()["outcome"]) == (404, word), again
        assert request(b, "DELETE", "/api/timers/soon").status == 400
        assert request(b, "DELETE", "/api/timers/%d" % (2**63 - 1)).json()["outcome"] == "unknown"  # the limit
        assert request(b, "DELETE", "/api/timers/%d" % 2**63).status == 400  # one past: a clear 400, not a 500
        assert request(b, "DELETE", "/api/timers/%d" % -2**63).json()["outcome"] == "unknown"
        assert request(b, "DELETE", "/api/timers/%d" % (-2**63 - 1)).status == 400
        assert [r[0] for r in timers(c)] == [far[0], far[2], other]  # only that one cancelled
