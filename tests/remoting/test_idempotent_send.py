"""Idempotent sends over RocketMQ remoting: METAQ_PID / METAQ_SEQ properties (idempotence/records.py)."""

import pytest

from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.remoting import ResponseCode
from tests.harness.broker import consume_all
from tests.harness.rocketmq import pull, send_v1


def test_a_resend_answers_the_original_id_and_offset(rmq_broker, rc):
    props = {"TAGS": "TagI", "KEYS": "k", "METAQ_PID": "99", "METAQ_SEQ": "0"}
    first = send_v1(rc, "tI1", b"once", queue=2, props=props)
    again = send_v1(rc, "tI1", b"once", queue=2, props=props)
    assert first.code == again.code == ResponseCode.SUCCESS
    assert (again.ext_fields["msgId"], again.ext_fields["queueOffset"]) == \
        (first.ext_fields["msgId"], first.ext_fields["queueOffset"])
    other = send_v1(rc, "tI1", b"twice", queue=2, props=dict(props, METAQ_SEQ="1"))
    assert other.ext_fields["queueOffset"] == "1"
    msgs = decode_stored_messages(pull(rc, "tI1", 2, 0).body)
    assert [(m.body, m.properties.get("TAGS"), m.properties.get("METAQ_SEQ")) for m in msgs] == \
        [(b"once", "TagI", "0"), (b"twice", "TagI", "1")]
    with rmq_broker.client() as text:  # the same window as put_idem: seq 0 of producer 99 is known there
        flag, data = encode_payload(b"once", "TagI")  # not the message stored (that one has KEYS): refused
        r = text.call(IdempotentPut("tI1", 2, flag, data, 1, metaq_checksum(data), 99, 0))
        assert r.code == 400 and b"was stored at offset 0 with other content" in r.body
        r = text.call(IdempotentPut("tI1", 2, flag, data, 2, metaq_checksum(data), 99, 1))  # seq 1: "twice"
        assert r.code == 400 and b"was stored at offset 1 with other content" in r.body
        assert len(consume_all(text, "tI1", 2)) == 2


@pytest.mark.parametrize("props, queue, why", [
    ({"METAQ_PID": "99"}, 0, "needs both"),
    ({"METAQ_PID": "x", "METAQ_SEQ": "0"}, 0, "needs both"),
    ({"METAQ_PID": "0", "METAQ_SEQ": "0"}, 0, "invalid producer id"),
    ({"METAQ_PID": "5", "METAQ_SEQ": "0"}, -1, "explicit queue id"),
    ({"METAQ_PID": "5", "METAQ_SEQ": "0", "DELAY": "2"}, 0, "no delay"),
])
def test_bad_idempotent_sends_are_refused_and_nothing_stored(rmq_broker, rc, props, queue, why):
    r = send_v1(rc, "tI2", b"x", queue=queue, props=props)
    assert r.code != ResponseCode.SUCCESS and why in r.remark
    with rmq_broker.client() as text:
        assert all(consume_all(text, "tI2", p) == [] for p in range(4))


def test_a_half_message_cannot_be_idempotent(rmq_broker, rc):
    r = send_v1(rc, "tI3", b"x", queue=0, props={"METAQ_PID": "5", "METAQ_SEQ": "0", "TRAN_MSG": "true"},
                sys_flag=4)
    assert r.code != ResponseCode.SUCCESS and "transactional" in r.remark


def test_a_text_put_idem_is_pulled_as_a_plain_put_would_be(rmq_broker, rc):
    with rmq_broker.client() as text:
        for seq, attribute in enumerate([None, "TagT"]):
            flag, data = encode_payload(b"text %d" % seq, attribute)
            assert text.call(IdempotentPut("tI4", 1, flag, data, 1, metaq_checksum(data), 8, seq)).code == 200
    msgs = decode_stored_messages(pull(rc, "tI4", 1, 0).body)
    assert [(m.body, m.flag, m.properties.get("TAGS")) for m in msgs] == [(b"text 0", 0, None), (b"text 1", 1, "TagT")]
    assert [(m.properties["METAQ_PID"], m.properties["METAQ_SEQ"]) for m in msgs] == [("8", "0"), ("8", "1")]
