"""What the client sends and receives: ``Message``, ``Partition`` and ``SendResult``.

A message is a topic, a body (bytes) and an optional attribute string; on the
wire the attribute travels as MetaQ's attribute block in front of the body
(``metaq.protocol.message.encode_payload``). The library fills in ``id``,
``partition`` and ``offset`` once the broker has stored the message (producer)
or when it was fetched (consumer).
"""

from array import array
from typing import NamedTuple, Optional

from metaq.keys import limits as keys_limits
from metaq.protocol.compression import compress
from metaq.protocol.events import DelayedPut, Put
from metaq.protocol.message import decode_payload, encode_payload
from metaq.priorities.wire import PriorityPut
from metaq.protocol.properties import PROP_KEYS, encode_attribute, split_attribute, stored_payload
from metaq.client.timers import when_of
from metaq.timers.wire import TimerPut

__all__ = ["Partition", "Message", "SendResult", "ManyResult"]


class Partition(NamedTuple):
    """One partition of a topic on one broker; written ``"<broker_id>-<partition>"`` as in MetaQ's ZooKeeper nodes."""

    broker_id: int
    partition: int

    def __str__(self):
        return "%d-%d" % (self.broker_id, self.partition)

    @classmethod
    def parse(cls, text):
        """``Partition.parse("7-3") == Partition(7, 3)``; ValueError when ``text`` is not ``"<int>-<int>"``."""
        broker, sep, part = str(text).partition("-")
        try:
            if not sep:
                raise ValueError
            return cls(int(broker), int(part))
        except ValueError:
            raise ValueError("invalid partition %r: expected '<brokerId>-<partition>'" % (text,)) from None


class Message:
    """A message: ``Message(topic, body, attribute=None, key=None, properties=None, delay_level=0)``.

    ``body`` is bytes (bytearray/memoryview are copied to bytes). ``attribute``
    is an optional string stored with the message (``""`` is kept as an empty
    attribute, ``None`` means none; ``\x02`` is refused: it starts the properties). ``key``: ``KeySelector`` uses
    it to pick a partition so that messages with the same key stay in order, and it is sent as the ``KEYS``
    property (unless ``properties`` has one), so the broker's key index finds it (``metaq.client.keys.lookup``).
    ``delay_level`` > 0 asks the broker to deliver the message only after that
    level's delay (the broker's ``delay.levels``, RocketMQ's ``1s 5s 10s 30s 1m
    …`` by default; above the last level = the last level); its ``offset`` is
    then unknown when the send succeeds and stays None.

    ``properties`` (a dict of str, empty by default) are RocketMQ message
    properties (``KEYS``, user properties ...): they travel in the attribute
    after a ``\x02`` (docs/rocketmq.md), so a RocketMQ consumer sees them, and messages sent by RocketMQ producers
    arrive with their tags as ``attribute`` and their other properties here.

    ``deliver_at`` (a datetime, naive = local time, or epoch milliseconds) or ``delay`` (a timedelta or seconds):
    delivered then, to the millisecond, up to 10 years ahead; a time in the past is delivered at once
    (docs/messaging.md "Any delivery time"); ``offset`` stays None as for a delay level;
    ``Producer.cancel(message.id)`` cancels it.

    ``priority`` (None by default): the level of a priority topic the message goes to, 0 the lowest (docs/messaging.md
    "Priorities"); the broker refuses it for a topic without priorities or past its levels. A fetched message
    of a priority topic has the level it came from here.

    Filled in by the library: ``id`` (the broker's message id), ``partition``
    (a ``Partition``) and ``offset`` (the message's sequence number in its
    partition); all None until then.
    """

    __slots__ = ("topic", "body", "attribute", "key", "delay_level", "id", "partition", "offset", "flag",
                 "properties", "priority", "when")

    def __init__(self, topic, body, attribute=None, key=None, properties=None, delay_level=0, priority=None,
                 deliver_at=None, delay=None):
        if type(body) is not bytes:
            if isinstance(body, (bytearray, memoryview)):
                body = bytes(body)
            elif not isinstance(body, bytes):
                raise TypeError("message body must be bytes, got %s" % type(body).__name__)
        if attribute is not None:
            if not isinstance(attribute, str):
                raise TypeError("message attribute must be a str or None, got %s" % type(attribute).__name__)
            if "\x02" in attribute:  # it would come back cut there, the rest as properties
                raise ValueError("a message attribute cannot hold \\x02: it separates the attribute from the "
                                 "message's properties (give those as properties=)")
        if priority is None and deliver_at is None and delay is None and type(delay_level) is int and not delay_level:
            self.when = None  # a plain message (the common case): nothing more to check
        else:
            self._check_timing(delay_level, priority, deliver_at, delay)
        self.priority = priority
        self.topic = topic
        self.body = body
        self.attribute = attribute
        self.key = key
        self.delay_level = delay_level
        self.id = None
        self.partition = None
        self.offset = None
        self.flag = None  # the record's flag when the message was fetched
        self.properties = dict(properties) if properties else {}

    def _check_timing(self, delay_level, priority, deliver_at, delay):
        """The delay level, priority and delivery time checked (ValueError), ``when`` set."""
        if not isinstance(delay_level, int) or isinstance(delay_level, bool) or delay_level < 0:
            raise ValueError("delay_level must be an int >= 0 (0 = no delay), got %r" % (delay_level,))
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool) or priority < 0):
            raise ValueError("priority must be None or an int >= 0 (a level of a priority topic), got %r" % (priority,))
        if priority is not None and delay_level:
            raise ValueError("a message cannot have both a delay level and a priority")
        self.when = when_of(deliver_at, delay)  # put_at's @<ms> / +<ms>, or None
        if self.when is not None and (delay_level or priority is not None):
            raise ValueError("a message cannot have both a delivery time (deliver_at, delay) and a delay level or a "
                             "priority")

    def encode(self, compress_over=None, compression="zlib"):
        """``(flag, data)`` as sent in a ``put``: the attribute block (if any) followed by the body.

        With ``compress_over`` (bytes), a longer body is sent compressed with ``compression`` (``zlib``,
        ``zstd`` or ``lz4``) when that makes it smaller, marked by the internal property ``@SYSFLAG``; the
        broker decompresses it on arrival and stores the original bytes (docs/rocketmq.md "Compressed bodies"). A
        message whose attribute is ``""`` with no properties is never compressed (stored, it would come back
        without an attribute). ValueError when a property cannot be encoded (empty, or holding \\x01 or
        \\x02).
        """
        body, properties = self.body, self.properties
        if isinstance(self.key, (str, bytes, int)) and PROP_KEYS not in properties:
            # sent to be indexed (docs/messaging.md "Key index") when the index could take it; a key of another kind
            # only picks the partition (the Spark sink passes the partition it chose that way)
            key = self.key_bytes()
            if key and len(key) <= keys_limits.MAX_KEY_BYTES and b"\x01" not in key and b"\x02" not in key:
                properties = dict(properties, **{PROP_KEYS: key.decode("utf-8", "replace")})
        if (compress_over is not None and len(body) > compress_over
                and (self.attribute is None or self.attribute or properties)):
            bits, packed = compress(body, compression)
            if len(packed) < len(body):
                body, properties = packed, dict(properties, **{"@SYSFLAG": str(bits)})
        if properties:
            return encode_payload(body, encode_attribute(self.attribute, properties))
        return encode_payload(body, self.attribute)

    def put_event(self, flag, data, checksum):
        """The request that stores the encoded message (partition -1): put, put_delayed or put_prio."""
        if self.priority is not None:
            return PriorityPut(self.topic, -1, flag, data, 0, checksum, self.priority)
        if self.when is not None:
            return TimerPut(self.topic, -1, flag, data, 0, checksum, self.when)
        if self.delay_level:
            return DelayedPut(self.topic, -1, flag, data, 0, checksum, self.delay_level)
        return Put(self.topic, -1, flag, data, 0, checksum)

    def key_bytes(self):
        """The key as bytes (str as UTF-8, other objects through ``str``), or None without a key."""
        key = self.key
        if key is None or isinstance(key, bytes):
            return key
        if isinstance(key, (bytearray, memoryview)):
            return bytes(key)
        return str(key).encode("utf-8")

    @classmethod
    def from_record(cls, topic, partition, offset, record):
        """A received message built from a ``metaq.protocol.message.Record`` found at ``offset`` of ``partition``.

        Raises ``errors.RemoteProtocolError`` when the record's attribute block is malformed, or when it is a
        record an older broker stored compressed and its body does not decompress.
        """
        attribute, payload = decode_payload(record.flag, record.data)
        tags, properties, from_remoting = split_attribute(attribute)
        if from_remoting:
            attribute = tags
            payload = stored_payload(properties, payload)
            properties = {k: v for k, v in properties.items() if not k.startswith("@")}
        msg = cls(topic, payload, attribute, properties=properties)
        msg.id = record.msg_id
        msg.partition = partition
        msg.offset = offset
        msg.flag = record.flag
        return msg

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        return (self.topic, self.body, self.attribute, self.id, self.partition, self.offset) == (
            other.topic, other.body, other.attribute, other.id, other.partition, other.offset)

    __hash__ = None

    def __repr__(self):
        body = self.body if len(self.body) <= 32 else self.body[:32] + b"..."
        return "Message(topic=%r, body=%r, attribute=%r, id=%r, partition=%s, offset=%r)" % (
            self.topic, body, self.attribute, self.id, self.partition, self.offset)


class SendResult(NamedTuple):
    """Outcome of one send.

    ``success`` True: the broker stored the message at ``partition`` / ``offset``
    with id ``msg_id``. ``success`` False: ``error`` says why (the last error
    seen); ``partition`` is the last partition tried, if any. ``duplicate``
    (idempotent producers): the broker had already stored this send (an earlier
    attempt's reply was lost); ``offset`` and ``msg_id`` are that original's.
    """

    success: bool
    partition: Optional[Partition] = None
    offset: int = -1
    msg_id: int = -1
    error: Optional[Exception] = None
    duplicate: bool = False


class ManyResult(NamedTuple):
    """Outcome of one ``Producer.send_many``: ``count`` payloads for ``partition``, one result for all.

    ``runs`` are ``(index, first_id, partition_number, first_offset, n)``, in payload order: payloads ``index ..
    index + n - 1`` were stored with consecutive ids and offsets from those (a handful of tuples, not one per
    message). ``success`` is True when every payload was stored; else ``error`` says why the first failed frame
    was refused, and ``runs`` cover what was stored (each frame of a call is stored whole or not at all).
    """

    success: bool
    partition: Optional[Partition]
    count: int
    runs: list
    error: Optional[Exception] = None
    duplicates: int = 0  # an idempotent producer's: payloads already stored, answered with the originals

    @property
    def stored(self):
        """How many of the payloads were stored."""
        return sum(run[4] for run in self.runs)

    def offsets(self):
        """``array('q')`` of each payload's offset, in payload order (-1 where it was not stored)."""
        return self._expand(3)

    def ids(self):
        """``array('q')`` of each payload's message id, in payload order (-1 where it was not stored)."""
        return self._expand(1)

    def _expand(self, field):
        out = array("q", [-1]) * self.count
        for run in self.runs:
            first, n = run[field], run[4]
            out[run[0]:run[0] + n] = array("q", range(first, first + n))
        return out
