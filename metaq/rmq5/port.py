"""The gRPC port: HTTP/2 connections (h2, sans-IO) on a listener of the connection core, serving ``rpcs``.

The port is no second server stack: its listener is opened with ``ConnectionCore.listen("grpc", ...)``, so the one
connection cap, the per-address share, the allow-list, TLS (``security.tls``: gRPC over TLS when it is on, h2c
with prior knowledge when off) and the deadlines apply to it as to every port. A connection's greenlet reads
through ``Connection.receive`` (idle timeout; a message begun must be whole within ``request_timeout_s``) and feeds
h2; gRPC's layer is ``wire``. Per connection the port announces and h2 enforces its named limits:

* ``max_streams_per_connection`` (``limits.GRPC_MAX_STREAMS_PER_CONNECTION``): SETTINGS_MAX_CONCURRENT_STREAMS; a
  client that opens one more stream than announced gets GOAWAY and the connection closes;
* ``max_header_bytes`` (``limits.GRPC_MAX_HEADER_BYTES``): SETTINGS_MAX_HEADER_LIST_SIZE; a larger header block
  ends the connection (GOAWAY);
* ``max_message_bytes`` (``limits.GRPC_MAX_MESSAGE_BYTES``): a request message announced larger ends its call with
  grpc-status 8, the connection going on.

A unary call (and a server-streaming one, ReceiveMessage: one request, the responses the service lists) runs in a
greenlet of its own once its request is whole (a send waits for its durability), bounded
by its ``grpc-timeout`` and ``limits.GRPC_MAX_CALL_S``: past it the call ends DEADLINE_EXCEEDED (a send may still
be stored, as any put whose acknowledgement is lost). Telemetry's commands are answered as they arrive, on the
stream, which stays open until the client half-closes it. A path that is no MessagingService RPC, a content type
that is not gRPC's (HTTP 415) and a request that does not parse are answered with gRPC's statuses, never a
closed connection. A call the client resets, or whose connection ends, is told at once (``Call.cancelled``): its long
poll ends and what it took is given back (``Call.unsent``). Responses respect HTTP/2 flow control (a window used up
waits for the client's WINDOW_UPDATE, at most ``request_timeout_s``).
"""

import logging
import socket
import time

import gevent
from gevent.event import Event
from gevent.lock import Semaphore
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (ConnectionTerminated, DataReceived, RemoteSettingsChanged, RequestReceived, StreamEnded,
                       StreamReset, WindowUpdated)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings

from metaq import limits
from metaq.rmq5.wire import (OK_TRAILERS_RAW, RESPONSE_HEADERS_RAW, GrpcError, MessageReader, Status, frame,
                             is_grpc_content_type, parse_timeout, rpc_name, trailers, trailers_only)
from metaq.server.connections import Connection

log = logging.getLogger(__name__)

#: The receive window the port opens per stream and for the connection: a 4 MiB message arrives without waiting
#: for a WINDOW_UPDATE per 64 KiB.
WINDOW_BYTES = 1 << 20
#: Response bytes a call hands h2 before they go to the socket: a call's frames (headers, messages, trailers) leave
#: in one send when they fit, and a long server stream is still sent as it is built, not held whole.
FLUSH_BYTES = 1 << 16
#: How long a connection ended by a GOAWAY reads what its client still sends before it closes (``_linger``).
LINGER_S = 1.0


class PortLimits:
    """The gRPC port's named limits (the ``grpc:`` settings; defaults from ``metaq.limits``)."""

    __slots__ = ("max_streams", "max_message_bytes", "max_header_bytes", "max_call_s")

    def __init__(self, max_streams=limits.GRPC_MAX_STREAMS_PER_CONNECTION,
                 max_message_bytes=limits.GRPC_MAX_MESSAGE_BYTES, max_header_bytes=limits.GRPC_MAX_HEADER_BYTES,
                 max_call_s=limits.GRPC_MAX_CALL_S):
        self.max_streams = max_streams
        self.max_message_bytes = max_message_bytes
        self.max_header_bytes = max_header_bytes
        self.max_call_s = max_call_s


class Call:
    """One stream: what a handler is told of its call (the RPC, the metadata, the connection's session)."""

    __slots__ = ("stream_id", "rpc", "kind", "metadata", "timeout_s", "reader", "requests", "ended", "done",
                 "reset", "headers_sent", "session", "peer", "greenlet", "push", "unsent", "user", "cancelled")

    def __init__(self, stream_id, rpc, kind, metadata, timeout_s, reader, session, peer):
        self.stream_id = stream_id
        self.rpc = rpc
        self.kind = kind
        self.metadata = metadata
        self.timeout_s = timeout_s
        self.reader = reader
        self.requests = []  # a unary call's request message, once whole
        self.ended = False  # the client half-closed its side
        self.done = False  # the server ended the call (trailers sent)
        self.reset = False  # the client reset the stream (cancelled)
        self.headers_sent = False
        self.session = session
        self.peer = peer
        self.greenlet = None
        self.push = None  # a Telemetry stream's: send one message on it from the service (False: it ended)
        self.unsent = None  # set by the service: called when the call ended before its whole answer was handed over
        self.user = ""  # the user this call signed in as (the service's login; "" with authentication off)
        self.cancelled = Event()  # set when the client reset the call or the connection ended: its long poll ends


class GrpcConnection(Connection):
    """One HTTP/2 connection of the gRPC port (see the module doc)."""

    log_prefix = "grpc"

    def __init__(self, sock, address, conn_id, rules, service, port_limits):
        super().__init__(sock, address, conn_id, rules)
        self.service = service
        self.limits = port_limits
        # Inbound headers are checked as h2 does by default; outbound ones are the port's own (``wire``: lower-case
        # names, printable ASCII values), so h2 neither re-validates nor re-normalizes them for every response.
        config = H2Configuration(client_side=False, header_encoding="utf-8", validate_outbound_headers=False,
                                 normalize_outbound_headers=False)
        self.h2 = H2Connection(config=config)
        self.h2.local_settings = Settings(client=False, initial_values={
            SettingCodes.MAX_CONCURRENT_STREAMS: port_limits.max_streams,
            SettingCodes.MAX_HEADER_LIST_SIZE: port_limits.max_header_bytes,
            SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
        })
        self.h2.decoder.max_header_list_size = port_limits.max_header_bytes
        self.calls = {}
        self.running = 0  # unary calls being answered
        self.completed = 0  # request messages received whole (Connection.progress)
        self.parser = self  # Connection.receive asks in_frame, completed and buffered of it
        self._send_lock = Semaphore()
        self._window = Event()
        self._flush_due = False  # a deferred flush is spawned and has not run yet (``_flush_soon``)
        self.goaway = False  # the client sent GOAWAY: nothing more is read

    # -- what Connection.receive asks --------------------------------------------------------------------------

    @property
    def in_frame(self):
        """A request under way: a message partly received, or a unary call whose request has not ended."""
        return any(c.reader.buffered or (c.kind == "unary" and not c.ended) for c in self.calls.values())

    @property
    def buffered(self):
        return sum(c.reader.buffered for c in self.calls.values())

    @property
    def busy(self):
        return self.running > 0 or self.in_frame

    # -- the connection's loop ---------------------------------------------------------------------------------

    def serve(self):
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(WINDOW_BYTES)
        try:
            self._flush()
            while not self.closed:
                data = self.receive()
                if not data:
                    break
                try:
                    events = self.h2.receive_data(data)
                except ProtocolError as exc:
                    log.info("grpc %s: HTTP/2 protocol error, closing: %s", self.peer, exc)
                    self._flush()  # h2's GOAWAY
                    self._linger()
                    break
                for event in events:
                    self._event(event)
                self._flush()
                if self.goaway:
                    break
        except OSError as exc:
            log.debug("grpc %s: %s", self.peer, exc)
        finally:
            for call in list(self.calls.values()):
                call.cancelled.set()
                if call.greenlet is not None:
                    call.greenlet.kill(block=False)
                if call.kind == "telemetry":
                    self.service.telemetry_closed(call)
            try:
                if not self.closed and self.h2.state_machine.state.name != "CLOSED":
                    self.h2.close_connection()
                    self._flush()
            except (OSError, ProtocolError):
                pass

    def _linger(self):
        """After a GOAWAY: stop sending and read what the client still sends, at most ``LINGER_S``, so that the
        close does not reset the connection before the client has read the GOAWAY (a close with unread bytes sends
        a TCP reset, which may discard them)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER_S
            while time.monotonic() < deadline:
                self.sock.settimeout(max(0.001, deadline - time.monotonic()))
                if not self.sock.recv(65536):
                    break
        except OSError:
            pass

    def _event(self, event):
        if isinstance(event, RequestReceived):
            self._request(event.stream_id, event.headers)
        elif isinstance(event, DataReceived):
            self._data(event)
        elif isinstance(event, StreamEnded):
            self._ended(event.stream_id)
        elif isinstance(event, StreamReset):
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                call.reset = True
                call.cancelled.set()  # its parked wait ends now; what it took is given back (``_unsent``)
                self._window.set()
                if call.kind == "telemetry":
                    self.service.telemetry_closed(call)
        elif isinstance(event, (WindowUpdated, RemoteSettingsChanged)):
            self._window.set()
        elif isinstance(event, ConnectionTerminated):
            self.goaway = True

    def _request(self, stream_id, headers):
        metadata = {}
        for name, value in headers:
            if name in metadata and not name.startswith(":"):
                metadata[name] += "," + value
            else:
                metadata[name] = value
        if metadata.get(":method") != "POST":
            self._plain_answer(stream_id, "405")
            return
        if not is_grpc_content_type(metadata.get("content-type")):
            self._plain_answer(stream_id, "415")
            return
        rpc = rpc_name(metadata.get(":path"))
        kind = self.service.kind(rpc) if rpc is not None else None
        if kind is None or kind == "later":
            why = ("unknown method %s" % (metadata.get(":path") or "")[:200] if kind is None
                   else "%s: %s" % (rpc, self.service.later(rpc)))
            self._end_now(stream_id, Status.UNIMPLEMENTED, why)
            return
        encoding = metadata.get("grpc-encoding")
        if encoding not in (None, "identity"):
            self._end_now(stream_id, Status.UNIMPLEMENTED, "grpc-encoding %s: only identity is accepted"
                          % encoding[:40])
            return
        try:
            timeout = parse_timeout(metadata.get("grpc-timeout"))
        except GrpcError as exc:
            self._end_now(stream_id, exc.status, exc.message)
            return
        cap = self.limits.max_call_s
        timeout = cap if timeout is None else min(timeout, cap)
        call = self.calls[stream_id] = Call(stream_id, rpc, kind, metadata, timeout,
                                            MessageReader(self.limits.max_message_bytes), self.session, self.peer)
        if kind == "telemetry":
            call.push = lambda payload: self._send_message(call, payload)

    def _data(self, event):
        sid = event.stream_id
        try:
            self.h2.acknowledge_received_data(event.flow_controlled_length, sid)
        except (StreamClosedError, ProtocolError):
            pass
        call = self.calls.get(sid)
        if call is None or call.done:
            return
        try:
            messages = call.reader.feed(event.data)
        except GrpcError as exc:
            self._finish(call, exc.status, exc.message, reset=True)
            return
        self.completed += len(messages)
        if call.kind == "telemetry":
            for data in messages:
                try:
                    answer = self.service.telemetry(call, data)
                except GrpcError as exc:
                    self._finish(call, exc.status, exc.message, reset=True)
                    return
                if answer is not None:
                    self._send_message(call, answer)
            return
        call.requests.extend(messages)
        if len(call.requests) > 1:
            self._finish(call, Status.INTERNAL, "a unary call with more than one request message", reset=True)

    def _ended(self, stream_id):
        call = self.calls.get(stream_id)
        if call is None or call.done:
            return
        call.ended = True
        if call.kind == "telemetry":  # the client half-closed its stream: ours ends too
            self._finish(call, Status.OK)
            return
        if call.reader.buffered or len(call.requests) != 1:
            self._finish(call, Status.INTERNAL, "a unary call must carry exactly one whole request message")
            return
        self.running += 1
        call.greenlet = gevent.spawn(self._unary, call)

    def _unary(self, call):
        """Answer one unary call (its own greenlet): the service's response, or the status it ended with."""
        try:
            timer = gevent.Timeout(call.timeout_s)
            timer.start()
            try:
                response = self.service.call(call.rpc, call, call.requests[0])
            except gevent.Timeout as exc:
                if exc is not timer:
                    raise
                self._finish(call, Status.DEADLINE_EXCEEDED, "no answer within %.3f s (grpc-timeout, at most "
                             "grpc.max_call_s)" % call.timeout_s)
                return
            except GrpcError as exc:
                self._finish(call, exc.status, exc.message)
                return
            except Exception:
                log.exception("grpc %s: %s failed", self.peer, call.rpc)
                self._finish(call, Status.INTERNAL, "internal error answering %s" % call.rpc)
                return
            finally:
                timer.close()
            pending = 0  # bytes handed to h2 and not flushed yet: the trailers' flush sends them with its own
            for payload in response if isinstance(response, list) else [response]:
                pending += len(payload)
                if not self._send_message(call, payload, flush=pending >= FLUSH_BYTES):
                    _unsent(call)
                    return
                if pending >= FLUSH_BYTES:
                    pending = 0
            if not self._finish(call, Status.OK):
                _unsent(call)
        except OSError as exc:
            log.debug("grpc %s: %s", self.peer, exc)
            _unsent(call)
        except gevent.GreenletExit:  # the connection ended: what the call took goes back
            _unsent(call)
            raise
        finally:
            self.running -= 1

    # -- sending -----------------------------------------------------------------------------------------------

    def _open(self, call):
        return not (call.reset or call.done or self.closed)

    def _send_message(self, call, payload, flush=True):
        """Send one response message on ``call`` within the flow-control windows; False when the call or the
        connection ended first. ``flush`` False: its frames wait in h2 for the next flush (a unary call's trailers
        send them; a shut window flushes before it waits)."""
        if not self._open(call):
            return False
        if not call.headers_sent:
            self.h2.send_headers(call.stream_id, list(RESPONSE_HEADERS_RAW))
            call.headers_sent = True
        data = memoryview(frame(payload))
        deadline = time.monotonic() + self.request_timeout
        while data:
            if not self._open(call):
                return False
            try:
                room = min(len(data), self.h2.local_flow_control_window(call.stream_id),
                           self.h2.max_outbound_frame_size)
            except (StreamClosedError, ProtocolError):
                return False
            if room <= 0:
                self._window.clear()
                self._flush()
                left = deadline - time.monotonic()
                if left <= 0 or not self._window.wait(left):
                    log.info("grpc %s: the client's flow-control window stayed shut for %.0f s; closing", self.peer,
                             self.request_timeout)
                    self.close()
                    return False
                continue
            self.h2.send_data(call.stream_id, data[:room].tobytes())
            data = data[room:]
        if flush:
            self._flush()
        return True

    def _finish(self, call, status, message="", reset=False):
        """End ``call`` with ``status`` (trailers; Trailers-Only when nothing was sent); ``reset``: the client's
        side is not over yet (RST_STREAM NO_ERROR after the trailers, as grpc's servers do). False when the call or
        the connection had ended first (nothing more reaches the client)."""
        if call.kind == "telemetry":
            self.service.telemetry_closed(call)
        if not self._open(call):
            self.calls.pop(call.stream_id, None)
            return False
        call.done = True
        self.calls.pop(call.stream_id, None)
        try:
            if call.headers_sent:
                ends = list(OK_TRAILERS_RAW) if status == Status.OK and not message else trailers(status, message)
                self.h2.send_headers(call.stream_id, ends, end_stream=True)
            else:
                self.h2.send_headers(call.stream_id, trailers_only(status, message), end_stream=True)
            if reset and not call.ended:
                self.h2.reset_stream(call.stream_id, ErrorCodes.NO_ERROR)
        except (StreamClosedError, ProtocolError):
            return False
        self._flush_soon()
        return True

    def _end_now(self, stream_id, status, message):
        """A call refused from its headers: Trailers-Only, and RST_STREAM unless the client's side is over."""
        try:
            self.h2.send_headers(stream_id, trailers_only(status, message), end_stream=True)
            stream = self.h2.streams.get(stream_id)
            if stream is not None and not stream.closed:
                self.h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        except (StreamClosedError, ProtocolError):
            pass

    def _plain_answer(self, stream_id, http_status):
        """An HTTP answer that is no gRPC response (a wrong method or content type)."""
        try:
            self.h2.send_headers(stream_id, [(":status", http_status)], end_stream=True)
            stream = self.h2.streams.get(stream_id)
            if stream is not None and not stream.closed:
                self.h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        except (StreamClosedError, ProtocolError):
            pass

    def _flush_soon(self):
        """Flush from a greenlet of its own, once the calls that are ready now have run: the responses of the calls
        answered in one turn of the loop (a burst of requests read at once) leave in one send, not one each. The
        connection's end (``serve``) flushes whatever is still pending itself."""
        if not self._flush_due:
            self._flush_due = True
            gevent.spawn(self._deferred_flush)

    def _deferred_flush(self):
        self._flush_due = False
        try:
            self._flush()
        except OSError as exc:
            log.debug("grpc %s: %s", self.peer, exc)

    def _flush(self):
        """Hand h2's pending bytes to the socket, in order (one greenlet at a time takes and sends them). One
        ``send`` mostly takes them all; gevent's ``sendall`` (a Timeout object, a getsockopt) only sends the rest."""
        with self._send_lock:
            data = self.h2.data_to_send()
            if data and not self.closed:
                sent = self.sock.send(data)
                if sent < len(data):
                    self.sock.sendall(memoryview(data)[sent:])


class GrpcPort:
    """The gRPC port: a listener of the connection core whose connections serve ``service``
    (``rpcs.MessagingService``) within ``port_limits`` (``PortLimits``)."""

    def __init__(self, core, service, port_limits=None):
        self.core = core
        self.service = service
        self.limits = port_limits or PortLimits()
        self.listener = None

    @property
    def port(self):
        return self.listener.port if self.listener is not None else None

    def listen(self, host, port):
        self.listener = self.core.listen("grpc", host, port, self._connection, alpn=("h2",))
        return self.listener

    def _connection(self, sock, address, conn_id):
        return GrpcConnection(sock, address, conn_id, self.core.rules, self.service, self.limits)

    def connection_count(self):
        return self.core.count("grpc")


def _unsent(call):
    """Tell the service its answer to ``call`` did not all reach the connection (the client reset the call, the
    connection ended or its window stayed shut): ``call.unsent``, once, if the service set one."""
    unsent, call.unsent = call.unsent, None
    if unsent is None:
        return
    try:
        unsent()
    except Exception:  # noqa: BLE001 - the service's clean-up must not end the connection's loop
        log.exception("grpc %s: cleaning up after an unsent answer failed", call.peer)
