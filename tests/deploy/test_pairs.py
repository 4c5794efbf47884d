"""fab over real SSH with a master/slave pair: m0 on 127.0.0.1, its slave s0 on 127.0.0.2 (broker id 0).

Deployed and started through fab, written through the master, restarted one at a time while a
producer sends, stopped; and the refusals of a rolling restart that could not keep the pair
serving. Both "hosts" are this machine; the brokers register in a real ZooKeeper.
"""

import os
import re
import signal
import threading

import pytest

from metaq.client import Message, Producer
from metaq.client.raw import TextClient
from metaq.deploy import agent
from metaq.deploy.layout import Layout
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from tests.deploy.test_cluster import listening, status_table
from tests.harness.broker import consume_all, wait_for
from tests.harness.fab import pair_inventory, run_fab, write_inventory

pytestmark = [pytest.mark.slow, pytest.mark.fault]
pytest.importorskip("fabric")

TOPIC = "pair-test"


class Pair:
    def __init__(self, root, sshd, zk_connect, ha="manual"):
        self.inventory = pair_inventory(root, sshd, zk_connect, ha=ha)
        self.zk_connect = zk_connect
        self.path = write_inventory(root / "cluster.yaml", self.inventory)
        self.brokers = {b["name"]: b for b in self.inventory["brokers"]}

    def fab(self, *args):
        return run_fab(self.path, *args)

    def address(self, name):
        return self.brokers[name]["host"], self.brokers[name]["port"]

    def url(self, name):
        return "meta://%s:%d" % self.address(name)

    def stats(self, name):
        with TextClient(*self.address(name)) as c:
            return c.stats_dict()

    def pid(self, name):
        try:
            with open(os.path.join(self.brokers[name]["install_dir"], "run", "metaq.pid")) as f:
                return int(f.read())
        except FileNotFoundError:
            return None

    def held(self, name):
        """{(partition, offset): payload} of everything broker ``name`` stores for TOPIC."""
        out = {}
        with TextClient(*self.address(name)) as c:
            for row in stats_codec.parse_offsets(c.stats("offsets").encode()):
                if row.topic == TOPIC:
                    for offset, rec in enumerate(consume_all(c, TOPIC, row.partition)):
                        out[row.partition, offset] = rec.payload
        return out

    def caught_up(self, slave, master):
        """The slave says it is caught up and holds as many messages as the master."""
        s, m = self.stats(slave), self.stats(master)
        return s.get("replication_caught_up") == "true" and s["total_messages"] == m["total_messages"]

    def kill_leftovers(self):
        for name, b in self.brokers.items():
            pid = self.pid(name)
            if pid and agent.is_ours(pid, Layout(b["install_dir"])):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def pair(sshd, zk_server, tmp_path_factory):
    p = Pair(tmp_path_factory.mktemp("pair"), sshd, zk_server.chroot())
    yield p
    p.fab("stop")
    p.kill_leftovers()


class Sender:
    """A producer thread sending numbered messages (retrying each for up to ``retry_deadline`` s)."""

    def __init__(self, **producer):
        self.results, self.stop = [], threading.Event()
        self.producer = Producer(**producer)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        i = 0
        while not self.stop.is_set():
            body = b"m-%06d" % i
            self.results.append((body, self.producer.send(Message(TOPIC, body))))
            i += 1

    def wait_for_more(self, n, what):
        count = len(self.results)
        wait_for(lambda: len(self.results) >= count + n, timeout=60, what=what)

    def close(self):
        self.stop.set()
        self.thread.join(60)
        self.producer.close()
        return self.results


def order(r, *lines):
    """The stdout positions of each line prefix, asserted to come in the order given."""
    positions = [r.out.index(r.line(prefix)) for prefix in lines]
    assert positions == sorted(positions), r
    return positions


def test_a_manual_pair_deploys_replicates_and_restarts_slave_first(pair):
    r = pair.fab("deploy", "start", "status")
    assert r.code == 0, r
    order(r, "[m0] started", "[s0] started")  # the master first: the slave finds it listening
    rows = status_table(r)
    assert (rows["m0"]["ROLE"], rows["s0"]["ROLE"]) == ("master", "slave"), r
    wait_for(lambda: pair.stats("m0").get("replication_slaves") == "1", what="s0 linked to m0")

    with Producer(brokers=[pair.url("m0")]) as producer:
        acked = [producer.send(Message(TOPIC, b"first-%03d" % i)) for i in range(200)]
    assert all(res.success for res in acked)
    wait_for(lambda: pair.caught_up("s0", "m0"), what=lambda: "s0 caught up: %s" % pair.stats("s0"))
    assert pair.held("s0") == pair.held("m0") and len(pair.held("m0")) == 200

    r = pair.fab("status")
    rows = status_table(r)
    assert rows["m0"]["LINK"] == "1 slave" and rows["m0"]["REPL_LAG"] == "-", r
    assert rows["s0"]["LINK"] == "connected" and rows["s0"]["REPL_LAG"] == "caught up", r

    # A rolling restart while a producer sends through the master: s0 first (caught up before m0 stops), then m0.
    before = {name: pair.pid(name) for name in pair.brokers}
    sender = Sender(brokers=[pair.url("m0")], retry_deadline=30.0)
    sender.wait_for_more(100, "100 sends before the restart")
    sent_before = len(sender.results)
    r = pair.fab("rolling-restart")
    sent_during = len(sender.results) - sent_before
    assert r.code == 0, r
    order(r, "[s0] stopped", "[m0] ha manual", "[m0] stopped")
    assert re.match(r"\[s0\] stopped \(pid %d, SIGTERM\) in [\d.]+ s, then started \(pid \d+\) in [\d.]+ s; caught "
                    r"up with its master in [\d.]+ s$" % before["s0"], r.line("[s0]")), r
    assert r.line("[m0] ha manual") == ("[m0] ha manual: while m0 restarts, sends to broker id 0's partitions fail (no "
                                        "other broker takes its writes); producers retry them or use other brokers"), r
    assert re.match(r"\[m0\] stopped \(pid %d, SIGTERM\) in [\d.]+ s, then started \(pid \d+\) in [\d.]+ s; broker id "
                    r"0 took no writes for at most [\d.]+ s; s0 caught up in [\d.]+ s$" % before["m0"],
                    r.line("[m0] stopped")), r
    sender.wait_for_more(100, "100 sends after the restart")
    results = sender.close()
    assert sent_during > 0, "the producer was not sending during the rolling restart"
    assert all(pair.pid(n) != before[n] for n in before)

    held = pair.held("m0")
    acknowledged = [(body, res) for body, res in results if res.success]
    lost = [body for body, res in acknowledged if held.get((res.partition.partition, res.offset)) != body]
    assert lost == [], "%d of %d acknowledged messages are not on the master" % (len(lost), len(acknowledged))
    assert len(acknowledged) > 200
    wait_for(lambda: pair.caught_up("s0", "m0"), what="s0 caught up after the restart")
    assert pair.held("s0") == held

    # stop: the slave first, so no one is left behind a master that stopped first.
    r = pair.fab("stop", "status")
    assert r.code == 1, r
    order(r, "[s0] stopped", "[m0] stopped")
    for b in pair.brokers.values():
        assert not listening(b["host"], b["port"])
        log = open(os.path.join(b["install_dir"], "log", "metaq.log")).read()
        assert log.rstrip().endswith("broker stopped cleanly"), log[-2000:]


def test_a_rolling_restart_refuses_what_would_break_the_pair(pair):
    r = pair.fab("deploy", "start")
    assert r.code == 0, r
    wait_for(lambda: pair.stats("s0").get("replication_link") == "connected", what="s0 linked")

    # The master down: the slave's link is down, so s0 could never catch up after its restart.
    r = pair.fab("stop", "--only", "m0", "status")
    assert r.code == 1, r
    rows = status_table(r)
    assert rows["s0"]["STATE"] == "up" and rows["s0"]["LINK"] == "down", r
    m0_repl = "127.0.0.1:%d" % pair.brokers["m0"]["replication_port"]
    assert "s0: replication link to %s is down (fab logs --only s0)" % m0_repl in r.out, r
    s0_pid = pair.pid("s0")
    r = pair.fab("rolling-restart", "--only", "s0")
    assert r.code == 1, r
    assert r.line("[s0]") == ("[s0] FAILED on s0 (root@127.0.0.2:%d): its replication link to %s is down: a restarted "
                              "slave must catch up before the next broker restarts; fix the link first (fab logs "
                              "--only s0)" % (pair.inventory["defaults"]["ssh_port"], m0_repl)), r
    assert r.err.strip().splitlines()[-1] == "rolling restart (nothing was restarted) failed on 1 of 1 brokers: s0", r
    assert pair.pid("s0") == s0_pid

    # Promoted by hand, s0 is the master now: the inventory must say so before a rolling restart.
    with TextClient(*pair.address("s0")) as c:
        reply = c.call(ev.Promote(0, c.opaque()))
    assert reply.code == 200, reply
    r = pair.fab("status", "--only", "s0")
    assert r.code == 0 and status_table(r)["s0"]["ROLE"] == "master (inventory: slave)", r
    r = pair.fab("rolling-restart", "--only", "s0")
    assert r.code == 1, r
    assert r.line("[s0]").endswith("reports replication_role master, but the inventory says slave of m0: after a "
                                   "promotion by hand, write the new roles into the inventory (fab check) and deploy "
                                   "before a rolling restart"), r
    assert pair.pid("s0") == s0_pid


@pytest.fixture
def auto_pair(sshd, zk_server, tmp_path_factory):
    p = Pair(tmp_path_factory.mktemp("auto"), sshd, zk_server.chroot(), ha="auto")
    yield p
    p.fab("stop")
    p.kill_leftovers()


def test_an_auto_pair_rolling_restart_fails_no_send(auto_pair):
    pair = auto_pair
    r = pair.fab("deploy", "start")
    assert r.code == 0, r
    wait_for(lambda: {pair.stats(n).get("replication_role") for n in pair.brokers} == {"master", "slave"},
             timeout=30, what="one master and one slave elected")
    master = next(n for n in pair.brokers if pair.stats(n)["replication_role"] == "master")
    other = next(n for n in pair.brokers if n != master)
    r = pair.fab("status")
    rows = status_table(r)
    assert (rows[master]["ROLE"], rows[other]["ROLE"]) == ("master (auto)", "slave (auto)"), r

    # A producer through ZooKeeper follows the election; it retries for long enough that nothing fails.
    sender = Sender(zk_connect=pair.zk_connect, retry_deadline=30.0)
    sender.wait_for_more(100, "100 sends before the restart")
    sent_before = len(sender.results)
    r = pair.fab("rolling-restart")
    sent_during = len(sender.results) - sent_before
    assert r.code == 0, r
    order(r, "[%s] stopped" % other, "[%s] stopped" % master)
    assert re.match(r"\[%s\] stopped \(pid \d+, SIGTERM\) in [\d.]+ s; %s took over as master in [\d.]+ s; started "
                    r"\(pid \d+\) in [\d.]+ s, and caught up as its slave in [\d.]+ s$" % (master, other),
                    r.line("[%s]" % master)), r
    assert "ha manual" not in r.out and "took no writes" not in r.out, r
    sender.wait_for_more(100, "100 sends after the restart")
    results = sender.close()
    assert sent_during > 0, "the producer was not sending during the rolling restart"
    failed = [(body, res) for body, res in results if not res.success]
    assert failed == [], "%d of %d sends failed" % (len(failed), len(results))
    assert pair.stats(other)["replication_role"] == "master" and pair.stats(master)["replication_role"] == "slave"
    held = pair.held(other)
    lost = [body for body, res in results if held.get((res.partition.partition, res.offset)) != body]
    assert lost == [], "%d of %d acknowledged messages are not on the new master" % (len(lost), len(results))
    wait_for(lambda: pair.caught_up(master, other), what="the old master caught up as a slave")
    assert pair.held(master) == held
