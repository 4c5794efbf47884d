"""The HTTP port's pure parts, without a network: readiness, the bounded request reader, the route table and its
authentication, the metrics collector, and the dashboard's escaping of names (user data)."""

import base64
import io
import re
import types

import pytest
from gevent import pywsgi
from prometheus_client import generate_latest

from metaq.server.http import limits as http_limits
from metaq.server.config import load_config
from metaq.server.guard import Guard
from metaq.server.http import api, dashboard
from metaq.server.http.metrics import BrokerCollector, Metrics
from metaq.protocol.httpreply import OPEN, READ, Response
from metaq.server.http.routes import Router
from metaq.server.http.server import ConnReader, Dropped, HeadTooLarge, RequestState
from tests.harness.acl import SECRETS, write_acl


def test_the_request_line_limit_is_pywsgis():
    assert http_limits.HTTP_MAX_REQUEST_LINE == pywsgi.MAX_REQUEST_LINE  # its handler answers the 414 past it


# -- readiness -------------------------------------------------------------------------------------------------


def test_readiness_reasons():
    master = {"replication_role": "none"}
    assert api.readiness(False, master, None, None) is None
    assert "shutting down" in api.readiness(True, master, None, None)
    assert "disk usage 97.0%" in api.readiness(False, master, "disk usage 97.0% is past the danger mark", None)
    assert "reads are refused" in api.readiness(False, master, None, "no epoch handshake yet")
    slave = {"replication_role": "slave", "replication_master": "127.0.0.1:9", "replication_link": "down"}
    assert "not handshaken" in api.readiness(False, slave, None, None)
    slave.update(replication_link="connected", replication_caught_up=False, replication_lag_messages=12)
    assert "12 messages behind" in api.readiness(False, slave, None, None)
    slave.update(replication_caught_up=True)
    assert api.readiness(False, slave, None, None) is None
    assert "slave cannot store" in api.readiness(False, slave, "disk full", None)
    waiting = {"replication_role": "slave", "replication_master": "none", "replication_link": "down"}
    assert "elected no master" in api.readiness(False, waiting, None, None)


def test_a_slave_whose_copy_met_a_full_disk_is_not_ready_for_its_disk_not_its_link():
    down = {"replication_role": "slave", "replication_master": "127.0.0.1:9", "replication_link": "down"}
    why = api.readiness(False, down, None, None, "disk full: no space left to allocate 1048576 bytes")
    assert why == "slave cannot store what it replicates: disk full: no space left to allocate 1048576 bytes"
    assert "not handshaken" in api.readiness(False, down, None, None, None)


# -- the reader ------------------------------------------------------------------------------------------------


class FakeConn:
    """What ConnReader asks of a connection: ``receive(nbytes)``, here from a list of chunks (None: the deadline
    passed or the peer went); ``asked``: the most bytes each receive asked for."""

    def __init__(self, chunks):
        self.chunks = list(chunks)
        self.asked = []

    def receive(self, nbytes):
        self.asked.append(nbytes)
        return self.chunks.pop(0)[:nbytes] if self.chunks else None


def test_the_reader_takes_at_most_a_turns_worth_of_bytes_a_receive():
    """A chunked body of 1-byte chunks costs microseconds a byte to parse: one receive is kept to
    ``limits.HTTP_RECV_BYTES``, so the connection shares the loop between two of them."""
    from metaq.server.http import limits as http_limits

    conn = FakeConn([b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"])
    r = ConnReader(conn, RequestState())
    r.start_request()
    assert r.readline(100) == b"GET / HTTP/1.1\r\n"
    assert conn.asked == [http_limits.HTTP_RECV_BYTES] and http_limits.HTTP_RECV_BYTES <= 64 * 1024


def test_the_reader_follows_requests_and_drops_a_partial_one():
    state = RequestState()
    r = ConnReader(FakeConn([b"GET / HTTP/1.1\r\nHo", b"st: x\r\n\r\n"]), state)
    r.start_request()
    assert not state.in_frame  # idle until the first byte: the idle timeout applies
    assert r.readline(100) == b"GET / HTTP/1.1\r\n"
    assert state.in_frame  # from the first byte on, the request deadline applies
    assert r.readline(100) == b"Host: x\r\n"
    assert r.readline(100) == b"\r\n"
    r.head_done()
    r.request_done()
    assert (state.in_frame, state.completed) == (False, 1)
    r.start_request()
    assert r.readline(100) == b""  # the peer went between requests: the end, no error
    slow = ConnReader(FakeConn([b"GET / HTTP/1.1\r\nHost: x\r\n"]), RequestState())  # then the deadline passes
    slow.start_request()
    slow.readline(100)
    slow.readline(100)
    with pytest.raises(Dropped):  # never a truncated head handed on as if whole
        slow.readline(100)


def test_the_reader_bounds_the_head_at_and_past_the_limit():
    line = b"X: %s\r\n" % (b"y" * 95)  # 100 bytes
    r = ConnReader(FakeConn([line * 3]), RequestState(), max_head=300)
    r.start_request()
    for _ in range(3):
        assert r.readline(1000) == line  # 300 bytes: at the limit
    r = ConnReader(FakeConn([line * 3 + b"\n"]), RequestState(), max_head=300)  # one byte more
    r.start_request()
    for _ in range(3):
        r.readline(1000)
    with pytest.raises(HeadTooLarge):
        r.readline(1000)


def test_a_stopped_reader_reads_nothing_more():
    r = ConnReader(FakeConn([b"body bytes"]), RequestState())
    r.stop()
    with pytest.raises(Dropped):
        r.read(10)


# -- the route table -------------------------------------------------------------------------------------------


@pytest.fixture
def secured_guard(tmp_path):
    return Guard(load_config(None, {"security.acl_file": write_acl(tmp_path / "acl.yaml")}).security)


def call(router, method, path, user=None, secret=None, body=b"", headers=None, session=None):
    env = {"REQUEST_METHOD": method, "PATH_INFO": path.split("?")[0],
           "QUERY_STRING": path.split("?", 1)[1] if "?" in path else "", "wsgi.input": io.BytesIO(body),
           "metaq.session": session or router.guard.session("127.0.0.1")}
    if body:
        env["CONTENT_LENGTH"] = str(len(body))
    if user is not None:
        env["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(("%s:%s" % (user, secret)).encode()).decode()
    env.update(headers or {})
    got = {}

    def start_response(status, hdrs):
        got["status"], got["headers"] = int(status.split()[0]), dict(hdrs)

    body = b"".join(router(env, start_response))
    return got["status"], got["headers"], body


def test_routes_check_basic_credentials_through_the_guard(secured_guard):
    from metaq.auth.acl import PUB

    router = Router(secured_guard)
    router.add("GET", "/open", OPEN, lambda req: Response(200, "open"))
    router.add("GET", "/read", READ, lambda req: Response(200, req.session.user))
    router.add("POST", "/t/{topic}", lambda g, s, p: g.require(s, PUB, "topic", p["topic"]),
               lambda req: Response(200, req.params["topic"]))
    assert call(router, "GET", "/open")[0] == 200
    status, headers, _ = call(router, "GET", "/read")
    assert status == 401 and "Basic" in headers["WWW-Authenticate"]
    assert call(router, "GET", "/read", "alice", "nope")[0] == 401
    assert call(router, "GET", "/read", "alice", SECRETS["alice"])[2] == b"alice"
    assert call(router, "POST", "/t/orders", "bob", SECRETS["bob"])[0] == 200
    status, _, body = call(router, "POST", "/t/payroll", "bob", SECRETS["bob"])
    assert status == 403 and b'"code": 403' in body
    session = secured_guard.session("127.0.0.1")  # one connection, two users in turn: each request proves its own
    assert call(router, "GET", "/read", "alice", SECRETS["alice"], session=session)[2] == b"alice"
    assert call(router, "GET", "/read", session=session)[0] == 401
    assert call(router, "GET", "/nowhere")[0] == 404
    status, headers, _ = call(router, "PUT", "/open")
    assert status == 405 and headers["Allow"] == "GET"


def test_a_body_past_the_limit_is_refused_by_its_content_length():
    router = Router(Guard(load_config(None, {}).security))
    read = []
    router.add("POST", "/p", OPEN, lambda req: read.append(req.body()) or Response(200, "ok"))
    status, headers, _ = call(router, "POST", "/p",
                              headers={"CONTENT_LENGTH": str(http_limits.HTTP_MAX_BODY_BYTES + 1)})
    assert status == 413 and headers["Connection"] == "close" and read == []
    assert call(router, "POST", "/p", body=b"x" * 10)[0] == 200 and read == [b"x" * 10]


# -- metrics ---------------------------------------------------------------------------------------------------


class TxInfo:
    def __init__(self, state):
        self.state = state


def test_the_collector_reads_the_figures_at_scrape_time():
    topics = [{"topic": "orders", "partitions": 4, "messages": 10, "bytes": 999, "puts_total": 12,
               "put_bytes_total": 600, "gets_total": 3}]
    groups = [{"group": "billing", "topic": "orders", "partition": 1, "offset": 4, "max_offset": 10, "lag": 6}]
    collector = BrokerCollector(None, lambda: [("version", "9.9"), ("broker_id", 3), ("disk_usage", 0.5),
                                               ("writes_refused", True), ("delay_pending", 7),
                                               ("timers_pending", 3), ("pop_in_flight", 5)],
                                lambda: topics, lambda: groups,
                                lambda: [("replication_role", "slave"), ("replication_epoch", 4),
                                         ("replication_lag_messages", 2), ("replication_writable", "no (slave)")],
                                lambda: {"text": 2, "http": 1}, lambda: [TxInfo("prepared"), TxInfo("prepared")])
    metrics = Metrics(collector)
    metrics.observe_flush(0.003)
    text = generate_latest(metrics.registry).decode()
    for line in ('metaq_topic_puts_total{topic="orders"} 12.0', 'metaq_topic_gets_total{topic="orders"} 3.0',
                 'metaq_group_lag_messages{group="billing",partition="1",topic="orders"} 6.0',
                 'metaq_replication_role{role="slave"} 1.0', "metaq_replication_epoch 4.0",
                 "metaq_replication_writable 0.0",
                 "metaq_writes_refused 1.0", "metaq_disk_usage_ratio 0.5", 'metaq_connections{listener="http"} 1.0',
                 'metaq_transactions{state="prepared"} 2.0', "metaq_delay_pending_messages 7.0",
                 "metaq_timers_pending_messages 3.0", "metaq_pop_in_flight_messages 5.0",
                 'metaq_flush_duration_seconds_bucket{le="0.005"} 1.0',
                 "metaq_flush_duration_seconds_count 1.0"):
        assert line in text, line
    assert "_created" not in text
    topics[0]["puts_total"] = 13  # read again at the next scrape
    assert 'metaq_topic_puts_total{topic="orders"} 13.0' in generate_latest(metrics.registry).decode()
    assert 'python_gc_collections_total{generation="2"}' in text  # the collector's full passes
    for name in re.findall(r"^# TYPE (\S+) ", text, re.M):
        assert name.startswith("metaq_") or name.startswith("python_gc_")


def _group_collector(rows):
    return BrokerCollector(None, lambda: [], lambda: [], lambda: rows, lambda: [], lambda: {}, lambda: [])


@pytest.mark.parametrize("extra", [0, 1])
def test_a_scrape_shows_the_most_group_rows_allowed_the_most_behind_first_and_says_how_many_it_left_out(extra):
    n = http_limits.MAX_METRICS_GROUP_ROWS + extra
    rows = [{"group": "g%d" % i, "topic": "t", "partition": 0, "offset": 0, "lag": i} for i in range(n)]
    text = generate_latest(Metrics(_group_collector(rows)).registry).decode()
    assert text.count("metaq_group_lag_messages{") == http_limits.MAX_METRICS_GROUP_ROWS
    assert "metaq_group_rows_left_out %d.0" % extra in text
    if extra:
        assert 'group="g0"' not in text and 'group="g%d"' % (n - 1) in text  # the least behind went


class Counted(BrokerCollector):
    calls = 0

    def collect(self):
        Counted.calls += 1
        return super().collect()


@pytest.mark.parametrize("build_s, reused_s", [(0.3, http_limits.METRICS_REUSE_S), (0.06, 0.6), (0.002, 0.0)])
def test_a_costly_answer_is_reused_for_ten_times_its_cost_at_most_a_second(monkeypatch, build_s, reused_s):
    import metaq.server.http.metrics as metrics_module
    clock = [100.0]
    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: clock[0])
    rows = [{"group": "g", "topic": "t", "partition": 0, "offset": 0, "lag": 1}]

    def costly():
        clock[0] += build_s  # what building the answer takes
        return rows
    Counted.calls = 0
    metrics = Metrics(Counted(None, lambda: [], lambda: [], costly, lambda: [], lambda: {}, lambda: []))
    request = types.SimpleNamespace(session=None)
    first = metrics.scrape(request).body
    rows[0]["lag"] = 7
    if reused_s:
        clock[0] += reused_s - 0.001
        assert metrics.scrape(request).body is first and Counted.calls == 1  # a flood of costly scrapes: one built
        clock[0] += 0.002
    assert b'metaq_group_lag_messages{group="g",partition="0",topic="t"} 7.0' in metrics.scrape(request).body
    assert Counted.calls == 2


# -- the dashboard ---------------------------------------------------------------------------------------------

HOSTILE = '<img src=x onerror="alert(1)">&</script><script>alert(2)</script>'


class Roles:
    role = "master"
    read_refusal = None

    def stats_values(self):
        return [("replication_role", "none"), ("replication_epoch", 1), ("replication_note", HOSTILE)]


class Views:
    """The BrokerViews a page reads, with names an attacker chose."""

    guard = Guard(load_config(None, {}).security)
    roles = Roles()

    def summary(self):
        return [("broker_id", 1), ("version", HOSTILE), ("disk_usage", 0.25)]

    def not_ready(self):
        return None

    def topic_list(self, may_see=None):
        return [{"topic": HOSTILE, "partitions": 1, "messages": 2, "bytes": 3}]

    def group_list(self, may_see=None):
        return [{"group": HOSTILE, "topic": HOSTILE, "partition": 0, "offset": 1, "max_offset": 2, "lag": 1}]


def test_the_dashboard_escapes_every_name():
    page = dashboard.Dashboard(Views()).page(type("Req", (), {"session": None})())
    html = page.body.decode()
    assert HOSTILE not in html and "<img" not in html and "alert(2)</script>" not in html
    assert html.count("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;&lt;/script&gt;") >= 4
    assert html.count("<script") == 1  # the page's own script, and nothing else
    assert "default-src 'self'" in dict(page.headers)["Content-Security-Policy"]
    script = dashboard.Dashboard(Views()).script.decode()
    assert "innerHTML" not in script and "textContent" in script  # the refresh writes text, never markup
