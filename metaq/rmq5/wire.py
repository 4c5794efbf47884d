"""gRPC's framing over HTTP/2, sans-IO: what a request's headers and DATA carry, and what a response ends with.

The HTTP/2 connection itself is ``http2``'s (``front-end`` port.py drives it); this module holds gRPC's own layer
(grpc's PROTOCOL-HTTP2): each DATA payload is a run of length-prefixed messages (1 byte compressed flag, 4 bytes
big-endian length, the protobuf bytes), unrelated to frame boundaries; a call ends with trailers carrying
``grpc-status`` (a decimal ``Status`` below) and ``grpc-message`` (percent-encoded UTF-8); ``grpc-timeout`` is
1-8 digits and a unit. Every bound is a named limit: ``MessageReader`` refuses a message whose prefix says more
than its maximum before keeping a byte of it.

Below gRPC's layer, HTTP/2's frames as a client sends them are seen from their 9-byte headers (``FrameGate``)
before the HTTP/2 layer buffers a byte of them, so that the limits hold whatever that layer does. The gate refuses
a frame past the advertised size from its header (``FrameTooLarge``); tells how many bytes of an incomplete frame
are held (``partial``: a request under way, with its deadline and budgets); names each frame begun
(``FrameHead``: the port budgets control frames and new streams before the layer spends time on them); and keeps
a client's GOAWAY out of the bytes the layer is fed (``goaway``), so that the streams the client opened go on to their
end, as RFC 9113 section 6.8 says.
"""

import enum
import struct
from typing import NamedTuple

from metaq import limits

#: HTTP/2 ``:path`` of every RPC: this, then the RPC's name (case-sensitive).
SERVICE = "apache.rocketmq.v2.MessagingService"
PATH_PREFIX = "/%s/" % SERVICE
CONTENT_TYPE = "application/grpc"

_PREFIX = struct.Struct(">BI")
PREFIX_BYTES = _PREFIX.size


class Status(enum.IntEnum):
    """gRPC's status codes (the ``grpc-status`` trailer), not RocketMQ's in-band ``Code``."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """A call refused at gRPC's level: the ``status`` and ``message`` its trailers carry."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = Status(status)
        self.message = message


def rpc_name(path):
    """The RPC a request's ``:path`` names, or None when it is not one of MessagingService's paths."""
    if not path or not path.startswith(PATH_PREFIX):
        return None
    name = path[len(PATH_PREFIX):]
    return name if name and "/" not in name else None


def is_grpc_content_type(value):
    """True for ``application/grpc`` and its ``+proto`` / ``;...`` forms (anything else is HTTP 415)."""
    if not value:
        return False
    value = value.lower()
    return value == CONTENT_TYPE or value.startswith(CONTENT_TYPE + "+") or value.startswith(CONTENT_TYPE + ";")


def frame(payload):
    """One length-prefixed, uncompressed gRPC message."""
    return _PREFIX.pack(0, len(payload)) + payload


class MessageReader:
    """One stream's DATA in, whole messages out (bytes), whatever the frame boundaries.

    ``feed`` raises ``GrpcError``: RESOURCE_EXHAUSTED for a prefix announcing more than ``max_bytes``
    (``limits.GRPC_MAX_MESSAGE_BYTES``: nothing of it is kept), UNIMPLEMENTED for a compressed message (the port
    accepts ``grpc-encoding: identity`` only; RocketMQ clients compress bodies themselves, ``body_encoding``),
    INTERNAL for a flag that is neither 0 nor 1."""

    __slots__ = ("max_bytes", "buf", "messages")

    def __init__(self, max_bytes=limits.GRPC_MAX_MESSAGE_BYTES):
        self.max_bytes = max_bytes
        self.buf = bytearray()
        self.messages = 0  # whole messages read so far

    @property
    def buffered(self):
        """Bytes held of a message not yet whole."""
        return len(self.buf)

    def feed(self, data):
        self.buf += data
        out = []
        while len(self.buf) >= PREFIX_BYTES:
            flag, length = _PREFIX.unpack_from(self.buf)
            if flag == 1:
                raise GrpcError(Status.UNIMPLEMENTED, "compressed gRPC messages are not accepted (grpc-encoding: "
                                "identity only)")
            if flag != 0:
                raise GrpcError(Status.INTERNAL, "a gRPC message prefix with flag %d (0 or 1)" % flag)
            if length > self.max_bytes:
                self.buf.clear()
                raise GrpcError(Status.RESOURCE_EXHAUSTED, "a gRPC message of %d bytes: the limit is %d "
                                "(grpc.max_message_bytes)" % (length, self.max_bytes))
            if len(self.buf) < PREFIX_BYTES + length:
                break
            out.append(bytes(self.buf[PREFIX_BYTES:PREFIX_BYTES + length]))
            del self.buf[:PREFIX_BYTES + length]
            self.messages += 1
        return out


_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value):
    """Seconds of a ``grpc-timeout`` value (1-8 ASCII digits, then H, M, S, m, u or n); GrpcError INVALID_ARGUMENT
    otherwise. Absent (None) is no deadline: None."""
    if value is None:
        return None
    digits, unit = value[:-1], value[-1:]
    if not 1 <= len(digits) <= 8 or not digits.isascii() or not digits.isdigit() or unit not in _UNITS:
        raise GrpcError(Status.INVALID_ARGUMENT, "malformed grpc-timeout %r" % value[:32])
    return int(digits) * _UNITS[unit]


_SAFE = frozenset(range(0x20, 0x7F)) - {ord("%")}


def quote_message(text):
    """``grpc-message``'s encoding: UTF-8, every byte outside printable ASCII (and ``%``) as ``%XX``."""
    return "".join(chr(b) if b in _SAFE else "%%%02X" % b for b in text.encode("utf-8"))


def unquote_message(text):
    """The text of a ``grpc-message`` value (malformed escapes are kept as they are)."""
    raw, i = bytearray(), 0
    data = text.encode("ascii", "replace")
    while i < len(data):
        if data[i] == 0x25 and i + 2 < len(data) and _is_hex(data[i + 1:i + 3]):
            raw.append(int(data[i + 1:i + 3], 16))
            i += 3
        else:
            raw.append(data[i])
            i += 1
    return raw.decode("utf-8", "replace")


def _is_hex(two):
    return len(two) == 2 and all(c in b"0123456789abcdefABCDEF" for c in two)


def response_headers():
    """The headers that open a response (``:status`` 200, gRPC's content type, the one encoding accepted)."""
    return [(":status", "200"), ("content-type", CONTENT_TYPE), ("grpc-accept-encoding", "identity")]


def trailers(status, message=""):
    """The trailers that end a call with ``status`` (and its ``grpc-message`` when there is one)."""
    out = [("grpc-status", str(int(status)))]
    if message:
        out.append(("grpc-message", quote_message(message)))
    return out


def trailers_only(status, message=""):
    """A call answered by one HEADERS frame (Trailers-Only): the response headers and the trailers at once."""
    return response_headers() + trailers(status, message)


def header_list_size(headers):
    """HTTP/2's measure of a header list (RFC 7541 4.1, SETTINGS_MAX_HEADER_LIST_SIZE): per field its name and value
    in bytes plus 32."""
    total = 0
    for name, value in headers:
        name = name.encode("utf-8") if isinstance(name, str) else name
        value = value.encode("utf-8") if isinstance(value, str) else value
        total += len(name) + len(value) + 32
    return total


def _raw(headers):
    return tuple((name.encode("ascii"), value.encode("ascii")) for name, value in headers)


#: ``response_headers()`` and the trailers of a call ended OK without a message, encoded once: the port hands the
#: HTTP/2 layer these bytes for every response instead of text it would encode each time.
RESPONSE_HEADERS_RAW = _raw(response_headers())
OK_TRAILERS_RAW = _raw(trailers(Status.OK))


# -- HTTP/2 frames, from their headers ---------------------------------------------------------------------------


#: The client connection preface (RFC 9113 section 3.4), passed to the HTTP/2 layer as it is.
PREFACE_BYTES = 24
FRAME_HEADER_BYTES = 9

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
#: Frames that cost the server work and carry no request (the HTTP/2 flood attacks: ping, settings, reset,
#: priority): each counts against the connection's control-frame budget.
CONTROL_FRAMES = frozenset((PRIORITY, RST_STREAM, SETTINGS, PING))
END_STREAM_FLAG, END_HEADERS_FLAG = 0x1, 0x4
#: A frame header: its 24-bit length (16 and 8 bits), type, flags and stream id (RFC 9113 section 4.1).
_FRAME_HEAD = struct.Struct(">HBBBI")


class FrameTooLarge(Exception):
    """A frame header declares more than the advertised SETTINGS_MAX_FRAME_SIZE (FRAME_SIZE_ERROR)."""


class FrameHead(NamedTuple):
    """One frame's header: its type, flags, stream id and payload length."""

    type: int
    flags: int
    stream_id: int
    length: int = 0

    def is_control(self):
        """Whether the frame counts against the control-frame budget: a ``CONTROL_FRAMES`` type, or an empty frame
        that ends nothing (DATA without END_STREAM, HEADERS or CONTINUATION without END_HEADERS: the empty-frames
        flood, which costs the server a frame's work for no byte of a request)."""
        if self.type in CONTROL_FRAMES:
            return True
        if self.length or self.type not in (DATA, HEADERS, CONTINUATION):
            return False
        return not self.flags & (END_STREAM_FLAG if self.type == DATA else END_HEADERS_FLAG)


class Goaway(NamedTuple):
    """A GOAWAY the client sent: the last stream it may still take and its error code."""

    last_stream_id: int
    error_code: int


class FrameGate:
    """The frame boundaries of a server connection's inbound bytes (see the module doc's HTTP/2 part)."""

    __slots__ = ("max_frame_size", "partial", "goaway", "_preface", "_head", "_left", "_type", "_body")

    def __init__(self, max_frame_size):
        self.max_frame_size = max_frame_size
        self.partial = 0  # bytes of the frame begun and not yet whole (its header and body so far)
        self.goaway = None  # the client's GOAWAY once one is whole (Goaway)
        self._preface = PREFACE_BYTES  # bytes of the preface still to come
        self._head = b""  # a frame header begun
        self._left = 0  # body bytes of the current frame still to come
        self._type = None  # the current frame's type while its body comes
        self._body = None  # a GOAWAY's body so far (it is not passed on)

    def feed(self, data):
        """``data`` read from the client: the bytes for the HTTP/2 layer (all but GOAWAY frames') and the heads of
        the frames begun in it; raises FrameTooLarge at a header past ``max_frame_size``, whatever followed it.
        ``data`` itself when every byte of it passes as it came (no GOAWAY in it, no frame header cut at either
        end), else a copy without the bytes held or kept from the layer."""
        heads, drops, prefix = [], [], b""  # drops: ``data``'s ranges not passed on; prefix: a header held, now whole
        pos, end = 0, len(data)
        if self._preface:
            pos = min(self._preface, end)
            self._preface -= pos
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                if self._body is not None:  # a GOAWAY's body: its first 8 bytes read here, none passed on
                    if len(self._body) < 8:
                        self._body += bytes(data[pos:pos + min(take, 8 - len(self._body))])
                    drops.append((pos, pos + take))
                self._left -= take
                self.partial += take
                pos += take
                if not self._left:
                    self._whole()
                continue
            start, held = pos, self._head
            if not held and end - pos >= FRAME_HEADER_BYTES:
                hi, lo, ftype, flags, stream_id = _FRAME_HEAD.unpack_from(data, pos)
                pos += FRAME_HEADER_BYTES
            else:  # a header cut by the end of a read: held until whole
                take = min(FRAME_HEADER_BYTES - len(held), end - pos)
                self._head = held + bytes(data[pos:pos + take])
                pos += take
                if len(self._head) < FRAME_HEADER_BYTES:
                    self.partial = len(self._head)
                    drops.append((start, pos))
                    break
                hi, lo, ftype, flags, stream_id = _FRAME_HEAD.unpack(self._head)
                self._head = b""
            length = hi << 8 | lo
            if length > self.max_frame_size:
                raise FrameTooLarge("a frame of %d bytes: the advertised SETTINGS_MAX_FRAME_SIZE is %d"
                                    % (length, self.max_frame_size))
            self.partial = FRAME_HEADER_BYTES
            self._type = ftype
            heads.append(FrameHead(ftype, flags, stream_id & 0x7FFFFFFF, length))
            if ftype == GOAWAY:
                self._body = b""
                drops.append((start, pos))
            elif held:
                prefix = held
            self._left = length
            if not length:
                self._whole()
        if not drops and not prefix:
            return data, heads
        view, at, out = memoryview(data), 0, [prefix]
        for a, b in drops:
            out.append(view[at:a])
            at = b
        out.append(view[at:])
        return b"".join(out), heads

    def _whole(self):
        """The current frame is whole: the next bytes start a header."""
        if self._body is not None:
            body = self._body.ljust(8, b"\0")
            self.goaway = Goaway(int.from_bytes(body[:4], "big") & 0x7FFFFFFF, int.from_bytes(body[4:8], "big"))
            self._body = None
        self._head = b""
        self._type = None
        self.partial = 0
