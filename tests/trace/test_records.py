"""What a trace reads, pure (metaq/trace/records.py, metaq/trace/wire.py): message ids as users write them, RocketMQ
message-trace records in the client's layouts (old and new), the ``trace`` command."""

import pytest

from metaq import errors
from metaq.trace import limits as trace_limits
from metaq.protocol.msgid import compose
from metaq.protocol.rocketmq.bodies import create_offset_msg_id
from metaq.protocol.text import TextParser, serialize
from metaq.trace.records import (CONTENT_SEPARATOR, FIELD_SEPARATOR, encode_pub, encode_sub_after,
                                 encode_sub_before, parse_message_id, parse_trace_body)
from metaq.trace.wire import TraceQuery


def test_a_metaq_id_and_a_rocketmq_offset_id_are_told_apart():
    metaq_id = compose(123_456, 7, 3)
    ref = parse_message_id(str(metaq_id))
    assert (ref.kind, ref.metaq_id) == ("metaq", metaq_id)
    offset_id = create_offset_msg_id("127.0.0.1", 10911, 4242)
    ref = parse_message_id(offset_id.lower())  # any case
    assert (ref.kind, ref.text, ref.host, ref.position) == ("rocketmq", offset_id, ("127.0.0.1", 10911), 4242)
    v6 = create_offset_msg_id("::1", 10911, 9)
    assert parse_message_id(v6).host == ("::1", 10911)


@pytest.mark.parametrize("text", ["", "abc", "-5", "0", "9" * 20, "G" * 32, "A" * 31, "A" * 33, "1 2", "１２３"])
def test_a_malformed_id_is_refused_naming_the_shapes_accepted(text):
    with pytest.raises(errors.ClientError, match="not a message id.*decimal.*32 or 56 hex"):
        parse_message_id(text)


def test_trace_records_of_the_client_layouts_are_read():
    body = (encode_pub(1000, "PG", "tA", "U1", "TagA", "k1", "10.0.0.1:10911", 5, 3, "OFFSETID")
            + encode_sub_before(1010, "CG", "req", "U1", 2, "k1")
            + encode_sub_after("req", "U1", 7, False, "k1", 1, 1017))
    pub, before, after = parse_trace_body(body.encode())
    assert (pub["type"], pub["group"], pub["topic"], pub["msg_id"], pub["offset_msg_id"], pub["success"]) == \
        ("Pub", "PG", "tA", "U1", "OFFSETID", True)
    assert (pub["timestamp_ms"], pub["body_length"], pub["cost_ms"], pub["store_host"]) == \
        (1000, 5, 3, "10.0.0.1:10911")
    assert (before["group"], before["retry_times"], before["request_id"]) == ("CG", 2, "req")
    assert (after["success"], after["cost_ms"], after["context_code"], after["timestamp_ms"]) == (False, 7, 1, 1017)


def test_older_and_newer_layouts_and_damaged_rows():
    c, f = CONTENT_SEPARATOR, FIELD_SEPARATOR
    old_pub = c.join(["Pub", "1", "R", "PG", "t", "U", "", "", "h:1", "3", "2", "0", "true"]) + f  # no offsetMsgId
    new_pub = c.join(["Pub", "1", "R", "PG", "t", "U", "", "", "h:1", "3", "2", "0", "O", "false", "client"]) + f
    old_after = c.join(["SubAfter", "req", "U", "4", "true", "k"]) + f  # no context code, no timestamp
    damaged = c.join(["Pub", "1", "R"]) + f + "Unknown" + c + "x" + f + c.join(["SubBefore", "1", "R", "CG", "req"]) + f
    recs = parse_trace_body(old_pub + new_pub + old_after + damaged)
    assert [(r["type"], r.get("offset_msg_id"), r.get("success")) for r in recs] == \
        [("Pub", None, True), ("Pub", "O", False), ("SubAfter", None, True)]
    assert recs[2]["timestamp_ms"] is None and recs[0]["timestamp_ms"] == 1
    end_tx = c.join(["EndTransaction", "5", "R", "PG", "t", "U", "", "k", "h:1", "3", "TX1", "COMMIT_MESSAGE",
                     "true"]) + f
    [end] = parse_trace_body(end_tx)
    assert (end["type"], end["transaction_id"], end["transaction_state"], end["from_check"]) == \
        ("EndTransaction", "TX1", "COMMIT_MESSAGE", True)
    assert parse_trace_body(b"\xff\xfe") == []


def test_the_trace_command_round_trips_and_its_max_is_bounded():
    for e in (TraceQuery("id", "12345", None, trace_limits.TRACE_MAX_RESULTS, 4),
              TraceQuery("key", "k-1", "orders", 1, 5)):
        parser = TextParser()
        parser.receive_data(serialize(e))
        assert parser.next_event() == e
    parser = TextParser()
    parser.receive_data(b"trace key k orders %d 6\r\n" % (trace_limits.TRACE_MAX_RESULTS + 1))
    with pytest.raises(errors.RemoteProtocolError, match="max"):
        parser.next_event()
