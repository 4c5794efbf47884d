"""HTTP/2 for the gRPC port, server side only, sans-IO (RFC 9113): bytes in, events out, bytes to send.

The port needs a small part of HTTP/2: a client opens streams with HEADERS, sends DATA and maybe trailers, the
server answers with HEADERS, DATA and trailing HEADERS; no server push, no priorities. ``ServerConnection`` does
that part and the connection's duties around it, with no object per frame: a frame is read from the buffer by one
``struct`` unpack of its 9-byte header and written from a packed header and its payload; a stream is a small
record (``Stream``: which sides are open, the two windows) instead of a state machine. HPACK stays the ``hpack``
library's (the port hands in its caching coder, ``headercache``).

What it does, and refuses (a connection error queues GOAWAY with the code and raises ``ProtocolError``; a stream
error queues RST_STREAM and, for a stream the port knows, reports ``RESET``):

* the client's preface, then SETTINGS both ways (each acknowledged; the client's first frame must be its
  SETTINGS, else PROTOCOL_ERROR); values checked: ENABLE_PUSH 0 or 1,
  INITIAL_WINDOW_SIZE at most 2^31-1 (FLOW_CONTROL_ERROR), MAX_FRAME_SIZE 2^14 to 2^24-1; a new initial window
  applies to the open streams' send windows; a new header table size to the encoder;
* PING answered (ACK); PRIORITY (a stream depending on itself: PROTOCOL_ERROR) and unknown frame types ignored;
  PUSH_PROMISE from a client is PROTOCOL_ERROR;
* HEADERS (padding, the priority fields) and CONTINUATION: one header block at a time, nothing else between, its
  parts gathered and joined once; stream ids odd and increasing (HEADERS on a lower id is a connection error:
  PROTOCOL_ERROR on an id never opened, STREAM_CLOSED on a stream the client ended; on a stream reset before
  that, a stream error STREAM_CLOSED; ``limits.GRPC_CLOSED_STREAMS_KEPT``); a stream past the announced
  SETTINGS_MAX_CONCURRENT_STREAMS is refused (REFUSED_STREAM, which a client retries; a GOAWAY names only streams
  taken, ``last_taken``); a second HEADERS on a stream is its trailers, which must end it; a header list past
  SETTINGS_MAX_HEADER_LIST_SIZE is ENHANCE_YOUR_CALM, a block that does not decode COMPRESSION_ERROR;
* DATA (padding) within both receive windows (FLOW_CONTROL_ERROR), given back by WINDOW_UPDATE as the port
  acknowledges what it consumed (``acknowledge``); a frame on a stream never opened is PROTOCOL_ERROR, on a closed
  or half-closed (remote) one STREAM_CLOSED; DATA that does not add up to a request's content-length is a stream
  error PROTOCOL_ERROR (RFC 9113 section 8.1.1);
* WINDOW_UPDATE for the connection and a stream: zero is PROTOCOL_ERROR (a stream error, on a closed stream too),
  past 2^31-1 FLOW_CONTROL_ERROR;
* RST_STREAM ends a stream; GOAWAY is reported (``GOAWAY``) and the streams go on (RFC 9113 section 6.8).

Limits before work: a frame declared past SETTINGS_MAX_FRAME_SIZE is refused from its header (FRAME_SIZE_ERROR),
before its body arrives; each frame is shown to ``on_frame`` once, as its header is whole (its body may still be
coming), and a reason it returns ends the connection (ENHANCE_YOUR_CALM) before the frame is buffered or served:
the port's flood budgets; each frame refused with a stream error is shown to ``on_wasted`` alike. ``partial`` is
the bytes held of a frame not yet whole.

Events are tuples ``(kind, stream_id, a, b)``: ``REQUEST`` (a: the header list, bytes pairs), ``DATA`` (a: the
data, b: the flow-controlled length, padding included), ``ENDED`` (the client half-closed), ``TRAILERS`` (a: the
header list), ``RESET`` (a: the error code), ``WINDOW`` (a: the increment), ``SETTINGS_CHANGED`` (a: the values
received, a dict), ``GOAWAY`` (a: the last stream id, b: the error code).
"""

import enum
import struct
from collections import OrderedDict, deque

from hpack import HPACKError, OversizedHeaderListError

from metaq.rmq5 import limits as rmq5_limits

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY_FRAME, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = \
    range(1, 7)
DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 1 << 14
MAX_WINDOW = (1 << 31) - 1
MAX_FRAME_LIMIT = (1 << 24) - 1

REQUEST, DATA_RECEIVED, ENDED, TRAILERS, RESET, WINDOW, SETTINGS_CHANGED, GOAWAY = range(8)

_HEAD = struct.Struct(">HBBBI")  # length (16 and 8 bits), type, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_GOAWAY = struct.Struct(">II")


class ErrorCode(enum.IntEnum):
    """HTTP/2's error codes (RFC 9113 section 7)."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    SETTINGS_TIMEOUT = 4
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    CONNECT_ERROR = 10
    ENHANCE_YOUR_CALM = 11
    INADEQUATE_SECURITY = 12
    HTTP_1_1_REQUIRED = 13


class ProtocolError(Exception):
    """A connection error: the connection ends with GOAWAY ``code`` (already queued when raised by ``receive``)."""

    def __init__(self, message, code=ErrorCode.PROTOCOL_ERROR):
        super().__init__(message)
        self.code = ErrorCode(code)


class StreamClosed(Exception):
    """The port sent on a stream that is closed (or its own side of it is)."""


def frame_head(length, ftype, flags, stream_id):
    """A frame's 9-byte header."""
    return _HEAD.pack(length >> 8, length & 0xFF, ftype, flags, stream_id)


class Stream:
    """One stream: which sides are open (both: open; the client's ended: half-closed (remote); the server's ended:
    half-closed (local); a closed stream is no longer kept) and its windows."""

    __slots__ = ("remote_open", "local_open", "inbound", "outbound", "unacked", "remaining")

    def __init__(self, inbound, outbound, remaining=None):
        self.remote_open = True
        self.local_open = True
        self.inbound = inbound  # what the client may still send on it
        self.outbound = outbound  # what the server may still send on it
        self.unacked = 0  # bytes the port consumed and not yet given back by WINDOW_UPDATE
        self.remaining = remaining  # bytes of DATA its content-length still announces (None: none announced)


def _increment(window, processed, maximum):
    """How much of a receive window to give back once ``processed`` bytes are consumed: all of them when half the
    window is consumed, or when the window is shut and a little is (so a stream never stalls); else nothing yet."""
    if processed and (processed >= maximum // 2 or (window == 0 and processed > min(1024, maximum // 4))):
        return processed
    return 0


class ServerConnection:
    """A server's HTTP/2 connection (see the module doc). ``encoder`` and ``decoder`` are hpack's (or subclasses);
    ``window`` is the receive window announced for each stream, ``connection_window`` what the connection's receive
    window is opened by beyond the default."""

    def __init__(self, encoder, decoder, max_streams, max_header_bytes, window=DEFAULT_WINDOW, connection_window=0):
        self.encoder = encoder
        self.decoder = decoder
        decoder.max_header_list_size = max_header_bytes
        self.max_streams = max_streams
        self.max_header_bytes = max_header_bytes
        self.window = window
        self.connection_window = DEFAULT_WINDOW + connection_window  # the connection's receive window, at most
        self.max_inbound_frame_size = DEFAULT_MAX_FRAME
        self.max_outbound_frame_size = DEFAULT_MAX_FRAME
        self.remote_initial_window = DEFAULT_WINDOW
        self.inbound = DEFAULT_WINDOW  # the connection's receive window left
        self.outbound = DEFAULT_WINDOW  # the connection's send window left
        self.unacked = 0
        self.streams = {}
        self.highest_inbound_stream_id = 0  # the highest stream id the client used: every lower one is not idle
        self.last_taken = 0  # the highest stream id handed to the port (REQUEST): what a GOAWAY names as processed
        self.closed = False  # the server sent its last GOAWAY: nothing more is read or sent
        self._out = []
        self._buf = b""
        self._preface = 0  # bytes of the preface received; 25 once the SETTINGS that must follow it began
        self._block = None  # a header block awaiting CONTINUATION: [stream id, end stream, bad priority, parts]
        self._shown = False  # the frame begun at ``_buf``'s start was shown to ``on_frame`` already
        self._connection_increment = connection_window
        self._announced = None  # the last stream id a GOAWAY named: a later one names no higher
        self._next_stream = 1  # the id the client's next stream takes unless it skips some
        #: What tells a lower stream id's HEADERS apart, each the last ``limits.GRPC_CLOSED_STREAMS_KEPT``: the
        #: streams reset before the client ended them (id -> what is left of the receive window the client may
        #: still fill with DATA it sent before it knew: ``_data_in_flight``; oldest first) and the runs of ids the
        #: client skipped (never opened); any other lower id is a stream the client ended.
        self._reset_ids = OrderedDict()
        self._skipped = deque(maxlen=rmq5_limits.GRPC_CLOSED_STREAMS_KEPT)
        #: Called ``(type, flags, length, stream id)`` for each frame as its header is whole; a reason (text)
        #: returned ends the connection with ENHANCE_YOUR_CALM.
        self.on_frame = None
        #: Called ``()`` for each frame refused with a stream error (a frame that did no work: DATA or HEADERS on a
        #: closed stream, a stream past SETTINGS_MAX_CONCURRENT_STREAMS, ...); a reason returned ends the
        #: connection with ENHANCE_YOUR_CALM.
        self.on_wasted = None

    @property
    def partial(self):
        """Bytes held of a frame begun and not yet whole (its header, its body so far)."""
        return len(self._buf)

    # -- sending ----------------------------------------------------------------------------------------------

    def initiate(self):
        """The server's preface: its SETTINGS, and the connection window opened."""
        settings = _SETTING.pack(MAX_CONCURRENT_STREAMS, self.max_streams) + \
            _SETTING.pack(INITIAL_WINDOW_SIZE, self.window) + _SETTING.pack(MAX_HEADER_LIST_SIZE, self.max_header_bytes)
        self._out.append(frame_head(len(settings), SETTINGS, 0, 0) + settings)
        if self._connection_increment:
            self.inbound += self._connection_increment
            self._out.append(frame_head(4, WINDOW_UPDATE, 0, 0) + _U32.pack(self._connection_increment))

    def data_to_send(self):
        """The bytes queued since the last call."""
        out = self._out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        return data

    def _stream_to_send(self, stream_id):
        stream = self.streams.get(stream_id)
        if stream is None or not stream.local_open or self.closed:
            raise StreamClosed("stream %d is closed" % stream_id)
        return stream

    def send_headers(self, stream_id, headers, end_stream=False):
        """A header block on ``stream_id`` (HEADERS, and CONTINUATIONs past the client's maximum frame size)."""
        stream = self._stream_to_send(stream_id)
        self._out.append(self._header_frames(stream_id, headers, END_STREAM if end_stream else 0))
        if end_stream:
            self._end_local(stream_id, stream)

    def _header_frames(self, stream_id, headers, end):
        """The frames of a header block of ``headers``: HEADERS (flags ``end``), and CONTINUATIONs past the client's
        maximum frame size."""
        block = self.encoder.encode(headers)
        size = self.max_outbound_frame_size
        if len(block) <= size:
            return frame_head(len(block), HEADERS, end | END_HEADERS, stream_id) + block
        chunks = [block[i:i + size] for i in range(0, len(block), size)]
        out = [frame_head(len(chunks[0]), HEADERS, end, stream_id) + chunks[0]]
        for i, chunk in enumerate(chunks[1:], 2):
            out.append(frame_head(len(chunk), CONTINUATION, END_HEADERS if i == len(chunks) else 0, stream_id) + chunk)
        return b"".join(out)

    def send_answer(self, stream_id, headers, data, trailers):
        """A whole answer on ``stream_id`` at once, or nothing: a header block of ``headers``, ``data`` (bytes) in
        DATA frames of at most the client's maximum frame size, and a header block of ``trailers`` that ends the
        stream. None, nothing queued, when ``data`` does not fit the send windows now; else the DATA frames
        queued."""
        stream = self._stream_to_send(stream_id)
        size = len(data)
        if size > self.outbound or size > stream.outbound:
            return None
        out = self._out
        out.append(self._header_frames(stream_id, headers, 0))
        step = self.max_outbound_frame_size
        if not size:
            frames = 0
        elif size <= step:
            out.append(frame_head(size, DATA, 0, stream_id))
            out.append(data)
            frames = 1
        else:
            view, frames = memoryview(data), 0
            for at in range(0, size, step):
                chunk = view[at:at + step]
                out.append(frame_head(len(chunk), DATA, 0, stream_id))
                out.append(chunk)
                frames += 1
        self.outbound -= size
        stream.outbound -= size
        out.append(self._header_frames(stream_id, trailers, END_STREAM))
        self._end_local(stream_id, stream)
        return frames

    def send_data(self, stream_id, data, end_stream=False):
        """One DATA frame; ``data`` (bytes or a memoryview of bytes that do not change) must fit the windows
        (``local_flow_control_window``) and the client's maximum frame size."""
        stream = self._stream_to_send(stream_id)
        size = len(data)
        if size > self.outbound or size > stream.outbound or size > self.max_outbound_frame_size:
            raise ValueError("%d bytes do not fit the flow-control window or the frame size" % size)
        self.outbound -= size
        stream.outbound -= size
        self._out.append(frame_head(size, DATA, END_STREAM if end_stream else 0, stream_id))
        self._out.append(data)
        if end_stream:
            self._end_local(stream_id, stream)

    def _end_local(self, stream_id, stream):
        stream.local_open = False
        if not stream.remote_open:
            del self.streams[stream_id]

    def _reset_before_its_end(self, stream_id, window=0):
        """``stream_id`` was reset (or refused) before the client ended it: frames it still has in flight for it
        are stream errors, not connection errors (kept among the last ``limits.GRPC_CLOSED_STREAMS_KEPT``), and
        full DATA frames up to ``window`` (its receive window left; 0: the client reset it) no work wasted."""
        reset = self._reset_ids
        reset[stream_id] = window
        if len(reset) > rmq5_limits.GRPC_CLOSED_STREAMS_KEPT:
            reset.popitem(last=False)

    def reset_stream(self, stream_id, code=ErrorCode.NO_ERROR):
        """RST_STREAM: the stream ends both ways."""
        stream = None if self.closed else self.streams.pop(stream_id, None)
        if stream is None:
            raise StreamClosed("stream %d is closed" % stream_id)
        if stream.remote_open:
            self._reset_before_its_end(stream_id, stream.inbound)
        self._out.append(frame_head(4, RST_STREAM, 0, stream_id) + _U32.pack(code))

    def local_flow_control_window(self, stream_id):
        """How many bytes may be sent on ``stream_id`` now (both send windows)."""
        stream = self._stream_to_send(stream_id)
        return min(self.outbound, stream.outbound)

    def remote_open(self, stream_id):
        """Whether the client may still send on ``stream_id`` (it has neither ended nor reset it)."""
        stream = self.streams.get(stream_id)
        return stream is not None and stream.remote_open

    def acknowledge(self, stream_id, size):
        """The port consumed ``size`` flow-controlled bytes of ``stream_id``: the windows are opened again by
        WINDOW_UPDATE once enough is consumed (``_increment``); a stream the client has ended gets none."""
        if self.closed:
            return
        self._acknowledge_connection(size)
        stream = self.streams.get(stream_id)
        if stream is not None and stream.remote_open:
            stream.unacked += size
            more = _increment(stream.inbound, stream.unacked, self.window)
            if more:
                stream.inbound += more
                stream.unacked = 0
                self._out.append(frame_head(4, WINDOW_UPDATE, 0, stream_id) + _U32.pack(more))

    def _acknowledge_connection(self, size):
        self.unacked += size
        more = _increment(self.inbound, self.unacked, self.connection_window)
        if more:
            self.inbound += more
            self.unacked = 0
            self._out.append(frame_head(4, WINDOW_UPDATE, 0, 0) + _U32.pack(more))

    def goaway(self, last_stream_id, code=ErrorCode.NO_ERROR, data=b""):
        """A GOAWAY that leaves the connection open: the streams up to ``last_stream_id`` go on (a shutdown's
        first announcement); a later GOAWAY names no higher stream (RFC 9113 section 6.8)."""
        if self._announced is not None:
            last_stream_id = min(last_stream_id, self._announced)
        self._announced = last_stream_id
        self._out.append(frame_head(8 + len(data), GOAWAY_FRAME, 0, 0) + _GOAWAY.pack(last_stream_id, code) + data)

    def close(self, code=ErrorCode.NO_ERROR, data=b""):
        """The last GOAWAY (naming the highest stream taken, ``last_taken``; a stream refused is none): nothing
        more is sent or read."""
        if not self.closed:
            self.goaway(self.last_taken, code, data)
            self.closed = True

    # -- receiving --------------------------------------------------------------------------------------------

    def receive(self, data):
        """The events of the frames ``data`` completes (an incomplete frame is kept for the next call); raises
        ProtocolError on a connection error, with its GOAWAY queued."""
        if self.closed:
            return []
        buf = self._buf + data if self._buf else bytes(data)
        pos, end = 0, len(buf)
        events = []
        try:
            if self._preface < 25:
                pos = self._take_preface(buf, end)
            on_frame = self.on_frame
            while end - pos >= 9:
                hi, lo, ftype, flags, sid = _HEAD.unpack_from(buf, pos)
                length = hi << 8 | lo
                sid &= 0x7FFFFFFF
                if length > self.max_inbound_frame_size:
                    raise ProtocolError("a frame of %d bytes: the advertised SETTINGS_MAX_FRAME_SIZE is %d" % (
                        length, self.max_inbound_frame_size), ErrorCode.FRAME_SIZE_ERROR)
                if self._shown:
                    self._shown = False
                elif on_frame is not None:
                    excess = on_frame(ftype, flags, length, sid)
                    if excess is not None:
                        raise ProtocolError(excess, ErrorCode.ENHANCE_YOUR_CALM)
                if end - pos - 9 < length:
                    self._shown = True
                    break
                payload = buf[pos + 9:pos + 9 + length]
                pos += 9 + length
                # the frame, by its type
                if self._block is not None and ftype != CONTINUATION:
                    raise ProtocolError("a frame inside a header block (CONTINUATION expected)")
                if ftype == DATA:
                    self._data(flags, sid, payload, events)
                elif ftype == HEADERS:
                    self._headers(flags, sid, payload, events)
                elif ftype == WINDOW_UPDATE:
                    self._window_update(sid, payload, events)
                elif ftype == SETTINGS:
                    self._settings(flags, sid, payload, events)
                else:
                    self._other(ftype, flags, sid, payload, events)
        except ProtocolError as exc:
            self.close(exc.code, str(exc).encode()[:200])
            raise
        self._buf = buf[pos:] if pos < end else b""
        return events

    def _take_preface(self, buf, end):
        """The bytes of the client's preface at ``buf``'s start (ProtocolError when they are not), and the first
        frame's header after it checked: a SETTINGS that is no ACK (RFC 9113 section 3.4)."""
        take = min(24 - self._preface, end)
        if buf[:take] != PREFACE[self._preface:self._preface + take]:
            raise ProtocolError("the client's connection preface is wrong")
        self._preface += take
        if self._preface == 24 and end - take >= 5:
            if buf[take + 3] != SETTINGS or buf[take + 4] & ACK:
                raise ProtocolError("the client's preface is not followed by its SETTINGS")
            self._preface = 25
        return take

    def _other(self, ftype, flags, sid, payload, events):
        """The rarer frames: PING, RST_STREAM, CONTINUATION, PRIORITY, GOAWAY, PUSH_PROMISE, unknown types."""
        if ftype == PING:
            if sid:
                raise ProtocolError("PING on a stream")
            if len(payload) != 8:
                raise ProtocolError("PING of %d bytes" % len(payload), ErrorCode.FRAME_SIZE_ERROR)
            if not flags & ACK:
                self._out.append(frame_head(8, PING, ACK, 0) + payload)
        elif ftype == RST_STREAM:
            self._reset(sid, payload, events)
        elif ftype == CONTINUATION:
            self._continuation(flags, sid, payload, events)
        elif ftype == PRIORITY:
            self._priority(sid, payload, events)
        elif ftype == GOAWAY_FRAME:
            if sid:
                raise ProtocolError("GOAWAY on a stream")
            if len(payload) < 8:
                raise ProtocolError("GOAWAY of %d bytes" % len(payload), ErrorCode.FRAME_SIZE_ERROR)
            last, code = _GOAWAY.unpack_from(payload)
            events.append((GOAWAY, 0, last & 0x7FFFFFFF, code))
        elif ftype == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE from a client")
        # any other type: ignored (RFC 9113 section 4.1)

    def _priority(self, sid, payload, events):
        """PRIORITY: ignored, once checked (its size; a stream depending on itself is PROTOCOL_ERROR, a connection
        error on an idle stream, which no RST_STREAM may name)."""
        if not sid:
            raise ProtocolError("PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(sid, ErrorCode.FRAME_SIZE_ERROR, events)
        elif _U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
            if sid > self.highest_inbound_stream_id:
                raise ProtocolError("PRIORITY making idle stream %d depend on itself" % sid)
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)

    def _stream_error(self, sid, code, events):
        """RST_STREAM ``code`` on ``sid``; a stream still kept ends (``RESET`` for the port). The frame refused did
        no work: ``on_wasted`` counts it."""
        if self.on_wasted is not None:
            excess = self.on_wasted()
            if excess is not None:
                raise ProtocolError(excess, ErrorCode.ENHANCE_YOUR_CALM)
        self._out.append(frame_head(4, RST_STREAM, 0, sid) + _U32.pack(code))
        stream = self.streams.pop(sid, None)
        if stream is not None:
            if stream.remote_open:
                self._reset_before_its_end(sid, stream.inbound)
            events.append((RESET, sid, code, None))

    def _unpad(self, payload, ftype_name):
        """``(start, stop)`` of a PADDED frame's payload without its padding."""
        if not payload or payload[0] >= len(payload):
            raise ProtocolError("%s whose padding is not shorter than its payload" % ftype_name)
        return 1, len(payload) - payload[0]

    def _data(self, flags, sid, payload, events):
        if not sid:
            raise ProtocolError("DATA on stream 0")
        flow = len(payload)
        if flow > self.inbound:
            raise ProtocolError("DATA past the connection's receive window", ErrorCode.FLOW_CONTROL_ERROR)
        self.inbound -= flow
        start, stop = self._unpad(payload, "DATA") if flags & PADDED else (0, flow)
        stream = self.streams.get(sid)
        if stream is None or not stream.remote_open:
            if sid > self.highest_inbound_stream_id:
                raise ProtocolError("DATA on stream %d, never opened" % sid)
            self._acknowledge_connection(flow)  # the port never sees it: the connection's window is given back
            if not self._data_in_flight(sid, flow):
                self._stream_error(sid, ErrorCode.STREAM_CLOSED, events)
            return
        if flow > stream.inbound:
            self._acknowledge_connection(flow)
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, events)
            return
        stream.inbound -= flow
        if stream.remaining is not None:  # a content-length announced: the DATA may not pass it
            stream.remaining -= stop - start
            if stream.remaining < 0:
                self._acknowledge_connection(flow)
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
                return
        if flow:
            events.append((DATA_RECEIVED, sid, payload[start:stop] if start or stop < flow else payload, flow))
        if flags & END_STREAM:
            self._end_remote(sid, stream, events)

    def _data_in_flight(self, sid, flow):
        """True for DATA the client sent before it knew the server reset ``sid``: a full frame (or the one that
        fills the window) within what is left of that stream's receive window, ignored (RFC 9113 section 5.4.2)
        and no work wasted; any other DATA on a closed stream (a dribble, past the window) is a stream error."""
        left = self._reset_ids.get(sid)
        if not left or not 0 < flow <= left or flow not in (self.max_inbound_frame_size, left):
            return False
        self._reset_ids[sid] = left - flow
        return True

    def _end_remote(self, sid, stream, events):
        if stream.remaining:  # ended short of its content-length: malformed (RFC 9113 section 8.1.1)
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        stream.remote_open = False
        if not stream.local_open:
            del self.streams[sid]
        events.append((ENDED, sid, None, None))

    def _headers(self, flags, sid, payload, events):
        if not sid:
            raise ProtocolError("HEADERS on stream 0")
        start, stop = self._unpad(payload, "HEADERS") if flags & PADDED else (0, len(payload))
        self_dependent = False
        if flags & PRIORITY_FLAG:
            if stop - start < 5:
                raise ProtocolError("HEADERS too short for its priority fields", ErrorCode.FRAME_SIZE_ERROR)
            self_dependent = _U32.unpack_from(payload, start)[0] & 0x7FFFFFFF == sid
            start += 5
        block = payload[start:stop]
        if flags & END_HEADERS:
            self._header_block(sid, flags & END_STREAM, self_dependent, block, events)
        else:
            self._block = [sid, flags & END_STREAM, self_dependent, [block]]

    def _continuation(self, flags, sid, payload, events):
        """A header block's next part: the parts gathered in a list and joined once, as the block ends."""
        block = self._block
        if block is None or block[0] != sid:
            raise ProtocolError("CONTINUATION with no header block open on stream %d" % sid)
        block[3].append(payload)
        if flags & END_HEADERS:
            self._block = None
            self._header_block(sid, block[1], block[2], b"".join(block[3]), events)

    def _header_block(self, sid, end_stream, self_dependent, block, events):
        try:
            headers = self.decoder.decode(block, raw=True)
        except OversizedHeaderListError as exc:
            raise ProtocolError("a header list past SETTINGS_MAX_HEADER_LIST_SIZE: %s" % exc,
                                ErrorCode.ENHANCE_YOUR_CALM) from None
        except (HPACKError, IndexError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError("a header block that does not decode: %s" % exc,
                                ErrorCode.COMPRESSION_ERROR) from None
        stream = self.streams.get(sid)
        if stream is None:
            if sid <= self.highest_inbound_stream_id:
                self._closed_headers(sid, end_stream, events)
                return
            if not sid & 1:
                raise ProtocolError("a client's stream with an even id (%d)" % sid)
            self.highest_inbound_stream_id = sid
            if sid != self._next_stream:
                self._skipped.append((self._next_stream, sid - 2))
            self._next_stream = sid + 2
            length = _content_length(headers)
            if self_dependent or length == -1 or len(self.streams) >= self.max_streams:
                # malformed, or past SETTINGS_MAX_CONCURRENT_STREAMS: refused (REFUSED_STREAM: a client retries it)
                self._reset_before_its_end(sid, self.window)
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR if self_dependent or length == -1
                                   else ErrorCode.REFUSED_STREAM, events)
                return
            stream = self.streams[sid] = Stream(self.window, self.remote_initial_window, length)
            self.last_taken = sid
            events.append((REQUEST, sid, headers, None))
        elif not stream.remote_open:
            self._stream_error(sid, ErrorCode.STREAM_CLOSED, events)
            return
        elif not end_stream:
            raise ProtocolError("trailers that do not end stream %d" % sid)
        else:
            events.append((TRAILERS, sid, headers, None))
        if end_stream:
            self._end_remote(sid, stream, events)

    def _closed_headers(self, sid, end_stream, events):
        """HEADERS on a stream id lower than one used and no longer kept (RFC 9113 sections 5.1, 5.1.1, 8.1): one
        that does not end its stream (no trailers, nor a stream it may open) is a connection error PROTOCOL_ERROR;
        after a reset before the client ended it, a stream error STREAM_CLOSED; on an id never opened (even, or
        skipped), a connection error PROTOCOL_ERROR; on a stream the client ended, a connection error
        STREAM_CLOSED."""
        if not end_stream:
            raise ProtocolError("HEADERS on stream %d, lower than stream %d, that does not end it" % (
                sid, self.highest_inbound_stream_id))
        if sid in self._reset_ids:
            self._stream_error(sid, ErrorCode.STREAM_CLOSED, events)
            return
        if not sid & 1 or any(low <= sid <= high for low, high in self._skipped):
            raise ProtocolError("HEADERS on stream %d, never opened and lower than stream %d" % (
                sid, self.highest_inbound_stream_id))
        raise ProtocolError("HEADERS on stream %d, which the client ended" % sid, ErrorCode.STREAM_CLOSED)

    def _window_update(self, sid, payload, events):
        if len(payload) != 4:
            raise ProtocolError("WINDOW_UPDATE of %d bytes" % len(payload), ErrorCode.FRAME_SIZE_ERROR)
        more = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not sid:
            if not more:
                raise ProtocolError("a WINDOW_UPDATE of 0 for the connection")
            if self.outbound + more > MAX_WINDOW:
                raise ProtocolError("the connection's send window past 2^31-1", ErrorCode.FLOW_CONTROL_ERROR)
            self.outbound += more
            events.append((WINDOW, 0, more, None))
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.highest_inbound_stream_id:
                raise ProtocolError("WINDOW_UPDATE on stream %d, never opened" % sid)
            if not more:  # an increment of 0 is a stream error on a closed stream too
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return  # a stream closed meanwhile
        if not more:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
        elif stream.outbound + more > MAX_WINDOW:
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, events)
        else:
            stream.outbound += more
            events.append((WINDOW, sid, more, None))

    def _reset(self, sid, payload, events):
        if not sid:
            raise ProtocolError("RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ProtocolError("RST_STREAM of %d bytes" % len(payload), ErrorCode.FRAME_SIZE_ERROR)
        if sid > self.highest_inbound_stream_id:
            raise ProtocolError("RST_STREAM on stream %d, never opened" % sid)
        stream = self.streams.pop(sid, None)
        if stream is not None:
            if stream.remote_open:
                self._reset_before_its_end(sid)
            events.append((RESET, sid, _U32.unpack(payload)[0], None))

    def _settings(self, flags, sid, payload, events):
        if sid:
            raise ProtocolError("SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError("a SETTINGS ACK with a payload", ErrorCode.FRAME_SIZE_ERROR)
            return
        if len(payload) % 6:
            raise ProtocolError("SETTINGS of %d bytes" % len(payload), ErrorCode.FRAME_SIZE_ERROR)
        values = {}
        for at in range(0, len(payload), 6):
            code, value = _SETTING.unpack_from(payload, at)
            if code == ENABLE_PUSH and value > 1:
                raise ProtocolError("SETTINGS_ENABLE_PUSH %d" % value)
            if code == INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
                raise ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE %d" % value, ErrorCode.FLOW_CONTROL_ERROR)
            if code == MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LIMIT:
                raise ProtocolError("SETTINGS_MAX_FRAME_SIZE %d" % value)
            values[code] = value
        for code, value in values.items():
            if code == INITIAL_WINDOW_SIZE:
                delta, self.remote_initial_window = value - self.remote_initial_window, value
                for stream in self.streams.values():
                    stream.outbound += delta
                    if stream.outbound > MAX_WINDOW:
                        raise ProtocolError("a stream's send window past 2^31-1", ErrorCode.FLOW_CONTROL_ERROR)
            elif code == MAX_FRAME_SIZE:
                self.max_outbound_frame_size = value
            elif code == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value
        self._out.append(frame_head(0, SETTINGS, ACK, 0))
        events.append((SETTINGS_CHANGED, 0, values, None))


def _content_length(headers):
    """The content-length a request's header list announces: None without one, -1 when it is no length (malformed,
    as are several that differ)."""
    length = None
    for name, value in headers:
        if name == b"content-length":
            if not value.isdigit() or len(value) > 18 or length is not None and int(value) != length:
                return -1
            length = int(value)
    return length
