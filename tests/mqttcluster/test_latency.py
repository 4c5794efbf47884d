"""How soon a message crosses the cluster (docs/mqtt.md "A cluster"): a message published on one broker reaches a
subscriber on another as soon as it is written there, also when it is the first message of its topic there; a
backlog crossing leaves the other clients of both brokers answered."""

import threading
import time

import pytest

from metaq.mqtt import wire
from metaq.mqttcluster.clientids.ids import home_of
from tests.harness.mqtt import V311, Paho, Raw, mosquitto_pub
from tests.harness.mqttcluster import Cluster, wait_routed
from tests.harness.replication import stats

pytestmark = pytest.mark.slow

#: Messages broker 0 finds waiting on broker 1 when it comes back.
BACKLOG = 100_000
#: The longest a client may wait for an answer while the backlog crosses.
ANSWER_S = 2.0
#: How soon the first message of a new topic crosses (most of them: slack for a busy machine); the follow's periodic
#: look at the topics (``serve.RESCAN_S``) is far longer.
PROMPT_S = 0.5


def test_the_first_message_of_a_new_topic_crosses_at_once(broker_factory, tmp_path, zk_connect):
    """50 messages one after another on broker 1, each the first of its topic there (MQTT QoS 1, every fifth a text
    put), each received on broker 0 before the next is sent: the follow learns of a topic at its first write, it does
    not wait for the follow's periodic look at the topics (``serve.RESCAN_S``) to find it. The bound has slack for a
    busy machine: 45 of the 50 within PROMPT_S."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    sub = Paho(cluster[0], "sub-new-topics")
    assert sub.subscribe("#", 1) == [1]
    pub = Paho(cluster[1], "pub-new-topics")
    wait_routed(sub, lambda i: pub.publish("probe", b"probe-%d" % i, 1))
    took, sent = [], []
    with cluster[1].client() as text:
        for i in range(50):
            started = time.monotonic()
            if i % 5 == 4:
                text.put_ok("text%d" % i, b"t%d" % i)
                sent.append(("text%d" % i, b"t%d" % i))
            else:
                pub.publish("new%d/reading" % i, b"m%d" % i, 1)
                sent.append(("new%d/reading" % i, b"m%d" % i))
            got = sub.wait_messages(i + 1, 10.0)
            took.append(time.monotonic() - started)
            assert len(got) == i + 1, "message %d not received within 10 s: %s" % (i, [m.topic for m in got])
    assert [(m.topic, m.payload) for m in sub.messages] == sent
    late = sorted(t for t in took if t > PROMPT_S)
    assert len(late) <= 5, "%d of 50 took over %.1f s: %s" % (len(late), PROMPT_S, late)


def _burst(broker, topic, count, size=100):
    """``count`` QoS 0 PUBLISHes of ``size`` bytes to ``topic`` on ``broker`` from one connection; returns once the
    broker answered a PINGREQ sent after them (it took them all)."""
    raw = Raw(broker, wire.MQTT_311)
    home = broker.config["broker"]["id"]
    client_id = next(c for c in ("burst-%d" % i for i in range(1000)) if home_of(c, (0, 1)) == home)
    assert raw.connect(client_id).reason_code == 0  # its own home: another broker's being down does not matter
    one = wire.encode(wire.Publish(topic, b"x" * size, 0), wire.MQTT_311)
    for start in range(0, count, 1000):
        raw.send_bytes(one * min(1000, count - start))
    raw.send(wire.PingReq())
    assert isinstance(raw.read(), wire.PingResp)
    raw.close()


def _slowest_answer(broker, until, timeout=120.0):
    """The longest a text request to ``broker`` waited for its answer, asked again and again until ``until()``."""
    slowest, deadline = 0.0, time.monotonic() + timeout
    with broker.client() as c:
        while not until() and time.monotonic() < deadline:
            started = time.monotonic()
            c.offset_at("probe", 0, 0)
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.01)
    return slowest


def test_clients_are_answered_while_a_peer_catches_up_a_backlog(broker_factory, tmp_path, zk_connect):
    """Broker 0 comes back to a backlog of BACKLOG messages its subscriber's route wants on broker 1: broker 1's
    follow sends it in as many RECORDS as it takes and broker 0's link copies them, each sharing its broker's loop
    with the other connections (``share_loop``) as a connection's pipeline does. A text client on either broker is
    answered meanwhile within ANSWER_S (slack for a busy machine: each waits about MAX_TURN_MS), not after the
    whole backlog."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    sub = Paho(cluster[0], "backlog", version=V311, clean=False)  # its filter stays in broker 0's route offline
    assert sub.subscribe("big/#", 0) == [0]
    wait_routed(sub, lambda i: mosquitto_pub(cluster[1], "big/probe", "probe-%d" % i, 0))
    sub.close()
    cluster[0].stop()
    _burst(cluster[1], "big/x", BACKLOG)
    cluster[0].start()

    def caught_up():
        return int(stats(cluster[0]).get("mqtt_cluster_copied", "0")) >= BACKLOG

    slowest = {}
    serving = threading.Thread(target=lambda: slowest.setdefault(1, _slowest_answer(cluster[1], caught_up)))
    serving.start()
    slowest[0] = _slowest_answer(cluster[0], caught_up)
    serving.join()
    assert caught_up(), stats(cluster[0]).get("mqtt_cluster_copied")
    assert max(slowest.values()) < ANSWER_S, slowest
