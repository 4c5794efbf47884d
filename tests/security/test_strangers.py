"""Issue 42 point 3, on real brokers with authentication (and TLS) on: nothing for strangers before they log in.

A connection must log in within ``limits.login_timeout_s`` or be closed; connections not yet logged in are capped
per address and in all, apart from logged-in ones (strangers from two addresses once filled a 200-connection cap
and locked every user out); before login a text body may be only ``MAX_PRELOGIN_BODY_BYTES``, and strangers'
unfinished requests draw on a budget of their own (``MAX_PRELOGIN_PARTIAL_BYTES``), so a user's put never waits
behind them.
"""

import socket
import ssl
import struct
import threading
import time

import pytest

from metaq import limits
from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient, TextClient
from metaq.mqtt import wire
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode as R
from tests.harness.acl import SECRETS, login, secured_config, write_acl
from tests.harness.broker import wait_for
from tests.harness.http import http_port, request, with_http
from tests.harness.mqtt import Raw, with_mqtt
from tests.harness.pki import Pki
from tests.harness.rocketmq import send_v1

pytestmark = pytest.mark.integration


def closed_by_broker(sock, within):
    """True when the broker closes ``sock`` within ``within`` seconds (bytes it sends first are skipped)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
        return True
    except (socket.timeout, ssl.SSLError):
        return False
    except OSError:
        return True


def connect(port, source="127.0.0.1"):
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def test_a_connection_that_never_logs_in_is_closed_at_the_login_deadline(broker_factory, tmp_path):
    cfg = with_http(secured_config(tmp_path))
    cfg["limits"] = dict(cfg.get("limits", {}), login_timeout_s=1.5, idle_timeout_s=600)
    b = broker_factory(cfg)
    text, http = connect(b.port), connect(http_port(b))
    text.sendall(b"version 1\r\n")  # requests that need no login do not extend the deadline
    started = time.monotonic()
    assert closed_by_broker(text, 10) and closed_by_broker(http, 10)
    assert 1.0 <= time.monotonic() - started < 8
    assert "not logged in within 2 s; closing" in b.log_text()
    with login(b, "alice") as c:  # a logged-in connection is held to the idle timeout only
        time.sleep(2.5)
        assert c.put("orders", b"still here").code == 200


def test_strangers_from_two_addresses_no_longer_lock_users_out(broker_factory, tmp_path):
    """The finding: 100 idle connections from each of two addresses filled a 200-connection cap."""
    cfg = with_http(secured_config(tmp_path))
    cfg["limits"] = dict(cfg.get("limits", {}), max_connections=200, login_timeout_s=30)
    b = broker_factory(cfg)
    held, refused = [], 0
    for source in ("127.0.0.2", "127.0.0.3"):
        for _ in range(100):
            s = connect(b.port, source)
            s.settimeout(0.3)
            try:
                reply = s.recv(4096)
            except socket.timeout:
                held.append(s)
                continue
            assert b"too many connections not yet logged in from %s" % source.encode() in reply, reply
            refused += 1
            s.close()
    per_address = limits.MAX_UNAUTHENTICATED_PER_ADDRESS
    assert len(held) == 2 * per_address and refused == 200 - 2 * per_address
    for user in ("alice", "bob", "reader"):  # logged-in users are served on every port
        with login(b, user) as c:
            assert c.call(ev.Version(1)).code == 200
    with login(b, "alice") as c:
        assert c.put("orders", b"served").code == 200
    assert request(b, "GET", "/api/broker", user="admin", secret=SECRETS["admin"]).status == 200
    held.pop(0).close()  # a stranger leaves: its address may wait to log in once more
    wait_for(lambda: _held_open(connect(b.port, "127.0.0.2")), timeout=10, what="a stranger's place to free")
    for s in held:
        s.close()


def _held_open(sock):
    """True when the broker keeps ``sock`` open (a place was free), False when it refused it; closes it."""
    sock.settimeout(0.3)
    try:
        return sock.recv(4096) == b"" and False
    except socket.timeout:
        return True
    finally:
        sock.close()


def test_the_strangers_cap_in_all_and_one_past(broker_factory, tmp_path):
    cfg = secured_config(tmp_path)
    cfg["limits"] = dict(cfg.get("limits", {}), max_unauthenticated=6, max_unauthenticated_per_address=2,
                         login_timeout_s=30, stranger_eviction_age_s=30)  # none old enough to make room
    b = broker_factory(cfg)
    held = [connect(b.port, "127.0.0.%d" % (10 + i // 2)) for i in range(6)]  # 2 each from 3 addresses: the cap
    for s in held:
        s.settimeout(0.3)
        with pytest.raises(socket.timeout):
            s.recv(10)  # held open
    one_past = connect(b.port, "127.0.0.20")
    one_past.settimeout(5)
    assert b"too many connections not yet logged in: the limit is 6" in one_past.recv(4096)
    held.pop(0).close()
    wait_for(lambda: _logs_in(b), timeout=10, what="a place to log in once a stranger left")
    with login(b, "alice") as a1, login(b, "bob") as a2:  # logged in: they take no stranger's place
        last = connect(b.port, "127.0.0.21")
        last.settimeout(0.3)
        with pytest.raises(socket.timeout):
            last.recv(10)
        assert a1.put("orders", b"1").code == 200 and a2.put("orders", b"2").code == 200
        last.close()
    for s in held:
        s.close()


def _closed_now(sock):
    """True when the broker has closed ``sock`` (looked at without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_strangers_at_their_cap_make_room_for_a_user_on_the_text_and_mqtt_ports(broker_factory, tmp_path):
    """The finding: 320 addresses holding 16 idle connections each left alice's new logins refused (8 of 48 got in):
    every new connection is a stranger until it logs in. At the cap a new connection closes the oldest stranger of
    the address holding the most, once that one is ``stranger_eviction_age_s`` old; a younger one is never closed."""
    cfg = with_mqtt(secured_config(tmp_path))
    age = 3.0
    cfg["limits"] = dict(cfg.get("limits", {}), max_unauthenticated=96, login_timeout_s=120, idle_timeout_s=600,
                         stranger_eviction_age_s=age)
    b = broker_factory(cfg)
    per_address = limits.MAX_UNAUTHENTICATED_PER_ADDRESS
    ports = (b.port, b.config["mqtt"]["port"])
    filled = time.monotonic()
    held = {"127.0.7.%d" % a: [connect(ports[1], "127.0.7.%d" % a) for _ in range(per_address // 2)]
            for a in range(1, 7)}  # 6 addresses x 16: the cap in all, on both ports
    time.sleep(0.5)  # accepted on the MQTT port before the text port's one past the cap
    for source, socks in held.items():
        socks.extend(connect(ports[0], source) for _ in range(per_address - len(socks)))
    one_past = connect(b.port, "127.0.8.1")  # all of them younger than the eviction age: none is closed for it
    one_past.settimeout(10)
    assert b"too many connections not yet logged in: the limit is 96" in one_past.recv(4096)
    assert not any(_closed_now(s) for socks in held.values() for s in socks)
    time.sleep(max(0.0, filled + age + 0.5 - time.monotonic()))
    refills = []
    for i in range(5):  # alice gets in on every port, each time, while strangers are at their cap
        with login(b, "alice") as c:
            assert c.put("orders", b"in %d" % i).code == 200
        refills.append(connect(b.port, "127.0.9.%d" % i))  # the attacker takes the place her login left
        user = Raw(b, wire.MQTT_311)
        assert user.connect("alice-%d" % i, username="alice", password=SECRETS["alice"].encode()).reason_code == 0
        user.close()
        refills.append(connect(ports[1], "127.0.10.%d" % i))
    wait_for(lambda: sum(_closed_now(s) for socks in held.values() for s in socks) >= 10, timeout=10,
             what="ten strangers closed to make room")
    lost = [sum(_closed_now(s) for s in socks) for socks in held.values()]
    assert sum(lost) == 10 and max(lost) - min(lost) <= 1, lost  # from the addresses holding the most, in turn
    assert not any(_closed_now(s) for s in refills)  # younger than the eviction age
    assert "evicted a connection from 127.0.7." in b.log_text()
    with login(b, "admin") as admin:
        evicted = int(admin.stats_dict()["strangers_evicted"])  # what an operator watching an attack sees
    # The admin's own connection is a newcomer too: at the cap it closed one more, unless the broker had not yet
    # accepted the last stranger on the other port when it came. Either way the count is the strangers closed.
    assert evicted in (sum(lost), sum(lost) + 1)
    wait_for(lambda: sum(_closed_now(s) for socks in held.values() for s in socks) == evicted, timeout=10,
             what="as many strangers closed as the broker counts")
    for socks in list(held.values()) + [refills]:
        for s in socks:
            s.close()


def _logs_in(b):
    try:
        with login(b, "alice"):
            return True
    except (AssertionError, OSError):
        return False


def test_a_large_body_before_login_is_refused_before_it_is_held(broker_factory, tmp_path):
    b = broker_factory(secured_config(tmp_path))
    s = connect(b.port)
    s.sendall(b"put orders 0 %d 0 1\r\n" % (4 << 20))
    s.settimeout(10)
    reply = s.recv(4096)
    assert b"exceeds the limit of %d bytes" % limits.MAX_PRELOGIN_BODY_BYTES in reply, reply
    assert closed_by_broker(s, 10)
    with TextClient("127.0.0.1", b.port) as c:  # a small pipelined put after auth still fits (and gets its 401)
        c.send(b"put orders 0 5 0 2\r\nhello")
        assert c.read_event().code == 401
    with login(b, "alice") as c:  # logged in: the configured limit again
        assert c.put("orders", b"x" * (200 << 10)).code == 200


def test_strangers_half_sent_frames_never_make_a_users_put_wait(broker_factory, tmp_path):
    """The finding: 70 unauthenticated 16 MiB remoting frames, half sent, filled the broker-wide budget for
    unfinished requests and a logged-in user's 2 MiB put waited 18 s."""
    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {}, security={"acl_file": write_acl(tmp_path / "acl.yaml")},
                     limits={"max_partial_request_bytes": 16 << 20, "request_timeout_s": 60, "login_timeout_s": 60})
    b = broker_factory(cfg, workdir=wd)
    rport = b.config["remoting"]["port"]
    strangers = []
    for i in range(12):  # 12 x 4 MiB, half of each 8 MiB frame: three times the strangers' own budget
        s = connect(rport, "127.0.0.%d" % (30 + i))
        s.setblocking(False)  # once the strangers' budget is full the broker reads no more of them: send what fits
        data, sent = struct.pack(">ii", 8 << 20, 20) + b"\0" * (4 << 20), 0
        try:
            while sent < len(data):
                sent += s.send(data[sent:sent + (1 << 20)])
        except BlockingIOError:
            pass
        strangers.append(s)
    wait_for(lambda: "unfinished requests of connections not yet logged in hold" in b.log_text(), timeout=20,
             what="the strangers' budget to fill")
    with login(b, "alice") as c:
        started = time.monotonic()
        assert c.put("orders", b"u" * (200 << 10)).code == 200
        assert time.monotonic() - started < 5  # not behind the strangers (they wait for their own budget)
    with RemotingClient(rport, credentials=("alice", SECRETS["alice"])) as rc:
        assert send_v1(rc, "orders", b"small").code == 0  # arrives whole: a signed request logs the connection in
        started = time.monotonic()
        assert send_v1(rc, "orders", b"r" * (200 << 10)).code == 0
        assert time.monotonic() - started < 5
    for s in strangers:
        s.close()


def test_a_tls_stranger_is_closed_at_the_deadline_and_a_signed_route_query_logs_in(broker_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    wd = tmp_path / "rb"
    cfg = rmq_config(wd / "data", {}, security={"acl_file": write_acl(tmp_path / "acl.yaml"),
                                                 "tls": pki.tls_config("on")},
                     limits={"login_timeout_s": 1.5})
    b = broker_factory(cfg, workdir=wd)
    ctx = ssl.create_default_context(cafile=pki.ca)
    raw = connect(b.port)
    tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")  # a handshake, then nothing
    assert closed_by_broker(tls, 10)
    rport = b.config["remoting"]["port"]
    with RemotingClient(rport, credentials=("alice", SECRETS["alice"]), ssl_context=ctx,
                        server_hostname="127.0.0.1") as rc:
        assert rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).code in (0, 17)  # signed: logged in
        time.sleep(2.5)
        assert rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"}).code in (0, 17)  # still open


def test_a_tls_handshake_flood_from_one_address_is_cut_to_its_rate(broker_factory, tmp_path):
    """The finding: a handshake flood from one address (236/s) took another user's p99 from 9 to 216 ms."""
    pki = Pki(tmp_path / "pki")
    cfg = secured_config(tmp_path, tls=pki.tls_config("on"))
    cfg["limits"] = dict(cfg.get("limits", {}), tls_handshakes_per_address_s=5)
    b = broker_factory(cfg)
    ctx = ssl.create_default_context(cafile=pki.ca)
    done = refused = 0
    started = time.monotonic()
    for _ in range(30):  # as fast as one client can: far past 5 a second with bursts of 10
        raw = connect(b.port, "127.0.0.7")
        try:
            ctx.wrap_socket(raw, server_hostname="127.0.0.1").close()
            done += 1
        except (ssl.SSLError, OSError):
            refused += 1
            raw.close()
    took = time.monotonic() - started
    # the burst, and the rate for the seconds it took (on a loaded machine the handshakes themselves take longer)
    assert refused > 0 and done <= 10 + 5 * took, (done, refused, took)
    with TextClient("127.0.0.1", b.port, ssl_context=ctx, server_hostname="127.0.0.1") as c:  # another address
        assert c.auth("alice", SECRETS["alice"]).code == 200
    assert "too many TLS handshakes from 127.0.0.7: the limit is 5 a second" in b.log_text()


def _partial_connect(port, source):
    """A stranger's MQTT CONNECT of 60,000 bytes (within the 64 KiB allowed before login), all but its last 1,000
    sent: the broker holds it as a packet under way."""
    s = connect(port, source)
    s.sendall(b"\x10" + bytes((0xE0, 0xD4, 0x03)) + b"\0" * 59000)  # remaining length 60,000
    return s


def _closed_within(socks, within):
    """How long after now each of ``socks`` was closed by the broker (None: still open ``within`` s from now)."""
    started, after = time.monotonic(), {}
    deadline = started + within
    for i, s in enumerate(socks):
        if closed_by_broker(s, max(0.01, deadline - time.monotonic())):
            after[i] = time.monotonic() - started
    return [after.get(i) for i in range(len(socks))]


@pytest.mark.fault
def test_partial_mqtt_connects_are_closed_at_the_login_deadline_with_the_strangers_budget_full(broker_factory,
                                                                                                tmp_path):
    """The finding: 36 partial 59 KB MQTT CONNECTs lived 21-23 s against a 10 s login deadline. A stranger whose
    unfinished request waited for room in the strangers' budget of half-sent bytes waited for its request deadline,
    not its login deadline."""
    wd = tmp_path / "rb"
    cfg = with_mqtt(rmq_config(wd / "data", {}, security={"acl_file": write_acl(tmp_path / "acl.yaml")},
                               limits={"request_timeout_s": 60, "login_timeout_s": 6, "idle_timeout_s": 600}))
    b = broker_factory(cfg, workdir=wd)
    fill = []
    for i in range(5):  # 5 x 4 MiB of half-sent remoting frames: past the strangers' own 16 MiB
        s = connect(b.config["remoting"]["port"], "127.0.11.%d" % i)
        s.setblocking(False)
        data, sent = struct.pack(">ii", 8 << 20, 20) + b"\0" * (4 << 20), 0
        try:
            while sent < len(data):
                sent += s.send(data[sent:sent + (1 << 20)])
        except BlockingIOError:
            pass
        fill.append(s)
    wait_for(lambda: "unfinished requests of connections not yet logged in hold" in b.log_text(), timeout=20,
             what="the strangers' budget to fill")
    partial = [_partial_connect(b.config["mqtt"]["port"], "127.0.12.%d" % i) for i in range(8)]
    took = _closed_within(partial, 30)  # waiting for room in the budget, then for their last bytes
    assert all(a is not None and 5 < a < 6 + 3 for a in took), took  # the login deadline, slack for a busy machine
    assert all(a is not None for a in _closed_within(fill, 5)), "the strangers filling the budget are closed too"
    for s in partial + fill:
        s.close()


class _TlsClient:
    """A TLS client over a plain socket (``ssl.MemoryBIO``): its records are bytes the test sends as it likes."""

    def __init__(self, ctx, sock):
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        sock.settimeout(10)
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                sock.sendall(self.outgoing.read())
                self.incoming.write(sock.recv(65536))
        sock.sendall(self.outgoing.read())

    def records(self, data):
        """``data`` as the TLS records that carry it."""
        self.obj.write(data)
        return self.outgoing.read()


def _trickle(socks_and_rest, until):
    """Send one byte of each socket's rest every half second until ``until`` (monotonic) or it is sent."""
    while time.monotonic() < until:
        for s, rest in socks_and_rest:
            if rest:
                try:
                    s.send(rest[:1])
                    del rest[:1]
                except OSError:
                    rest.clear()
        time.sleep(0.5)


@pytest.mark.fault
def test_tls_strangers_in_a_slow_handshake_or_a_trickled_connect_are_closed_at_the_login_deadline(broker_factory,
                                                                                                   tmp_path):
    """The login deadline runs from the connection's arrival, its TLS handshake included, and holds while a TLS
    record of its CONNECT trickles in (each read of the record's bytes once restarted the wait)."""
    pki = Pki(tmp_path / "pki")
    cfg = with_mqtt(secured_config(tmp_path, tls=pki.tls_config("on")))
    cfg["limits"] = dict(cfg.get("limits", {}), login_timeout_s=3, request_timeout_s=60, idle_timeout_s=600)
    b = broker_factory(cfg)
    port = b.config["mqtt"]["port"]
    ctx = ssl.create_default_context(cafile=pki.ca)
    started = time.monotonic()
    hellos = [connect(port, "127.0.13.%d" % i) for i in range(3)]
    for s in hellos:  # a ClientHello begun and never finished
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    trickled = []
    for i in range(3):  # a handshake done, then a 60,000-byte CONNECT whose last record trickles in
        s = connect(port, "127.0.14.%d" % i)
        records = _TlsClient(ctx, s).records(b"\x10" + bytes((0xE0, 0xD4, 0x03)) + b"\0" * 60000)
        s.sendall(records[:-200])
        trickled.append((s, bytearray(records[-200:])))
    threading.Thread(target=_trickle, args=(trickled, started + 30), daemon=True).start()
    ready = time.monotonic() - started
    took = [ready + a if a is not None else None for a in _closed_within(hellos + [s for s, _ in trickled], 30)]
    assert all(a is not None and 2.5 < a < 3 + 4 for a in took), took  # the login deadline, slack for a busy machine
    for s in hellos + [s for s, _ in trickled]:
        s.close()


def test_strangers_holding_tls_handshakes_at_their_cap_make_room_for_a_user(broker_factory, tmp_path):
    """A stranger in its TLS handshake counts as one and may be closed to make room as any: strangers holding
    half-done handshakes at the cap do not lock a user out of a TLS port."""
    pki = Pki(tmp_path / "pki")
    cfg = secured_config(tmp_path, tls=pki.tls_config("on"))
    age = 1.0
    cfg["limits"] = dict(cfg.get("limits", {}), max_unauthenticated=32, login_timeout_s=60,
                         stranger_eviction_age_s=age)
    b = broker_factory(cfg)
    filled = time.monotonic()
    hellos = [connect(b.port, "127.0.15.%d" % (i % 2)) for i in range(32)]
    for s in hellos:  # a ClientHello begun and never finished: strangers in their handshakes, at the cap
        s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    time.sleep(max(0.0, filled + age + 0.5 - time.monotonic()))
    ctx = ssl.create_default_context(cafile=pki.ca)
    refills = []
    for i in range(3):
        with TextClient("127.0.0.1", b.port, ssl_context=ctx, server_hostname="127.0.0.1") as c:
            assert c.auth("alice", SECRETS["alice"]).code == 200
            assert c.put("orders", b"in %d" % i).code == 200
        refills.append(connect(b.port, "127.0.15.9"))  # the attacker takes the place her login left
        refills[-1].sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    # long before their handshake deadline: the oldest of either address in turn
    wait_for(lambda: [i for i, s in enumerate(hellos) if _closed_now(s)] == [0, 1, 2], timeout=5,
             what=lambda: "the three oldest handshakes closed, not %s" % [i for i, s in enumerate(hellos)
                                                                           if _closed_now(s)])
    for s in hellos + refills:
        s.close()


def test_a_silent_stranger_on_a_permissive_tls_port_is_closed_at_the_login_deadline(broker_factory, tmp_path):
    """On a permissive port the broker waits for a first byte to tell TLS from plaintext: a stranger's wait is its
    login deadline, not the idle timeout."""
    pki = Pki(tmp_path / "pki")
    cfg = secured_config(tmp_path, tls=pki.tls_config("permissive"))
    cfg["limits"] = dict(cfg.get("limits", {}), login_timeout_s=1.5, idle_timeout_s=600)
    b = broker_factory(cfg)
    started = time.monotonic()
    silent = connect(b.port)
    assert closed_by_broker(silent, 10)
    assert 1.0 <= time.monotonic() - started < 8
