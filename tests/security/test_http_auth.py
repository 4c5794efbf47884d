"""The HTTP port with authentication (HTTP Basic through the Guard) and TLS (README "The HTTP port")."""

import socket
import ssl

from metaq.protocol import events as ev
from tests.harness.acl import SECRETS, secured_config
from tests.harness.http import http_port, request, with_http
from tests.harness.pki import Pki


def _as(user):
    return {"user": user, "secret": SECRETS[user]}


def test_http_basic_auth_maps_requests_to_the_guards_permissions(broker_factory, tmp_path):
    b = broker_factory(with_http(secured_config(tmp_path)))
    # open: liveness and readiness; the metrics need a user (a scrape user) unless open_metrics says otherwise
    assert request(b, "GET", "/healthz").status == 200
    assert request(b, "GET", "/readyz").status == 200
    assert request(b, "GET", "/metrics").status == 401
    # everything else needs a user
    r = request(b, "GET", "/api/broker")
    assert r.status == 401 and r.json()["code"] == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
    assert request(b, "GET", "/", user="alice", secret="wrong").status == 401
    assert request(b, "GET", "/api/broker", user="nobody", secret="x").status == 401
    assert request(b, "GET", "/api/broker", **_as("bob")).status == 200  # what stats needs: any user
    # put needs publish on the topic, get needs subscribe
    r = request(b, "POST", "/api/topics/orders/messages?partition=0", body=b"o1", **_as("bob"))
    assert r.status == 200, r
    r = request(b, "GET", "/api/topics/orders/partitions/0/messages?offset=0", **_as("bob"))
    assert r.status == 403 and r.json()["code"] == 403 and "subscribe" in r.json()["error"]
    r = request(b, "POST", "/api/topics/payroll/messages?partition=0", body=b"p", **_as("alice"))
    assert r.status == 403
    r = request(b, "GET", "/api/topics/orders/partitions/0/messages?offset=0", **_as("alice"))
    assert r.status == 200 and len(r.json()["messages"]) == 1
    # the tables show a user only what it may subscribe to, as stats does
    request(b, "POST", "/api/topics/payroll/messages?partition=0", body=b"p", **_as("admin"))
    seen = {t["topic"] for t in request(b, "GET", "/api/topics", **_as("reader")).json()["topics"]}
    assert "orders" in seen and "payroll" not in seen
    seen = {t["topic"] for t in request(b, "GET", "/api/topics", **_as("admin")).json()["topics"]}
    assert {"orders", "payroll"} <= seen
    assert "payroll" not in request(b, "GET", "/", **_as("reader")).text


def test_metrics_need_a_user_by_default_and_may_be_opened(broker_factory, tmp_path):
    b = broker_factory(with_http(secured_config(tmp_path)))
    r = request(b, "GET", "/metrics")
    assert r.status == 401 and "payroll" not in r.text and "orders" not in r.text  # nothing for a stranger
    assert request(b, "GET", "/metrics", **_as("reader")).status == 200
    (tmp_path / "open").mkdir()
    opened = broker_factory(with_http(secured_config(tmp_path / "open"), open_metrics=True))
    assert request(opened, "GET", "/metrics").status == 200


def test_broker_wide_stats_are_an_admins(broker_factory, tmp_path):
    """stats realtime and stats delay count every user's messages together (a tenant would learn another's rate)."""
    b = broker_factory(secured_config(tmp_path))
    with b.client() as c:
        assert c.auth("reader", SECRETS["reader"]).code == 200
        for item in ("realtime", "delay"):
            r = c.call(ev.Stats(item, c.opaque()))
            assert r.code == 403 and b"counts every user's messages: an admin's" in r.body, r
        assert c.call(ev.Stats(None, c.opaque())).code == 200  # the summary and the filtered tables stay any user's
        assert c.call(ev.Stats("topics", c.opaque())).code == 200
    with b.client() as c:
        assert c.auth("admin", SECRETS["admin"]).code == 200
        assert c.call(ev.Stats("realtime", c.opaque())).code == 200 and c.call(ev.Stats("delay", 2)).code == 200


def test_closed_metrics_show_a_user_only_what_it_may_subscribe_to(broker_factory, tmp_path):
    # an attack review: bob, who may only publish to orders, read payroll's puts, bytes and messages in /metrics
    b = broker_factory(with_http(secured_config(tmp_path), open_metrics=False))
    for topic in ("payroll", "orders"):
        assert request(b, "POST", "/api/topics/%s/messages?partition=0" % topic, body=b"x",
                       **_as("admin")).status == 200
    with b.client() as c:
        assert c.auth("admin", SECRETS["admin"]).code == 200
        assert c.call(ev.CommitOffset("payroll-audit", "payroll", 0, 1, c.opaque())).code == 200

    def names(user):
        text = request(b, "GET", "/metrics", **_as(user)).text
        return {line.split("{")[0] + ":" + line for line in text.splitlines() if not line.startswith("#")}
    for user in ("bob", "reader"):
        shown = "\n".join(names(user))
        assert "payroll" not in shown, (user, [line for line in shown.splitlines() if "payroll" in line])
    assert 'metaq_topic_messages{topic="orders"}' in "\n".join(names("reader"))  # what it may read: shown
    everything = "\n".join(names("admin"))
    assert 'topic="payroll"' in everything and 'group="payroll-audit"' in everything


def test_the_http_port_speaks_tls_when_tls_mode_is_on(broker_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    cfg = with_http(secured_config(tmp_path, tls=pki.tls_config("on")))
    b = broker_factory(cfg)
    r = request(b, "POST", "/api/topics/orders/messages?partition=0", body=b"over tls", ca=pki.ca, **_as("alice"))
    assert r.status == 200, r
    r = request(b, "GET", "/api/topics/orders/partitions/0/messages?offset=0&format=raw", ca=pki.ca, **_as("alice"))
    assert r.status == 200 and r.body == b"over tls"
    # plaintext on the TLS-only port: refused (400), never served
    s = socket.create_connection(("127.0.0.1", http_port(b)), timeout=10)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = s.recv(1000)
    assert reply.startswith(b"HTTP/1.1 400 ") and b"TLS" in reply
    s.close()
    # a client that does not trust the broker's CA does not get through
    try:
        request(b, "GET", "/healthz", ca=pki.rogue_ca)
        raise AssertionError("an untrusted certificate was accepted")
    except ssl.SSLError:
        pass


def test_the_timer_routes_need_admin(broker_factory, tmp_path):
    b = broker_factory(with_http(secured_config(tmp_path)))
    assert request(b, "GET", "/api/timers").status == 401
    for user in ("alice", "bob", "reader"):
        assert request(b, "GET", "/api/timers", **_as(user)).status == 403
        assert request(b, "DELETE", "/api/timers/1", **_as(user)).status == 403
    assert request(b, "GET", "/api/timers", **_as("admin")).json() == {"timers": []}
    assert request(b, "DELETE", "/api/timers/1", **_as("admin")).json()["outcome"] == "unknown"
