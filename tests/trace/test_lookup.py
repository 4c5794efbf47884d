"""The lookup over a real store (metaq/trace/service.py): each message's own topic is asked of the permission
decision before anything of it is answered; a metaq id of another broker is named as such; the scans stop at their
named limits (at the limit the answer is whole, one past it says so)."""

import pytest

from metaq import errors
from metaq.trace import limits as trace_limits
from metaq.protocol.msgid import id_broker
from metaq.protocol.rocketmq.bodies import create_offset_msg_id
from metaq.protocol.rocketmq.mapping import record_data_from_send
from metaq.trace.records import TRACE_TOPIC, encode_sub_before
from metaq.trace.service import trace_message
from metaq.trace.wire import TraceQuery
from tests.harness.store import NOW, open_store

HOST = ("127.0.0.1", 10911)
UNIQ = "0A0B0C0D00002A9F0000000000000001"


def put(s, topic, body, props, now=NOW, partition=0):
    flag, data = record_data_from_send(body, props)
    return s.put(topic, partition, flag, data, now)


def flush(s):
    s.mark_flushed(s.flush_log())
    while s.follow_log():
        pass


def position(s, topic, partition, offset):
    records, _next = s.read_records(topic, partition, offset, 1, 1 << 20)
    return records[0].position


def trace(s, value, topic=None, kind="id", allowed=None, broker_id=None):
    asked = []

    def require_read(t):
        asked.append(t)
        if allowed is not None and t not in allowed:
            raise errors.Forbidden("permission denied: may not subscribe to topic %s" % t)

    doc = trace_message(s, TraceQuery(kind, value, topic, trace_limits.TRACE_MAX_RESULTS, 0), require_read, None, HOST,
                        broker_id, pause=lambda: None)
    return doc, asked


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "data")
    yield s
    s.close(NOW)


def test_the_message_topic_is_asked_before_anything_is_answered(store):
    put(store, "tA", b"mine", {"UNIQ_KEY": UNIQ})
    put(store, "payroll", b"secret", {"KEYS": "k"})
    flush(store)
    offset_id = create_offset_msg_id(HOST[0], HOST[1], position(store, "payroll", 0, 0))
    with pytest.raises(errors.Forbidden, match="payroll"):
        trace(store, offset_id, allowed={"tA"})
    doc, asked = trace(store, create_offset_msg_id(HOST[0], HOST[1], position(store, "tA", 0, 0)), allowed={"tA"})
    assert asked == ["tA"] and doc["messages"][0]["uniq_key"] == UNIQ
    with pytest.raises(errors.Forbidden):  # a topic named up front is asked first, found or not
        trace(store, "nothing-here", topic="payroll", kind="key", allowed={"tA"})


def test_a_metaq_id_of_another_broker_and_a_key_without_topic_are_answered_clearly(store):
    r = put(store, "tA", b"x", {})
    flush(store)
    doc, _ = trace(store, str(r.msg_id), topic="tA", broker_id=id_broker(r.msg_id))
    assert doc["messages"][0]["msg_id"] == r.msg_id
    with pytest.raises(errors.NotFound, match="made by broker %d, not this one" % id_broker(r.msg_id)):
        trace(store, str(r.msg_id), topic="tA", broker_id=id_broker(r.msg_id) + 1)
    with pytest.raises(errors.ClientError, match="name the topic"):
        trace(store, str(r.msg_id))
    with pytest.raises(errors.ClientError, match="one topic"):
        trace(store, "k", kind="key")
    elsewhere = create_offset_msg_id("10.9.9.9", 10911, 0)
    with pytest.raises(errors.NotFound, match="names no record of this broker"):
        trace(store, elsewhere)


def test_a_metaq_id_is_found_within_the_id_scan_and_not_past_it(store, monkeypatch):
    monkeypatch.setattr(trace_limits, "TRACE_ID_SCAN", 4)
    ids = [put(store, "tA", b"m%d" % i, {}, now=NOW).msg_id for i in range(5)]  # one millisecond
    flush(store)
    assert trace(store, str(ids[3]), topic="tA")[0]["messages"][0]["offset"] == 3  # the 4th read: at the limit
    with pytest.raises(errors.NotFound):
        trace(store, str(ids[4]), topic="tA")  # the 5th: one past


@pytest.mark.parametrize("copies_before, complete", [(0, True), (1, False)])
def test_the_copy_scan_reads_at_most_its_limit(store, monkeypatch, copies_before, complete):
    monkeypatch.setattr(trace_limits, "TRACE_MAX_COPY_SCAN", 3)
    put(store, "tA", b"orig", {"UNIQ_KEY": UNIQ})
    for i in range(2 + copies_before):  # other messages' dead letters, then this one's
        put(store, "%DLQ%G", b"other", {"ORIGIN_MESSAGE_ID": "OTHER%d" % i}, now=NOW + 1)
    put(store, "%DLQ%G", b"orig", {"ORIGIN_MESSAGE_ID": UNIQ}, now=NOW + 2)
    flush(store)
    [m] = trace(store, UNIQ, topic="tA")[0]["messages"]
    assert m["copies_complete"] is complete
    assert [d["group"] for d in m["dead_letters"]] == ([] if copies_before else ["G"])


@pytest.mark.parametrize("records, complete", [(0, True), (1, False)])
def test_trace_records_shown_at_most_their_limit(store, monkeypatch, records, complete):
    monkeypatch.setattr(trace_limits, "TRACE_MAX_RECORDS", 2)
    put(store, "tA", b"orig", {"UNIQ_KEY": UNIQ})
    body = "".join(encode_sub_before(NOW + i, "CG", "r%d" % i, UNIQ, i, "") for i in range(2 + records))
    put(store, TRACE_TOPIC, body.encode(), {"KEYS": UNIQ})
    flush(store)
    [m] = trace(store, UNIQ, topic="tA")[0]["messages"]
    assert m["traces_complete"] is complete and [t["retry_times"] for t in m["traces"]] == [0, 1]
