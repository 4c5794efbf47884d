"""The connection core (serving/connections.py) with Unix socket pairs: no listening socket, no network."""

import logging
import time

import gevent
from gevent import socket

from metaq.protocol.text import TextParser
from metaq import limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.serving.proxies import TrustedProxies
from metaq.serving.connections import (PARKED, RECV_BYTES, WHEEL_TICK_S, Connection, ConnectionCore, ConnectionLimits,
                                      HandshakeRate, Listener, Penalties, ReplyBudget, Strangers)


class Echo(Connection):
    """Answers each complete line with ``ok``; ``busy`` while a line is being answered slowly."""

    def __init__(self, sock, address, conn_id, timeouts, slow=0.0):
        super().__init__(sock, address, conn_id, timeouts)
        self.parser = TextParser()
        self.slow = slow
        self.busy = False
        self.ended = None

    def serve(self):
        while True:
            data = self.receive()
            if not data:
                self.ended = "deadline or close"
                return
            self.parser.receive_data(data)
            while type(self.parser.next_event()).__name__ == "Version":
                self.busy = True
                gevent.sleep(self.slow)
                self.sock.sendall(b"ok\r\n")
                self.busy = False


class ParkingEcho(Echo):
    """Echo, served in turns: holds no greenlet while idle (``Connection.parks``)."""

    parks = True

    def serve(self):
        data = self.receive()
        while data is not PARKED:
            if not data:
                self.ended = "deadline or close"
                return
            self.parser.receive_data(data)
            while type(self.parser.next_event()).__name__ == "Version":
                self.sock.sendall(b"ok\r\n")
            data = self.receive()


def listener(core, name, made, slow=0.0, refuse=None, headroom=0, kind=Echo):
    def make(sock, address, conn_id):
        conn = kind(sock, address, conn_id, core.rules, slow)
        made.append(conn)
        return conn

    return Listener(name, "127.0.0.1", 0, make, refuse, 1, headroom)


def connect(core, lst, host="127.0.0.1"):
    """A connected Unix socket pair: the server side served by the core on its own greenlet, as from ``host``."""
    ours, theirs = socket.socketpair()
    g = gevent.spawn(core.accept, lst, theirs, (host, 40000))
    gevent.sleep(0)
    return ours, g


def test_one_cap_across_listeners_refuses_in_each_listeners_words(caplog):
    core = ConnectionCore(3, ConnectionLimits(60, 60))
    made = []
    refusals = []
    text = listener(core, "text", made, refuse=lambda sock, reason: refusals.append(reason) or sock.sendall(b"503\r\n"))
    other = listener(core, "remoting", made)
    clients = [connect(core, text), connect(core, other), connect(core, text)]
    assert core.count() == 3 and core.count("text") == 2 and core.count("remoting") == 1
    assert sorted(c.conn_id for c in made) == [1, 2, 3]  # ids unique across listeners
    with caplog.at_level(logging.WARNING):
        extra, g = connect(core, text)  # one past the cap, on the text port: its refusal, then closed
        g.join(5)
        assert extra.recv(100) == b"503\r\n" and extra.recv(100) == b""
        extra2, g2 = connect(core, other)  # one past, on a port without words: closed
        g2.join(5)
        assert extra2.recv(100) == b""
    assert refusals == ["too many connections: the limit is 3"]
    assert "on the remoting port: too many connections: the limit is 3 (3 connections open)" in caplog.text
    assert core.count() == 3 and len(made) == 3 and core.count("text") == 2  # the refused are not counted
    ours, g = clients.pop()
    ours.close()
    g.join(5)
    assert core.count() == 2 and core.count("text") == 1 and core.count("remoting") == 1
    again, _g = connect(core, text)  # a place was freed
    again.sendall(b"version 1\r\n")
    assert again.recv(100) == b"ok\r\n"
    assert core.count("text") == 2 and core.count("http") == 0
    core.shutdown(1.0)


def test_a_listener_with_headroom_is_served_past_the_cap_and_refused_past_its_headroom():
    """Clients that fill the cap do not lock slaves out of the replication port (limits.REPLICATION_HEADROOM)."""
    core = ConnectionCore(2, ConnectionLimits(60, 60))
    made = []
    text = listener(core, "text", made)
    repl = listener(core, "replication", made, headroom=1)
    clients = [connect(core, text), connect(core, text)]
    extra, g = connect(core, text)
    g.join(5)
    assert extra.recv(10) == b""  # the cap: 2
    slave, g_slave = connect(core, repl)  # within the replication port's headroom
    assert not g_slave.dead and core.count() == 3 and core.count("replication") == 1
    second, g2 = connect(core, repl)  # past cap + headroom
    g2.join(5)
    assert second.recv(10) == b"" and core.count() == 3
    core.shutdown(1.0)
    for sock, _g in clients + [(slave, g_slave)]:
        sock.close()


def test_close_hooks_run_for_every_connection_even_when_one_fails():
    core = ConnectionCore(10, ConnectionLimits(60, 60))
    closed = []
    core.on_close(lambda conn: 1 / 0)
    core.on_close(lambda conn: closed.append(conn.conn_id))
    lst = listener(core, "text", [])
    ours, g = connect(core, lst)
    ours.close()
    g.join(5)
    assert closed == [1] and core.count() == 0


def test_a_request_must_complete_within_the_deadline_from_its_first_byte():
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=0.5))
    made = []
    ours, g = connect(core, listener(core, "text", made))
    ours.sendall(b"vers")
    sent = 0
    for _ in range(20):  # a byte every 0.1 s: each recv is quick, the request never completes
        if g.dead:
            break
        gevent.sleep(0.1)
        try:
            ours.sendall(b"i")
        except OSError:
            break
        sent += 1
    g.join(5)
    assert made[0].ended == "deadline or close"
    assert sent < 20, "the trickle went on for 2 s: the 0.5 s deadline did not cut it"


def test_a_put_whose_line_then_body_trickle_in_meets_one_deadline():
    """The deadline is the whole request's: a header line that completes does not restart it for the body.

    Pieces 0.15 s apart: the line is complete at 0.3 s, the body would be at 1.05 s. With the clock restarted
    at the line the request would complete (0.3 + 0.8 > 1.05); from its first byte it is cut at 0.8 s.
    """
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=0.8))
    made = []
    ours, g = connect(core, listener(core, "text", made))
    pieces = [b"put t 0 ", b"10 0 -1 1", b"\r\n", b"ab", b"cd", b"ef", b"gh", b"ij"]
    sent = 0
    for piece in pieces:
        if g.dead:
            break
        try:
            ours.sendall(piece)
        except OSError:
            break
        sent += 1
        gevent.sleep(0.15)
    g.join(5)
    assert made[0].ended == "deadline or close"  # never answered: the request was cut
    assert sent < len(pieces), "the whole request went in: the deadline restarted at the line"


def test_whole_requests_restart_the_deadline():
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=0.5))
    ours, g = connect(core, listener(core, "text", []))
    ours.sendall(b"vers")
    for n in range(12):  # 1.2 s always inside a request, but each one completes within 0.1 s
        gevent.sleep(0.1)
        ours.sendall(b"ion %d\r\nvers" % n)
        assert ours.recv(100) == b"ok\r\n"
    assert not g.dead
    ours.close()
    g.join(5)


def test_an_idle_connection_is_closed_after_the_idle_timeout():
    core = ConnectionCore(10, ConnectionLimits(idle_s=0.3, request_s=60))
    ours, g = connect(core, listener(core, "text", []))
    g.join(5)
    assert g.dead and ours.recv(10) == b"" and core.count() == 0


def test_shutdown_closes_idle_at_once_lets_busy_finish_and_keeps_named_listeners():
    core = ConnectionCore(10, ConnectionLimits(60, 60))
    made = []
    text = listener(core, "text", made, slow=0.3)
    repl = listener(core, "replication", made)
    idle, g_idle = connect(core, text)
    busy, g_busy = connect(core, text)
    kept, g_kept = connect(core, repl)
    busy.sendall(b"version 1\r\n")
    gevent.sleep(0.05)
    assert made[1].busy
    started = time.monotonic()
    core.shutdown(30.0, keep=("replication",))
    assert 0.2 < time.monotonic() - started < 30.0  # waited for the busy one (0.3 s), not the whole grace
    assert busy.recv(100) == b"ok\r\n"  # its request was answered before the close
    g_idle.join(1)
    g_busy.join(1)
    assert g_idle.dead and g_busy.dead and not g_kept.dead
    assert core.closing
    late, g_late = connect(core, repl)  # no new connection anywhere once closing
    g_late.join(1)
    assert late.recv(10) == b""
    core.close_listener(repl)
    g_kept.join(1)
    assert g_kept.dead and core.count() == 0


def test_one_address_is_refused_past_its_cap_while_another_is_served():
    core = ConnectionCore(10, ConnectionLimits(60, 60), max_per_address=2)
    refusals = []
    text = listener(core, "text", [], refuse=lambda sock, reason: refusals.append(reason))
    repl = listener(core, "replication", [], headroom=1)
    mine = [connect(core, text), connect(core, text)]  # at the limit: 2 from 127.0.0.1
    extra, g = connect(core, text)  # one past
    g.join(5)
    assert extra.recv(10) == b""
    assert refusals == ["too many connections from 127.0.0.1: the limit is 2 per address"]
    other, g_other = connect(core, text, host="127.0.0.2")  # another host still gets in
    slave, g_slave = connect(core, repl)  # a slave on the same host: the replication port is not counted
    assert not g_other.dead and not g_slave.dead
    assert core.count_from("127.0.0.1") == 2 and core.count_from("127.0.0.2") == 1
    ours, g_mine = mine.pop()
    ours.close()
    g_mine.join(5)
    assert core.count_from("127.0.0.1") == 1
    again, g_again = connect(core, text)  # a place of that address was freed
    again.sendall(b"version 1\r\n")
    assert again.recv(100) == b"ok\r\n"
    core.shutdown(1.0)
    for sock in [again, other, slave] + [s for s, _g in mine]:
        sock.close()
    gevent.joinall([g_again, g_other, g_slave], timeout=5)
    assert core.count_from("127.0.0.1") == 0  # nothing held once they are gone


def test_reply_budget_lets_replies_up_to_the_limit_through_and_holds_one_past():
    budget = ReplyBudget(100)
    assert budget.reserve(60, lambda: False) and budget.reserve(40, lambda: False)  # exactly the limit
    assert budget.would_wait(1)
    waiter = gevent.spawn(budget.reserve, 1, lambda: False)  # one byte past: waits
    gevent.sleep(0.05)
    assert not waiter.ready()
    budget.release(60)  # a reply was sent
    assert waiter.get(timeout=5) is True and budget.held == 41


def test_reply_budget_serves_one_reply_larger_than_the_limit_and_gives_up_on_close():
    budget = ReplyBudget(100)
    assert budget.reserve(500, lambda: False)  # nothing held: a record larger than the limit still goes
    closed = []
    waiter = gevent.spawn(budget.reserve, 10, lambda: bool(closed))
    gevent.sleep(0.05)
    closed.append(True)
    budget.wake()
    assert waiter.get(timeout=5) is False and budget.held == 500


def test_a_flood_of_refusals_writes_one_log_line_a_second(caplog):
    core = ConnectionCore(1, ConnectionLimits(60, 60))
    text = listener(core, "text", [])
    held = connect(core, text)
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            extra, g = connect(core, text)
            g.join(5)
            extra.close()
        assert caplog.text.count("refused a connection") == 1
        time.sleep(1.05)
        extra, g = connect(core, text)
        g.join(5)
        extra.close()
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(lines) == 2 and lines[1].endswith("and 49 more since the last such line")  # 49 unlogged + this one
    core.shutdown(1.0)
    held[0].close()


def test_a_port_with_headroom_takes_at_most_a_few_connections_from_one_address():
    """One host cannot take the replication port's headroom (limits.HEADROOM_PER_ADDRESS)."""
    from metaq import limits

    core = ConnectionCore(2, ConnectionLimits(60, 60), max_per_address=1)
    repl = listener(core, "replication", [], headroom=limits.REPLICATION_HEADROOM)
    held = [connect(core, repl) for _ in range(limits.HEADROOM_PER_ADDRESS)]  # at the limit
    assert core.count_from("127.0.0.1", "replication") == limits.HEADROOM_PER_ADDRESS
    extra, g = connect(core, repl)  # one past
    g.join(5)
    assert extra.recv(10) == b""
    slave, g_slave = connect(core, repl, host="127.0.0.2")  # a slave on another host still gets in
    assert not g_slave.dead
    core.shutdown(1.0)
    for sock, _g in held + [(slave, g_slave)]:
        sock.close()


def test_the_tls_handshake_rate_per_address_and_one_past():
    rate = HandshakeRate(5)
    assert [rate.take("10.0.0.1", 100.0) for _ in range(11)] == [True] * 10 + [False]  # a burst of 2 x 5, one past
    assert rate.take("10.0.0.2", 100.0)  # another address has its own
    assert not rate.take("10.0.0.1", 100.1)  # 0.5 of a token back
    assert rate.take("10.0.0.1", 100.3)  # 1.5: one more
    assert [rate.take("10.0.0.1", 200.0) for _ in range(11)].count(True) == 10  # refilled, never past the burst
    assert rate.refused == 3
    for i in range(limits.MAX_TLS_RATE_ADDRESSES + 5):
        rate.take("h%d" % i, 300.0)
    assert rate.addresses == limits.MAX_TLS_RATE_ADDRESSES


def test_a_cooldown_doubles_at_each_cut_in_a_row_and_is_forgotten_after_max_s_uncut():
    pen = Penalties(limit=100, max_s=8.0)
    key = ("grpc", "10.0.0.1")
    assert pen.refusal(key, 0.0) is None
    assert [pen.cut(key, 1.0, t) for t in (0.0, 1.0, 3.0, 7.0, 15.0)] == [1.0, 2.0, 4.0, 8.0, 8.0]  # up to max_s
    assert "cut 5 times" in pen.refusal(key, 22.9) and pen.refusal(key, 23.0) is None
    assert pen.refusal(("text", "10.0.0.1"), 16.0) is None and pen.refusal(("grpc", "10.0.0.2"), 16.0) is None
    assert pen.cut(key, 1.0, 31.0) == 1.0  # max_s past its cooldown uncut: starts again
    assert pen.refused == 1


def test_an_ipv6_host_is_penalized_by_its_64_an_ipv4_one_by_itself_and_a_base_past_max_s_never_doubles():
    """One IPv6 host holds a whole /64: another address of it is refused with the one cut."""
    pen = Penalties(limit=100, max_s=8.0)
    pen.cut(("grpc", "2001:db8:1:2::1"), 1.0, 0.0)
    assert "2001:db8:1:2::/64" in pen.refusal(("grpc", "2001:db8:1:2:ffff::9"), 0.5)
    assert pen.refusal(("grpc", "2001:db8:1:3::1"), 0.5) is None  # the next /64 is another host
    pen.cut(("grpc", "10.0.0.1"), 1.0, 0.0)
    assert pen.refusal(("grpc", "::ffff:10.0.0.1"), 0.5) is not None and pen.refusal(("grpc", "10.0.0.2"), 0.5) is None
    assert [pen.cut(("grpc", "10.0.0.3"), 20.0, t) for t in (0.0, 20.0, 40.0)] == [20.0, 20.0, 20.0]
    assert pen.refused == 2 and len(pen) == 3


def test_the_penalized_addresses_at_their_limit_and_one_past():
    pen = Penalties(limit=rmq5_limits.MAX_PENALIZED_ADDRESSES)
    for i in range(rmq5_limits.MAX_PENALIZED_ADDRESSES):
        pen.cut(("grpc", "h%d" % i), 10.0, float(i) / 1e6)
    assert len(pen) == rmq5_limits.MAX_PENALIZED_ADDRESSES and pen.refusal(("grpc", "h0"), 1.0) is not None
    pen.cut(("grpc", "one more"), 10.0, 1.0)  # one past: the one cut longest ago is forgotten
    assert len(pen) == rmq5_limits.MAX_PENALIZED_ADDRESSES
    assert pen.refusal(("grpc", "h0"), 1.0) is None and pen.refusal(("grpc", "h1"), 1.0) is not None
    assert pen.refusal(("grpc", "one more"), 1.0) is not None


def closed_after(sock, timeout=5.0):
    """Seconds until the broker side closed ``sock`` (what arrives meanwhile is dropped)."""
    started = time.monotonic()
    sock.settimeout(timeout)
    while sock.recv(100):
        pass
    return time.monotonic() - started


def test_strangers_at_their_cap_name_the_oldest_of_the_address_holding_the_most_once_old_enough():
    strangers = Strangers(login_s=10, cap=5, per_address=3, eviction_age_s=2.0)
    arrivals = [("a", 0.0), ("b", 0.1), ("a", 0.2), ("b", 0.3), ("b", 0.4)]  # b holds 3, a 2: the cap
    for n, (host, at) in enumerate(arrivals):
        assert strangers.room(host, at) == (None, None)
        strangers.arrive(host)
        strangers.wait(host, "%s%d" % (host, n), at)
    assert strangers.room("b", 5.0)[0] == "too many connections not yet logged in from b: the limit is 3 per address"
    refusal, victim = strangers.room("c", 1.9)  # all younger than the eviction age: none is named
    assert refusal == "too many connections not yet logged in: the limit is 5" and victim is None
    assert strangers.room("c", 2.1) == (None, "b1")  # the oldest of b (3), once 2 s old
    strangers.leave("b", "b1")
    strangers.arrive("c")
    strangers.wait("c", "c5", 2.1)
    assert strangers.room("d", 2.5) == (None, "a0")  # a and b hold 2 each: a came to 2 first
    strangers.leave("a", "a0")
    strangers.arrive("d")
    strangers.wait("d", "d6", 2.5)
    assert strangers.room("e", 2.6) == (None, "b3")  # b holds the most again
    strangers.leave("b", "b3")
    strangers.leave("b", "b4")  # logged in: no longer one to name
    strangers.arrive("e")
    strangers.wait("e", "e7", 2.6)
    strangers.arrive("e")
    strangers.wait("e", "e8", 2.6)
    assert strangers.room("f", 3.0) == (None, "a2")  # e holds the most, but young: the oldest of the next
    assert strangers.evicted == 4


def test_an_idle_parked_connection_holds_no_greenlet_and_is_served_when_bytes_arrive():
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=60), max_per_address=5)
    closed = []
    core.on_close(lambda conn: closed.append(conn.conn_id))
    made = []
    ours, g = connect(core, listener(core, "mqtt", made, kind=ParkingEcho))
    gevent.sleep(0.05)
    assert g.dead and core.count() == 1 and core.parked() == 1  # open, idle, and its accept's greenlet is gone
    gevent.sleep(0.5)  # long idle
    ours.sendall(b"version 1\r\nversion 2\r\n")
    got = b""
    while len(got) < 8:
        got += ours.recv(100)
    assert got == b"ok\r\nok\r\n"
    gevent.sleep(0.05)
    assert core.parked() == 1 and core.count_from("127.0.0.1") == 1  # idle again: parked again
    ours.sendall(b"version 3\r\n")
    assert ours.recv(100) == b"ok\r\n"
    ours.close()  # the peer goes while parked: the connection ends, its hooks run, its share is freed
    gevent.sleep(0.1)
    assert core.count() == 0 and core.parked() == 0 and closed == [1] and core.count_from("127.0.0.1") == 0
    assert made[0].ended == "deadline or close"


class LingeringEcho(ParkingEcho):
    park_after_s = 0.3


def test_a_connection_busy_within_its_park_after_time_keeps_its_greenlet_and_parks_once_idle_that_long():
    """``park_after_s``: a client that sends again within it is read by the same greenlet (no park, no new one);
    idle past it, the connection parks; idle longer than its idle deadline allows, it still closes on time."""
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=60), max_per_address=5)
    made = []
    ours, g = connect(core, listener(core, "mqtt", made, kind=LingeringEcho))
    for i in range(5):  # every 0.1 s: always within the 0.3 s
        ours.sendall(b"version %d\r\n" % i)
        assert ours.recv(100) == b"ok\r\n"
        gevent.sleep(0.1)
        assert core.parked() == 0 and not g.dead  # the accept's greenlet serves it still
    gevent.sleep(0.4)
    assert core.parked() == 1 and g.dead  # idle past park_after_s: parked, no greenlet
    ours.sendall(b"version 9\r\n")
    assert ours.recv(100) == b"ok\r\n"
    gevent.sleep(0.1)
    assert core.parked() == 0  # served again, and lingering again
    ours.close()
    gevent.sleep(0.5)
    assert core.count() == 0 and core.parked() == 0 and made[0].ended == "deadline or close"


def test_a_silent_parked_connection_is_closed_at_its_idle_deadline_by_the_shared_wheel(caplog):
    caplog.set_level(logging.INFO, logger="metaq.serving.connections")
    core = ConnectionCore(10, ConnectionLimits(idle_s=0.5, request_s=60))
    lst = listener(core, "mqtt", [], kind=ParkingEcho)
    ours, _g = connect(core, lst)
    other, _g2 = connect(core, lst)
    assert core.parked() == 2
    gevent.sleep(0.3)
    other.sendall(b"version 1\r\n")  # a request restarts its idle deadline
    assert other.recv(100) == b"ok\r\n"
    waited = closed_after(ours)
    assert 0.2 - 0.05 <= waited < 0.2 + WHEEL_TICK_S + 0.3  # 0.5 s from its start, at most a tick late
    assert core.count() == 1
    assert 0.2 < closed_after(other) < 1.0
    assert core.count() == 0 and core.parked() == 0
    assert caplog.text.count("no request for 0 s; closing") == 2  # 0.5 s, written rounded


def test_a_half_sent_request_keeps_its_greenlet_and_is_closed_at_the_request_deadline():
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=0.5))
    made = []
    ours, _g = connect(core, listener(core, "mqtt", made, kind=ParkingEcho))
    ours.sendall(b"vers")
    gevent.sleep(0.05)
    assert core.parked() == 0  # inside a request: not parked, waiting for the rest
    assert 0.35 < closed_after(ours) < 1.0
    assert made[0].ended == "deadline or close" and core.count() == 0


def test_shutdown_and_close_listener_end_parked_connections_and_run_their_hooks():
    core = ConnectionCore(10, ConnectionLimits(60, 60))
    closed = []
    core.on_close(lambda conn: closed.append(conn.conn_id))
    a, _ga = connect(core, listener(core, "mqtt", [], kind=ParkingEcho))
    mqtt = core._listener_of[1]
    b, _gb = connect(core, listener(core, "other", [], kind=ParkingEcho))
    assert core.parked() == 2
    core.close_listener(mqtt)
    gevent.sleep(0.05)
    assert a.recv(10) == b"" and core.count() == 1 and closed == [1]
    core.shutdown(1.0)
    gevent.sleep(0.05)
    assert b.recv(10) == b"" and core.count() == 0 and core.parked() == 0 and sorted(closed) == [1, 2]


def test_woken_parked_connections_run_their_turns_in_kept_greenlets_up_to_the_limit_and_one_past_ends(monkeypatch):
    """A parked connection woken by bytes is served by a greenlet kept from an earlier turn (none made per wake);
    ``MAX_IDLE_TURN_GREENLETS`` are kept idle, one past it ends; a kept one holds no connection and serves any."""
    monkeypatch.setattr(limits, "MAX_IDLE_TURN_GREENLETS", 2)
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=60))
    lst = listener(core, "mqtt", [], kind=ParkingEcho)
    socks = [connect(core, lst)[0] for _ in range(3)]
    assert core.parked() == 3 and core.turners() == 0
    for s in socks:  # woken together: three turns at once, three greenlets; two kept, the third ends
        s.sendall(b"version 1\r\n")
    for s in socks:
        assert s.recv(100) == b"ok\r\n"
    gevent.sleep(0.05)
    assert core.parked() == 3 and core.turners() == 2
    kept = list(core._turners)
    for i in range(5):  # one at a time: each turn runs in a kept greenlet, none made
        for s in socks:
            s.sendall(b"version %d\r\n" % i)
            assert s.recv(100) == b"ok\r\n"
            gevent.sleep(0.01)
            assert core.turners() == 2 and set(core._turners) == set(kept)
    socks[0].close()  # its end runs in a kept greenlet too, and the others are still served after
    gevent.sleep(0.05)
    assert core.count() == 2 and core.parked() == 2 and core.turners() == 2
    socks[1].sendall(b"version 9\r\n")
    assert socks[1].recv(100) == b"ok\r\n"


def test_a_kept_turn_greenlet_switched_into_by_anything_else_ends_and_is_not_handed_a_turn(caplog):
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=60))
    ours, _g = connect(core, listener(core, "mqtt", [], kind=ParkingEcho))
    ours.sendall(b"version 1\r\n")
    assert ours.recv(100) == b"ok\r\n"
    gevent.sleep(0.05)
    assert core.turners() == 1
    stray = core._turners[0]
    gevent.get_hub().loop.run_callback(stray.switch, "not a connection")
    gevent.sleep(0.05)
    assert core.turners() == 0 and stray.dead and "a turn greenlet was woken by" in caplog.text
    ours.sendall(b"version 2\r\n")  # served by a new one
    assert ours.recv(100) == b"ok\r\n"


def test_a_kept_turn_greenlet_holds_no_connection_once_it_ended():
    import gc
    import weakref

    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=60))
    made = []
    ours, _g = connect(core, listener(core, "mqtt", made, kind=ParkingEcho))
    ours.sendall(b"version 1\r\n")
    assert ours.recv(100) == b"ok\r\n"
    ours.close()
    gevent.sleep(0.05)
    assert core.count() == 0 and core.turners() == 1
    gone = weakref.ref(made.pop())
    gc.collect()
    assert gone() is None


class LongLingeringEcho(ParkingEcho):
    park_after_s = 2.0


def test_a_linger_cut_short_by_the_idle_deadline_does_not_wait_the_kept_timers_whole_time(caplog):
    """A connection whose idle deadline comes before its ``park_after_s`` lingers only until that deadline (a timer
    of its own, not the kept ``park_after_s`` one) and is closed then, after a request as before any."""
    caplog.set_level(logging.INFO, logger="metaq.serving.connections")
    core = ConnectionCore(10, ConnectionLimits(idle_s=0.3, request_s=60))
    made = []
    ours, _g = connect(core, listener(core, "mqtt", made, kind=LongLingeringEcho))
    ours.sendall(b"version 1\r\n")  # (its kept timer is made with its read watcher, at its first linger)
    assert ours.recv(100) == b"ok\r\n"
    assert made[0].linger_timer is not None
    assert closed_after(ours) < 1.0  # (the kept timer would hold it 2 s)
    assert core.count() == 0 and made[0].linger_timer is None


class SpuriousWakeEcho(LingeringEcho):
    """LingeringEcho whose next ``spurious`` lingers say readable at once with nothing to read (a spurious wake)."""

    spurious = 0

    def receive(self, nbytes=RECV_BYTES, whole=False):
        if self.spurious and self.linger_timer is not None:  # (so this linger asks ``_linger_timer``)
            self.linger_timer.close()
            self.linger_timer = None
        return super().receive(nbytes, whole)

    def _linger_timer(self, timeout):
        if self.spurious:
            self.spurious -= 1
            self._readable = True  # (what a linger that saw the socket readable leaves)
            return None
        return super()._linger_timer(timeout)


def test_a_read_that_finds_nothing_after_a_linger_woke_still_waits_and_reads():
    """A linger that says readable is read at once; nothing there after all, the read waits as any read (for the
    bytes that come later) and the socket's timeout is still the idle time, its sends' bound."""
    core = ConnectionCore(10, ConnectionLimits(idle_s=60, request_s=60), max_per_address=5)
    made = []
    ours, _g = connect(core, listener(core, "mqtt", made, kind=SpuriousWakeEcho))
    ours.sendall(b"version 1\r\n")
    assert ours.recv(100) == b"ok\r\n"
    made[0].spurious = 1
    ours.sendall(b"version 2\r\n")  # (the linger under way reads it at once)
    assert ours.recv(100) == b"ok\r\n"
    gevent.sleep(0.1)  # now lingering again: woken spuriously, it waits in its read
    ours.sendall(b"version 3\r\n")
    assert ours.recv(100) == b"ok\r\n"
    assert made[0].spurious == 0 and made[0].sock.timeout == 60
    ours.close()
    gevent.sleep(0.2)
    assert core.count() == 0 and made[0].ended == "deadline or close"


def test_a_connection_woken_spuriously_is_still_closed_at_its_idle_deadline(caplog):
    caplog.set_level(logging.INFO, logger="metaq.serving.connections")
    core = ConnectionCore(10, ConnectionLimits(idle_s=0.5, request_s=60))
    made = []
    ours, _g = connect(core, listener(core, "mqtt", made, kind=SpuriousWakeEcho))
    ours.sendall(b"version 1\r\n")
    assert ours.recv(100) == b"ok\r\n"
    made[0].spurious = 1
    started = time.monotonic()
    ours.sendall(b"version 2\r\n")
    assert ours.recv(100) == b"ok\r\n"
    assert 0.3 < closed_after(ours) < 3.0 and time.monotonic() - started < 3.0
    assert "no request for" in caplog.text and core.count() == 0


def test_the_raw_socket_a_read_or_write_that_must_not_wait_uses_is_gevents_underlying_one_and_none_for_tls():
    """``Connection.raw_sock``, resolved once per connection: a plain socket's underlying non-blocking socket, the
    one its reads after a linger and an MQTT connection's ``try_send`` use; None on a TLS socket, whose bytes are
    encrypted by the SSL socket itself (a raw write there would put plaintext on the wire), so those fall back to
    the TLS path. A TLS socket that resolved its raw socket fails this."""
    import ssl as std_ssl

    from gevent import ssl as gevent_ssl

    ours, theirs = socket.socketpair()
    plain = Echo(theirs, ("127.0.0.1", 40000), 1, ConnectionLimits(60, 60))
    assert plain.raw_sock is theirs._sock and not plain.tls
    ours.sendall(b"version\r\n")
    plain._readable = True  # as after a linger saw it readable: read on the raw socket at once
    assert plain.receive() == b"version\r\n"
    wrapped = gevent_ssl.SSLContext(std_ssl.PROTOCOL_TLS_SERVER).wrap_socket(theirs, server_side=True,
                                                                           do_handshake_on_connect=False)
    secure = Echo(wrapped, ("127.0.0.1", 40000), 2, ConnectionLimits(60, 60))
    assert secure.tls and secure.raw_sock is None
    ours.close()


def test_a_trusted_proxys_connection_claims_its_clients_address_and_share():
    """``ConnectionCore.claim`` (a WebSocket upgrade's X-Forwarded-For): only from a trusted proxy; the client's
    share is checked and taken, the proxy's given back."""
    core = ConnectionCore(10, ConnectionLimits(60, 60), max_per_address=2, proxies=TrustedProxies(["127.0.0.1"]))
    made = []
    ws = listener(core, "ws", made)
    pairs = [connect(core, ws) for _ in range(2)]  # the proxy's share full until they claim their clients
    client = ("192.0.2.1", 4711)
    assert core.claim(made[0], client) is None and core.claim(made[1], client) is None
    assert made[0].address == client and made[0].peer == "192.0.2.1:4711"
    assert core.count_from("192.0.2.1") == 2 and core.count_from("127.0.0.1") == 0
    pairs.append(connect(core, ws))
    assert core.claim(made[2], client) == "too many connections from 192.0.2.1: the limit is 2 per address"
    assert made[2].address == ("127.0.0.1", 40000) and core.count_from("127.0.0.1") == 1
    untrusted, g = connect(core, ws, host="127.0.0.2")
    assert core.claim(made[3], ("192.0.2.9", 1)) is None and made[3].address == ("127.0.0.2", 40000)
    core.shutdown(1.0)
    for sock, _g in pairs + [(untrusted, g)]:
        sock.close()
    gevent.joinall([g for _s, g in pairs] + [g], timeout=5)
    assert core.count_from("192.0.2.1") == 0 and core.count_from("127.0.0.1") == 0


def test_a_stranger_moves_to_its_clients_share_of_strangers():
    strangers = Strangers(login_s=10, cap=10, per_address=1)
    a, b = object(), object()
    for conn in (a, b):
        strangers.arrive("10.0.0.1")
        strangers.wait("10.0.0.1", conn, 1.0)
    assert strangers.move("10.0.0.1", "192.0.2.1", a) is None
    assert strangers.held_by("10.0.0.1") == 1 and strangers.held_by("192.0.2.1") == 1
    assert strangers.move("10.0.0.1", "192.0.2.1", b) == ("too many connections not yet logged in from 192.0.2.1: "
                                                            "the limit is 1 per address")
    assert strangers.held_by("10.0.0.1") == 1 and strangers.count == 2
