"""``df.write.format("metaq")`` and ``df.writeStream.format("metaq")``: rows as messages, each stored once.

    (df.selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")
       .write.format("metaq").option("brokers", "meta://127.0.0.1:8123").option("topic", "orders").save())

Columns (any other column is an error: select the ones to write):

* ``value`` (binary or string, required): the message body; a null value fails the task;
* ``topic`` (string), or the ``topic`` option for rows without one;
* ``key`` (string): stored as the RocketMQ ``KEYS`` property and, without a ``partition``, it picks
  the partition (the same key, the same partition, while the topic's partitions stay the same);
* ``partition``: ``"<brokerId>-<p>"`` or an int (an index into the topic's partitions, sorted);
  without it and without a key, a task spreads its rows round-robin;
* ``attribute`` (string) and ``properties`` (map<string,string>): as ``metaq.client.Message`` has them.

**Exactly once.** Every task writes through an idempotent producer (``metaq.client.Producer(idempotent=True)``)
whose producer id is derived from what identifies the task's data: for a stream, the query id (kept in the
checkpoint), the micro-batch id and the task's partition; for a batch write, a random id drawn when the
write is planned and the task's partition. A retried task, a speculative copy, or a micro-batch replayed
after the driver restarted from its checkpoint sends the same rows with the same producer id and the same
sequence numbers, and the broker answers each one it already stored with the original offset instead of
storing it twice. This holds when the rows of a task arrive in the same order each time it runs (true of
a query that reads metaq or files and does not shuffle; after a shuffle, sort within partitions) and the
topic's partitions do not change in between; a row that differs from what was stored under its
sequence fails the task instead of being taken for a duplicate.

**Arrow.** The writers are pyspark's Arrow writers where it has them (``write`` receives record batches,
:func:`write_any`): a write of a ``value`` column alone to the ``topic`` option goes through
``Producer.send_many`` (:func:`write_value_batches`); an idempotent one through the idempotent producer's
``send_many`` (``putb_idem`` frames), whose per-partition sequences are the ones :func:`write_rows` gives the
same rows (the same producer id, the same round-robin partitions, each partition's rows numbered from 0 in
task order), so a retried task is answered as duplicates whichever path either run took. Every other write
is turned into rows for :func:`write_rows`, so the protocol above is unchanged.

Options: ``brokers`` or ``zk`` (``zkRoot``), ``topic``, ``maxInFlight`` (puts in flight per task, default
``DEFAULT_IN_FLIGHT``), ``timeoutSeconds`` (per put, with retries, default 30), ``idempotent`` (default true),
and the connection options of the source (``credentials``, ``tls`` …).
"""

import hashlib
import itertools
import logging
import os
from collections import deque

from metaq import errors, limits
from metaq.spark import limits as spark_limits
from metaq.client import security as client_security
from metaq.client.message import Message, Partition
from metaq.protocol.properties import PROPERTY_SEPARATOR
from metaq.protocol.properties import PROP_KEYS
from metaq.spark.ranges import read_options, security_options

__all__ = ["SinkOptions", "SinkError", "check_columns", "producer_id_of", "choose", "write_rows",
           "MetaQDataSourceWriter", "MetaQStreamWriter", "DEFAULT_IN_FLIGHT"]

log = logging.getLogger(__name__)

#: Puts a sink task keeps in flight (pipelined) before it waits for the oldest answer.
DEFAULT_IN_FLIGHT = 256
#: The columns the sink reads.
SINK_COLUMNS = ("value", "topic", "key", "partition", "attribute", "properties")
MAX_PRODUCER_ID = 2 ** 63 - 1


class SinkError(errors.ClientError):
    """A row cannot be written (no value, unknown topic or partition, too large, refused)."""


class SinkOptions:
    """The sink's options, checked on the driver (ValueError with the reason)."""

    def __init__(self, options):
        opts = read_options(options)
        self.brokers = [b.strip() for b in str(opts.get("brokers") or "").split(",") if b.strip()]
        self.zk = opts.get("zk") or None
        self.zk_root = opts.get("zkroot", "/meta")
        if not self.brokers and not self.zk:
            raise ValueError("the metaq sink needs the option 'brokers' (meta://host:port,...) or 'zk'")
        self.topic = limits.validate_topic(opts["topic"]) if opts.get("topic") else None
        self.in_flight = int(opts.get("maxinflight", DEFAULT_IN_FLIGHT))
        if not 1 <= self.in_flight <= spark_limits.MAX_SINK_IN_FLIGHT:
            raise ValueError("maxInFlight must be 1..%d, got %d" % (spark_limits.MAX_SINK_IN_FLIGHT, self.in_flight))
        self.timeout = float(opts.get("timeoutseconds", 30))
        self.idempotent = str(opts.get("idempotent", "true")).strip().lower() != "false"
        self.security = security_options(opts)
        self.partitions = {}  # {topic: [Partition]} fixed when the write is planned (plan_partitions)


def plan_partitions(opts, topic):
    """``topic``'s partitions, sorted, asked from every broker when the write is planned: the list every task,
    and every retry of a task, maps its rows onto (so a retry sends a row where its first attempt did).

    A listed broker that cannot be reached fails the write here (its partitions would be missing from the list,
    and a retry would then map rows elsewhere). A broker without the topic yet offers its partition 0 (the
    topic is created by its first put)."""
    from metaq.client.connection import BrokerConnection
    from metaq.client.discovery import find_brokers, partition_count_from_stats
    from metaq.protocol import events as ev

    security = client_security.resolve(opts.security)
    try:
        urls = find_brokers(opts.brokers, opts.zk, opts.zk_root, min(opts.timeout, 10.0), security)
    except (OSError, errors.Unavailable) as exc:
        raise errors.Unavailable("the metaq sink plans where rows go with every broker, and one cannot be reached: "
                                 "%s" % exc) from None
    parts = []
    for broker_id, url in sorted(urls.items()):
        with BrokerConnection(url, connect_timeout=opts.timeout, request_timeout=opts.timeout, heartbeat_interval=0,
                              security=security) as conn:
            count = partition_count_from_stats(conn.call(ev.Stats(topic, 0), timeout=opts.timeout))
        parts.extend(Partition(broker_id, p) for p in range(max(count, 1)))
    if not parts:
        raise errors.Unavailable("the metaq sink found no broker for topic %s" % topic)
    return sorted(parts)


#: The Spark types (``DataType.simpleString()``) each column may have; the key is written as text (``str``).
COLUMN_TYPES = {"value": ("binary", "string"), "topic": ("string",), "attribute": ("string",),
                "partition": ("string", "tinyint", "smallint", "int", "bigint"),
                "properties": ("map<string,string>",)}


def check_columns(names, opts, types=None):
    """Refuse a schema the sink cannot write (ValueError naming the problem); ``types``: ``{name: simpleString}``."""
    names = list(names)
    for name, kind in sorted((types or {}).items()):
        allowed = COLUMN_TYPES.get(name)
        if allowed and kind not in allowed:
            raise ValueError("the metaq sink's column '%s' must be %s, not %s (cast it)"
                             % (name, " or ".join(allowed), kind))
    unknown = [n for n in names if n not in SINK_COLUMNS]
    if unknown:
        raise ValueError("the metaq sink writes the columns %s; these are not among them: %s (select the "
                         "columns to write)" % (", ".join(SINK_COLUMNS), ", ".join(unknown)))
    if "value" not in names:
        raise ValueError("the metaq sink needs a 'value' column (binary or string)")
    if "topic" not in names and opts.topic is None:
        raise ValueError("the metaq sink needs a 'topic' column or the 'topic' option")


def producer_id_of(*parts):
    """A producer id (1 .. 2**63-1) derived from ``parts``: the same parts, the same id, in any process."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode("utf-8")).digest()
    return (int.from_bytes(digest[:8], "big") & MAX_PRODUCER_ID) or 1


def choose(partitions, row_index, key, partition):
    """The partition of a row among the topic's ``partitions`` (sorted): the ``partition`` column, else the key's
    hash, else round-robin by the row's index in the task. SinkError for a partition the topic lacks."""
    if partition is not None:
        if isinstance(partition, bool):
            raise SinkError("partition must be '<brokerId>-<p>' or an index, got %r" % partition)
        if isinstance(partition, int):
            if not 0 <= partition < len(partitions):
                raise SinkError("partition %d is not an index of the topic's %d partitions"
                                % (partition, len(partitions)))
            return partitions[partition]
        try:
            wanted = Partition.parse(str(partition))
        except ValueError as exc:
            raise SinkError(str(exc)) from None
        if wanted not in partitions:
            raise SinkError("partition %s is not one of the topic's (%s)" % (wanted, ", ".join(map(str, partitions))))
        return wanted
    if key is not None:
        import zlib

        return partitions[zlib.crc32(key.encode("utf-8")) % len(partitions)]
    return partitions[row_index % len(partitions)]


class _Chosen:
    """The sink's selector: the partition the sink chose travels in ``Message.key`` (never sent)."""

    ordered = True

    def select(self, topic, partitions, message):
        return message.key


def _field(row, name):
    try:
        return row[name]
    except (KeyError, ValueError, IndexError):
        return None


def write_rows(rows, opts, producer_id, producer_factory=None):
    """Send every row; ``{"rows": n, "duplicates": d, "producer_id": id}`` once all are stored.

    Raises SinkError naming the row's position in the task for the first row that cannot be written
    (the task fails: Spark retries it, and the retry's rows already stored are answered as duplicates).
    """
    from metaq.client.producer import Producer

    rows = iter(rows)
    first = next(rows, None)
    if first is None:  # an empty task (most of them after a shuffle): no producer, no connection
        return {"rows": 0, "duplicates": 0, "producer_id": producer_id}
    factory = producer_factory or Producer
    kwargs = {"send_timeout": min(10.0, opts.timeout), "retry_deadline": opts.timeout, "selector": _Chosen(),
              "security": client_security.resolve(opts.security)}
    if opts.idempotent:
        kwargs.update(idempotent=True, producer_id=producer_id)
    producer = factory(zk_connect=opts.zk, zk_root=opts.zk_root, **kwargs) if opts.zk else \
        factory(brokers=opts.brokers, **kwargs)
    parts_of, pending = {}, deque()
    sent = duplicates = 0
    try:
        for index, row in enumerate(itertools.chain((first,), rows)):
            message = _message_of(row, index, opts, producer, parts_of)
            pending.append((index, _send(producer, index, message)))
            while len(pending) >= opts.in_flight:
                duplicates += _settle(*pending.popleft(), opts)
            sent += 1
        while pending:
            duplicates += _settle(*pending.popleft(), opts)
    finally:
        producer.close()
    return {"rows": sent, "duplicates": duplicates, "producer_id": producer_id}


def write_any(items, opts, producer_id, producer_factory=None):
    """``write_rows`` for what a Spark writer's ``write`` receives: rows, or Arrow record batches (the Arrow writers).

    Batches whose only column is ``value`` go through :func:`write_value_batches` (``Producer.send_many``: no
    Python object per row but its bytes; idempotent or not, as the sink is); any other batches are turned into
    rows for :func:`write_rows`, so every column means what it means there."""
    items = iter(items)
    first = next(items, None)
    if first is None:
        return {"rows": 0, "duplicates": 0, "producer_id": producer_id}
    items = itertools.chain((first,), items)
    if not hasattr(first, "schema") or not hasattr(first, "num_rows"):  # rows (a row writer)
        return write_rows(items, opts, producer_id, producer_factory)
    if first.schema.names == ["value"] and opts.topic is not None:
        if not opts.idempotent:
            return write_value_batches(items, opts, producer_id, producer_factory)
        seen = []  # the task's batches so far: the row writer runs them again if a call is refused
        try:
            return write_value_batches(_kept(items, seen), opts, producer_id, producer_factory)
        except _Refused:
            rows = (row for batch in itertools.chain(seen, items) for row in batch.to_pylist())
            return write_rows(rows, opts, producer_id, producer_factory)
    return write_rows((row for batch in items for row in batch.to_pylist()), opts, producer_id, producer_factory)


class _Refused(SinkError):
    """An idempotent ``send_many`` call refused by the broker (nothing of it stored)."""


def _kept(items, seen):
    for batch in items:
        seen.append(batch)
        yield batch


def write_value_batches(batches, opts, producer_id, producer_factory=None):
    """Send the ``value`` column of Arrow ``batches`` to ``opts.topic`` with ``Producer.send_many``, round-robin over
    the topic's partitions by the row's index in the task (as :func:`choose` spreads rows without a key): one call
    per partition per batch. A batch's calls all go before any is waited for (the partitions' lanes work together,
    each behind its earlier frames), then the earlier batches' calls are answered down to ``opts.in_flight`` rows:
    at most the batch and ``opts.in_flight`` rows before it unanswered. With ``opts.idempotent`` the producer is the
    task's idempotent one (``producer_id``): each partition's rows get sequences 0, 1, ... in task order, as
    :func:`write_rows` numbers them, and rows already stored come back as duplicates (counted); else the plain
    sink's at-least-once. SinkError naming the row for a null value or one that cannot be sent, and naming the
    batch's first row for a refused call.

    An idempotent call the broker refused (``_Refused``: a row over its body limit, a frame over its limit)
    makes :func:`write_any` run the task's rows again through :func:`write_rows` with the same producer id,
    as a retried task would: the rows stored so far are answered as duplicates (the same sequences), and a bad
    row is named as the row writer names it. The partition's later frames are refused as a gap meanwhile, so
    nothing is stored under another sequence."""
    import pyarrow as pa

    from metaq.client.producer import Producer

    factory = producer_factory or Producer
    kwargs = {"send_timeout": min(10.0, opts.timeout), "retry_deadline": opts.timeout,
              "security": client_security.resolve(opts.security)}
    if opts.idempotent:
        kwargs.update(idempotent=True, producer_id=producer_id)
    producer = factory(zk_connect=opts.zk, zk_root=opts.zk_root, **kwargs) if opts.zk else \
        factory(brokers=opts.brokers, **kwargs)
    topic, parts = opts.topic, opts.partitions.get(opts.topic)
    pending, in_flight, index, duplicates = deque(), 0, 0, [0]
    try:
        if parts is None:
            found = producer.partitions(topic)
            parts = sorted({p if p.partition >= 0 else Partition(p.broker_id, 0) for p in found})
        if not parts:
            raise SinkError("no broker takes topic %s" % topic)
        n = len(parts)
        for batch in batches:
            if not batch.num_rows:
                continue
            column = batch.column(0)
            if column.null_count:
                k = column.is_null().to_pylist().index(True)
                raise SinkError("row %d of this task has no value (a null 'value' column)" % (index + k))
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                column = column.cast(pa.binary())
            values = column.to_pylist()
            for j in range(min(n, len(values))):  # this batch's calls all go: every partition's lane busy at once
                chunk = values[j::n]
                target = parts[(index + j) % n]
                try:
                    future = producer.send_many(topic, chunk, partition=target)
                except (ValueError, TypeError, errors.MetaqError) as exc:
                    raise SinkError("rows %d.. of this task cannot be sent: %s" % (index, exc)) from None
                pending.append((index + j, len(chunk), future))
                in_flight += len(chunk)
            while in_flight - len(values) > opts.in_flight:  # earlier batches' calls (queued first), oldest first
                in_flight -= _settle_many(*pending.popleft(), opts, duplicates)
            index += len(values)
        while pending:
            _settle_many(*pending.popleft(), opts, duplicates)
    finally:
        producer.close()
    return {"rows": index, "duplicates": duplicates[0], "producer_id": producer_id}


def _settle_many(first_row, count, future, opts, duplicates):
    """The rows of one ``send_many`` call stored (their duplicates added to ``duplicates[0]``), else SinkError."""
    try:
        result = future.result(opts.timeout + 30.0)
    except TimeoutError:
        raise SinkError("rows from %d of this task got no answer in %.0f s" % (first_row, opts.timeout + 30.0)) \
            from None
    if not result.success:
        kind = _Refused if (opts.idempotent and isinstance(result.error, errors.MetaqError)
                            and 400 <= getattr(result.error, "code", 0) < 500) else SinkError
        raise kind("a send_many of %d rows from row %d of this task was not stored whole: %s"
                   % (count, first_row, result.error))
    duplicates[0] += result.duplicates
    return count


def _message_of(row, index, opts, producer, parts_of):
    value = _field(row, "value")
    if value is None:
        raise SinkError("row %d of this task has no value (a null 'value' column)" % index)
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif not isinstance(value, (bytes, bytearray, memoryview)):  # bytes(5) would be five zero bytes
        raise SinkError("row %d of this task: 'value' must be binary or a string, got %s"
                        % (index, type(value).__name__))
    topic = _field(row, "topic") or opts.topic
    if topic is None:
        raise SinkError("row %d of this task has no topic (a null 'topic' column and no 'topic' option)" % index)
    parts = parts_of.get(topic) or opts.partitions.get(topic)
    if parts is None:
        try:
            limits.validate_topic(topic)
        except errors.MetaqError as exc:
            raise SinkError("row %d of this task: %s" % (index, exc)) from None
        found = producer.partitions(topic)
        # A topic no broker holds yet (created by its first put) is offered as partition -1 of each broker that
        # would take it: the sink writes to partition 0 there (an idempotent put names its partition).
        parts = parts_of[topic] = sorted({p if p.partition >= 0 else Partition(p.broker_id, 0) for p in found})
        parts_of[(topic, "new")] = any(p.partition < 0 for p in found)
        if not parts:
            raise SinkError("row %d of this task: no broker takes topic %s" % (index, topic))
    key = _field(row, "key")
    props = dict(_field(row, "properties") or {})
    if key is not None and str(key) != "":  # a property cannot be empty: "" picks a partition, nothing is stored
        props[PROP_KEYS] = str(key)
    try:
        target = choose(parts, index, None if key is None else str(key), _field(row, "partition"))
    except SinkError as exc:
        new = " (topic %s has no data yet: until its first put creates it, the sink sees partition 0 of each broker)" \
            % topic if parts_of.get((topic, "new")) else ""
        raise SinkError("row %d of this task: %s%s" % (index, exc, new)) from None
    attribute = _field(row, "attribute")
    if attribute is not None and PROPERTY_SEPARATOR in str(attribute):  # read back, it would end at the \x02
        raise SinkError("row %d of this task: the attribute %r holds \\x02, which marks where properties start"
                        % (index, attribute))
    try:
        return Message(topic, bytes(value), attribute, key=target, properties=props or None)
    except (ValueError, TypeError) as exc:
        raise SinkError("row %d of this task cannot be sent: %s" % (index, exc)) from None


def _send(producer, index, message):
    try:
        return producer.send_async(message)
    except (ValueError, TypeError, errors.MetaqError) as exc:  # too large, a property it cannot encode ...
        raise SinkError("row %d of this task cannot be sent: %s" % (index, exc)) from None


def _settle(index, future, opts):
    try:
        result = future.result(opts.timeout + 30.0)
    except TimeoutError:
        raise SinkError("row %d of this task got no answer in %.0f s" % (index, opts.timeout + 30.0)) from None
    if not result.success:
        raise SinkError("row %d of this task was not stored: %s" % (index, result.error))
    return 1 if getattr(result, "duplicate", False) else 0


def _task_partition():
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx, (ctx.partitionId() if ctx is not None else 0)


try:  # Spark >= 4.0
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
except ImportError:  # pragma: no cover - Spark 3.5
    DataSourceWriter = DataSourceStreamWriter = None
try:  # Arrow writers (Spark >= 4.0 has the batch one; the stream one came later)
    from pyspark.sql.datasource import DataSourceArrowWriter
except ImportError:  # pragma: no cover
    DataSourceArrowWriter = None
try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover
    DataSourceStreamArrowWriter = None


if DataSourceWriter is not None:

    class SinkCommit(WriterCommitMessage):
        """What one task wrote: rows, duplicates answered, its producer id."""

        def __init__(self, stats):
            self.stats = stats

    class MetaQDataSourceWriter(DataSourceArrowWriter or DataSourceWriter):
        """``df.write.format("metaq")``: one idempotent producer per task, its id drawn when the write is planned."""

        def __init__(self, options, schema):
            self.opts = SinkOptions(options)
            check_columns(schema.fieldNames(), self.opts, _types(schema))
            if self.opts.topic is not None:
                self.opts.partitions[self.opts.topic] = plan_partitions(self.opts, self.opts.topic)
            self.write_id = os.urandom(16).hex()  # pickled to the tasks: a retried task gets the same id
            self.totals = None

        def write(self, iterator):
            _ctx, part = _task_partition()
            return SinkCommit(write_any(iterator, self.opts, producer_id_of("batch", self.write_id, part)))

        def commit(self, messages):
            self.totals = _totals(messages)
            log.info("metaq sink: %(rows)d rows written (%(duplicates)d duplicates answered)", self.totals)

    class MetaQStreamWriter(DataSourceStreamArrowWriter or DataSourceStreamWriter):
        """``df.writeStream.format("metaq")``: producer ids from (query id, batch id, task partition)."""

        def __init__(self, options, schema):
            self.opts = SinkOptions(options)
            check_columns(schema.fieldNames(), self.opts, _types(schema))
            if self.opts.topic is not None:
                self.opts.partitions[self.opts.topic] = plan_partitions(self.opts, self.opts.topic)

        def write(self, iterator):
            ctx, part = _task_partition()
            query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
            batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
            if query is None or batch is None:
                raise SinkError("the metaq stream sink could not read the query id and batch id of this task "
                                "(Spark local properties sql.streaming.queryId / streaming.sql.batchId)")
            return SinkCommit(write_any(iterator, self.opts, producer_id_of("stream", query, batch, part)))

        def commit(self, messages, batchId):
            log.info("metaq sink: batch %d: %s", batchId, _totals(messages))

        def abort(self, messages, batchId):
            log.warning("metaq sink: batch %d aborted after %s (its rows stored so far are answered as duplicates "
                        "when it runs again)", batchId, _totals(messages))

else:  # pragma: no cover - Spark 3.5
    MetaQDataSourceWriter = MetaQStreamWriter = None


def _types(schema):
    return {f.name: f.dataType.simpleString() for f in schema.fields}


def _totals(messages):
    out = {"rows": 0, "duplicates": 0, "tasks": 0}
    for m in messages or ():
        stats = getattr(m, "stats", None)
        if stats:
            out["rows"] += stats["rows"]
            out["duplicates"] += stats["duplicates"]
            out["tasks"] += 1
    return out
