"""MQTT for the tests: a broker config with the MQTT port, paho-mqtt clients, Mosquitto's command-line clients, and a
raw client (our codec over a plain socket) for the bytes real clients never send."""

import os
import socket
import subprocess
import threading
import time

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from metaq.client.local import free_port, small_config
from metaq.mqtt import wire
from metaq.protocol.stream import CLOSED, NEED_DATA

V311, V5 = paho.MQTTv311, paho.MQTTv5

#: Every Paho client started and not yet closed (``close_all``: a test's clients must not reconnect after it).
_OPEN = []


def with_mqtt(config, **mqtt):
    """``config`` with the MQTT port on (a fixed free port, so that it survives restarts) and ``mqtt`` settings."""
    values = {"port": free_port()}
    values.update(mqtt)
    config.setdefault("mqtt", {}).update(values)
    return config


def mqtt_config(tmp_path, **mqtt):
    return with_mqtt(small_config(tmp_path / "data"), **mqtt)


def mqtt_port(broker):
    return broker.config["mqtt"]["port"]


class Paho:
    """A paho-mqtt client on its own network thread: connected, with what it received and its CONNACK."""

    def __init__(self, broker, client_id="", version=V5, user=None, secret=None, clean=True, will=None,
                 properties=None, keepalive=60, connect=True, websocket=None):
        self.messages = []
        self.got = threading.Condition()
        self.connack = None
        self.disconnects = []
        self.subacks = []
        kwargs = {"clean_session": clean} if version == V311 else {}
        # ``websocket``: None (TCP), or ``(port, path)`` of a WebSocket listener (Paho's websockets transport)
        self.websocket = websocket
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                             transport="websockets" if websocket else "tcp", **kwargs)
        if websocket:
            self.c.ws_set_options(path=websocket[1])
        self.c.on_message = self._message
        self.c.on_connect = self._connect
        self.c.on_disconnect = lambda c, u, flags, rc, props=None: self.disconnects.append(rc)
        self.c.on_subscribe = lambda c, u, mid, codes, props=None: self.subacks.append(
            [getattr(code, "value", code) for code in codes])
        if user is not None:
            self.c.username_pw_set(user, secret)
        if will is not None:
            self.c.will_set(**will)
        self.broker, self.version, self.keepalive, self.properties = broker, version, keepalive, properties
        self.clean = clean
        self.session_present = None
        _OPEN.append(self)
        if connect:
            self.connect()

    def connect(self, timeout=10.0):
        kwargs = {"clean_start": self.clean, "properties": self.properties} if self.version == V5 else {}
        host = getattr(self.broker, "host", "127.0.0.1")  # a broker in a network namespace binds its address
        port = self.websocket[0] if self.websocket else mqtt_port(self.broker)
        self.c.connect(host, port, keepalive=self.keepalive, **kwargs)
        self.c.loop_start()
        deadline = time.monotonic() + timeout
        while self.connack is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.connack is not None, "no CONNACK"
        return self

    def _connect(self, client, userdata, flags, rc, props=None):
        self.session_present = flags.session_present
        self.connack = rc

    def _message(self, client, userdata, msg):
        with self.got:
            self.messages.append(msg)
            self.got.notify_all()

    def subscribe(self, topic_filter, qos=1, timeout=10.0, properties=None):
        n = len(self.subacks)
        self.c.subscribe(topic_filter, qos, properties=properties)
        deadline = time.monotonic() + timeout
        while len(self.subacks) == n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.subacks) > n, "no SUBACK"
        return self.subacks[-1]

    def wait_messages(self, n, timeout=10.0):
        deadline = time.monotonic() + timeout
        with self.got:
            while len(self.messages) < n and time.monotonic() < deadline:
                self.got.wait(0.1)
        return list(self.messages)

    def publish(self, topic, payload, qos=0, properties=None, timeout=10.0):
        info = self.c.publish(topic, payload, qos, properties=properties)
        if qos:
            info.wait_for_publish(timeout)
        return info

    def settle(self, timeout=10.0):
        """Return once the acknowledgements of the PUBLISHes received so far have been written: paho acknowledges a
        message after its callback returns, so a ``close`` right after ``wait_messages`` can send its DISCONNECT
        first, and the broker then rightly sends that message again (QoS 1: at least once). A QoS 1 PUBLISH of our
        own is acknowledged only after the network thread has handled every packet before it."""
        self.publish("harness/settle", b"", 1).wait_for_publish(timeout)

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()
        if self in _OPEN:
            _OPEN.remove(self)


def close_all():
    """Close every Paho client still open (tests/mqtt/conftest.py, after each test)."""
    while _OPEN:
        _OPEN[-1].close()


def mosquitto_pub(broker, topic, message, qos=0, version="mqttv5", *extra):
    return subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(mqtt_port(broker)), "-V", version, "-t",
                           topic, "-m", message, "-q", str(qos), *extra], capture_output=True, text=True, timeout=30)


def mosquitto_sub(broker, topic_filter, count, qos=1, version="mqttv5", *extra):
    """A started ``mosquitto_sub -C count -v`` (the caller waits for it: ``.communicate``)."""
    return subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(mqtt_port(broker)), "-V", version, "-t",
                             topic_filter, "-C", str(count), "-q", str(qos), "-v", "-W", "20", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class SubscribedMosquittoSub:
    """``mosquitto_sub -C count -v``, returned once its SUBACK came (its debug lines, written a line at a time, say
    so): a message published from then on reaches it, however long the process took to start and subscribe.
    ``communicate`` is Popen's, text, without the debug lines (``Client ...``, ``Subscribed (mid: ...``)."""

    def __init__(self, broker, topic_filter, count, qos=1, version="mqttv5", *extra):
        self.proc = subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(mqtt_port(broker)),
                                      "-V", version, "-t", topic_filter, "-C", str(count), "-q", str(qos), "-v",
                                      "-W", "20", "-d", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.head = b""
        while b" received SUBACK" not in self.head:
            more = os.read(self.proc.stdout.fileno(), 4096)  # (it gives up after its -W 20 s: the pipe ends)
            if not more:
                _out, err = self.proc.communicate()
                raise AssertionError("mosquitto_sub got no SUBACK: %s" % err.decode(errors="replace"))
            self.head += more

    def communicate(self, timeout=None):
        out, err = self.proc.communicate(timeout=timeout)
        lines = (self.head + out).decode(errors="replace").splitlines(True)
        debug = ("Client ", "Subscribed (mid: ")
        return "".join(line for line in lines if not line.startswith(debug)), err.decode(errors="replace")


def next_publish(raw):
    """The next PUBLISH ``raw`` (a ``Raw``) reads, other packets passed over, not acknowledged; fails on a close."""
    while True:
        p = raw.read()
        assert p is not None, "closed"
        if isinstance(p, wire.Publish):
            return p


class Raw:
    """Our codec over a plain socket: send any packet or bytes, read the broker's packets (its parser is a client's:
    ``sender="server"``), see the close."""

    def __init__(self, broker, version=wire.MQTT_5, timeout=10.0):
        host = getattr(broker, "host", "127.0.0.1")  # a broker in a network namespace binds its address
        self.sock = socket.create_connection((host, mqtt_port(broker)), timeout=timeout)
        self.version = version
        self.parser = wire.MqttParser(version, sender="server")

    def send(self, packet):
        self.sock.sendall(wire.encode(packet, self.version))

    def send_bytes(self, data):
        self.sock.sendall(data)

    def connect(self, client_id="raw", **kwargs):
        self.send(wire.Connect(self.version, client_id, **kwargs))
        return self.read()

    def read(self):
        """The next packet, or None when the broker closed the connection."""
        while True:
            p = self.parser.next_event()
            if p is CLOSED:
                return None
            if p is not NEED_DATA:
                return p
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            self.parser.receive_data(data)

    def closed(self):
        """True when the broker closed the connection (nothing more arrives)."""
        return self.read() is None

    def close(self):
        self.sock.close()
