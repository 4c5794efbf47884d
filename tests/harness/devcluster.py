"""A local cluster as ``metaq-cluster`` starts it (metaq/client/devcluster.py), for tests of N brokers in one
ZooKeeper: its members' ports by broker id, stopped by PID at the end."""

import socket
from types import SimpleNamespace

from metaq.client import devcluster
from metaq.client.local import free_port_run


def listening(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_base(count):
    """A base port whose ``count`` members' ports are all free now and handed out to no other server of this
    process, before or after (``free_port_run``)."""
    return free_port_run(devcluster.PORT_STRIDE * count)


class LocalCluster:
    """``n`` masters (broker ids 0..n-1) of ``metaq-cluster start --background --zk ZK`` under ``root``."""

    def __init__(self, root, n, zk_connect, slaves=0):
        self.root, self.zk_connect = str(root), zk_connect
        self.state = devcluster.start(self.root, n, slaves, free_base(n * (1 + slaves)), zk_connect=zk_connect,
                                      say=lambda text: None)
        self.masters = {b["broker_id"]: b for b in self.state["brokers"] if b["slave_id"] is None}

    def port(self, broker_id, name="text"):
        return self.masters[broker_id]["ports"][name]

    def url(self, broker_id):
        return "meta://127.0.0.1:%d" % self.port(broker_id)

    def urls(self):
        return [self.url(b) for b in sorted(self.masters)]

    def as_broker(self, broker_id):
        """What the MQTT harness (tests/harness/mqtt.py) takes for a broker: its config's MQTT port."""
        return SimpleNamespace(config={"mqtt": {"port": self.port(broker_id, "mqtt")}})

    def stop(self):
        devcluster.stop(self.root, say=lambda text: None)
