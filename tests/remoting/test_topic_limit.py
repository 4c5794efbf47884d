"""Issue 15 point 5 on the remoting port: a send that would create a topic past limits.max_topics."""

from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.rocketmq import pull, send_v1


def test_a_send_past_max_topics_is_topic_not_exist_and_earlier_topics_work(rmq_factory):
    b = rmq_factory(limits={"max_topics": 3})
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        for topic in ("rA", "rB", "rC"):  # at the limit
            assert send_v1(rc, topic, b"first " + topic.encode()).code == C.SUCCESS
        r = send_v1(rc, "rD", b"one past")
        assert r.code == C.TOPIC_NOT_EXIST and "limits.max_topics" in r.remark
        assert send_v1(rc, "rB", b"second").code == C.SUCCESS
        assert pull(rc, "rB", 0, 0).code == C.SUCCESS
