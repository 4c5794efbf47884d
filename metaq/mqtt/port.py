"""The MQTT port: a listener on the connection core, the client identifiers connected now, and the will messages
(docs/mqtt.md).

``MqttPort`` opens its listener through ``ConnectionCore.listen("mqtt", ...)``, so the connection cap, the
per-address share, the deadlines, the allow-list, TLS and the strangers' login deadline apply as on every port. It
is given what it uses: the connection core, the ``mqtt:`` settings, the store (partition counts and the read path),
the put path (the one write decision and append), the guard, the partition waiters (deliveries wake on appends)
and the store's ``max_transfer_size``.

What it holds across connections:

* **client identifiers** connected now (``claim``): a second connection with a client id takes it over, the first
  is told DISCONNECT 0x8E (MQTT 5) and closed (MQTT 3.1.1 [MQTT-3.1.4-2], MQTT 5.0 [MQTT-3.1.4-3]);
* **wills** (``connection_lost``): published through the put path when a connection ends without a normal
  DISCONNECT; an MQTT 5 Will Delay holds it for min(Will Delay, Session Expiry) unless the client id connects
  again first with Clean Start 0, at most ``mqtt.max_delayed_wills`` at once (past it: at once);
* **assigned client identifiers** for a CONNECT with an empty one.
"""

import itertools
import logging
import os

import gevent

from metaq import errors
from metaq.mqtt.connection import Connection
from metaq.mqtt.records import first_level, partition_for, record_data
from metaq.server.clock import now_ms
from metaq.server.putpath import ACK_NOW

log = logging.getLogger(__name__)


class MqttPort:
    """See the module doc."""

    def __init__(self, core, settings, store, put_path, guard, waiters, max_transfer):
        self.core = core
        self.settings = settings  # the ``mqtt:`` section
        self.store = store
        self.put_path = put_path
        self.guard = guard
        self.waiters = waiters
        self.max_transfer = max_transfer
        self.listener = None
        self._clients = {}  # client id -> its Connection
        self._delayed = {}  # client id -> (the greenlet holding its will for its delay, the will, its guard session)
        self._ids = itertools.count(1)
        self._id_salt = os.urandom(4).hex()
        self.wills_published = 0

    @property
    def closing(self):
        return self.core.closing

    @property
    def port(self):
        return self.listener.port if self.listener is not None else None

    def listen(self, host, port):
        self.listener = self.core.listen("mqtt", host, port, self._connection)
        return self.listener

    def _connection(self, sock, address, conn_id):
        return Connection(sock, address, conn_id, self)

    def connection_count(self):
        return self.core.count("mqtt")

    # -- client identifiers ----------------------------------------------------

    def assign_id(self):
        """A client identifier for a CONNECT with an empty one, unique among the connected (MQTT 5.0
        [MQTT-3.2.2-16])."""
        while True:
            client_id = "metaq-%s-%d" % (self._id_salt, next(self._ids))
            if client_id not in self._clients:
                return client_id

    def claim(self, conn, client_id, clean_start):
        """``conn`` now holds ``client_id``: an earlier connection with it is taken over (closed, its will published
        unless the new connection resumes the session before its delay: ``clean_start`` false), and a will held for
        its delay is published now (``clean_start``: the old session ended) or dropped (resumed). With
        authentication on, a client id held by another user's connection (or will) is not taken: returns why (None:
        claimed), so that one user cannot close another's devices or drop their wills."""
        refusal = self._held_by_another(conn, client_id)
        if refusal is not None:
            return refusal
        old = self._clients.get(client_id)
        if old is not None and old is not conn:
            lost = old.take_over()
            if lost is not None:
                will, security, delay = lost
                if clean_start or delay <= 0:
                    self.publish_will(client_id, will, security)
        held = self._delayed.pop(client_id, None)
        if held is not None:
            greenlet, will, security = held
            greenlet.kill(block=False)
            if clean_start:
                self.publish_will(client_id, will, security)
        self._clients[client_id] = conn
        return None

    def _held_by_another(self, conn, client_id):
        if not self.guard.enabled:
            return None
        user = conn.session.user
        old = self._clients.get(client_id)
        held = self._delayed.get(client_id)
        owner = old.session.user if old is not None else held[2].user if held is not None else user
        if owner != user:
            return "client identifier %s is held by another user's connection" % client_id
        return None

    def release(self, conn, client_id):
        if self._clients.get(client_id) is conn:
            del self._clients[client_id]

    # -- puts ------------------------------------------------------------------

    def put(self, name, payload, qos, client_id, properties, security):
        """Store one PUBLISH (or will) of MQTT topic ``name`` as ``security``'s user: ``(metaq topic, PutResult,
        now)``. The write is the put path's one decision (``PutPath.write_refusal``: the user's permission, the
        broker's, the topic's name), the partition the name's (``records.partition_for``). Raises
        ``records.RecordRefusal`` or MetaqError."""
        topic = first_level(name)
        exc = self.put_path.write_refusal(topic, security)
        if exc is not None:
            self.put_path.failed(topic, exc)
            raise exc
        flag, data = record_data(name, payload, qos, client_id, properties)
        partition = partition_for(name, self.store.partitions_of(topic))
        now = now_ms()
        return topic, self.put_path.append(topic, partition, flag, data, now), now

    def made_visible(self, topic, result, now):
        """A put nobody waits for (QoS 0, a will): visible now (async), or at the flush it asks for (sync)."""
        if self.put_path.ack_mode(topic, result, now) != ACK_NOW:
            self.put_path.flusher.wake()

    # -- wills -----------------------------------------------------------------

    def connection_lost(self, client_id, will, security, delay_s):
        """A connection with a will ended without a normal DISCONNECT: publish it now, or after ``delay_s``."""
        if delay_s <= 0 or len(self._delayed) >= self.settings.max_delayed_wills:
            self.publish_will(client_id, will, security)
            return
        old = self._delayed.pop(client_id, None)
        if old is not None:
            old[0].kill(block=False)
        self._delayed[client_id] = (gevent.spawn_later(delay_s, self._delayed_will, client_id, will, security), will,
                                    security)

    def _delayed_will(self, client_id, will, security):
        if self._delayed.pop(client_id, None) is not None:
            self.publish_will(client_id, will, security)

    def publish_will(self, client_id, will, security):
        """Store ``will`` as its client's PUBLISH would be (its user's permission asked); a refusal is logged."""
        try:
            topic, r, now = self.put(will.topic, will.payload, will.qos, client_id, will.properties, security)
        except (errors.MetaqError, ValueError) as exc:
            log.warning("mqtt client %s: its will to %s was not published: %s", client_id, will.topic, exc)
            return
        self.wills_published += 1
        self.made_visible(topic, r, now)

    def summary_values(self):
        """The ``stats`` summary's MQTT pairs: the port, its connections, the wills published since the start and
        those waiting for their delay."""
        return [("mqtt_port", self.port or 0), ("mqtt_connections", self.connection_count()),
                ("mqtt_wills_published", self.wills_published), ("mqtt_delayed_wills", len(self._delayed))]

    def stop(self):
        """The broker stops: sessions end with it, so the wills held for their delay are published now."""
        held, self._delayed = self._delayed, {}
        for client_id, (greenlet, will, security) in held.items():
            greenlet.kill(block=False)
            self.publish_will(client_id, will, security)
