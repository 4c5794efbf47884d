"""Failures in an MQTT cluster (docs/mqtt.md "A cluster", "Failures"), judged by the history checker.

Group A is an ``ha: auto`` group in ``sync`` mode (broker id 7: a master and two slaves; a ``sync`` master left with
no slave refuses puts, so with one slave nothing could be acknowledged after the kill), group B one master (broker
id 0), under one ZooKeeper root. Producers put on A's master of the moment (text ``put``: each acknowledgement names
its position); devices subscribed on B receive them through B's link to A. A's master is killed (-9) and a slave
elected: B's link follows the new master from the same positions, and a device of A reconnects to the new master,
its session and its subscription to what is published on B going on.
"""

import threading
import time
from collections import Counter

import pytest

from tests.harness.broker import wait_for
from tests.harness.faults import PauseProcess
from tests.harness.ha import Group
from tests.harness.history import History, check
from tests.harness.mqtt import V311, Paho, mosquitto_pub, with_mqtt
from tests.harness.mqttcluster import cluster_config, wait_routed
from tests.harness.replication import stats
from tests.harness.workload import read_logs

pytestmark = [pytest.mark.slow, pytest.mark.fault]

TOPIC = "fleet"  # what A's producers put (the MQTT topic name of a text put is its metaq topic)
BACK = "cmds"  # what B's producer puts, for the device on A
PAUSE_S = 0.02


class Producer:
    """Puts ``<prefix>-<n>`` to whichever of ``brokers`` accepts (a new id after each failure), recording each
    acknowledgement with its position in ``history``, until stopped."""

    def __init__(self, history, brokers, topic, prefix):
        self.history, self.brokers, self.topic, self.prefix = history, brokers, topic, prefix
        self.acked = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(30)

    def _run(self):
        n, i = 0, 0
        while not self._stop.is_set():
            msg_id = "%s-%d" % (self.prefix, n)
            n += 1
            broker = self.brokers[i % len(self.brokers)]
            try:
                with broker.client() as c:
                    r = c.put(self.topic, msg_id.encode(), 0)
                if getattr(r, "code", None) == 200:
                    _mid, partition, offset = (int(x) for x in r.body.split())
                    self.history.ack(self.prefix, self.topic, partition, offset, msg_id, time.monotonic())
                    self.acked += 1
                    time.sleep(PAUSE_S)
                    continue
                reason = repr(r)
            except OSError as exc:
                reason = repr(exc)
            self.history.fail(self.prefix, msg_id, time.monotonic(), reason)
            i += 1  # another member: the master may have moved
            time.sleep(0.1)


def payloads(sub):
    with sub.got:
        return [m.payload.decode() for m in sub.messages]


def test_a_peers_failover_in_sync_mode_loses_nothing_acknowledged_across_brokers(broker_factory, tmp_path,
                                                                                 zk_connect):
    b = broker_factory(cluster_config(tmp_path / "b", 0, zk_connect), workdir=tmp_path / "b")
    group = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync", start=False)
    for member in group.members:
        with_mqtt(member.config)
        member.start()
    first = group.healthy(40)
    a_master = group.members[first]
    wait_for(lambda: stats(b).get("mqtt_cluster_peers_up") == "1", 30, "B follows A")
    wait_for(lambda: stats(a_master).get("mqtt_cluster_peers_up") == "1", 30, "A follows B")

    q1 = Paho(b, "dev-q1", version=V311, clean=False)
    assert q1.subscribe(TOPIC + "/#", 1) == [1]
    q2 = Paho(b, "dev-q2", version=V311, clean=False)
    assert q2.subscribe(TOPIC + "/#", 2) == [2]
    for sub in (q1, q2):
        assert sub.subscribe("probe/#", 0) == [0]  # after the fleet filter: a probe that arrives means both did
        wait_routed(sub, lambda i: mosquitto_pub(a_master, "probe/x", "p%d" % i, 0))
    dev_a = Paho(a_master, "dev-a", version=V311, clean=False)
    assert dev_a.subscribe(BACK + "/#", 1) == [1]
    assert dev_a.subscribe("probe/#", 0) == [0]
    wait_routed(dev_a, lambda i: mosquitto_pub(b, "probe/y", "p%d" % i, 0))

    history, back = History(), History()
    on_a = Producer(history, [a_master] + [m for m in group.members if m is not a_master], TOPIC, "a").start()
    on_b = Producer(back, [b], BACK, "b").start()
    try:
        wait_for(lambda: on_a.acked >= 100, 30, "100 puts acknowledged on A")
        t = time.monotonic()
        a_master.kill()
        history.fault("kill", t, target="a%d" % first)
        dev_a.close()
        second = group.master(40, exclude=(first,))
        new_master = group.members[second]
        acked = on_a.acked
        wait_for(lambda: on_a.acked >= acked + 100, 40, lambda: "100 puts acknowledged on A's new master: %s"
                 % (history.events()[-1:],))
        history.heal(time.monotonic())
        wait_for(lambda: stats(b).get("mqtt_cluster_peer_7", "").startswith(
            "up 127.0.0.1:%d" % group.replication_port(second)), 30, "B follows A's new master")
        dev_a2 = Paho(new_master, "dev-a", version=V311, clean=False)
        assert dev_a2.session_present, "the device's session lives on A's new master"
        time.sleep(1.0)
    finally:
        on_a.stop()
        on_b.stop()

    acked_a, acked_b = history.acked_ids(), back.acked_ids()
    for sub in (q1, q2):
        wait_for(lambda sub=sub: acked_a <= set(payloads(sub)), 60, lambda sub=sub: "every message acknowledged on "
                 "A at %s: missing %s" % (sub.c._client_id, sorted(acked_a - set(payloads(sub)))[:20]))
        sub.settle()
    wait_for(lambda: acked_b <= set(payloads(dev_a2)) | set(payloads(dev_a)), 60, lambda: (
        "every message acknowledged on B at the device of A: missing %s"
        % sorted(acked_b - set(payloads(dev_a2)) - set(payloads(dev_a)))[:20]))

    logs = read_logs({"a%d" % second: new_master}, topics=[TOPIC])
    t = time.monotonic()
    where = {m: pos for pos, m in logs["a%d" % second].items()}
    for name, sub in (("q1", q1), ("q2", q2)):
        for m in payloads(sub):
            if m in where:
                history.deliver(name, *where[m], m, t)
    verdict = check(history, logs, "sync", master="a%d" % second)
    assert not verdict, verdict.summary()
    assert not verdict.lost, verdict.summary()
    twice = {m: n for m, n in Counter(m for m in payloads(q2) if m.startswith("a-")).items() if n > 1}
    assert not twice, "QoS 2 delivered twice: %s" % sorted(twice)[:20]


def test_a_peers_unconfirmed_tail_is_not_copied_so_its_new_masters_messages_are_not_skipped(
        broker_factory, tmp_path, zk_connect):
    """A's master writes a message its slaves never confirm (both paused), and dies before answering: the slave
    elected writes other messages at those offsets. B must not have copied the unconfirmed one (its positions would
    then say the offset was copied and skip what the new master acknowledged there)."""
    b = broker_factory(cluster_config(tmp_path / "b", 0, zk_connect), workdir=tmp_path / "b")
    group = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync", start=False)
    for member in group.members:
        with_mqtt(member.config)
        member.start()
    first = group.healthy(40)
    a_master = group.members[first]
    wait_for(lambda: stats(b).get("mqtt_cluster_peers_up") == "1", 30, "B follows A")
    q1 = Paho(b, "dev-q1", version=V311, clean=False)
    assert q1.subscribe(TOPIC + "/#", 1) == [1]
    assert q1.subscribe("probe/#", 0) == [0]
    wait_routed(q1, lambda i: mosquitto_pub(a_master, "probe/x", "p%d" % i, 0))
    history = History()
    before = Producer(history, [a_master], TOPIC, "a").start()
    wait_for(lambda: before.acked >= 5, 30, "5 puts acknowledged on A")
    before.stop()
    wait_for(lambda: history.acked_ids() <= set(payloads(q1)), 30, "B's device got them")

    slaves = [PauseProcess(m) for i, m in enumerate(group.members) if i != first]
    for p in slaves:
        p.inject()
    answers = []
    put = threading.Thread(target=lambda: answers.append(_put_once(a_master, "u-0")), daemon=True)
    put.start()
    time.sleep(1.0)  # the master wrote it and waits for its slaves (sync_timeout_ms 3000)
    a_master.kill()
    for p in slaves:
        p.heal()
    put.join(10)
    assert answers and answers[0] != 200, "the unconfirmed put was acknowledged: %r" % answers
    second = group.master(40, exclude=(first,))
    after = Producer(history, [group.members[second]], TOPIC, "n").start()
    wait_for(lambda: after.acked >= 20, 40, "20 puts acknowledged on A's new master")
    after.stop()
    acked = history.acked_ids()
    print("GOT", payloads(q1))
    wait_for(lambda: acked <= set(payloads(q1)), 30, lambda: "B's device got every acknowledged message: "
             "missing %s; it got %s" % (sorted(acked - set(payloads(q1))), payloads(q1)))


def _put_once(broker, msg_id):
    try:
        with broker.client() as c:
            return getattr(c.put(TOPIC, msg_id.encode(), 0), "code", None)
    except OSError as exc:
        return repr(exc)
