"""Request-reply on the remoting port against real brokers (README "Request-reply"), our codec acting as the
RocketMQ requester (heartbeat as a producer, a send carrying CORRELATION_ID and REPLY_TO_CLIENT, the reply
pushed as PUSH_REPLY_MESSAGE_TO_CLIENT) and as the replier (SEND_REPLY_MESSAGE 324 / _V2 325); across protocols
with the metaq client; a requester gone; a handler that raised."""

import json
import threading
import time

import pytest

from metaq import errors
from metaq.client import Consumer, Message, Producer
from metaq.client.raw import RemotingClient
from metaq.reqreply.records import REPLY_ERROR, reply_properties
from metaq.protocol.rocketmq.bodies import decode_properties, decode_stored_messages, encode_properties
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from metaq.protocol.stream import CLOSED
from tests.harness.rocketmq import pull, send_v1


def rport(broker):
    return broker.config["remoting"]["port"]


def heartbeat(rc, client_id, group="RPG"):
    body = json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": group},
                                                                   {"groupName": "CLIENT_INNER_PRODUCER"}],
                       "consumerDataSet": []}).encode()
    assert rc.call(R.HEART_BEAT, {}, body).code == C.SUCCESS


def send_request(rc, topic, body, correlation_id, client_id, queue=0):
    sent = send_v1(rc, topic, body, queue=queue, props={"CORRELATION_ID": correlation_id, "REPLY_TO_CLIENT": client_id,
                                                        "TTL": "30000", "TAGS": "ask"})
    assert sent.code == C.SUCCESS, sent.remark
    return sent


def pulled(rc, topic, queue=0, offset=0):
    for _ in range(12):  # long polls, for as long as a loaded machine may need
        r = pull(rc, topic, queue, offset, suspend_ms=5000)
        if r.code == C.SUCCESS:
            return decode_stored_messages(r.body)
    raise AssertionError("nothing to pull from %s-%d" % (topic, queue))


def send_reply(rc, request_props, body, code=R.SEND_REPLY_MESSAGE, topic="DefaultCluster_REPLY_TOPIC", extra=None):
    props = dict(reply_properties(request_props), **(extra or {}))
    fields = {"producerGroup": "REPLIER", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
              "queueId": 0, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0,
              "properties": encode_properties(props), "reconsumeTimes": 0, "unitMode": "false"}
    if code == R.SEND_REPLY_MESSAGE_V2:
        keys = dict(producerGroup="a", topic="b", defaultTopic="c", defaultTopicQueueNums="d", queueId="e",
                    sysFlag="f", bornTimestamp="g", flag="h", properties="i", reconsumeTimes="j", unitMode="k")
        fields = {keys[k]: v for k, v in fields.items()}
    return rc.call(code, fields, body)


def next_push(rc, timeout=20.0):
    """The next PUSH_REPLY_MESSAGE_TO_CLIENT the broker sends this connection."""
    deadline = time.monotonic() + timeout
    while True:
        cmd = rc.read(max(0.01, deadline - time.monotonic()))
        assert cmd is not CLOSED, "the broker closed the requester's connection"
        if not cmd.is_response and cmd.code == R.PUSH_REPLY_MESSAGE_TO_CLIENT:
            return cmd


@pytest.mark.parametrize("code", [R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2])
def test_a_rocketmq_reply_is_pushed_to_the_requesters_connection(rmq_factory, code):
    b = rmq_factory()
    with RemotingClient(rport(b)) as requester, RemotingClient(rport(b)) as replier:
        heartbeat(requester, "requester-1")
        send_request(requester, "tRR", b"what time is it", "corr-1", "requester-1")
        [request] = pulled(replier, "tRR")
        assert request.body == b"what time is it"
        assert request.properties["CORRELATION_ID"] == "corr-1" and request.properties["TAGS"] == "ask"
        assert request.properties["CLUSTER"] == "DefaultCluster"  # the broker adds it, as RocketMQ's does
        answered = send_reply(replier, request.properties, b"noon", code, extra={"TAGS": "answer"})
        assert answered.code == C.SUCCESS, answered.remark
        assert (answered.ext_fields["msgId"], answered.ext_fields["queueOffset"]) == ("0", "0")
        push = next_push(requester)
        assert not push.is_oneway  # RocketMQ calls the client and waits for its answer
        assert push.body == b"noon"
        props = decode_properties(push.ext_fields["properties"])
        assert props["CORRELATION_ID"] == "corr-1" and props["REPLY_TO_CLIENT"] == "requester-1"
        assert props["MSG_TYPE"] == "reply" and props["TAGS"] == "answer" and "PUSH_REPLY_TIME" in props
        assert push.ext_fields["topic"] == "DefaultCluster_REPLY_TOPIC"
        for key in ("bornHost", "storeHost", "storeTimestamp", "queueId", "sysFlag", "flag", "bornTimestamp"):
            assert push.ext_fields[key] != ""
        # replies are not stored: the reply topic holds nothing
        r = pull(replier, "DefaultCluster_REPLY_TOPIC", 0, 0)
        assert r.code != C.SUCCESS


def test_a_reply_for_a_rocketmq_requester_that_went_away_is_a_system_error(rmq_factory):
    b = rmq_factory()
    with RemotingClient(rport(b)) as replier:
        requester = RemotingClient(rport(b))
        heartbeat(requester, "gone-1")
        send_request(requester, "tRG", b"q", "corr-g", "gone-1")
        [request] = pulled(replier, "tRG")
        requester.close()
        for _ in range(200):
            answered = send_reply(replier, request.properties, b"late")
            if answered.code != C.SUCCESS:
                break
            time.sleep(0.05)
        assert answered.code == C.SYSTEM_ERROR
        assert "channel of <gone-1> not found" in answered.remark
        # no routing properties at all: INVALID_PARAMETER
        bare = replier.call(R.SEND_REPLY_MESSAGE, {"producerGroup": "P", "topic": "x", "queueId": 0, "sysFlag": 0,
                                                   "bornTimestamp": 0, "flag": 0, "properties": ""}, b"x")
        assert bare.code == C.INVALID_PARAMETER and "CORRELATION_ID" in bare.remark


def test_a_rocketmq_requester_answered_by_a_metaq_consumer_with_reply(rmq_factory):
    b = rmq_factory()
    c = Consumer("mq-replier", brokers=["meta://127.0.0.1:%d" % b.port], long_poll_ms=500)
    c.subscribe("tMix", lambda m: b"metaq says: " + m.body, reply=True)
    c.subscribe("tMixFail", lambda m: 1 / 0, reply=True)
    c.start()
    try:
        with RemotingClient(rport(b)) as requester:
            heartbeat(requester, "requester-2")
            send_request(requester, "tMix", b"hi", "corr-2", "requester-2")
            push = next_push(requester)
            assert push.body == b"metaq says: hi"
            assert decode_properties(push.ext_fields["properties"])["CORRELATION_ID"] == "corr-2"
            send_request(requester, "tMixFail", b"boom", "corr-3", "requester-2")
            push = next_push(requester)
            props = decode_properties(push.ext_fields["properties"])
            assert props["CORRELATION_ID"] == "corr-3" and "ZeroDivisionError" in props[REPLY_ERROR]
    finally:
        c.close()


def pulled_request(replier, topic):
    """The one request stored in ``topic`` (4 queues), pulled through our codec once it is there (30 s at most)."""
    for _ in range(600):
        for q in range(4):
            r = pull(replier, topic, q, 0)
            if r.code == C.SUCCESS:
                [request] = decode_stored_messages(r.body)
                return request
        time.sleep(0.05)
    raise AssertionError("no request stored in %s" % topic)


def test_a_metaq_requester_answered_by_a_rocketmq_replier(rmq_factory):
    b = rmq_factory()
    out = {}
    with Producer(brokers=["meta://127.0.0.1:%d" % b.port]) as p:
        t = threading.Thread(target=lambda: out.setdefault("reply", p.request(Message("tBack", b"ping"), 30)))
        t.start()
        with RemotingClient(rport(b)) as replier:
            request = pulled_request(replier, "tBack")
            assert request.properties["REPLY_TO_CLIENT"].startswith("metaq-text@")
            assert send_reply(replier, request.properties, b"pong").code == C.SUCCESS
            t.join(30)
    assert out["reply"].body == b"pong"


def test_a_metaq_requester_gets_a_rocketmq_error_reply_as_reply_error(rmq_factory):
    b = rmq_factory()
    out = {}

    def ask():
        try:
            p.request(Message("tBackErr", b"ping"), 30)
        except errors.ReplyError as exc:
            out["error"] = exc

    with Producer(brokers=["meta://127.0.0.1:%d" % b.port]) as p:
        t = threading.Thread(target=ask)
        t.start()
        with RemotingClient(rport(b)) as replier:
            request = pulled_request(replier, "tBackErr")
            assert send_reply(replier, request.properties, b"", extra={REPLY_ERROR: "it broke"}).code == C.SUCCESS
            t.join(30)
    assert str(out["error"]) == "it broke"
