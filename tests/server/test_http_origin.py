"""Requests a browser was made to send (``metaq/server/http/origin.py``): cross-site writes and DNS rebinding.
Pure logic; the real browser's side is tests/security/test_http_browser.py."""

import pytest

from metaq.server.http.origin import BrowserCheck, split_host


def env(method="POST", host="127.0.0.1:8180", scheme="http", **headers):
    e = {"REQUEST_METHOD": method, "HTTP_HOST": host, "wsgi.url_scheme": scheme}
    e.update({"HTTP_" + k.upper(): v for k, v in headers.items()})
    return e


@pytest.mark.parametrize("value, parsed", [
    ("127.0.0.1:8180", ("127.0.0.1", 8180)), ("Broker.Example.", ("broker.example", 80)),
    ("[::1]:8180", ("::1", 8180)), ("[::1]", ("::1", 80)), ("a b", None), ("x:y", None), ("", None),
    ("[::1", None), ("u@h", None),
])
def test_host_values_are_read_or_refused(value, parsed):
    assert split_host(value) == parsed


def test_clients_that_are_not_browsers_are_not_concerned_when_authentication_is_on():
    check = BrowserCheck()
    assert check(env(host="evil.example:8180")) is None  # curl, the Python client, a scraper: no browser headers
    assert check(env(method="GET", host="anything")) is None
    # Node's fetch (undici) sends Sec-Fetch-Mode on every request, and no Origin: not a browser (a review found
    # Node services calling the broker by a service name refused)
    assert check(env(method="GET", host="metaq:8180", sec_fetch_mode="cors")) is None


def test_with_authentication_off_on_loopback_every_request_names_a_known_host():
    # a real Chromium sends no Sec-Fetch-* and no Origin with a plain-http page's own GET: a rebinding page's reads
    # look like curl's, so make run's broker (everything readable) checks the Host of every request
    check = BrowserCheck(["broker-1"], every_request=True)
    why = check(env(method="GET", host="evil.example:8180"))
    assert why is not None and "DNS rebinding" in why
    for host in ("127.0.0.1:8180", "localhost:8180", "broker-1:8180", "[::1]:8180"):
        assert check(env(method="GET", host=host)) is None, host
    assert check(env(host="127.0.0.1:8180")) is None  # a POST from curl: no Origin, nothing cross-site


def test_a_configured_name_behind_a_tls_terminating_proxy_is_the_same_site_whatever_the_port():
    check = BrowserCheck(["mq.example.com"], configured=["mq.example.com"])
    assert check(env(host="mq.example.com", scheme="http", origin="https://mq.example.com",
                     sec_fetch_site="same-origin")) is None
    assert check(env(host="mq.example.com", scheme="http", origin="https://evil.example")) is not None
    unconfigured = BrowserCheck(["mq.example.com"])  # the machine's own name: ports still compared
    assert unconfigured(env(host="mq.example.com", origin="https://mq.example.com")) is not None


@pytest.mark.parametrize("headers", [
    {"sec_fetch_site": "cross-site", "origin": "http://evil.example"},
    {"sec_fetch_site": "same-site", "origin": "http://127.0.0.1:3000"},  # another port of the same host
    {"origin": "http://evil.example"},  # a browser without Sec-Fetch-*
    {"origin": "http://127.0.0.1:3000"},
    {"origin": "null"},  # a sandboxed frame, a file:// page
    {"origin": "ftp://127.0.0.1:8180"},
])
def test_a_write_sent_by_a_page_of_another_site_is_refused(headers):
    why = BrowserCheck()(env(**headers))
    assert why is not None and "cross-site" in why


@pytest.mark.parametrize("method, headers", [
    ("POST", {"sec_fetch_site": "same-origin", "origin": "http://127.0.0.1:8180"}),  # the dashboard's own pages
    ("POST", {"origin": "http://127.0.0.1:8180"}),
    ("POST", {"sec_fetch_site": "none"}),  # typed by the user
    ("GET", {"sec_fetch_site": "cross-site", "sec_fetch_mode": "no-cors"}),  # a read: the answer stays opaque
])
def test_the_brokers_own_pages_and_reads_pass(method, headers):
    assert BrowserCheck()(env(method=method, **headers)) is None


def test_https_origins_compare_with_the_default_port():
    assert BrowserCheck()(env(host="127.0.0.1", scheme="https", origin="https://127.0.0.1")) is None
    assert BrowserCheck()(env(host="127.0.0.1:443", scheme="https", origin="https://127.0.0.1")) is None
    assert BrowserCheck()(env(host="127.0.0.1", scheme="http", origin="https://127.0.0.1")) is not None  # 80/443


@pytest.mark.parametrize("host", ["evil.example:8180", "rebind.attacker.test", "", "x y"])
def test_a_browser_request_under_a_name_the_broker_does_not_go_by_is_refused_reads_included(host):
    why = BrowserCheck(["broker-1"])(env(method="GET", host=host, sec_fetch_site="same-origin"))
    assert why is not None and "DNS rebinding" in why and "http.allowed_hosts" in why


@pytest.mark.parametrize("host", ["127.0.0.1:8180", "[::1]:8180", "localhost:8180", "app.localhost",
                                  "broker-1:8180", "BROKER-1.", "metaq.internal"])
def test_addresses_localhost_and_the_given_names_are_the_brokers(host):
    check = BrowserCheck(["broker-1", "metaq.internal"])
    assert check(env(method="GET", host=host, sec_fetch_site="same-origin")) is None


def test_a_star_lets_every_name_in_but_still_refuses_cross_site_writes():
    check = BrowserCheck(["*"])
    assert check(env(method="GET", host="whatever.example", sec_fetch_site="same-origin")) is None
    assert check(env(host="whatever.example", sec_fetch_site="cross-site")) is not None


def test_probes_answer_under_any_name():
    check = BrowserCheck(every_request=True)
    for path in ("/healthz", "/readyz"):
        e = env(method="GET", host="10-0-0-7.pod:8180")
        e["PATH_INFO"] = path
        assert check(e) is None  # a kubelet's or a load balancer's probe
    e = env(method="GET", host="10-0-0-7.pod:8180")
    e["PATH_INFO"] = "/metrics"
    assert check(e) is not None  # names of every topic: not for a rebinding page
