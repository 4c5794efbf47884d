"""The stored message format's attribute block: a record's tags, properties and keys, for every protocol (sans-IO).

A record is MetaQ's ``flag`` + ``data``; with flag bit 1 its data starts with an attribute block
(``metaq.protocol.message``: ``encode_payload`` / ``decode_payload``). The attribute is text::

    attribute = TAGS                                          a plain MetaQ attribute (a text put's)
    attribute = TAGS "\\x02" key "\\x01" value "\\x02" ...      tags, then properties

* ``TAGS`` (possibly empty) comes first. A ``\\x02`` after it says properties follow, and is written even when
  none does (a message sent with properties, all of them empty).
* Properties are ``key \\x01 value \\x02`` pairs (``encode_properties``): the same string RocketMQ's wire carries,
  so a RocketMQ front-end passes it through, and every other front-end (MQTT, gRPC, text, HTTP, the client,
  Spark) reads and writes it here. ``KEYS`` holds the message's keys (space-separated; the key index reads it,
  ``metaq.keys``), ``UNIQ_KEY`` its client-side id; a property whose name starts with ``@`` is the broker's
  own, never shown to a consumer.
* ``@SYSFLAG`` holds flag bits of the message a record has no other place for; its compression bits
  (``metaq.protocol.compression``) are taken out on arrival, as bodies are stored decompressed, except in records
  written before that rule, which readers still decompress (``stored_payload``).

Each front-end maps these names to its own (RocketMQ's headers: ``metaq.protocol.rocketmq.mapping``; MQTT's user
properties: ``metaq.mqtt.records``; gRPC's system properties: ``metaq.rmq5.records``). The bytes on disk are those
every earlier version wrote; nothing here changes them.
"""

from metaq.errors import BadCompressedBody, RemoteProtocolError
from metaq import limits
from metaq.protocol.compression import COMPRESSION_BITS, codec_of, inflate

__all__ = [
    "NAME_VALUE_SEPARATOR",
    "PROPERTY_SEPARATOR",
    "PROP_TAGS",
    "PROP_KEYS",
    "PROP_UNIQ_KEY",
    "PROP_SYSFLAG",
    "SYSFLAG_MARK",
    "PID_PROPERTY",
    "SEQ_PROPERTY",
    "PID_MARK",
    "SEQ_MARK",
    "has_identity",
    "encode_properties",
    "decode_properties",
    "encode_attribute",
    "split_attribute",
    "shown_tags",
    "record_properties",
    "pop_int",
    "compression_bits",
    "without_compression",
    "stored_payload",
]

#: Between a property's name and its value.
NAME_VALUE_SEPARATOR = "\x01"
#: After each property, and between the tags and the first property.
PROPERTY_SEPARATOR = "\x02"

#: The name a record's tags take when they are shown as a property (a consumer's view, a SQL92 filter's).
PROP_TAGS = "TAGS"
#: The message's keys, space-separated (what the key index finds a message by).
PROP_KEYS = "KEYS"
#: The message's client-side id.
PROP_UNIQ_KEY = "UNIQ_KEY"
#: The message's flag bits that have no other place in a record (the broker's own: never shown).
PROP_SYSFLAG = "@SYSFLAG"

#: How ``@SYSFLAG`` starts in an attribute (the put-burst scanners leave such puts to the general path, which
#: decompresses a body it marks compressed).
SYSFLAG_MARK = ("%s%s%s" % (PROPERTY_SEPARATOR, PROP_SYSFLAG, NAME_VALUE_SEPARATOR)).encode("ascii")

#: The idempotent producer's identity (``metaq.idempotence.records``): reserved, a plain put's attribute holds
#: neither (the put-burst scanners leave such puts to the general path, which refuses them).
PID_PROPERTY = "METAQ_PID"
SEQ_PROPERTY = "METAQ_SEQ"
#: How each starts in an attribute: every stored idempotent record's attribute holds ``PID_MARK``.
PID_MARK = ("%s%s%s" % (PROPERTY_SEPARATOR, PID_PROPERTY, NAME_VALUE_SEPARATOR)).encode("ascii")
SEQ_MARK = ("%s%s%s" % (PROPERTY_SEPARATOR, SEQ_PROPERTY, NAME_VALUE_SEPARATOR)).encode("ascii")
_PID_TEXT, _SEQ_TEXT = PID_MARK.decode("ascii"), SEQ_MARK.decode("ascii")


def has_identity(attribute):
    """True when an attribute string carries a reserved identity property (a plain put must not)."""
    return attribute is not None and (_PID_TEXT in attribute or _SEQ_TEXT in attribute)


def encode_properties(properties):
    """``{key: value}`` -> ``key\\x01value\\x02...`` (every pair ends with \\x02, like Java and C++).

    ValueError for a key or value that is not text, is empty or holds \\x01 or \\x02: it would not decode back.
    None values are skipped, as Java does.
    """
    parts = []
    for key, value in properties.items():
        if value is None:
            continue
        for text in (key, value):
            if not isinstance(text, str):
                raise ValueError("property %r=%r: keys and values must be text" % (key, value))
            if not text or NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
                raise ValueError("property %r=%r cannot be encoded (empty, or holds \\x01/\\x02)" % (key, value))
        parts.append("%s\x01%s\x02" % (key, value))
    return "".join(parts)


def decode_properties(text):
    """``key\\x01value\\x02...`` -> dict, as Java's ``string2messageProperties`` reads it.

    Items are split on \\x02, then at their first \\x01; an item without one,
    or with an empty key or value, is skipped. The last item may lack its \\x02.
    """
    result = {}
    if not text:
        return result
    for item in text.split(PROPERTY_SEPARATOR):
        key, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and key and value:
            result[key] = value
    return result


def encode_attribute(tags, properties):
    """The attribute of a message with ``tags`` (None or text without \\x02) and ``properties``: tags, ``\\x02``,
    then the encoded properties. ValueError for tags holding \\x02 or a property ``encode_properties`` refuses."""
    if tags is not None and PROPERTY_SEPARATOR in tags:
        raise ValueError("tags %r hold the separator \\x02" % tags[:64])
    return (tags or "") + PROPERTY_SEPARATOR + encode_properties(properties)


def split_attribute(attribute):
    """``(tags, properties, with_properties)`` of an attribute (text or None).

    Without a ``\\x02`` the attribute is a plain MetaQ attribute: ``(attribute, {}, False)``. With one: the tags
    before it (None when empty) and the properties after it. TypeError for an attribute that is not text.
    """
    if attribute is None:
        return None, {}, False
    if not isinstance(attribute, str):
        raise TypeError("an attribute is text (decode_payload's), not %s" % type(attribute).__name__)
    tags, sep, rest = attribute.partition(PROPERTY_SEPARATOR)
    if not sep:
        return attribute, {}, False
    return (tags or None), decode_properties(rest), True


def shown_tags(text):
    """The tags a consumer is shown for a record's ``text`` before the first ``\\x02``: None when there are none,
    or when they hold a separator (a text put's attribute may be anything)."""
    if not text or NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        return None
    return text


def record_properties(attribute):
    """The properties a consumer sees for a record whose attribute is ``attribute`` (text or None): its
    properties, and ``TAGS`` its tags (a plain MetaQ attribute: its tags alone); what a SQL92 filter evaluates."""
    tags, props, _with_properties = split_attribute(attribute)
    tags = shown_tags(tags)
    if tags is not None:
        props[PROP_TAGS] = tags
    return props


def pop_int(props, key):
    """Take the broker's own property ``key`` out of ``props`` as an int32: 0 when absent, not a number or out of
    range (a text put may carry any property: a forged one must never make a record unreadable)."""
    text = props.pop(key, None)
    try:
        value = int(text) if text is not None else 0
    except ValueError:
        return 0
    return value if -2**31 <= value < 2**31 else 0


def compression_bits(attribute):
    """The compression bits of the ``@SYSFLAG`` an attribute carries (0 without one, or for a value that is not
    a number: such a property is kept as it is)."""
    if attribute is None or PROP_SYSFLAG not in attribute:
        return 0
    _tags, props, with_properties = split_attribute(attribute)
    if not with_properties:
        return 0
    return pop_int(props, PROP_SYSFLAG) & COMPRESSION_BITS


def without_compression(attribute):
    """``attribute`` with the compression bits taken out of its ``@SYSFLAG`` (what is stored once the body is
    decompressed). A property part left empty goes too: the attribute is then its tags, or None when those
    are empty (so an unattributed message that was compressed is stored unattributed)."""
    tags, props, _with_properties = split_attribute(attribute)
    rest = pop_int(props, PROP_SYSFLAG) & ~COMPRESSION_BITS
    if rest:
        props[PROP_SYSFLAG] = str(rest)
    if props:
        return encode_attribute(tags, props)
    return tags or None


def stored_payload(properties, payload, max_bytes=limits.MAX_BODY_BYTES):
    """A record's payload as its producer meant it: decompressed when the record's (raw) ``properties`` say it
    is compressed, which only a record written by a metaq older than the decompress-on-arrival rule can.
    RemoteProtocolError when it does not decompress."""
    text = properties.get(PROP_SYSFLAG)
    if not text:
        return payload
    try:
        bits = int(text) & COMPRESSION_BITS
        if not bits or codec_of(bits) is None:
            return payload
        return inflate(bits, payload, max_bytes)
    except ValueError:
        return payload
    except BadCompressedBody as exc:
        raise RemoteProtocolError(str(exc)) from None
