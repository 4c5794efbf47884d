"""MQTT 3.1.1 (protocol level 4) and 5.0 (level 5) control packets, sans-IO: ``MqttParser`` turns bytes into packets,
``encode`` turns a packet into bytes (OASIS MQTT 3.1.1 and MQTT 5.0, chapters 1-3).

A packet is a fixed header (type in the high nibble, flags in the low one, then the Remaining Length as a variable
byte integer of 1-4 bytes) and a body. The parser checks the Remaining Length against ``max_packet`` (the whole
packet's bytes, as MQTT 5's Maximum Packet Size counts them) as soon as the length field is buffered, so a packet past
it is refused before its body is waited for (only what came in the same read as its header is buffered); once a
packet is refused every later byte is dropped.

The parser is told the protocol version (a client's parser) or learns it from the CONNECT it reads first (a
server's): before a CONNECT only a CONNECT is accepted, and a second CONNECT is refused ([MQTT-3.1.0-1], [-2]).
``sender`` says whose packets these are: ``"client"`` (a server's parser) refuses the packets only a server sends
and a Subscription Identifier in a PUBLISH ([MQTT-3.3.4-6]); ``"server"`` refuses the packets only a client sends;
None accepts both directions (tests, tools).

Every refusal is an ``MqttError`` (a fatal ``RemoteProtocolError``: an MQTT stream has no way to resynchronise)
carrying the MQTT 5 reason code the server answers with (``reason_code``: 0x81 Malformed Packet, 0x82 Protocol
Error, 0x84 Unsupported Protocol Version, 0x85 Client Identifier not valid, 0x8F Topic Filter invalid, 0x90 Topic
Name invalid, 0x94 Topic Alias invalid, 0x95 Packet too large), whether it was met in a CONNECT (answered with a
CONNACK, not a DISCONNECT: [MQTT-3.2.0-1]) and the version the answer is written in. ``refusal(error)`` is that
answer as a packet, or None when the connection is only closed (MQTT 3.1.1 has no DISCONNECT from the server, and
only some CONNECT refusals have a 3.1.1 return code).

What the codec checks, as the specification requires: fixed-header flags (0b0010 for PUBREL, SUBSCRIBE and
UNSUBSCRIBE, 0 for the others but PUBLISH; QoS 3 and DUP with QoS 0 refused), reserved bits (CONNECT flags bit 0,
CONNACK flags bits 7-1, subscription options bits 6-7, bits 2-7 in 3.1.1), variable byte integers (at most 4 bytes,
the shortest encoding: [MQTT-1.5.5-1]), UTF-8 strings (well formed, no surrogates, no U+0000: [MQTT-1.5.4-1],
[-2]), packet identifiers (never 0), topic names and filters (``metaq.mqtt.topics``), the CONNECT's protocol name and
level and its flags' consistency, MQTT 5 properties (each identifier's type, the packets it may appear in, once
unless it may repeat, the values the specification forbids) and reason codes (those defined for the packet).
Control characters other than U+0000 in strings are accepted (the specification says SHOULD NOT, and lets the
receiver choose). Session rules (client identifier lengths, keep-alive, topic alias ranges, quotas) are the
front-end's, not the codec's.

Values: strings are ``str``, binary data (passwords, will payloads, correlation and authentication data, payloads)
``bytes``. MQTT 5 properties are a dict by name (``PROPERTIES``); User Property is a tuple of ``(name, value)``
pairs in their order, Subscription Identifier in a PUBLISH a tuple of ints (it may repeat there), an int elsewhere.

Long because it is one codec: every control packet of both versions, each way, with the pure-Python twins of the
C helper's per-packet steps (``split``, ``plain_publishes``, ``publish_bytes``, ``encode_pubacks``) beside the
decoder they must agree with.
"""

import struct
from dataclasses import dataclass, field

from metaq.errors import RemoteProtocolError
from metaq.mqtt.limits import MQTT_MAX_PACKET_BYTES
from metaq.mqtt.topics import TopicError, validate_filter, validate_name
from metaq.protocol.stream import StreamParser
from metaq.speedups import load

__all__ = [
    "MQTT_311", "MQTT_5", "VERSIONS", "MAX_REMAINING_LENGTH", "MAX_VARINT",
    "CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP", "SUBSCRIBE", "SUBACK",
    "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH", "WILL",
    "BYTE", "TWO", "FOUR", "VARINT", "STRING", "PAIR", "BINARY", "PROPERTIES", "PROPERTY_IDS",
    "SUCCESS", "MALFORMED_PACKET", "PROTOCOL_ERROR", "UNSUPPORTED_PROTOCOL_VERSION", "CLIENT_ID_NOT_VALID",
    "TOPIC_FILTER_INVALID", "TOPIC_NAME_INVALID", "TOPIC_ALIAS_INVALID", "PACKET_TOO_LARGE", "REASON_CODES",
    "NO_SUBSCRIPTION_EXISTED", "UNSPECIFIED_ERROR", "IMPLEMENTATION_SPECIFIC_ERROR", "BAD_USER_NAME_OR_PASSWORD",
    "NOT_AUTHORIZED", "SERVER_UNAVAILABLE", "USE_ANOTHER_SERVER", "BAD_AUTHENTICATION_METHOD", "SESSION_TAKEN_OVER",
    "PACKET_IDENTIFIER_NOT_FOUND", "RECEIVE_MAXIMUM_EXCEEDED", "QUOTA_EXCEEDED", "RETAIN_NOT_SUPPORTED",
    "SHARED_SUBSCRIPTIONS_NOT_SUPPORTED", "SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED",
    "CONNACK_311_CODES", "SUBACK_311_CODES",
    "MqttError", "Will", "Connect", "Connack", "Publish", "PubAck", "PubRec", "PubRel", "PubComp",
    "Subscription", "Subscribe", "Suback", "Unsubscribe", "Unsuback", "PingReq", "PingResp", "Disconnect", "Auth",
    "MqttParser", "encode", "encode_pubacks", "encode_varint", "refusal", "with_topic_alias",
]

#: Protocol levels (the CONNECT's Protocol Level byte).
MQTT_311 = 4
MQTT_5 = 5
VERSIONS = (MQTT_311, MQTT_5)
_PROTOCOL_NAME = "MQTT"

#: The largest Remaining Length (and variable byte integer) four bytes can carry: 0xFF 0xFF 0xFF 0x7F.
MAX_REMAINING_LENGTH = MAX_VARINT = 268_435_455

# Control packet types (the fixed header's high nibble).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15
#: Not a packet type: the CONNECT payload's Will Properties, a place MQTT 5 properties may appear.
WILL = 0

_NAMES = {CONNECT: "CONNECT", CONNACK: "CONNACK", PUBLISH: "PUBLISH", PUBACK: "PUBACK", PUBREC: "PUBREC",
          PUBREL: "PUBREL", PUBCOMP: "PUBCOMP", SUBSCRIBE: "SUBSCRIBE", SUBACK: "SUBACK", UNSUBSCRIBE: "UNSUBSCRIBE",
          UNSUBACK: "UNSUBACK", PINGREQ: "PINGREQ", PINGRESP: "PINGRESP", DISCONNECT: "DISCONNECT", AUTH: "AUTH",
          WILL: "Will Properties"}
#: The fixed-header flags of every type but PUBLISH (MQTT 3.1.1 §2.2.2, MQTT 5.0 §2.1.3).
_FIXED_FLAGS = {t: (0b0010 if t in (PUBREL, SUBSCRIBE, UNSUBSCRIBE) else 0) for t in _NAMES if t not in (WILL,
                                                                                                         PUBLISH)}
#: The packets only a server sends, and those only a client sends (MQTT 5.0 §2.1.2).
_SERVER_ONLY = frozenset({CONNACK, SUBACK, UNSUBACK, PINGRESP})
_CLIENT_ONLY = frozenset({CONNECT, SUBSCRIBE, UNSUBSCRIBE, PINGREQ})

# -- reason codes (MQTT 5.0 §2.4) --------------------------------------------------------------------------------

SUCCESS = 0x00
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_ID_NOT_VALID = 0x85
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
# those a server's front-end answers with (its own decisions, not the codec's)
NO_SUBSCRIPTION_EXISTED = 0x11
UNSPECIFIED_ERROR = 0x80
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
USE_ANOTHER_SERVER = 0x9C
BAD_AUTHENTICATION_METHOD = 0x8C
SESSION_TAKEN_OVER = 0x8E
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
QUOTA_EXCEEDED = 0x97
RETAIN_NOT_SUPPORTED = 0x9A
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1

#: The reason codes each MQTT 5 packet may carry (MQTT 5.0 §3.2.2.2, §3.4.2.1, §3.5.2.1, §3.6.2.1, §3.7.2.1,
#: §3.9.3, §3.11.3, §3.14.2.1, §3.15.2.1); any other is a Protocol Error.
_PUB_ACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
REASON_CODES = {
    CONNACK: frozenset({0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95,
                        0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}),
    PUBACK: _PUB_ACK_CODES,
    PUBREC: _PUB_ACK_CODES,
    PUBREL: frozenset({0x00, 0x92}),
    PUBCOMP: frozenset({0x00, 0x92}),
    SUBACK: frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}),
    UNSUBACK: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    DISCONNECT: frozenset({0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8C, 0x8D, 0x8E, 0x8F, 0x90, 0x93,
                           0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1,
                           0xA2}),
    AUTH: frozenset({0x00, 0x18, 0x19}),
}
#: MQTT 3.1.1's CONNACK return codes (§3.2.2.3) and SUBACK return codes (§3.9.3).
CONNACK_311_CODES = frozenset({0x00, 0x01, 0x02, 0x03, 0x04, 0x05})
SUBACK_311_CODES = frozenset({0x00, 0x01, 0x02, 0x80})
#: An MQTT 5 CONNACK reason code -> the 3.1.1 return code that says the same (the others have none: close).
_CONNACK_311 = {0x00: 0x00, UNSUPPORTED_PROTOCOL_VERSION: 0x01, CLIENT_ID_NOT_VALID: 0x02, 0x88: 0x03, 0x86: 0x04,
                0x87: 0x05}

# -- MQTT 5 properties (MQTT 5.0 §2.2.2.2, Table 2-4) ------------------------------------------------------------

BYTE, TWO, FOUR, VARINT, STRING, PAIR, BINARY = "byte", "two", "four", "varint", "string", "pair", "binary"
_PUB_ACKS = (PUBACK, PUBREC, PUBREL, PUBCOMP)

#: identifier -> (name, type, the packets it may appear in).
PROPERTIES = {
    0x01: ("payload_format_indicator", BYTE, {PUBLISH, WILL}),
    0x02: ("message_expiry_interval", FOUR, {PUBLISH, WILL}),
    0x03: ("content_type", STRING, {PUBLISH, WILL}),
    0x08: ("response_topic", STRING, {PUBLISH, WILL}),
    0x09: ("correlation_data", BINARY, {PUBLISH, WILL}),
    0x0B: ("subscription_identifier", VARINT, {PUBLISH, SUBSCRIBE}),
    0x11: ("session_expiry_interval", FOUR, {CONNECT, CONNACK, DISCONNECT}),
    0x12: ("assigned_client_identifier", STRING, {CONNACK}),
    0x13: ("server_keep_alive", TWO, {CONNACK}),
    0x15: ("authentication_method", STRING, {CONNECT, CONNACK, AUTH}),
    0x16: ("authentication_data", BINARY, {CONNECT, CONNACK, AUTH}),
    0x17: ("request_problem_information", BYTE, {CONNECT}),
    0x18: ("will_delay_interval", FOUR, {WILL}),
    0x19: ("request_response_information", BYTE, {CONNECT}),
    0x1A: ("response_information", STRING, {CONNACK}),
    0x1C: ("server_reference", STRING, {CONNACK, DISCONNECT}),
    0x1F: ("reason_string", STRING, {CONNACK, *_PUB_ACKS, SUBACK, UNSUBACK, DISCONNECT, AUTH}),
    0x21: ("receive_maximum", TWO, {CONNECT, CONNACK}),
    0x22: ("topic_alias_maximum", TWO, {CONNECT, CONNACK}),
    0x23: ("topic_alias", TWO, {PUBLISH}),
    0x24: ("maximum_qos", BYTE, {CONNACK}),
    0x25: ("retain_available", BYTE, {CONNACK}),
    0x26: ("user_property", PAIR, {CONNECT, CONNACK, PUBLISH, WILL, *_PUB_ACKS, SUBSCRIBE, SUBACK, UNSUBSCRIBE,
                                   UNSUBACK, DISCONNECT, AUTH}),
    0x27: ("maximum_packet_size", FOUR, {CONNECT, CONNACK}),
    0x28: ("wildcard_subscription_available", BYTE, {CONNACK}),
    0x29: ("subscription_identifier_available", BYTE, {CONNACK}),
    0x2A: ("shared_subscription_available", BYTE, {CONNACK}),
}
#: name -> identifier.
PROPERTY_IDS = {name: pid for pid, (name, _, _) in PROPERTIES.items()}
#: Byte properties whose only values are 0 and 1; anything else is a Protocol Error.
_BOOLEAN_BYTES = frozenset({"payload_format_indicator", "request_problem_information",
                            "request_response_information", "maximum_qos", "retain_available",
                            "wildcard_subscription_available", "subscription_identifier_available",
                            "shared_subscription_available"})
#: Properties whose value 0 is a Protocol Error (Topic Alias 0 is "Topic Alias invalid").
_NONZERO = frozenset({"receive_maximum", "maximum_packet_size", "subscription_identifier", "topic_alias"})


class MqttError(RemoteProtocolError):
    """A packet the codec refuses; the connection is closed after the answer ``refusal(self)`` gives.

    ``reason_code`` is the MQTT 5 reason code the server answers with; ``in_connect`` says it was met in a CONNECT
    (the answer is a CONNACK); ``version`` is the protocol level the answer is written in (None: unknown, close
    without an answer).
    """

    def __init__(self, reason, reason_code, in_connect=False, version=None):
        super().__init__(reason, 0, True)
        self.reason_code = reason_code
        self.in_connect = in_connect
        self.version = version


def _malformed(reason):
    return MqttError(reason, MALFORMED_PACKET)


def _protocol(reason):
    return MqttError(reason, PROTOCOL_ERROR)


# -- packets -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Will:
    """A CONNECT's will message: published by the server when the connection ends without a normal DISCONNECT."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: dict = field(default_factory=dict)  # MQTT 5: will_delay_interval, message_expiry_interval, ...


@dataclass(frozen=True)
class Connect:
    version: int
    client_id: str
    clean_start: bool = True  # 3.1.1: Clean Session
    keep_alive: int = 0
    username: str = None
    password: bytes = None
    will: Will = None
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Connack:
    session_present: bool = False
    reason_code: int = SUCCESS  # 3.1.1: the return code (CONNACK_311_CODES)
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = None  # QoS 1 and 2 only
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PubAck:
    """PUBACK; PubRec, PubRel and PubComp have the same fields (a packet id, a reason code, properties)."""

    packet_id: int
    reason_code: int = SUCCESS
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PubRec(PubAck):
    pass


@dataclass(frozen=True)
class PubRel(PubAck):
    pass


@dataclass(frozen=True)
class PubComp(PubAck):
    pass


@dataclass(frozen=True)
class Subscription:
    """One filter of a SUBSCRIBE and its options (3.1.1 has the QoS only)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0  # 0 send retained at subscribe, 1 only if new, 2 never


@dataclass(frozen=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Suback:
    packet_id: int
    reason_codes: tuple
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Unsuback:
    packet_id: int
    reason_codes: tuple = ()  # MQTT 5 only: one per filter
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PingReq:
    pass


@dataclass(frozen=True)
class PingResp:
    pass


@dataclass(frozen=True)
class Disconnect:
    reason_code: int = SUCCESS  # MQTT 5 only
    properties: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Auth:
    reason_code: int = SUCCESS
    properties: dict = field(default_factory=dict)


_ACK_CLASSES = {PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp}
_ACK_TYPES = {PubAck: PUBACK, PubRec: PUBREC, PubRel: PUBREL, PubComp: PUBCOMP}


def refusal(error):
    """The packet a server sends before closing for ``error`` (an ``MqttError``), or None (close without one)."""
    if error.version is None:
        return None
    if error.in_connect:
        if error.version == MQTT_5:
            return Connack(False, error.reason_code)
        code = _CONNACK_311.get(error.reason_code)
        return None if code is None else Connack(False, code)
    return Disconnect(error.reason_code) if error.version == MQTT_5 else None


# -- decoding ----------------------------------------------------------------------------------------------------

class _Reader:
    """The body of one packet, read front to back; running past its end is a Malformed Packet."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data, pos=0, end=None):
        self.data, self.pos, self.end = data, pos, len(data) if end is None else end

    def left(self):
        return self.end - self.pos

    def take(self, n, what):
        if n > self.end - self.pos:
            raise _malformed("packet ends inside its %s" % what)
        start = self.pos
        self.pos += n
        return self.data[start:self.pos]

    def byte(self, what):
        return self.take(1, what)[0]

    def two(self, what):
        return int.from_bytes(self.take(2, what), "big")

    def four(self, what):
        return int.from_bytes(self.take(4, what), "big")

    def varint(self, what):
        value, shift = 0, 0
        for i in range(4):
            b = self.byte(what)
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                if i and not b:
                    raise _malformed("%s is not in its shortest encoding" % what)
                return value
            shift += 7
        raise _malformed("%s is longer than 4 bytes" % what)

    def binary(self, what):
        return bytes(self.take(self.two(what), what))

    def string(self, what):
        raw = self.binary(what)
        try:
            text = raw.decode("utf-8")  # strict: ill-formed sequences, overlongs and surrogates are refused
        except UnicodeDecodeError:
            raise _malformed("%s is not well-formed UTF-8" % what) from None
        if "\x00" in text:
            raise _malformed("%s contains U+0000" % what)
        return text

    def packet_id(self):
        pid = self.two("packet identifier")
        if pid == 0:
            raise _protocol("packet identifier 0")
        return pid

    def done(self, what):
        if self.pos != self.end:
            raise _malformed("%d bytes past the end of the %s" % (self.end - self.pos, what))


def _read_properties(r, kind, sender=None):
    """The property block at ``r`` of a packet of ``kind`` (a packet type or ``WILL``) as a dict."""
    length = r.varint("property length")
    if length > r.left():
        raise _malformed("property length %d runs past the packet" % length)
    end = r.pos + length
    props = {}
    while r.pos < end:
        pid = r.varint("property identifier")
        entry = PROPERTIES.get(pid)
        if entry is None:
            raise _malformed("unknown property identifier 0x%02X" % pid)
        name, ptype, where = entry
        if kind not in where:
            raise _malformed("property %s (0x%02X) is not allowed in %s" % (name, pid, _NAMES[kind]))
        sub = _Reader(r.data, r.pos, end)
        if ptype == BYTE:
            value = sub.byte(name)
        elif ptype == TWO:
            value = sub.two(name)
        elif ptype == FOUR:
            value = sub.four(name)
        elif ptype == VARINT:
            value = sub.varint(name)
        elif ptype == STRING:
            value = sub.string(name)
        elif ptype == BINARY:
            value = sub.binary(name)
        else:
            value = (sub.string(name + " name"), sub.string(name + " value"))
        r.pos = sub.pos
        _check_property(name, value, kind, sender)
        if name == "user_property" or (name == "subscription_identifier" and kind == PUBLISH):
            props[name] = props.get(name, ()) + (value,)
        elif name in props:
            raise _protocol("property %s given twice in %s" % (name, _NAMES[kind]))
        else:
            props[name] = value
    if "authentication_data" in props and "authentication_method" not in props:
        raise _protocol("authentication data without an authentication method")  # MQTT 5.0 §3.1.2.11.10
    return props


def _check_property(name, value, kind, sender):
    if name in _BOOLEAN_BYTES and value not in (0, 1):
        raise _protocol("%s must be 0 or 1, not %d" % (name, value))
    if name in _NONZERO and value == 0:
        if name == "topic_alias":
            raise MqttError("topic alias 0", TOPIC_ALIAS_INVALID)
        raise _protocol("%s must not be 0" % name)
    if name == "response_topic":
        try:
            validate_name(value)
        except TopicError as exc:
            raise _protocol("response topic: %s" % exc) from None
    if name == "subscription_identifier" and kind == PUBLISH and sender == "client":
        raise _protocol("a client's PUBLISH must not carry a subscription identifier")


def _reason(code, kind):
    if code not in REASON_CODES[kind]:
        raise _protocol("reason code 0x%02X is not defined for %s" % (code, _NAMES[kind]))
    return code


def _decode_connect(r):
    level = None
    try:
        name = r.string("protocol name")
        level = r.byte("protocol level")
        if name != _PROTOCOL_NAME:
            # MQTT 3.1 is told "unacceptable protocol version" the way a 3.1 client reads it; another name is
            # closed without an answer (MQTT 3.1.1 [MQTT-3.1.2-1], MQTT 5.0 §3.1.2.1: the server MAY close)
            level = MQTT_311 if name == "MQIsdp" else None
            raise MqttError("protocol name %r is not MQTT" % name, UNSUPPORTED_PROTOCOL_VERSION)
        if level not in VERSIONS:
            level = MQTT_311  # answered with 3.1.1's CONNACK 0x01, which every version's client reads
            raise MqttError("protocol level %d is not supported (4: 3.1.1, 5: 5.0)" % r.data[r.pos - 1],
                            UNSUPPORTED_PROTOCOL_VERSION)
        flags = r.byte("connect flags")
        if flags & 0x01:
            raise _malformed("CONNECT's reserved flag bit 0 is set")
        has_user, has_password, will_retain = bool(flags & 0x80), bool(flags & 0x40), bool(flags & 0x20)
        will_qos, has_will, clean = (flags >> 3) & 0x03, bool(flags & 0x04), bool(flags & 0x02)
        if will_qos == 3:
            raise _malformed("will QoS 3")
        if not has_will and (will_qos or will_retain):
            raise _malformed("will QoS or will retain set without the will flag")
        if level == MQTT_311 and has_password and not has_user:
            raise _malformed("password flag set without the user name flag (MQTT 3.1.1)")
        keep_alive = r.two("keep alive")
        props = _read_properties(r, CONNECT) if level == MQTT_5 else {}
        client_id = r.string("client identifier")
        if level == MQTT_311 and not client_id and not clean:
            raise MqttError("an empty client identifier needs clean session 1 (MQTT 3.1.1)", CLIENT_ID_NOT_VALID)
        will = None
        if has_will:
            will_props = _read_properties(r, WILL) if level == MQTT_5 else {}
            topic = r.string("will topic")
            try:
                validate_name(topic)
            except TopicError as exc:
                raise MqttError("will topic: %s" % exc, TOPIC_NAME_INVALID) from None
            will = Will(topic, r.binary("will payload"), will_qos, will_retain, will_props)
        username = r.string("user name") if has_user else None
        password = r.binary("password") if has_password else None
        r.done("CONNECT")
    except MqttError as exc:
        exc.in_connect = True
        exc.version = level if level in VERSIONS else None
        raise
    return Connect(level, client_id, clean, keep_alive, username, password, will, props)


def _decode_connack(r, version):
    flags = r.byte("acknowledge flags")
    if flags & 0xFE:
        raise _malformed("CONNACK's reserved flag bits are set")
    code = r.byte("reason code")
    if version == MQTT_311:
        if code not in CONNACK_311_CODES:
            raise _protocol("CONNACK return code 0x%02X is reserved" % code)
        props = {}
    else:
        _reason(code, CONNACK)
        props = _read_properties(r, CONNACK)
    if code and flags:
        raise _protocol("session present set with a refusal")
    r.done("CONNACK")
    return Connack(bool(flags), code, props)


def _decode_publish(r, flags, version, sender):
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise _malformed("PUBLISH with QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise _malformed("PUBLISH with DUP set at QoS 0")
    topic = r.string("topic name")
    packet_id = r.packet_id() if qos else None
    props = _read_properties(r, PUBLISH, sender) if version == MQTT_5 else {}
    if not (topic == "" and version == MQTT_5 and "topic_alias" in props):
        if topic == "" and version == MQTT_5:
            raise _protocol("an empty topic name without a topic alias")
        try:
            validate_name(topic)
        except TopicError as exc:
            raise MqttError(str(exc), TOPIC_NAME_INVALID) from None
    payload = bytes(r.take(r.left(), "payload"))
    return Publish(topic, payload, qos, bool(flags & 0x01), dup, packet_id, props)


def _decode_ack(r, ptype, version):
    packet_id = r.packet_id()
    code, props = SUCCESS, {}
    if version == MQTT_5 and r.left():
        code = _reason(r.byte("reason code"), ptype)
        if r.left():
            props = _read_properties(r, ptype)
    r.done(_NAMES[ptype])
    return _ACK_CLASSES[ptype](packet_id, code, props)


def _decode_subscribe(r, version):
    packet_id = r.packet_id()
    props = _read_properties(r, SUBSCRIBE) if version == MQTT_5 else {}
    subs = []
    while r.left():
        topic_filter = r.string("topic filter")
        options = r.byte("subscription options")
        qos = options & 0x03
        if version == MQTT_311:
            if options & 0xFC:
                raise _malformed("reserved bits of a 3.1.1 subscription's requested QoS byte are set")
            if qos == 3:
                raise _malformed("subscription QoS 3")
            sub = Subscription(topic_filter, qos)
        else:
            if options & 0xC0:
                raise _malformed("reserved bits 6-7 of subscription options are set")
            if qos == 3:
                raise _protocol("subscription maximum QoS 3")
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise _protocol("retain handling 3")
            sub = Subscription(topic_filter, qos, bool(options & 0x04), bool(options & 0x08), retain_handling)
        try:
            group, _ = validate_filter(topic_filter, shared=version == MQTT_5)
        except TopicError as exc:
            raise MqttError(str(exc), TOPIC_FILTER_INVALID) from None
        if group is not None and sub.no_local:
            raise _protocol("no local set on a shared subscription")
        subs.append(sub)
    if not subs:
        raise _protocol("SUBSCRIBE without a topic filter")
    return Subscribe(packet_id, tuple(subs), props)


def _decode_suback(r, version):
    packet_id = r.packet_id()
    props = _read_properties(r, SUBACK) if version == MQTT_5 else {}
    codes = tuple(bytes(r.take(r.left(), "reason codes")))
    if not codes:
        raise _protocol("SUBACK without a reason code")
    allowed = SUBACK_311_CODES if version == MQTT_311 else REASON_CODES[SUBACK]
    for code in codes:
        if code not in allowed:
            raise _protocol("SUBACK code 0x%02X is not defined" % code)
    return Suback(packet_id, codes, props)


def _decode_unsubscribe(r, version):
    packet_id = r.packet_id()
    props = _read_properties(r, UNSUBSCRIBE) if version == MQTT_5 else {}
    filters = []
    while r.left():
        topic_filter = r.string("topic filter")
        try:
            validate_filter(topic_filter, shared=version == MQTT_5)
        except TopicError as exc:
            raise MqttError(str(exc), TOPIC_FILTER_INVALID) from None
        filters.append(topic_filter)
    if not filters:
        raise _protocol("UNSUBSCRIBE without a topic filter")
    return Unsubscribe(packet_id, tuple(filters), props)


def _decode_unsuback(r, version):
    packet_id = r.packet_id()
    if version == MQTT_311:
        r.done("UNSUBACK")
        return Unsuback(packet_id)
    props = _read_properties(r, UNSUBACK)
    codes = tuple(_reason(c, UNSUBACK) for c in bytes(r.take(r.left(), "reason codes")))
    if not codes:
        raise _protocol("UNSUBACK without a reason code")
    return Unsuback(packet_id, codes, props)


def _decode_closing(r, ptype, version):
    """DISCONNECT and AUTH: an optional reason code, then optional properties (MQTT 5); nothing in 3.1.1."""
    code, props = SUCCESS, {}
    if version == MQTT_5 and r.left():
        code = _reason(r.byte("reason code"), ptype)
        if r.left():
            props = _read_properties(r, ptype)
    r.done(_NAMES[ptype])
    return (Disconnect if ptype == DISCONNECT else Auth)(code, props)


def _decode_empty(r, ptype):
    r.done(_NAMES[ptype])
    return PingReq() if ptype == PINGREQ else PingResp()


#: Topic names the PUBLISH fast path (``_plain_publish``) remembers as checked, by their bytes: the most used, each
#: at most ``_KNOWN_NAME_BYTES`` (past the count the memory starts again).
MQTT_KNOWN_NAMES = 4096
_KNOWN_NAME_BYTES = 256
_known_names = {}
_new = object.__new__


def _name_bytes(buf, start, end, flags):
    """The topic name's bytes of a PUBLISH body ``buf[start:end]`` with fixed-header ``flags`` the fast paths may
    decode (QoS 0-2, no DUP at QoS 0, the name within the body); None for any other."""
    qos = (flags >> 1) & 0x03
    if qos == 3 or (flags & 0x08 and not qos) or end - start < 2:
        return None
    at = start + 2 + ((buf[start] << 8) | buf[start + 1])
    if at > end:
        return None
    return bytes(buf[start + 2:at])


def _plain_publish(buf, start, end, flags, v5):
    """The ``Publish`` of a PUBLISH body ``buf[start:end]`` without properties whose topic name is one already
    checked, or one that passes ``_decode_publish``'s checks, decoded in one step; None for any other (a QoS 3, a DUP
    at QoS 0, properties, packet id 0, a short body, a name to refuse...): ``_decode_publish`` decodes or refuses it,
    so both give the same packet or the same refusal. A name that passes is remembered (``_known_names``), so its
    next PUBLISHes are decoded by ``split`` alone."""
    raw = _name_bytes(buf, start, end, flags)
    if raw is None:
        return None
    if raw not in _known_names:
        if len(raw) > _KNOWN_NAME_BYTES:
            return None
        try:
            topic = raw.decode("utf-8")
            if "\x00" in topic:
                return None
            validate_name(topic)
        except (UnicodeDecodeError, TopicError):
            return None
        if len(_known_names) >= MQTT_KNOWN_NAMES:
            _known_names.clear()
        _known_names[raw] = topic
    fields = _known_publish(buf, start, end, flags, v5, _known_names)
    return None if fields is None else packet_of(fields)


def _known_publish(buf, start, end, flags, v5, names):
    """The fields ``(PUBLISH, topic, payload, qos, retain, dup, packet id)`` of a PUBLISH body ``buf[start:end]``
    without properties whose topic name's bytes are a key of ``names`` (names already checked, to their ``str``), as
    ``_decode_publish`` decodes it (``packet_of`` makes its ``Publish``); None for any other."""
    raw = _name_bytes(buf, start, end, flags)
    topic = None if raw is None else names.get(raw)
    if topic is None:
        return None
    qos = (flags >> 1) & 0x03
    at = start + 2 + len(raw)
    packet_id = None
    if qos:
        if at + 2 > end:
            return None
        packet_id = (buf[at] << 8) | buf[at + 1]
        if not packet_id:
            return None
        at += 2
    if v5:
        if at >= end or buf[at]:
            return None  # properties (or none at all): the general decoder
        at += 1
    return PUBLISH, topic, bytes(buf[at:end]), qos, bool(flags & 0x01), bool(flags & 0x08), packet_id


def _plain_puback(buf, start, end, v5):
    """The fields ``(PUBACK, packet id, reason code)`` of a PUBACK body ``buf[start:end]`` with a non-zero packet id
    and no properties (MQTT 5: a reason code a PUBACK may carry, then an empty property length, each optional), as
    ``_decode_ack`` decodes it (``packet_of`` makes its ``PubAck``); None for any other."""
    n = end - start
    if n < 2 or (not v5 and n != 2) or n > 4:
        return None
    packet_id = (buf[start] << 8) | buf[start + 1]
    if not packet_id:
        return None
    code = SUCCESS
    if n >= 3:
        code = buf[start + 2]
        if code not in _PUB_ACK_CODES or (n == 4 and buf[start + 3]):
            return None
    return PUBACK, packet_id, code


def packet_of(fields):
    """The ``Publish`` or ``PubAck`` of ``split``'s fields, made as their frozen ``__init__`` would make it, without
    its per-field ``object.__setattr__``."""
    p = _new(Publish if fields[0] == PUBLISH else PubAck)
    if fields[0] == PUBLISH:
        _, topic, payload, qos, retain, dup, packet_id = fields
        p.__dict__.update(topic=topic, payload=payload, qos=qos, retain=retain, dup=dup, packet_id=packet_id,
                          properties={})
    else:
        p.__dict__.update(packet_id=fields[1], reason_code=fields[2], properties={})
    return p


#: ``split``'s answers when it returns no packet: the second field of ``(None, code, size)``.
SPLIT_NEED_DATA, SPLIT_TOO_LONG, SPLIT_NOT_SHORTEST, SPLIT_TOO_LARGE = -1, -2, -3, -4


def split_py(buf, pos, max_packet, version, names):
    """The packet at ``pos`` in ``buf``, split: ``(fields, next pos, next pos)`` when it is a plain PUBLISH of a
    name in ``names`` (``_known_publish``) or a plain PUBACK (``_plain_puback``), decoded to their fields (only once
    ``version``, the protocol level, is known; ``packet_of`` makes the packet); ``(None, body start, next pos)`` for
    any other whole packet (the general decoder's); ``(None, SPLIT_NEED_DATA, 0)`` when it is not whole yet;
    ``(None, SPLIT_TOO_LONG or SPLIT_NOT_SHORTEST, 0)`` for a Remaining Length longer than 4 bytes or not in its
    shortest encoding, ``(None, SPLIT_TOO_LARGE, its size)`` for a packet past ``max_packet`` (known as soon as its
    length field is). ``metaq.native._bytes``'s ``mqtt_split`` is this function in C (the tests hold the two equal)."""
    available = len(buf) - pos
    if available < 2:
        return None, SPLIT_NEED_DATA, 0
    length, shift, i = 0, 0, 1
    while True:
        if i >= available:
            return None, SPLIT_NEED_DATA, 0
        b = buf[pos + i]
        length |= (b & 0x7F) << shift
        if not b & 0x80:
            if i > 1 and not b:
                return None, SPLIT_NOT_SHORTEST, 0
            break
        if i == 4:
            return None, SPLIT_TOO_LONG, 0
        shift += 7
        i += 1
    total = 1 + i + length
    if total > max_packet:
        return None, SPLIT_TOO_LARGE, total
    if available < total:
        return None, SPLIT_NEED_DATA, 0
    start, end = pos + 1 + i, pos + total
    first = buf[pos]
    packet = None
    if version == MQTT_311 or version == MQTT_5:
        if first >> 4 == PUBLISH:
            packet = _known_publish(buf, start, end, first & 0x0F, version == MQTT_5, names)
        elif first == PUBACK << 4:
            packet = _plain_puback(buf, start, end, version == MQTT_5)
    return (None, start, end) if packet is None else (packet, end, end)


def plain_publishes_py(buf, pos, v5, max_packet, plans, decided, room, count, nbytes):
    """The consecutive plain PUBLISHes whole in ``buf`` from ``pos``, split and staged in one step: ``(entries, next
    pos, how many at QoS 1, their records' bytes)``. A plain PUBLISH is one at QoS 0 or 1, not retained, without
    properties (MQTT 5: ``v5``, an empty property length), within ``max_packet``, whose topic name's bytes are a key
    of ``plans`` and whose metaq topic (the plan's second field) is a key of ``decided``; a QoS 1 one only while
    ``room`` (how many more QoS 1 PUBLISHes may be unacknowledged) is left. ``plans`` maps a name's bytes to
    ``(name, metaq topic, name hash, flag, record prefix at QoS 0, at QoS 1)`` (``records.plain_plan``), ``decided``
    a metaq topic to its partition count (``MqttPort.stage``'s). Each entry is the plain values ``(metaq topic, hash
    % partitions, flag, prefix + payload, name, payload, qos, dup, packet id or None)``: what ``MqttPort.stage``
    gives, with the PUBLISH's name and fields after (``plainturn.entries_of`` makes the burst's entries of them). The
    split stops before the first packet that is not such a PUBLISH (anything else, a refusal included, is the general
    path's: ``_next_event``), and after ``count`` entries or once their records' bytes reach ``nbytes``.
    ``metaq.native._bytes``'s ``mqtt_plain_publishes`` is this function in C (the tests hold the two equal)."""
    out = []
    end = len(buf)
    qos1 = taken = 0
    while count > 0 and nbytes > 0 and end - pos >= 2:
        first = buf[pos]
        if first != 0x30 and first != 0x32 and first != 0x3A:  # PUBLISH, QoS 0 or 1 (DUP at 1 only), not retained
            break
        bounds = _plain_bounds(buf, pos, end, max_packet)
        if bounds is None:
            break
        start, stop = bounds
        at = start + 2 + ((buf[start] << 8) | buf[start + 1])
        if at > stop:
            break
        plan = plans.get(bytes(buf[start + 2:at]))
        if plan is None:
            break
        qos = (first >> 1) & 1
        head = _plain_head_end(buf, at, stop, qos, room, v5)
        if head is None:
            break
        packet_id, at = head
        partitions = decided.get(plan[1])
        if partitions is None or partitions <= 0:
            break
        payload = bytes(buf[at:stop])
        data = plan[4 + qos] + payload
        out.append((plan[1], plan[2] % partitions, plan[3], data, plan[0], payload, qos, bool(first & 0x08),
                    packet_id))
        pos = stop
        count -= 1
        nbytes -= len(data)
        taken += len(data)
        room -= qos
        qos1 += qos
    return out, pos, qos1, taken


def read_publishes_py(buf, pos, v5, max_packet, plans, decided, room, count, nbytes):
    """``plain_publishes``'s split and staging and the successful PUBACKs of the QoS 1 PUBLISHes it took, in their
    order, as one byte string (``encode_pubacks``'s): ``(entries, next pos, how many at QoS 1, their records' bytes,
    PUBACKs)``, the reader's turn of a device in one step. ``metaq.native._bytes``'s ``mqtt_read_publishes`` is this
    function in C (the tests hold the two equal)."""
    entries, pos, qos1, taken = plain_publishes_py(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
    return entries, pos, qos1, taken, encode_pubacks_py([e[8] for e in entries if e[6]])


def plain_pubacks_py(buf, pos, v5, max_packet):
    """The consecutive plain PUBACKs whole in ``buf`` from ``pos`` (``_plain_puback``'s: a non-zero packet id, MQTT 5
    (``v5``) an optional reason code a PUBACK may carry and an optional empty property length), within
    ``max_packet``: ``(their packet ids, in order, next pos)``, the subscriber's read of acknowledgements in one
    step. It stops before the first packet that is not one (anything else, a refusal included, is the general
    path's: ``_next_event``); ``end_pubacks``'s split. ``metaq.native._bytes``'s ``mqtt_plain_pubacks`` is this function
    in C (the tests hold the two equal)."""
    ids = []
    end = len(buf)
    pos = max(pos, 0)
    while end - pos >= 4 and buf[pos] == 0x40:
        n = buf[pos + 1]
        if n < 2 or n > (4 if v5 else 2) or 2 + n > max_packet or pos + 2 + n > end:
            break
        packet_id = (buf[pos + 2] << 8) | buf[pos + 3]
        if not packet_id or (n >= 3 and (buf[pos + 4] not in _PUB_ACK_CODES or (n == 4 and buf[pos + 5]))):
            break
        ids.append(packet_id)
        pos += 2 + n
    return ids, pos


def end_pubacks(buf, pos, v5, max_packet, inflight, where, state):
    """``plain_pubacks``' PUBACKs, each ending its packet id's message in flight as ``MqttSession.acknowledged``
    does: deleted from ``inflight`` (a session's, packet id -> state) when held there in ``state``, and from
    ``where``. ``(how many PUBACKs taken, how many messages ended, next pos)``: the subscriber's read of
    acknowledgements and their effect in one step."""
    ids, pos = plain_pubacks(buf, pos, v5, max_packet)
    ended = 0
    for packet_id in ids:
        if inflight.get(packet_id) == state:
            del inflight[packet_id]
            where.pop(packet_id, None)
            ended += 1
    return len(ids), ended, pos


def _plain_bounds(buf, pos, end, max_packet):
    """``(start, stop)`` of the variable header and payload of the packet at ``pos`` in ``buf`` (up to ``end``):
    None when its remaining length is incomplete, not minimal (a trailing 0x00 byte) or longer than four bytes,
    when the packet is past ``max_packet`` or not whole, or when it has no room for a topic name's length."""
    length, shift, i = 0, 0, 1
    while True:
        if pos + i >= end:
            return None
        b = buf[pos + i]
        length |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        if i == 4:
            return None
        shift += 7
        i += 1
    if i > 1 and not b:
        return None
    total = 1 + i + length
    if total > max_packet or total > end - pos:
        return None
    start, stop = pos + 1 + i, pos + total
    return None if stop - start < 2 else (start, stop)


def _plain_head_end(buf, at, stop, qos, room, v5):
    """``(packet id or None, payload start)`` of a plain PUBLISH whose topic name ends at ``at``: a QoS 1 one's
    non-zero packet id while ``room`` is left, then (MQTT 5) an empty property length; None otherwise."""
    packet_id = None
    if qos:
        if room <= 0 or at + 2 > stop:
            return None
        packet_id = (buf[at] << 8) | buf[at + 1]
        if not packet_id:
            return None
        at += 2
    if v5:
        if at >= stop or buf[at]:
            return None
        at += 1
    return packet_id, at


class MqttParser(StreamParser):
    """Incremental parser of MQTT control packets (``metaq.protocol.stream``'s buffer and markers).

    Feed bytes with ``receive_data`` (``b""``: the end of the stream), then call ``next_event`` until it returns
    ``NEED_DATA`` (or ``CLOSED`` after a clean end between packets); it raises ``MqttError`` on a packet it refuses,
    and again on every later call. ``version`` is the protocol level (None: learnt from the first packet, which must
    be a CONNECT); ``max_packet`` bounds a whole packet's bytes; ``sender`` is "client", "server" or None (see the
    module's docstring).
    """

    __slots__ = ("version", "max_packet", "sender")

    def __init__(self, version=None, max_packet=MQTT_MAX_PACKET_BYTES, sender=None):
        super().__init__()
        if version is not None and version not in VERSIONS:
            raise ValueError("unsupported MQTT protocol level %r" % version)
        if sender not in (None, "client", "server"):
            raise ValueError("sender must be 'client', 'server' or None")
        self.version = version
        self.max_packet = max_packet
        self.sender = sender

    def _next_event(self):
        buf, pos = self._buf, self._pos
        fields, start, end = split(buf, pos, self.max_packet, self.version, _known_names)
        if fields is not None:
            self._pos = end
            return packet_of(fields)
        if start < 0:
            if start == SPLIT_NEED_DATA:
                return self._need_data()
            if start == SPLIT_TOO_LARGE:
                raise self._refuse(MqttError("packet of %d bytes is past the limit of %d bytes"
                                             % (end, self.max_packet), PACKET_TOO_LARGE))
            raise self._refuse(_malformed("remaining length is longer than 4 bytes" if start == SPLIT_TOO_LONG
                                          else "remaining length is not in its shortest encoding"))
        first = buf[pos]
        if first >> 4 == PUBLISH and self.version is not None:
            packet = _plain_publish(buf, start, end, first & 0x0F, self.version == MQTT_5)
            if packet is not None:
                self._pos = end
                return packet
        body = bytes(buf[start:end])
        self._pos = end
        try:
            return self._decode(first >> 4, first & 0x0F, body)
        except MqttError as exc:
            raise self._refuse(exc) from None

    def plain_publishes(self, plans, decided, room, count, nbytes):
        """The plain PUBLISHes buffered next, split and staged: ``plain_publishes``'s ``(entries, how many at QoS 1,
        their records' bytes)``, no entries when the next packet is not one, or the parser has refused one or has no
        version yet. They are consumed as ``next_event`` would have returned them; whatever is not taken is left
        for ``next_event``, which decodes or refuses it."""
        if self._fatal is not None or self.version is None:
            return (), 0, 0
        entries, pos, qos1, taken = plain_publishes(self._buf, self._pos, self.version == MQTT_5, self.max_packet,
                                                    plans, decided, room, count, nbytes)
        if entries:
            self._pos = pos
            self._completed += len(entries)
        return entries, qos1, taken

    def plain_read(self, data, plans, decided, room, count, nbytes):
        """``receive_data(data)`` then the plain PUBLISHes buffered next, split and staged with the PUBACKs of the
        QoS 1 ones (``read_publishes``): ``(entries, how many at QoS 1, their records' bytes, PUBACKs, whether
        bytes are left buffered)``, as ``plain_publishes`` answers. When nothing is buffered before ``data`` (a
        device's read holding whole packets) they are split from ``data`` itself and only what follows them is
        buffered (for ``next_event``)."""
        if self._pos < len(self._buf) or self._fatal is not None or self._eof or self.version is None or not data:
            self.receive_data(data)
            if self._fatal is not None or self.version is None:
                return (), 0, 0, b"", self._pos < len(self._buf)
            data, start = self._buf, self._pos
        else:
            start = 0
        entries, pos, qos1, taken, acks = read_publishes(data, start, self.version == MQTT_5, self.max_packet, plans,
                                                         decided, room, count, nbytes)
        if entries:
            self._completed += len(entries)
        if data is self._buf:
            self._pos = pos
            return entries, qos1, taken, acks, pos < len(data)
        if pos < len(data):
            self.receive_data(data[pos:] if pos else data)
            return entries, qos1, taken, acks, True
        return entries, qos1, taken, acks, False

    def end_acks(self, data, inflight, where, state):
        """``receive_data(data)`` then the plain PUBACKs buffered next, each ending its message in flight
        (``end_pubacks``: ``inflight``, ``where`` and ``state`` a session's), consumed as ``next_event`` would have
        returned them; whatever follows them is left for ``next_event``: ``(PUBACKs taken, messages ended, whether
        bytes are left buffered)``. When nothing is buffered before ``data`` (a subscriber's read holding whole
        PUBACKs) they are split from ``data`` itself and only what follows them is buffered. None taken before the
        version is known or after a refusal."""
        if self._pos < len(self._buf) or self._fatal is not None or self._eof or self.version is None or not data:
            self.receive_data(data)
            if self._fatal is not None or self.version is None:
                return 0, 0, self._pos < len(self._buf)
            taken, ended, self._pos = end_pubacks(self._buf, self._pos, self.version == MQTT_5, self.max_packet,
                                                  inflight, where, state)
            self._completed += taken
            return taken, ended, self._pos < len(self._buf)
        taken, ended, pos = end_pubacks(data, 0, self.version == MQTT_5, self.max_packet, inflight, where, state)
        self._completed += taken
        if pos < len(data):
            self.receive_data(data[pos:] if pos else data)
            return taken, ended, True
        return taken, ended, False

    def _refuse(self, exc):
        if exc.version is None and not exc.in_connect:
            exc.version = self.version
        return exc

    def _ended_inside(self):
        return self._refuse(_malformed("the stream ended inside a packet"))

    def _decode(self, ptype, flags, body):
        version = self.version
        if ptype == 0 or (ptype == AUTH and version == MQTT_311):
            raise _malformed("reserved packet type %d" % ptype)
        if version is None and ptype != CONNECT:
            raise _protocol("the first packet must be CONNECT, not %s" % _NAMES[ptype])
        if ptype != PUBLISH and flags != _FIXED_FLAGS[ptype]:
            raise _malformed("%s with fixed-header flags 0b%s" % (_NAMES[ptype], format(flags, "04b")))
        if self.sender == "client" and ptype in _SERVER_ONLY or self.sender == "server" and ptype in _CLIENT_ONLY:
            raise _protocol("%s is not sent by a %s" % (_NAMES[ptype], self.sender))
        r = _Reader(body)
        if ptype == CONNECT:
            if version is not None:
                raise _protocol("a second CONNECT")
            packet = _decode_connect(r)
            self.version = packet.version
            return packet
        if ptype == PUBLISH:
            return _decode_publish(r, flags, version, self.sender)
        if ptype in _ACK_CLASSES:
            return _decode_ack(r, ptype, version)
        if ptype == CONNACK:
            return _decode_connack(r, version)
        if ptype == SUBSCRIBE:
            return _decode_subscribe(r, version)
        if ptype == SUBACK:
            return _decode_suback(r, version)
        if ptype == UNSUBSCRIBE:
            return _decode_unsubscribe(r, version)
        if ptype == UNSUBACK:
            return _decode_unsuback(r, version)
        if ptype in (PINGREQ, PINGRESP):
            return _decode_empty(r, ptype)
        return _decode_closing(r, ptype, version)


plain_publishes = load("mqtt_plain_publishes", plain_publishes_py)
read_publishes = load("mqtt_read_publishes", read_publishes_py)
plain_pubacks = load("mqtt_plain_pubacks", plain_pubacks_py)
split = load("mqtt_split", split_py)


# -- encoding ----------------------------------------------------------------------------------------------------

def encode_varint(value):
    """``value`` (0..MAX_VARINT) as a variable byte integer, in its shortest encoding."""
    if not 0 <= value <= MAX_VARINT:
        raise ValueError("variable byte integer %r out of range" % value)
    out = bytearray()
    while True:
        b, value = value & 0x7F, value >> 7
        out.append(b | 0x80 if value else b)
        if not value:
            return bytes(out)


def _binary(data):
    if len(data) > 0xFFFF:
        raise ValueError("binary data of %d bytes is past 65,535" % len(data))
    return len(data).to_bytes(2, "big") + data


def _string(text):
    if "\x00" in text:
        raise ValueError("an MQTT string must not contain U+0000")
    return _binary(text.encode("utf-8"))


def _property_value(ptype, value):
    if ptype == BYTE:
        return bytes((value,))
    if ptype == TWO:
        return value.to_bytes(2, "big")
    if ptype == FOUR:
        return value.to_bytes(4, "big")
    if ptype == VARINT:
        return encode_varint(value)
    if ptype == STRING:
        return _string(value)
    if ptype == BINARY:
        return _binary(value)
    return _string(value[0]) + _string(value[1])


def _encode_properties(props, kind):
    for name in props:
        pid = PROPERTY_IDS.get(name)
        if pid is None or kind not in PROPERTIES[pid][2]:
            raise ValueError("property %s is not allowed in %s" % (name, _NAMES[kind]))
    out = bytearray()
    for pid, (name, ptype, _) in PROPERTIES.items():
        if name not in props:
            continue
        value = props[name]
        repeated = name == "user_property" or (name == "subscription_identifier" and kind == PUBLISH)
        for one in (value if repeated else (value,)):
            out += encode_varint(pid) + _property_value(ptype, one)
    return encode_varint(len(out)) + bytes(out)


def _packet(ptype, flags, body):
    return _packet_byte(ptype << 4 | flags, body)


def _packet_byte(first, body):
    return bytes((first,)) + encode_varint(len(body)) + body


def _packet_id(pid):
    if pid is None or not 1 <= pid <= 0xFFFF:
        raise ValueError("packet identifier %r is not 1..65535" % (pid,))
    return pid.to_bytes(2, "big")


def _encode_connect(p):
    if p.version not in VERSIONS:
        raise ValueError("unsupported MQTT protocol level %r" % p.version)
    v5 = p.version == MQTT_5
    flags = (0x80 if p.username is not None else 0) | (0x40 if p.password is not None else 0)
    flags |= 0x02 if p.clean_start else 0
    if p.will is not None:
        flags |= 0x04 | (p.will.qos << 3) | (0x20 if p.will.retain else 0)
    body = _string(_PROTOCOL_NAME) + bytes((p.version, flags)) + p.keep_alive.to_bytes(2, "big")
    if v5:
        body += _encode_properties(p.properties, CONNECT)
    body += _string(p.client_id)
    if p.will is not None:
        if v5:
            body += _encode_properties(p.will.properties, WILL)
        body += _string(p.will.topic) + _binary(p.will.payload)
    if p.username is not None:
        body += _string(p.username)
    if p.password is not None:
        body += _binary(p.password)
    return _packet(CONNECT, 0, body)


def _encode_publish(p, v5):
    if p.qos not in (0, 1, 2):
        raise ValueError("QoS %r" % (p.qos,))
    flags = (0x08 if p.dup else 0) | (p.qos << 1) | (0x01 if p.retain else 0)
    packet_id = 0
    if p.qos:
        packet_id = p.packet_id
        if packet_id is None or not 1 <= packet_id <= 0xFFFF:
            raise ValueError("packet identifier %r is not 1..65535" % (packet_id,))
    elif p.packet_id is not None or p.dup:
        raise ValueError("a QoS 0 PUBLISH has no packet identifier and no DUP")
    props = None
    if v5:
        props = _encode_properties(p.properties, PUBLISH) if p.properties else b"\x00"
    return publish_bytes(PUBLISH << 4 | flags, p.topic, packet_id, props, p.payload)


def publish_bytes_py(first, topic, packet_id, props, payload):
    """A PUBLISH's bytes: fixed-header byte ``first``, Remaining Length, topic name ``topic`` (a ``str``: U+0000
    and past 65,535 bytes refused with ``ValueError``), packet id ``packet_id`` (0: none, QoS 0), the MQTT 5 property
    block ``props`` (its length and properties, encoded; None in 3.1.1), ``payload``. The caller checks the fields'
    consistency (``_encode_publish``); a packet id past 2 bytes or a ``first`` past a byte is refused
    (``OverflowError``, ``ValueError``), never truncated. ``metaq.native._bytes``'s ``mqtt_publish_bytes`` is this
    function in C."""
    body = _string(topic) + (packet_id.to_bytes(2, "big") if packet_id else b"") + (props or b"")
    return _packet_byte(first, body + payload)


publish_bytes = load("mqtt_publish_bytes", publish_bytes_py)


def _read_varint_at(data, at):
    """The variable byte integer of encoded ``data`` at byte ``at`` and the byte after it (a packet we encoded)."""
    value = shift = 0
    while True:
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7


def with_topic_alias(data, alias, named):
    """The encoded MQTT 5 PUBLISH ``data`` (``encode``'s, without a Topic Alias) with Topic Alias ``alias`` added
    (MQTT 5.0 §3.3.2.3.4), its topic name kept (``named``: the PUBLISH that sets the alias) or left empty (one that
    uses it); every other byte as it was, so one encoding serves subscribers with and without aliases."""
    view = memoryview(data)
    length, at = _read_varint_at(view, 1)
    end = at + length
    name_len = int.from_bytes(view[at:at + 2], "big")
    after_name = at + 2 + name_len
    props_at = after_name + (2 if (view[0] >> 1) & 0x03 else 0)  # a QoS 1 or 2 PUBLISH's packet id first
    props_len, props_body = _read_varint_at(view, props_at)
    props = b"\x23" + alias.to_bytes(2, "big") + view[props_body:props_body + props_len]
    body = b"".join((view[at:after_name] if named else b"\x00\x00", view[after_name:props_at],
                     encode_varint(len(props)), props, view[props_body + props_len:end]))
    return bytes(view[:1]) + encode_varint(len(body)) + body


def _encode_reason_tail(code, props, kind, short):
    """MQTT 5's optional reason code and properties: left out when the code is 0 and there are no properties."""
    if not props:
        return b"" if code == SUCCESS and short else bytes((code,))
    return bytes((code,)) + _encode_properties(props, kind)


def encode_pubacks_py(packet_ids):
    """The successful PUBACKs of ``packet_ids`` (a sequence of 1..65535), in order, as one byte string: each as
    ``encode`` writes it in either version (MQTT 5 leaves out a success reason code without properties); an id
    outside 0..65535 is refused with ``ValueError``. ``metaq.native._bytes``'s ``mqtt_pubacks`` is this function in
    C."""
    if packet_ids and not (0 <= min(packet_ids) and max(packet_ids) <= 0xFFFF):  # never a PUBACK with a wrong length
        raise ValueError("a packet identifier is not 0..65535")
    return struct.pack(">%dI" % len(packet_ids), *[0x40020000 | i for i in packet_ids])


encode_pubacks = load("mqtt_pubacks", encode_pubacks_py)


def _encode_subscribe(packet, v5):
    """A SUBSCRIBE: its packet id, properties (MQTT 5) and each filter with its options byte."""
    body = _packet_id(packet.packet_id) + (_encode_properties(packet.properties, SUBSCRIBE) if v5 else b"")
    for s in packet.subscriptions:
        options = s.qos
        if v5:
            options |= (0x04 if s.no_local else 0) | (0x08 if s.retain_as_published else 0)
            options |= s.retain_handling << 4
        body += _string(s.topic_filter) + bytes((options,))
    return _packet(SUBSCRIBE, 0b0010, body)


def _encode_unsuback(packet, v5):
    """An UNSUBACK: its packet id, then (MQTT 5 only) its properties and a reason code per filter."""
    body = _packet_id(packet.packet_id)
    if v5:
        body += _encode_properties(packet.properties, UNSUBACK) + bytes(packet.reason_codes)
    return _packet(UNSUBACK, 0, body)


def encode(packet, version):
    """``packet`` as bytes in protocol ``version`` (a CONNECT is written in its own version)."""
    if isinstance(packet, Connect):
        return _encode_connect(packet)
    if version not in VERSIONS:
        raise ValueError("unsupported MQTT protocol level %r" % (version,))
    v5 = version == MQTT_5
    if isinstance(packet, Publish):
        return _encode_publish(packet, v5)
    ptype = _ACK_TYPES.get(type(packet))
    if ptype is not None:
        tail = _encode_reason_tail(packet.reason_code, packet.properties, ptype, True) if v5 else b""
        return _packet(ptype, _FIXED_FLAGS[ptype], _packet_id(packet.packet_id) + tail)
    if isinstance(packet, Connack):
        body = bytes((1 if packet.session_present else 0, packet.reason_code))
        return _packet(CONNACK, 0, body + (_encode_properties(packet.properties, CONNACK) if v5 else b""))
    if isinstance(packet, Subscribe):
        return _encode_subscribe(packet, v5)
    if isinstance(packet, Suback):
        body = _packet_id(packet.packet_id) + (_encode_properties(packet.properties, SUBACK) if v5 else b"")
        return _packet(SUBACK, 0, body + bytes(packet.reason_codes))
    if isinstance(packet, Unsubscribe):
        body = _packet_id(packet.packet_id) + (_encode_properties(packet.properties, UNSUBSCRIBE) if v5 else b"")
        return _packet(UNSUBSCRIBE, 0b0010, body + b"".join(_string(f) for f in packet.topic_filters))
    if isinstance(packet, Unsuback):
        return _encode_unsuback(packet, v5)
    if isinstance(packet, PingReq):
        return _packet(PINGREQ, 0, b"")
    if isinstance(packet, PingResp):
        return _packet(PINGRESP, 0, b"")
    if isinstance(packet, Disconnect):
        return _packet(DISCONNECT, 0, _encode_reason_tail(packet.reason_code, packet.properties, DISCONNECT, True)
                       if v5 else b"")
    if isinstance(packet, Auth):
        if not v5:
            raise ValueError("AUTH is MQTT 5 only")
        return _packet(AUTH, 0, _encode_reason_tail(packet.reason_code, packet.properties, AUTH, True))
    raise TypeError("not an MQTT packet: %r" % (packet,))
