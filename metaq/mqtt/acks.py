"""The acknowledgements an MQTT connection sends for what its client published (PUBACK, PUBREC, PUBCOMP, and the
PUBREL of a delivery's first PUBREC in a persistent session), in the order the packets came, each once its put may
be acknowledged as a text ``put`` would be (``PutPath.durable``, ``MqttPort.burst_durable``), and the count of the
client's QoS 1/2 PUBLISHes not yet acknowledged that ``mqtt.receive_maximum`` bounds (docs/mqtt.md).

A burst's PUBACKs that may go at once and find nothing queued before them are written from the reader's turn
(``plainturn.pubacks_now``: by the socket's descriptor when it may be written that way, ``Connection.direct_fd``, else
``Connection.try_send``); the others are queued for a writer greenlet that exists only while some wait, so an idle
connection holds none.
"""

import logging
import time
from collections import deque

import gevent
from gevent.event import Event

from metaq import errors
from metaq.mqtt import wire
from metaq.mqtt.plainturn import pubacks_now
from metaq.mqtt.wire import MQTT_5, encode

log = logging.getLogger(__name__)


class Acknowledgements:
    """One connection's acknowledgements (see the module doc), written to ``conn`` (its ``send``, ``send_bytes``,
    ``try_send``, ``direct_fd``, ``close``, its version, peer and session), waiting on ``put_path`` (``durable``)
    and ``burst_durable`` (``MqttPort.burst_durable``). ``unacked`` is the client's QoS 1/2 PUBLISHes not yet
    acknowledged (QoS 2: until its PUBREL), counted by ``publishes.Publishes`` as it takes, refuses and releases
    them, set by a resumed session (``connect``) and counted down as their acknowledgements go; ``pending`` the
    acknowledgements queued and not yet written (0: none queued and no writer running, so a burst's PUBACKs
    acknowledged at once may be written from the reader's turn: ``pubacks_now``, which ``pubacks`` and the
    reader's one-step turn, ``plainturn.plain_turn``, both use); ``sent`` an Event once waited on
    (``wait_for_room``, the reader's), set after each acknowledgement written, here or by ``pubacks_now``."""

    __slots__ = ("conn", "put_path", "burst_durable", "unacked", "pending", "sent", "_queue", "_writer")

    def __init__(self, conn, put_path, burst_durable):
        self.conn = conn
        self.put_path = put_path
        self.burst_durable = burst_durable
        self.unacked = 0
        self.pending = 0
        self.sent = None
        self._queue = None  # (packet, wait, counted) in the order of their packets: a deque once one is queued
        self._writer = None  # the writer's greenlet while acknowledgements wait

    @property
    def writing(self):
        """True while the writer greenlet runs."""
        return self._writer is not None

    def queue(self, packet, wait=None, counted=False):
        """Send ``packet`` after every acknowledgement queued before it, once ``wait`` (``(topic, PutResult, now,
        cuts)`` of a put not yet acknowledgeable, ``cuts`` the log's ``log_cuts`` read right after its write: the
        wait begins later, in the writer's greenlet) may be acknowledged; ``counted``: it ends one of the client's
        unacknowledged PUBLISHes. A ``PubAckRun`` goes as ``pubacks`` sends one."""
        if type(packet) is PubAckRun:
            self.pubacks(packet.encoded(), wait, packet)
            return
        self._append((packet, wait, counted))

    def pubacks(self, data, wait=None, run=None):
        """Send a burst's PUBACKs, ``data`` their bytes (4 a PUBACK, in order, ``wire.encode_pubacks``'s), after every
        acknowledgement queued before it, once the burst may be acknowledged (``wait``: ``burst_durable``'s
        arguments; None: at once). Acknowledged at once, the common case of a burst with ``flush: async``, they are
        written from the reader's turn when nothing is queued before them and the socket takes them without waiting
        (``pubacks_now``): no entry, no writer greenlet. Else they are queued (``queue_pubacks``)."""
        if wait is None and pubacks_now(self, self.conn, data):
            return
        self.queue_pubacks(data, wait, run)

    def queue_pubacks(self, data, wait=None, run=None):
        """Queue a burst's PUBACKs (``pubacks``' arguments) as one ``PubAckRun`` (``run`` when made already) for the
        writer, behind every acknowledgement queued before it: what ``pubacks`` does with those it does not write at
        once (TLS, the socket's buffer full, another writer inside a packet, acknowledgements queued before them)."""
        self._append((PubAckRun(encoded=data) if run is None else run, wait, False))

    def _append(self, entry):
        """Queue ``entry`` (``(packet, wait, counted)``) for the writer, started when none runs."""
        self.pending += 1
        if self._queue is None:
            self._queue = deque()
        self._queue.append(entry)
        if self._writer is None:
            self._writer = gevent.spawn(self._write_all)

    def send_in_order(self, data):
        """Send encoded ``data`` after the acknowledgements queued before it (at once when none waits); False when
        the connection is closed or the send failed (then it closes)."""
        if self.pending:
            self.queue(data)
            return not self.conn.closed
        return self.conn.send_bytes(data)

    def wait_for_room(self, receive_maximum, deadline_s):
        """While the client's unacknowledged PUBLISHes are at ``receive_maximum`` and acknowledgements are on their
        way (their puts' flushes), read nothing more: an MQTT 3.1.1 client, told no Receive Maximum, may pipeline past
        it, and waits in its socket instead of being closed (at most ``deadline_s`` seconds). True when it waited
        (it yielded)."""
        deadline = time.monotonic() + deadline_s
        if self.sent is None:
            self.sent = Event()
        waited = False
        while self.unacked >= receive_maximum and self.pending and not self.conn.closed \
                and time.monotonic() < deadline:
            waited = True
            self.sent.clear()
            self.sent.wait(0.5)
        return waited

    def finish(self, deadline_s):
        """The connection ends: the acknowledgements queued are written (at most ``deadline_s`` seconds), then the
        writer, if any, is ended."""
        conn = self.conn
        if self.pending and not conn.closed:
            deadline = time.monotonic() + deadline_s
            while self.pending and not conn.closed and time.monotonic() < deadline:
                gevent.sleep(0.01)
        if self._writer is not None:
            self._writer.kill(block=False)

    def _write_all(self):
        """The writer: sends what ``queue`` queued, in order, and ends when none is left (the next ``queue`` starts
        it again)."""
        acks = self._queue
        try:
            while acks:
                self._write(*acks.popleft())
        finally:
            self._writer = None

    def _write(self, packet, wait, counted):
        try:
            if type(packet) is PubAckRun:
                self._write_run(packet, wait)
            elif type(packet) is bytes:  # an answer encoded when it was queued (it must follow the
                self.conn.send_bytes(packet)  # acknowledgements), or the rest of a PUBACK run ``pubacks`` began
            else:
                self._write_one(packet, wait, counted)
        finally:
            self.pending -= 1
            if self.sent is not None:
                self.sent.set()

    def _write_one(self, packet, wait, counted):
        if wait is not None:
            topic, r, now, cuts = wait
            try:
                self.put_path.durable(topic, r.partition, r.log_end, now, cuts)
            except errors.MetaqError as exc:
                packet = self._not_durable(packet, exc)
        if packet is not None:
            if counted and type(packet) is wire.PubAck:
                self.unacked -= 1
            self.conn.send(packet)

    def _write_run(self, run, wait):
        """A burst's PUBACKs: sent together once ``burst_durable(*wait)`` says the burst may be acknowledged (``wait``
        None: at once); one that may not be: MQTT 5 says so in each (0x80), MQTT 3.1.1 closes."""
        conn = self.conn
        data = None
        if wait is not None:
            try:
                self.burst_durable(*wait)
            except errors.MetaqError as exc:
                log.warning("mqtt %s: %d messages were written but are not acknowledged: %s", conn.peer,
                            run.count, exc)
                if conn.version != MQTT_5:
                    conn.close()
                    return
                data = b"".join(encode(wire.PubAck(i, wire.UNSPECIFIED_ERROR), MQTT_5) for i in run.ids)
        self.unacked -= run.count
        conn.send_bytes(run.encoded() if data is None else data)

    def _not_durable(self, packet, exc):
        """The put of ``packet`` was written but may not be acknowledged (a failed flush, a lost lease): MQTT 5 says
        so in the acknowledgement (0x80), MQTT 3.1.1 has no way to: the connection closes, the client resends."""
        conn = self.conn
        if type(packet) is wire.PubRel:  # the PUBREC's record: the client, back, is sent the PUBREL again
            log.warning("mqtt %s: a PUBREC was written but may not be counted on: %s; closing", conn.peer, exc)
            conn.close()
            return None
        log.warning("mqtt %s: a message was written but is not acknowledged: %s", conn.peer, exc)
        if type(packet) is wire.PubRec:
            conn.mqtt.qos2_released(packet.packet_id)
            self.unacked -= 1
        if conn.version == MQTT_5:
            return type(packet)(packet.packet_id, wire.UNSPECIFIED_ERROR)
        conn.close()
        return None


class PubAckRun:
    """A burst's PUBACKs: one entry of the acknowledgement queue, sent in one write. Made from their packet ids, in
    order, or from their bytes as the reader's split made them (``wire.read_publishes``: ``encoded``), the ids then
    read back from those only when needed (a refused flush)."""

    __slots__ = ("_ids", "_data", "count")

    def __init__(self, ids=None, encoded=None):
        self._ids = ids
        self._data = encoded
        self.count = len(ids) if encoded is None else len(encoded) >> 2

    @property
    def ids(self):
        if self._ids is None:
            data = self._data
            self._ids = [(data[i + 2] << 8) | data[i + 3] for i in range(0, len(data), 4)]
        return self._ids

    def encoded(self):
        data = self._data
        return wire.encode_pubacks(self._ids) if data is None else data
