"""LOCK_BATCH_MQ / UNLOCK_BATCH_MQ bodies (metaq.protocol.rocketmq.lockbodies)."""

import json

import pytest

from metaq.server.remoting import limits as remoting_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.rocketmq.lockbodies import (LockBatchBody, MessageQueue, decode_lock_batch, encode_lock_batch,
                                                encode_lock_ok)

#: What the C++ client 0.4.4 writes (jsoncpp FastWriter: no onlyThisBroker, a trailing newline).
CPP_BODY = (b'{"clientId":"127.0.0.1@4242","consumerGroup":"CG","mqSet":[{"brokerName":"metaq-7","queueId":1,'
            b'"topic":"orders"},{"brokerName":"metaq-7","queueId":0,"topic":"%RETRY%CG"}]}\n')


def test_the_cpp_clients_body_decodes():
    body = decode_lock_batch(CPP_BODY)
    assert body == LockBatchBody("CG", "127.0.0.1@4242", (MessageQueue("orders", "metaq-7", 1),
                                                           MessageQueue("%RETRY%CG", "metaq-7", 0)), False)


def test_an_empty_mq_set_may_be_left_out():
    assert decode_lock_batch(b'{"clientId":"c","consumerGroup":"G"}').mq_set == ()


def test_round_trip_and_the_response_body():
    body = LockBatchBody("G", "c", (MessageQueue("t", "b", 3),), True)
    assert decode_lock_batch(encode_lock_batch(body)) == body
    assert json.loads(encode_lock_ok([MessageQueue("t", "b", 3)])) == {
        "lockOKMQSet": [{"topic": "t", "brokerName": "b", "queueId": 3}]}
    assert json.loads(encode_lock_ok([])) == {"lockOKMQSet": []}


@pytest.mark.parametrize("raw, reason", [
    (b"not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"clientId":"c"}', "consumerGroup"),
    (b'{"clientId":"","consumerGroup":"G"}', "clientId"),
    (b'{"clientId":"c","consumerGroup":"G","mqSet":{}}', "mqSet must be a list"),
    (b'{"clientId":"c","consumerGroup":"G","mqSet":[1]}', "object"),
    (b'{"clientId":"c","consumerGroup":"G","mqSet":[{"topic":"t","brokerName":"b","queueId":"1"}]}', "int32"),
    (b'{"clientId":"c","consumerGroup":"G","mqSet":[{"topic":"t","brokerName":"b","queueId":true}]}', "int32"),
    (b'{"clientId":"c","consumerGroup":"G","mqSet":[{"topic":"t","brokerName":"b","queueId":2147483648}]}', "int32"),
    (b'{"clientId":"c","consumerGroup":"G","mqSet":[{"brokerName":"b","queueId":1}]}', "topic"),
    (b'{"clientId":"c","consumerGroup":"G","mqSet":[{"topic":"t","queueId":1}]}', "brokerName"),
])
def test_malformed_bodies_are_refused_with_the_reason_and_the_opaque(raw, reason):
    with pytest.raises(RemoteProtocolError, match=reason) as info:
        decode_lock_batch(raw, opaque=77)
    assert info.value.opaque == 77 and not info.value.fatal


def _body(n):
    return encode_lock_batch(LockBatchBody("G", "c", tuple(MessageQueue("t", "b", i) for i in range(n))))


def test_at_most_max_lock_batch_queues_per_request():
    assert (len(decode_lock_batch(_body(remoting_limits.MAX_LOCK_BATCH_QUEUES)).mq_set)
            == remoting_limits.MAX_LOCK_BATCH_QUEUES)
    with pytest.raises(RemoteProtocolError, match="MAX_LOCK_BATCH_QUEUES"):
        decode_lock_batch(_body(remoting_limits.MAX_LOCK_BATCH_QUEUES + 1))
