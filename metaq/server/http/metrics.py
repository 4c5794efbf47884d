"""``/metrics``: the broker's figures in Prometheus's exposition format, through ``prometheus_client``.

A custom collector reads the current values at scrape time from the sources it is given (the stats counters,
the store, the stats summary, the replication pairs, the connection counts, the transactions, the group
offsets); the flush latency is a Histogram the flusher feeds (``Flusher.observe_flushes``). Every metric is
in the "Metrics" table of docs/operating.md. The registry is this port's own (never the process-wide default), and the
``_created`` series are off.
"""

import heapq
import time

from prometheus_client import CollectorRegistry, GCCollector, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

try:  # prometheus_client >= 0.18
    from prometheus_client import disable_created_metrics
except ImportError:  # pragma: no cover - older clients always write them
    disable_created_metrics = None

from metaq.server.http import limits as http_limits
from metaq.serving.connections import share_loop
from metaq.protocol.httpreply import Response

if disable_created_metrics is not None:
    disable_created_metrics()

#: Buckets of ``metaq_flush_duration_seconds``: an fsync takes from tens of microseconds (tmpfs, a good NVMe
#: with a cache) to seconds (a saturated disk).
FLUSH_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

#: Transaction states always reported (0 when none), so a dashboard's series exist from the start.
TX_STATES = ("active", "idle", "prepared", "committing", "heuristic-commit", "heuristic-rollback")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value, default=0.0):
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


#: The metrics read from one ``stats`` summary item each: (family, name, help, stats item).
SUMMARY_METRICS = (
    (GaugeMetricFamily, "metaq_uptime_seconds", "Seconds since the broker started.", "uptime"),
    (GaugeMetricFamily, "metaq_disk_usage_ratio", "Used fraction of the data directory's filesystem (0 to 1), as "
     "the write gate measured it.", "disk_usage"),
    (GaugeMetricFamily, "metaq_writes_refused", "1 while puts are refused (a full disk, a failed flush).",
     "writes_refused"),
    (CounterMetricFamily, "metaq_put_failures", "Puts refused or failed since the broker started.", "put_failed"),
    (CounterMetricFamily, "metaq_corrupt_reads", "Reads that met a corrupt record.", "corrupt_reads"),
    (GaugeMetricFamily, "metaq_long_poll_waiters", "Partitions with a long-polling get or pull waiting.",
     "long_poll_waiters"),
    (GaugeMetricFamily, "metaq_parked_gets", "Gets and pulls parked waiting for a message.", "parked_gets"),
    (GaugeMetricFamily, "metaq_delay_pending_messages", "Delayed messages not yet due.", "delay_pending"),
    (GaugeMetricFamily, "metaq_timers_pending_messages", "Messages with a delivery time not yet delivered or "
     "cancelled.", "timers_pending"),
    (GaugeMetricFamily, "metaq_log_end_position_bytes", "The commit log's written end.", "log_end_position"),
    (GaugeMetricFamily, "metaq_pop_in_flight_messages", "POP messages handed out and not acknowledged (every group).",
     "pop_in_flight"),
    (GaugeMetricFamily, "metaq_pop_redelivered_messages", "POP messages handed out again after their invisible time "
     "(every group; the journal's count).", "pop_redelivered"),
    (GaugeMetricFamily, "metaq_pop_dead_lettered_messages", "POP messages moved to a dead-letter topic (every group; "
     "the journal's count).", "pop_dead_lettered"),
)


class BrokerCollector:
    """Reads every metric but the flush histogram at scrape time (``collect``)."""

    def __init__(self, counters, summary, topics, groups, replication, connections, transactions, quotas=list):
        self.counters = counters  # BrokerStats: the never-reset per-topic totals
        self.summary = summary  # () -> the stats summary pairs
        self.topics = topics  # () -> [{"topic", "partitions", "messages", "bytes", ...}] (api.BrokerViews)
        self.groups = groups  # () -> [{"group", "topic", "partition", "offset", "lag", ...}]
        self.replication = replication  # () -> the stats replication pairs
        self.connections = connections  # () -> {listener name: open connections}
        self.transactions = transactions  # () -> [TxInfo] (TransactionManager.in_doubt)
        self.quotas = quotas  # () -> [QuotaRow] per user and quota (stats.quota_rows; none for a user's own scrape)

    def describe(self):
        return []  # no describe-time collection: the registry must not call collect at registration

    def collect(self):
        s = dict(self.summary())
        yield from self._topics()
        yield from self._node(s)
        yield from self._replication()
        yield from self._groups()
        tx = GaugeMetricFamily("metaq_transactions", "Transactions the broker holds, by state.", labels=["state"])
        counts = dict.fromkeys(TX_STATES, 0)
        for info in self.transactions():
            counts[info.state] = counts.get(info.state, 0) + 1
        for state, n in sorted(counts.items()):
            tx.add_metric([state], n)
        yield tx
        yield from self._quotas()

    def _quotas(self):
        used = GaugeMetricFamily("metaq_quota_used", "What the user holds of the quota (docs/security.md "
                                 "\"Quotas\"; user \"-\": no user).", labels=["user", "quota"])
        limit = GaugeMetricFamily("metaq_quota_limit", "The user's quota.", labels=["user", "quota"])
        for row in self.quotas():
            used.add_metric([row.user, row.quota], row.used)
            limit.add_metric([row.user, row.quota], row.limit)
        yield used
        yield limit

    def _topics(self):
        puts = CounterMetricFamily("metaq_topic_puts", "Messages stored in the topic since the broker started.",
                                   labels=["topic"])
        put_bytes = CounterMetricFamily("metaq_topic_put_bytes", "Body bytes stored in the topic since the broker "
                                        "started.", labels=["topic"])
        gets = CounterMetricFamily("metaq_topic_gets", "Gets and pulls of the topic that returned messages, since "
                                   "the broker started.", labels=["topic"])
        messages = GaugeMetricFamily("metaq_topic_messages", "Messages the topic holds (retention applied).",
                                     labels=["topic"])
        size = GaugeMetricFamily("metaq_topic_log_bytes", "Bytes of the topic's records in the commit log.",
                                 labels=["topic"])
        partitions = GaugeMetricFamily("metaq_topic_partitions", "Partitions of the topic.", labels=["topic"])
        for t in self.topics():
            name = [t["topic"]]
            puts.add_metric(name, t["puts_total"])
            put_bytes.add_metric(name, t["put_bytes_total"])
            gets.add_metric(name, t["gets_total"])
            messages.add_metric(name, t["messages"])
            size.add_metric(name, t["bytes"])
            partitions.add_metric(name, t["partitions"])
        return puts, put_bytes, gets, messages, size, partitions

    def _node(self, s):
        info = GaugeMetricFamily("metaq_info", "Always 1; the labels name the broker.", labels=["version", "broker_id"])
        info.add_metric([str(s.get("version", "")), str(s.get("broker_id", ""))], 1)
        yield info
        for family, name, text, key in SUMMARY_METRICS:
            yield family(name, text, value=_number(s.get(key)))
        yield GaugeMetricFamily("metaq_loop_lag_seconds", "The longest the event loop ran work late over the last "
                                "minute (stats loop_lag_ms).", value=_number(s.get("loop_lag_ms")) / 1000.0)
        conns = GaugeMetricFamily("metaq_connections", "Open connections, by listener.", labels=["listener"])
        for name, n in sorted(self.connections().items()):
            conns.add_metric([name], n)
        yield conns

    def _replication(self):
        r = dict(self.replication())
        role = GaugeMetricFamily("metaq_replication_role", "1 for the broker's replication role (none: standalone).",
                                 labels=["role"])
        for name in ("master", "slave", "none"):
            role.add_metric([name], 1 if r.get("replication_role") == name else 0)
        yield role
        yield GaugeMetricFamily("metaq_replication_writable", "1 while this broker may acknowledge writes; 0 on a "
                                "slave or a master that may not (stats replication_writable says why).",
                                value=1 if r.get("replication_writable") == "yes" else 0)
        yield GaugeMetricFamily("metaq_replication_epoch", "The replication epoch (a new one per promotion).",
                                value=_number(r.get("replication_epoch")))
        yield GaugeMetricFamily("metaq_replication_lag_messages", "A slave's lag behind its master, in messages "
                                "(0 on a master).", value=_number(r.get("replication_lag_messages")))
        yield GaugeMetricFamily("metaq_replication_lag_bytes", "A slave's lag behind its master, in bytes of log "
                                "(0 on a master).", value=_number(r.get("replication_lag_bytes")))
        yield GaugeMetricFamily("metaq_replication_slaves", "Slaves connected to this master.",
                                value=_number(r.get("replication_slaves")))

    def _groups(self):
        lag = GaugeMetricFamily("metaq_group_lag_messages", "Messages between a group's committed offset (kept by "
                                "this broker) and the partition's end.", labels=["group", "topic", "partition"])
        offset = GaugeMetricFamily("metaq_group_committed_offset", "The offset a group committed to this broker.",
                                   labels=["group", "topic", "partition"])
        rows = self.groups()
        shown = heapq.nlargest(http_limits.MAX_METRICS_GROUP_ROWS, rows, key=lambda g: g["lag"]) \
            if len(rows) > http_limits.MAX_METRICS_GROUP_ROWS else rows  # the most behind first: what an alert needs
        turn = time.monotonic()
        for i, g in enumerate(shown):
            labels = [g["group"], g["topic"], str(g["partition"])]
            lag.add_metric(labels, g["lag"])
            offset.add_metric(labels, g["offset"])
            if i % 1000 == 999:
                turn = share_loop(turn)  # the other connections run meanwhile
        left_out = GaugeMetricFamily("metaq_group_rows_left_out", "Group rows (group, topic, partition) not shown: "
                                     "past limits.MAX_METRICS_GROUP_ROWS, the least behind.",
                                     value=len(rows) - len(shown))
        return lag, offset, left_out


class Metrics:
    """The port's registry: the collector and the flush histogram; ``scrape`` is the ``/metrics`` route.

    ``filtered(may_see)`` makes the collector of what one user may see (``guard.visible_to``); given a ``guard``
    (the port does when ``http.open_metrics`` is false: the scrape needs credentials), a user who is not an admin
    sees only the topics and groups it may subscribe to, as in ``stats``. An unfiltered answer that was costly to
    build is reused for ten times what it took, at most ``limits.METRICS_REUSE_S``."""

    def __init__(self, collector, guard=None, filtered=None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.flush_seconds = Histogram("metaq_flush_duration_seconds", "Time of each flush round's fsync of the "
                                       "commit log.", buckets=FLUSH_BUCKETS, registry=self.registry)
        GCCollector(registry=self.registry)  # the cyclic collector's passes, full ones above all (limits.py)
        self.guard = guard
        self.filtered = filtered
        self._last = (None, b"")  # (monotonic time it may be reused until, the unfiltered answer)

    def observe_flush(self, seconds):
        self.flush_seconds.observe(seconds)

    def scrape(self, request):
        may_see = self.guard.visible_to(request.session) if self.guard is not None and request.session else None
        if may_see is not None and self.filtered is not None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(self.filtered(may_see))
            return Response(200, generate_latest(registry), CONTENT_TYPE)
        fresh_until, body = self._last
        now = time.monotonic()
        if fresh_until is None or now >= fresh_until:
            body = generate_latest(self.registry)
            done = time.monotonic()
            cost = done - now
            self._last = (done + min(http_limits.METRICS_REUSE_S, 10 * cost) if cost > http_limits.METRICS_COSTLY_S
                          else done,
                          body)
        return Response(200, body, CONTENT_TYPE)
