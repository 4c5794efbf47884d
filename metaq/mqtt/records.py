"""An MQTT message in a metaq record, and a record as an MQTT message (sans-IO; docs/mqtt.md "Topics").

**The mapping.** The metaq topic a message is stored in is the broker's topic map's (``topicmap.TopicMap``: the
``mqtt.topic_map`` rules, else the first level when it is a legal metaq topic name, else ``mqtt.fallback_topic``;
``placement``), its partition the CRC-32 of the whole name's UTF-8 bytes modulo the topic's partitions
(``partition_for``: one MQTT topic always lands in one partition, so its messages keep their order), and the whole
name is kept in the record. The record keeps metaq's form (flag, attribute block, payload) with the properties of the
RocketMQ mapping (``protocol.rocketmq.mapping``: attribute ``"\\x02" key "\\x01" value "\\x02" ...``), so ``get``,
RocketMQ pulls, the Python client and Spark see them:

===================== =================================================================================
``MQTT_TOPIC``        the whole MQTT topic name (``MQTT_TOPIC_B64``: its UTF-8 base64, when it holds \\x01 or \\x02)
``MQTT_QOS``          the QoS it was published with (0, 1 or 2)
``MQTT_CLIENT``       its publisher's client identifier (an MQTT 5 No Local subscription skips its own)
``MQTT_CONTENT_TYPE`` MQTT 5 Content Type
``MQTT_RESPONSE_TOPIC`` MQTT 5 Response Topic
``MQTT_CORRELATION``  MQTT 5 Correlation Data, base64
``MQTT_PAYLOAD_FORMAT`` MQTT 5 Payload Format Indicator (``1``: UTF-8 text)
``MQTT_USER_PROPERTIES`` MQTT 5 User Properties: a JSON list of ``[name, value]`` pairs, in their order
``MQTT_RETAIN``       ``1`` when it was published retained (a Retain As Published subscription sees it)
``MQTT_EXPIRES_AT``   MQTT 5 Message Expiry Interval as the time it expires (epoch milliseconds)
===================== =================================================================================

A record's properties cannot hold ``\\x01`` or ``\\x02``: JSON escapes them in user properties, a topic name holding
one is kept as ``MQTT_TOPIC_B64`` (``_named``); a content type, response topic or client identifier holding one is
refused (``RecordRefusal``; the front-end answers 0x83).

A record of the MQTT cluster's inbox (``%MQTTIN%``, ``metaq.mqttcluster.following.inbox``) is a copy of a peer broker's
message and always carries the name it was published with.

**The other way.** A record of topic ``t`` without ``MQTT_TOPIC`` (put over text, RocketMQ or HTTP), or whose name
the topic map does not put in ``t`` (``TopicMap.holds``: a forged one), is the MQTT message of topic name ``t``
published at QoS 1 (it was acknowledged once stored), whose user properties are the
record's RocketMQ properties (internal ``@`` ones left out) and whose payload is the record's body.
"""

import base64
import functools
import json
import zlib
from typing import NamedTuple

from metaq.errors import RemoteProtocolError
from metaq.mqtt.limits import MQTT_ATTRIBUTE_CACHE, MQTT_KEPT_NAME
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.protocol.journaltopic import MQTT_INBOX_TOPIC
from metaq.protocol.message import decode_attribute, decode_payload, encode_payload
from metaq.protocol.properties import encode_attribute, split_attribute, stored_payload

__all__ = ["TOPIC", "TOPIC_B64", "QOS", "CLIENT", "CONTENT_TYPE", "RESPONSE_TOPIC", "CORRELATION", "PAYLOAD_FORMAT",
           "USER_PROPERTIES", "RETAIN", "EXPIRES_AT", "PLAIN_QOS", "RecordRefusal", "partition_for",
           "placement", "plain_plan", "record_data", "stored_message", "MqttMessage", "message_of", "name_of", "named"]

TOPIC = "MQTT_TOPIC"
#: The property that holds a topic name holding ``\x01`` or ``\x02`` (the attribute's separators) in place of
#: ``TOPIC``: the base64 of its UTF-8 bytes. Records written before never have it, so they read the same.
TOPIC_B64 = "MQTT_TOPIC_B64"
QOS = "MQTT_QOS"
CLIENT = "MQTT_CLIENT"
CONTENT_TYPE = "MQTT_CONTENT_TYPE"
RESPONSE_TOPIC = "MQTT_RESPONSE_TOPIC"
CORRELATION = "MQTT_CORRELATION"
PAYLOAD_FORMAT = "MQTT_PAYLOAD_FORMAT"
USER_PROPERTIES = "MQTT_USER_PROPERTIES"
RETAIN = "MQTT_RETAIN"
EXPIRES_AT = "MQTT_EXPIRES_AT"
_OURS = frozenset({TOPIC, TOPIC_B64, QOS, CLIENT, CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION, PAYLOAD_FORMAT,
                   USER_PROPERTIES, RETAIN, EXPIRES_AT})

#: The QoS a record put over another protocol is delivered as published with.
PLAIN_QOS = 1

_SEPARATORS = ("\x01", "\x02")

class RecordRefusal(ValueError):
    """A message the mapping cannot store; ``what`` names the field (``"topic"`` or another)."""

    def __init__(self, reason, what):
        super().__init__(reason)
        self.what = what


def partition_for(name, partitions):
    """The partition of ``partitions`` a message of MQTT topic name ``name`` is stored in: CRC-32 of its UTF-8 bytes
    modulo the count (the same on every broker and release: one MQTT topic, one partition, its order kept)."""
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % partitions


def placement(topics, name):
    """``(metaq topic, name hash)`` of MQTT topic name ``name`` under the topic map ``topics``
    (``TopicMap.place``, remembered per name): its topic and the CRC-32 whose remainder by the topic's partition count
    is ``partition_for``'s partition. RecordRefusal for a name beginning with ``$`` (the broker's)."""
    try:
        return topics.place(name)
    except ValueError as exc:
        raise RecordRefusal(str(exc), "topic") from None


def _text(value, what):
    if any(c in value for c in _SEPARATORS):
        raise RecordRefusal("a %s holding \\x01 or \\x02 cannot be stored" % what, what)
    return value


def record_data(name, payload, qos, client_id, properties, retain=False, now_ms=0):
    """``(flag, data)`` of the record of an MQTT PUBLISH (or will) of topic ``name`` with MQTT 5 ``properties``
    (``metaq.mqtt.wire``'s dict; those of delivery only, as Topic Alias, are not kept: ``_kept``); a Message Expiry
    Interval is kept as the time it expires, counted from ``now_ms``. The attribute holds properties and no tags, so
    the record's index unit has tag hash 0 (what the publish burst writes, ``MqttPort.write_burst``)."""
    if not properties:  # every MQTT 3.1.1 PUBLISH and most MQTT 5 ones: a device repeats the same few topics
        attribute = _plain_attribute if len(name) <= MQTT_KEPT_NAME else _plain_attribute.__wrapped__
        return encode_payload(payload, attribute(name, qos, client_id, retain))
    props = _named(name)
    props[QOS] = str(qos)
    if retain:
        props[RETAIN] = "1"
    if "message_expiry_interval" in properties:
        props[EXPIRES_AT] = str(now_ms + properties["message_expiry_interval"] * 1000)
    if client_id:
        props[CLIENT] = _text(client_id, "client identifier")
    kept = _kept(properties)
    if "content_type" in kept:
        props[CONTENT_TYPE] = _text(kept["content_type"], "content type")
    if "response_topic" in kept:
        props[RESPONSE_TOPIC] = _text(kept["response_topic"], "response topic")
    if "correlation_data" in kept:
        props[CORRELATION] = base64.b64encode(kept["correlation_data"]).decode("ascii")
    if "payload_format_indicator" in kept:
        props[PAYLOAD_FORMAT] = "1"
    if "user_property" in kept:
        props[USER_PROPERTIES] = json.dumps([list(p) for p in kept["user_property"]], ensure_ascii=False)
    return encode_payload(payload, encode_attribute(None, props))


def plain_plan(topics, name, client_id):
    """What staging a PUBLISH of ``name`` without properties by ``client_id`` (not retained) under the topic map
    ``topics`` needs, made once for
    ``wire.plain_publishes``: ``(name, metaq topic, name hash, flag, record prefix at QoS 0, at QoS 1)``, the first
    three ``placement``'s and each prefix ``record_data``'s record of an empty payload, so that ``prefix + payload``
    is ``record_data``'s data for that payload (the attribute comes before the payload). Raises ``RecordRefusal`` as
    ``record_data`` and ``placement`` do."""
    topic, crc = placement(topics, name)
    flag, prefix0 = record_data(name, b"", 0, client_id, None)
    _, prefix1 = record_data(name, b"", 1, client_id, None)
    return name, topic, crc, flag, prefix0, prefix1


def _kept(properties):
    """The MQTT 5 properties of a PUBLISH its record keeps, as ``message_of`` gives them back: an empty Content Type,
    a Payload Format Indicator 0 and no User Property are not kept (a subscriber sees them absent)."""
    out = {}
    if properties.get("content_type"):
        out["content_type"] = properties["content_type"]
    if "response_topic" in properties:
        out["response_topic"] = properties["response_topic"]
    if "correlation_data" in properties:
        out["correlation_data"] = bytes(properties["correlation_data"])
    if properties.get("payload_format_indicator"):
        out["payload_format_indicator"] = 1
    if properties.get("user_property"):
        out["user_property"] = tuple((str(n), str(v)) for n, v in properties["user_property"])
    return out


def stored_message(name, payload, qos, client_id, properties, retain=False, now_ms=0):
    """The ``MqttMessage`` that ``message_of`` gives for the record ``record_data`` makes of the same PUBLISH, made
    without it: a publisher's turn that has the PUBLISH sends it to subscribers without reading its record back."""
    if not properties:  # a plain PUBLISH's, made as ``MqttMessage._make`` makes one, in one C call
        return _message_of_fields((name, qos, client_id or None, payload, {}, retain, None))
    expiry = properties.get("message_expiry_interval")
    return MqttMessage(name, qos, client_id or None, payload, _kept(properties) if properties else {}, retain,
                       None if expiry is None else now_ms + expiry * 1000)


@functools.lru_cache(maxsize=MQTT_ATTRIBUTE_CACHE)
def _plain_attribute(name, qos, client_id, retain):
    """The attribute of a PUBLISH without MQTT 5 properties (``record_data``'s, remembered for names up to
    ``MQTT_KEPT_NAME``: the same publisher and topic give the same one; a refusal is raised again each time, never
    remembered)."""
    props = _named(name)
    props[QOS] = str(qos)
    if retain:
        props[RETAIN] = "1"
    if client_id:
        props[CLIENT] = _text(client_id, "client identifier")
    return encode_attribute(None, props)


def _named(name):
    """The properties that keep topic name ``name``: ``TOPIC``, or ``TOPIC_B64`` for one holding a separator."""
    if any(c in name for c in _SEPARATORS):
        return {TOPIC_B64: base64.b64encode(name.encode("utf-8", "surrogatepass")).decode("ascii")}
    return {TOPIC: name}


def _name_of(props):
    """The topic name ``_named`` kept in ``props``, or None (none, or a ``TOPIC_B64`` that does not decode)."""
    name = props.get(TOPIC)
    if name is None and TOPIC_B64 in props:
        try:
            return base64.b64decode(props[TOPIC_B64], validate=True).decode("utf-8")
        except ValueError:
            return None
    return name


class MqttMessage(NamedTuple):
    """A record as an MQTT message: its topic name, the QoS it was published with, its publisher's client id (None
    when not published over MQTT), its payload and the MQTT 5 properties a PUBLISH carries it with."""

    topic: str
    qos: int
    client_id: str
    payload: bytes
    properties: dict
    retain: bool = False
    expires_ms: int = None  # when it expires (epoch ms; MQTT 5 Message Expiry Interval), None: never


#: ``MqttMessage`` of its seven fields in order, without the named tuple's Python ``__new__``.
_message_of_fields = functools.partial(tuple.__new__, MqttMessage)


def _user_pairs(text):
    try:
        pairs = json.loads(text)
        return tuple((str(n), str(v)) for n, v in pairs)
    except (ValueError, TypeError):
        return ()


def message_of(metaq_topic, flag, data, topics=DEFAULT_MAP):
    """The ``MqttMessage`` of a record of ``metaq_topic`` (a ``LogRecord``'s flag and data) under the topic map
    ``topics``: the message its ``MQTT_TOPIC`` names when the map puts that name in ``metaq_topic``
    (``TopicMap.holds``), else the plain message of topic name ``metaq_topic``."""
    try:
        attribute, payload = decode_payload(flag, data)
    except RemoteProtocolError:
        attribute, payload = None, bytes(data)
    _tags, props, from_remoting = split_attribute(attribute)
    if from_remoting:
        try:
            payload = stored_payload(props, payload)
        except RemoteProtocolError:  # an old compressed record that does not inflate: its bytes as stored
            pass
    name = named(metaq_topic, props, topics)
    if name is None:
        user = tuple((k, v) for k, v in props.items() if not k.startswith("@") and k not in _OURS)
        return MqttMessage(metaq_topic, PLAIN_QOS, None, payload, {"user_property": user} if user else {})
    return named_message(name, props, payload)


def named_message(name, props, payload):
    """The ``MqttMessage`` of topic name ``name`` (``named``'s answer, not None) of a record with properties ``props``
    and ``payload`` (as stored): ``message_of``'s, for a caller that read the record's attribute already."""
    out = {}
    if CONTENT_TYPE in props:
        out["content_type"] = props[CONTENT_TYPE]
    if RESPONSE_TOPIC in props:
        out["response_topic"] = props[RESPONSE_TOPIC]
    if CORRELATION in props:
        try:
            out["correlation_data"] = base64.b64decode(props[CORRELATION], validate=True)
        except ValueError:
            pass
    if props.get(PAYLOAD_FORMAT) == "1":
        out["payload_format_indicator"] = 1
    if USER_PROPERTIES in props:
        pairs = _user_pairs(props[USER_PROPERTIES])
        if pairs:
            out["user_property"] = pairs
    qos = props.get(QOS)
    expires = props.get(EXPIRES_AT)
    return MqttMessage(name, int(qos) if qos in ("0", "1", "2") else PLAIN_QOS, props.get(CLIENT), payload, out,
                       props.get(RETAIN) == "1", int(expires) if expires and expires.isdigit() else None)


def name_of(metaq_topic, flag, data, topics=DEFAULT_MAP):
    """``message_of(metaq_topic, flag, data, topics).topic`` read from the attribute alone (the payload is neither
    decoded nor copied): what a cluster's follow matches a peer's filters against."""
    try:
        attribute, _end = decode_attribute(flag, data)
    except RemoteProtocolError:
        return metaq_topic
    name = named(metaq_topic, split_attribute(attribute)[1], topics)
    return metaq_topic if name is None else name


def named(metaq_topic, props, topics=DEFAULT_MAP):
    """The MQTT topic name a record of ``metaq_topic`` with properties ``props`` was published with, as
    ``message_of`` reads it: None when it names none, or one the topic map ``topics`` does not put in
    ``metaq_topic`` (the record is then the plain message of topic name ``metaq_topic``)."""
    name = _name_of(props)
    if name is None or (metaq_topic != MQTT_INBOX_TOPIC and not topics.holds(metaq_topic, name)):
        return None
    return name
