"""The HTTP port of a real broker (README "Operating metaq"): put/get, errors, limits, deadlines, the cap, readiness."""

import base64
import socket

import pytest

from metaq.server.http import limits as http_limits
from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from tests.harness.broker import wait_for
from tests.harness.http import http_port, read_until_closed, request, with_http


def _raw(broker):
    s = socket.create_connection(("127.0.0.1", http_port(broker)), timeout=10)
    return s


@pytest.fixture
def hbroker(broker_factory, tmp_path):
    return broker_factory(with_http(small_config(tmp_path / "data")))


def test_http_put_then_get_round_trips_and_equals_the_text_get(hbroker):
    r = request(hbroker, "POST", "/api/topics/t-http/messages?partition=1&attribute=a%20b", body=b"hello\x00world")
    assert r.status == 200, r
    put = r.json()
    assert put["partition"] == 1 and put["offset"] == 0
    r = request(hbroker, "GET", "/api/topics/t-http/partitions/1/messages?offset=0")
    assert r.status == 200, r
    doc = r.json()
    assert doc["next_offset"] == 1
    [m] = doc["messages"]
    assert (m["id"], m["offset"], m["attribute"]) == (put["id"], 0, "a b")
    assert base64.b64decode(m["body"]) == b"hello\x00world"
    with hbroker.client() as c:  # what the text port returns for the same record
        [rec] = c.get_records("t-http", 1, 0)
    assert rec.msg_id == put["id"]
    assert rec.attribute == "a b" and rec.payload == b"hello\x00world"
    raw = request(hbroker, "GET", "/api/topics/t-http/partitions/1/messages?offset=0&format=raw")
    assert raw.status == 200 and raw.body == b"hello\x00world"
    assert raw.headers["X-Metaq-Id"] == str(put["id"]) and raw.headers["X-Metaq-Next-Offset"] == "1"
    # a message put on the text port reads back over HTTP
    with hbroker.client() as c:
        c.put_ok("t-http", b"from text", 1)
    doc = request(hbroker, "GET", "/api/topics/t-http/partitions/1/messages?offset=1").json()
    assert base64.b64decode(doc["messages"][0]["body"]) == b"from text"
    topics = {t["topic"]: t for t in request(hbroker, "GET", "/api/topics").json()["topics"]}
    assert topics["t-http"]["puts_total"] == 2 and topics["t-http"]["messages"] == 2
    one = request(hbroker, "GET", "/api/topics/t-http").json()
    assert one["partitions"][1] == {"partition": 1, "min_offset": 0, "max_offset": 2, "messages": 2}


def test_http_errors_are_json_with_the_text_protocols_codes(hbroker):
    request(hbroker, "POST", "/api/topics/t-err/messages?partition=0", body=b"x")
    r = request(hbroker, "GET", "/api/topics/t-err/partitions/0/messages?offset=7")
    assert r.status == 416 and r.json()["code"] == 301 and r.json()["offset"] == 1  # where to read from
    r = request(hbroker, "GET", "/api/topics/t-err/partitions/9/messages?offset=0")
    assert r.status == 404 and r.json()["code"] == 404
    with hbroker.client() as c:
        assert c.get("t-err", 9, 0).code == 404  # the text port's answer to the same read
    r = request(hbroker, "POST", "/api/topics/t-err/messages?partition=nine", body=b"x")
    assert r.status == 400 and "partition" in r.json()["error"]
    r = request(hbroker, "GET", "/api/nothing-here")
    assert r.status == 404 and r.json()["code"] == 404
    r = request(hbroker, "DELETE", "/api/topics")
    assert r.status == 405 and r.headers["Allow"] == "GET"
    # a hostile topic name is refused as on the text port, never stored nor echoed as markup
    r = request(hbroker, "POST", "/api/topics/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E/messages", body=b"x")
    assert r.status == 400 and r.json()["code"] == 400 and "illegal topic name" in r.json()["error"]
    assert all("<" not in t["topic"] for t in request(hbroker, "GET", "/api/topics").json()["topics"])


def test_a_huge_content_length_is_refused_413_without_reading_the_body(hbroker):
    s = _raw(hbroker)
    s.sendall(b"POST /api/topics/t-big/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
              % (http_limits.HTTP_MAX_BODY_BYTES + 1))  # and no body: the answer comes without it
    reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 413 ") and b"HTTP_MAX_BODY_BYTES" in reply
    s.close()
    r = request(hbroker, "POST", "/api/topics/t-big/messages?partition=0", body=b"b" * 1000)
    assert r.status == 200  # the broker serves on
    # at the limit the port reads the body; the broker's own message limit (max_body_bytes) then answers
    r = request(hbroker, "POST", "/api/topics/t-big/messages?partition=0", body=b"b" * http_limits.HTTP_MAX_BODY_BYTES)
    assert r.status == 400 and "limits.max_body_bytes" in r.json()["error"]


def test_request_line_and_headers_are_bounded(hbroker):
    room = http_limits.HTTP_MAX_REQUEST_LINE - len(b"GET /healthz? HTTP/1.1\r\n") - 1
    s = _raw(hbroker)
    s.sendall(b"GET /healthz?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (b"a" * room))
    assert read_until_closed(s).startswith(b"HTTP/1.1 200 ")  # just under the limit
    s = _raw(hbroker)
    s.sendall(b"GET /healthz?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (b"a" * (room + 1)))
    assert read_until_closed(s).startswith(b"HTTP/1.1 414 ")
    header = b"X-Pad: %s\r\n" % (b"p" * 1000)
    fits = http_limits.HTTP_MAX_HEADER_BYTES // len(header) - 1
    s = _raw(hbroker)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + header * fits + b"\r\n")
    assert read_until_closed(s).startswith(b"HTTP/1.1 200 ")
    s = _raw(hbroker)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + header * (fits + 12) + b"\r\n")
    assert read_until_closed(s).startswith(b"HTTP/1.1 431 ")


def test_a_slow_loris_client_is_dropped_by_the_request_deadline(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data", limits={"request_timeout_s": 1.0})))
    s = _raw(b)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line that ends the headers
    s.settimeout(30)
    assert s.recv(100) == b""  # closed by the broker, without an answer to a request it never got whole
    assert request(b, "GET", "/healthz").status == 200  # others are served meanwhile and after
    assert "a partial request" in b.log_text()


def test_keep_alive_serves_several_requests_on_one_connection(hbroker):
    s = _raw(hbroker)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    out = read_until_closed(s)
    assert out.count(b"HTTP/1.1 200 OK") == 2 and out.endswith(b"ready\n")


def test_the_connection_cap_counts_http_connections(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data", limits={"max_connections": 3,
                                                                         "max_connections_per_address": 3})))
    held = []
    for _ in range(3):
        s = _raw(b)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(1000).startswith(b"HTTP/1.1 200 ")  # accepted and served: it holds a slot
        held.append(s)
    with b.client() as c:  # the text port is refused: the cap is shared
        r = c.read_event()
        assert isinstance(r, ev.Result) and r.code == 503 and b"too many connections" in r.body
    s = _raw(b)
    reply = read_until_closed(s)
    assert reply.startswith(b"HTTP/1.1 503 ") and b"too many connections" in reply
    held.pop().close()
    wait_for(lambda: request(b, "GET", "/healthz").status == 200, what="a slot freed")


def test_readyz_says_why_when_the_disk_gate_refuses_writes(broker_factory, tmp_path):
    # a danger mark below what the disk already uses: the gate refuses every write from the start
    b = broker_factory(with_http(small_config(tmp_path / "data", store={"disk_warn_ratio": 0.0001,
                                                                         "disk_danger_ratio": 0.0001})))
    r = request(b, "GET", "/readyz")
    assert r.status == 503 and "writes are refused" in r.text and "danger" in r.text, r
    assert request(b, "GET", "/healthz").status == 200  # alive, just not ready
    put = request(b, "POST", "/api/topics/t-full/messages?partition=0", body=b"x")
    assert put.status == 507 and put.json()["code"] == 507
    assert request(b, "GET", "/api/broker").json()["ready"] is False


def test_readyz_waits_for_a_slave_to_handshake_with_its_master(broker_factory, tmp_path):
    rport = free_port()
    slave = broker_factory(with_http(small_config(tmp_path / "s" / "data", broker={"id": 7},
                                                  replication={"role": "slave", "slave_of": "127.0.0.1:%d" % rport,
                                                               "slave_id": 1})),
                           workdir=tmp_path / "s")
    r = request(slave, "GET", "/readyz")
    assert r.status == 503 and "not handshaken" in r.text, r
    broker_factory(small_config(tmp_path / "m" / "data", replication={"port": rport}), workdir=tmp_path / "m")
    wait_for(lambda: request(slave, "GET", "/readyz").status == 200,
             what=lambda: "slave ready: %s" % request(slave, "GET", "/readyz").text)
    assert request(slave, "GET", "/api/replication").json()["replication_role"] == "slave"


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data", limits={"idle_timeout_s": 1.0})))
    s = _raw(b)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(30)
    assert read_until_closed(s).startswith(b"HTTP/1.1 200 ")  # the answer, then the close once idle: _read_all ends
    assert "no request for" in b.log_text()


def test_the_key_picks_the_partition_when_none_is_given(hbroker):
    import zlib
    r = request(hbroker, "POST", "/api/topics/t-keyed/messages?key=order-42", body=b"k")
    assert r.status == 200 and r.json()["partition"] == zlib.crc32(b"order-42") % 4  # t* topics have 4
    assert request(hbroker, "POST", "/api/topics/t-keyed/messages", body=b"k").json()["partition"] == 0


def test_a_corrupt_record_is_answered_512_never_served(broker_factory, tmp_path):
    from tests.integration.test_corrupt_records import flip_payload_byte

    wd = tmp_path / "b"
    b = broker_factory(with_http(small_config(wd / "data")), workdir=wd)
    for i in range(3):
        body = b"rec-%02d-" % i + b"x" * 4000
        assert request(b, "POST", "/api/topics/t-bad/messages?partition=0", body=body).status == 200
    assert b.stop() == 0
    flip_payload_byte(b.data_dir, 1)
    b.start()
    r = request(b, "GET", "/api/topics/t-bad/partitions/0/messages?offset=1")
    assert r.status == 500 and r.json()["code"] == 512 and "corrupt" in r.json()["error"], r
    r = request(b, "GET", "/api/topics/t-bad/partitions/0/messages?offset=0")  # the read stops before it
    assert r.status == 200 and [m["offset"] for m in r.json()["messages"]] == [0]
    with b.client() as c:
        assert c.get("t-bad", 0, 1).code == 512  # the text port's answer


def test_a_get_returns_at_most_max_count_and_max_bytes_but_at_least_one(hbroker):
    from metaq.server.http import limits as http_limits

    with hbroker.client() as c:
        for i in range(http_limits.HTTP_MAX_GET_MESSAGES + 1):
            c.put_ok("t-many", b"m%04d" % i, 0)
    path = "/api/topics/t-many/partitions/0/messages?offset=0"
    doc = request(hbroker, "GET", path).json()  # the default: HTTP_MAX_GET_MESSAGES
    assert len(doc["messages"]) == http_limits.HTTP_MAX_GET_MESSAGES == doc["next_offset"]
    doc = request(hbroker, "GET",
                  path + "&max_count=%d" % (http_limits.HTTP_MAX_GET_MESSAGES + 1)).json()  # and the most
    assert len(doc["messages"]) == http_limits.HTTP_MAX_GET_MESSAGES
    doc = request(hbroker, "GET", path + "&max_count=2").json()
    assert [m["offset"] for m in doc["messages"]] == [0, 1] and doc["next_offset"] == 2
    doc = request(hbroker, "GET", path + "&max_bytes=1").json()  # smaller than one message: still one
    assert [base64.b64decode(m["body"]) for m in doc["messages"]] == [b"m0000"] and doc["next_offset"] == 1
    assert request(hbroker, "GET", path + "&max_count=0").status == 400


def test_the_put_counter_survives_stats_reset(hbroker):
    with hbroker.client() as c:
        for i in range(3):
            c.put_ok("t-count", b"m%d" % i, 0)
        assert "reset ok" in c.stats("reset")
    text = request(hbroker, "GET", "/metrics").text
    assert 'metaq_topic_puts_total{topic="t-count"} 3.0' in text, text
    topics = {t["topic"]: t for t in request(hbroker, "GET", "/api/topics").json()["topics"]}
    assert topics["t-count"]["puts_total"] == 3
