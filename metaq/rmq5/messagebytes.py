"""A stored message's ``apache.rocketmq.v2.Message`` as protobuf bytes, written in one pass, sans-IO.

What a client is given of a stored message (``mapping.message_of_record``'s ``StoredMessage``) is decided here
(``message_fields``), as the proxy's converter fills it (reference 4.3): its topic, the user's properties, the system
ones (tag, keys, id, the body's MD5 digest the clients check, type, times, hosts, queue and offset) and the body; a
received message adds its receipt handle, delivery attempt and invisible duration (``Served``). The fields are
written by ``encode_fields`` (the C helper's, or its twin here) as protobuf's encoder writes them: in field order,
a plain proto3 scalar at its default left out, an ``optional`` one written whenever it is set. A served message
so costs no protobuf object filled field by field and then serialized; ``calls.message_of`` parses these bytes back
where a ``Message`` object is wanted.

A timestamp outside protobuf's range (years 1-9999) raises ValueError, as ``Timestamp.FromMilliseconds`` does.
"""

import functools
import hashlib
from typing import NamedTuple

from metaq import errors, speedups
from metaq.protocol.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY
from metaq.rmq5.records import DELAY, FIFO, NORMAL, PROP_DELIVER_MS, PROP_SHARDING_KEY, RESERVED_PROPERTIES
from metaq.server.inflate import inflate_body

#: protobuf's Timestamp range, in seconds (0001-01-01 .. 9999-12-31T23:59:59).
_TS_MIN_S, _TS_MAX_S = -62135596800, 253402300799
#: apache.rocketmq.v2's DigestType MD5 and Encoding IDENTITY.
MD5, IDENTITY = 2, 1
#: Nested messages ``encode_fields`` takes at most (a served message is three deep).
MAX_DEPTH = 16

_BYTE = [bytes((i,)) for i in range(128)]


def varint(n):
    """protobuf's base-128 varint of ``n`` (a negative one as its 64-bit two's complement: ten bytes)."""
    if 0 <= n < 0x80:
        return _BYTE[n]
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_fields_py(fields):
    """Protobuf bytes of ``fields`` (a tuple or list): field numbers and values, one after the other, each value
    written by its type: an int as a varint (wire type 0), bytes as bytes, a str as its UTF-8, a tuple or list as a
    nested message of the same form (length-delimited); None is left out. The C helper's ``encode_fields`` is its
    twin."""
    if not isinstance(fields, (tuple, list)):
        raise TypeError("encode_fields takes a tuple or list")
    return _fields(fields, 0)


def _fields(fields, depth):
    if depth > MAX_DEPTH:
        raise ValueError("fields nested too deep")
    if len(fields) % 2:
        raise ValueError("fields: field numbers and values, one after the other")
    out = []
    for i in range(0, len(fields), 2):
        number, value = fields[i], fields[i + 1]
        if value is None:
            continue
        if type(number) is not int:
            raise TypeError("a field number is an int")
        if not 1 <= number <= 536870911:
            raise ValueError("field number %d: 1..2**29-1" % number)
        if isinstance(value, int):
            if not -2 ** 63 <= value < 2 ** 64:
                raise OverflowError("a field's int fits neither int64 nor uint64")
            out += (varint(number << 3), varint(value))
            continue
        if isinstance(value, str):
            data = value.encode("utf-8")
        elif isinstance(value, (tuple, list)):
            data = _fields(value, depth + 1)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        else:
            raise TypeError("a field's value may be an int, bytes, str, a tuple or list, or None, not %s"
                            % type(value).__name__)
        out += (varint(number << 3 | 2), varint(len(data)), data)
    return b"".join(out)


encode_fields = speedups.load("encode_fields", encode_fields_py)


class Served(NamedTuple):
    """What a receive adds to a message: the topic it was received from, its queue and offset, its receipt
    handle, its delivery attempt and the invisible duration (ms)."""

    topic: str
    queue_id: int
    queue_offset: int
    receipt_handle: str
    attempt: int
    invisible_ms: int


def _timestamp(ms):
    """A Timestamp's fields of ``ms`` milliseconds since the epoch, as ``Timestamp.FromMilliseconds`` sets them."""
    seconds, millis = divmod(ms, 1000)
    if not _TS_MIN_S <= seconds <= _TS_MAX_S:
        raise ValueError("Timestamp is not valid: Seconds %d must be in range [%d, %d]." % (seconds, _TS_MIN_S,
                                                                                         _TS_MAX_S))
    return (1, seconds or None, 2, millis * 1_000_000 or None)


def _duration(ms):
    """A non-negative Duration's fields of ``ms`` milliseconds."""
    seconds, millis = divmod(ms, 1000)
    return (1, seconds or None, 2, millis * 1_000_000 or None)


@functools.lru_cache(maxsize=1024)
def _host(host):
    """``ip:port`` of a born or store host (an ``(ip, port)`` tuple, or longer: its first two); cached: a log's
    records name the same few producers' hosts."""
    return "%s:%d" % tuple(host[:2])


def message_fields(msg, endpoint, max_transfer, msg_id, served=None):
    """The ``Message`` fields (``encode_fields``' form) of the ``StoredMessage`` ``msg`` (see the module doc).
    ``endpoint``: the ``(host, port)`` messages name as their store host; ``max_transfer``: the most bytes a
    compressed body is inflated to (past it, or corrupt, the body goes as stored); ``msg_id``: the record's metaq
    id, the message id when the client gave none; ``served``: a receive's ``Served``, or None."""
    props, body = msg.properties, msg.body
    if msg.sys_flag:  # a flag without compression bits is served as stored by inflate_body too
        try:
            body = inflate_body(msg.sys_flag, body, max_transfer)
        except errors.MetaqError:
            pass
    group = props.get(PROP_SHARDING_KEY) or None
    deliver = props.get(PROP_DELIVER_MS, "")
    delivery = None
    if group:
        kind = FIFO
    elif deliver.isdigit():
        kind, delivery = DELAY, _timestamp(int(deliver))
    else:
        kind = NORMAL
    if served is None:
        topic, queue_id, queue_offset, handle, invisible, attempt = msg.topic, msg.queue_id, msg.queue_offset, \
            None, None, None
    else:
        topic, queue_id, queue_offset, handle, invisible, attempt = served.topic, served.queue_id, \
            served.queue_offset, served.receipt_handle, _duration(served.invisible_ms), served.attempt
    system = [1, props.get(PROP_TAGS) or None]
    keys = props.get(PROP_KEYS)
    if keys:
        for k in keys.split(" "):
            if k:
                system += (2, k)
    system += (3, props.get(PROP_UNIQ_KEY) or "%X" % msg_id,
               4, (1, MD5, 2, hashlib.md5(body).hexdigest().upper()),
               5, IDENTITY, 6, kind, 7, _timestamp(msg.born_timestamp), 8, _host(msg.born_host),
               9, _timestamp(msg.store_timestamp), 10, _host(endpoint), 11, delivery, 12, handle,
               13, queue_id or None, 14, queue_offset, 15, invisible, 16, attempt, 17, group)
    out = [1, (2, topic)]
    for k, v in props.items():
        if k not in RESERVED_PROPERTIES and not k.startswith(("@", "__")):
            out += (2, (1, k, 2, v))
    out += (3, system, 4, body or None)
    return out


def message_bytes(msg, endpoint, max_transfer, msg_id, served=None):
    """The ``Message`` bytes of ``message_fields``."""
    return encode_fields(message_fields(msg, endpoint, max_transfer, msg_id, served))


def response_bytes(msg, endpoint, max_transfer, msg_id, served=None):
    """A ReceiveMessageResponse's or PullMessageResponse's bytes holding the message (their ``message``, field 2
    of their oneof), written in the same pass."""
    return encode_fields((2, message_fields(msg, endpoint, max_transfer, msg_id, served)))
