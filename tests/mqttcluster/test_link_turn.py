"""A peer link's turn starts again when it waited for a frame (docs/limits.md): a link whose frames come one at a
time, apart, pauses for the other connections only after a backlog's frames held the loop ``MAX_TURN_MS``, not after
every frame (``loop_turn_pauses``)."""

import time

from metaq import limits
from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import Cluster, wait_routed

N = 200


def _pauses(cluster, b):
    return int(cluster.stats(b)["loop_turn_pauses"])


def test_a_link_that_waits_for_each_frame_does_not_pause_after_each(broker_factory, tmp_path, zk_connect):
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    sub = Paho(cluster[1], "turn-sub")
    assert sub.subscribe("turn/#", 1) == [1]
    pub = Paho(cluster[0], "turn-pub")
    probes = wait_routed(sub, lambda i: pub.publish("turn/probe", b"probe", 1))
    time.sleep(2 * limits.MAX_TURN_MS / 1000.0)  # the link's turn began longer ago than MAX_TURN_MS
    before = _pauses(cluster, cluster[1])
    for i in range(N):  # one at a time (QoS 1 waits for its PUBACK, QoS 0 for its copy): a frame each, mostly
        pub.publish("turn/t", b"m%d" % i, i % 2)
        if not i % 2:
            assert len(sub.wait_messages(i + 1, 10)) == i + 1, i
    assert len(sub.wait_messages(N, 10)) == N, probes
    assert sorted(m.payload for m in sub.messages) == sorted(b"m%d" % i for i in range(N))
    paused = _pauses(cluster, cluster[1]) - before
    assert paused < N // 10, paused  # before: a pause after (nearly) every frame
