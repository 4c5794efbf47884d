"""Named limits, each tested at the limit and one past it (DESIGN §5)."""

import os
import socket
import time

import pytest

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.client.local import small_config
from metaq.protocol.stream import CLOSED
from tests.harness.broker import wait_for


@pytest.fixture
def limited(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", limits={"max_line_bytes": 256, "max_body_bytes": 4096,
                                                   "max_connections": 20, "max_connections_per_address": 20,
                                                   "idle_timeout_s": 1.5,
                                                   "request_timeout_s": 1.0})
    return broker_factory(cfg)


def test_line_at_the_limit_and_one_past(limited):
    with limited.client() as c:
        line = b"stats " + b"x" * (256 - len(b"stats ") - 2) + b" 1"
        assert len(line) == 256
        c.send(line + b"\r\n")
        assert c.read_event().code == 200
        c.send(b"stats " + b"x" * (256 - len(b"stats ") - 1) + b" 2\r\n")
        r = c.read_event()
        assert r.code == 400 and b"longer than 256" in r.body
        assert c.read_event() is CLOSED


def test_body_at_the_limit_and_one_past(limited):
    with limited.client() as c:
        body = b"b" * 4096
        r = c.call(ev.Put("test", 0, 0, body, 1, metaq_checksum(body)))
        assert r.code == 200
        # one past: the reply comes before the body is sent, then the connection closes
        c.send(b"put test 0 4097 0 -1 2\r\n")
        r = c.read_event()
        assert r.code == 400 and b"4097" in r.body and r.opaque == 2
        assert c.read_event() is CLOSED
    with limited.client() as c:
        assert c.call(ev.Offset("test", "g", 0, 99, 3)).body == b"1"  # only the first was stored


def test_connections_at_the_limit_and_one_past(limited):
    clients = [limited.client() for _ in range(20)]
    try:
        for i, c in enumerate(clients):
            assert c.call(ev.Version(i)).code == 200
        extra = limited.client()
        r = extra.read_event()
        assert r.code == 503 and b"too many connections" in r.body
        assert extra.read_event() is CLOSED
        clients.pop().close()
        wait_for(lambda: clients[0].stats_dict()["curr_connections"] == "19", what="the closed connection uncounted")
        with limited.client() as again:
            assert again.call(ev.Version(99)).code == 200
    finally:
        for c in clients:
            c.close()


def test_idle_connection_kept_below_the_limit_and_closed_past_it(limited):
    with limited.client() as c:
        time.sleep(0.7)
        assert c.call(ev.Version(1)).code == 200  # idle 0.7 s < 1.5 s: still open
        time.sleep(2.5)
        c.send(b"version 2\r\n")
        assert c.read_event() is CLOSED


def test_partial_request_dropped_after_request_timeout(limited):
    with limited.client() as c:
        c.send(b"put test 0 10 0 -1 1\r\nhal")  # body never completes
        started = time.monotonic()
        assert c.read_event() is CLOSED
        assert time.monotonic() - started > 0.8  # not before the request timeout
    with limited.client() as c:
        assert c.call(ev.Offset("test", "g", 0, 9, 2)).body == b"0"  # nothing half-stored


def test_a_request_trickled_in_byte_by_byte_meets_the_same_deadline(limited):
    """The request deadline runs from a request's first byte: a byte every 0.3 s does not keep it alive."""
    with limited.client() as c:
        c.send(b"put test 0 10 0 -1 1\r\n")
        started = time.monotonic()
        closed_after = None
        for _ in range(40):  # 12 s of trickling, far past the 1 s deadline
            time.sleep(0.3)
            try:
                c.send(b"x")
            except OSError:
                closed_after = time.monotonic() - started
                break
        assert closed_after is not None and closed_after < 6.0  # by the deadline, not kept alive by the trickle
    with limited.client() as c:
        assert c.call(ev.Offset("test", "g", 0, 9, 2)).body == b"0"  # nothing half-stored


def test_whole_requests_streamed_past_the_deadline_are_all_served(limited):
    """Progress restarts the deadline: a producer always mid-frame for longer than request_timeout is served."""

    def frame(n):
        body = b"m%03d" % n
        return b"put test 1 %d 0 %d %d\r\n%s" % (len(body), metaq_checksum(body), n, body)

    with limited.client() as c:
        started = time.monotonic()
        c.send(frame(0)[:10])
        n = 0
        while time.monotonic() - started < 2.5:  # 2.5 s > the 1 s request timeout, never between frames
            time.sleep(0.1)
            c.send(frame(n)[10:] + frame(n + 1)[:10])  # the next frame begins before this one is answered
            r = c.read_event()
            assert r.code == 200 and r.opaque == n
            n += 1
        c.send(frame(n)[10:])
        assert c.read_event().opaque == n
        assert n > 10
    with limited.client() as c:
        assert c.call(ev.Offset("test", "g", 1, 9999, 2)).body == b"%d" % (n + 1)  # every one stored


@pytest.mark.slow
def test_two_thousand_idle_connections_while_serving(broker):
    idle = []
    try:
        for _ in range(2000):
            idle.append(socket.create_connection(("127.0.0.1", broker.port), timeout=10))
        with broker.client() as c:
            for i in range(100):
                c.put_ok("test", b"m%d" % i, i % 4)
            assert len(c.get_records("test", 0, 0)) == 25
            deadline = time.monotonic() + 10
            while int(c.stats_dict()["curr_connections"]) < 2001 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert int(c.stats_dict()["curr_connections"]) == 2001
        # every idle connection is still served
        for s in idle[::200]:
            s.sendall(b"version 5\r\n")
            assert s.recv(100).startswith(b"result 200")
    finally:
        for s in idle:
            s.close()


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def test_disconnects_mid_frame_store_nothing_and_leak_nothing(broker):
    with broker.client() as c:
        c.put_ok("test", b"baseline", 0)
        time.sleep(0.2)
        fds_before = open_fds(broker.proc.pid)
    cuts = [b"put test 0 10 0 -1 1", b"put test 0 10 0 -1 1\r\n", b"put test 0 10 0 -1 1\r\nhalf",
            b"get test g 0 0 10", b"stat"]
    for _ in range(40):
        for cut in cuts:
            s = socket.create_connection(("127.0.0.1", broker.port))
            s.sendall(cut)
            s.close()
    with broker.client() as c:
        assert c.call(ev.Offset("test", "g", 0, 99, 1)).body == b"1"  # nothing of the cut puts stored
        # each cut connection ends when its broker greenlet reads the close: waited for, then asserted
        wait_for(lambda: c.stats_dict()["curr_connections"] == "1" and open_fds(broker.proc.pid) <= fds_before + 1,
                 what=lambda: "the cut connections closed: %s connections, %d fds (%d before)" % (
                     c.stats_dict()["curr_connections"], open_fds(broker.proc.pid), fds_before))
        assert c.stats_dict()["curr_connections"] == "1"
        assert open_fds(broker.proc.pid) <= fds_before + 1
    assert "Traceback" not in broker.log_text()
