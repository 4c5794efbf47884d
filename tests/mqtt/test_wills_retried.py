"""A will whose publish a passing refusal stopped (metaq.mqtt.wills ``Wills.publish_will``, ``passing``:
Unavailable, here a full disk; QuotaExceeded, here ``mqtt.max_retained``) stays pending, not marked done, and is
published once writes come back, once (docs/mqtt.md "What survives what"), whatever its client id does meanwhile:
reconnect, record a newer will, end that one with a normal DISCONNECT. A refusal that lasts drops it. A will that
cannot be recorded refuses its CONNECT (``record_will`` says why). The real port and its keeper over a real store
and put path, a real connection over a socket pair; no network."""


import gevent
import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt import wire
from metaq.mqtt.connect import connect
from metaq.mqtt.wire import Will
from tests.harness.mqttport import inprocess_port, paired_connection, wait_until
from tests.server.test_inprocess import Parts, config


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data"))
    p.gate.on_change = p.path.changed  # as the broker wires it
    yield p
    p.close()


def test_a_will_refused_for_a_passing_reason_is_published_once_writes_come_back(parts, caplog):
    """Each retry pass logs one line for all the wills it tried, none per will."""
    port = inprocess_port(parts)
    keeper = gevent.spawn(port._keep)  # what ``listen`` starts: the role checks, the wills' passes
    try:
        security = port.guard.acting_for(None, "127.0.0.1")
        will = Will("status/meter-1", b"gone", 1, False, {})
        origin, _ = port.wills.record_will("meter-1", will, security, 0)
        assert "meter-1" in port.table.wills
        parts.gate.disk_full("the disk is full (a test)")
        port.wills.publish_will("meter-1", will, security, origin)  # its connection ended: refused, for now
        assert port.wills.published_count == 0 and "meter-1" in port.table.wills
        gevent.sleep(mqtt_limits.MQTT_WILL_RETRY_S * 2 + 0.3)
        assert port.wills.published_count == 0 and "meter-1" in port.table.wills  # tried again, refused again
        lines = [r.getMessage() for r in caplog.records if r.name == "metaq.mqtt.wills"]
        assert len([m for m in lines if "meter-1" in m]) == 1, lines  # its first refusal only
        assert len([m for m in lines if "1 wills tried again: 0 published, 1 still refused" in m]) >= 2, lines
        parts.gate.refresh()  # space again
        wait_until(lambda: "meter-1" not in port.table.wills, mqtt_limits.MQTT_WILL_RETRY_S + 2.0, "the will published")
        gevent.sleep(mqtt_limits.MQTT_WILL_RETRY_S + 0.3)
        assert port.wills.published_count == 1  # once
    finally:
        keeper.kill()


def test_a_will_refused_for_good_is_dropped(parts):
    port = inprocess_port(parts)
    security = port.guard.acting_for(None, "127.0.0.1")
    will = Will("status/meter-2", b"x" * (parts.store.config.segment_size + 1), 1, False, {})  # no segment holds it
    origin, _ = port.wills.record_will("meter-2", Will("status/meter-2", b"gone", 1, False, {}), security, 0)
    port.wills.publish_will("meter-2", will, security, origin)
    assert port.wills.published_count == 0 and "meter-2" not in port.table.wills
    assert not port.wills._pending


def test_a_pending_will_is_published_when_its_client_id_connects_again_meanwhile(parts):
    """Review of issue 66: the client id reconnecting (Clean Start 1) while its will waited dropped it for good."""
    port = inprocess_port(parts)
    keeper = gevent.spawn(port._keep)
    conn, other = paired_connection(port)
    try:
        security = port.guard.acting_for(None, "127.0.0.1")
        will = Will("status/meter-3", b"gone", 1, False, {})
        origin, _ = port.wills.record_will("meter-3", will, security, 0)
        parts.gate.disk_full("the disk is full (a test)")
        port.wills.publish_will("meter-3", will, security, origin)
        assert port.claim(conn, "meter-3", True) is None  # its device is back, Clean Start 1: tried, refused again
        gevent.sleep(mqtt_limits.MQTT_WILL_RETRY_S * 2 + 0.3)  # retry passes while the client id is connected
        assert port.wills.published_count == 0
        parts.gate.refresh()
        wait_until(lambda: port.wills.published_count == 1, mqtt_limits.MQTT_WILL_RETRY_S + 2.0, "the will published")
        assert "meter-3" not in port.table.wills
        gevent.sleep(mqtt_limits.MQTT_WILL_RETRY_S + 0.3)
        assert port.wills.published_count == 1
    finally:
        keeper.kill()
        conn.close()
        other.close()


def test_a_pending_will_outlives_a_newer_will_of_its_client_id_and_that_ones_normal_end(parts):
    """A retained will refused past ``mqtt.max_retained`` (passing: room comes back) waits; its client id records a
    newer will and ends it with a normal DISCONNECT: the older one is still published once there is room, the
    newer one never."""
    port = inprocess_port(parts)
    port.settings.max_retained = 0
    keeper = gevent.spawn(port._keep)
    try:
        security = port.guard.acting_for(None, "127.0.0.1")
        first = Will("status/meter-4", b"gone-1", 1, True, {})
        origin1, _ = port.wills.record_will("meter-4", first, security, 0)
        port.wills.publish_will("meter-4", first, security, origin1)  # refused: no room for a retained message
        assert port.wills.published_count == 0
        origin2, why = port.wills.record_will("meter-4", Will("status/meter-4", b"gone-2", 1, True, {}), security, 0)
        assert why is None and origin2 != origin1  # its next connection's will
        port.wills.will_done("meter-4", origin2)  # that connection's normal DISCONNECT ends its own will only
        assert "meter-4" not in port.table.wills
        gevent.sleep(mqtt_limits.MQTT_WILL_RETRY_S + 0.3)
        assert port.wills.published_count == 0  # still no room
        port.settings.max_retained = 10
        wait_until(lambda: port.wills.published_count == 1, mqtt_limits.MQTT_WILL_RETRY_S + 2.0,
                   "the first will published")
        assert port.table.retained["status/meter-4"].data.endswith(b"gone-1")
        gevent.sleep(mqtt_limits.MQTT_WILL_RETRY_S + 0.3)
        assert port.wills.published_count == 1
    finally:
        keeper.kill()


def test_a_will_published_meanwhile_is_not_published_again_nor_ends_the_next_one(parts):
    """A publish of a will that resumes after a wait (an MQTT cluster's ``wait_followed``) once the will was published
    by another path and its client id recorded a newer will: neither published again nor ending the newer one."""
    port = inprocess_port(parts)
    security = port.guard.acting_for(None, "127.0.0.1")
    will = Will("status/meter-5", b"gone", 1, False, {})
    origin1, _ = port.wills.record_will("meter-5", will, security, 0)
    port.wills.publish_will("meter-5", will, security, origin1)  # the takeover's publish
    assert port.wills.published_count == 1
    origin2, _ = port.wills.record_will("meter-5", Will("status/meter-5", b"gone-2", 1, False, {}), security, 0)
    port.wills.publish_will("meter-5", will, security, origin1)  # the stale one resumes
    assert port.wills.published_count == 1
    assert port.table.wills["meter-5"].origin == origin2  # the newer will stands


def test_a_will_that_cannot_be_recorded_says_why(parts):
    """``record_will`` on a full disk: not written, and why, so that the CONNECT is refused (Server unavailable)."""
    port = inprocess_port(parts)
    security = port.guard.acting_for(None, "127.0.0.1")
    parts.gate.disk_full("the disk is full (a test)")
    origin, why = port.wills.record_will("meter-6", Will("status/meter-6", b"gone", 1, False, {}), security, 0)
    assert origin is None and "disk is full" in why and "meter-6" not in port.table.wills


def test_a_connect_is_refused_when_the_broker_stops_confirming_while_it_waits(parts):
    """The CONNECT's refusals are asked again after its waits (the cluster's id, a takeover): a master that became
    unable to confirm a write meanwhile answers Server unavailable, not CONNACK 0 with a will it did not record."""
    down = []
    port = inprocess_port(parts, master_refusal=lambda: down[0] if down else None,
                          unconfirmable=lambda: down[0] if down else None)
    real_join = port.join_cluster

    def join_while_the_slave_goes(client_id, clean_start, user):
        down.append("SLAVE_NOT_AVAILABLE: no slave is in sync (a test)")  # while the CONNECT waited
        return real_join(client_id, clean_start, user)

    port.join_cluster = join_while_the_slave_goes
    conn, other = paired_connection(port)
    try:
        p = wire.Connect(wire.MQTT_5, "meter-7", will=Will("status/meter-7", b"gone", 1, False, {}))
        assert connect(conn, port, p) is False
        other.settimeout(5.0)
        parser = wire.MqttParser(wire.MQTT_5, sender="server")
        parser.receive_data(other.recv(65536))
        ack = parser.next_event()
        assert ack.reason_code == wire.SERVER_UNAVAILABLE, ack
        assert "meter-7" not in port.table.wills and conn.will is None  # nothing of it to publish
    finally:
        conn.close()
        other.close()


def test_waiting_wills_the_log_no_longer_holds_are_bounded(parts, monkeypatch, caplog):
    """``limits.MQTT_MAX_DETACHED_WILLS`` waiting wills whose client id recorded a newer will are kept; one more
    drops the oldest of them, logged."""
    monkeypatch.setattr(mqtt_limits, "MQTT_MAX_DETACHED_WILLS", 2)
    port = inprocess_port(parts)
    port.settings.max_retained = 0  # every retained will waits for room
    security = port.guard.acting_for(None, "127.0.0.1")
    for n in range(3):
        client_id = "meter-d%d" % n
        will = Will("status/" + client_id, b"gone", 1, True, {})
        origin, _ = port.wills.record_will(client_id, will, security, 0)
        port.wills.publish_will(client_id, will, security, origin)
        port.wills.record_will(client_id, Will("status/" + client_id, b"again", 1, True, {}), security, 0)
    assert sorted(c for c, _, _ in port.wills._pending.values()) == ["meter-d1", "meter-d2"]  # at the limit
    assert any("meter-d0" in r.getMessage() and "MQTT_MAX_DETACHED_WILLS" in r.getMessage() for r in caplog.records)

