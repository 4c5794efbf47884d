"""Counters and the MetaQ ``stats`` replies (``STATS\\r\\n`` + lines + ``END\\r\\n``).

Items follow MetaQ's StatsManager (reference §8.3): blank, ``topics``,
``offsets``, ``realtime``, ``<topic>``, ``config``, ``reset``, ``help``.
"""

import os
import threading
import time

import metaq
from metaq.errors import MetaqError
from metaq.protocol import checksum
from metaq.protocol.delay import SCHEDULE_TOPIC
from metaq.server.replication import roles

ITEMS_HELP = (
    "(blank)   broker summary",
    "topics    per topic: partitions, message count and bytes",
    "offsets   per partition: min_offset and max_offset",
    "realtime  put/get/offset counters since the last reset",
    "groups    per group and partition: offset committed in this broker, max_offset, lag, commit time (ms)",
    "transactions  open, prepared (in-doubt), committing and heuristically decided transactions",
    "delay     per delay level: delay, pending messages, next due time (ms), delivered",
    "<topic>   one topic's figures",
    "config    the configuration file in use",
    "reset     reset the realtime counters",
    "help      this list",
)

REALTIME = ("put", "get", "offset", "get_miss", "put_failed", "message_size")


class RealtimeStat:
    """MetaQ's MetaStatLog value: a count and a summed value over a duration."""

    __slots__ = ("count", "value")

    def __init__(self):
        self.count = 0
        self.value = 0

    def add(self, value=1):
        self.count += 1
        self.value += value

    def render(self, duration_s):
        if not self.count:
            return "null"
        avg = "%.2f" % (self.value / self.count)
        rate = "%.2f" % (self.count / duration_s) if duration_s > 0 else "invalid"
        return "Count=%d,Value=%d,Value/Count=%s,Count/Duration=%s,Duration=%d" % (
            self.count, self.value, avg, rate, int(duration_s))


class BrokerStats:
    """Cumulative counters plus resettable realtime counters (global and per topic)."""

    def __init__(self):
        self.started = time.time()
        self.cmd_put = self.cmd_get = self.cmd_offset = 0
        self.get_miss = self.put_failed = 0
        self.tx_begin = self.tx_xa_begin = self.tx_commit = self.tx_rollback = 0
        self.protocol_errors = 0
        self.burst_puts = 0  # puts stored through the burst fast path (server/fastput.py)
        self.reset_realtime()

    def reset_realtime(self):
        self.realtime_since = time.time()
        self.realtime = {name: RealtimeStat() for name in REALTIME}
        self.topic_realtime = {}

    def topic(self, topic):
        stats = self.topic_realtime.get(topic)
        if stats is None:
            stats = self.topic_realtime[topic] = {name: RealtimeStat() for name in REALTIME}
        return stats

    def on_put(self, topic, size):
        """Count a stored put."""
        self.on_puts(topic, 1, size)

    def on_puts(self, topic, count, size):
        """Count ``count`` stored puts of ``size`` body bytes in all (a burst's run: as ``count`` on_put calls)."""
        self.cmd_put += count
        t = self.topic_realtime.get(topic) or self.topic(topic)
        for stats in (self.realtime, t):
            put, msize = stats["put"], stats["message_size"]
            put.count += count
            put.value += count
            msize.count += count
            msize.value += size

    def on_put_failed(self, topic):
        self.put_failed += 1
        self.realtime["put_failed"].add()
        if topic is not None:
            self.topic(topic)["put_failed"].add()

    def on_get(self, topic, miss):
        self.cmd_get += 1
        self.realtime["get"].add()
        t = self.topic(topic)
        t["get"].add()
        if miss:
            self.get_miss += 1
            self.realtime["get_miss"].add()
            t["get_miss"].add()

    def on_offset(self, topic):
        self.cmd_offset += 1
        self.realtime["offset"].add()
        self.topic(topic)["offset"].add()


def _body(lines):
    out = ["STATS\r\n"]
    out.extend(line + "\r\n" for line in lines)
    out.append("END\r\n")
    return "".join(out).encode("utf-8")


def render(item, broker):
    """The reply body for ``stats <item>`` (item None or "" = the summary)."""
    item = (item or "").strip()
    if item == "":
        return _body(summary_lines(broker))
    if item == "topics":
        return _body(topics_lines(broker.store))
    if item == "offsets":
        return _body(offsets_lines(broker.store))
    if item == "transactions":
        return _body(transactions_lines(broker.tx.manager))
    if item == "delay":
        return _body(broker.delay.level_lines())
    if item == "groups":
        return _body(groups_lines(broker.store))
    if item == "realtime":
        return _body(realtime_lines(broker.stats))
    if item == "reset":
        broker.stats.reset_realtime()
        return _body(["reset ok"])
    if item == "help":
        return _body(ITEMS_HELP)
    if item == "config":
        return broker.config_text()
    return _body(topic_lines(item, broker))


def summary_lines(broker):
    s, store = broker.stats, broker.store
    disk = broker.disk_state
    return [
        "pid %d" % os.getpid(),
        "broker_id %d" % broker.config.broker.id,
        "port %d" % broker.port,
        "uptime %d" % int(time.time() - s.started),
        "version %s" % metaq.__version__,
        "slave %s" % ("true" if broker.slave_link is not None else "false"),
        "curr_connections %d" % broker.connection_count,
        "threads %d" % threading.active_count(),
        "cmd_put %d" % s.cmd_put,
        "burst_puts %d" % s.burst_puts,
        "cmd_get %d" % s.cmd_get,
        "cmd_offset %d" % s.cmd_offset,
        "tx_begin %d" % s.tx_begin,
        "tx_xa_begin %d" % s.tx_xa_begin,
        "tx_commit %d" % s.tx_commit,
        "tx_rollback %d" % s.tx_rollback,
        "get_miss %d" % s.get_miss,
        "put_failed %d" % s.put_failed,
        "total_messages %d" % store.total_messages(),
        "topics %d" % len(public_topics(store)),
        "config_checksum %d" % broker.config_checksum,
        "flush_mode %s" % broker.config.store.flush,
        "crc32 %s" % checksum.IMPLEMENTATION,
        "log_end_position %d" % store.written_position,
        "log_flushed_position %d" % store.flushed_position,
        "flush_rounds %d" % broker.flusher.rounds,
    ] + ["flush_time_%s_ms %.3f" % pair for pair in zip(("p50", "p99", "max"), broker.flusher.recent_times())] + [
        "disk_usage %.4f" % (disk.usage_ratio if disk else 0.0),
        "writes_refused %s" % ("true" if broker.refusal else "false"),
        "protocol_errors %d" % s.protocol_errors,
        "long_poll_waiters %d" % sum(1 for topic, _p in broker.waiters.keys() if topic != SCHEDULE_TOPIC),
        "zookeeper %s" % (broker.registry.state if broker.registry is not None else "standalone"),
    ] + replication_lines(broker) + broker.delay.summary_lines() + remoting_lines(broker)


def remoting_lines(broker):
    r = broker.remoting
    if r is None:
        return ["remoting_port 0"]
    return ["remoting_port %d" % r.port, "remoting_connections %d" % len(r.connections),
            "rocketmq_consumer_groups %d" % len(r.clients.groups())]


def public_topics(store):
    """Topics for listings: every known topic but the internal one of delayed delivery (see ``stats delay``)."""
    return [t for t in store.known_topics() if t != SCHEDULE_TOPIC]


def replication_lines(broker):
    """Role (slave; master with a replication port or after a promotion; none = standalone), epoch, link figures."""
    epochs = broker.store.epochs
    promoted = broker.role == "master" and roles.read_promoted(broker.store) is not None
    if broker.slave_link is not None:
        role, more = "slave", broker.slave_link.stats_lines()
    elif broker.replication is not None:
        role, more = "master", broker.replication.stats_lines()
    else:
        role, more = ("master" if promoted else "none"), []
    return ["replication_role %s" % role, "replication_epoch %d" % epochs.epoch,
            "replication_epoch_start %d" % epochs.latest[1],
            "replication_promoted %s" % ("true" if promoted else "false"),
            "replication_reads_refused %s" % ("true" if broker.read_refusal else "false")] + more


def topics_lines(store):
    lines = []
    with_data = {}
    for topic, partition in store.partition_keys():
        with_data.setdefault(topic, []).append(partition)
    for topic in sorted(public_topics(store)):
        parts = with_data.get(topic)
        if not parts:
            lines.append("%s *Empty*" % topic)
            continue
        count = sum(store.max_offset(topic, p) - store.min_offset(topic, p) for p in parts)
        size = store.topic_bytes(topic)
        lines.append("%s partitions %d message_count %d message_bytes %d accept_publish true accept_subscribe true"
                     % (topic, store.partitions_of(topic), count, size))
    return lines


def offsets_lines(store):
    return ["%s part %d min_offset %d max_offset %d" % (t, p, store.min_offset(t, p), store.max_offset(t, p))
            for t, p in sorted(store.partition_keys())]


def groups_lines(store):
    lines = []
    for group, topic, partition, offset, commit_ms in store.consumer_offsets.entries():
        try:
            end = store.max_offset(topic, partition)
        except MetaqError:  # the topic is no longer configured
            continue
        lines.append("%s %s %d offset %d max_offset %d lag %d committed_ms %d"
                     % (group, topic, partition, offset, end, max(0, end - offset), commit_ms))
    return lines


def transactions_lines(manager):
    """``<key> <state> puts N bytes N begun_ms T prepared_ms T|- timeout_s N`` per transaction the broker holds."""
    lines = []
    for t in manager.in_doubt():
        lines.append("%s %s puts %d bytes %d begun_ms %d prepared_ms %s timeout_s %d" % (
            t.key, t.state, t.puts, t.bytes, t.begun_ms, "-" if t.prepared_ms is None else t.prepared_ms,
            t.timeout_s or 0))
    return lines


def realtime_lines(stats):
    duration = time.time() - stats.realtime_since
    return ["realtime_%s %s" % (name, stats.realtime[name].render(duration)) for name in REALTIME]


def topic_lines(topic, broker):
    store, stats = broker.store, broker.stats
    keys = [p for t, p in store.partition_keys() if t == topic]
    if topic not in store.known_topics() and not keys:
        code, parts, count, size = 1, 0, 0, 0
    elif not keys:
        code, parts, count, size = 2, store.partitions_of(topic), 0, 0
    else:
        code, parts = 0, store.partitions_of(topic)
        count = sum(store.max_offset(topic, p) - store.min_offset(topic, p) for p in keys)
        size = store.topic_bytes(topic)
    lines = [topic, "resultCode %d" % code, "partitions %d" % parts, "message_count %d" % count, "bytes %d" % size]
    duration = time.time() - stats.realtime_since
    rt = stats.topic_realtime.get(topic) or {name: None for name in REALTIME}
    for name in REALTIME:
        value = rt[name].render(duration) if rt[name] is not None else "null"
        lines.append("topic_realtime_%s %s" % (name, value))
    return lines
