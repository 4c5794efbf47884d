"""A suspended PULL_MESSAGE and the puts made visible around its read: none is left waiting for the suspend
timeout with the message there (serving/longpoll.py: the wait does not begin when an append came since the read)."""

import time

from metaq.client.raw import PULL_FLAGS, RemotingClient, pull_fields
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.headers import PULL_SUSPEND
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode, encode_command, make_request
from tests.harness.rocketmq import send_v1

SUSPEND_MS = 30000


def send_fields(topic, queue):
    return {"producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
            "queueId": queue, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": "",
            "reconsumeTimes": 0, "unitMode": "false"}


def test_a_suspended_pull_sees_a_send_of_the_same_burst(rmq_factory):
    """The pull (a greenlet of its own, started after the reader's turn) and a send right behind it in one write
    (``flush: async``: visible at once, answered on the reader): the pull answers with it at once."""
    b = rmq_factory(store={"flush": "async"})
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        assert send_v1(rc, "tw", b"first", queue=1).code == ResponseCode.SUCCESS
        started = time.monotonic()
        burst = encode_command(make_request(R.PULL_MESSAGE, pull_fields("tw", 1, 1, sys_flag=PULL_FLAGS | PULL_SUSPEND,
                                                                        suspend_ms=SUSPEND_MS), b"", 7))
        burst += encode_command(make_request(R.SEND_MESSAGE, send_fields("tw", 1), b"second", 8))
        rc.send_raw(burst)
        pulled, sent = rc.response(7, timeout=40.0), rc.response(8, timeout=40.0)
        assert time.monotonic() - started < SUSPEND_MS / 2000.0  # not the suspend timeout
        assert sent.code == ResponseCode.SUCCESS
        assert pulled.code == ResponseCode.SUCCESS
        assert [(m.queue_offset, m.body) for m in decode_stored_messages(pulled.body)] == [(1, b"second")]


def test_a_parked_pull_is_woken_by_another_connections_send(rmq_factory):
    """The usual path, kept: a send after the pull parked wakes it, and it answers with the message at once."""
    b = rmq_factory(store={"flush": "async"})
    port = b.config["remoting"]["port"]
    with RemotingClient(port) as rc, RemotingClient(port) as other:
        opaque = rc.request(R.PULL_MESSAGE, pull_fields("tw", 2, 0, sys_flag=PULL_FLAGS | PULL_SUSPEND,
                                                        suspend_ms=SUSPEND_MS))
        time.sleep(0.2)  # parked
        started = time.monotonic()
        assert send_v1(other, "tw", b"late", queue=2).code == ResponseCode.SUCCESS
        pulled = rc.response(opaque, timeout=40.0)
        assert time.monotonic() - started < SUSPEND_MS / 2000.0
        assert pulled.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_stored_messages(pulled.body)] == [b"late"]
