"""One MQTT connection: its packets read and answered, in the order they came (docs/mqtt.md).

The connection's greenlet reads (``Connection.receive``: the idle timeout, here 1.5 x the client's Keep Alive, the
request deadline, the login deadline; an idle connection parks, holding no greenlet until bytes arrive), parses
(``wire.MqttParser``, the packet size bounded before a body is kept) and handles each packet:

* **CONNECT** first (any other packet first, or a second CONNECT, closes: the parser's refusal, with the MQTT 5
  reason code where one exists); the client id's rules (empty: MQTT 5 gets one assigned; too long or holding a
  control character: 0x85 / 0x02), the user name and password through the guard (``Guard.login_with_secret``, the
  decision HTTP Basic takes too; refused: 0x86 / 0x04, then closed), the takeover of a client id (``MqttPort.claim``);
  CONNACK says what the broker allows (Receive Maximum, Maximum Packet Size, Topic Alias Maximum; retained
  messages, shared subscriptions and subscription identifiers are served, enhanced authentication is not); the
  client's own Topic Alias Maximum gives the connection its table of aliases the broker sends
  (``topics.OutboundAliases``, within ``mqtt.max_outbound_aliases``); a Keep Alive past ``mqtt.max_keep_alive_s``
  (or none) is answered Server Keep Alive (MQTT 5) or refused 0x02 (MQTT 3.1.1) (``_keep_alive``). A
  slave refuses a CONNECT that needs a persistent session (one that outlives the connection, or resumes one): it
  writes no session records, so the session would be lost; MQTT 5 gets 0x9C Use another server with the master's
  address as Server Reference when it is known, MQTT 3.1.1 0x03 Server unavailable.
* **PUBLISH**: stored through the port's put (the put path's one write decision); QoS 1's PUBACK and QoS 2's PUBREC
  go out through the acknowledgement writer, in the order the PUBLISHes came, once the put may be acknowledged as
  a text ``put`` would be (``PutPath.ack_mode`` / ``durable``: the flush and replication modes). The QoS 0 and 1
  PUBLISHes one read brings (not retained) are gathered as a burst (``limits.MQTT_PUBLISH_BURST``,
  ``MQTT_PUBLISH_BURST_BYTES``), their write decision asked as each comes, and stored together through the store's
  burst path (``MqttPort.write_burst``) before any other packet is handled, the reader yields or answers; their
  PUBACKs go out together once the burst may be acknowledged. The plain ones (no properties, of a name staged in this
  turn, to a topic the decision let through) are split from the buffer and staged in one step
  (``wire.MqttParser.plain_publishes``, in C when the helper is built), each as ``MqttPort.stage`` stages it. A PUBLISH
  the burst cannot store (the disk, a record too large) is refused as alone, those before it stored and acknowledged,
  those after it put one by one. A QoS 2 resend of a packet id not yet released is answered PUBREC and not stored again
  (``session.MqttSession``). A refusal: MQTT 5 QoS 1/2 get the reason code in the PUBACK/PUBREC (0x87 not authorized,
  0x90 topic name invalid, 0x97 quota exceeded, 0x80), MQTT 5 QoS 0 is dropped (logged), MQTT 3.1.1 (which has no
  negative acknowledgement) is closed.
* **SUBSCRIBE / UNSUBSCRIBE**: each filter's permission asked of the guard; the delivery (``delivery.Delivery``,
  a greenlet of its own while it has work; a partition it is caught up on at QoS 0 is written by the port's
  fan-out reader of it) reads the topics the subscriptions read from their end.
* **PINGREQ**, **DISCONNECT** (0x00: no will; 0x04 or none: the will is published), the acknowledgements of
  deliveries (PUBACK, PUBREC, PUBCOMP) and the PUBREL of a QoS 2 PUBLISH.

Bad input is answered as the specification says and closed, one log line, never a traceback.
"""

import logging
import os
import time
from collections import deque

import gevent
from gevent.event import Event
from gevent.lock import Semaphore

from metaq import errors, limits
from metaq.mqtt import wire
from metaq.mqtt.delivery import Delivery
from metaq.mqtt.records import RecordRefusal, placement, plain_plan, stored_message
from metaq.mqtt.session import PUBLISH_SENT, PUBREL_SENT, MqttSession
from metaq.mqtt.topics import OutboundAliases
from metaq.mqtt.wire import MQTT_5, MqttError, MqttParser, encode, refusal
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.server import connections as core
from metaq.server.clock import now_ms
from metaq.server.putpath import ACK_NOW

log = logging.getLogger(__name__)

#: MQTT 3.1.1's CONNACK return code for an MQTT 5 CONNACK reason code (the others have none: closed without one).
CONNACK_311 = {wire.CLIENT_ID_NOT_VALID: 0x02, wire.BAD_USER_NAME_OR_PASSWORD: 0x04, wire.NOT_AUTHORIZED: 0x05,
               wire.SERVER_UNAVAILABLE: 0x03, wire.QUOTA_EXCEEDED: 0x03, wire.USE_ANOTHER_SERVER: 0x03}
#: Longest Reason String a refused PUBACK or PUBREC carries (the refusal's words, cut).
MAX_REASON_CHARS = 256
#: MQTT 3.1.1's SUBACK failure.
SUBACK_FAILURE_311 = 0x80
#: Topic names a connection keeps the staging plan of (``records.plain_plan``: their plain PUBLISHes are split and
#: staged in one step, ``wire.MqttParser.plain_publishes``): a device publishes to a few; past the count the plans
#: start again.
MQTT_PLAIN_PLANS = 32


def reason_of(exc):
    """The MQTT 5 reason code of a refused put or subscribe (a MetaqError or a ``records.RecordRefusal``)."""
    if isinstance(exc, RecordRefusal):
        return wire.TOPIC_NAME_INVALID if exc.what == "topic" else wire.IMPLEMENTATION_SPECIFIC_ERROR
    if isinstance(exc, (errors.Forbidden, errors.Unauthenticated)):
        return wire.NOT_AUTHORIZED
    if isinstance(exc, errors.QuotaExceeded):
        return wire.QUOTA_EXCEEDED
    if isinstance(exc, errors.InvalidTopic):
        return wire.TOPIC_NAME_INVALID
    if isinstance(exc, errors.ClientError):
        return wire.IMPLEMENTATION_SPECIFIC_ERROR
    return wire.UNSPECIFIED_ERROR


class Connection(core.Connection):
    """One MQTT client's connection (see the module doc). ``mqtt`` is its ``MqttSession`` once connected."""

    log_prefix = "mqtt"
    __slots__ = ("port", "settings", "parser", "version", "mqtt", "will", "expiry_s", "client_receive_max",
                 "client_max_packet", "problem_information", "room", "_write_lock", "_acks", "_acks_pending",
                 "_ack_sent", "_writer", "_delivery", "_unacked_in", "_aliases", "_handling",
                 "_ended_cleanly", "_taken_over", "_decided", "_burst", "_burst_bytes", "_burst_now", "_unsent",
                 "_plans", "outbound_aliases")

    def __init__(self, sock, address, conn_id, port):
        super().__init__(sock, address, conn_id, port.core.rules)
        self.port = port
        self.settings = port.settings
        self.parser = MqttParser(max_packet=self.settings.max_packet_bytes, sender="client")
        self.version = None
        self.mqtt = None  # the MqttSession, once connected
        self.will = None
        self.expiry_s = 0  # the session's expiry interval (MQTT 5): what a will's delay is bounded by
        self.client_receive_max = 65535  # the client's Receive Maximum: our QoS 1/2 deliveries in flight
        self.client_max_packet = None  # the client's Maximum Packet Size: larger deliveries are dropped
        self.problem_information = True  # MQTT 5 Request Problem Information: refusals carry a Reason String
        self.room = None  # an Event once subscribed: set when an acknowledgement or a subscription lets it go on
        self._write_lock = Semaphore()
        self._unsent = None  # what a try_send left of its packet: written before anything else
        self._acks = None  # acknowledgements in the order of their packets, (packet, wait, counted): a deque once one
        self._acks_pending = 0
        self._ack_sent = None  # an Event once waited on: set by the acknowledgement writer after each acknowledgement
        self._writer = None  # the acknowledgement writer's greenlet while acknowledgements wait (_queue_ack)
        self._delivery = None  # the Delivery, once the client subscribed (its greenlet runs while it has work)
        self._unacked_in = 0  # the client's QoS 1/2 PUBLISHes not yet acknowledged (QoS 2: until its PUBREL)
        self._aliases = {}  # topic alias -> topic name (MQTT 5, this connection's)
        self.outbound_aliases = None  # the topic aliases the broker sends it (an OutboundAliases), when it allows them
        self._handling = False
        self._ended_cleanly = False  # DISCONNECT 0x00: no will
        self._taken_over = False
        self._decided = {}  # metaq topic -> its partitions: those the write decision let through since the last yield
        self._burst = []  # PUBLISHes staged, not yet stored: (topic, partition, flag, data, packet, name)
        self._burst_bytes = 0
        self._burst_now = 0  # the burst's time (epoch ms): its records' store time
        self._plans = None  # name bytes -> records.plain_plan of names staged this turn: a dict once one is (_plan)

    @property
    def busy(self):
        """A packet being handled or acknowledgements waiting for their put's durability (a shutdown lets them
        finish)."""
        return self._handling or self._acks_pending > 0

    def await_login(self, host, arrived):
        """Until its CONNECT logs it in, a packet may be only ``limits.MAX_PRELOGIN_BODY_BYTES``."""
        super().await_login(host, arrived)
        self.parser.max_packet = min(self.parser.max_packet, limits.MAX_PRELOGIN_BODY_BYTES)

    def login_done(self):
        self.parser.max_packet = self.settings.max_packet_bytes

    # -- writing ---------------------------------------------------------------

    def send(self, packet):
        """Send one packet (encoded in the connection's version); False when the connection is closed or the send
        failed (then it closes)."""
        return False if self.closed else self.send_bytes(encode(packet, self.version))

    def send_bytes(self, data):
        """Send an encoded packet, whole, under the write lock (the reader's answers, the acknowledgement writer and
        the delivery share the socket), after what a ``try_send`` left unsent; False when the connection is closed
        or the send failed (then it closes)."""
        if self.closed:
            return False
        with self._write_lock:
            return self._write_all(data)

    def send_made(self, make):
        """``send_bytes`` of the packet ``make()`` returns, made under the write lock: what it decides (the topic alias
        a delivery sends, ``OutboundAliases``) is decided in the order the packets are written, whichever writer
        comes first."""
        if self.closed:
            return False
        with self._write_lock:
            return self._write_all(make())

    def _write_all(self, data):
        """``send_bytes``'s write, the write lock held."""
        try:
            rest = self._unsent
            if rest is not None:
                self._unsent = None
                self.sock.sendall(rest)
            self.sock.sendall(data)
        except OSError as exc:
            log.info("mqtt %s: send failed (%s); closing", self.peer, exc)
            self.close()
            return False
        return True

    def try_send(self, data):
        """Write an encoded packet now, never waiting for the socket or the write lock (a fan-out reader writes one
        message to many connections and waits for none): ``len(data)`` when all of it went; 0 when none did (the
        socket's buffer is full, another writer holds the lock, or what an earlier ``try_send`` left is still
        unsent); None when the connection is closed, the send failed (then it closes) or is TLS (written only by
        ``send_bytes``); else the bytes written: the rest is kept on the connection and goes before anything else
        written to it (``send_bytes``, ``flush_unsent``), so no writer ever waits on a lock a stalled one holds."""
        if self.closed or self.tls:
            return None
        lock = self._write_lock
        if not lock.acquire(blocking=False):
            return 0
        try:
            rest = self._unsent
            if rest is not None:
                n = self._send_now(rest)
                if n < len(rest):
                    self._unsent = rest[n:]
                    return 0
                self._unsent = None
            n = self._send_now(data)
            if 0 < n < len(data):
                self._unsent = data[n:]
            return n
        except OSError as exc:
            log.info("mqtt %s: send failed (%s); closing", self.peer, exc)
            self.close()
            return None
        finally:
            lock.release()

    def _send_now(self, data):
        try:
            return self.sock.send(data, 0, 0.0)
        except BlockingIOError:
            return 0

    def fan_fd(self):
        """The socket's file descriptor when packets may be written to it now by descriptor (a fan-out reader's
        ``send_each``), else None (it writes through ``try_send``): open, not TLS (an SSL socket encrypts what it
        writes), no writer inside a packet (the write lock free) and nothing a partial write left. The caller writes
        before it yields, so no other writer can come in between."""
        if self.closed or self.tls or self._unsent is not None or self._write_lock.locked():
            return None
        fd = self.sock.fileno()
        return fd if fd >= 0 else None

    def keep_unsent(self, rest):
        """What a write by descriptor (``fan_fd``, no yield since) left of its last packet: written before anything
        else, as what a ``try_send`` leaves."""
        self._unsent = rest

    def send_failed(self, err):
        """A write by descriptor failed with errno ``err``: the connection closes, as when ``try_send`` fails."""
        log.info("mqtt %s: send failed (%s); closing", self.peer, os.strerror(err))
        self.close()

    @property
    def unsent(self):
        """True while part of a packet a ``try_send`` began is still to be written (``flush_unsent``)."""
        return self._unsent is not None

    def flush_unsent(self):
        """Write what a ``try_send`` left of its packet, waiting for the socket; False when the connection is closed
        or the send failed (then it closes)."""
        if self.closed:
            return False
        if self._unsent is None:
            return True
        return self.send_bytes(b"")

    def _queue_ack(self, packet, wait=None, counted=False):
        """Send ``packet`` after every acknowledgement queued before it, once ``wait`` (``(topic, PutResult, now,
        cuts)`` of a put not yet acknowledgeable, ``cuts`` the log's ``log_cuts`` read right after its write: the
        wait begins later, in the writer's greenlet) may be acknowledged; ``counted``: it ends one of the client's
        unacknowledged PUBLISHes."""
        if wait is None and type(packet) is _PubAckRun and self._writer is None and not self._acks \
                and self._ack_now(packet):
            return
        self._acks_pending += 1
        if self._acks is None:
            self._acks = deque()
        self._acks.append((packet, wait, counted))
        if self._writer is None:
            self._writer = gevent.spawn(self._write_acks)

    def _ack_now(self, run):
        """Write a burst's PUBACKs from the reader's turn, nothing being queued before them, when the socket takes
        them without waiting (``try_send``): the common case of a burst acknowledged at once (flush async) needs no
        writer greenlet. A part written: the writer finishes it before anything else. False when they must be queued
        instead (TLS, the socket's buffer full, another writer inside a packet)."""
        data = run.encoded()
        sent = self.try_send(data)
        if not sent:
            return False
        self._unacked_in -= len(run.ids)
        if sent < len(data):
            self._queue_ack(b"")  # ``send_bytes`` writes what ``try_send`` left first
        if self._ack_sent is not None:
            self._ack_sent.set()
        return True

    def _write_acks(self):
        """The acknowledgement writer: sends what ``_queue_ack`` queued, in order, and ends when none is left (the
        next ``_queue_ack`` starts it again), so that an idle connection, most of a device fleet's, holds no
        greenlet for it."""
        path, acks = self.port.put_path, self._acks
        try:
            while acks:
                self._write_ack(path, *acks.popleft())
        finally:
            self._writer = None

    def _write_ack(self, path, packet, wait, counted):
        if type(packet) is _PubAckRun:
            return self._write_run(packet, wait)
        if type(packet) is bytes:  # an answer encoded when it was queued (it must follow the acknowledgements), or
            try:  # the rest of a PUBACK run ``_ack_now`` began
                self.send_bytes(packet)
            finally:
                self._acks_pending -= 1
                if self._ack_sent is not None:
                    self._ack_sent.set()
            return
        try:
            if wait is not None:
                topic, r, now, cuts = wait
                try:
                    path.durable(topic, r.partition, r.log_end, now, cuts)
                except errors.MetaqError as exc:
                    packet = self._not_durable(packet, exc)
            if packet is not None:
                if counted and type(packet) is wire.PubAck:
                    self._unacked_in -= 1
                self.send(packet)
        finally:
            self._acks_pending -= 1
            if self._ack_sent is not None:
                self._ack_sent.set()

    def _write_run(self, run, wait):
        """A burst's PUBACKs: sent together once ``port.burst_durable(*wait)`` says the burst may be acknowledged
        (``wait`` None: at once); one that may not be: MQTT 5 says so in each (0x80), MQTT 3.1.1 closes."""
        try:
            data = None
            if wait is not None:
                try:
                    self.port.burst_durable(*wait)
                except errors.MetaqError as exc:
                    log.warning("mqtt %s: %d messages were written but are not acknowledged: %s", self.peer,
                                len(run.ids), exc)
                    if self.version != MQTT_5:
                        self.close()
                        return
                    data = b"".join(encode(wire.PubAck(i, wire.UNSPECIFIED_ERROR), MQTT_5) for i in run.ids)
            self._unacked_in -= len(run.ids)
            self.send_bytes(run.encoded() if data is None else data)
        finally:
            self._acks_pending -= 1
            if self._ack_sent is not None:
                self._ack_sent.set()

    def _not_durable(self, packet, exc):
        """The put of ``packet`` was written but may not be acknowledged (a failed flush, a lost lease): MQTT 5 says
        so in the acknowledgement (0x80), MQTT 3.1.1 has no way to: the connection closes, the client resends."""
        if type(packet) is wire.PubRel:  # the PUBREC's record: the client, back, is sent the PUBREL again
            log.warning("mqtt %s: a PUBREC was written but may not be counted on: %s; closing", self.peer, exc)
            self.close()
            return None
        log.warning("mqtt %s: a message was written but is not acknowledged: %s", self.peer, exc)
        if type(packet) is wire.PubRec:
            self.mqtt.qos2_released(packet.packet_id)
            self._unacked_in -= 1
        if self.version == MQTT_5:
            return type(packet)(packet.packet_id, wire.UNSPECIFIED_ERROR)
        self.close()
        return None

    def _disconnect(self, code, why):
        """Close for ``why``: the PUBLISHes before it stored, then MQTT 5 sends DISCONNECT ``code`` after the
        acknowledgements queued before it; one log line. Returns False (stop reading)."""
        self._flush_burst()
        log.info("mqtt %s: %s; closing", self.peer, why)
        if self.version == MQTT_5:
            self._send_in_order(encode(wire.Disconnect(code), MQTT_5))
        return False

    def _send_in_order(self, data):
        """Send encoded ``data`` after the acknowledgements queued before it (at once when none waits)."""
        if self._acks_pending:
            self._queue_ack(data)
        else:
            self.send_bytes(data)

    # -- reading ---------------------------------------------------------------

    #: An idle connection, most of a device fleet's, holds no greenlet (the connection core's ``parks``), once idle
    #: for ``limits.MQTT_PARK_AFTER_S``.
    parks = True
    park_after_s = limits.MQTT_PARK_AFTER_S
    #: [MQTT-3.1.2-24]: a packet begun whose bytes stop for 1.5 x Keep Alive closes the connection as a network
    #: failure (its will fires), before the request deadline; Keep Alive bounds the time from the end of one packet
    #: to the start of the next (3.1.2.10), not a packet's transmission: one arriving steadily is served.
    idle_bounds_partial = True

    def serve(self):
        """One turn (``parks``): read and handle packets until the connection is idle (parked: this returns, the
        core calls it again when bytes arrive) or ends (then ``_end``)."""
        parked = False
        try:
            data = self.receive()
            parked = data is core.PARKED
            if parked or (data is not None and self.version is None and not self.parser.buffered
                          and self.tls_hello(data)):  # its first bytes: nothing parsed before them
                return
            while data is not None and not self.closed:
                self.parser.receive_data(data)
                self._handling = True
                try:
                    if not self._process() or not data:
                        return
                finally:
                    self._handling = False
                if self.port.closing:
                    return
                data = self.receive()
                parked = data is core.PARKED
                if parked:
                    return
        finally:
            if not parked:
                self._end()
            else:
                self._plans = None  # an idle connection holds no staging plan: its next turn makes them again

    def _process(self):  # noqa: C901 - to split with the connection by operation group
        """Handle every whole packet buffered; False when the connection must close. The PUBLISHes among them ask
        the write decision once per metaq topic (``MqttPort.put``'s ``decided``) until the reader yields: a turn
        given to the others, a wait, a packet other than PUBLISH, a failed put."""
        turn = None
        decided = self._decided
        decided.clear()
        parser = self.parser
        try:
            while True:
                plans = self._plans
                if plans and decided:  # plain PUBLISHes of names staged before: split and staged in one step
                    staged, qos1, nbytes = parser.plain_publishes(
                        plans, decided, self.settings.receive_maximum - self._unacked_in,
                        limits.MQTT_PUBLISH_BURST - len(self._burst),
                        limits.MQTT_PUBLISH_BURST_BYTES - self._burst_bytes)
                    if staged:
                        if not self._stage_plain(staged, qos1, nbytes) or self.closed:
                            return False
                        started = turn if turn is not None else _now()
                        if _now() - started < limits.MAX_TURN_MS / 1000.0:
                            turn = started
                            continue
                        if self._burst and not self._flush_burst():
                            return False
                        turn = core.share_loop(started)
                        decided.clear()
                        continue
                try:
                    packet = parser.next_event()
                except MqttError as exc:
                    self._flush_burst()  # the PUBLISHes before the bad packet are stored and acknowledged
                    self._refuse(exc)
                    return False
                if packet is NEED_DATA:
                    return self._flush_burst()
                if packet is CLOSED:
                    self._flush_burst()
                    return False
                if type(packet) is not wire.Publish:
                    decided.clear()
                    if self._burst and not self._flush_burst():
                        return False
                try:
                    if not self._handle(packet):
                        return False
                except Exception:  # noqa: BLE001 - the one place an unexpected error ends a connection
                    log.exception("mqtt %s: unexpected error handling %s", self.peer, type(packet).__name__)
                    self._burst = []
                    if self.version == MQTT_5:
                        self.send(wire.Disconnect(wire.UNSPECIFIED_ERROR))
                    return False
                if self.closed:
                    return False
                started = turn if turn is not None else _now()
                if _now() - started < limits.MAX_TURN_MS / 1000.0:  # one reading of the clock decides both
                    turn = started
                    continue
                if self._burst and not self._flush_burst():
                    return False  # stored before the others run
                turn = core.share_loop(started)  # the turn is over: it yields
                decided.clear()  # the others ran: the decision may have changed
        finally:
            self._burst = []  # not stored: the connection closes without acknowledging them

    def _refuse(self, exc):
        """A packet the codec refused: its answer (CONNACK, DISCONNECT or nothing), then close; one log line."""
        log.info("mqtt %s: %s (reason 0x%02X); closing", self.peer, exc.reason, exc.reason_code)
        answer = refusal(exc)
        if answer is not None and not self.closed:
            self._send_in_order(encode(answer, exc.version))

    def _handle(self, p):
        kind = type(p)
        if kind is wire.Publish:
            return self._publish(p)
        if kind is wire.PubAck:
            if self.mqtt.acknowledged(p.packet_id, PUBLISH_SENT):
                self._freed_room()
            return True
        if kind is wire.PubRec:
            return self._pubrec(p)
        if kind is wire.PubComp:
            if self.mqtt.acknowledged(p.packet_id, PUBREL_SENT):
                self._freed_room()
            return True
        if kind is wire.PubRel:
            if self.mqtt.qos2_released(p.packet_id):
                self._unacked_in -= 1
                if self.mqtt.persistent:
                    self.port.save(self.mqtt)  # released before PUBCOMP: the client may use the id again
            # an unknown id still gets PUBCOMP: it may be a resend after the PUBCOMP was lost
            self._queue_ack(wire.PubComp(p.packet_id))
            return True
        if kind is wire.Subscribe:
            return self._subscribe(p)
        if kind is wire.Unsubscribe:
            return self._unsubscribe(p)
        if kind is wire.PingReq:
            return self.send(wire.PingResp())
        if kind is wire.Disconnect:
            return self._client_disconnect(p)
        if kind is wire.Connect:
            return self._connect(p)
        return self._disconnect(wire.PROTOCOL_ERROR, "%s is not expected from a client" % kind.__name__)

    # -- CONNECT -----------------------------------------------------------------

    def _refuse_connect(self, code, why, props=None):
        """Answer the CONNECT with ``code`` (its 3.1.1 return code in 3.1.1), then close; one log line."""
        log.info("mqtt %s: CONNECT refused: %s (reason 0x%02X); closing", self.peer, why, code)
        if self.version == MQTT_5:
            self.send(wire.Connack(False, code, props or {}))
        elif code in CONNACK_311:
            self.send(wire.Connack(False, CONNACK_311[code]))
        return False

    def _connect(self, p):  # noqa: C901 - to split with the connection by operation group
        self.version = p.version
        s = self.settings
        v5 = p.version == MQTT_5
        if v5 and "authentication_method" in p.properties:
            return self._refuse_connect(wire.BAD_AUTHENTICATION_METHOD, "enhanced authentication (%s) is not supported"
                                        % p.properties["authentication_method"])
        client_id = p.client_id
        if len(client_id.encode("utf-8")) > s.max_client_id_bytes:
            return self._refuse_connect(wire.CLIENT_ID_NOT_VALID, "a client identifier of %d bytes is past the limit "
                                        "of %d (mqtt.max_client_id_bytes)" % (len(client_id.encode("utf-8")),
                                                                             s.max_client_id_bytes))
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in client_id):
            return self._refuse_connect(wire.CLIENT_ID_NOT_VALID, "a client identifier holding a control character")
        assigned = not client_id
        if assigned:
            client_id = self.port.assign_id()
        if not self._login(p):
            return False
        will = p.will
        if will is not None:
            try:
                placement(self.port.topics, will.topic)
            except RecordRefusal as exc:
                return self._refuse_connect(wire.TOPIC_NAME_INVALID, "will topic %r: %s" % (will.topic, exc))
        self.will = will
        self.expiry_s = p.properties.get("session_expiry_interval", 0) if v5 else 0
        refusal = self.port.session_refusal()
        if refusal is not None and ((self.expiry_s if v5 else not p.clean_start) or
                                    (not p.clean_start and client_id in self.port.table.sessions)):
            return self._use_another_server(client_id, refusal)
        self.client_receive_max = p.properties.get("receive_maximum", 65535)
        self.client_max_packet = p.properties.get("maximum_packet_size")
        self.problem_information = p.properties.get("request_problem_information", 1) == 1
        most = min(p.properties.get("topic_alias_maximum", 0), s.max_outbound_aliases) if v5 else 0
        self.outbound_aliases = OutboundAliases(most, s.max_outbound_aliases) if most else None  # its own: none kept
        keep_alive = self._keep_alive(p.keep_alive)
        if keep_alive is None:
            return False
        if keep_alive:
            self.idle_timeout = keep_alive * 1.5  # [MQTT-3.1.2-24]: closed as a network failure, the will fires
        refused = self.port.join_cluster(client_id, p.clean_start, self.session.user)  # the cluster's id
        if refused is not None:
            return self._refuse_connect(*refused)
        refusal = self.port.claim(self, client_id, p.clean_start)
        if refusal is not None:
            return self._refuse_connect(wire.CLIENT_ID_NOT_VALID, refusal)
        session = self.mqtt = MqttSession(client_id, p.version, s.receive_maximum)
        session.user = self.session.user
        session.expiry_s = self.expiry_s if v5 else None
        session.persistent = bool(self.expiry_s) if v5 else not p.clean_start
        saved = self.port.resume(client_id, p.clean_start, session.persistent)
        if saved is not None:
            session.restore(saved)
            self._unacked_in = len(session.qos2_received)  # its QoS 2 PUBLISHes waiting for their PUBREL
        if session.persistent:
            self.port.connected(session)
        if will is not None:
            self.port.record_will(client_id, will, self.session, self._will_delay(will))
        props = {}
        if v5:
            props = {"receive_maximum": s.receive_maximum, "maximum_packet_size": s.max_packet_bytes}
            if s.topic_alias_maximum:
                props["topic_alias_maximum"] = s.topic_alias_maximum
            if keep_alive != p.keep_alive:
                props["server_keep_alive"] = keep_alive  # [MQTT-3.2.2-21]: the client uses it instead of its own
            if assigned:
                props["assigned_client_identifier"] = client_id
        if not self.send(wire.Connack(saved is not None, wire.SUCCESS, props)):
            return False
        if session.subscriptions or session.inflight or session.rejoin or session.carried:
            delivery = self._delivery_of()  # a resumed session: its messages in flight again, then what came since
            delivery.resumed()
            rejoin, session.rejoin = session.rejoin, []
            for topic_filter, granted, sub_id in rejoin:  # its shared groups joined again, permission asked again
                code = delivery.subscribe(wire.Subscription(topic_filter, granted), sub_id)
                if code > 2:
                    log.info("mqtt %s: shared subscription %s not resumed (0x%02X)", self.peer, topic_filter, code)
        return True

    def _keep_alive(self, asked):
        """The Keep Alive the connection is held to, from the CONNECT's (``asked``, seconds; 0: none) and the broker's
        bound (``mqtt.max_keep_alive_s``, 0: none): MQTT 5 past the bound, or asking for none, gets the bound (told
        in the CONNACK as Server Keep Alive); MQTT 3.1.1, which cannot be told, is refused with 0x02 as Mosquitto's
        ``max_keepalive`` refuses it (None: answered, closing)."""
        bound = self.settings.max_keep_alive_s
        if not bound or 0 < asked <= bound:
            return asked
        if self.version == MQTT_5:
            return bound
        self._refuse_connect(wire.CLIENT_ID_NOT_VALID, "a Keep Alive of %s is past the bound of %d s "
                             "(mqtt.max_keep_alive_s), and MQTT 3.1.1 cannot be told another"
                             % ("%d s" % asked if asked else "0 (none)", bound))
        return None

    def _use_another_server(self, client_id, refusal):
        """A broker that keeps no session now (``MqttPort.session_refusal``: a slave, or a master that may not
        acknowledge) cannot keep a persistent session: refused, the master named."""
        master = self.port.master_reference()
        props = {"server_reference": master} if master else {}
        return self._refuse_connect(wire.USE_ANOTHER_SERVER, "client %s asks for a persistent session and this broker "
                                    "keeps none now (%s): connect to the master%s"
                                    % (client_id, refusal, " (%s)" % master if master else ""), props)

    def _login(self, p):
        """The CONNECT's user name and password through the guard (authentication on); False: refused, answered."""
        guard = self.port.guard
        if not guard.enabled:
            return True
        if p.username is None:
            return self._refuse_connect(wire.NOT_AUTHORIZED, "no user name (authentication is on)")
        try:
            guard.login_with_secret(self.session, p.username, p.password or b"", "mqtt")
        except errors.QuotaExceeded as exc:
            return self._refuse_connect(wire.QUOTA_EXCEEDED, str(exc))
        except errors.Unauthenticated as exc:
            return self._refuse_connect(wire.BAD_USER_NAME_OR_PASSWORD, str(exc))
        return True

    def take_over(self):
        """Another connection took this client id: MQTT 5 is told DISCONNECT 0x8E, the connection closes. Returns
        ``(will, guard session, will delay)`` for the port to publish (or drop), or None without a will."""
        self._taken_over = True
        if self.mqtt.persistent:
            self.port.taken_over(self.mqtt)  # saved now, and handed to the new connection as it stands
        log.info("mqtt %s: client %s connected again from another connection; closing this one", self.peer,
                 self.mqtt.client_id)
        if self.version == MQTT_5:
            self.send(wire.Disconnect(wire.SESSION_TAKEN_OVER))
        self.close()
        will, self.will = self.will, None
        return (will, self.session, self._will_delay(will)) if will is not None else None

    def keeps_state(self):
        """True when this connection holds what only a master keeps: a persistent session or a will."""
        return self.mqtt is not None and (self.mqtt.persistent or self.will is not None)

    def move_away(self, reference):
        """This broker stopped keeping sessions (``MqttPort.session_refusal``): MQTT 5 is told DISCONNECT 0x9C Use
        another server (Server Reference: the master's MQTT address, ``reference``, when known), MQTT 3.1.1 is just
        closed. The connection ends as a network failure: its will is left to the master (it is in the log)."""
        log.info("mqtt %s: client %s: this broker keeps no session now; closing%s", self.peer, self.mqtt.client_id,
                 " (the master is %s)" % reference if reference else "")
        if self.version == MQTT_5:
            self.send(wire.Disconnect(wire.USE_ANOTHER_SERVER, {"server_reference": reference} if reference else {}))
        self.close()

    def _will_delay(self, will):
        if self.version != MQTT_5:
            return 0
        return min(will.properties.get("will_delay_interval", 0), self.expiry_s)

    def _client_disconnect(self, p):
        expiry = p.properties.get("session_expiry_interval")
        if expiry is not None:
            if self.expiry_s == 0 and expiry:
                return self._disconnect(wire.PROTOCOL_ERROR, "a DISCONNECT may not set a session expiry when the "
                                        "CONNECT's was 0")
            self.expiry_s = expiry
            self.mqtt.expiry_s = expiry
            self.mqtt.persistent = bool(expiry)
        self._ended_cleanly = p.reason_code == wire.SUCCESS  # 0x04: disconnect with will message
        return False

    def _end(self):
        """The connection ends: its acknowledgements finish, its will is published (not after a normal DISCONNECT),
        its client id is free again."""
        if self._acks_pending and not self.closed:
            deadline = _now() + self.request_timeout
            while self._acks_pending and not self.closed and _now() < deadline:
                gevent.sleep(0.01)
        if self._writer is not None:
            self._writer.kill(block=False)
        if self._delivery is not None:
            self._delivery.stop()
        self.close()
        if self.mqtt is None:
            return
        self.port.release(self, self.mqtt.client_id)
        if not self._taken_over:
            if self.mqtt.persistent:
                self.port.went_offline(self.mqtt)  # its shared subscriptions with it, before it leaves their groups
            elif not self.port.holds(self.mqtt.client_id):
                self.port.end_session(self.mqtt.client_id)  # a resumed session with no expiry ends with its connection
        for topic_filter in list(self.mqtt.shared):
            self._leave(topic_filter)
        will, self.will = self.will, None
        if will is not None and not self._taken_over:
            if self._ended_cleanly:
                self.port.will_done(self.mqtt.client_id)
            else:
                self.port.connection_lost(self.mqtt.client_id, will, self.session, self._will_delay(will))

    def close(self):
        super().close()
        self._wake()  # the delivery sees it at once

    # -- PUBLISH -------------------------------------------------------------------

    def _publish(self, p):
        s = self.settings
        v5 = self.version == MQTT_5
        name = p.topic
        alias = p.properties.get("topic_alias") if v5 else None
        if alias is not None:
            if alias > s.topic_alias_maximum:
                return self._disconnect(wire.TOPIC_ALIAS_INVALID, "topic alias %d is past the maximum of %d "
                                        "(mqtt.topic_alias_maximum)" % (alias, s.topic_alias_maximum))
            if name:
                self._aliases[alias] = name
            else:
                name = self._aliases.get(alias)
                if name is None:
                    return self._disconnect(wire.PROTOCOL_ERROR, "topic alias %d was never set" % alias)
        if p.qos == 2 or p.retain:
            return self._flush_burst() and self._publish_one(p, name)
        if p.qos and self._unacked_in >= s.receive_maximum:
            if self.version != MQTT_5:
                if not self._flush_burst():
                    return False
                self._wait_for_acks()  # MQTT 3.1.1 has no Receive Maximum: its client waits for our acks instead
            if self._unacked_in >= s.receive_maximum:
                return self._disconnect(wire.RECEIVE_MAXIMUM_EXCEEDED, "more than %d QoS 1 and 2 PUBLISHes "
                                        "unacknowledged (mqtt.receive_maximum)" % s.receive_maximum)
        burst = self._burst
        now = self._burst_now if burst else now_ms()
        try:
            topic, partition, flag, data = self.port.stage(name, p.payload, p.qos, self.mqtt.client_id, p.properties,
                                                           self.session, self._decided, now)
        except (RecordRefusal, errors.MetaqError) as exc:
            self._decided.clear()
            return self._flush_burst() and self._publish_refused(p, name, exc)
        self._burst_now = now
        burst.append((topic, partition, flag, data, p, name))
        if p.qos:
            self._unacked_in += 1
        self._burst_bytes += len(data)
        if not p.properties:
            self._plan(name)
        if len(burst) >= limits.MQTT_PUBLISH_BURST or self._burst_bytes >= limits.MQTT_PUBLISH_BURST_BYTES:
            return self._flush_burst()
        return True

    def _plan(self, name):
        """Remember the staging plan of ``name``, just staged from a PUBLISH without properties (so a valid topic
        name, a valid metaq topic): its next plain PUBLISHes are split and staged in one step (``_stage_plain``)."""
        if self._plans is None:
            self._plans = {}
        remember_plan(self._plans, self.port.topics, name, self.mqtt.client_id)

    def _stage_plain(self, staged, qos1, nbytes):
        """Add ``wire.MqttParser.plain_publishes``'s entries (``qos1`` of them at QoS 1, ``nbytes`` of records) to
        the burst, as ``_publish`` adds each: what ``MqttPort.stage`` gives and the packet, the write decision being
        ``decided``'s (the split takes only names of topics it let through), the QoS 1 ones within
        ``mqtt.receive_maximum``. False when the connection must close."""
        burst = self._burst
        if not burst:
            self._burst_now = now_ms()
        burst.extend(staged)
        self._unacked_in += qos1
        self._burst_bytes += nbytes
        if len(burst) >= limits.MQTT_PUBLISH_BURST or self._burst_bytes >= limits.MQTT_PUBLISH_BURST_BYTES:
            return self._flush_burst()
        return True

    def _flush_burst(self):
        """Store the staged PUBLISHes (``MqttPort.write_burst``), in order, and queue the PUBACKs of its QoS 1 ones as
        one run, sent once the burst may be acknowledged. Where the store refuses one, it is answered as a refused
        PUBLISH and those after it are put one by one. False when the connection must close."""
        burst = self._burst
        if not burst:
            return True
        self._burst = []
        self._burst_bytes = 0
        now = self._burst_now
        runs = []
        stored, log_end, keys, exc = self.port.write_burst(burst, now, runs)
        cuts = self.port.store.log_cuts  # nothing yielded since the writes: their wait begins later
        if stored:
            client_id = self.mqtt.client_id
            # visible now (flush async): its subscribers waiting for it get it from here
            mode = self.port.burst_mode(keys, now, lambda: self.port.deliver_now(keys, burst, runs, lambda k: (
                stored_message(burst[k][5], burst[k][4].payload, burst[k][4].qos, client_id, burst[k][4].properties,
                               False, now))))
            self._decided.clear()  # the put path's wake may yield: the write decision is asked again after
            ids = [e[4].packet_id for e in (burst[:stored] if exc is not None else burst) if e[4].qos]
            if ids:
                self._queue_ack(_PubAckRun(ids), None if mode == ACK_NOW else (keys, log_end, now, cuts))
        if exc is None:
            return True
        self._decided.clear()
        rest = burst[stored:]
        self._unacked_in -= sum(1 for e in rest if e[4].qos)
        if not self._publish_refused(rest[0][4], rest[0][5], exc):
            return False
        for e in rest[1:]:
            if not self._publish_one(e[4], e[5]):
                return False
        return True

    def _publish_one(self, p, name):
        """A PUBLISH stored alone (QoS 2, retained, or after a refusal in a burst), answered in its order."""
        s = self.settings
        session = self.mqtt
        if p.qos == 2 and session.qos2_seen(p.packet_id):
            self._queue_ack(wire.PubRec(p.packet_id))  # a resend: stored once already
            return True
        if p.qos and self.version != MQTT_5:
            self._wait_for_acks()  # MQTT 3.1.1 has no Receive Maximum: its client waits for our acks instead
        if p.qos and (self._unacked_in >= s.receive_maximum or (p.qos == 2 and not session.qos2_room())):
            return self._disconnect(wire.RECEIVE_MAXIMUM_EXCEEDED, "more than %d QoS 1 and 2 PUBLISHes unacknowledged "
                                    "(mqtt.receive_maximum)" % s.receive_maximum)
        try:
            topic, r, now = self.port.put(name, p.payload, p.qos, session.client_id, p.properties, self.session,
                                          p.retain, self._decided)
        except (RecordRefusal, errors.MetaqError) as exc:
            self._decided.clear()
            return self._publish_refused(p, name, exc)
        cuts = self.port.store.log_cuts  # nothing yielded since the write (a session's save below may)
        self._decided.clear()  # the put path's wake below may yield: the write decision is asked again after
        if p.qos == 0:
            self.port.made_visible(topic, r, now)
            return True
        mode = self.port.put_path.ack_mode(topic, r, now)
        self._unacked_in += 1
        if p.qos == 2:
            session.qos2_stored(p.packet_id)
            if session.persistent:  # its packet id saved before the PUBREC: exactly once across a restart
                end = self.port.save(session)
                if end is not None:
                    r = r._replace(log_end=max(r.log_end, end))
        ack = wire.PubAck(p.packet_id) if p.qos == 1 else wire.PubRec(p.packet_id)
        self._queue_ack(ack, None if mode == ACK_NOW else (topic, r, now, cuts), counted=p.qos == 1)
        return True

    def _wait_for_acks(self):
        """While the client's unacknowledged PUBLISHes are at ``mqtt.receive_maximum`` and acknowledgements of ours
        are on their way (their puts' flushes), read nothing more: an MQTT 3.1.1 client, told no Receive Maximum,
        may pipeline past it, and waits in its socket instead of being closed (at most ``request_timeout_s``)."""
        deadline = _now() + self.request_timeout
        if self._ack_sent is None:
            self._ack_sent = Event()
        while (self._unacked_in >= self.settings.receive_maximum and self._acks_pending and not self.closed
               and _now() < deadline):
            self._decided.clear()  # it yields: the write decision is asked again after
            self._ack_sent.clear()
            self._ack_sent.wait(0.5)

    def _publish_refused(self, p, name, exc):
        code = reason_of(exc)
        if self.version != MQTT_5:
            log.info("mqtt %s: PUBLISH to %s refused: %s; closing (MQTT 3.1.1 has no negative acknowledgement)",
                     self.peer, name, exc)
            return False
        log.debug("mqtt %s: PUBLISH to %s refused (0x%02X): %s", self.peer, name, code, exc)
        props = {}
        if self.problem_information:  # why, in the words every other port answers with ([MQTT-3.1.2-29])
            props["reason_string"] = str(exc)[:MAX_REASON_CHARS]
        if p.qos == 1:
            self._queue_ack(wire.PubAck(p.packet_id, code, props))
        elif p.qos == 2:
            self._queue_ack(wire.PubRec(p.packet_id, code, props))
        return True

    def _pubrec(self, p):
        """The client's PUBREC of a QoS 2 delivery: PUBREL. A persistent session writes the first PUBREC of a message
        to the sessions' log before its PUBREL goes out, which waits, as a PUBACK does, until the record may be
        counted on (``MqttPort.save_first``: with ``sync`` replication the slave holds it): once the client has the
        PUBREL it may complete the exchange and use the packet id again, so a restart, a kill or a failover must
        send the PUBREL again, never the PUBLISH."""
        session = self.mqtt
        if p.reason_code >= 0x80:
            session.dropped(p.packet_id)
            self._wake()
            return True
        first = session.inflight.get(p.packet_id) == PUBLISH_SENT
        if session.received(p.packet_id):
            if first and session.persistent:
                self._queue_ack(wire.PubRel(p.packet_id), self.port.save_first(session))
            else:
                self._send_in_order(encode(wire.PubRel(p.packet_id), self.version))  # after one queued before it
            return not self.closed
        return self.send(wire.PubRel(p.packet_id, wire.PACKET_IDENTIFIER_NOT_FOUND if self.version == MQTT_5 else 0))

    # -- SUBSCRIBE -----------------------------------------------------------------

    def _subscribe(self, p):
        v5 = self.version == MQTT_5
        sub_id = p.properties.get("subscription_identifier") if v5 else None  # 0 was refused by the codec
        delivery = self._delivery_of()
        codes = []
        retained = []
        for sub in p.subscriptions:
            new = sub.topic_filter not in self.mqtt.subscriptions
            code = delivery.subscribe(sub, sub_id)
            codes.append(code)
            if code <= 2 and (sub.retain_handling == 0 or (sub.retain_handling == 1 and new)):
                retained.append((sub.topic_filter, code))
        codes = tuple(codes)
        if not v5:
            codes = tuple(c if c <= 2 else SUBACK_FAILURE_311 for c in codes)
        if self.mqtt.persistent:
            self.port.save(self.mqtt)
        ok = self.send(wire.Suback(p.packet_id, codes))
        if retained:
            delivery.retained_after_suback(retained)  # sent by the delivery, after the SUBACK
        self._wake()
        return ok

    def _wake(self):
        """Let the delivery look again (an acknowledgement, a subscription, the close); nothing before one exists."""
        if self._delivery is not None:
            self._delivery.wake()

    @property
    def inflight_window(self):
        """Most QoS 1 and 2 messages in flight to this client at once: min(``mqtt.max_inflight``, its Receive
        Maximum)."""
        return min(self.settings.max_inflight, self.client_receive_max)

    def _freed_room(self):
        """An acknowledgement freed a place in flight: the delivery is woken when a place can matter to it, that is
        when its window was full (a pass or the publisher's turn held a message for one: ``Delivery._prepare``) or
        it is in a shared group (whose turns weigh each member's room); a delivery that is caught up sleeps on
        until the next append."""
        delivery = self._delivery
        if delivery is None:
            return
        session = self.mqtt
        if session.shared or len(session.inflight) + 1 >= self.inflight_window:
            delivery.wake()

    def _delivery_of(self):
        if self._delivery is None:
            self.room = Event()
            self._delivery = Delivery(self, self.port)
            self._delivery.wake()
        return self._delivery

    def _unsubscribe(self, p):
        codes = tuple(wire.SUCCESS if self.mqtt.unsubscribe(f) or self._leave(f) else wire.NO_SUBSCRIPTION_EXISTED
                      for f in p.topic_filters)
        if self.mqtt.persistent:
            self.port.save(self.mqtt)
        return self.send(wire.Unsuback(p.packet_id, codes if self.version == MQTT_5 else ()))

    def _leave(self, topic_filter):
        """Leave the shared group of ``topic_filter`` (True when this connection was a member)."""
        held = self.mqtt.shared.pop(topic_filter, None)
        if held is None:
            return False
        self.port.leave_group(self, held[0])
        return True


def remember_plan(plans, topics, name, client_id):
    """Add ``records.plain_plan(topics, name, client_id)`` to ``plans`` under the name's bytes unless it is there;
    ``plans`` holds at most ``MQTT_PLAIN_PLANS`` names (full, it starts again)."""
    key = name.encode("utf-8")
    if key not in plans:
        if len(plans) >= MQTT_PLAIN_PLANS:
            plans.clear()
        plans[key] = plain_plan(topics, name, client_id)


def _now():
    return time.monotonic()


class _PubAckRun:
    """A burst's PUBACKs (their packet ids, in order): one entry of the acknowledgement queue, sent in one write."""

    __slots__ = ("ids",)

    def __init__(self, ids):
        self.ids = ids

    def encoded(self):
        return wire.encode_pubacks(self.ids)
