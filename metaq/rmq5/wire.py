"""gRPC's framing over HTTP/2, sans-IO: what a request's headers and DATA carry, and what a response ends with.

The HTTP/2 connection itself is ``http2``'s (``front-end`` port.py drives it); this module holds gRPC's own layer
(grpc's PROTOCOL-HTTP2): each DATA payload is a run of length-prefixed messages (1 byte compressed flag, 4 bytes
big-endian length, the protobuf bytes), unrelated to frame boundaries; a call ends with trailers carrying
``grpc-status`` (a decimal ``Status`` below) and ``grpc-message`` (percent-encoded UTF-8); ``grpc-timeout`` is
1-8 digits and a unit. Every bound is a named limit: ``MessageReader`` refuses a message whose prefix says more
than its maximum before keeping a byte of it.
"""

import enum
import struct

from metaq import speedups
from metaq.rmq5 import limits as rmq5_limits

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


#: A service's answer to a unary call it was asked to answer without waiting (``call(..., wait=False)``, on the
#: connection's reader) when answering may wait: nothing was done; the port asks again from the call's own greenlet.
WAITS = object()


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


def frames_py(payloads):
    """``frame`` of each of ``payloads`` (bytes-like, each under 4 GiB), joined. The C helper's ``grpc_frames`` is
    its twin (one copy, no call a message)."""
    return b"".join(map(frame, payloads))


frames = speedups.load("grpc_frames", frames_py)


class MessageReader:
    """One stream's DATA in, whole messages out (bytes), whatever the frame boundaries.

    ``feed`` raises ``GrpcError``: RESOURCE_EXHAUSTED for a prefix announcing more than ``max_bytes``
    (``limits.GRPC_MAX_MESSAGE_BYTES``: nothing of it is kept), UNIMPLEMENTED for a compressed message (the port
    accepts ``grpc-encoding: identity`` only; RocketMQ clients compress bodies themselves, ``body_encoding``),
    INTERNAL for a flag that is neither 0 nor 1."""

    __slots__ = ("max_bytes", "buf", "messages")

    def __init__(self, max_bytes=rmq5_limits.GRPC_MAX_MESSAGE_BYTES):
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
