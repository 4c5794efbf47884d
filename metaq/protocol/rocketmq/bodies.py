"""Pure encoders/decoders of RocketMQ remoting bodies (reference ``rocketmq-remoting.md`` §2.4).

* message properties: ``key \\x01 value \\x02`` repeated (``MessageDecoder#messageProperties2String``);
* the stored-message record that pull, VIEW_MESSAGE and CHECK_TRANSACTION_STATE bodies carry and
  clients decode (``MessageDecoder#decode``), v1 magic for topics up to 127 bytes;
* the offset message id (store host + commit-log offset, upper-case hex);
* SEND_BATCH_MESSAGE entries (``MessageDecoder#encodeMessages``);
* JSON bodies: topic route data (quoted ``"0"`` broker-id keys, numbers as numbers), cluster
  info, consumer id list, and a lenient HeartbeatData reader (C++ ordinals, string subVersion).

Decoders of peer bytes raise ``RemoteProtocolError`` (not fatal: the frame was
whole); encoders raise ``ValueError`` for values the format cannot carry.
"""

import functools
import ipaddress
import json
import re
import struct
from typing import NamedTuple

from metaq import limits
from metaq.server.remoting import limits as remoting_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.properties import decode_properties, encode_properties  # the stored format's, RocketMQ's too

__all__ = [
    "MAGIC_V1",
    "MAGIC_V2",
    "SYSFLAG_COMPRESSED",
    "SYSFLAG_MULTI_TAGS",
    "SYSFLAG_TRANSACTION_PREPARED",
    "SYSFLAG_TRANSACTION_COMMIT",
    "SYSFLAG_TRANSACTION_ROLLBACK",
    "SYSFLAG_BORNHOST_V6",
    "SYSFLAG_STOREHOST_V6",
    "PERM_READ",
    "PERM_WRITE",
    "PERM_INHERIT",
    "MAX_PROPERTIES_BYTES",
    "StoredMessage",
    "BatchEntry",
    "BrokerData",
    "QueueData",
    "HeartbeatData",
    "ConsumerData",
    "SubscriptionData",
    "CheckClientBody",
    "decode_check_client",
    "encode_properties",
    "decode_properties",
    "body_crc",
    "encode_stored_message",
    "decode_stored_message",
    "decode_stored_messages",
    "create_offset_msg_id",
    "parse_offset_msg_id",
    "encode_batch_messages",
    "decode_batch_messages",
    "encode_topic_route",
    "encode_cluster_info",
    "encode_consumer_list",
    "decode_heartbeat",
]

#: Stored-message magic codes as signed int32: 0xDAA320A7 (1-byte topic length), 0xDAA320AB (2-byte).
MAGIC_V1 = 0xDAA320A7 - 2**32
MAGIC_V2 = 0xDAA320AB - 2**32

SYSFLAG_COMPRESSED = 1 << 0
SYSFLAG_MULTI_TAGS = 1 << 1
SYSFLAG_TRANSACTION_PREPARED = 1 << 2
SYSFLAG_TRANSACTION_COMMIT = 2 << 2
SYSFLAG_TRANSACTION_ROLLBACK = 3 << 2
SYSFLAG_BORNHOST_V6 = 1 << 4
SYSFLAG_STOREHOST_V6 = 1 << 5

PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4

#: The properties length of a stored record is a signed int16.
MAX_PROPERTIES_BYTES = 32767

#: Record head: TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID, FLAG (int32), QUEUEOFFSET, PHYSICALOFFSET (int64),
#: SYSFLAG (int32), BORNTIMESTAMP (int64). BORNHOST starts right after it, at offset 48.
_RECORD_HEAD = struct.Struct(">iiiiiqqiq")
assert _RECORD_HEAD.size == 48
#: A host's port (int32) after its 4 or 16 address bytes; also RECONSUMETIMES and BODYLEN.
_I32 = struct.Struct(">i")
assert _I32.size == 4
#: STORETIMESTAMP and PREPARED TX OFFSET.
_I64 = struct.Struct(">q")
assert _I64.size == 8
#: TOPICLEN of a v1 record (signed byte) / of a v2 record and PROPLEN (signed int16).
_I8 = struct.Struct(">b")
assert _I8.size == 1
_I16 = struct.Struct(">h")
assert _I16.size == 2
#: Offset message id: host address (4 or 16 bytes), then PORT (int32) and COMMITLOG OFFSET (int64).
_MSG_ID_TAIL = struct.Struct(">iq")
assert _MSG_ID_TAIL.size == 12
#: Batch entry head: TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN (int32 each).
_BATCH_HEAD = struct.Struct(">iiiii")
assert _BATCH_HEAD.size == 20

#: Smallest IPv4 v1 record: 88 fixed bytes (through BODYLEN) + TOPICLEN (1) + PROPLEN (2).
MIN_RECORD_BYTES = 91


# Stored messages -------------------------------------------------------------------


class StoredMessage(NamedTuple):
    """One stored-message record. Hosts are ``(ip text, port)``; ``properties`` a dict
    (``encode_stored_message`` also takes an already encoded string)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    body: bytes
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: tuple = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: tuple = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: object = {}


def body_crc(body):
    """BODYCRC: ``CRC32(body) & 0x7FFFFFFF`` (``UtilAll.crc32``)."""
    return metaq_checksum(body)


@functools.lru_cache(maxsize=1024)
def _packed_host(host, what):
    """``(address bytes, port bytes)``; cached: a broker encodes the same few hosts for every message."""
    ip, port = host
    try:
        packed = ipaddress.ip_address(ip).packed
    except ValueError:
        raise ValueError("%s %r is not an IP address" % (what, ip)) from None
    return packed, _I32.pack(port)


def encode_stored_message(msg):
    """The record bytes of ``msg`` as a RocketMQ client decodes them.

    TOTALSIZE is the real length; BODYCRC is computed; sysFlag bits 4/5 are set
    from the host address families (clear for IPv4); the magic is v1 unless the
    topic is over 127 bytes (then v2, 2-byte topic length).
    """
    topic = msg.topic.encode("utf-8")
    props = msg.properties if isinstance(msg.properties, str) else encode_properties(msg.properties)
    props = props.encode("utf-8")
    if len(props) > MAX_PROPERTIES_BYTES:
        raise ValueError("properties of %d bytes exceed %d" % (len(props), MAX_PROPERTIES_BYTES))
    if len(topic) > 32767:
        raise ValueError("topic of %d bytes is too long" % len(topic))
    born_ip, born_port = _packed_host(msg.born_host, "born host")
    store_ip, store_port = _packed_host(msg.store_host, "store host")
    sys_flag = msg.sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    sys_flag |= SYSFLAG_BORNHOST_V6 if len(born_ip) == 16 else 0
    sys_flag |= SYSFLAG_STOREHOST_V6 if len(store_ip) == 16 else 0
    body = bytes(msg.body)
    if len(topic) <= 127:
        magic, topic_len = MAGIC_V1, _I8.pack(len(topic))
    else:
        magic, topic_len = MAGIC_V2, _I16.pack(len(topic))
    total = (_RECORD_HEAD.size + len(born_ip) + 4 + 8 + len(store_ip) + 4 + 4 + 8 + 4 + len(body)
             + len(topic_len) + len(topic) + 2 + len(props))
    return b"".join((
        _RECORD_HEAD.pack(total, magic, body_crc(body), msg.queue_id, msg.flag, msg.queue_offset,
                          msg.physical_offset, sys_flag, msg.born_timestamp),
        born_ip, born_port, _I64.pack(msg.store_timestamp), store_ip, store_port,
        _I32.pack(msg.reconsume_times), _I64.pack(msg.prepared_transaction_offset),
        _I32.pack(len(body)), body, topic_len, topic, _I16.pack(len(props)), props,
    ))


class _Reader:
    """Bounded sequential reads over ``data[pos:end]``; raises RemoteProtocolError past ``end``."""

    __slots__ = ("data", "pos", "end", "what")

    def __init__(self, data, pos, end, what):
        self.data, self.pos, self.end, self.what = data, pos, end, what

    def take(self, n):
        if n < 0 or self.pos + n > self.end:
            raise RemoteProtocolError("%s: field of %d bytes at %d runs past its end %d" % (self.what, n, self.pos,
                                                                                          self.end))
        start = self.pos
        self.pos += n
        return bytes(self.data[start:self.pos])

    def unpack(self, fmt):
        return fmt.unpack(self.take(fmt.size))[0]


def _host(reader, v6):
    ip = ipaddress.ip_address(reader.take(16 if v6 else 4))
    return str(ip), reader.unpack(_I32)


def decode_stored_message(data, pos=0, check_crc=False):
    """``(StoredMessage, end)`` for the record at ``data[pos:]``. RemoteProtocolError if malformed
    (or, with ``check_crc``, if BODYCRC does not match)."""
    if len(data) - pos < _RECORD_HEAD.size:
        raise RemoteProtocolError("stored message: %d bytes left, need at least %d" % (len(data) - pos,
                                                                                         MIN_RECORD_BYTES))
    (total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
     born_timestamp) = _RECORD_HEAD.unpack_from(data, pos)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise RemoteProtocolError("stored message: bad magic code 0x%08X" % (magic & 0xFFFFFFFF))
    if total < MIN_RECORD_BYTES or total > len(data) - pos:
        raise RemoteProtocolError("stored message: total size %d is not within %d..%d"
                                  % (total, MIN_RECORD_BYTES, len(data) - pos))
    reader = _Reader(data, pos + _RECORD_HEAD.size, pos + total, "stored message")
    born_host = _host(reader, sys_flag & SYSFLAG_BORNHOST_V6)
    store_timestamp = reader.unpack(_I64)
    store_host = _host(reader, sys_flag & SYSFLAG_STOREHOST_V6)
    reconsume_times = reader.unpack(_I32)
    prepared = reader.unpack(_I64)
    body = reader.take(reader.unpack(_I32))
    topic_len = reader.unpack(_I8 if magic == MAGIC_V1 else _I16)
    try:
        topic = reader.take(topic_len).decode("utf-8")
        props = decode_properties(reader.take(reader.unpack(_I16)).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError("stored message: text is not UTF-8: %s" % exc) from None
    if reader.pos != pos + total:
        raise RemoteProtocolError("stored message: %d bytes after the properties" % (pos + total - reader.pos))
    if check_crc and crc != body_crc(body):
        raise RemoteProtocolError("stored message: body CRC %d, computed %d" % (crc, body_crc(body)))
    msg = StoredMessage(topic, queue_id, queue_offset, physical_offset, body, flag, sys_flag, born_timestamp,
                        born_host, store_timestamp, store_host, reconsume_times, prepared, props)
    return msg, pos + total


def decode_stored_messages(data, check_crc=False):
    """Every record of a pull body (records back to back)."""
    messages, pos = [], 0
    while pos < len(data):
        msg, pos = decode_stored_message(data, pos, check_crc)
        messages.append(msg)
    return messages


# Message ids -----------------------------------------------------------------------


def create_offset_msg_id(ip, port, physical_offset):
    """The offset msgId: upper-case hex of store ip (4 or 16 bytes) + port (int32) + commit-log offset (int64)."""
    return (_packed_ip(ip) + _MSG_ID_TAIL.pack(port, physical_offset)).hex().upper()


@functools.lru_cache(maxsize=1024)
def _packed_ip(ip):
    return ipaddress.ip_address(ip).packed


def parse_offset_msg_id(msg_id):
    """``(ip, port, physical_offset)`` of an offset msgId (32 hex chars for IPv4, 56 for IPv6, any case)."""
    if len(msg_id) not in (32, 56):
        raise RemoteProtocolError("message id %r: expected 32 or 56 hex digits" % (msg_id[:64],))
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RemoteProtocolError("message id %r is not hexadecimal" % (msg_id,)) from None
    if not msg_id.isascii() or len(raw) * 2 != len(msg_id):
        raise RemoteProtocolError("message id %r is not hexadecimal" % (msg_id,))
    port, offset = _MSG_ID_TAIL.unpack(raw[-12:])
    return str(ipaddress.ip_address(raw[:-12])), port, offset


# Batch send bodies -----------------------------------------------------------------


class BatchEntry(NamedTuple):
    """One message of a SEND_BATCH_MESSAGE body."""

    body: bytes
    flag: int = 0
    properties: dict = {}


def encode_batch_messages(entries):
    """A SEND_BATCH_MESSAGE body, as ``MessageDecoder#encodeMessages`` writes it (magic and CRC 0)."""
    out = []
    for entry in entries:
        props = encode_properties(entry.properties).encode("utf-8")
        if len(props) > MAX_PROPERTIES_BYTES:
            raise ValueError("properties of %d bytes exceed %d" % (len(props), MAX_PROPERTIES_BYTES))
        total = _BATCH_HEAD.size + len(entry.body) + 2 + len(props)
        out += [_BATCH_HEAD.pack(total, 0, 0, entry.flag, len(entry.body)), bytes(entry.body),
                _I16.pack(len(props)), props]
    return b"".join(out)


def decode_batch_messages(data, opaque=0):
    """The ``BatchEntry``s of a SEND_BATCH_MESSAGE body; RemoteProtocolError(opaque) if malformed."""
    entries, pos = [], 0
    try:
        while pos < len(data):
            if len(data) - pos < _BATCH_HEAD.size + 2:
                raise RemoteProtocolError("batch entry at %d is truncated" % pos)
            total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(data, pos)
            if total < _BATCH_HEAD.size + 2 or total > len(data) - pos:
                raise RemoteProtocolError("batch entry at %d: total size %d out of range" % (pos, total))
            reader = _Reader(data, pos + _BATCH_HEAD.size, pos + total, "batch entry")
            body = reader.take(body_len)
            try:
                props = decode_properties(reader.take(reader.unpack(_I16)).decode("utf-8"))
            except UnicodeDecodeError:
                raise RemoteProtocolError("batch entry at %d: properties are not UTF-8" % pos) from None
            if reader.pos != pos + total:
                raise RemoteProtocolError("batch entry at %d: size %d does not match its fields" % (pos, total))
            entries.append(BatchEntry(body, flag, props))
            pos += total
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(exc.reason, opaque, False) from None
    return entries


# JSON bodies -----------------------------------------------------------------------


def _json(obj):
    """Compact JSON with sorted keys and raw UTF-8, as fastjson writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode("utf-8")


class BrokerData(NamedTuple):
    """A broker of a route: ``addrs`` maps broker id (0 = master) to ``"ip:port"``."""

    broker_name: str
    addrs: dict
    cluster: str = "DefaultCluster"

    def to_json(self):
        return {"brokerAddrs": {str(int(k)): v for k, v in self.addrs.items()}, "brokerName": self.broker_name,
                "cluster": self.cluster, "enableActingMaster": False}


class QueueData(NamedTuple):
    """The queues of a topic on one broker; ``perm`` 6 = READ|WRITE."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0

    def to_json(self):
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}


def encode_topic_route(brokers, queues, order_topic_conf=None):
    """TopicRouteData JSON: quoted broker-id keys (``"0"``), numbers as JSON numbers, sorted keys."""
    route = {"brokerDatas": [b.to_json() for b in brokers], "filterServerTable": {},
             "queueDatas": [q.to_json() for q in queues]}
    if order_topic_conf is not None:
        route["orderTopicConf"] = order_topic_conf
    return _json(route)


def encode_cluster_info(brokers):
    """ClusterInfo JSON (GET_BROKER_CLUSTER_INFO): ``brokerAddrTable`` and ``clusterAddrTable``."""
    clusters = {}
    for b in brokers:
        clusters.setdefault(b.cluster, []).append(b.broker_name)
    return _json({"brokerAddrTable": {b.broker_name: b.to_json() for b in brokers},
                  "clusterAddrTable": {c: sorted(names) for c, names in clusters.items()}})


def encode_consumer_list(client_ids):
    """GET_CONSUMER_LIST_BY_GROUP body: ``{"consumerIdList":[...]}``."""
    return _json({"consumerIdList": list(client_ids)})


class SubscriptionData(NamedTuple):
    topic: str
    sub_string: str = "*"
    tags: tuple = ()
    sub_version: int = 0
    expression_type: str = "TAG"


class ConsumerData(NamedTuple):
    """A consumer group of a heartbeat; the enums as Java names whatever form they came in."""

    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    unit_mode: bool = False
    subscriptions: tuple = ()


class HeartbeatData(NamedTuple):
    client_id: str
    consumers: tuple = ()
    producer_groups: tuple = ()


_CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY", "CONSUME_POP")
_MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
_CONSUME_FROM = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                 "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                 "CONSUME_FROM_TIMESTAMP")


_INTEGER = re.compile(r"[+-]?[0-9]{1,19}", re.ASCII)


def _enum(value, names, default):
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    return default


def _as_int(value, default=0):
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        return int(value)
    return default


def _as_bool(value):
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _objects(value):
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _strings(value):
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


def decode_heartbeat(data, opaque=0):
    """HeartbeatData, read leniently: enum names or ordinals, subVersion as number or string,
    missing sets empty. RemoteProtocolError(opaque) if not a JSON object with a ``clientID``."""
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise RemoteProtocolError("heartbeat body is not JSON: %s" % exc, opaque, False) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("clientID"), str):
        raise RemoteProtocolError("heartbeat body has no clientID", opaque, False)
    _bounded("clientID", obj["clientID"], remoting_limits.MAX_CLIENT_ID_BYTES, opaque)
    consumers = []
    for c in _objects(obj.get("consumerDataSet")):
        if not isinstance(c.get("groupName"), str):
            continue
        _bounded("consumer group name", c["groupName"], limits.MAX_NAME_BYTES, opaque)
        subs = tuple(
            SubscriptionData(s["topic"], str(s.get("subString") or "*"),
                             _strings(s.get("tagsSet")),
                             _as_int(s.get("subVersion")), str(s.get("expressionType") or "TAG"))
            for s in _objects(c.get("subscriptionDataSet")) if isinstance(s.get("topic"), str))
        consumers.append(ConsumerData(
            c["groupName"], _enum(c.get("consumeType"), _CONSUME_TYPES, "CONSUME_PASSIVELY"),
            _enum(c.get("messageModel"), _MESSAGE_MODELS, "CLUSTERING"),
            _enum(c.get("consumeFromWhere"), _CONSUME_FROM, "CONSUME_FROM_LAST_OFFSET"),
            _as_bool(c.get("unitMode")), subs))
    producers = tuple(p["groupName"] for p in _objects(obj.get("producerDataSet"))
                      if isinstance(p.get("groupName"), str))
    for name in producers:
        _bounded("producer group name", name, limits.MAX_NAME_BYTES, opaque)
    return HeartbeatData(obj["clientID"], tuple(consumers), producers)


class CheckClientBody(NamedTuple):
    """CHECK_CLIENT_CONFIG's body (RocketMQ's CheckClientRequestBody): the client, its group, one subscription."""

    client_id: str
    group: str
    subscription: SubscriptionData


def decode_check_client(data, opaque=0):
    """``CheckClientBody``, read leniently as the heartbeat's subscriptions are; RemoteProtocolError(opaque) if
    not a JSON object with a ``subscriptionData`` object naming its topic."""
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise RemoteProtocolError("check-client body is not JSON: %s" % exc, opaque, False) from None
    s = obj.get("subscriptionData") if isinstance(obj, dict) else None
    if not isinstance(s, dict) or not isinstance(s.get("topic"), str):
        raise RemoteProtocolError("check-client body has no subscriptionData with a topic", opaque, False)
    group = obj.get("group") if isinstance(obj.get("group"), str) else ""
    client = obj.get("clientId") if isinstance(obj.get("clientId"), str) else ""
    _bounded("topic", s["topic"], limits.MAX_NAME_BYTES, opaque)
    if group:
        _bounded("consumer group name", group, limits.MAX_NAME_BYTES, opaque)
    return CheckClientBody(client, group, SubscriptionData(
        s["topic"], str(s.get("subString") or "*"), _strings(s.get("tagsSet")), _as_int(s.get("subVersion")),
        str(s.get("expressionType") or "TAG")))


def _bounded(what, value, most, opaque):
    """A heartbeat's names are kept (the client registry, the check-back's producers) and sent back (group change
    notices): one past ``most`` UTF-8 bytes refuses the heartbeat, nothing of it recorded."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if not value or size > most:
        raise RemoteProtocolError("heartbeat %s of %d bytes: it must be 1..%d" % (what, size, most), opaque, False)
