"""How soon a message crosses the cluster (docs/mqtt.md "A cluster"): a message published on one broker reaches a
subscriber on another as soon as it is written there, also when it is the first message of its topic there."""

import time

import pytest

from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import Cluster, wait_routed

pytestmark = pytest.mark.slow

#: The old look again at a peer's topics for new ones (``serve.RESCAN_S``); each message here must beat half of it.
OLD_POLL_S = 1.0


def test_the_first_message_of_a_new_topic_crosses_at_once(broker_factory, tmp_path, zk_connect):
    """50 messages one after another on broker 1, each the first of its topic there (MQTT QoS 1, every fifth a text
    put), each received on broker 0 before the next is sent: the follow learns of a topic at its first write, it does
    not wait for a look at the topics to find it. The bound has slack for a busy machine: 45 of the 50 within half of
    the old look's interval."""
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
    late = sorted(t for t in took if t > OLD_POLL_S / 2)
    assert len(late) <= 5, "%d of 50 took over %.1f s: %s" % (len(late), OLD_POLL_S / 2, late)

