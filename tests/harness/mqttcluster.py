"""An MQTT cluster for the tests: N masters under one ZooKeeper root, each with an MQTT port and a replication
port, and a way to wait until each one's route reached the others."""

import os
import time

from metaq.client.local import free_port, small_config
from tests.harness.acl import login
from tests.harness.broker import wait_for
from tests.harness.mqtt import with_mqtt
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
