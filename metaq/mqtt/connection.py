"""One MQTT connection: its packets read and answered, in the order they came, and its socket written by whoever
sends to the client (docs/mqtt.md).

The connection's greenlet reads (``Connection.receive``: the idle timeout, here 1.5 x the client's Keep Alive, the
request deadline, the login deadline; an idle connection parks, holding no greenlet until bytes arrive), parses
(``wire.MqttParser``, the packet size bounded before a body is kept) and hands each packet to its operation group:

* **CONNECT** first (any other packet first, or a second CONNECT, closes: the parser's refusal, with the MQTT 5
  reason code where one exists): ``connect.connect`` (client id, login, will, Keep Alive, session, CONNACK).
* **PUBLISH** and the **PUBREL** of a QoS 2 PUBLISH: ``publishes.Publishes`` (topic aliases, the QoS 1/2 state, the
  burst), acknowledged in order through ``acks.Acknowledgements``.
* **SUBSCRIBE / UNSUBSCRIBE** and the acknowledgements of deliveries (PUBACK, PUBREC, PUBCOMP):
  ``subscriptions.Subscriptions``, which owns the connection's ``delivery.Delivery``.
* **PINGREQ**, **DISCONNECT** (0x00: no will; 0x04 or none: the will is published), the takeover of its client id by
  another connection and the end of the connection: here.

The socket is written by the reader's answers, the acknowledgement writer, the delivery and the port's fan-out
readers: whole packets, in order, under one write lock that a fan-out reader never waits on (``try_send``,
``fan_fd``). The C helper's writers, the delivery from a publisher's turn and a burst's PUBACKs from the reader's
(``plainturn.pubacks_now``), write by descriptor while no other writer is inside a packet (``direct_fd``), keeping what
the socket did not take for the next writer (``keep_unsent``). Bad input is answered as the specification says and
closed, one log line, never a traceback.
"""

import logging
import os
import time

from gevent.lock import Semaphore

from metaq import limits
from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt import wire
from metaq.mqtt.acks import Acknowledgements
from metaq.mqtt.connect import connect
from metaq.mqtt.publishes import Publishes
from metaq.mqtt.session import PUBLISH_SENT, PUBREL_SENT
from metaq.mqtt.subscriptions import Subscriptions
from metaq.mqtt.wire import MQTT_5, MqttError, MqttParser, encode, refusal
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.serving import connections as core

log = logging.getLogger(__name__)


class Connection(core.Connection):
    """One MQTT client's connection (see the module doc). ``mqtt`` is its ``MqttSession`` once connected; ``acks``,
    ``publishes`` and ``subscriptions`` are its operation groups."""

    log_prefix = "mqtt"
    __slots__ = ("port", "settings", "parser", "version", "mqtt", "will", "will_origin", "expiry_s",
                 "client_receive_max", "inflight_window",
                 "client_max_packet", "problem_information", "room", "outbound_aliases", "acks", "publishes",
                 "subscriptions", "_write_lock", "_unsent", "_handling", "_ended_cleanly", "_taken_over",
                 "direct_fd", "_fd", "_framed")

    def __init__(self, sock, address, conn_id, port):
        super().__init__(sock, address, conn_id, port.core.rules)
        self.port = port
        self.settings = port.settings
        self.parser = MqttParser(max_packet=self.settings.max_packet_bytes, sender="client")
        self.version = None
        self.mqtt = None  # the MqttSession, once connected
        self.will = None
        self.will_origin = None  # the will's ``SavedWill.origin`` in the sessions' log (None: not recorded)
        self.expiry_s = 0  # the session's expiry interval (MQTT 5): what a will's delay is bounded by
        self.receive_maximum(65535)  # the client's Receive Maximum until its CONNECT says one
        self.client_max_packet = None  # the client's Maximum Packet Size: larger deliveries are dropped
        self.problem_information = True  # MQTT 5 Request Problem Information: refusals carry a Reason String
        self.room = None  # an Event once subscribed: set when an acknowledgement or a subscription lets it go on
        self.outbound_aliases = None  # the topic aliases the broker sends it (an OutboundAliases), when it allows them
        self.acks = Acknowledgements(self, port.put_path, port.burst_durable)
        self.publishes = Publishes(self, port, self.acks)
        self.subscriptions = Subscriptions(self, port, self.acks)
        self._write_lock = Semaphore()
        self._unsent = None  # what a try_send left of its packet: written before anything else (b"": the stream's)
        self._fd = self.raw_sock.fileno() if self.raw_sock is not None else -1  # (TLS: never written by descriptor)
        #: a WebSocket stream's ``try_send`` (one frame written without waiting, its rest kept by the stream), or None
        self._framed = getattr(sock, "try_send", None)
        #: ``fan_fd``'s answer kept as it changes, for the writers by descriptor (the delivery, ``direct.DirectPath``;
        #: a burst's PUBACKs, ``plainturn.pubacks_now``): the socket's descriptor while packets may be written to it by
        #: descriptor, else -1 (TLS, a writer inside a packet, something unsent, closed). Set wherever the write lock
        #: is held across a wait or ``_unsent`` changes.
        self.direct_fd = self._fd
        self._handling = False
        self._ended_cleanly = False  # DISCONNECT 0x00: no will
        self._taken_over = False

    @property
    def busy(self):
        """A packet being handled or acknowledgements waiting for their put's durability (a shutdown lets them
        finish)."""
        return self._handling or (self.acks is not None and self.acks.pending > 0)

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
            self.direct_fd = -1
            try:
                return self._write_all(data)
            finally:
                self.direct_fd = self._fd if self._unsent is None and not self.closed else -1

    def send_made(self, make):
        """``send_bytes`` of the packet ``make()`` returns, made under the write lock: what it decides (the topic alias
        a delivery sends, ``OutboundAliases``) is decided in the order the packets are written, whichever writer
        comes first."""
        if self.closed:
            return False
        with self._write_lock:
            self.direct_fd = -1
            try:
                return self._write_all(make())
            finally:
                self.direct_fd = self._fd if self._unsent is None and not self.closed else -1

    def _write_all(self, data):
        """``send_bytes``'s write, the write lock held. On a plain socket what it takes now goes by one non-blocking
        send (a small packet whole); only a rest waits in gevent's ``sendall``, which asks the kernel for the socket's
        buffer size at each call."""
        try:
            rest = self._unsent
            if rest is not None:
                self._unsent = None
                self.sock.sendall(rest)
            if self.raw_sock is not None:
                n = self._send_now(data)
                if n == len(data):
                    return True
                data = memoryview(data)[n:]
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
        ``send_bytes``; over WebSocket one frame, ``_try_framed``); else the bytes written: the rest is kept on the
        connection and goes before anything else written to it (``send_bytes``, ``flush_unsent``), so no writer ever
        waits on a lock a stalled one holds."""
        if self.closed:
            return None
        if self.tls:
            return self._try_framed(data)
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
                self.direct_fd = self._fd
            try:
                n = self.raw_sock.send(data)  # (gevent's underlying non-blocking socket)
            except BlockingIOError:
                return 0
            if 0 < n < len(data):
                self._unsent = data[n:]
                self.direct_fd = -1
            return n
        except OSError as exc:
            log.info("mqtt %s: send failed (%s); closing", self.peer, exc)
            self.close()
            return None
        finally:
            lock.release()

    def _try_framed(self, data):
        """``try_send`` on a WebSocket stream (its ``try_send``: ``data`` one frame, none on TLS): a frame begun and
        not finished is kept by the stream, and ``_unsent`` set empty so the next writer (``send_bytes``,
        ``flush_unsent``) has the stream write that rest first."""
        framed = self._framed
        if framed is None:
            return None
        lock = self._write_lock
        if not lock.acquire(blocking=False):
            return 0
        try:
            n = framed(data)
            if n:
                self._unsent = b"" if n < len(data) else None
            return n
        except OSError as exc:
            log.info("mqtt %s: send failed (%s); closing", self.peer, exc)
            self.close()
            return None
        finally:
            lock.release()

    def _send_now(self, data):
        """Write what the socket takes now, never waiting: 0 when its buffer is full. On gevent's underlying
        non-blocking socket (what its wrapper's send with no timeout does, less a call)."""
        try:
            return self.raw_sock.send(data)
        except BlockingIOError:
            return 0

    def fan_fd(self):
        """The socket's file descriptor when packets may be written to it now by descriptor (a fan-out reader's
        ``send_each``), else None (it writes through ``try_send``): open, not TLS (an SSL socket encrypts what it
        writes), no writer inside a packet (the write lock free) and nothing a partial write left. The caller writes
        before it yields, so no other writer can come in between."""
        if self.closed or self.tls or self._unsent is not None or self._write_lock.locked():
            return None
        fd = self.raw_sock.fileno()  # (gevent's underlying socket: the same descriptor, no wrapper's call)
        return fd if fd >= 0 else None

    def keep_unsent(self, rest):
        """What a write by descriptor (``fan_fd`` or ``direct_fd``, no yield since) left of its last packet: written
        before anything else, as what a ``try_send`` leaves."""
        self._unsent = rest
        self.direct_fd = -1

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


    def disconnect(self, code, why):
        """Close for ``why``: the PUBLISHes before it stored, then MQTT 5 sends DISCONNECT ``code`` after the
        acknowledgements queued before it; one log line. Returns False (stop reading)."""
        self.publishes.flush()
        log.info("mqtt %s: %s; closing", self.peer, why)
        if self.version == MQTT_5:
            self.acks.send_in_order(encode(wire.Disconnect(code), MQTT_5))
        return False

    def receive_maximum(self, most):
        """The client's Receive Maximum is ``most`` (fixed by its CONNECT): ``client_receive_max``, and
        ``inflight_window``, the most QoS 1 and 2 messages in flight to it at once: min(``mqtt.max_inflight``, its
        Receive Maximum), kept as an attribute since neither moves while the connection lives (the port's settings
        are fixed at its start)."""
        self.client_receive_max = most
        self.inflight_window = min(self.settings.max_inflight, most)

    # -- reading ---------------------------------------------------------------

    #: An idle connection, most of a device fleet's, holds no greenlet (the connection core's ``parks``), once idle
    #: for ``limits.MQTT_PARK_AFTER_S``.
    parks = True
    park_after_s = mqtt_limits.MQTT_PARK_AFTER_S
    #: [MQTT-3.1.2-24]: a packet begun whose bytes stop for 1.5 x Keep Alive closes the connection as a network
    #: failure (its will fires), before the request deadline; Keep Alive bounds the time from the end of one packet
    #: to the start of the next (3.1.2.10), not a packet's transmission: one arriving steadily is served.
    idle_bounds_partial = True

    def serve(self):
        """One turn (``parks``): read and handle packets until the connection is idle (parked: this returns, the
        core calls it again when bytes arrive) or ends (then ``_end``). A read beginning with a PUBACK, a
        subscriber's common turn, goes to ``Subscriptions.read_pubacks``; one to a connection holding staging plans
        and write decisions, a device's, to ``Publishes.read``: each takes the plain packets the read begins with in
        one step and leaves what follows them, from the first other or partial packet on, to ``_process`` (None),
        in order; when they took it all (True) nothing is buffered, which the next ``receive`` and ``Publishes.read``
        are told (``whole``, asked of the parser once at the turn's start). Any other read goes to ``_process``
        whole."""
        parked = False
        try:
            whole = not self.parser.in_frame
            data = self.receive(whole=whole)
            parked = data is core.PARKED
            if parked or (data is not None and self.version is None and not self.parser.buffered
                          and self.tls_hello(data)):  # its first bytes: nothing parsed before them
                return
            publishes = self.publishes
            parser = self.parser
            ports = self.port.core  # (its ``closing``: the broker is shutting down)
            while data is not None and not self.closed:
                self._handling = True
                try:
                    if not data:
                        parser.receive_data(data)  # the end of the stream
                        self._process()
                        return
                    if data[0] == PUBACK_FIRST and self.mqtt is not None:
                        went = self.subscriptions.read_pubacks(parser, data)
                    elif publishes.plans and publishes.decided:
                        went = publishes.read(parser, data, whole)
                    else:
                        parser.receive_data(data)
                        went = None
                    whole = went is True  # a one-step path took every byte: nothing buffered
                    if went is None:
                        went = self._process()
                    if not went:
                        return
                finally:
                    self._handling = False
                if ports.closing:
                    return
                data = self.receive(whole=whole)
                parked = data is core.PARKED
                if parked:
                    return
        finally:
            if not parked:
                self._end()
            else:
                self.publishes.parked()  # a device's few plans and decisions kept for its next turn

    def _process(self):
        """Handle every whole packet buffered; False when the connection must close. The PUBLISHes among them ask
        the write decision once per metaq topic while it stands (``Publishes.decided``, kept across turns); a packet
        other than PUBLISH has the PUBLISHes before it stored first. The clock is read once a packet: the turn yields
        once ``limits.MAX_TURN_MS`` have passed since it began."""
        turn = None
        publishes = self.publishes
        parser = self.parser
        try:
            while True:
                # plain PUBLISHes of names staged before: in one step
                went = publishes.stage_plain(parser) if publishes.plans and publishes.decided else None
                if went is None:
                    try:
                        packet = parser.next_event()
                    except MqttError as exc:
                        publishes.flush()  # the PUBLISHes before the bad packet are stored and acknowledged
                        self._refuse(exc)
                        return False
                    kind = type(packet)
                    if kind is not wire.Publish:
                        ended = self._before_other(packet)
                        if ended is not None:
                            return ended
                    try:
                        went = publishes.publish(packet) if kind is wire.Publish else _HANDLERS.get(
                            kind, _unexpected)(self, packet)
                    except Exception:  # noqa: BLE001 - the one place an unexpected error ends a connection
                        return self._failed(kind)
                if not went or self.closed:
                    return False
                now = _now()
                if turn is None:
                    turn = now
                elif now - turn >= MAX_TURN_S:
                    turn = self._yield_turn(turn)
                    if turn is None:
                        return False
        finally:
            publishes.drop()  # not stored: the connection closes without acknowledging them

    def _before_other(self, packet):
        """Before a packet other than PUBLISH: the PUBLISHes before it stored; None to handle it, else what
        ``_process`` returns (no whole packet buffered: True, the staged PUBLISHes stored; the end of the stream or a
        failed put: False)."""
        publishes = self.publishes
        if packet is NEED_DATA:
            return publishes.flush()
        if packet is CLOSED:
            publishes.flush()
            return False
        return None if publishes.flush() else False

    def _failed(self, kind):
        """An unexpected error handling a packet of type ``kind`` ends the connection: logged with its traceback,
        MQTT 5 told 0x80; returns False."""
        log.exception("mqtt %s: unexpected error handling %s", self.peer, kind.__name__)
        self.publishes.drop()
        if self.version == MQTT_5:
            self.send(wire.Disconnect(wire.UNSPECIFIED_ERROR))
        return False

    def _yield_turn(self, started):
        """The turn begun at ``started`` is over (``limits.MAX_TURN_MS``): the staged PUBLISHes are stored before the
        others run, the reader yields and a new turn begins, returned. None when the connection must close."""
        if not self.publishes.flush():
            return None  # stored before the others run
        return core.share_loop(started)  # the turn is over: it yields

    def _refuse(self, exc):
        """A packet the codec refused: its answer (CONNACK, DISCONNECT or nothing), then close; one log line."""
        log.info("mqtt %s: %s (reason 0x%02X); closing", self.peer, exc.reason, exc.reason_code)
        answer = refusal(exc)
        if answer is not None and not self.closed:
            self.acks.send_in_order(encode(answer, exc.version))

    # -- ending ----------------------------------------------------------------

    def take_over(self):
        """Another connection took this client id: MQTT 5 is told DISCONNECT 0x8E, the connection closes. Returns
        ``(will, guard session, will delay, origin)`` for the port to publish (or drop), or None without a will."""
        self._taken_over = True
        if self.mqtt.persistent:
            self.port.taken_over(self.mqtt)  # saved now, and handed to the new connection as it stands
        log.info("mqtt %s: client %s connected again from another connection; closing this one", self.peer,
                 self.mqtt.client_id)
        if self.version == MQTT_5:
            self.send(wire.Disconnect(wire.SESSION_TAKEN_OVER))
        self.close()
        will, self.will = self.will, None
        return (will, self.session, self.will_delay(will), self.will_origin) if will is not None else None

    def keeps_state(self):
        """True when this connection holds what only a master keeps: a persistent session or a will."""
        return self.mqtt is not None and (self.mqtt.persistent or self.will is not None)

    def move_away(self, reference, why="this broker keeps no session now"):
        """This broker stopped keeping sessions (``MqttPort.session_refusal``), or may not keep this client id now
        (``why``: its home broker's lease ran out, ``MqttPort.lease_lost``): MQTT 5 is told DISCONNECT 0x9C Use
        another server (Server Reference: the master's MQTT address, ``reference``, when known), MQTT 3.1.1 is just
        closed. The connection ends as a network failure: its will as for one (a deposed master's is left to the
        master: it is in the log)."""
        log.info("mqtt %s: client %s: %s; closing%s", self.peer, self.mqtt.client_id, why,
                 " (the master is %s)" % reference if reference else "")
        if self.version == MQTT_5:
            self.send(wire.Disconnect(wire.USE_ANOTHER_SERVER, {"server_reference": reference} if reference else {}))
        self.close()

    def will_delay(self, will):
        """The delay of ``will`` (MQTT 5's Will Delay Interval, bounded by the session's expiry; 3.1.1: none)."""
        if self.version != MQTT_5:
            return 0
        return min(will.properties.get("will_delay_interval", 0), self.expiry_s)

    def client_disconnect(self, p):
        """The client's DISCONNECT: its session expiry as it says (MQTT 5), no will after a normal one (0x00); False
        (the connection ends)."""
        expiry = p.properties.get("session_expiry_interval")
        if expiry is not None:
            if self.expiry_s == 0 and expiry:
                return self.disconnect(wire.PROTOCOL_ERROR, "a DISCONNECT may not set a session expiry when the "
                                       "CONNECT's was 0")
            self.expiry_s = expiry
            self.mqtt.expiry_s = expiry
            self.mqtt.persistent = bool(expiry)
        self._ended_cleanly = p.reason_code == wire.SUCCESS  # 0x04: disconnect with will message
        return False

    def _end(self):
        """The connection ends: its acknowledgements finish, its will is published (not after a normal DISCONNECT),
        its client id is free again; then it lets go of its operation groups (``_let_go``)."""
        try:
            self._ended()
        finally:
            self._let_go()

    def _ended(self):
        """``_end``'s steps, up to letting go."""
        self.acks.finish(self.request_timeout)
        if self.subscriptions.delivery is not None:
            self.subscriptions.delivery.stop()
        self.close()
        if self.mqtt is None:
            return
        self.port.release(self, self.mqtt.client_id)
        if not self._taken_over:
            if self.mqtt.persistent:
                self.port.went_offline(self.mqtt)  # its shared subscriptions with it, before it leaves their groups
            elif not self.port.holds(self.mqtt.client_id):
                self.port.end_session(self.mqtt.client_id)  # a resumed session with no expiry ends with its connection
        self.subscriptions.leave_all()
        will, self.will = self.will, None
        if will is not None and not self._taken_over:
            if self._ended_cleanly:
                if self.will_origin is not None:
                    self.port.wills.will_done(self.mqtt.client_id, self.will_origin)
            else:
                self.port.wills.connection_lost(self.mqtt.client_id, will, self.session, self.will_delay(will),
                                          self.will_origin)

    def _let_go(self):
        """The end's last step: the connection lets go of its operation groups. Each of them, and the delivery's
        parts, keeps the connection: a reference cycle that only the cyclic collector's full pass would free, a pass
        that walks every object of the broker. Let go, the groups are freed at once (a greenlet of theirs still
        running, an acknowledgement writer's, keeps what it uses), and the connection with all it holds when its
        last holder lets go. Nothing asks an ended connection for its groups; ``close`` and ``busy`` look first."""
        self.acks = self.publishes = self.subscriptions = None

    def close(self):
        self.direct_fd = -1
        super().close()
        if self.subscriptions is not None:  # (None: it ended, ``_let_go``)
            self.subscriptions.wake()  # the delivery sees it at once


_now = time.monotonic

#: ``limits.MAX_TURN_MS`` in seconds: how long a turn of the reader goes on before it yields.
MAX_TURN_S = limits.MAX_TURN_MS / 1000.0


def _unexpected(conn, p):
    return conn.disconnect(wire.PROTOCOL_ERROR, "%s is not expected from a client" % type(p).__name__)


#: What the reader does with each packet other than PUBLISH (``Connection._process``), by its type: its operation
#: group's function, given the connection and the packet; False when the connection must close.
_HANDLERS = {
    wire.PubAck: lambda conn, p: conn.subscriptions.acknowledged(p.packet_id, PUBLISH_SENT),
    wire.PubRec: lambda conn, p: conn.subscriptions.pubrec(p),
    wire.PubComp: lambda conn, p: conn.subscriptions.acknowledged(p.packet_id, PUBREL_SENT),
    wire.PubRel: lambda conn, p: conn.publishes.release(p),
    wire.Subscribe: lambda conn, p: conn.subscriptions.subscribe(p),
    wire.Unsubscribe: lambda conn, p: conn.subscriptions.unsubscribe(p),
    wire.PingReq: lambda conn, p: conn.acks.send_in_order(PINGRESP),  # after the acknowledgements queued before it
    wire.Disconnect: lambda conn, p: conn.client_disconnect(p),
    wire.Connect: lambda conn, p: connect(conn, conn.port, p),
}

#: A PUBACK's first byte (its type, no flags): a read beginning with it takes ``Subscriptions.read_pubacks``.
PUBACK_FIRST = wire.PUBACK << 4

#: The PINGRESP, encoded once: the same two bytes in every version.
PINGRESP = encode(wire.PingResp(), MQTT_5)
