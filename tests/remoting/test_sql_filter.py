"""SQL92 filters in the broker (docs/messaging.md "SQL92 filters"), against a real broker process: a RocketMQ
remoting pull with an ``SQL92`` subscription, in the pull or registered by the group's heartbeat; a bad
expression answered with RocketMQ's code and the position; the scan bounded by ``limits.MAX_SQL_FILTER_SCAN``;
CHECK_CLIENT_CONFIG; the text ``get_sql``."""

import json
import socket
import threading
import time

import pytest

from metaq.filters import limits as filters_limits
from metaq.client import Consumer
from metaq.errors import BadFilterExpression, ClientError
from metaq.client.raw import PULL_FLAGS
from metaq.filters.wire import decode_tagged_body
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.headers import PULL_SUBSCRIPTION
from metaq.protocol.properties import encode_attribute
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from metaq.protocol.text import serialize
from tests.harness.broker import url_of
from tests.harness.rocketmq import pull, send_v1

REGIONS = ("eu", "us", "ap")


def put_with_properties(port, topic, partition, props_list, tags="T"):
    """Put one message per properties dict (a RocketMQ attribute: tags, \\x02, the properties), pipelined."""
    frames = []
    for i, props in enumerate(props_list):
        flag, data = encode_payload(b"m%d" % i, encode_attribute(tags, props))
        frames.append(serialize(ev.Put(topic, partition, flag, data, i, metaq_checksum(data))))
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"".join(frames))
        got = b""
        while got.count(b"result 200 ") < len(frames):
            chunk = s.recv(1 << 20)
            assert chunk, "the broker closed the connection"
            got += chunk
            assert b"result 4" not in got and b"result 5" not in got, got[-300:]


def sql_pull(rc, topic, queue, offset, expression, **fields):
    return pull(rc, topic, queue, offset, sub=expression, expression="SQL92", **fields)


def offsets(r):
    assert r.code == C.SUCCESS, (r.code, r.remark)
    return [m.queue_offset for m in decode_stored_messages(r.body)]


def heartbeat(rc, group, topic, expression, expression_type="SQL92"):
    body = json.dumps({"clientID": "10.0.0.9@sql", "consumerDataSet": [{
        "groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0, "unitMode": False,
        "subscriptionDataSet": [{"topic": topic, "subString": expression, "subVersion": 1,
                                 "expressionType": expression_type, "classFilterMode": False}]}]}).encode()
    return rc.call(R.HEART_BEAT, body=body)


def test_a_pull_with_a_sql92_subscription_gets_only_the_matching_messages(rmq_broker, rc):
    put_with_properties(rmq_broker.port, "sq1", 0, [{"a": str(i), "region": REGIONS[i % 3]} for i in range(30)])
    send_v1(rc, "sq1", b"sent", props={"TAGS": "TagA", "a": "4", "region": "eu"})  # offset 30, over remoting
    r = sql_pull(rc, "sq1", 0, 0, "a BETWEEN 3 AND 12 AND region = 'eu'")
    assert offsets(r) == [3, 6, 9, 12, 30]
    assert int(r.ext_fields["nextBeginOffset"]) == 31
    msgs = decode_stored_messages(r.body)
    assert msgs[-1].body == b"sent" and msgs[-1].properties["TAGS"] == "TagA"
    assert offsets(sql_pull(rc, "sq1", 0, 0, "TAGS IN ('TagA') AND a > 3")) == [30]
    assert offsets(sql_pull(rc, "sq1", 0, 0, "region <> 'eu' AND a < 3")) == [1, 2]
    # three-valued: no message has b, so neither b = 1 nor NOT (b = 1) matches; b IS NULL matches all
    assert sql_pull(rc, "sq1", 0, 0, "b = 1 OR NOT (b = 1)").code == C.PULL_NOT_FOUND
    assert len(offsets(sql_pull(rc, "sq1", 0, 0, "b IS NULL", max_nums=100))) == 31


def test_max_nums_stops_right_after_the_last_match(rmq_broker, rc):
    put_with_properties(rmq_broker.port, "sq2", 1, [{"a": str(i)} for i in range(20)])
    r = sql_pull(rc, "sq2", 1, 0, "a >= 5", max_nums=3)
    assert offsets(r) == [5, 6, 7] and int(r.ext_fields["nextBeginOffset"]) == 8
    r = sql_pull(rc, "sq2", 1, 8, "a >= 5", max_nums=3)
    assert offsets(r) == [8, 9, 10]
    r = sql_pull(rc, "sq2", 1, 0, "a > 100")  # nothing wanted up to the end: the end is the next offset
    assert r.code == C.PULL_NOT_FOUND and int(r.ext_fields["nextBeginOffset"]) == 20


@pytest.mark.parametrize("expression, position", [
    ("a >", 3), ("a = 1 AND", 9), ("a > 'x'", 4), ("a IN (1)", 6), ("", 0), ("(" * 40 + "a = 1" + ")" * 40, 32),
])
def test_a_bad_expression_is_subscription_parse_failed_naming_the_position(rmq_broker, rc, expression, position):
    put_with_properties(rmq_broker.port, "sq3", 0, [{"a": "1"}])
    r = sql_pull(rc, "sq3", 0, 0, expression)
    assert r.code == C.SUBSCRIPTION_PARSE_FAILED
    assert "at character %d" % position in r.remark
    assert offsets(sql_pull(rc, "sq3", 0, 0, "a = 1")) == [0]  # the connection goes on


def test_the_expression_length_limit_at_and_past(rmq_broker, rc):
    put_with_properties(rmq_broker.port, "sq4", 0, [{"a": "1"}])
    pad = filters_limits.MAX_SQL_FILTER_CHARS - len("a = 1 ")
    at = "a = 1 " + " " * pad
    assert offsets(sql_pull(rc, "sq4", 0, 0, at)) == [0]
    r = sql_pull(rc, "sq4", 0, 0, at + " ")
    assert (r.code == C.SUBSCRIPTION_PARSE_FAILED
            and "at most %d characters" % filters_limits.MAX_SQL_FILTER_CHARS in r.remark)


def test_a_push_consumer_pull_uses_the_heartbeat_expression(rmq_broker, rc):
    """The official push consumer sends its subscription in heartbeats, not in its pulls (no SUBSCRIPTION flag):
    the broker filters by the group's registered expression, and a heartbeat changing it changes the filter."""
    put_with_properties(rmq_broker.port, "sq5", 0, [{"a": str(i)} for i in range(10)])
    no_sub = PULL_FLAGS & ~PULL_SUBSCRIPTION
    r = sql_pull(rc, "sq5", 0, 0, "", group="G5", sys_flag=no_sub)  # no heartbeat yet
    assert r.code == C.FILTER_DATA_NOT_EXIST
    assert heartbeat(rc, "G5", "sq5", "a >= 8").code == C.SUCCESS
    assert offsets(sql_pull(rc, "sq5", 0, 0, "", group="G5", sys_flag=no_sub)) == [8, 9]
    assert heartbeat(rc, "G5", "sq5", "a < 2").code == C.SUCCESS
    assert offsets(sql_pull(rc, "sq5", 0, 0, "", group="G5", sys_flag=no_sub)) == [0, 1]
    # a bad expression in a heartbeat: the heartbeat succeeds (as RocketMQ's), the pulls say why
    assert heartbeat(rc, "G5", "sq5", "a <").code == C.SUCCESS
    r = sql_pull(rc, "sq5", 0, 0, "", group="G5", sys_flag=no_sub)
    assert r.code == C.FILTER_DATA_NOT_EXIST and "at character 3" in r.remark
    # back to a TAG subscription: the SQL92 entry is gone
    assert heartbeat(rc, "G5", "sq5", "*", "TAG").code == C.SUCCESS
    assert sql_pull(rc, "sq5", 0, 0, "", group="G5", sys_flag=no_sub).code == C.FILTER_DATA_NOT_EXIST


def test_an_unknown_expression_type_is_refused(rmq_broker, rc):
    r = pull(rc, "sq6", 0, 0, sub="x", expression="CLASS")
    assert r.code == C.SYSTEM_ERROR and "CLASS" in r.remark


@pytest.mark.slow
def test_a_pull_evaluates_at_most_the_scan_limit(rmq_broker, rc):
    limit = filters_limits.MAX_SQL_FILTER_SCAN
    put_with_properties(rmq_broker.port, "sq7", 0, [{"a": "0"}] * limit + [{"a": "1"}])
    # from offset 1 the wanted record is the limit-th one evaluated: found in one pull
    assert offsets(sql_pull(rc, "sq7", 0, 1, "a = 1", max_nums=1)) == [limit]
    # from offset 0 it is one past this pull's scan: RETRY_IMMEDIATELY past exactly `limit` records, then found
    r = sql_pull(rc, "sq7", 0, 0, "a = 1", max_nums=1)
    assert r.code == C.PULL_RETRY_IMMEDIATELY and int(r.ext_fields["nextBeginOffset"]) == limit
    assert offsets(sql_pull(rc, "sq7", 0, limit, "a = 1")) == [limit]


def check_client(rc, expression, expression_type="SQL92", group="G8", topic="sq8"):
    body = json.dumps({"clientId": "10.0.0.9@sql", "group": group, "subscriptionData": {
        "topic": topic, "subString": expression, "expressionType": expression_type, "subVersion": 1}}).encode()
    return rc.call(R.CHECK_CLIENT_CONFIG, body=body)


def test_check_client_config_says_whether_the_subscription_is_taken(rmq_broker, rc):
    """The Java push consumer asks before it starts with an SQL92 subscription; a refusal stops it."""
    assert check_client(rc, "a > 1 AND TAGS IN ('A')").code == C.SUCCESS
    assert check_client(rc, "A || B", "TAG").code == C.SUCCESS
    r = check_client(rc, "a > 1 AND")
    assert r.code == C.SUBSCRIPTION_PARSE_FAILED and "at character 9" in r.remark
    assert check_client(rc, "x", "CLASS_FILTER").code == C.SYSTEM_ERROR
    assert rc.call(R.CHECK_CLIENT_CONFIG, body=b"{}").code != C.SUCCESS  # no subscription: a bad field
    assert check_client(rc, "a = 1").code == C.SUCCESS  # the connection goes on


# -- the text protocol: get_sql ------------------------------------------------------------------------------------

def test_text_get_sql(broker):
    put_with_properties(broker.port, "sqt", 0, [{"a": str(i), "region": REGIONS[i % 3]} for i in range(12)])
    with broker.client() as c:
        r = c.get_sql("sqt", 0, 0, "a >= 3 AND region IN ('eu', 'ap')")
        assert isinstance(r, ev.Value)
        nxt, records = decode_tagged_body(r.body)
        assert nxt == 12 and [o for o, _rec in records] == [3, 5, 6, 8, 9, 11]
        assert all(rec.data.endswith(b"m%d" % o) for o, rec in records)
        # maxSize bounds the bytes read, wanted or not: small reads follow their next offset to the same records
        offset, seen = 0, []
        while offset < 12:
            nxt, records = decode_tagged_body(c.get_sql("sqt", 0, offset, "a >= 3", max_size=150).body)
            assert nxt > offset and len(records) <= 2
            seen += [o for o, _rec in records]
            offset = nxt
        assert seen == list(range(3, 12))
        r = c.get_sql("sqt", 0, 0, "zz = 1")  # nothing wanted up to the end: none, and where to go on
        assert isinstance(r, ev.Value) and decode_tagged_body(r.body) == (12, [])
        r = c.get_sql("sqt", 0, 12, "a = 1")  # at the end
        assert isinstance(r, ev.Result) and r.code == 404
        r = c.get_sql("sqt", 0, 0, "a = 1 AND (region = 'eu'")  # a bad expression: 400 naming the position
        assert isinstance(r, ev.Result) and r.code == 400 and b"at character 24" in r.body
        assert isinstance(c.get_sql("sqt", 0, 0, "a = 1"), ev.Value)  # the connection goes on
        # a long poll past unwanted records: woken by them, it waits on from past them, then answers a wanted one
        done = {}
        t = threading.Thread(target=lambda: done.setdefault(
            "r", c.get_sql("sqt", 0, 12, "region = 'us' AND a > 100", max_wait_ms=20000)))
        t.start()
        put_with_properties(broker.port, "sqt", 0, [{"a": "500", "region": "eu"}, {"a": "501", "region": "us"}])
        t.join(30)
        nxt, records = decode_tagged_body(done["r"].body)
        assert nxt == 14 and [o for o, _rec in records] == [13]


def test_text_get_sql_evaluates_at_most_the_scan_limit(broker):
    n = filters_limits.MAX_SQL_FILTER_SCAN
    put_with_properties(broker.port, "sqs", 0, [{"a": "0"}] * n + [{"a": "1"}])
    with broker.client() as c:
        r = c.get_sql("sqs", 0, 0, "a = 1")
        assert isinstance(r, ev.Value) and decode_tagged_body(r.body) == (n, [])
        nxt, records = decode_tagged_body(c.get_sql("sqs", 0, n, "a = 1").body)
        assert nxt == n + 1 and [o for o, _rec in records] == [n]


# -- the metaq consumer: subscribe(..., sql=...) --------------------------------------------------------------------

def test_metaq_consumer_with_a_sql92_subscription(broker):
    put_with_properties(broker.port, "sqc", 0, [{"a": str(i), "region": REGIONS[i % 3]} for i in range(60)])
    got, lock, done = [], threading.Lock(), threading.Event()

    def handle(message):
        with lock:
            got.append((message.offset, message.attribute, message.properties["a"]))
            if len(got) == 10:
                done.set()

    consumer = Consumer("CGsql", brokers=[url_of(broker)], long_poll_ms=500)
    consumer.subscribe("sqc", handle, sql="region = 'eu' AND a BETWEEN 20 AND 50 AND TAGS = 'T'")
    consumer.start()
    try:
        assert done.wait(30)
        time.sleep(0.3)  # nothing more comes
    finally:
        consumer.close()
    assert sorted(o for o, _t, _a in got) == [i for i in range(20, 51) if i % 3 == 0]
    assert all(t == "T" and a == str(o) for o, t, a in got)


def test_a_bad_sql92_subscription_is_refused_at_subscribe(broker):
    consumer = Consumer("CGbad", brokers=[url_of(broker)])
    with pytest.raises(BadFilterExpression, match="at character 8") as info:
        consumer.subscribe("sqc", print, sql="a = 1 OR")
    assert info.value.position == 8
    with pytest.raises(ClientError, match="not both"):
        consumer.subscribe("sqc", print, filter="T", sql="a = 1")
    consumer.close()


def test_a_heartbeat_past_the_sql_subscription_limit_is_refused_whole(rmq_broker, rc):
    n = filters_limits.MAX_HEARTBEAT_SQL_SUBSCRIPTIONS

    def body(count):
        return json.dumps({"clientID": "10.0.0.9@many", "consumerDataSet": [{
            "groupName": "GM%d" % i, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0,
            "subscriptionDataSet": [{"topic": "sqm", "subString": "a = 1", "expressionType": "SQL92"}]}
            for i in range(count)]}).encode()

    no_sub = PULL_FLAGS & ~PULL_SUBSCRIPTION
    r = rc.call(R.HEART_BEAT, body=body(n + 1))
    assert r.code == C.INVALID_PARAMETER and "at most %d SQL92 subscriptions" % n in r.remark
    assert sql_pull(rc, "sqm", 0, 0, "", group="GM0", sys_flag=no_sub).code == C.FILTER_DATA_NOT_EXIST
    assert rc.call(R.HEART_BEAT, body=body(n)).code == C.SUCCESS
    put_with_properties(rmq_broker.port, "sqm", 0, [{"a": "0"}, {"a": "1"}])
    assert offsets(sql_pull(rc, "sqm", 0, 0, "", group="GM%d" % (n - 1), sys_flag=no_sub)) == [1]


def test_get_sql_sees_a_plain_attribute_as_tags_and_no_attribute_as_none(broker):
    frames = []
    for i, attribute in enumerate(["plain", None, "x\x02k\x01v", "\x02k\x01w"]):
        flag, data = encode_payload(b"b%d" % i, attribute)
        frames.append(serialize(ev.Put("sqa", 0, flag, data, i, metaq_checksum(data))))
    with socket.create_connection(("127.0.0.1", broker.port)) as s:
        s.sendall(b"".join(frames))
        got = b""
        while got.count(b"result 200 ") < len(frames):
            chunk = s.recv(1 << 16)
            assert chunk
            got += chunk
    with broker.client() as c:
        def matching(expression):
            return [o for o, _rec in decode_tagged_body(c.get_sql("sqa", 0, 0, expression).body)[1]]
        assert matching("TAGS = 'plain'") == [0]
        assert matching("TAGS IS NULL") == [1, 3]
        assert matching("k IS NOT NULL") == [2, 3] and matching("TAGS = 'x' AND k = 'v'") == [2]
