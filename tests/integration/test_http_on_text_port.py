"""An HTTP client pointed at the text port (a browser, curl, a health check) is answered in HTTP: a 400 naming the
broker's HTTP port (or saying it is off), then the connection closes. A real broker; the request is sent by
Python's own HTTP client and by a raw socket, as curl sends it."""

import http.client
import socket

from metaq.client.local import small_config
from tests.harness.http import read_until_closed, with_http


def ask(port, method="GET", path="/", body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.getheader("Connection"), response.read().decode()
    finally:
        conn.close()


def test_the_text_port_names_the_http_port(broker_factory, tmp_path):
    b = broker_factory(config=with_http(small_config(tmp_path / "data")))
    http_port = b.config["http"]["port"]
    status, connection, text = ask(b.port)
    assert (status, connection) == (400, "close")
    assert text == "this is metaq's text protocol port, not HTTP: the HTTP port is http://127.0.0.1:%d/\n" % http_port
    assert ask(http_port, path="/healthz")[0] == 200  # the port named is the broker's HTTP port
    status, _, text = ask(b.port, "POST", "/api/topics/orders/messages", body=b"x" * 200000)  # a body to drop
    assert status == 400 and "http://127.0.0.1:%d/" % http_port in text
    with b.client() as c:  # the text protocol is unchanged
        c.put_ok("orders", b"x")
        assert c.stats_dict()["protocol_errors"] == "2"  # each counted as a protocol error


def test_without_an_http_port_it_says_so(broker_factory, tmp_path):
    b = broker_factory(config=small_config(tmp_path / "data"))
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n")
        reply = read_until_closed(s)  # the broker closes the connection
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert body == (b"this is metaq's text protocol port, not HTTP; this broker's HTTP port is off (set http.port in "
                    b"its configuration, or --http-port)\n")


def test_a_text_command_spelt_like_a_method_is_still_a_protocol_error(broker):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
        s.sendall(b"GET orders\r\nversion\r\n")  # no HTTP version: not a request line
        data = b""
        while b"\r\n" not in data.split(b"unknown command 'GET'", 1)[-1]:
            data += s.recv(4096)
    assert data.startswith(b"result 400 21 0\r\nunknown command 'GET'")
