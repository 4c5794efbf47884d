"""Attacks on issue 19's HTTP port against a real broker: request smuggling, replies a client never reads."""

import socket

import pytest

from metaq.client.local import small_config
from tests.harness.http import http_port, request, with_http


@pytest.fixture
def hbroker(broker_factory, tmp_path):
    return broker_factory(with_http(small_config(tmp_path / "data")))


def _exchange(broker, data):
    s = socket.create_connection(("127.0.0.1", http_port(broker)), timeout=10)
    s.sendall(data)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def test_content_length_and_chunked_together_are_refused_and_the_connection_closed(hbroker):
    # RFC 9112 6.1: such a request may be an attempt at request smuggling (a proxy in front that trusts the
    # Content-Length sees another request boundary): refuse it or close the connection after the answer. The
    # request the proxy would not see must never be served.
    smuggled = b"GET /api/topics/t-smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    reply = _exchange(hbroker, b"POST /api/topics/t-cl/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Content-Length: 4\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + smuggled)
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:300]
    assert reply.count(b"HTTP/1.1 ") == 1, reply  # one answer: the connection closed after it
    assert request(hbroker, "GET", "/api/topics/t-cl/partitions/0/messages?offset=0").json()["messages"] == []
    # plain chunked bodies are still taken
    reply = _exchange(hbroker, b"POST /api/topics/t-cl/messages?partition=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Connection: close\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:300]
