"""An MQTT cluster for the tests: N masters under one ZooKeeper root, each with an MQTT port and a replication
port, and a way to wait until each one's route reached the others."""

import json
import os
import time

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from metaq.mqttcluster.clientids.ids import home_of
from tests.harness.acl import login
from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho, with_mqtt
from tests.harness.registrar import Registrar
from tests.harness.replication import stats


def cluster_config(workdir, broker_id, zk_connect, **sections):
    cfg = small_config(os.path.join(str(workdir), "data"), zk={"connect": zk_connect, "session_timeout_ms": 4000},
                       replication={"port": free_port()}, **sections)
    cfg["broker"]["id"] = broker_id
    return with_mqtt(cfg)


class Cluster:
    def __init__(self, broker_factory, tmp_path, zk_connect, n, **sections):
        self.factory = broker_factory
        self.tmp_path = tmp_path
        self.zk_connect = zk_connect
        self.configs = [cluster_config(tmp_path / ("b%d" % i), i, zk_connect, **sections) for i in range(n)]
        self.secured = "security" in sections
        self.brokers = []

    def stats(self, b):
        """``stats`` of broker ``b`` (as the admin when authentication is on)."""
        if not self.secured:
            return stats(b)
        with login(b, "admin") as c:
            return c.stats_dict()

    def start(self):
        self.brokers = [self.factory(cfg, workdir=self.tmp_path / ("b%d" % i)) for i, cfg in enumerate(self.configs)]
        self.wait_linked()
        return self

    def __getitem__(self, i):
        return self.brokers[i]

    def wait_linked(self, timeout=30.0):
        n = len(self.brokers)
        for b in self.brokers:
            wait_for(lambda b=b: self.stats(b).get("mqtt_cluster_peers_up") == str(n - 1), timeout,
                     lambda b=b: "every peer link up on broker %s: %s\n%s" % (
                         b.port, {k: v for k, v in self.stats(b).items() if "cluster" in k},
                         b.log_text()[-3000:]))

    def restart(self, i, kill=False):
        b = self.brokers[i]
        if kill:
            b.kill()
        else:
            b.stop()
        b.start()
        self.wait_linked()
        return b


class PaperMembers:
    """Members of an MQTT cluster that ZooKeeper names and no broker runs: each a ``replication`` node (ephemeral,
    of its own session) naming an address nobody listens on, so that a test's raw peer calls come from a member (a
    broker serves members only: ``mqttcluster.asks``), or the address ``broker_ids`` maps it to (a dict: a test's
    own server playing that member). ``close`` ends them."""

    def __init__(self, zk_connect, broker_ids, root="/meta"):
        self.registrar = Registrar(zk_connect, root)
        addresses = broker_ids if isinstance(broker_ids, dict) else dict.fromkeys(broker_ids, "127.0.0.1:1")
        for broker_id, address in addresses.items():
            path = "%s/brokers/ids/%d" % (root, broker_id)
            self.registrar.zk.ensure_path(path)
            self.registrar.zk.create(path + "/replication", json.dumps({"address": address}).encode(), ephemeral=True)

    def close(self):
        self.registrar.close()


def wait_routed(subscriber, publish, timeout=20.0):
    """Publish probes (``publish(i)``) until ``subscriber`` (a Paho client) received one: its route reached the
    publisher's broker. Returns how many messages it holds then (the probes), all removed from its list."""
    deadline = time.monotonic() + timeout
    i = 0
    while time.monotonic() < deadline:
        publish(i)
        i += 1
        got = subscriber.wait_messages(1, 0.3)
        if got:
            time.sleep(0.5)  # the other probes in flight arrive too
            with subscriber.got:
                count = len(subscriber.messages)
                del subscriber.messages[:]
            return count
    raise AssertionError("no probe reached the subscriber within %.0f s" % timeout)


class FollowedGroup:
    """Broker 0 following broker 1, a master ``m1`` and its slave ``s1`` (replication port ``s1_port`` once
    promoted): ``keeper``, a persistent session on broker 0 subscribed to ``sensors/#`` at QoS 1, routed to broker
    1. ``sections``: broker 1's (both members') config sections."""

    def __init__(self, broker_factory, tmp_path, zk_connect, **sections):
        self.b0 = broker_factory(cluster_config(tmp_path / "b0", 0, zk_connect), workdir=tmp_path / "b0")
        m1cfg = cluster_config(tmp_path / "m1", 1, zk_connect, **sections)
        self.m1 = broker_factory(m1cfg, workdir=tmp_path / "m1")
        s1cfg = cluster_config(tmp_path / "s1", 1, zk_connect, **sections)
        s1cfg["replication"] = {}
        self.s1_port = free_port()
        self.s1 = broker_factory(s1cfg, workdir=tmp_path / "s1", extra_args=[
            "--slave-of", "127.0.0.1:%d" % m1cfg["replication"]["port"], "--slave-id", "1",
            "--replication-port", str(self.s1_port)])
        wait_for(lambda: stats(self.b0).get("mqtt_cluster_peers_up") == "1", 30, "0 follows 1")
        self.keeper = Paho(self.b0, client_id="keeper", version=V311, clean=False)
        assert self.keeper.subscribe("sensors/#", qos=1) == [1]
        wait_routed(self.keeper, lambda i: Paho(self.m1, "probe-%d" % i).publish("sensors/probe", b"p", 1))

    def promote_slave(self, capsys):
        """Promote ``s1`` once it sees its master gone (``m1`` killed or stopped first), and wait until broker 0
        follows it."""
        wait_for(lambda: stats(self.s1)["replication_link"] == "down", 15, "the slave sees its master gone")
        code = admin.main(["promote", "127.0.0.1:%d" % self.s1.port, "--force"])
        assert code == 0, capsys.readouterr()
        wait_for(lambda: stats(self.b0).get("mqtt_cluster_peer_1", "").startswith("up 127.0.0.1:%d" % self.s1_port),
                 30, "0 follows the new master of broker 1")


def homed(n, home, members, prefix):
    """``n`` client ids ``<prefix>-<i>`` whose home is broker ``home`` among ``members`` (``ids.home_of``)."""
    out, i = [], 0
    while len(out) < n:
        client_id = "%s-%d" % (prefix, i)
        if home_of(client_id, members) == home:
            out.append(client_id)
        i += 1
    return out
