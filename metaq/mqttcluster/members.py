"""The members of the MQTT cluster as ZooKeeper names them: the one reader both the follow links (``peers.py``) and
the client ids (``service.py``) use (service: the server layer; docs/architecture.md "MQTT across the cluster").

A member is a master under ``<root>/brokers/ids/<id>`` whose ephemeral ``replication`` node names a replication
address (``server/registry.py`` writes it after the ``master`` node and deletes it first, so the node alone says
"a master with a replication port"); this broker is one of them when it is. One greenlet reads them when a watch
fires (the children of ``ids``, each member's ``replication`` node: a failover re-creates it) and at least every
``MQTT_CLUSTER_MEMBERS_POLL_S``; the kazoo watch only wakes it, as the registry's listener does. After a reading
that changed anything the listeners are called (in that greenlet: each only records and wakes its own work).
Nothing is written to ZooKeeper.
"""

import json
import logging

import gevent
from gevent.event import Event
from kazoo.exceptions import KazooException, NoNodeError

from metaq.mqttcluster import limits as mqttcluster_limits

log = logging.getLogger(__name__)

__all__ = ["Members"]


class Members:
    """See the module doc. ``zk``: the registry's kazoo client; ``root``: its root."""

    def __init__(self, zk, root, poll_s=None):
        self.zk = zk
        self.root = root
        self.poll_s = mqttcluster_limits.MQTT_CLUSTER_MEMBERS_POLL_S if poll_s is None else poll_s
        #: ``{broker id: (replication address, its node's ZooKeeper session)}`` as last read; None while ZooKeeper
        #: cannot be read (those who use it keep what they had)
        self.current = None
        self.readings = 0
        self._listeners = []
        self._wake = Event()
        self._task = None

    def on_change(self, listener):
        """``listener()`` is called after each reading that changed ``current`` (it records and wakes, no more)."""
        self._listeners.append(listener)

    def start(self):
        if self._task is None:
            self._task = gevent.spawn(self._run)

    def stop(self):
        if self._task is not None:
            self._task.kill(block=False)
            self._task = None

    def _watch(self, _event):
        self._wake.set()  # a kazoo callback: record and wake, nothing else

    def _run(self):
        while True:
            self._wake.clear()
            try:
                found = self.read() if self.zk.connected else None
            except Exception:  # noqa: BLE001 - the reader must go on
                log.exception("mqtt cluster: reading the members failed")
                found = None
            if found != self.current:
                self.current = found
                for listener in self._listeners:
                    listener()
            self._wake.wait(self.poll_s)

    def read(self):
        """``{broker id: (replication address, node owner)}`` of the members now, or None when ZooKeeper cannot be
        read; leaves a watch on the children and on each member's node."""
        path = "%s/brokers/ids" % self.root
        out = {}
        try:
            children = self.zk.get_children(path, watch=self._watch)
            for name in children:
                if not name.isdigit():
                    continue
                node = "%s/%s/replication" % (path, name)
                try:
                    data, stat = self.zk.get(node, watch=self._watch)
                except NoNodeError:
                    self.zk.exists(node, watch=self._watch)  # a master coming (a failover's): seen when it is
                    continue
                try:
                    address = json.loads(data.decode("utf-8")).get("address")
                except (ValueError, AttributeError):
                    continue
                if address:
                    out[int(name)] = (address, stat.ephemeralOwner)
        except NoNodeError:
            return {}
        except KazooException as exc:
            log.debug("mqtt cluster: ZooKeeper could not be read: %r", exc)
            return None
        self.readings += 1
        return out
