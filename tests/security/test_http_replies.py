"""HTTP replies have a byte budget (issue 42 point 3; docs/limits.md, ``limits.max_http_unsent_bytes``).

Clients that send a request and never read the answer held the whole reply each (150 of them, 1.4 MiB each).
Now the port's unread replies are counted in all: past the budget a new request is answered 503 at once (its
reply never produced), and a reply not read within ``request_timeout_s`` closes its connection, which lets it go.
Real broker; the readers that never read use a small receive buffer so that the kernel cannot take the reply."""

import socket
import time

from metaq.client.local import small_config
from metaq.server.http.server import UnsentReplies
from tests.harness.broker import wait_for
from tests.harness.http import http_port, request, with_http

TOPIC = "t-big"
BODY = b"x" * 60_000
PATH = "/api/topics/%s/partitions/0/messages?offset=0&max_bytes=1048576" % TOPIC


def test_the_budget_is_full_only_past_its_limit():
    unsent = UnsentReplies(limit=1000, send_s=1.0)
    unsent.held = 1000
    assert not unsent.full()  # at the limit: served
    unsent.held = 1001
    assert unsent.full()  # one past: refused


def never_reads(broker):
    """A connection that asks for a large reply and never reads it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", http_port(broker)))
    s.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % PATH.encode())
    return s


def drain(sock, wait_s=3.0):
    """``(bytes, closed)``: what the broker sent on ``sock``, read now, and whether it closed the connection."""
    sock.settimeout(wait_s)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got, True
            got += chunk
    except TimeoutError:
        return got, False


def test_readers_that_never_read_fill_the_budget_then_are_closed_and_others_are_served(broker_factory, tmp_path):
    cfg = with_http(small_config(tmp_path / "data"))
    cfg["limits"].update({"max_http_unsent_bytes": 1 << 16, "request_timeout_s": 3})
    broker = broker_factory(cfg, workdir=tmp_path)
    with broker.client() as c:
        for _ in range(16):
            c.put_ok(TOPIC, BODY, partition=0)
    assert request(broker, "GET", PATH).status == 200  # a reader that reads: about 1.3 MB of JSON
    stuck = [never_reads(broker) for _ in range(3)]
    try:
        def refused():
            r = request(broker, "GET", "/api/broker")
            return r if r.status == 503 else None
        r = wait_for(refused, 10, "a request refused while the unread replies pass the budget")
        assert "max_http_unsent_bytes" in r.json()["error"] and r.headers.get("Retry-After") == "1"
        started = time.monotonic()
        wait_for(lambda: request(broker, "GET", "/api/broker").status == 200, 15,
                 "the readers that never read closed after request_timeout_s, their replies let go")
        assert time.monotonic() - started < 10
        answers = [drain(s) for s in stuck]
        partial = [got for got, closed in answers if got.startswith(b"HTTP/1.1 200")]
        assert partial and all(len(got) < 1_200_000 for got in partial)  # closed short of the whole reply
        assert all(closed for got, closed in answers if got.startswith(b"HTTP/1.1 200"))
        assert all(got.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")) for got, _ in answers), answers
        assert "not read within 3 s; closing" in broker.log_text()
    finally:
        for s in stuck:
            s.close()
    assert request(broker, "GET", PATH).status == 200  # and the port serves large replies again
