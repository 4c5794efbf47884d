"""MQTT.js (npm's mqtt, the Makefile's JS_CACHE) in a page in headless Chromium against the MQTT port's WebSocket
listener, with a device on TCP (docs/mqtt.md "Over WebSocket"): the page receives what the device published and
publishes what the device receives, at QoS 1 and 2."""

import os
import pathlib
import signal
import subprocess

from metaq.client.local import free_port
from tests.harness.http import need
from tests.harness.mqtt import Paho, mqtt_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The browser bundle `make setup` installs (Makefile: JS_CACHE, MQTTJS).
MQTTJS = pathlib.Path(os.environ.get("METAQ_JS_CACHE", ROOT / ".cache" / "js")) / "node_modules/mqtt/dist/mqtt.min.js"

PAGE = """<!doctype html><html><body><pre id="log"></pre>
<script src="%(script)s"></script>
<script>
const log = (s) => { document.getElementById("log").textContent += s + "\\n"; };
const client = mqtt.connect("ws://127.0.0.1:%(port)d/mqtt",
                            {clientId: "page-1", protocolVersion: 5, reconnectPeriod: 0});
client.on("connect", () => {
  log("connected");
  client.subscribe("fleet/+/state", {qos: 1}, () => client.publish("page/hello", "from the page", {qos: 2}));
});
client.on("message", (topic, payload) => {
  client.publish("page/echo", "got " + topic + " " + payload.toString(), {qos: 1});
});
client.on("error", (e) => log("error " + e));
</script></body></html>
"""


def test_mqttjs_in_chromium_and_a_device_on_tcp(broker_factory, tmp_path):
    assert MQTTJS.is_file(), "MQTT.js is not installed: run make setup (the Makefile's $(JS_CACHE)/.installed)"
    b = broker_factory(mqtt_config(tmp_path, ws_port=free_port()))
    device = Paho(b, "device")
    device.subscribe("page/#", 2)
    device.c.publish("fleet/d1/state", b"on", 1, retain=True).wait_for_publish(10)
    page = tmp_path / "page.html"
    page.write_text(PAGE % {"script": MQTTJS.as_uri(), "port": b.config["mqtt"]["ws_port"]})
    browser = subprocess.Popen([need("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--user-data-dir=%s" % (tmp_path / "profile"), "--remote-debugging-port=0",
                                page.as_uri()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # its renderers in its process group: ended with it
    try:
        got = device.wait_messages(2, timeout=60)
        assert sorted((m.topic, m.payload) for m in got) == [
            ("page/echo", b"got fleet/d1/state on"), ("page/hello", b"from the page")]
        device.publish("fleet/d2/state", b"live", 1)  # a device's message as the page holds its subscription
        got = device.wait_messages(3, timeout=30)
        assert ("page/echo", b"got fleet/d2/state live") in [(m.topic, m.payload) for m in got]
    finally:
        os.killpg(browser.pid, signal.SIGKILL)
        browser.wait(10)
