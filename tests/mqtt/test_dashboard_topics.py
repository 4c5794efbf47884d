"""The dashboard's live topic page (docs/operating.md "A topic, live over MQTT") in headless Chromium, with users
on: the page's own MQTT client connects to the WebSocket listener with the secret typed in, shows what a device
published over TCP, publishes what a TCP subscriber receives; the broker's refusals are shown; the page's limits
hold at and one past."""

import json
import time

import pytest

from metaq.server.http import limits as http_limits
from metaq.client.local import free_port
from tests.harness.acl import SECRETS, secured_config
from tests.harness.browser import Browser
from tests.harness.http import http_port, with_http
from tests.harness.mqtt import Paho, with_mqtt
from tests.harness.pki import Pki

ROWS = "Array.from(document.querySelectorAll('#messages tbody tr'), r => Array.from(r.cells, c => c.textContent))"


@pytest.fixture
def pages(broker_factory, tmp_path):
    """``pages(**mqtt)``: a broker with users, the MQTT port (with ``mqtt`` settings) and its ws:// listener, the HTTP
    port; and a browser on its topic page as ``user``: ``open(user) -> Browser``."""
    browsers = []

    def make(**mqtt):
        b = broker_factory(with_http(with_mqtt(secured_config(tmp_path), ws_port=free_port(), **mqtt)))

        def open_page(user):
            browser = Browser(tmp_path / ("chromium-%d" % len(browsers)))
            browsers.append(browser)
            browser.basic_auth(user, SECRETS[user])
            browser.open("http://127.0.0.1:%d/dashboard/topics" % http_port(b))
            return browser

        open_page.broker = b
        return open_page

    yield make
    for browser in browsers:
        browser.close()


@pytest.fixture
def page(pages):
    return pages()


def _type(browser, **fields):
    for name, value in fields.items():
        browser.evaluate("document.getElementById(%s).value = %s" % (json.dumps(name), json.dumps(value)))


def _submit(browser, form):
    browser.evaluate("document.getElementById(%s).requestSubmit()" % json.dumps(form))


def _connect(browser, user, secret):
    _type(browser, user=user, secret=secret)
    _submit(browser, "login")


def _state(browser):
    return browser.evaluate("document.getElementById('state').textContent")


def test_the_page_shows_a_devices_message_and_publishes_one_a_tcp_subscriber_gets(page):
    browser = page("alice")
    b = page.broker
    ws = b.config["mqtt"]["ws_port"]
    assert browser.evaluate("document.getElementById('endpoint').textContent") == \
        "MQTT over WebSocket: ws://127.0.0.1:%d/mqtt" % ws
    assert browser.evaluate("document.getElementById('user').value") == "alice"  # the HTTP user, the secret typed
    device = Paho(b, "device", user="alice", secret=SECRETS["alice"])
    device.c.publish("orders/d1/state", b"on", 1, retain=True).wait_for_publish(10)
    _connect(browser, "alice", SECRETS["alice"])
    browser.wait_for("document.getElementById('state').textContent.startsWith('connected to ws://')")
    _type(browser, filter="orders/#")
    _submit(browser, "watch")
    browser.wait_for("document.getElementById('subscriptions').textContent.includes('orders/#: granted QoS 1')")
    browser.wait_for("document.querySelectorAll('#messages tbody tr').length === 1")
    device.publish("orders/d2/state", b"live", 1)
    device.publish("orders/d2/raw", b"\x00\xff\x10", 0)
    browser.wait_for("document.querySelectorAll('#messages tbody tr').length === 3")
    assert browser.evaluate(ROWS) == [["1", "orders/d1/state", "1", "yes", "on"],
                                      ["2", "orders/d2/state", "1", "no", "live"],
                                      ["3", "orders/d2/raw", "0", "no", "hex: 00 ff 10"]]
    subscriber = Paho(b, "subscriber", user="alice", secret=SECRETS["alice"])
    subscriber.subscribe("orders/page/#", 1)
    _type(browser, **{"pub-topic": "orders/page/1", "pub-payload": "from the page"})
    _submit(browser, "publish")
    got = subscriber.wait_messages(1, timeout=20)
    assert [(m.topic, m.payload, m.qos) for m in got] == [("orders/page/1", b"from the page", 1)]
    browser.wait_for("document.getElementById('published').textContent.includes('orders/page/1: acknowledged')")
    _type(browser, **{"pub-topic": "orders/page/kept", "pub-payload": "kept"})
    browser.evaluate("document.getElementById('pub-retain').checked = true")
    _submit(browser, "publish")
    browser.wait_for("document.getElementById('published').textContent.includes('orders/page/kept: acknowledged')")
    late = Paho(b, "late", user="alice", secret=SECRETS["alice"])
    late.subscribe("orders/page/kept", 1)
    got = late.wait_messages(1, timeout=20)
    assert [(m.topic, m.payload, m.retain) for m in got] == [("orders/page/kept", b"kept", 1)]


def test_a_wrong_secret_a_denied_subscribe_and_a_denied_publish_show_the_brokers_refusal(page):
    browser = page("bob")  # bob may publish to orders, nothing else
    _connect(browser, "bob", "not-the-secret")
    # the CONNACK's refusal is shown first, then the closed connection's line, which stays
    browser.wait_for("document.getElementById('state').textContent.startsWith('not connected: ')")
    assert _state(browser) == "not connected: refused: CONNACK 4 (bad user name or password)"
    _connect(browser, "bob", SECRETS["bob"])
    browser.wait_for("document.getElementById('state').textContent.startsWith('connected to')")
    _type(browser, filter="orders/#")
    _submit(browser, "watch")
    browser.wait_for("document.getElementById('subscriptions').textContent.includes('orders/#: refused by the broker "
                     "(SUBACK 0x80')")
    watcher = Paho(page.broker, "watcher", user="admin", secret=SECRETS["admin"])
    watcher.subscribe("payroll/#", 1)
    _type(browser, **{"pub-topic": "payroll/june", "pub-payload": "raise"})
    _submit(browser, "publish")
    browser.wait_for("document.getElementById('state').textContent.startsWith('not connected: ')")
    assert "unacknowledged: payroll/june (MQTT 3.1.1 refuses a PUBLISH by closing" in _state(browser)
    assert watcher.wait_messages(1, timeout=1) == []  # nothing stored


def test_the_pages_limits_hold_at_and_one_past(page):
    browser = page("alice")
    b = page.broker
    _connect(browser, "alice", SECRETS["alice"])
    browser.wait_for("document.getElementById('state').textContent.startsWith('connected to')")
    _type(browser, filter="orders/#")
    _submit(browser, "watch")
    browser.wait_for("document.getElementById('subscriptions').textContent.includes('granted')")
    device = Paho(b, "device", user="alice", secret=SECRETS["alice"])
    shown = http_limits.DASHBOARD_SHOWN_PAYLOAD_BYTES
    device.publish("orders/long", b"a" * shown, 1)
    device.publish("orders/long", b"b" * (shown + 1), 1)
    browser.wait_for("document.querySelectorAll('#messages tbody tr').length === 2")
    assert browser.evaluate(ROWS)[0][4] == "a" * shown  # the whole payload: no note
    for i in range(http_limits.DASHBOARD_MAX_MESSAGES - 2):
        device.c.publish("orders/many", b"m%d" % i, 0)
    device.publish("orders/many", b"last", 1)
    count = http_limits.DASHBOARD_MAX_MESSAGES + 1
    browser.wait_for("Array.from(document.querySelectorAll('#messages tbody tr td:first-child')).some("
                     "c => c.textContent === '%d')" % count)
    rows = browser.evaluate(ROWS)
    assert len(rows) == http_limits.DASHBOARD_MAX_MESSAGES and rows[0][0] == "2" and rows[-1][0] == str(count)
    assert rows[0][4] == "b" * shown + " … (%d bytes, the first %d shown)" % (shown + 1, shown)
    # the page's QoS 1 publishes waiting for their PUBACK: DASHBOARD_MAX_INFLIGHT, and one more refused
    _type(browser, **{"pub-topic": "orders/burst"})
    notes = browser.evaluate("for (let i = 0; i <= %d; i++) document.getElementById('publish').requestSubmit(); "
                             "Array.from(document.querySelectorAll('#published li'), li => li.textContent)"
                             % http_limits.DASHBOARD_MAX_INFLIGHT)  # in one turn of the page: no PUBACK read between
    assert notes.count("orders/burst: sent, waiting for PUBACK") == http_limits.DASHBOARD_MAX_INFLIGHT, notes
    assert notes[0].startswith("orders/burst: refused in the page: %d packets wait"
                               % http_limits.DASHBOARD_MAX_INFLIGHT)
    browser.wait_for("document.querySelectorAll('#published li').length === %d"
                     % (2 * http_limits.DASHBOARD_MAX_INFLIGHT
                                                                                  + 1))
    # a packet of DASHBOARD_MAX_PACKET_BYTES is read; one byte more closes the connection at its length field
    topic = "orders/big"
    payload = http_limits.DASHBOARD_MAX_PACKET_BYTES - (1 + 3 + 2 + len(topic))  # QoS 0: a 3-byte Remaining Length
    device.c.publish(topic, b"x" * payload, 0)
    browser.wait_for("Array.from(document.querySelectorAll('#messages tbody tr td:nth-child(2)')).some("
                     "c => c.textContent === 'orders/big')")
    device.c.publish(topic, b"x" * (payload + 1), 0)
    browser.wait_for("document.getElementById('state').textContent.startsWith('not connected: ')")
    assert _state(browser) == ("not connected: a packet of %d bytes passes the page's limit of %d bytes "
                               "(limits.DASHBOARD_MAX_PACKET_BYTES)" % (http_limits.DASHBOARD_MAX_PACKET_BYTES + 1,
                                                                         http_limits.DASHBOARD_MAX_PACKET_BYTES))


def test_a_page_over_https_connects_over_wss(broker_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    cfg = with_http(with_mqtt(secured_config(tmp_path, tls=pki.tls_config("on")), wss_port=free_port()))
    b = broker_factory(cfg)
    browser = Browser(tmp_path / "chromium", "--ignore-certificate-errors")  # the test's own CA
    try:
        browser.basic_auth("alice", SECRETS["alice"])
        browser.open("https://127.0.0.1:%d/dashboard/topics" % http_port(b))
        url = "wss://127.0.0.1:%d/mqtt" % cfg["mqtt"]["wss_port"]
        assert browser.evaluate("document.getElementById('endpoint').textContent") == "MQTT over WebSocket: " + url
        _connect(browser, "alice", SECRETS["alice"])
        browser.wait_for("document.getElementById('state').textContent.startsWith('connected to %s')" % url)
        browser.evaluate("document.getElementById('disconnect').click()")  # DISCONNECT, then the close
        browser.wait_for("document.getElementById('state').textContent === 'not connected: disconnected'")
    finally:
        browser.close()


@pytest.mark.slow
def test_the_pages_pings_keep_an_idle_connection_past_the_brokers_keep_alive_deadline(pages):
    """Under a bound on the Keep Alive below ``DASHBOARD_KEEPALIVE_S`` the page asks the bound (a 3.1.1 CONNECT
    asking more is refused), and pings within it (once a second it looks whether one is due)."""
    keep = 4
    page = pages(max_keep_alive_s=keep)
    browser = page("alice")
    _connect(browser, "alice", SECRETS["alice"])
    browser.wait_for("document.getElementById('state').textContent.startsWith('connected to')")
    time.sleep(keep * 1.5 + 2)  # the broker closes a client silent for 1.5 keep-alives
    assert _state(browser).startswith("connected to"), _state(browser)
    device = Paho(page.broker, "device", user="alice", secret=SECRETS["alice"])
    _type(browser, filter="orders/#")
    _submit(browser, "watch")
    browser.wait_for("document.getElementById('subscriptions').textContent.includes('granted')")
    device.publish("orders/late", b"still here", 1)
    browser.wait_for("document.querySelectorAll('#messages tbody tr').length === 1")


def test_a_handshake_refused_for_the_pages_origin_is_said_so(broker_factory, tmp_path):
    cfg = with_http(with_mqtt(secured_config(tmp_path), ws_port=free_port(),
                              ws_allowed_origins=["https://dash.example.com"]))
    b = broker_factory(cfg)
    browser = Browser(tmp_path / "chromium")
    try:
        browser.basic_auth("alice", SECRETS["alice"])
        browser.open("http://127.0.0.1:%d/dashboard/topics" % http_port(b))
        _connect(browser, "alice", SECRETS["alice"])
        browser.wait_for("document.getElementById('state').textContent.startsWith('not connected: ')")
        assert _state(browser) == ("not connected: the WebSocket did not open: the listener refused the handshake "
                                   "(is this page's origin, http://127.0.0.1:%d, missing from "
                                   "mqtt.ws_allowed_origins?) or is not reachable" % http_port(b))
    finally:
        browser.close()
