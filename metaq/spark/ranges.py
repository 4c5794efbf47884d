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

``startingTimestamp`` (ms since the Unix epoch), as in Spark's Kafka source: every partition starts at
the first offset the broker stored at or after that time (:func:`offsets_at_time`, the text extension
``offset_at``); it takes precedence over ``startingOffsets`` when both are given (as Spark's does). A
partition with no message stored since fails the read (Spark's default
``startingOffsetsByTimestampStrategy=error``) or, with ``startingOffsetsByTimestampStrategy=latest``,
starts at its end (an empty range).
"""

import json
from typing import NamedTuple

from metaq import errors
from metaq.client import security as client_security
from metaq.client.connection import BrokerConnection
from metaq.client.discovery import find_brokers
from metaq.client.message import Partition
from metaq.client.replies import reply_error
from metaq.limits import validate_topic
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.spark.rows import DEFAULT_FETCH_BYTES, SCHEMA_DDL, DataLoss, msg_timestamp_ms, read_rows

__all__ = ["OffsetRange", "DataLoss", "SCHEMA_DDL", "msg_timestamp_ms", "parse_offsets", "parse_timestamp",
           "partition_bounds", "offsets_at_time", "plan_ranges", "split_ranges", "read_range", "read_options",
           "arrow_options", "security_options"]

EARLIEST, LATEST = -2, -1
#: The source's connection options (lower-case) -> ``ClientSecurity.from_options`` argument. Files only: a
#: secret itself is never an option (options show in Spark's plans, UI and logs).
SECURITY_OPTIONS = {"credentials": "credentials", "user": "user", "secretfile": "secret_file", "tls": "tls",
                    "ca": "ca", "cert": "cert", "key": "key", "serverhostname": "server_hostname"}


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


def read_options(options):
    """Spark's options (any case) as a plain dict with lower-case keys."""
    return {str(k).lower(): v for k, v in dict(options or {}).items()}


def arrow_options(opts):
    """``(arrow, batch_rows)`` of a read's (lower-case) options, for the batch and the streaming source alike:
    ``arrow`` (default true) reads into Arrow batches (``metaq.spark.arrowread``), else row by row, and
    ``batch_rows`` is its ``maxrecordsperbatch`` (None when not Arrow). ValueError for a bad value."""
    value = str(opts.get("arrow", "true")).strip().lower()
    if value not in ("true", "false"):
        raise ValueError("option arrow must be true or false, got %r" % opts.get("arrow"))
    if value == "false":
        return False, None
    from metaq.spark.arrowread import batch_rows_option  # pyarrow and numpy: loaded for an Arrow read only

    return True, batch_rows_option(opts)


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
    """An offsets option: ``"earliest"``, ``"latest"`` or the JSON form -> ``EARLIEST``, ``LATEST`` or
    ``{key: offset}``.

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


def offsets_at_time(urls, topic, timestamp_ms, timeout=10.0, security=None):
    """``{(broker_id, partition): offset}``: for every partition of ``topic`` on the brokers ``urls``
    (``{broker_id: url}``) that holds messages, the first offset stored at or after ``timestamp_ms`` (ms since
    the Unix epoch); the partition's end when nothing was stored since, its first kept offset when the time is
    older. One connection per broker: ``stats offsets`` for its partitions, then one ``offset_at`` each
    (pipelined). Raises the broker's refusal as its error (``metaq.client.replies``)."""
    offsets = {}
    security = client_security.resolve(security)
    for broker_id, url in sorted(urls.items()):
        with BrokerConnection(url, connect_timeout=timeout, request_timeout=timeout, heartbeat_interval=0,
                              security=security) as conn:
            reply = conn.call(ev.Stats("offsets", 0), timeout=timeout)
            if reply.code != 200:
                raise reply_error(reply, "stats offsets on %s" % url)
            parts = sorted(r.partition for r in stats_codec.parse_offsets(reply.body) if r.topic == topic)
            futures = [(p, conn.request(ev.OffsetAt(topic, p, timestamp_ms, 0), timeout)) for p in parts]
            for p, future in futures:
                reply = future.result(timeout + 1.0)
                if not isinstance(reply, ev.Result) or reply.code != 200:
                    raise reply_error(reply, "offset_at %s %d %d on %s" % (topic, p, timestamp_ms, url))
                offsets[(broker_id, p)] = int(reply.body)
    return offsets


def parse_timestamp(text, name="startingTimestamp"):
    """A timestamp option: ms since the Unix epoch (a long >= 0, as Spark's Kafka source takes it); ValueError."""
    text = str(text).strip()
    if text.isascii() and text.isdigit():
        return int(text)
    raise ValueError("%s must be milliseconds since the Unix epoch (a single long value >= 0), got %r" % (name, text))


def _starts_at_time(opts, topic, urls, bounds, timeout, security):
    """``{key: offset}`` of ``startingTimestamp`` per ``startingOffsetsByTimestampStrategy``, or None without it."""
    if opts.get("startingtimestamp") in (None, ""):
        return None
    timestamp_ms = parse_timestamp(opts["startingtimestamp"])
    strategy = str(opts.get("startingoffsetsbytimestampstrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ValueError("startingOffsetsByTimestampStrategy must be 'error' or 'latest', got %r" % strategy)
    starts = {}
    for (broker_id, p), offset in offsets_at_time(urls, topic, timestamp_ms, timeout, security).items():
        key = "%d-%d" % (broker_id, p)
        end = bounds.get((broker_id, p), (offset, offset))[1]
        if offset >= end and strategy == "error":
            raise ValueError("startingTimestamp %d: no message of %s %s was stored at or after it (the partition "
                             "ends at offset %d); set startingOffsetsByTimestampStrategy=latest to start such "
                             "partitions at their end" % (timestamp_ms, topic, key, end))
        starts[key] = offset
    return starts


def _split_list(text):
    return [item.strip() for item in str(text or "").split(",") if item.strip()]


def plan_ranges(options):
    """The frozen ``[OffsetRange]`` a read with these options covers (sorted, split by ``maxOffsetsPerPartition``).

    Options (case-insensitive): ``topic``; ``brokers`` (``meta://h:p[,…]``) and/or ``zk``
    (``host:port[/chroot]``, with ``zkRoot``, default ``/meta``); ``startingOffsets``,
    ``endingOffsets``; ``startingTimestamp`` (ms since the Unix epoch; before ``startingOffsets``) and
    ``startingOffsetsByTimestampStrategy`` (``error`` or ``latest``: see the module docstring); ``partitions``
    (``"7-0,7-1"``: only these); ``maxOffsetsPerPartition``
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
    starts = _starts_at_time(opts, topic, urls, bounds, timeout, security)
    if starts is None:
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
            raise ValueError("partition %s of %s is not on any broker (known: %s)"
                             % (named, topic, ", ".join(sorted(known)) or "none"))
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
    """Yield the row (``metaq.spark.rows.COLUMNS``) of every offset of ``r``, in order.

    Exactly ``r.count`` rows or an exception: DataLoss when the broker says an offset of the
    range no longer exists (301) or does not exist yet (404). ``security``: what
    ``metaq.client.security.resolve`` takes (the :func:`security_options` dict on an executor).
    """
    return read_rows(r, fetch_bytes=fetch_bytes, timeout=timeout, security=security, fail_on_data_loss=True)
