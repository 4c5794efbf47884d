"""Malformed input against a live broker (F11, F12): a well-formed reply or a clean close, never a dead broker."""

import random
import socket
import time

import pytest

from metaq import limits
from metaq.protocol import events as ev
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser
from metaq.limits import CLOSE_DRAIN_BYTES, CLOSE_DRAIN_S

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


def replies_or_close(sock, until_opaque=None, quiet_s=0.5):
    """Replies until one carries ``until_opaque``, the broker closes or goes quiet (``quiet_s``); fails on anything
    unparseable."""
    parser = TextParser(max_body=1 << 20)
    sock.settimeout(quiet_s)
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


def test_a_body_past_the_limit_sent_whole_gets_its_400_then_the_close(broker):
    """The usual client sends a put's line and body in one go and reads after: the refusal (400, then the close) must
    reach it, not a reset because the broker closed with the body unread; and the broker serves the next client."""
    body = b"x" * (limits.MAX_BODY_BYTES + 1024 * 1024)
    for i in range(5):
        s = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        try:
            s.sendall(b"put test 0 %d 0 %d\r\n" % (len(body), i) + body)  # broken pipe here without the drain
            replies, closed = replies_or_close(s)
        finally:
            s.close()
        assert closed and [(r.code, r.opaque) for r in replies] == [(400, i)], replies
        assert b"exceeds the limit of" in replies[0].body
    with broker.client() as c:
        assert c.put_ok("test", b"after the refusals", 0)[2] >= 0


def test_a_refused_client_that_keeps_sending_or_stops_is_closed_within_the_drains_bounds(broker):
    """What is read and dropped after the refusal is bounded: the refusal and the end of the replies come at once,
    what the client sends after them is dropped until ``CLOSE_DRAIN_S`` has passed, then the connection is gone
    (reset); a client that sends on past ``CLOSE_DRAIN_BYTES`` is cut once they are read."""
    quiet = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    quiet.sendall(b"put test 0 %d 0 1\r\n" % (limits.MAX_BODY_BYTES * 2) + b"x" * 1000)
    replies, closed = replies_or_close(quiet)
    assert closed and [r.code for r in replies] == [400]
    quiet.sendall(b"x" * 1000)  # read and dropped
    time.sleep(CLOSE_DRAIN_S + 1)
    with pytest.raises(OSError):  # the broker no longer reads: reset
        for _ in range(20):
            quiet.sendall(b"x" * 1000)
            time.sleep(0.05)
    quiet.close()
    flood = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    flood.sendall(b"put test 0 %d 0 2\r\n" % (CLOSE_DRAIN_BYTES * 2))
    sent, chunk = 0, b"x" * (1 << 20)
    with pytest.raises(OSError):  # the broker stops reading, and resets, once CLOSE_DRAIN_BYTES are dropped
        while sent <= CLOSE_DRAIN_BYTES * 2:
            flood.sendall(chunk)
            sent += len(chunk)
    flood.close()
    assert CLOSE_DRAIN_BYTES <= sent < CLOSE_DRAIN_BYTES * 2
    with broker.client() as c:
        assert c.put_ok("test", b"after the refusals", 0)[2] >= 0
