"""The gRPC port: HTTP/2 connections (``http2``, sans-IO) on a listener of the connection core, serving ``rpcs``.

The port is no second server stack: its listener is opened with ``ConnectionCore.listen("grpc", ...)``, so the one
connection cap, the per-address share, the allow-list, TLS (``security.tls``: gRPC over TLS when it is on, h2c
with prior knowledge when off) and the deadlines apply to it as to every port. A connection's greenlet reads
through ``Connection.receive`` (idle timeout; a message begun must be whole within ``request_timeout_s``) and feeds
the HTTP/2 layer; gRPC's layer is ``wire``. Per connection the port announces and enforces its named limits:

* ``max_streams_per_connection`` (``limits.GRPC_MAX_STREAMS_PER_CONNECTION``): SETTINGS_MAX_CONCURRENT_STREAMS; a
  stream opened past it is refused (REFUSED_STREAM, which a gRPC client retries), the connection going on;
* ``max_header_bytes`` (``limits.GRPC_MAX_HEADER_BYTES``): SETTINGS_MAX_HEADER_LIST_SIZE; a larger header block
  ends the connection (GOAWAY);
* ``max_message_bytes`` (``limits.GRPC_MAX_MESSAGE_BYTES``): a request message announced larger ends its call with
  grpc-status 8, the connection going on;
* SETTINGS_MAX_FRAME_SIZE (HTTP/2's default, 16 KiB): a frame declared larger ends the connection (GOAWAY
  FRAME_SIZE_ERROR) from its header, before its body arrives (``http2``); the bytes of an incomplete
  frame are a request under way (its deadline, the unfinished-request budgets, a stranger's among them);
* ``max_control_frames`` and ``max_new_streams`` per ``flood_window_s`` (``limits.GRPC_MAX_CONTROL_FRAMES``,
  ``limits.GRPC_MAX_NEW_STREAMS``, ``limits.GRPC_FLOOD_WINDOW_S``): every frame costs by its kind
  (``FloodBudget``): frames that do no work for a request (control and unknown types, empty and tiny frames that
  end nothing, frames refused on their stream, WINDOW_UPDATEs past ``limits.GRPC_WINDOW_UPDATES_PER_DATA`` for each
  DATA frame sent, small frames past the credit streams and full DATA frames give) count against the first,
  streams opened against the second; past either the connection ends with GOAWAY ENHANCE_YOUR_CALM (the HTTP/2
  flood, empty-frames, tiny-frames, closed-stream and rapid reset attacks);
* a header block (HEADERS and its CONTINUATIONs) encoded in more than ``limits.GRPC_HEADER_BLOCK_FACTOR`` times
  ``max_header_bytes`` ends the connection (GOAWAY ENHANCE_YOUR_CALM) as the frame that passes it begins, before
  the HTTP/2 layer buffers it (the CONTINUATION flood). Every frame is budgeted as its header arrives
  (``FloodBudget``, the layer's ``on_frame``), before it is buffered or served;
* a connection cut for frames that do no work (those two, not ``max_new_streams``) reads at most
  ``limits.GRPC_CALM_LINGER_BYTES`` more, and its address is refused new connections for ``flood_penalty_s``
  (``limits.GRPC_FLOOD_PENALTY_S``), doubled at each cut in a row (``ConnectionCore.penalize``): a flood that
  reconnects gets no fresh budget.

A connection reads ``limits.GRPC_RECV_BYTES`` at a time and lets the other connections run every
``limits.MAX_TURN_MS`` (``share_loop``, ``turn_after``), as every port's connections do.

A unary call (and a server-streaming one, ReceiveMessage: one request, the responses the service lists) runs in a
greenlet of its own once its request is whole (a send waits for its durability), bounded
by its ``grpc-timeout`` and ``limits.GRPC_MAX_CALL_S``: past it the call ends DEADLINE_EXCEEDED (a send may still
be stored, as any put whose acknowledgement is lost). A call the service can answer without waiting (asked with
``wait=False``; ``wire.WAITS`` when it may wait) is answered on the reader instead, in the turn that read it, its
answer flushed with the turn's others: no greenlet, deadline timer or deferred flush of its own. Telemetry's
commands are answered as they arrive, on the
stream, which stays open until the client half-closes it. A path that is no MessagingService RPC, a content type
that is not gRPC's (HTTP 415) and a request that does not parse are answered with gRPC's statuses, never a
closed connection. A call the client resets, or whose connection ends, is told at once (``Call.cancelled``): its long
poll ends and what it took is given back (``Call.unsent``). Responses respect HTTP/2 flow control (a window used up
waits for the client's WINDOW_UPDATE, at most ``request_timeout_s``).

A GOAWAY ends a connection cleanly either way (RFC 9113 section 6.8): after the client's, the streams it opened are
served to their end (the HTTP/2 layer reports it and closes nothing), then the port answers
with its own GOAWAY and closes; at the broker's shutdown (``drain``) the port sends GOAWAY naming the last stream it
took, refuses newer ones (REFUSED_STREAM), lets the open calls finish within the core's grace, then ends its
Telemetry streams (OK), sends its last GOAWAY and closes.
"""

import logging
import socket
import time

import gevent
from gevent.event import Event
from gevent.lock import Semaphore
from metaq.rmq5 import limits as rmq5_limits
from metaq.rmq5 import http2
from metaq.rmq5.http2 import (ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, PING, WINDOW_UPDATE,
                              ErrorCode, ProtocolError, ServerConnection, StreamClosed)
from metaq.rmq5.headercache import CachedDecoder, CachedEncoder, CheckedHeaders
from metaq.rmq5.wire import (OK_TRAILERS_RAW, RESPONSE_HEADERS_RAW, WAITS, GrpcError, MessageReader, Status, frame,
                             frames, is_grpc_content_type, parse_timeout, rpc_name, trailers, trailers_only)
from metaq.serving.connections import Connection, loop_polls, turn_after

log = logging.getLogger(__name__)

#: The receive window the port opens per stream and for the connection: a 4 MiB message arrives without waiting
#: for a WINDOW_UPDATE per 64 KiB.
WINDOW_BYTES = 1 << 20
#: Response bytes a call queues before they go to the socket: a call's frames (headers, messages, trailers) leave
#: in one send when they fit, and a long server stream is still sent as it is built, not held whole.
FLUSH_BYTES = 1 << 16
#: How long a connection ended by a GOAWAY reads what its client still sends before it closes (``_linger``).
LINGER_S = 1.0
#: The text of the port's plain HTTP answers (a request that is no gRPC call), by status.
PLAIN_BODIES = {"405": b"the gRPC port takes POST requests only\n",
                "415": b"the gRPC port takes application/grpc requests only\n"}


class PortLimits:
    """The gRPC port's named limits (the ``grpc:`` settings; defaults from ``metaq.rmq5.limits``)."""

    __slots__ = ("max_streams", "max_message_bytes", "max_header_bytes", "max_call_s", "max_control_frames",
                 "max_new_streams", "flood_window_s", "flood_penalty_s")

    def __init__(self, max_streams=rmq5_limits.GRPC_MAX_STREAMS_PER_CONNECTION,
                 max_message_bytes=rmq5_limits.GRPC_MAX_MESSAGE_BYTES,
                 max_header_bytes=rmq5_limits.GRPC_MAX_HEADER_BYTES,
                 max_call_s=rmq5_limits.GRPC_MAX_CALL_S, max_control_frames=rmq5_limits.GRPC_MAX_CONTROL_FRAMES,
                 max_new_streams=rmq5_limits.GRPC_MAX_NEW_STREAMS, flood_window_s=rmq5_limits.GRPC_FLOOD_WINDOW_S,
                 flood_penalty_s=rmq5_limits.GRPC_FLOOD_PENALTY_S):
        self.max_streams = max_streams
        self.max_message_bytes = max_message_bytes
        self.max_header_bytes = max_header_bytes
        self.max_call_s = max_call_s
        self.max_control_frames = max_control_frames
        self.max_new_streams = max_new_streams
        self.flood_window_s = flood_window_s
        self.flood_penalty_s = flood_penalty_s  # an address cut for flooding is refused this long, doubled per cut


class FloodBudget:
    """What one connection may send in a window of ``flood_window_s``, each frame by its cost: ``max_control_frames``
    frames that do no work for a request, ``max_new_streams`` streams opened, and the header block open at most
    ``GRPC_HEADER_BLOCK_FACTOR * max_header_bytes`` encoded.

    Work for no request: PING, SETTINGS, RST_STREAM, PRIORITY and GOAWAY frames and types HTTP/2 does not define,
    empty DATA frames that do not end their stream (the empty-frames flood), header-block parts shorter than
    ``GRPC_SMALL_FRAME_BYTES`` that do not end it (clients split a block only at the maximum frame size; the
    CONTINUATION flood of tiny frames), frames refused with a stream error (``wasted``,
    the HTTP/2 layer's ``on_wasted``: DATA or HEADERS on a closed stream, a stream refused; the port's DATA on a
    stream no call takes, a plain answer's), WINDOW_UPDATEs past the
    credit the DATA frames sent give (``sent_data``; a DATA frame cut to less than ``GRPC_SMALL_FRAME_BYTES`` by
    the client's window gives none: the data dribble), PINGs past the credit those give (a client's bandwidth
    probes as it reads), and small frames (DATA shorter than ``GRPC_SMALL_FRAME_BYTES``,
    HEADERS on a stream opened before) past the credit useful work gives: ``GRPC_SMALL_FRAMES_PER_STREAM`` a stream
    opened, one a full DATA frame. A DATA frame of ``GRPC_SMALL_FRAME_BYTES`` or more is payload delivered: free.
    Each credit is held to ``max_control_frames``. Each frame is counted as its header arrives (``begun``, the
    layer's ``on_frame``), before its body is buffered or it is served. Time is passed in (``tick``, once a read); a
    window starts with the first read after the last one ended."""

    __slots__ = ("limits", "controls", "streams", "last_stream", "block", "credit", "paid", "pongs", "_since")

    def __init__(self, port_limits):
        self.limits = port_limits
        self.controls = 0
        self.streams = 0
        self.last_stream = 0  # the highest stream id the client opened
        self.block = 0  # encoded bytes of the header block begun and not yet ended (END_HEADERS)
        self.credit = 0  # WINDOW_UPDATEs the client may send free (GRPC_WINDOW_UPDATES_PER_DATA a DATA frame sent)
        self.paid = 0  # small frames the client may send free (paid by streams opened and full DATA frames)
        self.pongs = 0  # PINGs the client may send free (GRPC_PINGS_PER_DATA a DATA frame sent: its bandwidth probes)
        self._since = None

    def sent_data(self, frames=1):
        """The port sent the client ``frames`` DATA frames: room for the window updates and the bandwidth probes
        (PING) it answers with."""
        most = self.limits.max_control_frames
        self.credit = min(self.credit + frames * rmq5_limits.GRPC_WINDOW_UPDATES_PER_DATA, most)
        self.pongs = min(self.pongs + frames * rmq5_limits.GRPC_PINGS_PER_DATA, most)

    def tick(self, now):
        """The time of a read: a window past ``flood_window_s`` starts again."""
        if self._since is None or now - self._since >= self.limits.flood_window_s:
            self._since, self.controls, self.streams = now, 0, 0

    def begun(self, ftype, flags, length, stream_id):
        """A frame's cost, as its header arrives (the one place it is decided; the class doc says how): None while
        the frames begun keep within the budget (this one counted), else why not. The frames of requests (a full
        DATA frame, a small one ending a call, HEADERS opening a stream) are taken first."""
        lim = self.limits
        if ftype == DATA:
            if length >= rmq5_limits.GRPC_SMALL_FRAME_BYTES:  # payload delivered: free, and pays for a small frame
                if self.paid < lim.max_control_frames:
                    self.paid += 1
                return None
            if (length or flags & END_STREAM) and self.paid:  # a small frame, paid (an empty one ending nothing never)
                self.paid -= 1
                return None
            self.controls += 1
            return self._excess()
        if ftype == HEADERS or ftype == CONTINUATION:
            return self._header_part(ftype == HEADERS, flags, length, stream_id)
        if ftype == WINDOW_UPDATE and self.credit:  # answering DATA the port sent
            self.credit -= 1
            return None
        if ftype == PING and self.pongs and not flags & ACK:  # a bandwidth probe as the client reads DATA
            self.pongs -= 1
            return None
        self.controls += 1  # PING, SETTINGS, RST_STREAM, PRIORITY, GOAWAY, an unknown type, an unprompted update
        return self._excess()

    def _header_part(self, headers, flags, length, stream_id):
        """``begun`` for a part of a header block (HEADERS when ``headers``, else CONTINUATION)."""
        lim = self.limits
        if headers and stream_id > self.last_stream:  # a stream opened: counted, and pays for small frames
            self.last_stream = stream_id
            self.streams += 1
            paid = self.paid + rmq5_limits.GRPC_SMALL_FRAMES_PER_STREAM
            self.paid = paid if paid < lim.max_control_frames else lim.max_control_frames
            if self.streams > lim.max_new_streams:
                return "more than %d streams opened in %g s (grpc.max_new_streams)" % (lim.max_new_streams,
                                                                                      lim.flood_window_s)
        elif headers:  # on a stream opened before (trailers): a small frame
            if self.paid:
                self.paid -= 1
            else:
                self.controls += 1
        if flags & END_HEADERS:
            self.block = 0
        else:
            if length < rmq5_limits.GRPC_SMALL_FRAME_BYTES:  # a tiny part that does not end its block
                self.controls += 1
            self.block += length
            if self.block > rmq5_limits.GRPC_HEADER_BLOCK_FACTOR * lim.max_header_bytes:
                return "a header block of more than %d bytes begun (%d x grpc.max_header_bytes)" % (
                    rmq5_limits.GRPC_HEADER_BLOCK_FACTOR * lim.max_header_bytes, rmq5_limits.GRPC_HEADER_BLOCK_FACTOR)
        return self._excess()

    def wasteful(self):
        """True once the frames that do no work passed ``max_control_frames`` or a header block its bound: a cut
        for flooding (its address then cools down, ``GrpcPort``), not for a busy client's many streams."""
        lim = self.limits
        return (self.controls > lim.max_control_frames
                or self.block > rmq5_limits.GRPC_HEADER_BLOCK_FACTOR * lim.max_header_bytes)

    def wasted(self):
        """A frame the HTTP/2 layer refused with a stream error (the layer's ``on_wasted``): None while within the
        budget (counted), else why not."""
        self.controls += 1
        return self._excess()

    def _excess(self):
        lim = self.limits
        if self.controls > lim.max_control_frames:
            return ("more than %d frames that do no work (PING, SETTINGS, RST_STREAM, PRIORITY, GOAWAY, unknown, empty "
                    "or small ones past their credit, unprompted WINDOW_UPDATEs, frames refused on their stream) in "
                    "%g s (grpc.max_control_frames)" % (lim.max_control_frames, lim.flood_window_s))
        return None


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
    paces_receive = False  # a call's user is its own: SendMessage charges its messages (calls.paced_wait)

    def __init__(self, sock, address, conn_id, rules, service, port_limits, on_flood=None):
        super().__init__(sock, address, conn_id, rules)
        self.on_flood = on_flood  # called with the peer's host when the connection is cut for flooding
        self.service = service
        self.limits = port_limits
        # HTTP/2 (``http2``) with HPACK's caching coder: the fixed response headers' blocks, and a client's repeated
        # request blocks (a few kept), coded once while the compression context stands still (``headercache``).
        # Inbound headers are checked by the port (``headercache.CheckedHeaders``: once for a list that repeats);
        # outbound ones are the port's own (``wire``: lower-case names, printable ASCII values).
        self.http2 = ServerConnection(CachedEncoder((RESPONSE_HEADERS_RAW, OK_TRAILERS_RAW)), CachedDecoder(),
                                   port_limits.max_streams, port_limits.max_header_bytes, WINDOW_BYTES, WINDOW_BYTES)
        self.checked = CheckedHeaders()
        self.calls = {}
        self.plain = {}  # stream id -> a plain answer's text waiting for the client's window (an open stream each)
        self.running = 0  # unary calls being answered
        self.completed = 0  # request messages received whole (Connection.progress)
        self.parser = self  # Connection.receive asks in_frame, completed and buffered of it
        self._send_lock = Semaphore()
        self._window = Event()
        self._flush_due = False  # a deferred flush is spawned and has not run yet (``_flush_soon``)
        self._reading = None  # the reader's greenlet while it serves a read's events: it flushes their answers after
        self.budget = FloodBudget(port_limits)
        self.http2.on_frame = self.budget.begun  # each frame budgeted as its header arrives
        self.http2.on_wasted = self.budget.wasted  # and each one refused on its stream
        self.goaway = False  # the client sent GOAWAY: its open streams end, then the connection
        self.draining = None  # the last stream id the port's GOAWAY named (``drain``): newer ones are refused
        self.ended = False  # the port sent its last GOAWAY and shut its side (``_end_cleanly``)
        self.call_peer = self.peer  # every call's ``peer``, made once

    # -- what Connection.receive asks --------------------------------------------------------------------------

    @property
    def in_frame(self):
        """A request under way: an HTTP/2 frame or a message partly received, or a unary call whose request has not
        ended."""
        return bool(self.http2.partial) or any(c.reader.buffered or (c.kind == "unary" and not c.ended)
                                              for c in self.calls.values())

    @property
    def buffered(self):
        """Bytes held of requests under way: an incomplete frame (the HTTP/2 layer holds it) and the messages partly
        received."""
        return self.http2.partial + sum(c.reader.buffered for c in self.calls.values())

    @property
    def busy(self):
        return self.running > 0 or self.in_frame

    # -- the connection's loop ---------------------------------------------------------------------------------

    def serve(self):
        self.http2.initiate()
        try:
            self._flush()
            turn, polls = time.monotonic(), loop_polls()
            while not self.closed and not self.ended:
                data = self.receive(rmq5_limits.GRPC_RECV_BYTES)
                if not data:
                    break
                if self.ended:  # a call's end ended the connection meanwhile (its GOAWAY sent): no more is read
                    self._drain_after_goaway()
                    break
                if not self._read(data):
                    break
                self._flush()
                if self._over():
                    self._end_cleanly()
                    self._drain_after_goaway()
                    break
                # a client that keeps the socket full lets the others run; a read that waited for it let them
                turn, polls = turn_after(turn, polls)
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
                if not self.closed and not self.http2.closed:
                    self.http2.close()
                    self._flush()
            except (OSError, ProtocolError):
                pass

    def _read(self, data):
        """Hand ``data`` to the HTTP/2 layer and serve its events; False when the connection ends (a frame too large,
        a budget passed, a protocol error: each a GOAWAY)."""
        self.budget.tick(time.monotonic())
        try:
            events = self.http2.receive(data)
        except ProtocolError as exc:
            if exc.code == ErrorCode.PROTOCOL_ERROR:
                log.info("grpc %s: HTTP/2 protocol error, closing: %s", self.peer, exc)
            else:  # a frame too large, a flood budget passed, a flow-control or compression error
                log.info("grpc %s: %s; closing (GOAWAY %s)", self.peer, exc, exc.code.name)
            self._flush()  # the GOAWAY the layer queued
            if exc.code == ErrorCode.ENHANCE_YOUR_CALM and self.budget.wasteful():
                self._cut_for_flooding()
            else:
                self._drain_after_goaway()
            return False
        self._reading = gevent.getcurrent()  # calls answered on it are flushed with this read's answers, after it
        try:
            for kind, stream_id, a, b in events:  # each ``http2`` event, by its kind
                if kind == http2.REQUEST:
                    self._request(stream_id, a)
                elif kind == http2.DATA_RECEIVED:
                    self._data(stream_id, a, b)
                elif kind == http2.ENDED:
                    self._ended(stream_id)
                elif kind == http2.WINDOW:  # a call waiting for the client's window looks again
                    self._window.set()
                    if self.plain:
                        self._plain_bodies()
                else:
                    self._event(kind, stream_id, a)
        except ProtocolError as exc:  # headers that fail HTTP/2's checks (``CheckedHeaders``), or a flood (``_data``)
            if exc.code == ErrorCode.ENHANCE_YOUR_CALM:
                log.info("grpc %s: %s; closing (GOAWAY ENHANCE_YOUR_CALM)", self.peer, exc)
                self.http2.close(exc.code, str(exc).encode()[:200])
                self._flush()
                self._cut_for_flooding()
                return False
            return self._refuse(ErrorCode.PROTOCOL_ERROR, "headers that fail HTTP/2's checks: %s" % exc)
        finally:
            self._reading = None
        return True

    def _refuse(self, error_code, why):
        """End the connection with GOAWAY ``error_code``, saying ``why`` in the log; False."""
        log.info("grpc %s: %s; closing (GOAWAY %s)", self.peer, why, error_code.name)
        self.http2.close(error_code, why.encode()[:200])
        self._flush()
        self._drain_after_goaway()
        return False

    def _over(self):
        """True once a GOAWAY was sent either way and the calls it waits for are over: after the client's, every
        stream it opened (its Telemetry streams end when it half-closes them); after the port's (``drain``), every
        unary call, its request still arriving or being answered (the Telemetry streams are then the port's to
        end)."""
        if self.running or (self.draining is None and not self.goaway):
            return False
        if self.draining is not None:
            return all(c.kind == "telemetry" for c in self.calls.values())
        return not self.calls

    def drain(self):
        """The broker is shutting down (the core, before its grace): GOAWAY naming the last stream taken, so the
        client opens no more; the calls open go on; with none running, the connection ends cleanly at once. Sent
        from a greenlet of its own: a client that reads nothing cannot hold the shutdown."""
        if self.closed or self.ended or self.draining is not None:
            return
        self.draining = self.http2.last_taken
        gevent.spawn(self._announce)

    def _announce(self):
        """``drain``'s GOAWAY, after what is queued to send; the connection stays open for the streams it names."""
        try:
            with self._send_lock:
                if not self.http2.closed:
                    self.http2.goaway(self.draining)
                data = self.http2.data_to_send()
                if not self.closed:
                    self.sock.sendall(data)
            if self._over():
                self._end_cleanly()
        except OSError as exc:
            log.debug("grpc %s: %s", self.peer, exc)

    def _end_cleanly(self):
        """After a GOAWAY either way, once the calls that count are over: end the Telemetry streams left (OK), send
        the last GOAWAY, and shut this side (the client closes its own once it has read them)."""
        if self.ended or self.closed:
            return
        self.ended = True
        for call in list(self.calls.values()):  # Telemetry streams: their client goes elsewhere
            if call.kind == "telemetry":
                self._finish(call, Status.OK, reset=True)
            else:
                self._finish(call, Status.UNAVAILABLE, "the broker is shutting down", reset=True)
        try:
            self.http2.close()
            self._flush()
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            log.debug("grpc %s: %s", self.peer, exc)

    def _cut_for_flooding(self):
        """A flood cut (its GOAWAY ENHANCE_YOUR_CALM sent): its address cools down (``on_flood``), and the
        connection reads at most ``limits.GRPC_CALM_LINGER_BYTES`` more before it closes, not ``LINGER_S`` of a
        flood."""
        if self.on_flood is not None and isinstance(self.address, tuple):
            self.on_flood(self.address[0])
        self._drain_after_goaway(rmq5_limits.GRPC_CALM_LINGER_BYTES)

    def _drain_after_goaway(self, most=None):
        """After a GOAWAY: stop sending and read what the client still sends, at most ``LINGER_S``, so that the
        close does not reset the connection before the client has read the GOAWAY (a close with unread bytes sends
        a TCP reset, which may discard them); a client still flooding lets the other connections run meanwhile
        (``turn_after``: a receive with bytes waiting never yields). ``most``: the bytes read at most (None: no
        bound but the time)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER_S
            turn, polls = time.monotonic(), loop_polls()
            left = most
            while time.monotonic() < deadline and (left is None or left > 0):
                self.sock.settimeout(max(0.001, deadline - time.monotonic()))
                got = self.sock.recv(65536 if left is None else min(left, 65536))
                if not got:
                    break
                if left is not None:
                    left -= len(got)
                turn, polls = turn_after(turn, polls)
        except OSError:
            pass

    def _event(self, kind, stream_id, a):
        """One ``http2`` event of the rarer kinds (``_read`` serves a request, its data, its end and a window)."""
        if kind == http2.TRAILERS:
            self.checked.trailers(a)
        elif kind == http2.RESET:
            self.plain.pop(stream_id, None)
            call = self.calls.pop(stream_id, None)
            if call is not None:
                call.reset = True
                call.cancelled.set()  # its parked wait ends now; what it took is given back (``_unsent``)
                self._window.set()
                if call.kind == "telemetry":
                    self.service.telemetry_closed(call)
        elif kind == http2.SETTINGS_CHANGED:  # a new initial window: as a WINDOW_UPDATE
            self._window.set()
            if self.plain:
                self._plain_bodies()
        elif kind == http2.GOAWAY:  # the client is leaving: its streams go on to their end (RFC 9113 section 6.8)
            self.goaway = True

    def _request(self, stream_id, headers):
        metadata = self.checked.request(headers)  # ProtocolError: the connection ends (``_read``)
        if self.draining is not None and stream_id > self.draining:  # opened after the port's GOAWAY
            try:
                self.http2.reset_stream(stream_id, ErrorCode.REFUSED_STREAM)
            except StreamClosed:
                pass
            return
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
                                            MessageReader(self.limits.max_message_bytes), self.session, self.call_peer)
        if kind == "telemetry":
            call.push = lambda payload: self._send_message(call, payload)

    def _data(self, sid, data, flow_controlled):
        """DATA for a call; on a stream with no call to take it (a plain answer's, a call already answered) a frame
        that did no work, counted as one (``FloodBudget.wasted``: its ProtocolError ends the connection)."""
        self.http2.acknowledge(sid, flow_controlled)
        call = self.calls.get(sid)
        if call is None or call.done:
            excess = self.budget.wasted()
            if excess is not None:
                raise ProtocolError(excess, ErrorCode.ENHANCE_YOUR_CALM)
            return
        try:
            messages = call.reader.feed(data)
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
        if call.timeout_s > 0 and self._unary_now(call):
            return
        call.greenlet = gevent.spawn(self._unary, call)

    def _unary_now(self, call):
        """Answer ``call`` on the reader, in this turn, when the service can without waiting (``wire.WAITS``
        otherwise: False, nothing done, and the call gets its greenlet), as the remoting port answers a send that
        does not wait: no greenlet and no deadline timer a call (nothing in it waits). Its answer is flushed with the
        read's (``serve``); one the flow-control windows cannot take whole now is sent from a greenlet of its own (a
        window waits for the client's WINDOW_UPDATE, which this reader reads). Answers as ``_unary`` does."""
        try:
            response = self.service.call(call.rpc, call, call.requests[0], wait=False)
        except GrpcError as exc:
            response, status, message = None, exc.status, exc.message
        except Exception:
            log.exception("grpc %s: %s failed", self.peer, call.rpc)
            response, status, message = None, Status.INTERNAL, "internal error answering %s" % call.rpc
        else:
            if response is WAITS:
                return False
            framed = frame(response) if type(response) is bytes else frames(response)
            answered = self._answer(call, framed)
            if answered is None:  # the windows cannot take it whole now: its own greenlet waits for them
                call.greenlet = gevent.spawn(self._unary, call, response)
                return True
            status = message = None
        try:
            if status is not None:
                self._finish(call, status, message)
            elif not answered:
                _unsent(call)
        finally:
            self._unary_done()
        return True

    def _answer(self, call, framed):
        """Queue a unary call's whole answer at once (``http2.send_answer``): the response headers, its messages
        (``framed``) and the OK trailers, the call done. True when queued; False when the call or the connection
        ended first (nothing more reaches the client); None, nothing queued, when the flow-control windows cannot
        take ``framed`` now."""
        if not self._open(call):
            self.calls.pop(call.stream_id, None)
            return False
        try:
            sent = self.http2.send_answer(call.stream_id, RESPONSE_HEADERS_RAW, framed, OK_TRAILERS_RAW)
        except StreamClosed:
            self.calls.pop(call.stream_id, None)
            return False
        if sent is None:
            return None
        self.budget.sent_data(sent)
        call.headers_sent = call.done = True
        self.calls.pop(call.stream_id, None)
        self._flush_soon()
        return True

    def _unary(self, call, response=WAITS):
        """Answer one unary call (its own greenlet): the service's response, or the status it ended with;
        ``response``: the one the service gave already (``_unary_now``), to send."""
        try:
            if response is WAITS:
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
            # the messages in runs of FLUSH_BYTES, each run sent as one DATA frame where the windows and the
            # frame size allow; a whole run is flushed, the last one's bytes go with the trailers' flush
            for run, whole in _runs(response if isinstance(response, list) else [response]):
                if not self._send_framed(call, run, flush=whole):
                    _unsent(call)
                    return
            if not self._finish(call, Status.OK):
                _unsent(call)
        except OSError as exc:
            log.debug("grpc %s: %s", self.peer, exc)
            _unsent(call)
        except gevent.GreenletExit:  # the connection ended: what the call took goes back
            _unsent(call)
            raise
        finally:
            self._unary_done()

    def _unary_done(self):
        """A unary call is over (answered, refused or given up)."""
        self.running -= 1
        if self._over():
            self._end_cleanly()  # the last call after a GOAWAY: the connection ends (before the core's close)

    # -- sending -----------------------------------------------------------------------------------------------

    def _open(self, call):
        return not (call.reset or call.done or self.closed)

    def _send_message(self, call, payload, flush=True):
        """Send one response message on ``call`` (``_send_framed``)."""
        return self._send_framed(call, frame(payload), flush)

    def _send_framed(self, call, framed, flush=True):
        """Send response messages, ``framed`` (``wire.frame``'s, one after another), on ``call`` within the
        flow-control windows; False when the call or the connection ended first. ``flush`` False: their frames wait
        queued for the next flush (a unary call's trailers send them; a shut window flushes before it waits)."""
        if not self._open(call):
            return False
        if not call.headers_sent:
            try:
                self.http2.send_headers(call.stream_id, list(RESPONSE_HEADERS_RAW))
            except StreamClosed:  # the connection ended meanwhile (its last GOAWAY sent)
                return False
            call.headers_sent = True
        data = memoryview(framed)
        deadline = time.monotonic() + self.request_timeout
        while data:
            if not self._open(call):
                return False
            try:
                room = min(len(data), self.http2.local_flow_control_window(call.stream_id),
                           self.http2.max_outbound_frame_size)
            except StreamClosed:
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
            self.http2.send_data(call.stream_id, data[:room])
            if room == len(data) or room >= rmq5_limits.GRPC_SMALL_FRAME_BYTES:  # (a sliver the window let out earns
                self.budget.sent_data()  # the client nothing: the data dribble, windows opened a byte at a time)
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
                self.http2.send_headers(call.stream_id, ends, end_stream=True)
            else:
                self.http2.send_headers(call.stream_id, trailers_only(status, message), end_stream=True)
            if reset and not call.ended:
                self.http2.reset_stream(call.stream_id, ErrorCode.NO_ERROR)
        except StreamClosed:
            return False
        self._flush_soon()
        return True

    def _end_now(self, stream_id, status, message):
        """A call refused from its headers: Trailers-Only, and RST_STREAM unless the client's side is over."""
        try:
            self.http2.send_headers(stream_id, trailers_only(status, message), end_stream=True)
            if self.http2.remote_open(stream_id):
                self.http2.reset_stream(stream_id, ErrorCode.NO_ERROR)
        except StreamClosed:
            pass

    def _plain_answer(self, stream_id, http_status):
        """An HTTP answer that is no gRPC response (a wrong method or content type): its status and a line of text
        (``PLAIN_BODIES``), sent as the client's window takes it (``_plain_body``)."""
        try:
            self.http2.send_headers(stream_id, [(":status", http_status), ("content-type", "text/plain")])
            self._plain_body(stream_id, PLAIN_BODIES[http_status])
        except StreamClosed:
            pass

    def _plain_body(self, stream_id, body):
        """Send what the client's window takes of a plain answer's text: the whole of it ends the port's side (the
        client may finish its request, whose DATA the HTTP/2 layer still checks, then ignored); the rest waits in
        ``plain`` for the window to grow, its stream open meanwhile (one of the connection's streams)."""
        room = self.http2.local_flow_control_window(stream_id)
        if room < len(body):
            if room > 0:
                self.http2.send_data(stream_id, body[:room])
                body = body[room:]
            self.plain[stream_id] = body
            return
        self.plain.pop(stream_id, None)
        self.http2.send_data(stream_id, body, end_stream=True)

    def _plain_bodies(self):
        """The client's window grew: the plain answers waiting get what it takes now."""
        for stream_id, body in list(self.plain.items()):
            try:
                self._plain_body(stream_id, body)
            except StreamClosed:
                self.plain.pop(stream_id, None)

    def _flush_soon(self):
        """Flush from a greenlet of its own, once the calls that are ready now have run: the responses of the calls
        answered in one turn of the loop (a burst of requests read at once) leave in one send, not one each. The
        connection's end (``serve``) flushes whatever is still pending itself."""
        if self._reading is not None and self._reading is gevent.getcurrent():
            return  # a call answered on the reader: the reader flushes after its read (``serve``)
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
        """Hand the HTTP/2 layer's pending bytes to the socket, in order (one greenlet at a time takes and sends
        them). One ``send`` mostly takes them all; gevent's ``sendall`` (a Timeout object, a getsockopt) only sends
        the rest."""
        with self._send_lock:
            data = self.http2.data_to_send()
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
        return GrpcConnection(sock, address, conn_id, self.core.rules, self.service, self.limits, self._flooded)

    def _flooded(self, host):
        """A connection from ``host`` was cut for flooding: the host cools down (``ConnectionCore.penalize``)."""
        cooldown = self.core.penalize("grpc", host, self.limits.flood_penalty_s)
        if cooldown:
            log.info("grpc %s: cut for flooding; its new connections are refused for %.1f s", host, cooldown)

    def connection_count(self):
        return self.core.count("grpc")

    def flood_counts(self):
        """``(refused, penalized)`` of the addresses cut for flooding (``ConnectionCore.penalty_counts``)."""
        return self.core.penalty_counts()


def _runs(payloads):
    """``(framed, whole)``: ``payloads`` framed (``wire.frame``) and joined in runs of ``FLUSH_BYTES`` or more,
    ``whole`` False for the last run when it is shorter (its bytes may wait for the trailers)."""
    run, size = [], 0
    for payload in payloads:
        framed = frame(payload)
        run.append(framed)
        size += len(framed)
        if size >= FLUSH_BYTES:
            yield b"".join(run), True
            run, size = [], 0
    if run:
        yield b"".join(run), False


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
