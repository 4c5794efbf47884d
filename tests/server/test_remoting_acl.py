"""RocketMQ's plain ACL on the remoting port without a network: the signature, which permissions each request code
needs (``metaq.server.remoting.acl.needs``) and the per-request check against a real Guard and permissions file."""

import json

import pytest

from metaq import errors
from metaq.auth import limits as auth_limits
from metaq.auth import proofs
from metaq.client.raw import sign_request
from metaq.protocol.rocketmq.bodies import encode_properties
from metaq.protocol.rocketmq.remoting import RemotingParser, RequestCode as R, encode_command, make_request
from metaq.server.config import load_config
from metaq.server.guard import ADMIN, PUB, SUB, Guard
from metaq.server.remoting.acl import ADMIN_CODES, NAME_SERVER_CODES, RemotingAcl, needs
from tests.harness.acl import SECRETS, write_acl

SECRET = SECRETS["alice"].encode()


# -- the signature ------------------------------------------------------------------------------------------


def test_signature_is_hmac_sha1_of_the_sorted_values_then_the_body():
    # computed apart with: printf 'aliceALIYUNPGordershello' | openssl dgst -sha1 -hmac <secret> -binary | base64
    ext = {"b": "orders", "a": "PG", "OnsChannel": "ALIYUN", "AccessKey": "alice", "Signature": "ignored",
           "_UNIQUE_KEY_QUERY": "true"}
    assert proofs.rocketmq_signature(SECRET, ext, b"hello") == "NGrcRGcUsducSOuks6jJ+caZSqw="
    assert proofs.rocketmq_signature(SECRET, ext) == "IVyaSoSQy/esb+D7KJjhoLRY9tY="  # no body: the fields alone


def test_a_signed_request_survives_the_wire_and_any_change_breaks_it():
    """What the raw client signs is what the broker's parser hands the check: ints and booleans as their text."""
    fields = {"topic": "orders", "queueId": 3, "unitMode": False, "properties": encode_properties({"K": "v"})}
    ext = sign_request(fields, b"body", "alice", SECRETS["alice"])
    parser = RemotingParser()
    parser.receive_data(encode_command(make_request(R.SEND_MESSAGE, ext, b"body", opaque=9)))
    got = parser.next_event()
    assert got.ext_fields["queueId"] == "3" and got.ext_fields["unitMode"] == "false"
    assert proofs.same(got.ext_fields["Signature"], proofs.rocketmq_signature(SECRET, got.ext_fields, got.body))
    changed = dict(got.ext_fields, queueId="2")
    assert not proofs.same(got.ext_fields["Signature"], proofs.rocketmq_signature(SECRET, changed, got.body))
    assert not proofs.same(got.ext_fields["Signature"], proofs.rocketmq_signature(SECRET, got.ext_fields, b"bodz"))


# -- request code -> permissions ------------------------------------------------------------------------------


def req(code, ext=None, body=b""):
    return make_request(code, {k: str(v) for k, v in (ext or {}).items()}, body)


def heartbeat(*consumers):
    return json.dumps({"clientID": "c1", "consumerDataSet": [
        {"groupName": group, "subscriptionDataSet": [{"topic": t, "subString": "*"} for t in topics]}
        for group, topics in consumers], "producerDataSet": [{"groupName": "PG"}]}).encode()


SEND_V1 = {"producerGroup": "PG", "topic": "orders", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
           "queueId": 0, "sysFlag": 0, "bornTimestamp": 1, "flag": 0, "properties": ""}
SEND_V2 = {"a": "PG", "b": "orders", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0, "i": ""}
LOCK = (b'{"clientId":"c1","consumerGroup":"billing","mqSet":[{"brokerName":"b","queueId":0,"topic":"orders"},'
        b'{"brokerName":"b","queueId":1,"topic":"orders"},{"brokerName":"b","queueId":0,"topic":"%RETRY%billing"}]}')
PULL = {"consumerGroup": "billing", "topic": "orders", "queueId": 0, "queueOffset": 0, "maxMsgNums": 1, "sysFlag": 0,
        "commitOffset": 0, "suspendTimeoutMillis": 0}


@pytest.mark.parametrize("cmd, expected", [
    (req(R.SEND_MESSAGE, SEND_V1), [(PUB, "topic", "orders")]),
    (req(R.SEND_MESSAGE_V2, SEND_V2), [(PUB, "topic", "orders")]),
    (req(R.SEND_BATCH_MESSAGE, SEND_V2), [(PUB, "topic", "orders")]),
    # a client re-sending to a retry topic needs the group's permission (RocketMQ: getRetryTopic(group) SUB)
    (req(R.SEND_MESSAGE_V2, dict(SEND_V2, b="%RETRY%billing")), [(SUB, "group", "billing")]),
    (req(R.PULL_MESSAGE, PULL), [(SUB, "topic", "orders"), (SUB, "group", "billing")]),
    (req(R.PULL_MESSAGE, dict(PULL, topic="%RETRY%billing")), [(SUB, "group", "billing")]),
    (req(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": "billing", "topic": "orders", "queueId": 0}),
     [(SUB, "group", "billing"), (SUB, "topic", "orders")]),
    (req(R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "billing", "topic": "orders", "queueId": 0, "commitOffset": 4}),
     [(SUB, "group", "billing"), (SUB, "topic", "orders")]),
    (req(R.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "orders", "queueId": 0, "timestamp": 5}), [(SUB, "topic", "orders")]),
    (req(R.GET_MAX_OFFSET, {"topic": "orders", "queueId": 0}), [(SUB, "topic", "orders")]),
    (req(R.GET_MIN_OFFSET, {"topic": "orders", "queueId": 0}), [(SUB, "topic", "orders")]),
    (req(R.GET_EARLIEST_MSG_STORETIME, {"topic": "orders", "queueId": 0}), [(SUB, "topic", "orders")]),
    (req(R.VIEW_MESSAGE_BY_ID, {"offset": 4096}), [(SUB, "topic", "payroll")]),  # the stored message's topic
    (req(R.CONSUMER_SEND_MSG_BACK, {"offset": 4096, "group": "billing", "delayLevel": 0}),
     [(SUB, "group", "billing"), (SUB, "topic", "payroll")]),
    (req(R.END_TRANSACTION, {"producerGroup": "PG", "tranStateTableOffset": 7, "commitLogOffset": 1,
                             "commitOrRollback": 8, "msgId": "x"}), [(PUB, "topic", "orders")]),
    (req(R.END_TRANSACTION, {"producerGroup": "PG", "tranStateTableOffset": 8, "commitLogOffset": 1,
                             "commitOrRollback": 8, "msgId": "x"}), []),  # no such half message: the handler says so
    (req(R.HEART_BEAT, body=heartbeat(("billing", ["orders", "%RETRY%billing"]), ("audit", ["orders"]))),
     [(SUB, "group", "billing"), (SUB, "topic", "orders"), (SUB, "group", "audit")]),
    (req(R.HEART_BEAT, body=heartbeat()), []),  # a producer's heartbeat
    (req(R.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "billing"}), [(SUB, "group", "billing")]),
    (req(R.UNREGISTER_CLIENT, {"clientID": "c1", "producerGroup": "PG"}), []),
    (req(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "billing"}), [(SUB, "group", "billing")]),
    (req(17, {"topic": "x"}), [(ADMIN, None, None)]),  # UPDATE_AND_CREATE_TOPIC
    (req(215, {"topic": "x"}), [(ADMIN, None, None)]),  # DELETE_TOPIC_IN_BROKER
    (req(R.LOCK_BATCH_MQ, body=LOCK), [(SUB, "group", "billing"), (SUB, "topic", "orders")]),
    (req(R.CHECK_CLIENT_CONFIG, body=b'{"clientId":"c1","group":"billing","subscriptionData":{"topic":"orders",'
                                     b'"subString":"a > 1","expressionType":"SQL92"}}'),
     [(SUB, "group", "billing"), (SUB, "topic", "orders")]),
    (req(R.UNLOCK_BATCH_MQ, body=LOCK), [(SUB, "group", "billing"), (SUB, "topic", "orders")]),
    (req(219), []),  # GET_KV_LIST_BY_NAMESPACE, served by nobody: signature only, then REQUEST_CODE_NOT_SUPPORTED
    # a reply: PUB on the cluster's reply topic, as the text ``reply`` (RocketMQ: a signature only)
    (req(R.SEND_REPLY_MESSAGE, SEND_V1), [(PUB, "topic", "DefaultCluster_REPLY_TOPIC")]),
    (req(R.SEND_REPLY_MESSAGE_V2, SEND_V2), [(PUB, "topic", "DefaultCluster_REPLY_TOPIC")]),
])
def test_each_request_code_needs_its_permissions(cmd, expected):
    got = needs(cmd, record_topic=lambda offset: {4096: "payroll"}[offset], half_topic={7: "orders"}.get,
                reply_topic="DefaultCluster_REPLY_TOPIC")
    assert got == expected


def test_admin_codes_are_rocketmqs_and_the_acl_configuration():
    assert {17, 25, 200, 207, 215} <= ADMIN_CODES  # Permission.ADMIN_CODE of RocketMQ 4.9
    assert {50, 51, 52, 53} <= ADMIN_CODES
    assert NAME_SERVER_CODES == {R.GET_ROUTEINFO_BY_TOPIC, R.GET_BROKER_CLUSTER_INFO}


def test_a_heartbeat_naming_too_many_groups_is_refused_not_checked_one_by_one():
    many = [("g%d" % i, []) for i in range(auth_limits.MAX_ACL_RESOURCES_PER_REQUEST + 1)]
    with pytest.raises(errors.ClientError, match="MAX_ACL_RESOURCES_PER_REQUEST"):
        needs(req(R.HEART_BEAT, body=heartbeat(*many)))
    # duplicates count once: a heartbeat repeating one group many times is fine
    assert needs(req(R.HEART_BEAT, body=heartbeat(*[("billing", ["orders"])] * 5000))) == [
        (SUB, "group", "billing"), (SUB, "topic", "orders")]


def test_a_malformed_header_is_a_client_error():
    with pytest.raises(errors.RemoteProtocolError, match="missing header field topic"):
        needs(req(R.PULL_MESSAGE, {"consumerGroup": "billing"}))


# -- the check, with a real Guard ------------------------------------------------------------------------------


class Conn:
    def __init__(self, guard, host="127.0.0.1"):
        self.session = guard.session(host)
        self.peer = host + ":1"


@pytest.fixture
def acl(tmp_path):
    guard = Guard(load_config(None, {"security.acl_file": write_acl(tmp_path / "acl.yaml")}).security)
    return RemotingAcl(guard, store=None, half_topic=lambda number: None)


def signed(code, ext, user, secret=None, body=b""):
    return make_request(code, sign_request(ext, body, user, secret or SECRETS[user]), body)


def test_a_signed_request_of_a_permitted_user_passes_and_marks_the_session(acl):
    conn = Conn(acl.guard)
    assert acl.check(signed(R.SEND_MESSAGE, SEND_V1, "alice"), conn) == "alice"
    assert conn.session.user == "alice"
    assert acl.check(signed(R.PULL_MESSAGE, PULL, "reader"), conn) == "reader"  # one connection, several users
    assert conn.session.user == "reader"


@pytest.mark.parametrize("cmd, error, text", [
    (make_request(R.SEND_MESSAGE, {k: str(v) for k, v in SEND_V1.items()}), errors.Unauthenticated,
     "No accessKey is configured"),
    (make_request(R.SEND_MESSAGE, {"AccessKey": "", "Signature": "x"}), errors.Unauthenticated,
     "No accessKey is configured"),
    (signed(R.SEND_MESSAGE, SEND_V1, "mallory", "whatever"), errors.Unauthenticated,
     "Check signature failed for accessKey=mallory"),
    (signed(R.SEND_MESSAGE, SEND_V1, "alice", "wrong"), errors.Unauthenticated,
     "Check signature failed for accessKey=alice"),
    (signed(R.SEND_MESSAGE, dict(SEND_V1, topic="payroll"), "alice"), errors.Forbidden,
     "No default permission for topic:payroll (permission denied: user alice may not publish to topic payroll)"),
    (signed(R.PULL_MESSAGE, dict(PULL, consumerGroup="audit"), "alice"), errors.Forbidden,
     "No default permission for group:audit"),
    (signed(R.PULL_MESSAGE, PULL, "bob"), errors.Forbidden, "No default permission for topic:orders"),
    (signed(17, {"topic": "x"}, "alice"), errors.Forbidden,
     "Need admin permission for request code=17, but accessKey=alice is not"),
])
def test_each_refusal_has_rocketmqs_reason(acl, cmd, error, text):
    with pytest.raises(error) as info:
        acl.check(cmd, Conn(acl.guard))
    assert str(info.value).startswith(text)


def test_a_tampered_body_fails_the_signature(acl):
    good = signed(R.SEND_MESSAGE, SEND_V1, "alice", body=b"pay 10")
    bad = make_request(R.SEND_MESSAGE, good.ext_fields, b"pay 99")
    with pytest.raises(errors.Unauthenticated, match="Check signature failed"):
        acl.check(bad, Conn(acl.guard))


def test_name_server_requests_need_no_signature_and_admins_pass_admin_codes(acl):
    conn = Conn(acl.guard)
    assert acl.check(make_request(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "payroll"}), conn) is None
    assert acl.check(make_request(R.GET_BROKER_CLUSTER_INFO), conn) is None
    assert acl.check(signed(17, {"topic": "x"}, "admin"), conn) == "admin"


def test_failed_signatures_count_towards_the_guards_back_off(acl):
    conn = Conn(acl.guard, "10.9.9.9")
    for _ in range(auth_limits.AUTH_FAILURES_BEFORE_DELAY - 1):
        with pytest.raises(errors.Unauthenticated):
            acl.check(signed(R.SEND_MESSAGE, SEND_V1, "alice", "wrong"), conn)
    # the next failure from that address is the one that starts the delay
    assert acl.guard.failed("10.9.9.9") == 0.0
    assert acl.guard.failed("10.9.9.9") == auth_limits.AUTH_FAILURE_DELAY_S
    assert acl.refused == auth_limits.AUTH_FAILURES_BEFORE_DELAY - 1


def test_a_user_limited_to_other_addresses_is_refused(tmp_path):
    users = {"alice": {"secret": SECRETS["alice"], "allow": ["10.1.0.0/16"], "default_topic": "pub|sub"}}
    guard = Guard(load_config(None, {"security.acl_file": write_acl(tmp_path / "acl.yaml", users=users)}).security)
    acl = RemotingAcl(guard, None, lambda n: None)
    with pytest.raises(errors.Unauthenticated, match="user alice may not connect from 127.0.0.1"):
        acl.check(signed(R.SEND_MESSAGE, SEND_V1, "alice"), Conn(guard))
    assert acl.check(signed(R.SEND_MESSAGE, SEND_V1, "alice"), Conn(guard, "10.1.2.3")) == "alice"
