"""A storm of CONNECTs is worked on ``limits.MQTT_CONNECTS_AT_ONCE`` at a time (metaq.mqtt.connect ``connect``,
the port's ``connects``): the real port over a real store and put path, real connections over socket pairs; no
network."""


import gevent
import gevent.event
import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt import wire
from metaq.mqtt.connect import connect
from tests.harness.mqttport import inprocess_port, paired_connection, wait_until
from tests.server.test_inprocess import Parts, config


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data"))
    yield p
    p.close()


def test_connects_past_those_worked_on_at_once_wait_their_turn_and_are_answered(parts, monkeypatch):
    """``limits.MQTT_CONNECTS_AT_ONCE`` CONNECTs are worked on at once (here 2, each waiting in the cluster's id as
    a CONNECT of an id homed on another broker does); one more waits, read but not worked on, until one of them is
    answered; then it is answered too, CONNACK 0 each, in the order they came."""
    monkeypatch.setattr(mqtt_limits, "MQTT_CONNECTS_AT_ONCE", 2)
    port = inprocess_port(parts)
    real_join, home_answers, joined = port.join_cluster, gevent.event.Event(), []

    def join_waiting_for_the_home(client_id, clean_start, user):
        joined.append(client_id)
        home_answers.wait(10)
        return real_join(client_id, clean_start, user)

    port.join_cluster = join_waiting_for_the_home
    pairs = [paired_connection(port) for _ in range(3)]
    try:
        done = [gevent.spawn(connect, conn, port, wire.Connect(wire.MQTT_5, "meter-%d" % i))
                for i, (conn, _other) in enumerate(pairs)]
        wait_until(lambda: len(joined) >= 2, 5, "two CONNECTs worked on")
        gevent.sleep(0.2)
        assert joined == ["meter-0", "meter-1"]  # the third waits its turn
        home_answers.set()
        gevent.joinall(done, timeout=10)
        assert [g.value for g in done] == [True, True, True] and joined == ["meter-0", "meter-1", "meter-2"]
        for _conn, other in pairs:
            other.settimeout(5.0)
            parser = wire.MqttParser(wire.MQTT_5, sender="server")
            parser.receive_data(other.recv(65536))
            assert parser.next_event().reason_code == 0
    finally:
        for conn, other in pairs:
            conn.close()
            other.close()
