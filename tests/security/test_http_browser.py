"""A real browser made to attack the broker by a page of another site (found by an attack review: a page the
operator opened stored messages and reset a group's offset through the HTTP port; a foreign Host was served)."""

import http.server
import threading

import pytest

from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.http import chromium, http_port, request, with_http


class _Page(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args):
        pass


@pytest.fixture
def evil_site():
    """Serve ``html`` from another origin (http://localhost:<port>/): returns ``serve(html) -> url``."""
    servers = []

    def serve(html):
        handler = type("Page", (_Page,), {"page": html.encode("utf-8")})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return "http://localhost:%d/" % server.server_address[1]

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_page_of_another_site_can_neither_write_nor_reset_offsets_through_the_visitors_browser(
        broker_factory, tmp_path, evil_site):
    b = broker_factory(with_http(small_config(tmp_path / "data")))  # as `make run` starts it: no authentication
    with b.client() as c:
        for i in range(5):
            c.put_ok("orders", b"m%d" % i, partition=0)
        assert c.call(ev.CommitOffset("billing", "orders", 0, 5, c.opaque())).code == 200
    base = "http://127.0.0.1:%d" % http_port(b)
    url = evil_site("""<html><body>
      <form id=f method=post enctype=text/plain action="%s/api/topics/orders/messages?partition=0">
        <input name=by value=form></form>
      <script>
        fetch('%s/api/topics/orders/messages?partition=0', {method: 'POST', mode: 'no-cors', body: 'by-fetch'});
        fetch('%s/api/groups/billing/offsets/orders/0?to=earliest&execute=1&force=1', {method: 'POST', mode: 'no-cors'})
          .then(function () { document.getElementById('f').submit(); });
      </script>evil</body></html>""" % (base, base, base))
    chromium(url, "--user-data-dir=%s" % (tmp_path / "chrome"), "--dump-dom", budget_ms=4000)
    with b.client() as c:
        assert c.call(ev.QueryOffset("billing", "orders", 0, c.opaque())).body == b"5"  # was reset to 0
    stored = request(b, "GET", "/api/topics/orders/partitions/0/messages?offset=0").json()["messages"]
    assert len(stored) == 5, stored  # neither the fetch's message nor the form's
    log = b.log_text()
    assert "refused (cross-site request)" in log  # the browser did send them: they were refused


def test_a_rebinding_page_in_a_real_browser_reads_nothing_from_make_runs_broker(broker_factory, tmp_path):
    # a review: Chromium sends no Sec-Fetch-* and no Origin with a plain-http page's own GET, so a check of browser
    # requests alone let a rebinding page read every message of a broker without authentication
    import base64

    b = broker_factory(with_http(small_config(tmp_path / "data")))  # no authentication, loopback: make run's
    with b.client() as c:
        c.put_ok("orders", b"top-secret-payload", partition=0)
    path = "/api/topics/orders/partitions/0/messages?offset=0"
    secret = base64.b64encode(b"top-secret-payload").decode()
    # the attacker's name, resolved to the broker's address as a rebinding DNS answer would
    dom = chromium("http://evil.example:%d%s" % (http_port(b), path), "--user-data-dir=%s" % (tmp_path / "c1"),
                   "--host-resolver-rules=MAP evil.example 127.0.0.1", "--dump-dom")
    assert secret not in dom and "DNS rebinding" in dom, dom[:500]
    dom = chromium("http://127.0.0.1:%d%s" % (http_port(b), path), "--user-data-dir=%s" % (tmp_path / "c2"),
                   "--dump-dom")
    assert secret in dom  # by its address: served


def test_a_browser_reaching_the_port_under_a_foreign_name_is_refused_and_other_clients_are_not(
        broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data"), allowed_hosts=["metaq.internal"]))
    with b.client() as c:
        c.put_ok("orders", b"secret", partition=0)
    path = "/api/topics/orders/partitions/0/messages?offset=0"
    # what a DNS-rebinding page's own (same-origin, from the browser's view) fetch sends
    rebinding = request(b, "GET", path, headers={"Host": "evil.example:%d" % http_port(b),
                                                 "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"})
    assert rebinding.status == 403 and "http.allowed_hosts" in rebinding.json()["error"], rebinding
    assert b"secret" not in rebinding.body
    for host in ("metaq.internal:%d" % http_port(b), "127.0.0.1:%d" % http_port(b), "localhost"):
        ok = request(b, "GET", path, headers={"Host": host, "Sec-Fetch-Site": "same-origin"})
        assert ok.status == 200 and len(ok.json()["messages"]) == 1, (host, ok)
    # with authentication off on a loopback port every request is checked (a browser's own GET looks like curl's)
    assert request(b, "GET", path, headers={"Host": "broker.example"}).status == 403


def test_with_authentication_on_clients_that_are_not_browsers_may_use_any_name(broker_factory, tmp_path):
    from tests.harness.acl import SECRETS, secured_config

    b = broker_factory(with_http(secured_config(tmp_path)))
    ok = request(b, "GET", "/api/broker", user="admin", secret=SECRETS["admin"], headers={"Host": "broker.example"})
    assert ok.status == 200, ok  # a service calling the broker by its DNS name (Node's fetch: Sec-Fetch-Mode too)
    node = request(b, "GET", "/api/broker", user="admin", secret=SECRETS["admin"],
                   headers={"Host": "metaq:9", "Sec-Fetch-Mode": "cors"})
    assert node.status == 200, node
    browser = request(b, "GET", "/api/broker", user="admin", secret=SECRETS["admin"],
                      headers={"Host": "evil.example", "Sec-Fetch-Site": "same-origin"})
    assert browser.status == 403


def test_a_name_that_is_not_a_host_name_in_allowed_hosts_is_refused_at_start(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data"), allowed_hosts=["http://x.example"]), start=False)
    with pytest.raises(RuntimeError):  # the harness: the broker exited before it served
        b.start(timeout=10)
    assert "http.allowed_hosts" in b.log_text() and "is not a host name" in b.log_text()
