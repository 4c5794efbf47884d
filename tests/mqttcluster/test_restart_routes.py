"""What a broker of an MQTT cluster publishes in the first moments after its restart reaches the subscribers connected
to the other brokers (docs/mqtt.md "A cluster", "Right after a restart"): the will of a connection that ended when
the broker was killed, published as it starts again, and a device's QoS 1 PUBLISH acknowledged by it as soon as its
port accepts. Their topics are new on the restarted broker (the other brokers hold no position in them), the case
where a message published before the other brokers' follows of it are back would be sent to none of them."""

import signal
import threading
import time

import pytest

from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import Paho, Raw
from tests.harness.replication import stats
from tests.mqttcluster.test_client_ids import _cluster, _homed

#: How long a watcher that got its message is watched for a second copy of it.
QUIET_S = 2.0


def _watchers(b1, others, topic_filter):
    """A QoS 1 subscriber of ``topic_filter`` on each broker of ``others``, returned once a message published on
    ``b1`` reaches each of them (their follows of ``b1`` carry their filters; the message's topic, ``ping``, is
    not the one tested)."""
    watchers = [Paho(b, "watch-%d" % i) for i, b in enumerate(others)]
    for w in watchers:
        assert w.subscribe(topic_filter, qos=1) == [1]
        assert w.subscribe("ping/#", qos=1) == [1]
    pinger = Paho(b1, "pinger")
    deadline = time.monotonic() + 30
    while not all(w.messages for w in watchers):  # a ping a second until every follow of b1 carries the filters
        assert time.monotonic() < deadline, "the cluster's links before the test"
        pinger.publish("ping/1", b"ping", 1)
        for w in watchers:
            w.wait_messages(1, timeout=1.0)
    pinger.close()
    return watchers


def _tested(w):
    """What watcher ``w`` got but the warm-up pings."""
    return [(m.topic, m.payload) for m in list(w.messages) if not m.topic.startswith("ping/")]


def _got_once(watchers, topic, payload):
    """Each watcher got ``topic``'s ``payload`` once (the warm-up pings aside)."""
    for i, w in enumerate(watchers):
        wait_for(lambda w=w: _tested(w), 30, "watcher %d (broker %d) did not get %s" % (i, i + 2, topic))
    time.sleep(QUIET_S)
    for i, w in enumerate(watchers):
        assert _tested(w) == [(topic, payload)], "watcher %d (broker %d) got %s twice" % (i, i + 2, topic)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("version", [wire.MQTT_311, wire.MQTT_5], ids=["mqtt311", "mqtt5-delay0"])
def test_a_will_published_at_a_restart_reaches_the_other_brokers_subscribers(broker_factory, tmp_path, zk_connect,
                                                                             version):
    """A device with a will of no delay on broker 1; broker 1 is killed (the will is left in its log) and started
    again: it publishes the will once, and each subscriber of its topic on brokers 2 and 3, subscribed before the
    kill, gets it once."""
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000})
    watchers = _watchers(b1, (b2, b3), "will/#")
    device = Raw(b1, version)
    props = {"will_delay_interval": 0} if version == wire.MQTT_5 else {}
    ack = device.connect("meter-will", will=wire.Will("will/meter-will", b"gone", 1, False, props))
    assert ack.reason_code == 0, ack
    b1.kill()
    device.close()
    b1.start()
    wait_for(lambda: stats(b1)["mqtt_wills_published"] == "1", 30, "broker 1 published the will")
    _got_once(watchers, "will/meter-will", b"gone")
    assert stats(b1)["mqtt_wills_published"] == "1"


def _accepting(b, deadline):
    """A Raw client connected to ``b``'s MQTT port as soon as the port accepts (before the broker says it is
    ready)."""
    while True:
        try:
            return Raw(b, wire.MQTT_5)
        except OSError:
            assert time.monotonic() < deadline, "the MQTT port never accepted"
            time.sleep(0.005)


@pytest.mark.slow
@pytest.mark.fault
def test_a_publish_acknowledged_right_after_a_restart_reaches_the_other_brokers_subscribers(
        broker_factory, tmp_path, zk_connect):
    """Broker 1 is killed and started again; a device connects to it as soon as its MQTT port accepts and publishes
    QoS 1 at once: once its PUBACK came, each subscriber of the topic on brokers 2 and 3 gets the message once."""
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000})
    watchers = _watchers(b1, (b2, b3), "fresh/#")
    b1.kill()
    starting = threading.Thread(target=b1.start, daemon=True)  # returns once the broker says it is ready
    starting.start()
    device = _accepting(b1, time.monotonic() + 30)
    ack = device.connect("early-publisher")
    assert ack is not None and ack.reason_code == 0, ack
    _published_once(device, watchers, b"early")
    starting.join(30)
    device.close()


def _published_once(device, watchers, payload):
    """``device`` publishes ``payload`` on fresh/1 at QoS 1: acknowledged (0), each watcher gets it once."""
    device.send(wire.Publish("fresh/1", payload, 1, packet_id=1))
    puback = device.read()
    assert isinstance(puback, wire.PubAck) and puback.reason_code == 0, puback
    _got_once(watchers, "fresh/1", payload)


#: ``mqtt.cluster_start_hold_s`` of the test of a member that does not follow.
HOLD_S = 3.0


@pytest.mark.slow
@pytest.mark.fault
def test_a_restarted_broker_holds_its_connacks_for_a_member_that_does_not_follow_it_at_most_its_bound(
        broker_factory, tmp_path, zk_connect):
    """Broker 3 is paused (SIGSTOP: still a member in ZooKeeper, following nobody) while broker 1 starts again: a
    device that connects to broker 1 as soon as its port accepts gets its CONNACK once ``mqtt.cluster_start_hold_s``
    passed since broker 1's start, not before (broker 3 might still follow) and not much later; what it publishes
    then reaches the subscribers on broker 2, which follows broker 1 again within the bound; the log names broker 3."""
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000},
                          zk_of={3: {"session_timeout_ms": 30000}}, cluster_start_hold_s=HOLD_S)
    watchers = _watchers(b1, (b2,), "fresh/#")
    client_id = _homed(1, 1, [1, 2, 3], "early")[0]  # its home is broker 1: the paused broker is not asked
    b3.proc.send_signal(signal.SIGSTOP)
    try:
        b1.kill()
        starting = threading.Thread(target=b1.start, daemon=True)
        starting.start()
        device = _accepting(b1, time.monotonic() + 30)
        accepted = time.monotonic()  # at or after the listener opened: before broker 1's hold began
        ack = device.connect(client_id)
        waited = time.monotonic() - accepted
        assert ack is not None and ack.reason_code == 0, ack
        assert HOLD_S - 0.1 <= waited < HOLD_S + 15, waited
        wait_for(lambda: "peer brokers [3] do not follow this broker" in b1.log_text(since_start=True), 10,
                 "the log naming broker 3")  # (written as the hold ends: maybe a moment after the CONNACK went)
        _published_once(device, watchers, b"held")
        starting.join(30)
        device.close()
    finally:
        b3.proc.send_signal(signal.SIGCONT)
