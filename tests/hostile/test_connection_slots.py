"""Issue 15 points 3 and 4: one host cannot take every connection slot, and a slow request cannot hold one.

``limits.max_connections`` is one cap over every port; ``limits.max_connections_per_address`` (by
default half of it) is what one peer address may hold; ``limits.request_timeout_s`` is a deadline for
a whole request from its first byte.
"""

import socket
import time

from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient, TextClient
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize
from tests.harness.broker import wait_for
from tests.hostile.common import quiet_socket


def call(sock, event):
    """One request on a raw socket and its reply."""
    sock.settimeout(5)
    sock.sendall(serialize(event))
    parser = TextParser()
    while True:
        parser.receive_data(sock.recv(65536))
        reply = parser.next_event()
        if reply is not NEED_DATA:
            return reply


def served_again(port):
    with TextClient("127.0.0.1", port) as c:
        return c.call(ev.Version(2)).code == 200


def grab_all(port, source, limit=200):
    """Open connections from ``source`` until the broker turns one away; returns (held, the refused one)."""
    held = []
    for _ in range(limit):
        s = quiet_socket(port, source=source)
        s.settimeout(0.3)
        try:
            data = s.recv(4096)  # a served connection says nothing; a refused one answers and closes
        except socket.timeout:
            held.append(s)
            continue
        return held, (s, data)
    raise AssertionError("no connection was refused after %d" % limit)


def test_one_host_gets_its_share_and_another_host_is_still_served(broker_factory, tmp_path):
    broker = broker_factory(rmq_config(tmp_path / "data", limits={"max_connections": 12}))  # 6 per address
    held, (refused, answer) = grab_all(broker.port, "127.0.0.1")
    try:
        assert len(held) == 6
        assert answer == b"result 503 63 0\r\ntoo many connections from 127.0.0.1: the limit is 6 per address"
        refused.close()
        # The remoting port counts toward the same address: the host has no slot left there either.
        with RemotingClient(broker.config["remoting"]["port"]) as rc:
            assert rc.is_closed()
        # Another host is served, and writes work.
        other = quiet_socket(broker.port, source="127.0.0.2", rcvbuf=65536)
        try:
            assert call(other, ev.Version(1)).code == 200
            assert call(other, ev.Put("slots", 0, 0, b"still writable", 2)).code == 200
        finally:
            other.close()
    finally:
        for s in held:
            s.close()
    # Once the host lets go, it is served again without a restart.
    wait_for(lambda: served_again(broker.port), what="127.0.0.1 to be served again")
    with broker.client() as c:
        assert [r.data for r in c.get_records("slots", 0, 0)] == [b"still writable"]


def test_a_trickled_request_loses_its_slot_at_the_deadline(broker_factory, tmp_path):
    """Slowloris: one byte of a put line every 0.2 s. The request deadline runs from its first byte."""
    broker = broker_factory(rmq_config(tmp_path / "data", limits={"max_connections": 4,
                                                                    "max_connections_per_address": 4,
                                                                    "request_timeout_s": 1.0}))
    slow = [socket.create_connection(("127.0.0.1", broker.port)) for _ in range(4)]
    line = b"put slots 0 1000 0 0 1\r\n"
    started = time.monotonic()
    closed_at = [None] * len(slow)
    try:
        for i in range(len(line) - 1):
            for k, s in enumerate(slow):
                if closed_at[k] is None:
                    try:
                        s.send(line[i:i + 1])
                    except OSError:
                        closed_at[k] = time.monotonic() - started
            time.sleep(0.2)
            if all(c is not None for c in closed_at):
                break
        for s in slow:  # whatever the sends saw, the broker has closed each one
            s.settimeout(1)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
        assert all(c is None or c < 3.0 for c in closed_at)
        # All the slots are free again: a client is served at once.
        with TextClient("127.0.0.1", broker.port) as c:
            assert c.call(ev.Version(1)).code == 200
    finally:
        for s in slow:
            s.close()
    assert broker.log_text().count("a partial request for 1 s; closing") >= 4


def test_remoting_connections_past_the_cap_are_refused_and_puts_keep_working(broker_factory, tmp_path):
    """The remoting port once had no cap (1,100 idle connections exhausted the descriptors)."""
    broker = broker_factory(rmq_config(tmp_path / "data", limits={"max_connections": 10,
                                                                    "max_connections_per_address": 10}))
    port = broker.config["remoting"]["port"]
    idle = [RemotingClient(port) for _ in range(9)]
    try:
        with TextClient("127.0.0.1", broker.port) as c:  # the tenth slot
            # every idle connection accepted before the one past the cap (a loaded machine may lag)
            wait_for(lambda: c.stats_dict()["remoting_connections"] == "9", 10, "the nine idle connections accepted")
            extra = RemotingClient(port)
            assert extra.is_closed()
            extra.close()
            c.put_ok("slots", b"at the cap", partition=1)
            assert [r.data for r in c.get_records("slots", 1, 0)] == [b"at the cap"]
        r = idle[0].call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "slots"})
        assert r.code == ResponseCode.SUCCESS
    finally:
        for rc in idle:
            rc.close()


def test_unfinished_requests_hold_at_most_the_broker_wide_budget_and_others_still_put(broker_factory, tmp_path):
    # an attack review: 100 connections each sending 15 MiB of a 16 MiB remoting frame and stopping held 1.5 GB
    import socket as _socket

    from metaq.client.local import rmq_config
    from tests.hostile.common import hang_up, rss_bytes

    budget = 8 << 20
    b = broker_factory(rmq_config(tmp_path / "data", limits={"max_partial_request_bytes": budget,
                                                             "request_timeout_s": 20}))
    port = b.config["remoting"]["port"]
    before = rss_bytes(b.proc.pid)
    frame_len = 4 << 20
    attackers = []
    for _ in range(16):  # 16 x 3 MiB of 4 MiB frames: six times the budget, if nothing held them back
        s = _socket.create_connection(("127.0.0.1", port))
        s.sendall(frame_len.to_bytes(4, "big") + (60).to_bytes(4, "big"))
        s.setblocking(False)
        sent = 0
        try:
            while sent < 3 << 20:
                sent += s.send(b"\0" * min(1 << 20, (3 << 20) - sent))
        except BlockingIOError:
            pass  # the broker stopped reading this one: it waits for room
        attackers.append(s)
    time.sleep(2)
    grown = rss_bytes(b.proc.pid) - before
    assert grown < budget + (16 << 20), grown  # the budget and the sockets' buffers, not 48 MiB of frames
    assert "unfinished requests hold" in b.log_text() and "this one waits" in b.log_text()
    with b.client() as c:  # a text client's small puts do not wait (they hold nothing unfinished long)
        c.put_ok("after", b"fine")
    for s in attackers:
        hang_up(s)
