"""A group's retry and dead-letter topics (``%RETRY%<g>``, ``%DLQ%<g>``, and ``%RESENT%<g>``) hold copies of the
messages of every topic the group consumed (README "Security"): a user denied a topic must not read its messages
there, nor plant messages there that an admin's ``dlq resend`` then writes into a topic that user may not publish
to. Real broker, authentication on, the default users of tests/harness/acl.py: ``reader`` reads every topic but
payroll as any group, ``alice`` publishes and reads ``orders*``, ``admin`` plays the payroll service."""

import json
import time

from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient, pull_fields, sign_request
from metaq.protocol import events as ev
from metaq.admin.wire import DlqResend
from metaq.protocol.rocketmq.bodies import decode_stored_messages, encode_properties, parse_offset_msg_id
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode, encode_command, make_request
from tests.harness.acl import SECRETS, login, write_acl
from tests.harness.broker import wait_for
from tests.harness.http import request, with_http
from tests.harness.rocketmq import pull, send_v1

SECRET = b"salary of the CEO: 1,000,000"


def start(broker_factory, tmp_path):
    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {"send_back_delay_level": 1},
                     security={"acl_file": write_acl(tmp_path / "acl.yaml"), "acl_reload_s": 0.2},
                     store={"flush": "async", "flush_interval_ms": 50})
    return broker_factory(with_http(cfg), workdir=wd)


def remoting(b, user):
    return RemotingClient(b.config["remoting"]["port"], credentials=(user, SECRETS[user]))


def sent_back(rc, topic, body, group, delay_level, props=None):
    """``body`` sent to ``topic`` queue 0, then sent back by ``group`` (-1: straight to its dead letters)."""
    sent = send_v1(rc, topic, body, props=props)
    assert sent.code == ResponseCode.SUCCESS, sent
    back = {"offset": parse_offset_msg_id(sent.ext_fields["msgId"])[2], "group": group, "delayLevel": delay_level,
            "originMsgId": sent.ext_fields["msgId"], "originTopic": topic, "maxReconsumeTimes": 16}
    r = rc.call(R.CONSUMER_SEND_MSG_BACK, back)
    assert r.code == ResponseCode.SUCCESS, r


def refused(r, resource):
    """A remoting refusal for want of a permission on ``resource`` (RocketMQ's AclException, as remark)."""
    return r.code == ResponseCode.SYSTEM_ERROR and "No default permission for %s " % resource in (r.remark or "")


def pulled(rc, topic, group):
    """Every body pulls of ``topic`` (a group's: one queue) as ``group`` serve from offset 0 (a refusal fails)."""
    bodies, offset = [], 0
    while True:
        r = pull(rc, topic, 0, offset, group=group)
        assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY), (
            topic, r.code, r.remark)
        if r.code == ResponseCode.PULL_NOT_FOUND:
            return bodies
        if r.code == ResponseCode.SUCCESS:
            bodies += [m.body for m in decode_stored_messages(r.body)]
        offset = int(r.ext_fields["nextBeginOffset"])


def test_a_groups_copies_of_a_denied_topic_are_not_served_to_who_may_not_read_it(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    with remoting(b, "admin") as admin:
        sent_back(admin, "payroll", SECRET, "payclerks", -1)  # a dead letter of payroll
        sent_back(admin, "payroll", SECRET + b" (retried)", "payclerks", 1)  # a retry of payroll, in 1 s
        sent_back(admin, "orders", b"order 7 (retried)", "payclerks", 1)  # and of orders, which reader may read
    with remoting(b, "admin") as admin:  # delay level 1 is 1 s: both retries reach %RETRY%payclerks after it
        wait_for(lambda: len(pulled(admin, "%RETRY%payclerks", "payclerks")) == 2, what="both retries delivered")
        assert SECRET + b" (retried)" in pulled(admin, "%RETRY%payclerks", "payclerks")  # the group's own consumer
        assert SECRET in pulled(admin, "%DLQ%payclerks", "payclerks")
    with login(b, "reader") as reader:
        assert reader.get("payroll", 0, 0).code == 403
        for topic in ("%DLQ%payclerks", "%RETRY%payclerks", "%RESENT%payclerks"):
            r = reader.get(topic, 0, 0)
            assert isinstance(r, ev.Result) and r.code == 403, (topic, r)
            assert b"holds copies of messages of the topics its group consumed" in r.body
    r = request(b, "GET", "/api/topics/%25DLQ%25payclerks/partitions/0/messages?offset=0", user="reader",
                secret=SECRETS["reader"])
    assert r.status == 403, (r.status, r.text)
    with remoting(b, "reader") as rc:
        r = pull(rc, "%DLQ%payclerks", 0, 0, group="payclerks")
        assert refused(r, "topic:%DLQ%payclerks"), (r.code, r.remark)
        # the group's retry topic is pulled as the group (RocketMQ's rule), but only copies of topics reader may
        # read are served: order 7, not payroll's
        bodies = pulled(rc, "%RETRY%payclerks", "payclerks")
        assert bodies == [b"order 7 (retried)"], bodies
        # by key or by position the copies are an admin's (nothing there passes them over)
        r = rc.call(R.QUERY_MESSAGE, {"topic": "%RETRY%payclerks", "key": "k", "maxNum": 32, "beginTimestamp": 0,
                                      "endTimestamp": 2 ** 62})
        assert r.code == ResponseCode.SYSTEM_ERROR and "Need admin permission" in r.remark, (r.code, r.remark)
    with remoting(b, "admin") as admin:
        r = pull(admin, "%RETRY%payclerks", 0, 0, group="payclerks")
        retried = decode_stored_messages(r.body)[0]
    with remoting(b, "reader") as rc:
        r = rc.call(R.VIEW_MESSAGE_BY_ID, {"offset": retried.physical_offset})
        assert r.code == ResponseCode.SYSTEM_ERROR and "No permission to read the message at that offset" in r.remark
        assert "payclerks" not in r.remark, r.remark
        # a pull is filtered as the user who signed it, even when another user's request follows it on the
        # connection before it runs (a pull runs in a greenlet of its own)
        frames = b""
        for user, code, fields in (("reader", R.PULL_MESSAGE, pull_fields("%RETRY%payclerks", 0, 0, group="payclerks")),
                                   ("admin", R.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0})):
            fields = sign_request(fields, b"", user, SECRETS[user])
            frames += encode_command(make_request(code, fields, b"", 900 + len(frames), False, "CPP", 63))
        rc.send_raw(frames)
        first = rc.response(900)
        assert first.code == ResponseCode.SUCCESS, (first.code, first.remark)
        assert [m.body for m in decode_stored_messages(first.body)] == [b"order 7 (retried)"]


def test_a_planted_dead_letter_cannot_be_resent_into_a_topic_its_sender_may_not_write(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    with remoting(b, "reader") as rc:
        # a consumer's own re-send to its group's retry topic names the topic it read the message from
        r = send_v1(rc, "%RETRY%payclerks", b"FORGED: pay mallory", props={"RETRY_TOPIC": "payroll"})
        assert refused(r, "topic:payroll"), (r.code, r.remark)  # reader may not read payroll
        r = send_v1(rc, "%DLQ%payclerks", b"FORGED: pay mallory", props={"RETRY_TOPIC": "payroll"})
        assert refused(r, "topic:%DLQ%payclerks"), (r.code, r.remark)
        # nor through a topic it may read but not write: its own reconsumeTimes would send it to the dead letters
        forged = {"producerGroup": "PG", "topic": "%RETRY%payclerks", "defaultTopic": "TBW102",
                  "defaultTopicQueueNums": 1, "queueId": 0, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000),
                  "flag": 0, "properties": encode_properties({"RETRY_TOPIC": "weather"}), "reconsumeTimes": 16,
                  "maxReconsumeTimes": 16, "unitMode": "false"}
        r = rc.call(R.SEND_MESSAGE, forged, b"FORGED: storm warning")
        assert refused(r, "topic:weather"), (r.code, r.remark)
    with remoting(b, "alice") as rc:
        # alice writes to orders a message claiming it came from payroll, then sends it back: the dead letter's
        # RETRY_TOPIC is the topic it was read from, orders
        sent_back(rc, "orders", b"FORGED by alice", "billing", -1, props={"RETRY_TOPIC": "payroll"})
    with login(b, "admin") as admin:
        r = admin.call(DlqResend("billing", None, admin.opaque()))
        assert r.code == 200, r
        resent = json.loads(r.body)["resent"]
        assert [x["topic"] for x in resent] == ["orders"], resent
        assert not any(isinstance(admin.get("payroll", p, 0), ev.Value) for p in range(4))  # nothing written there
    with login(b, "alice") as alice:
        r = alice.call(ev.Put("%RETRY%billing", 0, 0, b"x", 1, -1, None))
        assert r.code == 403 and b"holds copies" in r.body, r


def test_a_topic_list_names_only_the_topics_its_user_may_publish_to_or_read(broker_factory, tmp_path):
    from metaq.topics.wire import TopicCommand

    b = start(broker_factory, tmp_path)
    with remoting(b, "admin") as admin:
        sent_back(admin, "payroll", SECRET, "payclerks", -1)
        assert send_v1(admin, "orders", b"o").code == ResponseCode.SUCCESS
        assert send_v1(admin, "weather", b"w").code == ResponseCode.SUCCESS
    for user, sees, hidden in (("admin", {"payroll", "orders", "weather", "%DLQ%payclerks"}, set()),
                               ("bob", {"orders"}, {"payroll", "weather", "%DLQ%payclerks"}),  # pub orders only
                               ("reader", {"orders", "weather"}, {"payroll", "%DLQ%payclerks"})):
        with login(b, user) as c:
            r = c.call(TopicCommand("list", None, (), c.opaque()))
            assert r.code == 200, r
            names = {t["name"] for t in json.loads(r.body)}
        r = request(b, "GET", "/api/topic-table", user=user, secret=SECRETS[user])
        assert r.status == 200, r.text
        assert {t["name"] for t in r.json()["topics"]} == names, user  # the same on both ports
        assert sees <= names and not hidden & names, (user, sorted(names))
