"""A will whose publish a passing refusal stopped (metaq.mqtt.port ``MqttPort.publish_will``: Unavailable, here a
full disk) stays in the sessions' log, not marked done, and is published once writes come back, once
(docs/mqtt.md "What survives what"); a refusal that lasts (no permission, a bad name) drops it, as before. The real
port and its keeper over a real store and put path, no network."""

import time

import gevent
import pytest

from metaq import limits
from metaq.mqtt.port import MqttPort
from metaq.mqtt.wire import Will
from metaq.server.guard import Guard
from tests.server.test_inprocess import Parts, config


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data"))
    p.gate.on_change = p.path.changed  # as the broker wires it
    yield p
    p.close()


def _port(p):
    return MqttPort(p.core, p.config.mqtt, p.store, p.path, Guard(p.config.security), p.waiters,
                    p.config.store.max_transfer_size)


def _wait(check, timeout, what):
    """Until ``check()``, yielding to the port's greenlets; AssertionError naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within %.1f s: %s" % (timeout, what)
        gevent.sleep(0.05)


def test_a_will_refused_for_a_passing_reason_is_published_once_writes_come_back(parts):
    port = _port(parts)
    keeper = gevent.spawn(port._keep)  # what ``listen`` starts: the role checks, the wills' passes
    try:
        security = port.guard.acting_for(None, "127.0.0.1")
        will = Will("status/meter-1", b"gone", 1, False, {})
        port.record_will("meter-1", will, security, 0)
        assert "meter-1" in port.table.wills
        parts.gate.disk_full("the disk is full (a test)")
        port.publish_will("meter-1", will, security)  # its connection ended: refused, for now
        assert port.wills_published == 0 and "meter-1" in port.table.wills
        gevent.sleep(limits.MQTT_WILL_RETRY_S + 0.3)
        assert port.wills_published == 0 and "meter-1" in port.table.wills  # tried again, refused again
        parts.gate.refresh()  # space again
        _wait(lambda: "meter-1" not in port.table.wills, limits.MQTT_WILL_RETRY_S + 2.0, "the will published")
        gevent.sleep(limits.MQTT_WILL_RETRY_S + 0.3)
        assert port.wills_published == 1  # once
    finally:
        keeper.kill()


def test_a_will_refused_for_good_is_dropped(parts):
    port = _port(parts)
    security = port.guard.acting_for(None, "127.0.0.1")
    will = Will("status/meter-2", b"x" * (parts.store.config.segment_size + 1), 1, False, {})  # no segment holds it
    port.record_will("meter-2", Will("status/meter-2", b"gone", 1, False, {}), security, 0)
    port.publish_will("meter-2", will, security)
    assert port.wills_published == 0 and "meter-2" not in port.table.wills
