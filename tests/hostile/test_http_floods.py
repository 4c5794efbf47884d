"""The HTTP port against a client that keeps its socket full, mangles its headers or frames a body ambiguously
(found by an attack review: one unauthenticated connection froze every port for as long as it sent; a
traceback a request in the log; a Content-Length given twice parsed as two requests)."""

import socket
import threading
import time

import pytest
import yaml

from metaq import limits
from metaq.client.local import small_config
from tests.harness.http import http_port, read_until_closed, request, with_http
from tests.hostile.common import LoopProbe

ADMIN = ("admin", "admin-secret-0123456789")


@pytest.fixture
def hbroker(broker_factory, tmp_path):
    return broker_factory(with_http(small_config(tmp_path / "data", limits={"request_timeout_s": 2})))


@pytest.fixture
def abroker(broker_factory, tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_text(yaml.safe_dump({"users": {ADMIN[0]: {"secret": ADMIN[1], "admin": True}}}))
    acl.chmod(0o600)
    return broker_factory(with_http(small_config(tmp_path / "data", security={"acl_file": str(acl)},
                                                 limits={"request_timeout_s": 2})))


def _keep_sending(port, head, unit, seconds):
    """Send ``head`` then ``unit`` over and over for ``seconds`` from a thread, every reply read and thrown away;
    returns ``(thread, outcome)``: outcome gets "cut off" (the broker closed) or "sent throughout"."""
    outcome = []
    s = socket.create_connection(("127.0.0.1", port))

    def drain():
        try:
            while s.recv(1 << 20):
                pass
        except OSError:
            pass

    def run():
        threading.Thread(target=drain, daemon=True).start()
        started = time.monotonic()
        try:
            s.sendall(head)
            while time.monotonic() - started < seconds:
                s.sendall(unit)
            outcome.append("sent throughout")
        except OSError:
            outcome.append("cut off after %.1f s" % (time.monotonic() - started))
        finally:
            s.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, outcome


def test_pipelined_requests_that_keep_the_socket_full_let_the_other_clients_in(hbroker):
    thread, outcome = _keep_sending(http_port(hbroker), b"",
                                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 50, 4)
    time.sleep(0.3)
    with LoopProbe(hbroker.port) as probe:
        thread.join(30)
    assert outcome == ["sent throughout"]  # a well-formed pipeline is served, not cut off
    assert probe.latencies and not probe.failures
    assert probe.worst() < 1.0, (probe.worst(), len(probe.latencies))  # 7.9 s before: every port waited
    assert len(probe.latencies) >= 20, len(probe.latencies)


def test_an_endless_chunked_body_is_cut_at_the_request_deadline_and_stores_nothing(hbroker):
    head = (b"POST /api/topics/flood/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    thread, outcome = _keep_sending(http_port(hbroker), head, b"1\r\na\r\n" * 100, 15)
    time.sleep(0.3)
    with LoopProbe(hbroker.port) as probe:
        thread.join(30)
    # request_timeout_s is 2: a request still arriving then is over, however steadily its bytes come
    assert outcome and outcome[0].startswith("cut off"), outcome  # ran on for 8-17 s, never cut, before
    assert float(outcome[0].split()[3]) < 10, outcome
    assert probe.worst() < 1.0, probe.worst()
    assert "a partial request for 2 s; closing" in hbroker.log_text()
    reply = request(hbroker, "GET", "/api/topics/flood/partitions/0/messages?offset=0")
    assert reply.status in (200, 404) and (reply.status == 404 or reply.json()["messages"] == []), reply


def test_a_refused_request_with_an_unread_body_closes_the_connection_after_its_answer(abroker):
    # unauthenticated: answered 401 at once, and the chunked body that follows is not read and thrown away
    s = socket.create_connection(("127.0.0.1", http_port(abroker)), timeout=10)
    s.sendall(b"POST /api/topics/t/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"1\r\na\r\n" * 1000)
    reply = read_until_closed(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 401 ") and b"Connection: close" in reply, reply[:300]
    assert reply.count(b"HTTP/1.1 ") == 1
    # a request without a body keeps its connection
    s = socket.create_connection(("127.0.0.1", http_port(abroker)), timeout=10)
    s.sendall(b"GET /api/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
              b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    reply = read_until_closed(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 401 ") and reply.count(b"HTTP/1.1 ") == 2, reply[:500]


def test_mangled_headers_are_one_log_line_each_and_never_a_traceback(hbroker):
    many = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + \
        b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(101))
    before = len(hbroker.log_text())
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", http_port(hbroker)), timeout=10)
        s.sendall(many + b"\r\n")
        reply = read_until_closed(s)
        s.close()
        assert reply.startswith(b"HTTP/1.1 400 ") and b"malformed request: got more than 100 headers" in reply, \
            reply[:300]
    log = hbroker.log_text()[before:]
    assert "Traceback" not in log
    lines = log.count("a malformed request")  # the log's flood filter lets a template through so often
    assert lines <= 2 * limits.LOG_LINES_PER_TEMPLATE, lines
    assert len(log) < 2 * limits.LOG_LINES_PER_TEMPLATE * 200, len(log)  # 11 MB in 5 s before


def test_a_body_that_stops_arriving_gets_no_answer_no_traceback_and_stores_nothing(hbroker):
    s = socket.create_connection(("127.0.0.1", http_port(hbroker)), timeout=20)
    s.sendall(b"POST /api/topics/half/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Length: 100\r\n\r\nabc")
    assert read_until_closed(s) == b""  # closed at the request deadline, nothing answered (was a 500)
    s.close()
    log = hbroker.log_text()
    assert "Traceback" not in log and "internal error" not in log
    reply = request(hbroker, "GET", "/api/topics/half/partitions/0/messages?offset=0")
    assert reply.status == 404 or reply.json()["messages"] == [], reply


@pytest.mark.parametrize("framing", [
    b"Content-Length: 2\r\nContent-Length: 7\r\n",  # which one? pywsgi took the first: "cdefg" began a request
    b"Content-Length: +7\r\n",
    b"Content-Length: 0_7\r\n",
    b"Content-Length : 7\r\n",  # a header name with a space: ignored by the parser, so the body was a request
    b"Transfer-Encoding : chunked\r\n",
    b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
])
def test_an_ambiguously_framed_body_is_refused_whole_and_nothing_after_it_is_served(hbroker, framing):
    smuggled = (b"POST /api/topics/smuggled/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Length: 1\r\n\r\nz")
    s = socket.create_connection(("127.0.0.1", http_port(hbroker)), timeout=10)
    s.sendall(b"POST /api/topics/framed/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n" + framing + b"\r\nabcdefg"
              + smuggled)
    reply = read_until_closed(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:300]
    assert reply.count(b"HTTP/1.1 ") == 1, reply  # one answer, then the connection closed
    for topic in ("framed", "smuggled"):
        got = request(hbroker, "GET", "/api/topics/%s/partitions/0/messages?offset=0" % topic)
        assert got.status == 404 or got.json()["messages"] == [], (topic, got)
    assert "Traceback" not in hbroker.log_text()


@pytest.mark.parametrize("content_type", [b"multipart/form-data; boundary=xyz", b"multipart/mixed", b"message/rfc822",
                                          b"application/octet-stream"])
def test_well_formed_headers_of_any_content_type_are_taken(hbroker, content_type):
    # a review: the e-mail parser's defects of a multipart type with no body were taken for a broken header line
    s = socket.create_connection(("127.0.0.1", http_port(hbroker)), timeout=10)
    s.sendall(b"POST /api/topics/ctype/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: " + content_type + b"\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
    reply = read_until_closed(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:300]


def test_unfinished_http_bodies_count_in_the_broker_wide_budget(broker_factory, tmp_path):
    # HTTP bodies wait in the connection's reader: counted with the other ports' unfinished requests
    from tests.hostile.common import hang_up, rss_bytes, settled_rss_bytes

    budget = 8 << 20
    b = broker_factory(with_http(small_config(tmp_path / "data", limits={"max_partial_request_bytes": budget,
                                                                         "request_timeout_s": 20,
                                                                         "max_body_bytes": 4 << 20},
                                                  store={"segment_size": 16 << 20})))
    before = settled_rss_bytes(b.proc.pid)
    attackers = []
    for _ in range(16):  # 16 x 3 MiB of 4 MiB bodies: six times the budget, if nothing held them back
        s = socket.create_connection(("127.0.0.1", http_port(b)))
        s.sendall(b"POST /api/topics/big/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  b"Content-Length: %d\r\n\r\n" % (4 << 20))
        s.setblocking(False)
        sent = 0
        try:
            while sent < 3 << 20:
                sent += s.send(b"\0" * min(1 << 20, (3 << 20) - sent))
        except BlockingIOError:
            pass
        attackers.append(s)
    time.sleep(2)
    grown = rss_bytes(b.proc.pid) - before
    assert grown < budget + (16 << 20), grown
    assert "unfinished requests hold" in b.log_text()
    for s in attackers:
        hang_up(s)
