"""The cluster's RocketMQ brokers now, as ZooKeeper knows them: what a RocketMQ route lists (docs/rocketmq.md).

Each broker member with a RocketMQ port publishes its addresses beside MetaQ's nodes (``registry.py``, ephemeral,
by role; the names and JSON are ``protocol/registration.py``'s): ``<root>/brokers/ids/<id>/rocketmq-master`` or
``.../rocketmq-slave<N>``, holding ``{"name": broker name, "remoting": "ip:port" or null, "grpc": "host:port" or
null}``. A topic's queues on a broker
are MetaQ's own registration: ``topics-pub/<topic>/<id>-m`` (the master's partition count) and, for a broker whose
master is away, ``topics-sub/<topic>/<id>-s<N>``.

``ClusterView.brokers(topic)`` reads them at each call (a route query is rare: RocketMQ clients refresh every 30 s)
and gives ``RouteBroker`` rows, one per broker id: masters as RocketMQ broker id 0, slave N as ``N + 1`` (metaq's
slave ids start at 0, RocketMQ's 0 is the master). A front-end is given this callable, never the registry. None
when ZooKeeper cannot be read now: the front-end then answers as a broker alone does (its own queues, the
master it knows), as RocketMQ's name servers keep serving the routes last registered.
"""

import logging
from typing import NamedTuple, Optional

from kazoo.exceptions import KazooException, NoNodeError

from metaq.protocol.registration import ROCKETMQ, address, load, member_of

log = logging.getLogger(__name__)


class RouteBroker(NamedTuple):
    """One broker of a route: ``remoting`` maps RocketMQ broker ids (0 = master) to ``"ip:port"``; ``grpc`` is
    its master's gRPC endpoint ``"host:port"`` or None; ``queues`` the topic's queues there (0 without a topic)."""

    broker_id: int
    name: str
    remoting: dict
    grpc: Optional[str]
    queues: int


class ClusterView:
    """Reads the RocketMQ brokers of the cluster from ZooKeeper (``zk``: a connected kazoo client, ``root``: the
    registry's root) — see the module doc."""

    def __init__(self, zk, root):
        self.zk = zk
        self.root = root

    def brokers(self, topic=None):
        """Every broker with a RocketMQ port (sorted by broker id), each with ``topic``'s queue count where it is
        registered and 0 where the broker does not hold the topic yet (its first send creates it there, as the
        Python producer's first put does); None when ZooKeeper cannot be read now."""
        if not self.zk.connected:
            return None
        try:
            return self._read(topic)
        except KazooException as exc:
            log.info("routes: ZooKeeper could not be read (%r); answering with this broker alone", exc)
            return None

    def _children(self, path):
        try:
            return self.zk.get_children(path)
        except NoNodeError:
            return []

    def _read(self, topic):
        queues = {}
        if topic is not None:
            for kind, suffix in (("topics-sub", "-s"), ("topics-pub", "-m")):  # a master's count wins
                base = "%s/brokers/%s/%s" % (self.root, kind, topic)
                for child in self._children(base):
                    head, sep, _tail = child.partition(suffix)
                    if not sep or not head.isdigit():
                        continue
                    try:
                        value = load(self.zk.get("%s/%s" % (base, child))[0])
                    except NoNodeError:
                        continue
                    parts = value.get("numParts") if value else None
                    if isinstance(parts, int) and parts > 0:
                        queues[int(head)] = parts
        out = []
        ids = "%s/brokers/ids" % self.root
        for child in self._children(ids):
            if not child.isdigit():
                continue
            broker = self._broker(int(child), "%s/%s" % (ids, child), queues.get(int(child), 0))
            if broker is not None:
                out.append(broker)
        return sorted(out)

    def _broker(self, broker_id, path, queues):
        name, remoting, grpc = None, {}, None
        for child in self._children(path):
            member = member_of(child)
            if member is None or member[0] != ROCKETMQ:
                continue
            rocketmq_id = 0 if member[1] is None else member[1] + 1
            try:
                value = load(self.zk.get("%s/%s" % (path, child))[0])
            except NoNodeError:
                continue
            if value is None:
                continue
            name = name if rocketmq_id != 0 and name else address(value.get("name")) or name
            if address(value.get("remoting")):
                remoting[rocketmq_id] = value["remoting"]
            if rocketmq_id == 0:
                grpc = address(value.get("grpc"))
        if name is None:
            return None  # no member of it has a RocketMQ port
        return RouteBroker(broker_id, name, remoting, grpc, queues)
