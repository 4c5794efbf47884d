"""One store, two protocols: how a RocketMQ message lives in a MetaQ record, and back (sans-IO).

The record's format is the store's, not RocketMQ's: ``metaq.protocol.properties`` encodes and decodes its
attribute (tags, then ``\\x02`` and the properties), for every front-end. This module holds what is RocketMQ's
in it: its header names, the fields of its messages and their place in a record, its stored-message body. A
record keeps MetaQ's form, ``flag`` + ``data`` (attribute block + payload), so a text ``get`` of a message sent
over remoting still sees the user's body as the payload and the tags at the start of the attribute.

* ``TAGS`` (possibly empty) comes first; the ``\\x02`` marks a record sent with properties and is always written,
  even when no property follows.
* The properties are RocketMQ's own (``KEYS``, ``UNIQ_KEY``,
  ``RETRY_TOPIC``, user properties ...) minus ``TAGS`` and ``DELAY`` (a delay
  is served by the scheduler, as RocketMQ clears it when the message is due).
* Fields of a RocketMQ message that a MetaQ record has no place for are
  internal properties, written only when not zero and never shown to
  consumers: ``@FLAG`` (the RocketMQ user flag), ``@SYSFLAG`` (the multi-tags
  bit), ``@RECONSUME`` (reconsume times) and ``@BORNHOST`` (the producer's
  ``ip:port``, RocketMQ's born host).
* Bodies are stored decompressed (``metaq.protocol.compression``): the sender
  inflates a compressed body before it builds the record, so no stored
  ``@SYSFLAG`` carries a compression bit -- except in records written by a
  metaq older than that rule, which readers decode (``properties.stored_payload``). A
  text ``put`` may carry ``@SYSFLAG`` with compression bits (the metaq
  ``Producer``'s ``compress_over``): the broker inflates it on arrival and
  takes the bits out (``properties.compression_bits``, ``properties.without_compression``).
* The MetaQ flag of such a record is 1 (attribute present).

The metaq client (``metaq.client.Message``) shows the part before the
``\\x02`` as ``attribute`` and the rest as ``properties``.

The other way, a record put over text becomes a RocketMQ message whose body is
the payload, whose ``TAGS`` property is the attribute (when it has one) and
whose FLAG is the MetaQ flag. The queue id is the partition, the queue offset
our offset, the physical offset the record's commit-log position (it is in the
offset message id), and the born and store times are the record's.
"""

import functools
import ipaddress
from typing import NamedTuple

from metaq.errors import RemoteProtocolError
from metaq.server.remoting import limits as remoting_limits
from metaq.protocol.tags import parse_tag_expression
from metaq.protocol.compression import COMPRESSION_BITS
from metaq.protocol.journaltopic import DLQ_PREFIX, RETRY_PREFIX
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.properties import (
    PROP_SYSFLAG,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    PROPERTY_SEPARATOR,
    encode_attribute,
    pop_int,
    shown_tags,
    split_attribute,
)
from metaq.protocol.rocketmq.bodies import (
    MAX_PROPERTIES_BYTES,
    SYSFLAG_COMPRESSED,
    SYSFLAG_MULTI_TAGS,
    SYSFLAG_TRANSACTION_PREPARED,
    StoredMessage,
    create_offset_msg_id,
    encode_stored_message,
)

__all__ = [
    "PROP_DELAY",
    "PROP_RETRY_TOPIC",
    "PROP_ORIGIN_MESSAGE_ID",
    "PROP_TRAN_MSG",
    "PROP_REAL_TOPIC",
    "PROP_REAL_QID",
    "PROP_PRODUCER_GROUP",
    "PROP_CHECK_IMMUNITY",
    "KEPT_SYSFLAG_BITS",
    "STORED_SYSFLAG_BITS",
    "born_host_property",
    "PROP_BORNHOST",
    "UNTRIMMED_CHARS",
    "born_host_of",
    "RecordFields",
    "record_data_from_send",
    "message_of_record",
    "stored_message_bytes",
    "parse_subscription",
    "retry_copy",
    "half_message",
]

PROP_DELAY = "DELAY"
PROP_RETRY_TOPIC = "RETRY_TOPIC"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_TRAN_MSG = "TRAN_MSG"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QID = "REAL_QID"
PROP_PRODUCER_GROUP = "PGROUP"
PROP_CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"

_FLAG = "@FLAG"
_RECONSUME = "@RECONSUME"
#: The broker's own property holding a producer's address (``born_host_property``).
PROP_BORNHOST = "@BORNHOST"

#: sysFlag bits read back from a stored message: multi-tags, and the compression bits that records written
#: before bodies were stored decompressed may hold (their consumers must still decompress them).
#: Transaction bits are not kept (a stored message is a committed one); host-family bits are recomputed.
KEPT_SYSFLAG_BITS = SYSFLAG_COMPRESSED | SYSFLAG_MULTI_TAGS | (7 << 8)
#: sysFlag bits written into a record now: bodies are stored decompressed.
STORED_SYSFLAG_BITS = SYSFLAG_MULTI_TAGS
def born_host_property(host):
    """``{"@BORNHOST": host}`` for a producer's address ``"ip:port"`` (empty when unknown)."""
    if not host:
        return {}
    return {PROP_BORNHOST: host}


def _born_host(props):
    """The ``(ip, port)`` of ``@BORNHOST``, or None unless it is one (a text put may carry any property: a forged
    one must never make a record unencodable, which would stop every pull of its queue there)."""
    return born_host_of(props.pop(PROP_BORNHOST, None))


def born_host_of(text):
    """The ``(ip, port)`` of a ``@BORNHOST`` text, or None when it is empty or not one."""
    if not text:
        return None
    return _host_of(text) if len(text) <= _HOST_TEXT_CACHED else _host_of.__wrapped__(text)


#: The longest ``@BORNHOST`` text whose parse is cached (an IPv6 address in brackets and a port take 53 characters;
#: a longer, forged one is parsed each time, never held).
_HOST_TEXT_CACHED = 64


@functools.lru_cache(maxsize=1024)
def _host_of(text):
    """``_born_host``'s parse of one ``"ip:port"`` text; cached: a log's records name the same few producers'
    hosts."""
    ip, _sep, port = text.rpartition(":")
    try:
        ip, port = str(ipaddress.ip_address(ip.strip("[]"))), int(port)
    except ValueError:
        return None
    return (ip, port) if 0 <= port <= 65535 else None


def record_data_from_send(body, properties, flag=0, sys_flag=0, reconsume_times=0, born_host=None):
    """``(metaq_flag, data)`` of a message sent over remoting (``body`` already decompressed: ValueError when
    ``sys_flag`` still says it is compressed).

    ``properties`` is a dict (TAGS and DELAY are taken out of a copy); ``born_host`` the producer's
    ``"ip:port"``, kept as ``@BORNHOST``. RemoteProtocolError when a property cannot be stored (a separator in it).
    """
    if sys_flag & COMPRESSION_BITS:
        raise ValueError("record_data_from_send takes a decompressed body (sysFlag %d)" % sys_flag)
    props = {k: v for k, v in properties.items() if not k.startswith("@")}
    tags = props.pop(PROP_TAGS, None)
    props.pop(PROP_DELAY, None)
    if tags is not None and PROPERTY_SEPARATOR in tags:
        raise RemoteProtocolError("tags %r hold the separator \\x02" % tags[:64])
    if flag:
        props[_FLAG] = str(flag)
    if sys_flag & STORED_SYSFLAG_BITS:
        props[PROP_SYSFLAG] = str(sys_flag & STORED_SYSFLAG_BITS)
    if reconsume_times:
        props[_RECONSUME] = str(reconsume_times)
    props.update(born_host_property(born_host))
    try:
        attribute = encode_attribute(tags, props)
    except ValueError as exc:
        raise RemoteProtocolError(str(exc)) from None
    size = len(attribute.encode("utf-8", "surrogatepass")) if attribute is not None else 0
    room = MAX_PROPERTIES_BYTES - remoting_limits.PROPERTIES_HEADROOM
    if size > room:
        raise RemoteProtocolError("the message's properties and tags take %d bytes: at most %d may be stored (RocketMQ "
                                  "carries %d, less what the broker adds)" % (size, room, MAX_PROPERTIES_BYTES))
    return encode_payload(body, attribute)


def message_of_record(rec, store_host):
    """The ``StoredMessage`` a RocketMQ consumer gets for a ``LogRecord`` (``rec.position`` = physical offset)."""
    try:
        attribute, body = decode_payload(rec.flag, rec.data)
    except RemoteProtocolError:  # a malformed attribute block: hand over the raw data
        attribute, body = None, rec.data
    tags, props, from_remoting = split_attribute(attribute)
    born = None
    if from_remoting:
        flag = pop_int(props, _FLAG)
        sys_flag = pop_int(props, PROP_SYSFLAG) & KEPT_SYSFLAG_BITS
        reconsume = pop_int(props, _RECONSUME)
        born = _born_host(props)
    else:
        flag, sys_flag, reconsume = rec.flag, 0, 0
    tags = shown_tags(tags)
    if tags is not None:
        props[PROP_TAGS] = tags
    _fit_properties(props)
    return StoredMessage(rec.topic, rec.partition, rec.queue_offset, rec.position, body, flag, sys_flag,
                         rec.born_ts_ms, born or store_host, rec.store_ts_ms, store_host, reconsume, 0, props)


#: The most characters of properties (each key and value, and two separators a property) served whole by
#: ``message_of_record`` without counting their bytes: at most 4 bytes a character.
UNTRIMMED_CHARS = (MAX_PROPERTIES_BYTES - remoting_limits.PROPERTIES_HEADROOM) // 4
#: The property that says how many of a stored message's properties were left out of the served copy.
PROP_TRIMMED = "METAQ_TRIMMED_PROPERTIES"


def _fit_properties(props):
    """Leave out of ``props`` its largest properties (tags included) until they encode within
    ``MAX_PROPERTIES_BYTES - PROPERTIES_HEADROOM``, saying how many in ``PROP_TRIMMED``: a message stored with
    more (a text put's attribute of 40,000 characters) is still served, where its encoding would fail and
    every pull of its queue with it."""
    room = MAX_PROPERTIES_BYTES - remoting_limits.PROPERTIES_HEADROOM
    if sum(len(k) + len(v) + 2 for k, v in props.items() if v is not None) <= UNTRIMMED_CHARS:
        return  # at most 4 bytes a character: they fit, without encoding each one to count its bytes
    sizes = {k: len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) + 2
             for k, v in props.items() if v is not None}
    total = sum(sizes.values())
    if total <= room:
        return
    left_out = 0
    for key in sorted(sizes, key=sizes.get, reverse=True):
        del props[key]
        total -= sizes[key]
        left_out += 1
        if total <= room - 64:  # and room for PROP_TRIMMED itself
            break
    props[PROP_TRIMMED] = str(left_out)


def stored_message_bytes(msg):
    """The record bytes of a ``StoredMessage`` for a pull body."""
    return encode_stored_message(msg)


def parse_subscription(expression):
    """The ``filters.wire.TagFilter`` of a ``TAG`` subscription (``"A || B"``), or None for every message (``*`` or
    empty); ClientError for an expression too long or naming a tag no record can carry."""
    return parse_tag_expression(expression)


def retry_copy(msg, store_host, max_reconsume_times):
    """What CONSUMER_SEND_MSG_BACK re-stores for the ``StoredMessage`` ``msg``.

    Returns ``(dead, properties, reconsume_times)``: ``dead`` when the copy
    goes to the dead-letter topic (the message was already consumed
    ``max_reconsume_times`` times); the properties get ``RETRY_TOPIC`` (the
    original topic: the message's own, unless it is a retry already) and ``ORIGIN_MESSAGE_ID`` (the client id,
    else the offset id, if not set yet); reconsume times grows by one.
    """
    props = dict(msg.properties)
    if msg.topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):  # a retry again: RETRY_TOPIC set here, or checked at its send
        props.setdefault(PROP_RETRY_TOPIC, msg.topic)
    else:  # the topic it was read from, whatever the sender wrote there (dlq resend puts it back to that topic)
        props[PROP_RETRY_TOPIC] = msg.topic
    origin = props.get(PROP_UNIQ_KEY) or create_offset_msg_id(store_host[0], store_host[1], msg.physical_offset)
    props.setdefault(PROP_ORIGIN_MESSAGE_ID, origin)
    dead = msg.reconsume_times >= max_reconsume_times
    return dead, props, msg.reconsume_times + 1


def half_message(topic, queue_id, number, physical_offset, flag, data, stored_ms, store_host, group):
    """The ``StoredMessage`` a CHECK_TRANSACTION_STATE carries for a pending half message: the record its send
    stored (``flag``, ``data``), flagged PREPARED with ``TRAN_MSG`` and ``PGROUP`` (the client finds its
    producer by that group), the half message's number as queue offset and ``physical_offset`` (both come
    back in END_TRANSACTION)."""
    rec = RecordFields(topic, queue_id, number, physical_offset, flag, data, stored_ms, stored_ms)
    msg = message_of_record(rec, store_host)
    props = dict(msg.properties)
    props[PROP_TRAN_MSG] = "true"
    props[PROP_PRODUCER_GROUP] = group
    return msg._replace(sys_flag=msg.sys_flag | SYSFLAG_TRANSACTION_PREPARED, properties=props)


class RecordFields(NamedTuple):
    """The fields of a log record ``message_of_record`` reads: for a message that is not (or not yet) a record
    of the log (a half message's check-back body, a reply on its way)."""

    topic: str
    partition: int
    queue_offset: int
    position: int
    flag: int
    data: bytes
    born_ts_ms: int
    store_ts_ms: int
