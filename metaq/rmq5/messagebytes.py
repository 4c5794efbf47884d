"""A stored message's ``apache.rocketmq.v2.Message`` as protobuf bytes, written in one pass, sans-IO.

What a client is given of a stored message (``mapping.message_of_record``'s ``StoredMessage``) is decided here
(``message_fields``), as the proxy's converter fills it (reference 4.3): its topic, the user's properties, the system
ones (tag, keys, id, the body's MD5 digest the clients check, type, times, hosts, queue and offset) and the body; a
received message adds its receipt handle, delivery attempt and invisible duration (``Served``). The fields are
written by ``encode_fields`` (the C helper's, or its twin here) as protobuf's encoder writes them: in field order,
a plain proto3 scalar at its default left out, an ``optional`` one written whenever it is set. A served message
so costs no protobuf object filled field by field and then serialized; ``calls.message_of`` parses these bytes back
where a ``Message`` object is wanted. A log record a RocketMQ or gRPC producer wrote is written out in one pass over
its properties (``served_record``, the C helper's or its twin here), without the ``StoredMessage`` between; any
other record is mapped first.

The body's digest is MD5, as the proxy sends it: the clients read CRC32's text differently (eight hex digits, hex
without leading zeros, decimal), so no CRC32 text is accepted by all of them.

A timestamp outside protobuf's range (years 1-9999) raises ValueError, as ``Timestamp.FromMilliseconds`` does.
"""

import functools
import hashlib
from typing import NamedTuple

from metaq import errors, speedups
from metaq.protocol.properties import (
    NAME_VALUE_SEPARATOR,
    PROP_KEYS,
    PROP_SYSFLAG,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    PROPERTY_SEPARATOR,
    shown_tags,
)
from metaq.protocol.rocketmq.mapping import PROP_BORNHOST, UNTRIMMED_CHARS, born_host_of, message_of_record
from metaq.rmq5.records import (
    DELAY,
    FIFO,
    MAX_USER_PROPERTIES,
    NORMAL,
    PROP_DELIVER_MS,
    PROP_SHARDING_KEY,
    RESERVED_PROPERTIES,
)
from metaq.loop.inflate import inflate_body

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
                   props.get(PROP_UNIQ_KEY) or _message_id(msg_id), props.get(PROP_SHARDING_KEY),
                   props.get(PROP_DELIVER_MS), msg.born_timestamp, _host(msg.born_host), msg.store_timestamp,
                   _host(endpoint), user, body, served)


def _layout(topic, queue_id, queue_offset, tag, keys, message_id, group, deliver, born_ms, born_host, store_ms,
            store_host, user, body, served):
    """The ``Message`` fields of a message's parts (the properties' values, None when absent; the hosts as
    ``ip:port``; ``user`` its user properties' ``(key, value)`` pairs), as the proxy's converter fills them."""
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
    system += (3, message_id, 4, (1, MD5, 2, _digest(body)),
               5, IDENTITY, 6, kind, 7, _timestamp(born_ms), 8, born_host,
               9, _timestamp(store_ms), 10, store_host, 11, delivery, 12, handle,
               13, queue_id or None, 14, queue_offset, 15, invisible, 16, attempt, 17, group)
    out = [1, (2, topic)]
    for k, v in user:
        out += (2, (1, k, 2, v))
    out += (3, system, 4, body or None)
    return out


def _message_id(msg_id):
    """The message id of a message whose client gave none: its metaq id in hex."""
    return "%X" % msg_id


def _digest(body):
    """The body's digest as the proxy sends it: MD5, in upper-case hex (see the module doc)."""
    return hashlib.md5(body).hexdigest().upper()


def _born_text(text):
    """``ip:port`` of a ``@BORNHOST`` text, or None when it is not a producer's address."""
    host = born_host_of(text)
    return None if host is None else _host(host)


def _in_range(ms):
    return _TS_MIN_S <= ms // 1000 <= _TS_MAX_S


#: The most ``@BORNHOST`` texts whose ``ip:port`` ``served_record`` is given (``_BORN_HOSTS``; when full it is
#: emptied and refilled as records name them), and the longest such text in characters (an IPv6 address in brackets
#: and a port take 53; a longer, forged one is left to the general mapping, never kept).
BORN_HOSTS_KEPT = 1024
BORN_HOST_CHARS = 64

#: Each ``@BORNHOST`` text seen (at most ``BORN_HOST_CHARS``) to its ``ip:port``, or None when it is not a
#: producer's address (``_born_text``); ``learn_born_host`` fills it.
_BORN_HOSTS = {}
_NOT_KNOWN = object()

#: What ``served_record`` is given besides a record: the property names it looks for (as bytes, in the C helper's
#: order), the most characters of properties served untrimmed, the most user properties it sorts out itself (the
#: proxy's bound), the names no user property may take, the born hosts known and the longest born host text.
_CONTEXT = (tuple(name.encode() for name in (PROP_UNIQ_KEY, PROP_KEYS, PROP_TAGS, PROP_SHARDING_KEY, PROP_DELIVER_MS,
                                             PROP_BORNHOST, PROP_SYSFLAG)),
            UNTRIMMED_CHARS, MAX_USER_PROPERTIES, RESERVED_PROPERTIES, _BORN_HOSTS, BORN_HOST_CHARS)


def learn_born_host(text):
    """Keep the ``ip:port`` of the ``@BORNHOST`` text ``served_record`` answered (a text it was not given yet)
    among the born hosts it is given, at most ``BORN_HOSTS_KEPT`` of them."""
    if len(_BORN_HOSTS) >= BORN_HOSTS_KEPT:
        _BORN_HOSTS.clear()
    _BORN_HOSTS[text] = _born_text(text)
_INT64 = range(-2 ** 63, 2 ** 63)


def served_record_py(data, flag, topic, queue_id, queue_offset, born_ms, store_ms, msg_id, endpoint, served, context):
    """A received or pulled message's response bytes (``response_bytes``') written straight from a log record a
    RocketMQ or gRPC producer wrote, in one pass over its properties, each read into its field: the record's
    ``data`` and ``flag``, its topic, queue, offset, times and metaq id (the message id when the record has no
    ``UNIQ_KEY``, in hex as ``_message_id`` writes it); ``endpoint`` the store host's ``ip:port``;
    ``served`` a receive's ``Served`` or None; ``context`` the module's ``_CONTEXT``, whose hosts give a
    ``@BORNHOST`` text's ``ip:port`` (None: the endpoint serves). The ``@BORNHOST`` text itself (a str) when the
    hosts do not hold it: the caller learns it (``learn_born_host``) and asks again. None for any other record,
    which the general mapping serves: no attribute block or a malformed one, attribute bytes not UTF-8, no property
    part (a text put's), properties that could be trimmed (more than ``UNTRIMMED_CHARS`` characters with the tags'
    key), ``@SYSFLAG`` (a body to inflate), more user properties than the context's bound, a delivery time (without
    a message group) not in ASCII or past 18 digits, a timestamp outside protobuf's range, a ``@BORNHOST`` text past
    the context's longest, an int past 64 bits. ``metaq._bytes.served_record`` is this function in C (built with
    OpenSSL's libcrypto, its MD5; where that has none, it leaves every record to the general mapping)."""
    _names, room, user_max, reserved, hosts, born_max = context
    ints = (flag, queue_id, queue_offset, born_ms, store_ms) if served is None else \
        (flag, served.queue_id, served.queue_offset, born_ms, store_ms, served.attempt, served.invisible_ms)
    if not all(v in _INT64 for v in ints) or not flag & 1 or len(data) < 4:
        return None
    size = int.from_bytes(data[:4], "big", signed=True)
    if size < 0 or size > len(data) - 4 or size + 6 > room:
        return None
    try:
        attribute = bytes(data[4:4 + size]).decode("utf-8")
    except UnicodeDecodeError:
        return None
    tags, sep, rest = attribute.partition(PROPERTY_SEPARATOR)
    read = _read_properties(rest, reserved, user_max) if sep else None
    if read is None:
        return None
    tag, keys, uniq, group, deliver, born, user = read
    if not group and deliver and (not deliver.isascii() or deliver.isdigit() and (
            len(deliver) > 18 or not _in_range(int(deliver)))):
        return None
    if not (_in_range(born_ms) and _in_range(store_ms)):
        return None
    if born and len(born) > born_max:
        return None
    shown = shown_tags(tags or None)
    message_id = uniq or _message_id(msg_id)
    host = None
    if born:
        host = hosts.get(born, _NOT_KNOWN)
        if host is _NOT_KNOWN:
            return born
        if host is not None and not isinstance(host, str):
            raise TypeError("a host is text")
    return encode_fields((2, _layout(topic, queue_id, queue_offset, tag if shown is None else shown, keys,
                                     message_id, group, deliver, born_ms, host or endpoint, store_ms,
                                     endpoint, user.items(), bytes(data[4 + size:]), served)))


def _read_properties(rest, reserved, user_max):
    """``served_record_py``'s pass over the properties ``rest`` (``decode_properties``' reading: a repeated key's
    last value wins, in its first place): ``(tag, keys, message id, group, delivery time, born host, user
    properties)``, None absent; None for ``@SYSFLAG`` or more than ``user_max`` user properties."""
    tag = keys = uniq = group = deliver = born = None
    user = {}
    for item in rest.split(PROPERTY_SEPARATOR):
        key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if not (sep and key and value):
            continue
        if key in reserved:
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
            if key not in user and len(user) == user_max:
                return None
            user[key] = value
    return tag, keys, uniq, group, deliver, born, user


served_record = speedups.load("served_record", served_record_py)


def message_bytes(msg, endpoint, max_transfer, msg_id, served=None):
    """The ``Message`` bytes of ``message_fields``."""
    return encode_fields(message_fields(msg, endpoint, max_transfer, msg_id, served))


def response_bytes(msg, endpoint, max_transfer, msg_id, served=None):
    """A ReceiveMessageResponse's or PullMessageResponse's bytes holding the message (their ``message``, field 2
    of their oneof), written in the same pass."""
    return encode_fields((2, message_fields(msg, endpoint, max_transfer, msg_id, served)))


def served_bytes(rec, host, served):
    """``served_record`` of the log record ``rec`` (``host``: the store host's ``ip:port``): its bytes, or None for
    the general mapping; a born host it did not know is learned and it is asked again."""
    out = served_record(rec.data, rec.flag, rec.topic, rec.partition, rec.queue_offset, rec.born_ts_ms, rec.store_ts_ms,
                        rec.msg_id, host, served, _CONTEXT)
    if out.__class__ is str:
        learn_born_host(out)
        out = served_record(rec.data, rec.flag, rec.topic, rec.partition, rec.queue_offset, rec.born_ts_ms,
                            rec.store_ts_ms, rec.msg_id, host, served, _CONTEXT)
    return out


def record_response_bytes(rec, endpoint, max_transfer, served=None):
    """``response_bytes`` of the log record ``rec`` as the general mapping serves it
    (``message_of_record``, then ``message_fields``), written in one pass by ``served_record`` when it takes it."""
    out = served_bytes(rec, _host(endpoint), served)
    if out is None:
        out = response_bytes(message_of_record(rec, endpoint), endpoint, max_transfer, rec.msg_id, served)
    return out


#: ``Served`` made from a tuple of its fields without namedtuple's ``__new__`` (a Python frame a message).
_served_of = functools.partial(tuple.__new__, Served)


def received_response_bytes(received, endpoint, max_transfer, invisible_ms):
    """``record_response_bytes`` of each message of a receive (``received``: ``PopService``'s ``Received``, whose
    ``record`` is the log record), served with its receipt handle, attempt and ``invisible_ms``: the one list a
    ReceiveMessage's answer is made of, written in one loop (the store host's text made once)."""
    host, out = _host(endpoint), []
    for r in received:
        rec = r.record
        served = _served_of((r.topic, r.partition, r.offset, r.handle, r.attempt, invisible_ms))
        data = served_record(rec.data, rec.flag, rec.topic, rec.partition, rec.queue_offset, rec.born_ts_ms,
                             rec.store_ts_ms, rec.msg_id, host, served, _CONTEXT)
        if data.__class__ is str:  # a born host not known yet
            data = served_bytes(rec, host, served)
        if data is None:
            data = response_bytes(message_of_record(rec, endpoint), endpoint, max_transfer, rec.msg_id, served)
        out.append(data)
    return out
