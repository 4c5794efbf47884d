"""Helpers of the RocketMQ remoting tests: SEND v1 and PULL requests, is the official client installed, which
lines a consume run received.

The raw client is ``metaq.client.raw.RemotingClient``, brokers with a remoting port come from
``metaq.client.local.rmq_config``, and the official client runs through ``bench/rocketmq_peer.py``.
"""

import time

import pytest

from metaq.client.raw import RemotingClient, pull_fields
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.bodies import encode_properties, parse_offset_msg_id


def require_official_client():
    try:
        import rocketmq  # noqa: F401  (only: is it there?)
    except ImportError:
        pytest.fail("the official RocketMQ client is not installed: it is in the test extra "
                    "(make test installs it; by hand: pip install rocketmq==0.4.4)")


def received(lines):
    """The message lines of a consume run."""
    return [line for line in lines if "body" in line]


def send_v1(rc, topic, body, queue=0, props=None, sys_flag=0, flag=0):
    return rc.call(R.SEND_MESSAGE, {
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": queue, "sysFlag": sys_flag, "bornTimestamp": int(time.time() * 1000), "flag": flag,
        "properties": encode_properties(props or {}), "reconsumeTimes": 0, "unitMode": "false"}, body)


def pull(rc, topic, queue, offset, timeout=10.0, **fields):
    return rc.call(R.PULL_MESSAGE, pull_fields(topic, queue, offset, **fields), timeout=timeout)


def end_tx(rc, sent, decision):
    """END_TRANSACTION of the half message whose send response is ``sent`` (decision: 0 unknown, 8 commit,
    12 rollback)."""
    return rc.call(R.END_TRANSACTION, {"producerGroup": "PG", "tranStateTableOffset": sent.ext_fields["queueOffset"],
                                       "commitLogOffset": parse_offset_msg_id(sent.ext_fields["msgId"])[2],
                                       "commitOrRollback": decision, "msgId": sent.ext_fields["msgId"],
                                       "fromTransactionCheck": "false"})


def committed(broker, group, topic, queues):
    """QUERY_CONSUMER_OFFSET on the broker's remoting port: {queue: offset or None}."""
    with RemotingClient(broker.config["remoting"]["port"]) as rc:
        out = {}
        for q in range(queues):
            r = rc.call(R.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": q,
                                                  "setZeroIfNotFound": "false"})
            out[q] = int(r.ext_fields["offset"]) if r.code == 0 else None
        return out
