"""Issue 16 on the RocketMQ remoting port of a real broker: every request signed as RocketMQ 4's plain ACL signs
it, refusals as RocketMQ's broker gives them (SYSTEM_ERROR, ``org.apache.rocketmq.acl.common.AclException: ...``),
and the same users allowed and refused the same things on the text port and the remoting port.

The raw frames come from ``metaq.client.raw.RemotingClient`` (``credentials=`` signs each request); the official
client's runs are in ``test_remoting_official.py``."""

import time

import pytest

from metaq.auth import limits as auth_limits
from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient, sign_request
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.rocketmq.remoting import RequestCode as R, ResponseCode, encode_command, make_request
from tests.harness.acl import SECRETS, write_acl
from tests.harness.broker import consume_all
from tests.harness.rocketmq import end_tx, send_v1

ACL = "org.apache.rocketmq.acl.common.AclException: "
FAST = {"flush": "async", "flush_interval_ms": 50}


@pytest.fixture
def secured(broker_factory, tmp_path):
    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {}, security={"acl_file": write_acl(tmp_path / "acl.yaml")}, store=FAST)
    return broker_factory(cfg, workdir=wd)


def port(b):
    return b.config["remoting"]["port"]


def as_user(b, user, secret=None):
    return RemotingClient(port(b), credentials=(user, secret or SECRETS[user]))


def stored(b, topic, partitions=(0, 1)):
    """Every payload of ``topic``, read over the text port as the admin."""
    with b.client() as text:
        assert text.auth("admin", SECRETS["admin"]).code == 200
        return sorted(rec.payload for p in partitions for rec in consume_all(text, topic, p))


def refused(r, reason):
    assert r.code == ResponseCode.SYSTEM_ERROR, r
    assert r.remark.startswith(ACL + reason), r.remark


# -- a user with the right key is served -------------------------------------------------------------------


def test_signed_requests_of_a_permitted_user_are_served(secured):
    with as_user(secured, "alice") as rc:
        assert send_v1(rc, "orders", b"one", queue=0).code == ResponseCode.SUCCESS
        r = rc.call(R.PULL_MESSAGE, {"consumerGroup": "billing", "topic": "orders", "queueId": 0, "queueOffset": 0,
                                     "maxMsgNums": 8, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0})
        assert r.code == ResponseCode.SUCCESS and b"one" in r.body
    assert stored(secured, "orders") == [b"one"]


# -- failed authentication: a clear answer, the connection closed, nothing done ---------------------------------


def test_no_access_key_is_refused_and_the_connection_closed(secured):
    with RemotingClient(port(secured)) as rc:
        refused(send_v1(rc, "orders", b"unsigned"), "No accessKey is configured")
        assert rc.is_closed()
    assert stored(secured, "orders") == []


def test_an_unknown_access_key_is_refused_and_the_connection_closed(secured):
    with RemotingClient(port(secured), credentials=("mallory", "guess-0123456789")) as rc:
        refused(send_v1(rc, "orders", b"x"), "Check signature failed for accessKey=mallory")
        assert rc.is_closed()
    assert stored(secured, "orders") == []


def test_a_wrong_secret_or_a_changed_body_fails_the_signature(secured):
    with as_user(secured, "alice", "not-alices-secret") as rc:
        refused(send_v1(rc, "orders", b"x"), "Check signature failed for accessKey=alice")
        assert rc.is_closed()
    ext = {"producerGroup": "PG", "topic": "orders", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
           "queueId": 0, "sysFlag": 0, "bornTimestamp": 1, "flag": 0, "properties": ""}
    signed = sign_request(ext, b"pay 10", "alice", SECRETS["alice"])
    with RemotingClient(port(secured)) as rc:  # a man in the middle changes the body of a signed request
        rc.send_raw(encode_command(make_request(R.SEND_MESSAGE, signed, b"pay 99", opaque=5)))
        refused(rc.response(5), "Check signature failed for accessKey=alice")
        assert rc.is_closed()
    assert stored(secured, "orders") == []
    with as_user(secured, "alice") as rc:  # the broker still serves the right key
        assert send_v1(rc, "orders", b"ok").code == ResponseCode.SUCCESS
    assert stored(secured, "orders") == [b"ok"]


def test_repeated_failures_from_an_address_are_slowed(secured):
    for _ in range(auth_limits.AUTH_FAILURES_BEFORE_DELAY):
        with as_user(secured, "alice", "guess") as rc:
            refused(send_v1(rc, "orders", b"x"), "Check signature failed")
    started = time.monotonic()
    with as_user(secured, "alice", "guess") as rc:
        refused(send_v1(rc, "orders", b"x"), "Check signature failed")
    assert time.monotonic() - started >= auth_limits.AUTH_FAILURE_DELAY_S * 0.9
    started = time.monotonic()
    with as_user(secured, "alice") as rc:  # a right key is not slowed
        assert send_v1(rc, "orders", b"ok").code == ResponseCode.SUCCESS
    assert time.monotonic() - started < auth_limits.AUTH_FAILURE_DELAY_S * 0.5


# -- permissions: refused with RocketMQ's reason, the connection goes on -----------------------------------------


def test_a_topic_the_user_may_not_publish_to_is_refused_and_the_connection_stays(secured):
    with as_user(secured, "bob") as rc:
        refused(send_v1(rc, "payroll", b"x"), "No default permission for topic:payroll (permission denied: user bob "
                                              "may not publish to topic payroll)")
        assert send_v1(rc, "orders", b"fine").code == ResponseCode.SUCCESS  # same connection
    assert stored(secured, "payroll") == [] and stored(secured, "orders") == [b"fine"]


def test_a_group_the_user_may_not_consume_as_is_refused(secured):
    with as_user(secured, "alice") as rc:
        assert send_v1(rc, "orders", b"m", queue=0).code == ResponseCode.SUCCESS
        pull = {"consumerGroup": "audit", "topic": "orders", "queueId": 0, "queueOffset": 0, "maxMsgNums": 8,
                "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0}
        r = rc.call(R.PULL_MESSAGE, pull)
        refused(r, "No default permission for group:audit")
        assert b"m" not in r.body
        refused(rc.call(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "audit", "topic": "orders", "queueId": 0,
                                                   "commitOffset": 1}), "No default permission for group:audit")
        hb = (b'{"clientID":"c1","consumerDataSet":[{"groupName":"audit","subscriptionDataSet":'
              b'[{"topic":"orders","subString":"*"}]}],"producerDataSet":[]}')
        refused(rc.call(R.HEART_BEAT, {}, hb), "No default permission for group:audit")
        assert rc.call(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "audit"}).remark.startswith(ACL)


def test_a_message_of_a_topic_the_user_may_not_read_is_not_shown_nor_copied(secured):
    with as_user(secured, "admin") as rc:
        r = send_v1(rc, "payroll", b"salaries", queue=0)
        assert r.code == ResponseCode.SUCCESS
        offset = int(r.ext_fields["msgId"][16:], 16)  # the offset message id ends with the commit-log position
        assert rc.call(R.VIEW_MESSAGE_BY_ID, {"offset": offset}).code == ResponseCode.SUCCESS
    with as_user(secured, "alice") as rc:
        r = rc.call(R.VIEW_MESSAGE_BY_ID, {"offset": offset})
        refused(r, "No permission to read the message at that offset")
        assert b"salaries" not in r.body and "payroll" not in r.remark  # not even the topic's name
        # a send-back would copy it into alice's own retry topic, where she could read it
        r = rc.call(R.CONSUMER_SEND_MSG_BACK, {"offset": offset, "group": "billing", "delayLevel": 0})
        refused(r, "No permission to read the message at that offset")
        assert "payroll" not in r.remark
    assert stored(secured, "%RETRY%billing", (0,)) == []


def test_admin_codes_need_the_admin_role_and_unknown_codes_a_signature(secured):
    with as_user(secured, "alice") as rc:
        refused(rc.call(17, {"topic": "newtopic"}), "Need admin permission for request code=17, but accessKey=alice "
                                                     "is not")
        assert rc.call(9999).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED  # signed: answered, nothing done
    with as_user(secured, "admin") as rc:
        assert rc.call(17, {"topic": "newtopic"}).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    with RemotingClient(port(secured)) as rc:
        refused(rc.call(9999), "No accessKey is configured")


def test_name_server_requests_are_answered_unsigned_as_rocketmqs_name_server_does(secured):
    with RemotingClient(port(secured)) as rc:
        assert rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).code == ResponseCode.SUCCESS
        assert rc.call(R.GET_BROKER_CLUSTER_INFO).code == ResponseCode.SUCCESS
        refused(send_v1(rc, "orders", b"x"), "No accessKey is configured")  # the broker's requests are not


# -- the same permissions on both protocols -------------------------------------------------------------------


TOPICS = ("orders", "orders-eu", "payroll", "misc")
GROUPS = ("billing", "audit")


def text_outcomes(b, user):
    """{(what, name): allowed} on the text port."""
    out = {}
    with b.client() as c:
        assert c.auth(user, SECRETS[user]).code == 200
        for topic in TOPICS:
            body = b"t-" + user.encode()
            r = c.call(ev.Put(topic, 0, 0, body, c.opaque(), metaq_checksum(body), None))
            out["publish", topic] = r.code != 403
            out["subscribe", topic] = c.call(ev.Offset(topic, "billing", 0, 0, c.opaque())).code != 403
        for group in GROUPS:
            out["group", group] = c.call(ev.QueryOffset(group, "orders", 0, c.opaque())).code != 403
    return out


def remoting_outcomes(b, user):
    out = {}
    with as_user(b, user) as rc:
        def allowed(r):
            assert r.code != ResponseCode.SYSTEM_ERROR or r.remark.startswith(ACL), r
            return not (r.code == ResponseCode.SYSTEM_ERROR and r.remark.startswith(ACL))

        for topic in TOPICS:
            out["publish", topic] = allowed(send_v1(rc, topic, b"r-" + user.encode(), queue=0))
            out["subscribe", topic] = allowed(rc.call(R.GET_MAX_OFFSET, {"topic": topic, "queueId": 0}))
        for group in GROUPS:
            out["group", group] = allowed(rc.call(R.QUERY_CONSUMER_OFFSET, {
                "consumerGroup": group, "topic": "orders", "queueId": 0}))
    return out


def test_the_same_users_get_the_same_answers_on_both_protocols(secured):
    table = {}
    for user in ("admin", "alice", "bob", "reader"):
        text, remoting = text_outcomes(secured, user), remoting_outcomes(secured, user)
        assert text == remoting, user
        table[user] = remoting
    # the table is what the permissions file says (tests/harness/acl.py), not all-allowed or all-refused
    assert all(table["admin"].values())
    assert [t for t in TOPICS if table["alice"]["publish", t]] == ["orders", "orders-eu"]
    assert [t for t in TOPICS if table["bob"]["publish", t]] == ["orders"]
    assert not any(table["bob"]["subscribe", t] for t in TOPICS)
    assert [t for t in TOPICS if table["reader"]["subscribe", t]] == ["orders", "orders-eu", "misc"]
    assert not any(table["reader"]["publish", t] for t in TOPICS)
    assert table["alice"]["group", "billing"] and not table["alice"]["group", "audit"]
    assert table["reader"]["group", "audit"] and not table["bob"]["group", "billing"]


def test_a_half_message_is_ended_only_by_a_user_who_may_publish_to_its_topic(secured):
    with as_user(secured, "alice") as rc, as_user(secured, "reader") as other:
        sent = send_v1(rc, "orders", b"half", queue=0, sys_flag=4, props={"TRAN_MSG": "true", "PGROUP": "PG"})
        assert sent.code == ResponseCode.SUCCESS
        refused(end_tx(other, sent, 8), "No default permission for topic:orders (permission denied: user reader "
                                         "may not publish to topic orders)")
        assert stored(secured, "orders") == []  # still waiting
        assert end_tx(rc, sent, 8).code == ResponseCode.SUCCESS
    assert stored(secured, "orders") == [b"half"]


def test_a_check_back_goes_only_to_a_connection_of_the_user_who_sent_the_half_message(broker_factory, tmp_path):
    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {"transaction_check_interval_ms": 200, "transaction_timeout_ms": 0,
                                   "transaction_check_max": 1000},
                     security={"acl_file": write_acl(tmp_path / "acl.yaml")}, store=FAST)
    b = broker_factory(cfg, workdir=wd)
    body = b'{"clientID": "%s", "producerDataSet": [{"groupName": "PG"}], "consumerDataSet": []}'
    with as_user(b, "bob") as bob, as_user(b, "alice") as alice:
        assert bob.call(R.HEART_BEAT, {}, body % b"bob").code == ResponseCode.SUCCESS  # same group, may publish
        sent = send_v1(alice, "orders", b"alice's half", queue=0, sys_flag=4,
                       props={"TRAN_MSG": "true", "PGROUP": "PG", "UNIQ_KEY": "A1"})
        assert sent.code == ResponseCode.SUCCESS
        deadline = time.monotonic() + 20
        while "no producer of group PG to ask" not in b.log_text():  # a round found bob only: not asked
            assert time.monotonic() < deadline, "no check-back round ran"
            time.sleep(0.05)
        assert alice.call(R.HEART_BEAT, {}, body % b"alice").code == ResponseCode.SUCCESS
        while True:
            cmd = alice.read(20)
            if not cmd.is_response and cmd.code == R.CHECK_TRANSACTION_STATE:
                break
        assert cmd.ext_fields["transactionId"] == "A1"
        assert end_tx(alice, sent, 8).code == ResponseCode.SUCCESS
        bob.sock.settimeout(0.5)
        with pytest.raises(OSError):  # nothing came to bob: no check, no response (a timeout)
            bob.read(0.5)
    assert stored(b, "orders") == [b"alice's half"]
