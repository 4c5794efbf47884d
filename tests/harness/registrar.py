"""Registrar: writes a broker's MetaQ registration nodes to ZooKeeper as a broker would, for client tests."""

import json

from kazoo.client import KazooClient


class Registrar:
    """Writes MetaQ's broker nodes by hand (as a broker would), with its own ZooKeeper session."""

    def __init__(self, zk_connect, root="/meta"):
        self.root = root
        self.zk = KazooClient(hosts=zk_connect, timeout=10)
        self.zk.start(timeout=15)

    def broker(self, bid, url, slave=None):
        self.zk.ensure_path("%s/brokers/ids/%d" % (self.root, bid))
        name = "master" if slave is None else "slave%d" % slave
        self.zk.create("%s/brokers/ids/%d/%s" % (self.root, bid, name), url.encode(), ephemeral=True)

    def topic(self, topic, bid, parts, slave=None, kinds=("topics-pub", "topics-sub"), legacy=False):
        node = "%d-%s" % (bid, "m" if slave is None else "s%d" % slave)
        data = json.dumps({"broker": node, "numParts": parts}).encode()  # field order differs from MetaQ's
        for kind in kinds:
            self.zk.ensure_path("%s/brokers/%s/%s" % (self.root, kind, topic))
            self.zk.create("%s/brokers/%s/%s/%s" % (self.root, kind, topic, node), data, ephemeral=True)
        if legacy:
            self.zk.ensure_path("%s/brokers/topics/%s" % (self.root, topic))
            self.zk.create("%s/brokers/topics/%s/%s" % (self.root, topic, node), b"%d" % parts, ephemeral=True)

    def remove_broker(self, bid):
        """Delete a broker's ephemeral nodes, as ZooKeeper does when the broker's session ends."""
        for path in ["%s/brokers/ids/%d/master" % (self.root, bid)] + [
                "%s/brokers/%s/%s/%d-m" % (self.root, kind, topic, bid)
                for kind in ("topics-pub", "topics-sub", "topics")
                for topic in (self.zk.get_children("%s/brokers/%s" % (self.root, kind))
                              if self.zk.exists("%s/brokers/%s" % (self.root, kind)) else [])]:
            if self.zk.exists(path):
                self.zk.delete(path)

    def close(self):
        self.zk.stop()
        self.zk.close()
