"""Request-reply with the metaq client against real brokers (README "Request-reply"): ``Producer.request`` and
``Consumer.subscribe(..., reply=True)`` in this process and in another, a timeout, a handler that raised, a
requester that went away, and the pending-request limits at and one past."""

import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from metaq import errors
from metaq.client import Consumer, Message, Producer
from metaq.client.local import small_config
from metaq.client.raw import TextClient
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import iter_records
from metaq.reqreply.records import CORRELATION_ID, REPLY_TO_CLIENT, reply_properties
from metaq.client.message import Message as M
from metaq.protocol.text import serialize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def url(broker):
    return "meta://127.0.0.1:%d" % broker.port


def replier(broker, topic, handler, group="rg"):
    c = Consumer(group, brokers=[url(broker)], long_poll_ms=500, max_retries=0, retry_backoff=0.01)
    c.subscribe(topic, handler, reply=True)
    return c.start()


def test_a_request_gets_the_reply_its_handler_returned(broker):
    seen = []

    def handle(message):
        seen.append(message)
        return Message("ignored", b"re: " + message.body, properties={"who": "replier"})

    with Producer(brokers=[url(broker)]) as p:
        c = replier(broker, "tReq", handle)
        try:
            reply = p.request(Message("tReq", b"ping", properties={"k": "v"}), timeout=20)
            assert reply.body == b"re: ping"
            assert reply.properties["who"] == "replier" and reply.properties["MSG_TYPE"] == "reply"
            assert reply.properties[CORRELATION_ID] == seen[0].properties[CORRELATION_ID]
            request = seen[0]
            assert request.properties["k"] == "v" and request.properties["TTL"] == "20000"
            assert request.properties["CLUSTER"] == "DefaultCluster"
            assert request.properties[REPLY_TO_CLIENT].startswith("metaq-text@7/")
            # many in a row, each answered with its own reply
            for i in range(20):
                assert p.request(Message("tReq", b"n%d" % i), timeout=20).body == b"re: n%d" % i
        finally:
            c.close()


def test_a_replier_in_another_process(broker, tmp_path):
    code = textwrap.dedent("""
        import sys, time
        from metaq.client import Consumer
        c = Consumer("other", brokers=[sys.argv[1]], long_poll_ms=500)
        c.subscribe("tOther", lambda m: m.body.upper(), reply=True)
        c.start()
        print("ready", flush=True)
        sys.stdin.read()
        c.close()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, url(broker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=ROOT), text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with Producer(brokers=[url(broker)]) as p:
            assert p.request(Message("tOther", b"hello"), timeout=30).body == b"HELLO"
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_no_replier_times_out_with_no_reply_and_the_request_is_stored(broker):
    with Producer(brokers=[url(broker)]) as p:
        with pytest.raises(errors.NoReply) as info:
            p.request(Message("tNobody", b"anyone?", properties={"k": "v"}), timeout=0.3)
        assert info.value.code == 504 and "no reply within 300 ms" in str(info.value)
    with TextClient("127.0.0.1", broker.port) as t:
        stored = [m for part in range(4) for m in _stored(t, "tNobody", part)]
    assert [m.body for m in stored] == [b"anyone?"] and stored[0].properties["k"] == "v"


def test_a_handler_that_raised_gives_the_requester_its_error_at_once(broker):
    def handle(message):
        raise KeyError("no such order 17")

    with Producer(brokers=[url(broker)]) as p:
        c = replier(broker, "tFail", handle)
        try:
            with pytest.raises(errors.ReplyError) as info:
                p.request(Message("tFail", b"order 17"), timeout=60)  # answered long before the timeout
            assert "KeyError" in str(info.value) and "no such order 17" in str(info.value)
        finally:
            c.close()


def test_a_handler_returning_a_wrong_type_is_an_error_reply(broker):
    with Producer(brokers=[url(broker)]) as p:
        c = replier(broker, "tType", lambda m: 42)
        try:
            with pytest.raises(errors.ReplyError, match="TypeError"):
                p.request(Message("tType", b"x"), timeout=60)
        finally:
            c.close()


def _request_frame(topic, body, timeout_ms, opaque):
    return ev.Request(topic, 0, 0, body, opaque, metaq_checksum(body), timeout_ms)


def _reply_frame(request_props, body, opaque=1):
    flag, data = M("r", body, properties=reply_properties(request_props)).encode()
    return ev.Reply(flag, data, opaque, metaq_checksum(data))


def _stored(t, topic, partition=0, offset=0, wait_ms=0):
    """The messages of ``topic``'s partition from ``offset`` (waiting up to ``wait_ms`` for the first)."""
    got = t.get(topic, partition, offset, max_wait_ms=wait_ms or None)
    if not isinstance(got, ev.Value):
        return []
    return [M.from_record(topic, None, offset, rec) for rec, _end in iter_records(got.body)]


def _stored_request(t, topic, offset=0):
    """The request stored at ``offset`` of partition 0, waiting for it to be there (long polls shorter than the
    client's socket timeout, for as long as a loaded machine may need)."""
    for _ in range(12):
        found = _stored(t, topic, 0, offset, 5_000)
        if found:
            return found[0]
    raise AssertionError("no request stored at %s-0 offset %d" % (topic, offset))


def test_a_reply_for_a_requester_that_went_away_is_answered_404_and_kept_nowhere(broker):
    requester = TextClient("127.0.0.1", broker.port)
    requester.send(serialize(_request_frame("tGone", b"q", 60_000, 5)))
    with TextClient("127.0.0.1", broker.port) as t:
        request = _stored_request(t, "tGone")
        requester.close()  # the requester goes away before the reply
        for _ in range(600):  # until the broker has seen the close (t is then its only text connection)
            if int(t.stats_dict()["curr_connections"]) == 1:
                break
            time.sleep(0.05)
        answer = t.call(_reply_frame(request.properties, b"late"))
        assert answer.code == 404 and b"no request with correlation id" in answer.body
        # a reply to a correlation id nobody ever used: 404 too; without routing properties: 400
        props = dict(request.properties, CORRELATION_ID="feedbeef")
        assert t.call(_reply_frame(props, b"x")).code == 404
        flag, data = M("r", b"x").encode()
        assert t.call(ev.Reply(flag, data, 2, -1)).code == 400


def test_text_request_and_reply_by_hand(broker):
    """The text extension itself: the answer to ``request`` is ``value`` holding the reply as one record."""
    with TextClient("127.0.0.1", broker.port) as requester, TextClient("127.0.0.1", broker.port) as other:
        requester.send(serialize(_request_frame("tHand", b"2+2", 60_000, 9)))
        request = _stored_request(other, "tHand")
        assert request.body == b"2+2"
        assert other.call(_reply_frame(request.properties, b"4")) == ev.Result(200, b"delivered", 1)
        answer = requester.read_event()
        assert isinstance(answer, ev.Value) and answer.opaque == 9
        [(rec, _)] = list(iter_records(answer.body))
        assert M.from_record("x", None, None, rec).body == b"4"
        # a second reply to the same request finds nobody waiting
        assert other.call(_reply_frame(request.properties, b"5")).code == 404


def test_a_text_request_and_reply_get_a_puts_checks_and_compressed_bodies_are_decompressed(broker):
    """``request`` and ``reply`` are checked as a put is: the broker's reserved properties refused (nothing
    stored), a body marked compressed (the Producer's compress_over) decompressed on arrival, a bad one refused."""
    body = b"a question asked at length " * 2000
    with TextClient("127.0.0.1", broker.port) as requester, TextClient("127.0.0.1", broker.port) as other:
        flag, data = M("tChk", b"x", properties={"METAQ_PID": "1", "METAQ_SEQ": "0"}).encode()
        refused = requester.call(ev.Request("tChk", 0, flag, data, 3, metaq_checksum(data), 5_000))
        assert refused.code == 400 and b"reserved" in refused.body
        flag, data = M("tChk", body, properties={"q": "1"}).encode(1024, "zlib")
        assert len(data) < len(body) // 20
        bad = data[:-40]
        refused = requester.call(ev.Request("tChk", 0, flag, bad, 4, metaq_checksum(bad), 5_000))
        assert refused.code == 400 and b"does not decompress" in refused.body
        requester.send(serialize(ev.Request("tChk", 0, flag, data, 5, metaq_checksum(data), 60_000)))
        request = _stored_request(other, "tChk")  # the first stored: the refused ones were not
        assert request.body == body and "@SYSFLAG" not in request.properties
        rflag, rdata = M("r", body, properties=reply_properties(request.properties)).encode(1024, "lz4")
        assert other.call(ev.Reply(rflag, rdata, 1, metaq_checksum(rdata))).code == 200
        answer = requester.read_event()
        [(rec, _)] = list(iter_records(answer.body))
        assert M.from_record("x", None, None, rec).body == body  # the reply too, as sent before compression


@pytest.mark.parametrize("where", ["connection", "broker"])
def test_pending_request_limits_at_and_one_past(broker_factory, tmp_path, where):
    limit = 3
    lim = ({"max_pending_requests_per_connection": limit} if where == "connection"
           else {"max_pending_requests": limit})
    b = broker_factory(small_config(tmp_path / "data", limits=dict(lim, max_body_bytes=256 * 1024)))
    with TextClient("127.0.0.1", b.port) as t, TextClient("127.0.0.1", b.port) as other:
        for i in range(limit):  # at the limit: every one is taken, stored, and waits
            t.send(serialize(_request_frame("tLim", b"r%d" % i, 60_000, 100 + i)))
        _stored_request(other, "tLim")
        for _ in range(400):  # all of them stored (each from a greenlet of its own)
            if len(_stored(other, "tLim")) == limit:
                break
            time.sleep(0.05)
        past = (t if where == "connection" else other).call(_request_frame("tLim", b"one more", 60_000, 0))
        assert past.code == 503, past
        assert (b"on this connection" if where == "connection" else b"on the broker") in past.body
        assert b"the limit is %d" % limit in past.body
        assert len(_stored(other, "tLim")) == limit  # the refused one was not stored
        first = _stored_request(other, "tLim")  # one answered: room again
        assert other.call(_reply_frame(first.properties, b"ok")).code == 200
        answer = t.read_event()
        assert isinstance(answer, ev.Value) and answer.opaque == 100
        t.send(serialize(_request_frame("tLim", b"fits again", 300, 7)))
        late = t.read_event()
        assert isinstance(late, ev.Result) and (late.code, late.opaque) == (504, 7)


def test_the_readme_example_runs_and_ends(broker, tmp_path):
    from tests.harness.docs import section as doc_section

    section = doc_section("messaging.md", "Request-reply")
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    code = code.replace("127.0.0.1:8123", "127.0.0.1:%d" % broker.port)
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "b'price of ACME: 42'"


def test_a_stopping_broker_answers_waiting_requests_503(broker):
    with TextClient("127.0.0.1", broker.port, timeout=60) as t, TextClient("127.0.0.1", broker.port) as other:
        t.send(serialize(_request_frame("tStop", b"q", 120_000, 3)))
        _stored_request(other, "tStop")  # stored, so it waits
        broker.stop()
        answer = t.read_event()
        assert isinstance(answer, ev.Result) and (answer.code, answer.opaque) == (503, 3)
        assert b"the broker is stopping" in answer.body


def test_replies_to_a_requester_that_never_reads_stop_at_its_reply_budget(broker_factory, tmp_path):
    """A delivered reply is held until the requester's socket takes it, counted in that connection's reply budget
    (limits.max_reply_bytes) as a get's data is: past it the replier is told 503 (try again) and the broker does
    not grow. Before, 120 replies of 900 KiB were all taken and the broker grew by 200 MB."""
    b = broker_factory(small_config(tmp_path / "data", limits=dict(max_body_bytes=1 << 20),
                                    store=dict(segment_size=8 << 20)))
    lazy = socket.socket()
    lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    lazy.connect(("127.0.0.1", b.port))  # the requester: a tiny receive buffer, never reads
    big = b"x" * (900 * 1024)
    outcomes = []
    try:
        with TextClient("127.0.0.1", b.port, timeout=60) as other:
            for i in range(40):
                lazy.sendall(serialize(_request_frame("tPile", b"r%d" % i, 120_000, 100 + i)))
                request = _stored_request(other, "tPile", i)
                outcomes.append(other.call(_reply_frame(request.properties, big)).code)
            rss = int([line.split()[1] for line in open("/proc/%d/status" % b.proc.pid)
                       if line.startswith("VmRSS")][0])
    finally:
        lazy.close()
    # the budget (4 MiB) plus what the kernel took: a handful delivered, every later one refused with 503
    delivered = outcomes.count(200)
    assert 1 <= delivered <= 12 and set(outcomes[delivered:]) == {503}, outcomes
    assert rss < 200_000, rss  # KiB: 40 replies of 900 KiB would be 36 MB held on top of the broker's own
