"""``spark.readStream.format("metaq")``: topics as an unbounded stream (PySpark's Python streaming source API).

    from metaq.spark import register
    register(spark)
    stream = (spark.readStream.format("metaq")
              .option("brokers", "meta://127.0.0.1:8123")   # or .option("zk", "127.0.0.1:2181")
              .option("subscribe", "orders,refunds")        # or .option("subscribePattern", "orders-.*")
              .option("startingOffsets", "earliest")        # default latest; or JSON, or startingTimestamp
              .option("maxOffsetsPerTrigger", 100000)       # optional: at most this many messages a batch
              .load())

The options are named as in Spark's Kafka source where the idea is the same:

* ``subscribe`` (topics, comma-separated) or ``subscribePattern`` (a regular expression a whole
  topic name must match; the broker's internal topics never match);
* ``startingOffsets``: ``latest`` (the default), ``earliest`` or JSON
  ``{"<topic>": {"<brokerId>-<partition>": offset}}`` (-2 earliest, -1 latest; partitions not named
  start at latest); ``startingTimestamp`` (ms since the epoch) starts every partition at its first
  message stored at or after that time and takes precedence over ``startingOffsets``. Both apply
  only when a query starts without a checkpoint; a restarted query goes on from its checkpoint.
* ``maxOffsetsPerTrigger``: at most this many messages a micro-batch, shared among the partitions in
  proportion to their backlog; ``minPartitions``: cut the batch's ranges so that there are at least
  this many Spark tasks; ``maxOffsetsPerPartition``: no task reads more than this many offsets;
* ``failOnDataLoss`` (default true): offsets the stream had not read yet that retention deleted (or
  that a cut log no longer holds) fail the query with a message naming the range; false skips them
  with a WARNING line naming it;
* ``maxRecordsPerBatch``: rows per Arrow batch a task yields (default 10,000; 1 ..
  ``limits.MAX_ARROW_BATCH_ROWS``); ``arrow=false`` reads row by row instead (the same rows, slower);
* ``group``: after each finished micro-batch its end offsets are committed for this consumer group
  (in ZooKeeper with ``zk``, else in the brokers), so ``metaq-admin`` and ``metaq-spark-report``
  show the stream's lag. The checkpoint, not the group, is where the query resumes from;
* connection options as in the batch source (``credentials`` …, ``tls`` …).

Offsets (what Spark writes in the checkpoint) are ``{"<topic>": {"<brokerId>-<p>": next offset}}``.
Partitions and brokers that appear while the query runs are picked up between micro-batches: a new
partition enters the offsets at its first kept offset in one batch and is read from the next, so a
batch replayed after a restart reads exactly the offsets it read the first time. A broker that
cannot be reached keeps its partitions where they are (a WARNING line) until it is back.
"""

import json
import logging
import re

from metaq import errors
from metaq.client import security as client_security
from metaq.client.message import Partition
from metaq.limits import validate_topic
from metaq.spark.limits import MAX_STREAM_TASKS
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.spark.brokers import BrokerView, is_unreachable
from metaq.spark.ranges import OffsetRange, arrow_options, read_options, security_options, split_ranges
from metaq.spark.rows import DataLoss

__all__ = ["StreamOptions", "parse_stream_options", "starting_offsets", "next_end", "plan_stream_ranges",
           "offsets_json", "MetaQStreamReader"]

log = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1


class StreamOptions:
    """The streaming source's options, checked once (ValueError with the reason for a bad one)."""

    def __init__(self, options):
        opts = read_options(options)
        self.raw = opts
        self.brokers = [b.strip() for b in str(opts.get("brokers") or "").split(",") if b.strip()]
        self.zk = opts.get("zk") or None
        self.zk_root = opts.get("zkroot", "/meta")
        if not self.brokers and not self.zk:
            raise ValueError("the metaq source needs the option 'brokers' (meta://host:port,...) or 'zk'")
        subscribe, pattern = opts.get("subscribe"), opts.get("subscribepattern")
        if opts.get("topic") and not subscribe:
            subscribe = opts.get("topic")
        if bool(subscribe) == bool(pattern):
            raise ValueError("give exactly one of the options 'subscribe' (topics, comma-separated) and "
                             "'subscribePattern' (a regular expression)")
        self.topics = [validate_topic(t.strip()) for t in str(subscribe or "").split(",") if t.strip()]
        if subscribe and not self.topics:
            raise ValueError("'subscribe' names no topic: %r" % subscribe)
        try:
            self.pattern = re.compile(pattern) if pattern else None
        except re.error as exc:
            raise ValueError("'subscribePattern' is not a regular expression: %s" % exc) from None
        self.starting = opts.get("startingoffsets")
        self.starting_ts = _opt_int(opts, "startingtimestamp", 0)
        self.max_per_trigger = _opt_int(opts, "maxoffsetspertrigger", 1)
        self.min_partitions = _opt_int(opts, "minpartitions", 1)
        if self.min_partitions is not None and self.min_partitions > MAX_STREAM_TASKS:
            raise ValueError("option minPartitions must be <= %d, got %d" % (MAX_STREAM_TASKS, self.min_partitions))
        self.max_per_partition = _opt_int(opts, "maxoffsetsperpartition", 1)
        self.fail_on_data_loss = str(opts.get("failondataloss", "true")).strip().lower() != "false"
        self.group = opts.get("group") or None
        self.timeout = float(opts.get("timeoutseconds", 10))
        self.security = security_options(opts)
        self.fetch_bytes = int(opts.get("fetchbytes", 1 << 20))
        self.arrow, self.batch_rows = arrow_options(opts)

    def subscribed(self, topic):
        """True when ``topic`` is one this stream reads."""
        if self.pattern is not None:
            return topic != SCHEDULE_TOPIC and self.pattern.fullmatch(topic) is not None
        return topic in self.topics


def _opt_int(opts, name, low):
    value = opts.get(name)
    if value in (None, ""):
        return None
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise ValueError("option %s must be an integer, got %r" % (name, value)) from None
    if value < low:
        raise ValueError("option %s must be >= %d, got %d" % (name, low, value))
    return value


def parse_stream_options(options):
    """``StreamOptions`` of Spark's options (any case)."""
    return StreamOptions(options)


def _parse_starting(text, topics_known):
    """``startingOffsets`` -> EARLIEST, LATEST or ``{topic: {key: offset}}`` (ValueError when malformed)."""
    if text is None or str(text).strip() in ("", "latest"):
        return LATEST
    text = str(text).strip()
    if text == "earliest":
        return EARLIEST
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise ValueError("startingOffsets must be 'earliest', 'latest' or JSON like {\"orders\": {\"0-0\": 42}}, "
                         "got %r" % text)
    out = {}
    for topic, parts in doc.items():
        if not topics_known(topic):
            raise ValueError("startingOffsets names topic %r, which this stream does not subscribe to" % topic)
        for key, offset in parts.items():
            Partition.parse(key)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < -2:
                raise ValueError("starting offset of %s %s must be an integer >= 0 (or -2 earliest, -1 latest), "
                                 "got %r" % (topic, key, offset))
            out.setdefault(topic, {})[key] = offset
    return out


def starting_offsets(opts, bounds, at_time=None):
    """The first batch's start, ``{topic: {key: offset}}``, for ``bounds`` ``{(topic, key): (low, high)}``.

    ``at_time`` is ``{(topic, key): offset}`` when ``startingTimestamp`` is given (it wins). Raises
    ValueError for a malformed ``startingOffsets`` or one naming a partition that does not exist, and
    DataLoss for a named offset below the partition's first kept one (with ``failOnDataLoss``).
    """
    spec = _parse_starting(opts.starting, opts.subscribed)
    out = {}
    if isinstance(spec, dict):
        for topic, parts in spec.items():
            for key in parts:
                if (topic, key) not in bounds:
                    known = sorted(k for t, k in bounds if t == topic)
                    raise ValueError("startingOffsets names partition %s of %s, which is not on any broker "
                                     "(known: %s)" % (key, topic, ", ".join(known) or "none"))
    for (topic, key), (low, high) in sorted(bounds.items()):
        if at_time is not None:
            offset = at_time.get((topic, key), high)
        else:
            value = spec.get(topic, {}).get(key, LATEST) if isinstance(spec, dict) else spec
            offset = low if value == EARLIEST else high if value == LATEST else value
        if offset < low:
            if opts.fail_on_data_loss:
                raise DataLoss("%s %s: starting offset %d was deleted (the partition starts at %d now); set "
                               "failOnDataLoss=false to start there" % (topic, key, offset, low))
            offset = low
        out.setdefault(topic, {})[key] = offset
    return out


def _share(limit, backlog):
    """``{key: n}`` with ``sum(n) == min(limit, sum(backlog))``, each n <= its backlog, in proportion to it.

    Largest remainders, ties broken by key order, so the same inputs always give the same shares.
    """
    total = sum(backlog.values())
    if limit is None or total <= limit:
        return dict(backlog)
    exact = {k: limit * v / total for k, v in backlog.items()}
    out = {k: int(x) for k, x in exact.items()}
    rest = limit - sum(out.values())
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[:rest]:
        out[k] += 1
    return out


def next_end(start, bounds, max_per_trigger=None):
    """The next batch's end offsets: every known partition at its log end, ``max_per_trigger`` at most in all.

    ``start`` is the previous end; ``bounds`` ``{(topic, key): (low, high)}`` the partitions reachable now.
    A partition new to ``start`` enters at its first kept offset (``low``: nothing read from it in this
    batch). A partition of ``start`` missing from ``bounds`` (its broker unreachable) stays where it is.
    An end never goes below the start (a log cut below it is the reader's data loss to report).
    """
    end = {topic: dict(parts) for topic, parts in start.items()}
    backlog = {}
    for (topic, key), (low, high) in sorted(bounds.items()):
        parts = end.setdefault(topic, {})
        if key not in parts:
            parts[key] = low
            continue
        if high > max(parts[key], low):  # (a Trigger.AvailableNow target can be below a log start that moved)
            backlog[(topic, key)] = high - max(parts[key], low)
    for (topic, key), n in _share(max_per_trigger, backlog).items():
        low = bounds[(topic, key)][0]
        end[topic][key] = max(end[topic][key], low) + n
    return end


def cut_logs(start, bounds):
    """``[(topic, key, high, position)]``: partitions whose log now ends below the stream's position in ``start``.

    Their log was cut (a failover to a slave that lacked its tail, a wiped broker): the next messages stored
    there take offsets the stream holds for read, and would be skipped without a word."""
    return [(topic, key, high, start[topic][key]) for (topic, key), (_low, high) in sorted(bounds.items())
            if key in start.get(topic, {}) and high < start[topic][key]]


def offsets_json(offsets):
    """Offsets as the JSON-safe dict Spark keeps in its checkpoint (sorted keys, plain ints)."""
    return {topic: {key: int(off) for key, off in sorted(parts.items())} for topic, parts in sorted(offsets.items())}


def plan_stream_ranges(start, end, bounds, urls, opts):
    """The ``[OffsetRange]`` of one micro-batch ``start -> end`` (sorted: the same batch gives the same ranges).

    Offsets below a partition's first kept one (deleted by retention) follow ``failOnDataLoss``:
    DataLoss naming the range, or a WARNING line and a start at the first kept offset.
    """
    ranges = []
    for topic, parts in sorted(end.items()):
        for key, stop in sorted(parts.items()):
            begin = start.get(topic, {}).get(key, stop)
            part = Partition.parse(key)
            if stop <= begin:
                continue
            low = bounds.get((topic, key), (begin, stop))[0]
            if begin < low:
                if opts.fail_on_data_loss:
                    raise DataLoss("%s %s: offsets %d..%d were deleted by retention before the stream read them "
                                   "(the partition starts at %d now); set failOnDataLoss=false to skip them"
                                   % (topic, key, begin, min(low, stop) - 1, low))
                log.warning("%s %s: skipping offsets %d..%d, deleted by retention before the stream read them "
                            "(failOnDataLoss=false)", topic, key, begin, min(low, stop) - 1)
                begin = min(low, stop)
            if part.broker_id not in urls:
                raise errors.Unavailable("%s %s: broker %d is not reachable to read offsets %d..%d"
                                         % (topic, key, part.broker_id, begin, stop - 1))
            if stop > begin:
                ranges.append(OffsetRange(topic, part.broker_id, part.partition, begin, stop, urls[part.broker_id]))
    ranges = split_to_at_least(split_ranges(ranges, opts.max_per_partition), opts.min_partitions)
    if len(ranges) > MAX_STREAM_TASKS:
        raise ValueError("maxOffsetsPerPartition=%s cuts this micro-batch into %d tasks, more than %d: raise it, or "
                         "bound the batch with maxOffsetsPerTrigger" % (opts.max_per_partition, len(ranges),
                                                                        MAX_STREAM_TASKS))
    return ranges


def split_to_at_least(ranges, min_partitions):
    """``ranges`` cut so that there are at least ``min_partitions`` of them (the largest cut first), when
    they hold that many offsets; the same offsets, no gap, no overlap, in the same order."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.count for r in ranges)
    if total <= len(ranges):
        return ranges
    out = []
    for r in ranges:
        pieces = max(1, min(r.count, round(min_partitions * r.count / total)))
        step = -(-r.count // pieces)
        out.extend(r._replace(start=lo, end=min(lo + step, r.end)) for lo in range(r.start, r.end, step))
    return out


def discover(view, strict=False):
    """``(urls, bounds)`` now: ``{broker_id: url}`` of the brokers that answered and ``{(topic, key): (low, high)}``
    of their partitions of the subscribed topics, asked through ``view`` (a ``BrokerView``: connections kept).
    A broker that cannot be reached is left out with a WARNING line (its partitions wait); ZooKeeper that cannot
    be reached, refused credentials and TLS failures raise.

    ``strict`` (where a new query starts): a listed broker that cannot be reached, or no broker at all, raises
    Unavailable instead; its partitions would otherwise join later at their first offset, whatever
    ``startingOffsets`` said."""
    opts = view.opts
    urls, failed = view.masters()
    for url, exc in failed:
        if strict:
            raise errors.Unavailable("metaq stream: broker %s cannot be reached (%s): a new query needs every "
                                     "listed broker to know where it starts" % (url, exc))
        log.warning("metaq stream: broker %s cannot be reached (%s); its partitions wait", url, exc)
    if strict and not urls:
        raise errors.Unavailable("metaq stream: no broker is registered in ZooKeeper %s under %s"
                                 % (opts.zk, opts.zk_root))
    reachable, bounds = {}, {}
    for broker_id, url in sorted(urls.items()):
        try:
            reply = view.call(url, ev.Stats("offsets", 0))
        except Exception as exc:
            if not is_unreachable(exc):
                raise
            if strict:
                raise errors.Unavailable("metaq stream: broker %d (%s) cannot be reached (%s): a new query needs "
                                         "every broker to know where it starts" % (broker_id, url, exc)) from None
            log.warning("metaq stream: broker %d (%s) cannot be reached (%s); its partitions wait", broker_id, url, exc)
            continue
        if reply.code != 200:
            raise errors.RemoteProtocolError("stats offsets on %s answered %d" % (url, reply.code))
        reachable[broker_id] = url
        for r in stats_codec.parse_offsets(reply.body):
            if opts.subscribed(r.topic):
                bounds[(r.topic, "%d-%d" % (broker_id, r.partition))] = (r.min_offset, r.max_offset)
    return reachable, bounds


def commit_group(view, urls, end):
    """Write ``end`` as the consumer group's offsets (ZooKeeper with ``zk``, else each partition's broker)."""
    from metaq.client.offsets import ZkOffsetStore
    from metaq.client.replies import reply_error

    opts = view.opts
    if opts.zk:
        entries = {(topic, Partition.parse(key)): (offset, -1)
                   for topic, parts in end.items() for key, offset in parts.items()}
        ZkOffsetStore(view.zk_discovery().zk, opts.zk_root, opts.group).commit(entries)
        return
    for topic, parts in sorted(end.items()):
        for key, offset in sorted(parts.items()):
            part = Partition.parse(key)
            if part.broker_id in urls:
                reply = view.call(urls[part.broker_id], ev.CommitOffset(opts.group, topic, part.partition, offset, 0))
                if reply.code != 200:
                    raise reply_error(reply, "commit_offset %s %s %s" % (opts.group, topic, key))


try:  # Spark >= 4.0
    from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
except ImportError:  # pragma: no cover - Spark 3.5
    DataSourceStreamReader = InputPartition = None
try:  # Spark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - Spark 4.0 / 4.1
    ReadAllAvailable = ReadMaxRows = None
    SupportsTriggerAvailableNow = object


if DataSourceStreamReader is not None:

    class StreamRangePartition(InputPartition):
        """One offset range of a micro-batch: the unit a Spark task reads (pickled to the executor)."""

        def __init__(self, offset_range):
            super().__init__(offset_range)
            self.range = offset_range

    class MetaQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        """The ``metaq`` streaming source; see the module docstring for the options.

        ``initialOffset``, ``latestOffset`` and ``partitions`` run on the driver (in one long-lived
        Python process); ``read`` runs in the executors on a pickled copy.
        """

        def __init__(self, options):
            self.opts = StreamOptions(options)
            self._view = None  # BrokerView: connections kept while the query runs (never pickled)
            self._target = None  # Trigger.AvailableNow: {(topic, key): high} when the query started
            self._last_end = None  # the last end given, for Spark < 4.2 (latestOffset() without a start)
            self._highs = None
            self._group_done = None  # the offsets last written for the group
            self._initial = None  # initialOffset(), resolved once
            self._cut_told = set()  # (topic, key, position) of cut logs already told (failOnDataLoss=false)

        @property
        def view(self):
            if self._view is None:
                self._view = BrokerView(self.opts)
            return self._view

        def __getstate__(self):  # the copy Spark sends to an executor carries no connection
            state = dict(self.__dict__)
            state["_view"] = None
            return state

        def stop(self):
            if self._view is not None:
                self._view.close()
                self._view = None

        def initialOffset(self):
            # Spark asks twice in a new query (for the first latestOffset, then again to plan batch 0):
            # "latest" must be the same answer both times, or batch 0 misses what came in between.
            if self._initial is None:
                self._initial = self._resolve_initial()
            return self._initial

        def _resolve_initial(self):
            urls, bounds = discover(self.view, strict=True)
            at_time = None
            if self.opts.starting_ts is not None:
                from metaq.spark.ranges import offsets_at_time

                security = client_security.resolve(self.opts.security)
                at_time = {}
                for topic in sorted({t for t, _ in bounds}):
                    found = offsets_at_time(urls, topic, self.opts.starting_ts, self.opts.timeout, security)
                    at_time.update({(topic, "%d-%d" % k): off for k, off in found.items()})
            return offsets_json(starting_offsets(self.opts, bounds, at_time))

        def getDefaultReadLimit(self):
            if self.opts.max_per_trigger is None or ReadMaxRows is None:
                return ReadAllAvailable() if ReadAllAvailable is not None else None
            return ReadMaxRows(self.opts.max_per_trigger)

        def latestOffset(self, start=None, limit=None):
            if start is None:  # Spark < 4.2
                start, max_rows = self._last_end, self.opts.max_per_trigger
                if start is None:
                    start = self.initialOffset()
            else:
                max_rows = getattr(limit, "max_rows", None)
            urls, bounds = discover(self.view)
            self._commit_group(urls, start)  # Spark asks for the next end once the batch ending at start is done
            self._report_cut_logs(start, bounds)
            self._highs = {topic: {} for topic, _ in bounds}
            for (topic, key), (_low, high) in bounds.items():
                self._highs[topic][key] = high
            if self._target is not None:
                bounds = {k: (low, min(high, self._target.get(k, low))) for k, (low, high) in bounds.items()}
            end = offsets_json(next_end(start, bounds, max_rows))
            self._last_end = end
            return end

        def _report_cut_logs(self, start, bounds):
            for topic, key, high, position in cut_logs(start, bounds):
                text = ("%s %s: the partition ends at offset %d, below the stream's position %d: its log was cut "
                        "(a failover to a slave that lacked its tail?), and messages stored at %d..%d from now on are "
                        "not read" % (topic, key, high, position, high, position - 1))
                if self.opts.fail_on_data_loss:
                    raise DataLoss(text + "; set failOnDataLoss=false to go on from %d" % position)
                if (topic, key, position) not in self._cut_told:
                    self._cut_told.add((topic, key, position))
                    log.warning("%s (failOnDataLoss=false)", text)

        def reportLatestOffset(self):
            return offsets_json(self._highs) if self._highs else None

        def prepareForTriggerAvailableNow(self):
            _urls, bounds = discover(self.view)
            self._target = {k: high for k, (_low, high) in bounds.items()}

        def partitions(self, start, end):
            # Spark < 4.2 plans every batch it runs here, and on a restart announces the checkpoint's last
            # offsets as partitions(end, end) (AcceptsLatestSeenOffset): the start of the next latestOffset().
            self._last_end = end
            urls, bounds = discover(self.view)
            return [StreamRangePartition(r) for r in plan_stream_ranges(start, end, bounds, urls, self.opts)]

        def read(self, partition):
            if self.opts.arrow:
                from metaq.spark.arrowread import read_batches

                return read_batches(partition.range, fetch_bytes=self.opts.fetch_bytes,
                                    timeout=max(self.opts.timeout, 30.0), security=self.opts.security,
                                    fail_on_data_loss=self.opts.fail_on_data_loss, max_rows=self.opts.batch_rows)
            from metaq.spark.rows import read_rows

            return read_rows(partition.range, fetch_bytes=self.opts.fetch_bytes, timeout=max(self.opts.timeout, 30.0),
                             security=self.opts.security, fail_on_data_loss=self.opts.fail_on_data_loss)

        def commit(self, end):
            # Not a start for latestOffset(): Spark commits batch N-1 after it has asked for batch N's end.
            if self.opts.group and end != self._group_done:  # latestOffset() wrote it already, as a rule
                self._commit_group(discover(self.view)[0], end)

        def _commit_group(self, urls, done):
            """Write ``done`` (the end of a finished batch) as the group's offsets, once per new value."""
            if not self.opts.group or done == self._group_done:
                return
            try:
                commit_group(self.view, urls, done)
            except (OSError, errors.MetaqError) as exc:  # written again with the next finished batch
                log.warning("metaq stream: committing the offsets of group %s failed: %s", self.opts.group, exc)
            else:
                self._group_done = done

else:  # pragma: no cover - Spark 3.5
    MetaQStreamReader = None
