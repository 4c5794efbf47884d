"""The MQTT port in process for the tests: the real ``MqttPort`` over a real store and put path (``Parts`` of
tests/server/test_inprocess.py), its connections over socket pairs; no network."""

import socket
import time

import gevent

from metaq.mqtt.connection import Connection
from metaq.mqtt.port import MqttPort
from metaq.server.guard import Guard


def inprocess_port(parts, **options):
    """A port over ``parts``' core, store, put path and waiters, with their config's MQTT settings (``options``: the
    port's keyword arguments, e.g. ``master_refusal``)."""
    return MqttPort(parts.core, parts.config.mqtt, parts.store, parts.path, Guard(parts.config.security),
                    parts.waiters, parts.config.store.max_transfer_size, **options)


def paired_connection(port):
    """``(a Connection of port, the client's end of its socket pair)``, logged in as an accepted one is."""
    ours, theirs = socket.socketpair()
    conn = Connection(ours, ("127.0.0.1", 1), 1, port)
    conn.session = port.guard.acting_for(None, "127.0.0.1")  # what the core gives an accepted connection
    return conn, theirs


def wait_until(check, timeout, what):
    """Until ``check()``, yielding to the port's greenlets; AssertionError naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within %.1f s: %s" % (timeout, what)
        gevent.sleep(0.05)
