"""One store, two protocols: how a RocketMQ message lives in a MetaQ record, and back (sans-IO).

A record keeps MetaQ's form, ``flag`` + ``data`` (attribute block + payload),
so a text ``get`` of a message sent over remoting still sees the user's body as
the payload and the tags at the start of the attribute. The rest of the
RocketMQ message travels in the attribute after a ``\\x02``::

    attribute = TAGS "\\x02" key "\\x01" value "\\x02" key "\\x01" value "\\x02" ...

* ``TAGS`` (possibly empty) comes first; the ``\\x02`` marks a record sent over
  remoting and is always written, even when no property follows.
* The properties are RocketMQ's own encoding (``KEYS``, ``UNIQ_KEY``,
  ``RETRY_TOPIC``, user properties ...) minus ``TAGS`` and ``DELAY`` (a delay
  is served by the scheduler, as RocketMQ clears it when the message is due).
* Fields of a RocketMQ message that a MetaQ record has no place for are
  internal properties, written only when not zero and never shown to
  consumers: ``@FLAG`` (the RocketMQ user flag), ``@SYSFLAG`` (compression
  bits) and ``@RECONSUME`` (reconsume times).
* The MetaQ flag of such a record is 1 (attribute present).

The metaq client (``metaq.client.Message``) shows the part before the
``\\x02`` as ``attribute`` and the rest as ``properties``.

The other way, a record put over text becomes a RocketMQ message whose body is
the payload, whose ``TAGS`` property is the attribute (when it has one) and
whose FLAG is the MetaQ flag. The queue id is the partition, the queue offset
our offset, the physical offset the record's commit-log position (it is in the
offset message id), and the born and store times are the record's.
"""

from metaq.errors import RemoteProtocolError
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.tags import parse_tag_expression
from metaq.protocol.rocketmq.bodies import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    SYSFLAG_COMPRESSED,
    SYSFLAG_MULTI_TAGS,
    StoredMessage,
    create_offset_msg_id,
    decode_properties,
    encode_properties,
    encode_stored_message,
)

__all__ = [
    "PROP_TAGS",
    "PROP_KEYS",
    "PROP_DELAY",
    "PROP_UNIQ_KEY",
    "PROP_RETRY_TOPIC",
    "PROP_ORIGIN_MESSAGE_ID",
    "PROP_TRAN_MSG",
    "PROP_REAL_TOPIC",
    "PROP_REAL_QID",
    "KEPT_SYSFLAG_BITS",
    "encode_attribute",
    "split_attribute",
    "record_data_from_send",
    "message_of_record",
    "stored_message_bytes",
    "parse_subscription",
    "retry_copy",
]

PROP_TAGS = "TAGS"
PROP_KEYS = "KEYS"
PROP_DELAY = "DELAY"
PROP_UNIQ_KEY = "UNIQ_KEY"
PROP_RETRY_TOPIC = "RETRY_TOPIC"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_TRAN_MSG = "TRAN_MSG"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QID = "REAL_QID"

_FLAG = "@FLAG"
_SYSFLAG = "@SYSFLAG"
_RECONSUME = "@RECONSUME"
_INTERNAL = (_FLAG, _SYSFLAG, _RECONSUME)

#: sysFlag bits a stored message keeps: compressed, multi-tags, compression type (bits 8-10).
#: Transaction bits are not kept (a stored message is a committed one); host-family bits are recomputed.
KEPT_SYSFLAG_BITS = SYSFLAG_COMPRESSED | SYSFLAG_MULTI_TAGS | (7 << 8)


def encode_attribute(tags, properties):
    """The attribute string of a remoting message: tags, ``\\x02``, then the encoded properties."""
    return (tags or "") + PROPERTY_SEPARATOR + encode_properties(properties)


def split_attribute(attribute):
    """``(tags, properties, from_remoting)`` of an attribute string.

    Without a ``\\x02`` the attribute is a plain MetaQ attribute: ``(attribute, {}, False)``.
    With one: the tags before it (None when empty) and the properties after it.
    """
    if attribute is None:
        return None, {}, False
    tags, sep, rest = attribute.partition(PROPERTY_SEPARATOR)
    if not sep:
        return attribute, {}, False
    return (tags or None), decode_properties(rest), True


def _int_prop(props, key):
    text = props.pop(key, None)
    try:
        return int(text) if text is not None else 0
    except ValueError:
        return 0


def record_data_from_send(body, properties, flag=0, sys_flag=0, reconsume_times=0):
    """``(metaq_flag, data)`` of a message sent over remoting.

    ``properties`` is a dict (TAGS and DELAY are taken out of a copy).
    RemoteProtocolError when a property cannot be stored (a separator in it).
    """
    props = {k: v for k, v in properties.items() if not k.startswith("@")}
    tags = props.pop(PROP_TAGS, None)
    props.pop(PROP_DELAY, None)
    if tags is not None and PROPERTY_SEPARATOR in tags:
        raise RemoteProtocolError("tags %r hold the separator \\x02" % tags[:64])
    if flag:
        props[_FLAG] = str(flag)
    if sys_flag & KEPT_SYSFLAG_BITS:
        props[_SYSFLAG] = str(sys_flag & KEPT_SYSFLAG_BITS)
    if reconsume_times:
        props[_RECONSUME] = str(reconsume_times)
    try:
        attribute = encode_attribute(tags, props)
    except ValueError as exc:
        raise RemoteProtocolError(str(exc)) from None
    return encode_payload(body, attribute)


def _clean_tags(text):
    if not text or NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        return None
    return text


def message_of_record(rec, store_host):
    """The ``StoredMessage`` a RocketMQ consumer gets for a ``LogRecord`` (``rec.position`` = physical offset)."""
    try:
        attribute, body = decode_payload(rec.flag, rec.data)
    except RemoteProtocolError:  # a malformed attribute block: hand over the raw data
        attribute, body = None, rec.data
    tags, props, from_remoting = split_attribute(attribute)
    if from_remoting:
        flag = _int_prop(props, _FLAG)
        sys_flag = _int_prop(props, _SYSFLAG) & KEPT_SYSFLAG_BITS
        reconsume = _int_prop(props, _RECONSUME)
    else:
        flag, sys_flag, reconsume = rec.flag, 0, 0
    tags = _clean_tags(tags)
    if tags is not None:
        props[PROP_TAGS] = tags
    return StoredMessage(rec.topic, rec.partition, rec.queue_offset, rec.position, body, flag, sys_flag,
                         rec.born_ts_ms, store_host, rec.store_ts_ms, store_host, reconsume, 0, props)


def stored_message_bytes(msg):
    """The record bytes of a ``StoredMessage`` for a pull body."""
    return encode_stored_message(msg)


def parse_subscription(expression):
    """The ``protocol.tags.TagFilter`` of a ``TAG`` subscription (``"A || B"``), or None for every message (``*`` or
    empty); ClientError for an expression too long or naming a tag no record can carry."""
    return parse_tag_expression(expression)


def retry_copy(msg, store_host, max_reconsume_times):
    """What CONSUMER_SEND_MSG_BACK re-stores for the ``StoredMessage`` ``msg``.

    Returns ``(dead, properties, reconsume_times)``: ``dead`` when the copy
    goes to the dead-letter topic (the message was already consumed
    ``max_reconsume_times`` times); the properties get ``RETRY_TOPIC`` (the
    original topic, if not set yet) and ``ORIGIN_MESSAGE_ID`` (the client id,
    else the offset id, if not set yet); reconsume times grows by one.
    """
    props = dict(msg.properties)
    props.setdefault(PROP_RETRY_TOPIC, msg.topic)
    origin = props.get(PROP_UNIQ_KEY) or create_offset_msg_id(store_host[0], store_host[1], msg.physical_offset)
    props.setdefault(PROP_ORIGIN_MESSAGE_ID, origin)
    dead = msg.reconsume_times >= max_reconsume_times
    return dead, props, msg.reconsume_times + 1
