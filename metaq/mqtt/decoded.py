"""Records decoded once for every MQTT delivery of a port, and each QoS 0 PUBLISH encoded once for every subscriber
that gets it the same way (``Decoded``): the fan-out readers, the deliveries' own reads and a publisher's turn all
take a record's message and its encodings from here, bounded by count and bytes (``limits.MQTT_SHARED_DECODES``,
``limits.MQTT_SHARED_DECODES_BYTES``)."""

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt import wire
from metaq.mqtt.records import message_of
from metaq.mqtt.topicmap import DEFAULT_MAP


class Decoded:
    """Records decoded once for every delivery of a port, and the QoS 0 PUBLISH of each encoded once for every
    subscriber that gets it the same way (same MQTT version and retain flag, no Subscription Identifier, no expiry):
    at most ``count`` of each (``limits.MQTT_SHARED_DECODES``) holding ``nbytes`` together
    (``limits.MQTT_SHARED_DECODES_BYTES``), the oldest dropped first. A record is known by its place in the log and
    its message id, so a log cut and written again (a slave's) is never mistaken for it. ``topics``: the port's
    topic map (``records.message_of``)."""

    __slots__ = ("topics", "count", "nbytes", "_messages", "_packets")

    def __init__(self, topics=DEFAULT_MAP, count=mqtt_limits.MQTT_SHARED_DECODES,
                 nbytes=mqtt_limits.MQTT_SHARED_DECODES_BYTES):
        self.topics = topics
        self.count = count
        self.nbytes = nbytes
        self._messages = _Kept(count, nbytes)  # (position, msg id) -> MqttMessage
        self._packets = _Kept(count, nbytes)  # (position, msg id, retain, version) -> encoded QoS 0 PUBLISH

    def message(self, key, topic, flag, data, made=None):
        """The ``MqttMessage`` of the record ``key`` (``(position, msg id)``) of metaq topic ``topic``; ``made``: that
        message when the caller has it already (kept, not decoded)."""
        m = self._messages.get(key)
        if m is None:
            m = message_of(topic, flag, data, self.topics) if made is None else made
            self._messages.put(key, m, len(m.payload))
        return m

    def keep(self, key, m):
        """Keep ``m`` as the message of record ``key``, made without decoding it (``records.stored_message``: the one
        ``message`` would decode)."""
        self._messages.put(key, m, len(m.payload))

    def packet(self, key, m, retain, version):
        """The QoS 0 PUBLISH of record ``key``'s message ``m`` in ``version``."""
        pkey = key + (retain, version)
        data = self._packets.get(pkey)
        if data is None:
            data = wire.encode(wire.Publish(m.topic, m.payload, 0, retain, False, None,
                                            m.properties if version == wire.MQTT_5 else {}), version)
            self._packets.put(pkey, data, len(data))
        return data

    def aliased(self, key, retain, version, data, alias, named):
        """``packet``'s PUBLISH ``data`` (of record ``key``, ``retain``, ``version``) with Topic Alias ``alias``, its
        name kept (``named``) or not (``wire.with_topic_alias``): encoded once for every connection that sends it
        so."""
        akey = key + (retain, version, alias, named)
        out = self._packets.get(akey)
        if out is None:
            out = wire.with_topic_alias(data, alias, named)
            self._packets.put(akey, out, len(out))
        return out


class _Kept:
    """The most recent values, at most ``count`` of them and ``nbytes`` together (a value larger alone: not kept)."""

    __slots__ = ("count", "nbytes", "held", "_values")

    def __init__(self, count, nbytes):
        self.count = count
        self.nbytes = nbytes
        self.held = 0
        self._values = {}  # key -> (value, size), oldest first

    def __len__(self):
        return len(self._values)

    def __contains__(self, key):
        return key in self._values

    def get(self, key):
        kept = self._values.get(key)
        return None if kept is None else kept[0]

    def put(self, key, value, size):
        if size > self.nbytes:
            return
        values = self._values
        values[key] = (value, size)
        self.held += size
        while len(values) > self.count or self.held > self.nbytes:
            oldest = next(iter(values))
            self.held -= values.pop(oldest)[1]

