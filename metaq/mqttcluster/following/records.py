"""The inbox's records (``%MQTTIN%``, ``inbox.py``): the one definition of which peer's MQTT record a copy keeps as
it is (its attribute read plainly, its payload never decoded) and of the properties an inbox record adds (its place,
its check, its epoch, in that order), which the one-step copy (``copyturn.py``) and the general path (``inbox.as_is``,
``inbox.copy_parts``, ``inbox.marker``) both call, so their bytes cannot drift apart. Compiled with Cython where it is
built (``metaq.native``: the one-step copy calls these as C functions), this source itself elsewhere.
"""

from metaq.errors import RemoteProtocolError
from metaq.mqtt.records import EXPIRES_AT, named
from metaq.protocol.message import decode_attribute
from metaq.protocol.properties import PROP_SYSFLAG, split_attribute

#: A copy's property: ``<broker id>:<partition>:<offset>:<topic>`` of its origin record.
ORIGIN = "MQTT_ORIGIN"
#: A copy's property: the ``$share`` groups of this broker the origin assigned it to (JSON).
GROUPS = "MQTT_GROUPS"
#: A marker's property: ``<broker id>:<partition>:<next offset>:<topic>``.
NEXT = "MQTT_NEXT"
#: A copy's or a marker's property: the ``record_check`` of the origin record at (for a marker: before) its place;
#: absent when it is 0 (its readers take a missing one as 0).
CHECK = "MQTT_CHECK"
#: A copy's or a marker's property: ``<number>:<origin>`` of the epoch of the origin record at (before) its place;
#: absent for ``NO_EPOCH`` (0:0).
EPOCH = "MQTT_EPOCH"
#: The properties only the inbox writes: a peer's record holding one is made again (``inbox.copy_parts``), not kept.
OWN = (ORIGIN, GROUPS, NEXT, CHECK, EPOCH)


def kept_attribute(topic, flag, data, now_ms, topics):
    """``(attribute, MQTT topic name, properties, where the payload starts in data)`` of a peer's MQTT record of
    ``topic`` a copy keeps as it is: the attribute (its text, ending with ``\\x02``) is what the copy's own properties
    follow. ``()`` when it expired (MQTT 5 Message Expiry: the time its record keeps); None when the record is not one
    to keep as it is: no attribute or one not well formed, no MQTT name the topic map ``topics`` puts in ``topic``
    (``records.named``), tags, a property of the inbox's own (forged) or an old record's compression (``@SYSFLAG``)."""
    try:
        attribute, end = decode_attribute(flag, data)
    except RemoteProtocolError:
        return None
    tags, props, with_properties = split_attribute(attribute)
    if not with_properties or tags:
        return None
    if PROP_SYSFLAG in props:
        return None
    for own in OWN:
        if own in props:
            return None
    name = named(topic, props, topics)
    if name is None:
        return None
    expires = props.get(EXPIRES_AT)
    if expires and expires.isdigit() and int(expires) <= now_ms:
        return ()
    if not attribute.endswith("\x02"):
        attribute += "\x02"
    return attribute, name, props, end


def place_properties(key, origin, topic, partition, offset, check, epoch):
    """The properties an inbox record adds, encoded (each ends with ``\\x02``): ``key`` (``ORIGIN`` for a copy,
    ``NEXT`` for a marker) = ``<origin>:<partition>:<offset>:<topic>``, then ``CHECK`` unless ``check`` is 0, then
    ``EPOCH`` unless ``epoch`` is ``NO_EPOCH``. ValueError for a topic no property can hold (a separator in it)."""
    if "\x01" in topic or "\x02" in topic:
        raise ValueError("topic %r cannot be a property's value (it holds \\x01/\\x02)" % topic[:64])
    e0, e1 = epoch
    text = "%s\x01%d:%d:%d:%s\x02" % (key, origin, partition, offset, topic)
    if check:
        text += "%s\x01%d\x02" % (CHECK, check)
    if e0 or e1:
        text += "%s\x01%d:%d\x02" % (EPOCH, e0, e1)
    return text
