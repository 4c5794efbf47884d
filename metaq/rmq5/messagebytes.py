"""A stored message's ``apache.rocketmq.v2.Message`` as protobuf bytes, written in one pass, sans-IO.

What a client is given of a stored message (``mapping.message_of_record``'s ``StoredMessage``) is decided here
(``message_fields``), as the proxy's converter fills it (reference 4.3): its topic, the user's properties, the system
ones (tag, keys, id, the body's MD5 digest the clients check, type, times, hosts, queue and offset) and the body; a
received message adds its receipt handle, delivery attempt and invisible duration (``Served``). The fields are
written by ``encode_fields`` (the C helper's, or its twin here) as protobuf's encoder writes them: in field order,
a plain proto3 scalar at its default left out, an ``optional`` one written whenever it is set. A served message
so costs no protobuf object filled field by field and then serialized; ``calls.message_of`` parses these bytes back
where a ``Message`` object is wanted. A log record a RocketMQ or gRPC producer wrote is read into these fields in one
pass over its properties (``record_fields``), without the ``StoredMessage`` between; any other record is mapped first.

The body's digest is MD5, as the proxy sends it: the clients read CRC32's text differently (eight hex digits, hex
without leading zeros, decimal), so no CRC32 text is accepted by all of them.

A timestamp outside protobuf's range (years 1-9999) raises ValueError, as ``Timestamp.FromMilliseconds`` does.
"""

import functools
import hashlib
from typing import NamedTuple

from metaq import errors, speedups
from metaq.protocol.message import decode_payload
from metaq.protocol.properties import (
    NAME_VALUE_SEPARATOR,
    PROP_KEYS,
    PROP_SYSFLAG,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    PROPERTY_SEPARATOR,
    shown_tags,
)
from metaq.protocol.rocketmq.mapping import PROP_BORNHOST, born_host_of, fits_untrimmed, message_of_record
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
    user = [(k, v) for k, v in props.items() if k not in RESERVED_PROPERTIES and not k.startswith(("@", "__"))]
    return _layout(msg.topic, msg.queue_id, msg.queue_offset, props.get(PROP_TAGS), props.get(PROP_KEYS),
                   props.get(PROP_UNIQ_KEY), props.get(PROP_SHARDING_KEY), props.get(PROP_DELIVER_MS),
                   msg.born_timestamp, msg.born_host, msg.store_timestamp, user, body, endpoint, msg_id, served)


def record_fields(rec, endpoint, max_transfer, served=None):
    """``message_fields(message_of_record(rec, endpoint), endpoint, max_transfer, rec.msg_id, served)`` of the log
    record ``rec``, the same fields, read in one pass over the record's properties when a RocketMQ or gRPC producer
    wrote it: each property goes straight to its field, with no dict of them and no ``StoredMessage`` between.
    Any other record goes that general way: a text put's (no property part), one with ``@SYSFLAG`` (its body may
    need inflating), one whose properties could be trimmed (``mapping.fits_untrimmed``), a malformed one."""
    try:
        attribute, body = decode_payload(rec.flag, rec.data)
    except errors.RemoteProtocolError:
        attribute = None
    if attribute is not None and fits_untrimmed(len(attribute) + len(PROP_TAGS) + 2):  # + the shown tags' key
        tags, sep, rest = attribute.partition(PROPERTY_SEPARATOR)
        if sep:
            fields = _property_fields(rec, tags, rest, body, endpoint, served)
            if fields is not None:
                return fields
    return message_fields(message_of_record(rec, endpoint), endpoint, max_transfer, rec.msg_id, served)


def _property_fields(rec, tags, rest, body, endpoint, served):
    """``record_fields``' one pass over the properties ``rest`` (``key\x01value`` items, ``decode_properties``'
    reading: the last of a repeated key wins, in its first place); None for a record with ``@SYSFLAG``."""
    tag = keys = uniq = group = deliver = born = None
    user = {}
    for item in rest.split(PROPERTY_SEPARATOR):
        key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not (sep and key and value):
            continue
        if key in RESERVED_PROPERTIES:
            if key == PROP_UNIQ_KEY:
                uniq = value
            elif key == PROP_KEYS:
                keys = value
            elif key == PROP_TAGS:
                tag = value
            elif key == PROP_SHARDING_KEY:
                group = value
            elif key == PROP_DELIVER_MS:
                deliver = value
        elif key.startswith("@"):
            if key == PROP_BORNHOST:
                born = value
            elif key == PROP_SYSFLAG:
                return None
        elif not key.startswith("__"):
            user[key] = value
    shown = shown_tags(tags or None)
    return _layout(rec.topic, rec.partition, rec.queue_offset, tag if shown is None else shown, keys, uniq, group,
                   deliver, rec.born_ts_ms, born_host_of(born) or endpoint, rec.store_ts_ms, user.items(), body,
                   endpoint, rec.msg_id, served)


def _layout(topic, queue_id, queue_offset, tag, keys, uniq, group, deliver, born_ms, born_host, store_ms, user, body,
            endpoint, msg_id, served):
    """The ``Message`` fields of a message's parts (the properties' values, None when absent; ``user`` its user
    properties' ``(key, value)`` pairs), as the proxy's converter fills them."""
    group = group or None
    delivery = None
    if group:
        kind = FIFO
    elif deliver and deliver.isdigit():
        kind, delivery = DELAY, _timestamp(int(deliver))
    else:
        kind = NORMAL
    if served is None:
        handle, invisible, attempt = None, None, None
    else:
        topic, queue_id, queue_offset, handle, invisible, attempt = served.topic, served.queue_id, \
            served.queue_offset, served.receipt_handle, _duration(served.invisible_ms), served.attempt
    system = [1, tag or None]
    if keys:
        for k in keys.split(" "):
            if k:
                system += (2, k)
    system += (3, uniq or "%X" % msg_id,
               4, (1, MD5, 2, hashlib.md5(body).hexdigest().upper()),
               5, IDENTITY, 6, kind, 7, _timestamp(born_ms), 8, _host(born_host),
               9, _timestamp(store_ms), 10, _host(endpoint), 11, delivery, 12, handle,
               13, queue_id or None, 14, queue_offset, 15, invisible, 16, attempt, 17, group)
    out = [1, (2, topic)]
    for k, v in user:
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


def record_response_bytes(rec, endpoint, max_transfer, served=None):
    """``response_bytes`` of the log record ``rec`` (``record_fields``)."""
    return encode_fields((2, record_fields(rec, endpoint, max_transfer, served)))
