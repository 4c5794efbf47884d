"""A message with more properties than RocketMQ's 32,767 bytes, against a real broker (found by an attack review:
a text put with a 40,000-character attribute made every pull of its queue SYSTEM_ERROR, for good)."""

from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.rocketmq import pull, send_v1


def test_a_text_put_with_a_huge_attribute_does_not_stop_the_queues_rocketmq_consumers(rmq_broker, rc):
    with rmq_broker.client() as c:
        assert c.put("huge", b"first", partition=0, attribute="t" * 40_000).code == 200
        assert c.put("huge", b"second", partition=0, attribute="ok").code == 200
    r = pull(rc, "huge", 0, 0)
    assert r.code == C.SUCCESS, (r.code, r.remark)
    msgs = decode_stored_messages(r.body)
    assert [m.body for m in msgs] == [b"first", b"second"]
    assert msgs[0].properties["METAQ_TRIMMED_PROPERTIES"] == "1" and msgs[1].properties["TAGS"] == "ok"
    assert "Traceback" not in rmq_broker.log_text()


def test_a_send_with_more_properties_than_can_be_served_is_refused_and_nothing_is_stored(rmq_broker, rc):
    r = send_v1(rc, "big-props", b"x", props={"KEYS": "k" * 40_000})
    assert r.code != C.SUCCESS and "at most" in r.remark, (r.code, r.remark)
    assert send_v1(rc, "big-props", b"y", props={"KEYS": "k"}).code == C.SUCCESS  # the connection goes on
    msgs = decode_stored_messages(pull(rc, "big-props", 0, 0).body)
    assert [m.body for m in msgs] == [b"y"]
