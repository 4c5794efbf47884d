"""The peers' retained messages as this broker knows them (state: no socket, gevent or clock; docs/architecture.md
"MQTT across the cluster").

Each link follows its peer's ``%MQTT%`` journal's ``R``/``U`` records from its start (``following.peers``): kept in
memory here, at most MQTT_CLUSTER_MAX_RETAINED names (rebuilt at each start and after a promotion the same way),
with this broker's own clears; for a name the newest by (time, broker id) wins against the local table.
"""

import logging

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqtt.follow import RecordError, decode_retained
from metaq.mqtt.topics import matches

log = logging.getLogger(__name__)

__all__ = ["PeerRetained"]


class PeerRetained:
    """See the module doc. ``broker_id``: this broker's; ``holds(metaq topic, name)``: the port's topic map puts
    ``name`` in that topic (``TopicMap.holds``); ``local(name)``: the port's own retained message of ``name``, or
    None."""

    def __init__(self, broker_id, holds, local):
        self.broker_id = broker_id
        self.holds = holds
        self.local = local
        self.names = {}  # MQTT topic name -> (at ms, broker id, Retained or None)

    def apply(self, origin, e):
        """A RETAINED entry of peer ``origin``'s follow: its ``R``/``U`` record (a malformed one logged, skipped)."""
        try:
            name, r = decode_retained(e.data)
        except RecordError as exc:
            log.warning("mqtt cluster: peer broker %d: %s", origin, exc)
            return
        at = r.at_ms if r is not None else e.ts
        self.keep(name, at, origin, r)

    def keep(self, name, at, broker, r):
        """``name``'s retained message ``r`` (None: cleared) of ``broker`` at ``at`` (ms), unless one as new or newer
        is known, or MQTT_CLUSTER_MAX_RETAINED names are (logged)."""
        old = self.names.get(name)
        if old is not None and (old[0], old[1]) >= (at, broker):
            return
        if old is None and len(self.names) >= mqttcluster_limits.MQTT_CLUSTER_MAX_RETAINED:
            log.warning("mqtt cluster: %d retained names is the limit (MQTT_CLUSTER_MAX_RETAINED): %s from broker %d "
                        "is not kept", mqttcluster_limits.MQTT_CLUSTER_MAX_RETAINED, name, broker)
            return
        self.names[name] = (at, broker, r)

    def local_cleared(self, name, at):
        """This broker cleared ``name``'s retained message at ``at``: older ones of the peers no longer show here."""
        if name in self.names:
            self.keep(name, at, self.broker_id, None)

    def knows(self, name):
        entry = self.names.get(name)
        return entry is not None and entry[2] is not None

    def count(self):
        """The peers' retained messages that show here (clears not counted)."""
        return sum(1 for e in self.names.values() if e[2] is not None)

    def merged(self, topic_filter, topics, local):
        """The retained messages for a subscription of ``topic_filter`` reading ``topics``: ``local`` (the port's
        own) merged with the peers', the newest of each name by (time, broker id). A peer's is the name's when the
        topic map puts the name in its metaq topic (``holds``), whether or not this broker has that topic yet: a
        wildcard filter gets a peer's retained message of a topic only the peer holds."""
        if not self.names:
            return local
        out = {}
        for r in local:
            entry = self.names.get(r.name)
            if entry is None or (entry[0], entry[1]) < (r.at_ms, self.broker_id):
                out[r.name] = r
        local_names = {r.name for r in local}
        for name, (at, broker, r) in self.names.items():
            if r is None or name in out or not matches(topic_filter, name) or \
                    not (r.metaq_topic in topics or self.holds(r.metaq_topic, name)):
                continue
            local_r = self.local(name) if name in local_names else None
            if local_r is not None and (local_r.at_ms, self.broker_id) > (at, broker):
                continue
            out[name] = r
        return list(out.values())
