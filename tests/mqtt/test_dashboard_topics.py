"""The dashboard's live topic page (docs/operating.md "A topic, live over MQTT") in headless Chromium, with users
on: the page's own MQTT client connects to the WebSocket listener with the secret typed in, shows what a device
published over TCP, publishes what a TCP subscriber receives; the broker's refusals are shown; the page's limits
hold at and one past."""

import json

import pytest

from metaq import limits
from metaq.client.local import free_port
from tests.harness.acl import SECRETS, secured_config
from tests.harness.browser import Browser
from tests.harness.http import http_port, with_http
from tests.harness.mqtt import Paho, with_mqtt

ROWS = "Array.from(document.querySelectorAll('#messages tbody tr'), r => Array.from(r.cells, c => c.textContent))"


@pytest.fixture
def page(broker_factory, tmp_path):
    """A broker with users, the MQTT port and its ws:// listener, the HTTP port; and a browser on its topic page
    as ``user``: ``open(user) -> Browser``."""
    b = broker_factory(with_http(with_mqtt(secured_config(tmp_path), ws_port=free_port())))
    browsers = []

    def open_page(user):
        browser = Browser(tmp_path / ("chromium-%d" % len(browsers)))
        browsers.append(browser)
        browser.basic_auth(user, SECRETS[user])
        browser.open("http://127.0.0.1:%d/dashboard/topics" % http_port(b))
        return browser

    open_page.broker = b
    yield open_page
    for browser in browsers:
        browser.close()


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
