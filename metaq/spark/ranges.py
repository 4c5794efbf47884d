"""Offset ranges of a topic and a plain-Python reader for them (no Spark here).

Like Spark's Kafka ``OffsetRange``, a range is ``[start, end)`` of one partition: ``start``
inclusive, ``end`` exclusive, ``count = end - start``. Offsets are message sequence numbers,
so a range can be cut anywhere (:func:`split_ranges`). :func:`plan_ranges` resolves
``earliest`` / ``latest`` / per-partition JSON against the brokers' ``stats offsets`` once,
so the ranges are frozen before anything is read; :func:`read_range` reads exactly one range
with ``get`` requests. The Spark data source (:mod:`metaq.spark.datasource`) and its
RDD fallback are thin wrappers around these two functions.

Offsets JSON (the ``startingOffsets`` / ``endingOffsets`` options), as in Spark's Kafka
source: ``{"<topic>": {"<brokerId>-<partition>": <offset>, ...}}`` where the key is the
partition as MetaQ names it in ZooKeeper (``"7-0"`` is partition 0 of broker 7); ``-2``
means earliest and ``-1`` latest. Partitions not named take the default (earliest for the
start, latest for the end).
"""

import json
from datetime import datetime, timezone
from typing import NamedTuple

from metaq import errors
from metaq.client import security as client_security
from metaq.client.connection import BrokerConnection
from metaq.client.discovery import find_brokers
from metaq.client.fetcher import records_of
from metaq.client.message import Partition
from metaq.limits import validate_topic
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.protocol.message import decode_payload
from metaq.protocol.rocketmq.mapping import split_attribute

__all__ = ["OffsetRange", "DataLoss", "SCHEMA_DDL", "msg_timestamp_ms", "parse_offsets",
           "partition_bounds", "plan_ranges", "split_ranges", "read_range", "read_options", "security_options"]

#: MetaQ's message-id epoch (ms) and where the timestamp starts in an id:
#: ``id = ((ts_ms - TWEPOCH) << 22) | (broker_id << 12) | seq`` (the broker's ``metaq.store.msgid``).
TWEPOCH = 1303895660503
TIMESTAMP_SHIFT = 22
EARLIEST, LATEST = -2, -1
#: The group name sent in ``get`` requests (a get never commits anything).
READER_GROUP = "metaq-spark"
#: Columns of a message DataFrame, as a Spark DDL string.
SCHEMA_DDL = ("topic string, partition string, offset long, msg_id long, attribute string, value binary, "
              "timestamp timestamp")
DEFAULT_FETCH_BYTES = 1 << 20
#: The source's connection options (lower-case) -> ``ClientSecurity.from_options`` argument. Files only: a
#: secret itself is never an option (options show in Spark's plans, UI and logs).
SECURITY_OPTIONS = {"credentials": "credentials", "user": "user", "secretfile": "secret_file", "tls": "tls",
                    "ca": "ca", "cert": "cert", "key": "key", "serverhostname": "server_hostname"}


class DataLoss(errors.ClientError):
    """Requested offsets are no longer (or not yet) in the partition."""


class OffsetRange(NamedTuple):
    """``[start, end)`` of partition ``broker_id-partition`` of ``topic``, read from ``url``."""

    topic: str
    broker_id: int
    partition: int
    start: int
    end: int
    url: str

    @property
    def key(self):
        return "%d-%d" % (self.broker_id, self.partition)

    @property
    def count(self):
        return self.end - self.start


def msg_timestamp_ms(msg_id):
    """Milliseconds since the Unix epoch inside a message id (when the broker stored the message)."""
    return (msg_id >> TIMESTAMP_SHIFT) + TWEPOCH


def read_options(options):
    """Spark's options (any case) as a plain dict with lower-case keys."""
    return {str(k).lower(): v for k, v in dict(options or {}).items()}


def security_options(opts):
    """The connection settings among a read's (lower-case) options, as ``ClientSecurity.from_options``
    arguments: paths and names only, so they can travel to the executors, which read the files there (an
    empty dict: the environment's ``METAQ_*``). ValueError for a ``secret`` option."""
    if opts.get("secret") is not None:
        raise ValueError("the metaq source takes no 'secret' option (options show in Spark's plans and logs): "
                         "use 'credentials' (a credentials file) or 'user' with 'secretFile'")
    out = {arg: opts[name] for name, arg in SECURITY_OPTIONS.items() if opts.get(name) not in (None, "")}
    if "tls" in out:
        out["tls"] = str(out["tls"]).strip().lower() in ("1", "true", "yes", "on")
    return out


def parse_offsets(text, topic, which):
    """An offsets option: ``"earliest"``, ``"latest"`` or the JSON form -> ``EARLIEST``, ``LATEST`` or ``{key: offset}``.

    ``which`` is ``"start"`` or ``"end"``; as in Spark's Kafka batch source a start cannot be
    latest and an end cannot be earliest. Raises ValueError with the reason.
    """
    default = EARLIEST if which == "start" else LATEST
    if text is None or str(text).strip() == "":
        return default
    text = str(text).strip()
    if text in ("earliest", "latest"):
        value = EARLIEST if text == "earliest" else LATEST
        if value != default:
            raise ValueError("%s offsets cannot be %r in a batch read" % (which, text))
        return value
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError("%s offsets must be 'earliest', 'latest' or JSON like "
                         "{\"%s\": {\"0-0\": 42}}, got %r" % (which, topic, text)) from None
    if not isinstance(doc, dict) or set(doc) - {topic}:
        raise ValueError("%s offsets JSON must be {\"%s\": {\"<brokerId>-<partition>\": offset}}, got %r"
                         % (which, topic, text))
    out = {}
    for key, offset in (doc.get(topic) or {}).items():
        part = Partition.parse(key)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < -2:
            raise ValueError("offset of %s must be an integer >= 0 (or -2 earliest, -1 latest), got %r" % (key, offset))
        if offset == (LATEST if which == "start" else EARLIEST):
            raise ValueError("%s offset of %s cannot be %d in a batch read" % (which, key, offset))
        out[str(part)] = offset
    return out


def partition_bounds(urls, topic, timeout=10.0, security=None):
    """``{(broker_id, partition): (min_offset, max_offset)}`` of ``topic`` from every broker's ``stats offsets``."""
    bounds = {}
    security = client_security.resolve(security)
    for broker_id, url in sorted(urls.items()):
        with BrokerConnection(url, connect_timeout=timeout, request_timeout=timeout, heartbeat_interval=0,
                              security=security) as conn:
            reply = conn.call(ev.Stats("offsets", 0), timeout=timeout)
        if reply.code != 200:
            raise errors.RemoteProtocolError("stats offsets on %s answered %d" % (url, reply.code))
        for r in stats_codec.parse_offsets(reply.body):
            if r.topic == topic:
                bounds[(broker_id, r.partition)] = (r.min_offset, r.max_offset)
    return bounds


def _split_list(text):
    return [item.strip() for item in str(text or "").split(",") if item.strip()]


def plan_ranges(options):
    """The frozen ``[OffsetRange]`` a read with these options covers (sorted, split by ``maxOffsetsPerPartition``).

    Options (case-insensitive): ``topic``; ``brokers`` (``meta://h:p[,…]``) and/or ``zk``
    (``host:port[/chroot]``, with ``zkRoot``, default ``/meta``); ``startingOffsets``,
    ``endingOffsets``; ``partitions`` (``"7-0,7-1"``: only these); ``maxOffsetsPerPartition``
    (cut every range into pieces of at most this many offsets: one Spark partition each);
    ``failOnDataLoss`` (default true: a start below the partition's first kept offset is an
    error; false: start there instead); ``credentials`` (a credentials file) or ``user`` with
    ``secretFile``, and ``tls``, ``ca``, ``cert``, ``key``, ``serverHostname`` (default: the
    environment's ``METAQ_*``; :func:`security_options`). Raises ValueError for bad options,
    DataLoss for offsets outside the partitions.
    """
    opts = read_options(options)
    topic = validate_topic(opts.get("topic") or "")
    brokers = _split_list(opts.get("brokers"))
    if not brokers and not opts.get("zk"):
        raise ValueError("the metaq source needs the option 'brokers' (meta://host:port,...) or 'zk'")
    timeout = float(opts.get("timeoutseconds", 10))
    security = client_security.resolve(security_options(opts))
    urls = find_brokers(brokers, opts.get("zk"), opts.get("zkroot", "/meta"), timeout, security)
    bounds = partition_bounds(urls, topic, timeout, security)
    starts = parse_offsets(opts.get("startingoffsets"), topic, "start")
    ends = parse_offsets(opts.get("endingoffsets"), topic, "end")
    only = {str(Partition.parse(p)) for p in _split_list(opts.get("partitions"))}
    fail_on_loss = str(opts.get("failondataloss", "true")).lower() != "false"
    known = {"%d-%d" % k for k in bounds}
    named_parts = set(only)
    for spec in (starts, ends):
        if isinstance(spec, dict):
            named_parts.update(spec)
    for named in sorted(named_parts):
        if named not in known:
            raise ValueError("partition %s of %s is not on any broker (known: %s)" % (named, topic, ", ".join(sorted(known)) or "none"))
    ranges = []
    for (broker_id, p), (low, high) in sorted(bounds.items()):
        key = "%d-%d" % (broker_id, p)
        if only and key not in only:
            continue
        start = _resolve(starts, key, low, high, EARLIEST)
        end = _resolve(ends, key, low, high, LATEST)
        if start < low:
            if fail_on_loss:
                raise DataLoss("%s %s: offset %d was deleted (the partition starts at %d now); "
                               "set failOnDataLoss=false to start there" % (topic, key, start, low))
            start = low
        if end > high:
            raise DataLoss("%s %s: ending offset %d is past the log end %d" % (topic, key, end, high))
        if start > end:
            raise ValueError("%s %s: starting offset %d is after the ending offset %d" % (topic, key, start, end))
        ranges.append(OffsetRange(topic, broker_id, p, start, end, urls[broker_id]))
    max_per = opts.get("maxoffsetsperpartition")
    return split_ranges(ranges, int(max_per) if max_per not in (None, "") else None)


def _resolve(spec, key, low, high, default):
    value = spec.get(key, default) if isinstance(spec, dict) else spec
    return low if value == EARLIEST else high if value == LATEST else value


def split_ranges(ranges, max_per_range=None):
    """``ranges`` with every range cut into consecutive pieces of at most ``max_per_range`` offsets.

    Empty ranges are dropped. The pieces cover exactly the same offsets: no gap, no overlap.
    """
    if max_per_range is not None and max_per_range < 1:
        raise ValueError("maxOffsetsPerPartition must be >= 1, got %r" % max_per_range)
    out = []
    for r in ranges:
        step = max_per_range or max(r.count, 1)
        for lo in range(r.start, r.end, step):
            out.append(r._replace(start=lo, end=min(lo + step, r.end)))
    return out


def read_range(r, fetch_bytes=DEFAULT_FETCH_BYTES, timeout=30.0, security=None):
    """Yield ``(topic, "b-p", offset, msg_id, attribute, value, timestamp)`` for every offset of ``r``, in order.

    Exactly ``r.count`` rows or an exception: DataLoss when the broker says an offset of the
    range no longer exists (301) or does not exist yet (404). ``security``: what
    ``metaq.client.security.resolve`` takes (the :func:`security_options` dict on an executor).
    """
    if r.count <= 0:
        return
    key = r.key
    conn = BrokerConnection(r.url, connect_timeout=timeout, request_timeout=timeout, heartbeat_interval=0,
                            security=client_security.resolve(security))
    try:
        offset = r.start
        while offset < r.end:
            reply = conn.call(ev.Get(r.topic, READER_GROUP, r.partition, offset, fetch_bytes, 0), timeout=timeout)
            try:
                records = records_of(reply, "get %s %s %d" % (r.topic, key, offset))
            except errors.Moved as exc:
                raise DataLoss("%s %s: offset %d is not in the partition any more (the broker points to %d)"
                               % (r.topic, key, offset, exc.offset)) from None
            if not records:
                raise DataLoss("%s %s: the partition ends before offset %d (range %d..%d)"
                               % (r.topic, key, offset, r.start, r.end))
            for record in records[: r.end - offset]:
                attribute, payload = decode_payload(record.flag, record.data)
                attribute = split_attribute(attribute)[0]  # the user's part, before any properties (as the client)
                ts = datetime.fromtimestamp(msg_timestamp_ms(record.msg_id) / 1000.0, tz=timezone.utc)
                yield (r.topic, key, offset, record.msg_id, attribute, bytes(payload), ts)
                offset += 1
    finally:
        conn.close()
