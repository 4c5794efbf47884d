"""Malformed input against a live broker (F11, F12): a well-formed reply or a clean close, never a dead broker."""

import random
import socket

import pytest

from metaq.protocol import events as ev
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser

WORDS = [b"put", b"get", b"offset", b"stats", b"version", b"quit", b"transaction", b"sync", b"value", b"result",
         b"test", b"g", b"-1", b"0", b"5", b"99999999999", b"-2147483649", b"TX:a:1", b"XID:1:ab:cd:q", b"\xff\xfe"]


def garbage(rng):
    kind = rng.randrange(3)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    tokens = [rng.choice(WORDS) for _ in range(rng.randrange(1, 9))]
    line = b" ".join(tokens) + rng.choice([b"\r\n", b"\n", b"\r\n\r\n", b""])
    if kind == 2:
        line += bytes(rng.randrange(256) for _ in range(rng.randrange(0, 20)))
    return line


def replies_or_close(sock, until_opaque=None):
    """Replies until one carries ``until_opaque``, the broker closes or goes quiet; fails on anything unparseable."""
    parser = TextParser(max_body=1 << 20)
    sock.settimeout(0.5)
    out = []
    while True:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            return out, False
        parser.receive_data(data)
        while True:
            event = parser.next_event()  # raises if the broker ever sent a malformed frame
            if event is NEED_DATA:
                break
            if event is CLOSED:
                return out, True
            assert isinstance(event, (ev.Result, ev.Value)), event
            out.append(event)
            if until_opaque is not None and event.opaque == until_opaque:
                return out, False


@pytest.mark.fault
def test_random_garbage_gets_clean_answers_and_the_broker_keeps_serving(broker):
    rng = random.Random(20261122)
    for _ in range(150):
        payload = garbage(rng)
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        s.sendall(payload + b"\r\nversion 777\r\n")
        replies, closed = replies_or_close(s, until_opaque=777)
        s.close()
        assert all(r.code in (200, 301, 400, 404, 500, 503) for r in replies if isinstance(r, ev.Result))
        # either the stream resynchronised (the version after the garbage is answered) or it was closed cleanly
        assert closed or any(getattr(r, "opaque", None) == 777 for r in replies), (payload, replies)
    with broker.client() as c:
        assert c.call(ev.Version(1)).code == 200
        assert c.put_ok("test", b"still fine", 0)[2] >= 0
    assert "Traceback" not in broker.log_text()


def test_declaring_huge_bodies_allocates_nothing(broker):
    def rss_kib():
        with open("/proc/%d/status" % broker.proc.pid) as f:
            return int(next(line for line in f if line.startswith("VmRSS")).split()[1])

    before = rss_kib()
    for i in range(100):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
        s.sendall(b"put test 0 2147483647 0 -1 %d\r\n" % i)
        replies, closed = replies_or_close(s)
        s.close()
        assert closed and replies[0].code == 400 and b"exceeds the limit" in replies[0].body
    assert rss_kib() - before < 20 * 1024  # no 2 GiB buffers were ever allocated
