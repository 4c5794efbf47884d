"""README "The HTTP port": its connections count against the per-address share of the connection cap, and the
address allow-list applies to it, as on the text port (only the global cap is in test_http.py)."""

import socket

from metaq.client.local import small_config
from tests.harness.acl import secured_config, write_acl
from tests.harness.broker import wait_for
from tests.harness.http import http_port, read_until_closed, request, with_http

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def connect_from(source, port):
    sock = socket.socket()
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def held_from(source, port):
    """A served keep-alive connection from ``source``: it holds a slot."""
    s = connect_from(source, port)
    s.sendall(HEALTHZ)
    assert s.recv(1000).startswith(b"HTTP/1.1 200 ")
    return s


def test_http_connections_count_against_the_per_address_share(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data", limits={"max_connections": 10,
                                                                         "max_connections_per_address": 2})))
    port = http_port(b)
    held = [held_from("127.0.0.1", port) for _ in range(2)]
    try:
        third = read_until_closed(connect_from("127.0.0.1", port))  # the share of 127.0.0.1 is used up, the cap is not
        assert third.startswith(b"HTTP/1.1 503 ") and b"too many connections from 127.0.0.1" in third, third
        with b.client() as c:  # the text port's connections from the same address count against the same share
            r = c.read_event()
            assert r.code == 503 and b"too many connections from 127.0.0.1" in r.body, r
        other = connect_from("127.0.0.3", port)  # another address still gets in
        other.sendall(HEALTHZ)
        assert other.recv(1000).startswith(b"HTTP/1.1 200 ")
        other.close()
    finally:
        held.pop().close()
    wait_for(lambda: request(b, "GET", "/healthz").status == 200, what="a slot of 127.0.0.1 freed")
    for s in held:
        s.close()


def test_the_allow_list_applies_to_the_http_port(broker_factory, tmp_path):
    config = with_http(secured_config(tmp_path))
    write_acl(config["security"]["acl_file"], allow=["127.0.0.1"])
    b = broker_factory(config)
    reply = read_until_closed(connect_from("127.0.0.2", http_port(b)))  # refused before a request is even sent
    assert reply.startswith(b"HTTP/1.1 503 ") and b"127.0.0.2 is not in the allow-list" in reply, reply
    s = connect_from("127.0.0.2", http_port(b))
    try:
        s.sendall(HEALTHZ)  # even the open /healthz: closed unanswered (a reset, as the request was never read)
        assert not read_until_closed(s).startswith(b"HTTP/1.1 200 ")
    except ConnectionResetError:
        pass
    finally:
        s.close()
    s = connect_from("127.0.0.1", http_port(b))
    s.sendall(HEALTHZ)
    assert s.recv(1000).startswith(b"HTTP/1.1 200 ")
    s.close()
