"""RocketMQ's "remoting" protocol, sans-IO: ``RemotingParser`` turns bytes into ``RemotingCommand``s,
``encode_command`` turns a command into bytes.

Frame (reference ``rocketmq-remoting.md`` §1.1), all big-endian::

    int32 total          = 4 + H + B (does not count itself)
    int32 header word    = (serialize type << 24) | H
    H bytes header       JSON (type 0) or ROCKETMQ binary (type 1, §1.3)
    B bytes body         opaque bytes; B = total - 4 - H

The parser accepts both header types and keeps ``extFields`` as ``str -> str``
whatever JSON types the peer used (numbers as their decimal text, booleans as
``true``/``false``, nested values as compact JSON, ``null`` entries dropped:
Java treats a null value as an absent field). ``encode_command`` always writes a
JSON header the way Java's fastjson does: keys in alphabetical order, nulls left
out, ``serializeTypeCurrentRPC`` present, header word's high byte 0 (the C++
client reads it unmasked).

Errors: ``RemoteProtocolError``. It is ``fatal`` when the frame structure is
broken (total length out of range, header length over the frame or the limit,
unknown serialize type, header that is not JSON / not a well-formed binary
header, EOF inside a frame); every later ``next_event()`` raises it again. It is
not fatal when the header decoded but a field is invalid (e.g. ``code`` is not
an int32): the frame is consumed, ``opaque`` carries the request's opaque when it
could be read, and the parser goes on with the next frame.
"""

import json
import struct
from dataclasses import dataclass, field

from metaq.server.remoting import limits as remoting_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.stream import StreamParser

__all__ = [
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "RPC_RESPONSE",
    "RPC_ONEWAY",
    "LANGUAGES",
    "DEFAULT_LANGUAGE",
    "DEFAULT_VERSION",
    "RequestCode",
    "ResponseCode",
    "RemotingCommand",
    "RemotingParser",
    "encode_command",
    "encode_json_header",
    "make_request",
    "response_for",
    "not_supported",
    "ext_str",
]


SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
#: flag bit 0: this command is a response (RPC_TYPE).
RPC_RESPONSE = 1 << 0
#: flag bit 1: the request wants no response (RPC_ONEWAY).
RPC_ONEWAY = 1 << 1

#: LanguageCode names by their byte (ROCKETMQ binary headers carry the byte, JSON the name).
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS",
             "RUST", "NODE_JS")
_LANGUAGE_BYTES = {name: i for i, name in enumerate(LANGUAGES)}
DEFAULT_LANGUAGE = "JAVA"
#: MQVersion ordinal we announce: V5_3_3 (what the reference's Java broker sends).
DEFAULT_VERSION = 479

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_MAX_HEADER_FIELD = 0xFFFFFF  # the header length has 24 bits

#: Frame prefix: ``total`` (int32, signed as Java reads it) and the header word (uint32).
_FRAME_HEAD = struct.Struct(">iI")
assert _FRAME_HEAD.size == 8
#: ROCKETMQ binary header, fixed part: code (int16), language (int8), version (int16), opaque (int32), flag (int32).
_BIN_FIXED = struct.Struct(">hbhii")
assert _BIN_FIXED.size == 13
_INT32 = struct.Struct(">i")
assert _INT32.size == 4
_INT16 = struct.Struct(">h")
assert _INT16.size == 2


class RequestCode:
    """Request codes of the compatibility subset (reference §2.1, §5)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    CHECK_CLIENT_CONFIG = 46
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326


class ResponseCode:
    """Response codes (reference §2.2)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    INVALID_PARAMETER = 29
    CONSUMER_NOT_ONLINE = 206
    NO_MESSAGE = 208
    FLOW_CONTROL = 215


@dataclass(frozen=True)
class RemotingCommand:
    """One remoting frame.

    ``ext_fields`` is always ``str -> str`` when it comes from the parser;
    ``encode_command`` also accepts ints and booleans (written as Java prints
    them) and drops ``None`` values. ``remark`` None = absent. ``serialize_type``
    is the header type the frame arrived in (encoding always writes JSON).
    """

    code: int
    language: str = DEFAULT_LANGUAGE
    version: int = DEFAULT_VERSION
    opaque: int = 0
    flag: int = 0
    remark: object = None
    ext_fields: dict = field(default_factory=dict)
    body: bytes = b""
    serialize_type: int = SERIALIZE_JSON

    @property
    def is_response(self):
        return bool(self.flag & RPC_RESPONSE)

    @property
    def is_oneway(self):
        return bool(self.flag & RPC_ONEWAY)


def make_request(code, ext_fields=None, body=b"", opaque=0, oneway=False, language=DEFAULT_LANGUAGE,
                 version=DEFAULT_VERSION):
    """A request command (flag 0, or RPC_ONEWAY)."""
    return RemotingCommand(code, language, version, opaque, RPC_ONEWAY if oneway else 0, None,
                           dict(ext_fields or {}), bytes(body))


def response_for(request, code, remark=None, ext_fields=None, body=b""):
    """The response to ``request``: same opaque, flag RPC_RESPONSE, our language and version."""
    return RemotingCommand(code, DEFAULT_LANGUAGE, DEFAULT_VERSION, request.opaque, RPC_RESPONSE, remark,
                           dict(ext_fields or {}), bytes(body))


def not_supported(request):
    """Java's answer to an unknown code: 3 REQUEST_CODE_NOT_SUPPORTED, remark ``" request type N not supported"``."""
    return response_for(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                        " request type %d not supported" % request.code)


def ext_str(value):
    """An extFields value as Java's ``toString`` would give it; None for null (= absent).

    str unchanged; bool -> ``true``/``false``; int -> decimal; float -> its repr;
    list/dict -> compact JSON. Anything else is a TypeError.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    raise TypeError("extFields value %r cannot be sent" % (value,))


def _ext_fields_out(ext_fields):
    out = {}
    for key, value in ext_fields.items():
        if not isinstance(key, str):
            raise TypeError("extFields key %r is not a string" % (key,))
        text = ext_str(value)
        if text is not None:
            out[key] = text
    return out


def encode_json_header(cmd, type_field=True):
    """The JSON header bytes of ``cmd``, as fastjson writes them (sorted keys, no nulls, no spaces).

    ``type_field``: write ``"serializeTypeCurrentRPC":"JSON"`` as Java does (every
    reader ignores it; the C++ client never writes it).
    """
    header = {
        "code": cmd.code,
        "flag": cmd.flag,
        "language": cmd.language,
        "opaque": cmd.opaque,
        "version": cmd.version,
    }
    if type_field:
        header["serializeTypeCurrentRPC"] = "JSON"
    ext = _ext_fields_out(cmd.ext_fields)
    if ext:
        header["extFields"] = ext
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode("utf-8")


def encode_command(cmd, type_field=True):
    """The wire bytes of ``cmd`` with a JSON header (serialize type 0); ``type_field`` as in
    ``encode_json_header``.

    ValueError if the header is over 16 MiB - 1 (the 24-bit field), the frame
    over 2 GiB, or a text field cannot be encoded as UTF-8.
    """
    for name in ("code", "version", "opaque", "flag"):
        value = getattr(cmd, name)
        if isinstance(value, bool) or not isinstance(value, int) or not INT32_MIN <= value <= INT32_MAX:
            raise ValueError("%s must be an int32, got %r" % (name, value))
    header = encode_json_header(cmd, type_field)
    body = cmd.body
    if len(header) > _MAX_HEADER_FIELD:
        raise ValueError("header of %d bytes does not fit the 24-bit length field" % len(header))
    total = 4 + len(header) + len(body)
    if total > INT32_MAX:
        raise ValueError("frame of %d bytes is too large" % total)
    return b"".join((_FRAME_HEAD.pack(total, (SERIALIZE_JSON << 24) | len(header)), header, body))


# Header decoding -----------------------------------------------------------------


class _HeaderError(Exception):
    """The header decoded, but a field is invalid (non-fatal)."""


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


#: Floats keep their literal text (as Java's BigDecimal would print them); NaN/Infinity are refused.
_JSON_DECODER = json.JSONDecoder(parse_float=str, parse_constant=_reject_constant)


def _int32_field(header, name, default):
    value = header.get(name)
    if value is None:
        if default is None:
            raise _HeaderError("header has no %s" % name)
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not INT32_MIN <= value <= INT32_MAX:
        raise _HeaderError("header field %s must be an int32, got %s" % (name, _show(value)))
    return value


def _show(value):
    text = repr(value)
    return text if len(text) <= 64 else text[:64] + "..."


def _opaque_of(header):
    value = header.get("opaque")
    if isinstance(value, int) and not isinstance(value, bool) and INT32_MIN <= value <= INT32_MAX:
        return value
    return 0


def _decode_json_header(raw, body):
    try:
        header = _JSON_DECODER.decode(bytes(raw).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise RemoteProtocolError("undecodable JSON header: %s" % exc, 0, True) from None
    if not isinstance(header, dict):
        raise RemoteProtocolError("JSON header is not an object", 0, True)
    opaque = _opaque_of(header)
    try:
        code = _int32_field(header, "code", None)
        version = _int32_field(header, "version", 0)
        opaque = _int32_field(header, "opaque", 0)
        flag = _int32_field(header, "flag", 0)
        language = header.get("language")
        if language is None:
            language = DEFAULT_LANGUAGE
        elif isinstance(language, int) and not isinstance(language, bool) and 0 <= language < len(LANGUAGES):
            language = LANGUAGES[language]
        elif not isinstance(language, str):
            raise _HeaderError("header field language must be a name, got %s" % _show(language))
        remark = header.get("remark")
        remark = None if remark is None else ext_str(remark)
        ext = header.get("extFields")
        if ext is None:
            ext = {}
        elif not isinstance(ext, dict):
            raise _HeaderError("extFields must be an object, got %s" % _show(ext))
        ext_fields = {key: text for key, text in ((k, ext_str(v)) for k, v in ext.items()) if text is not None}
    except _HeaderError as exc:
        raise RemoteProtocolError(str(exc), opaque, False) from None
    return RemotingCommand(code, language, version, opaque, flag, remark, ext_fields, body, SERIALIZE_JSON)


def _binary_string(raw, pos, length, what, end):
    if length < 0 or pos + length > end:
        raise RemoteProtocolError("binary header: %s length %d runs past the header" % (what, length), 0, True)
    # Java decodes with replacement characters; a zero length means null.
    return (bytes(raw[pos:pos + length]).decode("utf-8", "replace") if length else None), pos + length


def _decode_binary_header(raw, body):
    """Decode a ROCKETMQ binary header (RocketMQSerializable.rocketMQProtocolDecode)."""
    size = len(raw)
    if size < _BIN_FIXED.size + 8:
        opaque = _BIN_FIXED.unpack_from(raw, 0)[3] if size >= _BIN_FIXED.size else 0
        raise RemoteProtocolError("binary header of %d bytes is shorter than %d" % (size, _BIN_FIXED.size + 8),
                                  opaque, True)
    code, language, version, opaque, flag = _BIN_FIXED.unpack_from(raw, 0)
    pos = _BIN_FIXED.size
    try:
        (remark_len,) = _INT32.unpack_from(raw, pos)
        remark, pos = _binary_string(raw, pos + 4, remark_len, "remark", size)
        if pos + 4 > size:
            raise RemoteProtocolError("binary header ends before the extFields length", 0, True)
        (ext_len,) = _INT32.unpack_from(raw, pos)
        pos += 4
        if ext_len < 0 or pos + ext_len > size:
            raise RemoteProtocolError("binary header: extFields length %d runs past the header" % ext_len, 0, True)
        end = pos + ext_len
        ext_fields = {}
        while pos < end:
            if pos + 2 > end:
                raise RemoteProtocolError("binary header: truncated extFields key length", 0, True)
            (key_len,) = _INT16.unpack_from(raw, pos)
            key, pos = _binary_string(raw, pos + 2, key_len, "extFields key", end)
            if pos + 4 > end:
                raise RemoteProtocolError("binary header: truncated extFields value length", 0, True)
            (value_len,) = _INT32.unpack_from(raw, pos)
            value, pos = _binary_string(raw, pos + 4, value_len, "extFields value", end)
            if key is not None and value is not None:
                ext_fields[key] = value
        if end != size:
            raise RemoteProtocolError("binary header has %d bytes after its extFields" % (size - end), 0, True)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(exc.reason, opaque, True) from None
    name = LANGUAGES[language] if 0 <= language < len(LANGUAGES) else "OTHER"
    return RemotingCommand(code, name, version, opaque, flag, remark, ext_fields, body, SERIALIZE_ROCKETMQ)


_HEADER_DECODERS = {SERIALIZE_JSON: _decode_json_header, SERIALIZE_ROCKETMQ: _decode_binary_header}


class RemotingParser(StreamParser):
    """Incremental parser of remoting frames (requests and responses alike).

    Feed bytes with ``receive_data`` (``b""`` = end of stream), then call
    ``next_event`` until it returns ``NEED_DATA`` (or ``CLOSED`` after a clean
    end of stream). ``max_frame`` counts the 4-byte length field like Java's
    frame decoder; ``max_header`` caps the header. Both are checked as soon as
    the 8-byte prefix is buffered, before waiting for (or keeping) the rest.
    """

    def __init__(self, max_frame=remoting_limits.MAX_REMOTING_FRAME, max_header=remoting_limits.MAX_REMOTING_HEADER):
        super().__init__()
        self.max_frame = max_frame
        self.max_header = max_header

    def _next_event(self):
        buf, pos = self._buf, self._pos
        available = len(buf) - pos
        if available < 4:
            return self._need_data()
        (total,) = _INT32.unpack_from(buf, pos)
        if total < 4:
            raise RemoteProtocolError("frame length %d is less than 4" % total, 0, True)
        if total + 4 > self.max_frame:
            raise RemoteProtocolError("frame of %d bytes exceeds the limit of %d bytes" % (total + 4, self.max_frame),
                                      0, True)
        if available < 8:
            return self._need_data()
        _, word = _FRAME_HEAD.unpack_from(buf, pos)
        serialize_type, header_len = word >> 24, word & _MAX_HEADER_FIELD
        decode = _HEADER_DECODERS.get(serialize_type)
        if decode is None:
            raise RemoteProtocolError("unknown serialize type %d" % serialize_type, 0, True)
        if header_len > total - 4:
            raise RemoteProtocolError("header length %d exceeds the frame's %d bytes" % (header_len, total - 4),
                                      0, True)
        if header_len > self.max_header:
            raise RemoteProtocolError("header of %d bytes exceeds the limit of %d bytes"
                                      % (header_len, self.max_header), 0, True)
        if available < 4 + total:
            return self._need_data()
        start = pos + 8
        with memoryview(buf) as view:
            raw = bytes(view[start:start + header_len])
            body = bytes(view[start + header_len:pos + 4 + total])
        self._pos = pos + 4 + total
        return decode(raw, body)

