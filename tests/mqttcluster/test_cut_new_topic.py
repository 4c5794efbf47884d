"""A topic first created on a broker while another broker's follow of it was away (docs/mqtt.md "Failures in a
cluster"): broker 0 holds a QoS 1 subscriber of ``sensors/#``; broker 1's replication address, as ZooKeeper names
it, is a proxy (``LinkProxy``), so broker 0's link to broker 1 can be cut and healed (or broker 0 stopped and started
again) while both keep serving their clients. A device publishes QoS 1 to ``sensors/...`` on broker 1 meanwhile,
the first message of metaq topic ``sensors`` there: once the follow is back, the subscriber gets it, once."""

import time

import pytest

from metaq.mqttcluster.clientids.ids import home_of
from tests.harness.broker import wait_for
from tests.harness.faults import LinkProxy
from tests.harness.mqtt import V311, Paho
from tests.harness.mqttcluster import cluster_config, wait_routed
from tests.harness.replication import stats

pytestmark = [pytest.mark.slow, pytest.mark.fault]


def homed_on(broker_id, prefix):
    """A client id whose home among brokers 0 and 1 is ``broker_id`` (its CONNECT needs no call across the cut)."""
    return next("%s-%d" % (prefix, i) for i in range(1000) if home_of("%s-%d" % (prefix, i), (0, 1)) == broker_id)


class CutPair:
    """Brokers 0 and 1; broker 0 follows broker 1 through ``proxy``; ``sub``: a persistent QoS 1 session on broker 0
    subscribed to ``sensors/#`` (and ``probe/#``, whose probes prove its route reached broker 1 without making
    metaq topic ``sensors`` there)."""

    def __init__(self, broker_factory, tmp_path, zk_connect):
        cfg1 = cluster_config(tmp_path / "b1", 1, zk_connect)
        self.proxy = LinkProxy(("127.0.0.1", cfg1["replication"]["port"])).start()
        cfg1["replication"]["advertised_address"] = self.proxy.address
        self.b0 = broker_factory(cluster_config(tmp_path / "b0", 0, zk_connect), workdir=tmp_path / "b0")
        self.b1 = broker_factory(cfg1, workdir=tmp_path / "b1")
        self.wait_up()
        self.sub_id = homed_on(0, "sub")
        self.sub = Paho(self.b0, client_id=self.sub_id, version=V311, clean=False)
        assert self.sub.subscribe("sensors/#", qos=1) == [1]
        assert self.sub.subscribe("probe/#", qos=1) == [1]
        wait_routed(self.sub, lambda i: Paho(self.b1, "probe-%d" % i).publish("probe/x", b"p", 1))

    def wait_up(self):
        wait_for(lambda: stats(self.b0).get("mqtt_cluster_peer_1", "").startswith("up"), 30,
                 lambda: "broker 0 follows broker 1: %s" % stats(self.b0).get("mqtt_cluster_peer_1"))

    def wait_down(self):
        wait_for(lambda: stats(self.b0).get("mqtt_cluster_peer_1", "").startswith("down"), 30,
                 lambda: "broker 0's link to broker 1 down: %s" % stats(self.b0).get("mqtt_cluster_peer_1"))

    def publish_new_topic(self):
        """A device on broker 1 publishes QoS 1 to a topic new there; returns the payload, acknowledged."""
        device = Paho(self.b1, client_id=homed_on(1, "device"), version=V311)
        info = device.publish("sensors/room1/temp", b"first", 1)
        assert info.is_published(), "the device's PUBLISH was not acknowledged"
        device.close()
        return "first"

    def received(self, payload, timeout=20.0):
        """How many times ``sub`` got ``payload`` within ``timeout`` (and a moment more for a second copy)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.sub.got:
                got = [m for m in self.sub.messages if m.payload.decode() == payload]
            if got:
                time.sleep(2.0)
                break
            time.sleep(0.1)
        with self.sub.got:
            return sum(1 for m in self.sub.messages if m.payload.decode() == payload)

    def close(self):
        self.proxy.close()


def test_a_topic_made_on_a_peer_while_the_link_was_cut_reaches_the_subscribers_once_it_heals(broker_factory, tmp_path,
                                                                                           zk_connect):
    pair = CutPair(broker_factory, tmp_path, zk_connect)
    try:
        pair.proxy.cut()
        pair.wait_down()
        payload = pair.publish_new_topic()
        time.sleep(1.0)
        pair.proxy.heal()
        pair.wait_up()
        assert pair.received(payload) == 1, (stats(pair.b0), pair.b1.log_text()[-3000:])
    finally:
        pair.close()


def test_a_topic_made_on_a_peer_while_the_subscribers_broker_was_down_reaches_its_persistent_session(
        broker_factory, tmp_path, zk_connect):
    pair = CutPair(broker_factory, tmp_path, zk_connect)
    try:
        pair.sub.close()
        pair.b0.stop()
        wait_for(lambda: not stats(pair.b1).get("mqtt_cluster_peer_0", "").startswith("up"), 30,
                 "broker 1 sees broker 0 gone")
        time.sleep(1.0)  # its follow of broker 1 ended too (the same stop closed it)
        payload = pair.publish_new_topic()
        pair.b0.start()
        pair.wait_up()
        pair.sub = Paho(pair.b0, client_id=pair.sub_id, version=V311, clean=False)
        assert pair.sub.session_present
        assert pair.received(payload) == 1, (stats(pair.b0), pair.b1.log_text()[-3000:])
    finally:
        pair.close()
