"""An MQTT cluster under network partitions (docs/mqtt.md "A cluster", "Failures"): network namespaces.

Every process has a namespace of its own (tests/harness/netns.py): ZooKeeper (``zk``), the three members of group A
(an ``ha: auto`` group of broker id 7 in ``sync`` mode, ``a0``..``a2``), group B's one master (broker id 0, ``b``),
and the clients (``c``: this test's thread moves there, so every device, producer and ``stats`` crosses the bridge).
The faults cut brokers from each other, or a broker from ZooKeeper, never from their clients; the history checker
judges what the producers on A had acknowledged against what B's device received.
"""

import threading
import time

import pytest

from metaq.mqttcluster.clientids.ids import home_of
from tests.harness import netns
from tests.harness.broker import wait_for
from tests.harness.ha import Group
from tests.harness.history import History, check
from tests.harness.mqtt import V311, Paho, with_mqtt
from tests.harness.mqttcluster import cluster_config
from tests.harness.replication import stats
from tests.harness.workload import read_logs
from tests.harness.zookeeper import ZooKeeperProcess
from tests.mqttcluster.test_cluster_faults import TOPIC, Producer, payloads

pytestmark = [pytest.mark.slow, pytest.mark.fault]

MEMBERS = ("a0", "a1", "a2")
INSECURE = {"security": {"insecure": True}}  # the ports listen on a namespace's address, only the run's reach it


class NetCluster:
    """Group A (three members) and group B (one master) and their ZooKeeper, each in a namespace of one topology."""

    def __init__(self, broker_factory, tmp_path, **replication):
        why = netns.unavailable()
        if why:
            pytest.skip("network namespaces unavailable: " + why)
        self.factory, self.tmp_path, self.replication = broker_factory, tmp_path, replication
        self.topo = netns.Topology(["zk"] + list(MEMBERS) + ["b", "c"])
        self.zk = self.group = self.b = None
        self._inside = None

    def __enter__(self):
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()

    def _open(self):
        self.topo.start()
        self._inside = self.topo.inside("c")
        self._inside.__enter__()
        self.zk = ZooKeeperProcess(self.tmp_path / "zk", host=self.topo.addresses["zk"],
                                   prefix=self.topo.prefix("zk")).start()
        self.group = Group(self.factory, self.tmp_path, self.zk.connect, n=3, mode="sync", start=False,
                           sections=INSECURE, **self.replication)
        for node, member in zip(MEMBERS, self.group.members, strict=True):
            with_mqtt(member.config)
            self._place(member, node)
        self.b = self.factory(cluster_config(self.tmp_path / "b", 0, self.zk.connect, **INSECURE),
                              workdir=self.tmp_path / "b", start=False)
        self._place(self.b, "b")
        for member in self.group.members + [self.b]:
            member.start()
        return self

    def _place(self, broker, node):
        address = self.topo.addresses[node]
        broker.config["broker"]["host"] = broker.host = address
        broker.config["replication"]["advertised_address"] = "%s:%d" % (address, broker.config["replication"]["port"])
        broker.prefix = self.topo.prefix(node)

    def master(self, timeout=40.0, exclude=()):
        """A's elected master (its index), once B follows it."""
        i = self.group.healthy(timeout) if not exclude else self.group.master(timeout, exclude=exclude)
        want = "up %s" % self.group.members[i].config["replication"]["advertised_address"]
        wait_for(lambda: stats(self.b).get("mqtt_cluster_peer_7", "").startswith(want), timeout,
                 lambda: "B follows A's master a%d: %s" % (i, stats(self.b).get("mqtt_cluster_peer_7")))
        return i

    def close(self):
        try:
            for member in (self.group.members if self.group else []) + ([self.b] if self.b else []):
                member.kill()
            if self.zk is not None:
                self.zk.kill()
        finally:
            if self._inside is not None:
                self._inside.__exit__(None, None, None)
                self._inside = None
            self.topo.close()


def homed_on(broker_id, prefix):
    """A client id whose home (docs/mqtt.md "A client id across the cluster") is ``broker_id`` of this cluster (0
    and 7): a CONNECT of an id whose home is on the other side of a cut is refused until ZooKeeper drops that side."""
    return next("%s-%d" % (prefix, i) for i in range(1000) if home_of("%s-%d" % (prefix, i), (0, 7)) == broker_id)


def routed(sub, broker, topic, timeout=30.0):
    """Publish QoS 0 probes on ``broker`` to ``topic`` until ``sub`` got one (its route reached ``broker``); the
    probes are then dropped from its list."""
    probe = Paho(broker, "probe-%s" % sub.c._client_id.decode())
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            probe.publish(topic, b"probe", 0)
            if sub.wait_messages(1, 0.3):
                time.sleep(0.5)
                with sub.got:
                    del sub.messages[:]
                return
        raise AssertionError("no probe of %s reached %s within %.0f s" % (topic, sub.c._client_id, timeout))
    finally:
        probe.close()


def judged(history, cluster, master, subs):
    """The history checker's verdict on A's log (its master ``master``) and the deliveries of ``subs``."""
    name = "a%d" % master
    logs = read_logs({name: cluster.group.members[master]}, topics=[TOPIC])
    where = {m: pos for pos, m in logs[name].items()}
    t = time.monotonic()
    for sub in subs:
        for m in payloads(sub):
            if m in where:
                history.deliver(sub.c._client_id.decode(), *where[m], m, t)
    return check(history, logs, "sync", master=name)


def test_a_broker_cut_off_from_its_peers_resumes_where_it_stopped_and_its_new_routes_converge(broker_factory,
                                                                                              tmp_path):
    with NetCluster(broker_factory, tmp_path) as cluster:
        first = cluster.master()
        a = cluster.group.members[first]
        q1 = Paho(cluster.b, "dev-q1", version=V311, clean=False)
        assert q1.subscribe(TOPIC + "/#", 1) == [1]
        assert q1.subscribe("probe/#", 0) == [0]  # after the fleet filter: a probe that arrives means both did
        routed(q1, a, "probe/q1")
        history = History()
        producer = Producer(history, [a], TOPIC, "a").start()
        try:
            wait_for(lambda: producer.acked >= 30, 30, "30 puts acknowledged on A")
            cut = netns.Cut(cluster.topo, ["b"], list(MEMBERS))
            history.fault("cut", cut.inject(), target="b")
            late = Paho(cluster.b, homed_on(0, "dev-late"), version=V311, clean=False)
            assert late.subscribe("late/#", 1) == [1]  # made while A is unreachable
            acked = producer.acked
            wait_for(lambda: producer.acked >= acked + 50, 30, "A acknowledges while cut off from B")
            during = len(payloads(q1))
            time.sleep(2.0)
            history.heal(cut.heal())
            wait_for(lambda: producer.acked >= acked + 100, 30, "A acknowledges after the cut")
        finally:
            producer.stop()
        acked_ids = history.acked_ids()
        wait_for(lambda: acked_ids <= set(payloads(q1)), 60, lambda: "B's device got every acknowledged message: "
                 "missing %s" % sorted(acked_ids - set(payloads(q1)))[:20])
        assert during < len(acked_ids)
        q1.settle()
        verdict = judged(history, cluster, first, [q1])
        assert not verdict and not verdict.lost, verdict.summary()
        # the route B gained during the cut reached A once the link was back
        pub = Paho(a, "pub-late")
        routed(late, a, "late/probe")
        for i in range(10):
            pub.publish("late/x", b"%d" % i, 1)
        got = late.wait_messages(10, 20)
        assert [m.payload for m in got] == [b"%d" % i for i in range(10)]


def test_a_broker_cut_off_from_zookeeper_keeps_its_links_and_its_sessions(broker_factory, tmp_path):
    """B cut from ZooKeeper past its session: its links keep their last membership (A's messages still reach
    its devices), it still keeps persistent sessions (a master without ``ha: auto`` has no lease to lose), and
    A, which sees B's nodes expire and stops following it, resumes from its positions when B registers again:
    nothing B acknowledged in the meantime is missed by A's devices."""
    with NetCluster(broker_factory, tmp_path) as cluster:
        first = cluster.master()
        a = cluster.group.members[first]
        q1 = Paho(cluster.b, "dev-q1", version=V311, clean=False)
        assert q1.subscribe(TOPIC + "/#", 1) == [1]
        assert q1.subscribe("probe/#", 0) == [0]  # after the fleet filter: a probe that arrives means both did
        routed(q1, a, "probe/q1")
        dev_a = Paho(a, "dev-a", version=V311, clean=False)
        assert dev_a.subscribe("cmds/#", 1) == [1]
        routed(dev_a, cluster.b, "cmds/probe")
        history, back = History(), History()
        on_a = Producer(history, [a], TOPIC, "a").start()
        on_b = Producer(back, [cluster.b], "cmds", "b").start()
        try:
            wait_for(lambda: on_a.acked >= 20, 30, "20 puts acknowledged on A")
            cut = netns.Cut(cluster.topo, ["b"], ["zk"])
            history.fault("cut-zk", cut.inject(), target="b")
            # past B's ZooKeeper session (4 s): A no longer lists B as a peer
            wait_for(lambda: stats(a).get("mqtt_cluster_peers") == "0", 30, "A drops B, whose nodes expired")
            assert stats(cluster.b).get("mqtt_cluster_peer_7", "").startswith("up "), "B keeps following A"
            seen = len(payloads(q1))
            acked = on_a.acked
            wait_for(lambda: on_a.acked >= acked + 20 and len(payloads(q1)) >= seen + 20, 30,
                     "B's device receives A's messages while B is cut from ZooKeeper")
            again = Paho(cluster.b, "dev-q2", version=V311, clean=False)
            assert again.connack == 0, "B keeps sessions while cut from ZooKeeper"
            history.heal(cut.heal())
            wait_for(lambda: stats(a).get("mqtt_cluster_peers_up") == "1", 40, "A follows B again")
            time.sleep(1.0)
        finally:
            on_a.stop()
            on_b.stop()
        for sub, h in ((q1, history), (dev_a, back)):
            ids = h.acked_ids()
            wait_for(lambda sub=sub, ids=ids: ids <= set(payloads(sub)), 60, lambda sub=sub, ids=ids: (
                "%s got every acknowledged message: missing %s" % (sub.c._client_id,
                                                                   sorted(ids - set(payloads(sub)))[:20])))
        verdict = judged(history, cluster, first, [q1])
        assert not verdict and not verdict.lost, verdict.summary()


def test_a_peers_unconfirmed_tail_is_not_copied_so_its_new_masters_messages_are_not_skipped(broker_factory,
                                                                                           tmp_path):
    """A's master writes a message its slaves never get (cut from them, not from B) and dies before confirming it:
    the member elected writes other messages at those offsets. B must not have copied the unconfirmed one: its
    resume positions would then say those offsets were copied and skip what the new master acknowledged there."""
    with NetCluster(broker_factory, tmp_path, sync_timeout_ms=10000, insync_lag_ms=10000) as cluster:
        first = cluster.master()
        a = cluster.group.members[first]
        q1 = Paho(cluster.b, "dev-q1", version=V311, clean=False)
        assert q1.subscribe(TOPIC + "/#", 1) == [1]
        assert q1.subscribe("probe/#", 0) == [0]  # after the fleet filter: a probe that arrives means both did
        routed(q1, a, "probe/q1")
        history = History()
        before = Producer(history, [a], TOPIC, "a").start()
        wait_for(lambda: before.acked >= 5, 30, "5 puts acknowledged on A")
        before.stop()
        wait_for(lambda: history.acked_ids() <= set(payloads(q1)), 30, "B's device got them")
        slaves = [m for i, m in enumerate(MEMBERS) if i != first]
        cut = netns.Cut(cluster.topo, [MEMBERS[first]], slaves)
        history.fault("cut", cut.inject(), target=MEMBERS[first])
        answers = []

        def put_once():
            try:
                with a.client() as c:
                    answers.append(getattr(c.put(TOPIC, b"u-0", 0), "code", None))
            except OSError as exc:
                answers.append(repr(exc))
        put = threading.Thread(target=put_once, daemon=True)
        put.start()
        time.sleep(1.5)  # the master wrote it and waits for its slaves' confirmation
        copied = "u-0" in payloads(q1)
        a.kill()
        history.fault("kill", time.monotonic(), target=MEMBERS[first])
        put.join(15)
        assert answers and answers[0] != 200, "the unconfirmed put was acknowledged: %r" % answers
        second = cluster.master(exclude=(first,))
        after = Producer(history, [cluster.group.members[second]], TOPIC, "n").start()
        try:
            wait_for(lambda: after.acked >= 20, 40, "20 puts acknowledged on A's new master")
        finally:
            after.stop()
        # healed only now: the dead master's kernel would still deliver what its socket held to a slave
        history.heal(cut.heal())
        acked = history.acked_ids()
        wait_for(lambda: acked <= set(payloads(q1)), 30, lambda: "B's device got every acknowledged message (it %s "
                 "the unconfirmed one): missing %s" % ("got" if copied else "did not get",
                                                        sorted(acked - set(payloads(q1)))))
        assert not copied, "B delivered a message A's master had not confirmed (sync mode)"
