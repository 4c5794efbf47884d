"""BrokerConnection against real broker processes: pipelining, timeouts, drops, reconnects, heartbeat."""

import socket
import threading
import time

import pytest

from metaq.client.connection import BrokerConnection, ConnectionPool, parse_url
from metaq.errors import ConnectionLost, RequestTimeout
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import iter_records
from metaq.protocol.stream import CLOSED
from metaq.client.local import free_port, small_config
from tests.harness.broker import url_of, wait_for
from tests.harness.faults import PauseProcess


def put_event(topic, body, partition=0):
    return ev.Put(topic, partition, 0, body, 0, metaq_checksum(body))


def test_parse_url():
    assert parse_url("meta://127.0.0.1:8123") == ("127.0.0.1", 8123)
    assert parse_url("meta://host.example:1") == ("host.example", 1)
    assert parse_url("meta://[::1]:8123?slaveId=1") == ("::1", 8123)
    assert parse_url("localhost:9") == ("localhost", 9)
    for bad in ("meta://host", "http://h:1", "meta://h:0", "meta://:80", "meta://h:x"):
        with pytest.raises(ValueError):
            parse_url(bad)


def test_pipelined_requests_are_matched_by_opaque(broker):
    with BrokerConnection(url_of(broker)) as conn:
        puts = [conn.request(put_event("tpipe", b"m%d" % i)) for i in range(1000)]
        assert conn.in_flight > 0 or all(f.done() for f in puts)
        replies = [f.result(30) for f in puts]
        assert all(isinstance(r, ev.Result) and r.code == 200 for r in replies)
        offsets = [int(r.body.split()[2]) for r in replies]
        assert offsets == list(range(1000))  # written in order, each reply went to its own request
        gets = [conn.request(ev.Get("tpipe", "g", 0, i, 64, 0)) for i in range(1000)]
        for i, future in enumerate(gets):
            value = future.result(30)
            record = next(iter_records(value.body))[0]
            assert record.data == b"m%d" % i
        assert conn.connect_count == 1 and conn.in_flight == 0


def test_call_returns_reply_and_errors_are_results(broker):
    with BrokerConnection(url_of(broker)) as conn:
        assert conn.call(ev.Version(0)).body.startswith(b"0.")
        bad = conn.call(ev.Put("tx", 99, 0, b"x", 0, metaq_checksum(b"x")))
        assert isinstance(bad, ev.Result) and bad.code == 400
        assert conn.call(ev.Stats(None, 0)).body.startswith(b"STATS")
        conn.send_oneway(put_event("tx", b"oneway"))
        assert wait_for(lambda: conn.in_flight == 0, 10)
        reply = conn.call(ev.Get("tx", "g", 0, 0, 1024, 0))
        assert [r.data for r, _ in iter_records(reply.body)] == [b"oneway"]


@pytest.mark.integration
def test_request_timeout_against_a_silent_server():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        conn = BrokerConnection("meta://127.0.0.1:%d" % server.getsockname()[1], request_timeout=2.0,
                                heartbeat_interval=0)
        started = time.monotonic()
        futures = [conn.request(ev.Version(0)) for _ in range(10)]
        for future in futures:
            with pytest.raises(RequestTimeout):
                future.result(30)
        assert time.monotonic() - started < 10  # the ten 2 s timeouts run together, not one after another (20 s)
        with pytest.raises(RequestTimeout):
            conn.call(ev.Version(0), timeout=0.3)
        assert conn.connected  # a timeout does not drop the connection
        conn.close()
    finally:
        server.close()
        for sock, _addr in accepted:
            sock.close()


@pytest.mark.integration
def test_unreachable_broker_fails_fast_with_connection_lost():
    conn = BrokerConnection("meta://127.0.0.1:%d" % free_port(), connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ConnectionLost):
        conn.call(ev.Version(0))
    # during the backoff the next request fails at once, without another attempt
    with pytest.raises(ConnectionLost, match="next attempt"):
        conn.request(ev.Version(0)).result(5)
    assert time.monotonic() - started < 3
    conn.close()


@pytest.mark.fault
def test_kill_mid_flight_fails_pending_with_connection_lost(broker):
    conn = BrokerConnection(url_of(broker))
    conn.call(put_event("tkill", b"first"))
    # long polls the broker holds: certainly in flight when it dies
    polls = [conn.request(ev.Get("tkill", "g", 0, 1, 1024, 0, 30000), timeout=40) for _ in range(20)]
    time.sleep(0.3)
    assert not any(f.done() for f in polls)
    started = time.monotonic()
    broker.kill()
    for future in polls:
        with pytest.raises(ConnectionLost):
            future.result(10)
    assert time.monotonic() - started < 15  # failed by the lost connection, not at the end of their 30 s wait
    assert wait_for(lambda: not conn.connected)
    conn.close()


@pytest.mark.fault
@pytest.mark.slow
def test_reconnects_after_broker_restart_on_same_port(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", broker={"port": free_port()})
    broker = broker_factory(config=cfg)
    conn = BrokerConnection(url_of(broker), connect_timeout=1.0, max_backoff=0.5)
    assert conn.call(put_event("trestart", b"before")).code == 200
    broker.kill()
    with pytest.raises(ConnectionLost):
        for _ in range(50):  # the first request may still be written before the drop is noticed
            conn.call(ev.Version(0), timeout=2)
            time.sleep(0.05)
    broker.start()

    def works():
        try:
            return conn.call(ev.Version(0), timeout=2).code == 200
        except (ConnectionLost, RequestTimeout):
            return False

    assert wait_for(works, 20, 0.1)
    reply = conn.call(ev.Get("trestart", "g", 0, 0, 1024, 0))
    assert [r.data for r, _ in iter_records(reply.body)] == [b"before"]
    assert conn.connect_count == 2
    conn.close()


@pytest.mark.slow
def test_heartbeat_keeps_idle_connection_alive(broker_factory, tmp_path):
    broker = broker_factory(config=small_config(tmp_path / "data", limits={"idle_timeout_s": 2}))
    conn = BrokerConnection(url_of(broker), heartbeat_interval=0.5)
    assert conn.call(ev.Version(0)).code == 200
    with broker.client() as raw:  # control: without a heartbeat the broker closes an idle connection
        time.sleep(4.5)
        assert raw.read_event() is CLOSED
    assert conn.connected
    assert conn.call(ev.Version(0)).code == 200
    assert conn.connect_count == 1
    conn.close()


def test_threads_share_one_connection(broker):
    conn = BrokerConnection(url_of(broker))
    results = {}

    def worker(n):
        futures = [conn.request(put_event("tthreads", b"%d-%d" % (n, i), n % 4)) for i in range(200)]
        results[n] = [f.result(30) for f in futures]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(8))
    stored = set()
    for n, replies in results.items():
        assert all(r.code == 200 for r in replies)
        offsets = [int(r.body.split()[2]) for r in replies]
        assert offsets == sorted(offsets)  # one thread's requests stay in order
        stored.update((n % 4, off) for off in offsets)
    assert len(stored) == 1600
    conn.close()


def test_pool_keeps_one_connection_per_url(broker):
    with ConnectionPool(request_timeout=5.0) as pool:
        a = pool.get(url_of(broker))
        assert pool.get(url_of(broker)) is a and a.request_timeout == 5.0
        assert a.call(ev.Version(0)).code == 200
        assert pool.urls() == [url_of(broker)]
    assert a.closed
    with pytest.raises(ConnectionLost):
        a.call(ev.Version(0))


GEVENT_SCRIPT = r"""
from gevent import monkey; monkey.patch_all()
import sys, gevent
from metaq.client.connection import BrokerConnection
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
conn = BrokerConnection(sys.argv[1], heartbeat_interval=0.2)
def worker(n):
    fs = [conn.request(ev.Put("tgevent", n, 0, b"x", 0, metaq_checksum(b"x"))) for _ in range(100)]
    return [f.result(20).code for f in fs]
jobs = [gevent.spawn(worker, n) for n in range(4)]
gevent.joinall(jobs, timeout=30)
assert all(j.value == [200] * 100 for j in jobs), [j.value for j in jobs]
gevent.sleep(0.6)  # heartbeats run as greenlets too
assert conn.call(ev.Version(0)).code == 200 and conn.connect_count == 1
conn.close()
print("OK")
"""


def test_works_under_gevent_monkey_patching(broker):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", GEVENT_SCRIPT, url_of(broker)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr


def test_requests_from_reply_callbacks(broker):
    """A callback (on the reader thread) may send more requests: a chain of 300 puts, each sent by the last reply."""
    conn = BrokerConnection(url_of(broker))
    done = threading.Event()
    offsets = []

    def on_reply(reply, error):
        assert error is None and reply.code == 200, (reply, error)
        offsets.append(int(reply.body.split()[2]))
        if len(offsets) == 300:
            done.set()
        else:
            conn.request_callback(put_event("tchain", b"%d" % len(offsets)), on_reply)

    conn.request_callback(put_event("tchain", b"0"), on_reply)
    assert done.wait(30)
    assert offsets == list(range(300))
    conn.close()


class FakeBroker:
    """A scripted server: ``reply(line) -> bytes`` answers each request line (None: stay silent)."""

    def __init__(self, reply):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.url = "meta://127.0.0.1:%d" % self.server.getsockname()[1]
        self.reply = reply
        self.socks = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            while True:
                sock, _ = self.server.accept()
                self.socks.append(sock)
                threading.Thread(target=self._session, args=(sock,), daemon=True).start()
        except OSError:
            return

    def _session(self, sock):
        buf = b""
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    answer = self.reply(line.decode())
                    if answer:
                        sock.sendall(answer)
        except OSError:
            return

    def close(self):
        self.server.close()
        for sock in self.socks:
            sock.close()


@pytest.mark.integration
def test_reply_with_unknown_opaque_is_ignored(caplog):
    def reply(line):
        opaque = line.split()[-1]
        return b"result 200 5 424242\r\nstray" + b"result 200 2 %s\r\nok" % opaque.encode()

    fake = FakeBroker(reply)
    try:
        with BrokerConnection(fake.url, heartbeat_interval=0) as conn:
            assert conn.call(ev.Version(0)).body == b"ok"
            assert conn.call(ev.Version(0)).body == b"ok"
            assert conn.connected and conn.connect_count == 1
        assert "unknown opaque 424242" in caplog.text
    finally:
        fake.close()


@pytest.mark.integration
def test_unanswered_heartbeat_drops_the_connection():
    answer = {"on": True}

    def reply(line):
        return b"result 200 2 %s\r\nok" % line.split()[-1].encode() if answer["on"] else None

    fake = FakeBroker(reply)
    try:
        # a heartbeat's answer is waited for min(request_timeout, max(2 x interval, 1 s)): 1 s here
        conn = BrokerConnection(fake.url, heartbeat_interval=0.3, request_timeout=2.0)
        assert conn.call(ev.Version(0)).body == b"ok"
        time.sleep(2.5)
        assert conn.connected  # answered heartbeats keep it up
        answer["on"] = False
        assert wait_for(lambda: not conn.connected, 10)
        answer["on"] = True
        assert conn.call(ev.Version(0)).body == b"ok"  # the next request reconnects
        assert conn.connect_count == 2
        conn.close()
    finally:
        fake.close()


@pytest.mark.integration
def test_close_writes_the_one_way_sends_queued_before_it(broker):
    """One-way puts queued faster than a paused broker reads them: ``close`` writes every one before the socket
    closes (CLIENT_CLOSE_DRAIN_S), so the broker stores them all once it runs again; none is dropped with the
    queue."""
    body = b"q" * 16384
    n = 1000  # 16 MB: more than the loopback socket's buffers hold while the broker is stopped
    pause = PauseProcess(broker)
    conn = BrokerConnection(url_of(broker), max_buffered=64 << 20)
    assert conn.call(ev.Version(0)).body.startswith(b"0.")
    pause.inject(1.0)
    try:
        for _ in range(n):
            conn.send_oneway(put_event("tclose", body))
        conn.close()
    finally:
        pause.heal()
    with BrokerConnection(url_of(broker)) as check:

        def stored():
            count = 0
            while True:
                reply = check.call(ev.Get("tclose", "g", 0, count, 1 << 20, 0))
                got = [] if isinstance(reply, ev.Result) else list(iter_records(reply.body))
                if not got:
                    return count
                count += len(got)

        wait_for(lambda: stored() == n, 5)
        assert stored() == n


@pytest.mark.integration
def test_close_waits_for_a_stopped_broker_no_longer_than_its_bound(broker):
    """A broker stopped past the close's bound (``drain_s``, CLIENT_CLOSE_DRAIN_S by default): ``close`` returns at
    the bound, not when the broker runs again, and the connection is closed."""
    pause = PauseProcess(broker)
    conn = BrokerConnection(url_of(broker))
    assert conn.call(ev.Version(0)).body.startswith(b"0.")
    pause.inject(3.0)
    try:
        conn.send_oneway(put_event("tbound", b"x"))
        started = time.monotonic()
        conn.close(drain_s=0.5)
        took = time.monotonic() - started
    finally:
        pause.heal()
    assert 0.4 <= took < 2.5, took
    assert conn.in_flight == 0
    with pytest.raises(ConnectionLost):
        conn.send_oneway(put_event("tbound", b"y"))
