"""Counters and the ``stats`` service: the MetaQ ``stats`` replies, rendered from the sources it is given.

Items follow MetaQ's StatsManager (reference §8.3): blank, ``topics``,
``offsets``, ``realtime``, ``<topic>``, ``config``, ``reset``, ``help``, plus
ours (``groups``, ``transactions``, ``delay``). Every line is written by the
codec ``metaq.protocol.stats``; ``StatsService`` never sees the broker: the
broker gives it, at assembly, the counters, the store, the flusher, the
long-poll waiters, the configuration text and one source (a callable) per
section that others own (``add_source``).
"""

import os
import threading
import time

from typing import NamedTuple

import metaq
from metaq import limits
from metaq.groups import limits as groups_limits
from metaq.errors import Forbidden, MetaqError
from metaq.groups import lag
from metaq.protocol import checksum
from metaq.protocol import stats as codec
from metaq.serving import looplag
from metaq.serving.connections import turn_pauses
from metaq.topics import names as topic_names

ITEMS_HELP = (
    "(blank)   broker summary",
    "topics    per topic: partitions, message count and bytes",
    "offsets   per partition: min_offset and max_offset",
    "realtime  put/get/offset counters since the last reset",
    "groups    per group of every protocol and partition: position, max_offset, lag, time (ms), kind, in flight",
    "pop       per group and topic: POP messages in flight, redelivered, dead-lettered",
    "transactions  open, prepared (in-doubt), committing and heuristically decided transactions",
    "quotas    per user and quota: what the user holds and its quota (admins only)",
    "delay     per delay level: delay, pending messages, next due time (ms), delivered",
    "<topic>   one topic's figures",
    "config    the configuration file in use",
    "reset     reset the realtime counters",
    "help      this list",
)

REALTIME = codec.REALTIME

#: Items that count every user's messages together: with authentication on, an admin's alone (a user would learn
#: the rate of topics it may not read).
BROKER_WIDE = frozenset({"realtime", "delay", "quotas"})


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
        return codec.format_realtime(self.count, self.value, duration_s)


class BrokerStats:
    """Cumulative counters plus resettable realtime counters (global and per topic)."""

    def __init__(self):
        self.started = time.time()
        self.cmd_put = self.cmd_get = self.cmd_offset = 0
        self.get_miss = self.put_failed = 0
        self.tx_begin = self.tx_xa_begin = self.tx_commit = self.tx_rollback = 0
        self.protocol_errors = 0
        self.burst_puts = 0  # puts stored through the burst fast path (server/fastput.py)
        self.filter_skipped_units = 0  # index units a filtered read passed over without reading their record
        self.burst_scanned_bytes = 0  # receive-buffer bytes handed to its scanners (bounded per frame: fastput.py)
        self.reset_realtime()
        #: topic -> [puts, put body bytes, gets that returned messages], never reset (the HTTP port's
        #: ``metaq_topic_*_total`` counters; ``stats reset`` resets only the realtime figures)
        self.topic_totals = {}

    def reset_realtime(self):
        self.realtime_since = time.time()
        self.realtime = {name: RealtimeStat() for name in REALTIME}
        self.topic_realtime = {}
        #: topic -> the counters ``on_puts`` adds to (``_put_counters``), for topics counted under their own name
        #: (at most ``limits.MAX_STATS_TOPICS``); rebuilt with the realtime counters they hold
        self._put_counters = {}

    def topic(self, topic):
        """The realtime counters of ``topic``. Names come from clients (a get of a topic that does not exist
        counts too), so past ``limits.MAX_STATS_TOPICS`` names a new one shares the counters of ``OTHER_TOPICS``."""
        stats = self.topic_realtime.get(topic)
        if stats is None:
            if len(self.topic_realtime) >= limits.MAX_STATS_TOPICS:
                topic = OTHER_TOPICS
                stats = self.topic_realtime.get(topic)
            if stats is None:
                stats = self.topic_realtime[topic] = {name: RealtimeStat() for name in REALTIME}
        return stats

    def on_put(self, topic, size):
        """Count a stored put."""
        self.on_puts(topic, 1, size)

    def on_puts(self, topic, count, size):
        """Count ``count`` stored puts of ``size`` body bytes in all (a burst's run: as ``count`` on_put calls): the
        broker's and the topic's realtime ``put`` and ``message_size``, the topic's totals, ``cmd_put``. Every put
        path counts here, once per run: the counters of a topic are found with one lookup (``_put_counters``)."""
        self.cmd_put += count
        c = self._put_counters.get(topic)
        if c is None:
            c = self._counters_of(topic)
        put, msize, tput, tmsize, totals = c
        put.count += count
        put.value += count
        msize.count += count
        msize.value += size
        tput.count += count
        tput.value += count
        tmsize.count += count
        tmsize.value += size
        totals[0] += count
        totals[1] += size

    def _counters_of(self, topic):
        """``(broker put, broker message_size, topic put, topic message_size, topic totals)``: what ``on_puts``
        adds to; kept for ``topic`` while it is counted under its own name (not ``OTHER_TOPICS``) until the next
        ``reset_realtime`` replaces the realtime counters."""
        t = self.topic_realtime.get(topic) or self.topic(topic)
        totals = self.topic_totals.get(topic) or self.totals(topic)
        rt = self.realtime
        c = (rt["put"], rt["message_size"], t["put"], t["message_size"], totals)
        if t is self.topic_realtime.get(topic) and totals is self.topic_totals.get(topic):
            self._put_counters[topic] = c
        return c

    def totals(self, topic):
        """The never-reset ``[puts, bytes, gets]`` of ``topic`` (folded into ``OTHER_TOPICS`` past the limit)."""
        totals = self.topic_totals.get(topic)
        if totals is None:
            if len(self.topic_totals) >= limits.MAX_STATS_TOPICS:
                topic = OTHER_TOPICS
                totals = self.topic_totals.get(topic)
            if totals is None:
                totals = self.topic_totals[topic] = [0, 0, 0]
        return totals

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
        if not miss:
            self.totals(topic)[2] += 1
        if miss:
            self.get_miss += 1
            self.realtime["get_miss"].add()
            t["get_miss"].add()

    def on_offset(self, topic):
        self.cmd_offset += 1
        self.realtime["offset"].add()
        self.topic(topic)["offset"].add()

    def command_values(self):
        """The summary's command counters, as ``(key, value)`` pairs in their order."""
        return [("cmd_put", self.cmd_put), ("burst_puts", self.burst_puts),
                ("burst_scanned_bytes", self.burst_scanned_bytes), ("cmd_get", self.cmd_get),
                ("cmd_offset", self.cmd_offset), ("tx_begin", self.tx_begin), ("tx_xa_begin", self.tx_xa_begin),
                ("tx_commit", self.tx_commit), ("tx_rollback", self.tx_rollback), ("get_miss", self.get_miss),
                ("put_failed", self.put_failed)]


class NodeFacts(NamedTuple):
    """What the broker itself knows for the summary (its ``stats_facts()``)."""

    broker_id: int
    port: int
    slave: bool
    connections: int
    config_checksum: int
    flush_mode: str
    disk_usage: float
    writes_refused: bool
    zookeeper: str  # the registry's state, or "standalone"
    pressure_deleted_segments: int = 0  # segments retention deleted young to bring the disk below its warn mark
    disk_pressure: str = "none"  # none | warn | full (Broker.disk_pressure)


#: The broker's own topics (metaq.topics.names): no long polls of theirs counted, not listed (delay levels,
#: timers).
INTERNAL = topic_names.INTERNAL

#: The sources ``StatsService`` renders from, each a callable the broker registers (``add_source``).
SOURCES = {
    "node": "NodeFacts of the broker",
    "replication": "the summary's replication (key, value) pairs",
    "delay": "the summary's delay (key, value) pairs",
    "remoting": "the summary's remoting (key, value) pairs",
    "grpc": "the summary's gRPC port (key, value) pairs (docs/rocketmq5.md)",
    "security": "the summary's security (key, value) pairs: auth on|off, tls on|off, ...",
    "zero_copy": "the summary's zero-copy read (key, value) pairs: replies sent from the maps, copied out",
    "mqtt": "the summary's MQTT port (key, value) pairs: its port, connections, wills",
    "delay_levels": "``stats delay``: ([DelayLevelRow], totals as (key, value) pairs)",
    "transactions": "``stats transactions``: the transactions the broker holds (key, state, puts, ...)",
    "quotas": "``stats quotas``: [QuotaRow] per user and quota (docs/security.md \"Quotas\")",
    "pop": "``stats pop`` and the summary's pop_* pairs: (group, topic, in flight, redelivered, dead-lettered) rows",
    "pop_positions": "``stats groups``: the POP groups' ``metaq.groups.lag.Position``s",
    "mqtt_positions": "``stats groups``: the MQTT shared groups' and persistent sessions' "
                      "``metaq.groups.lag.Position``s",
}


class StatsService:
    """Renders ``stats <item>`` replies from narrow sources (see the module docstring)."""

    def __init__(self, counters, store, flusher, waiters, config_view):
        self.counters = counters
        self.store = store
        self.flusher = flusher
        self.waiters = waiters
        self.config_view = config_view
        self.sources = {}

    def add_source(self, name, source):
        """Register ``source`` (a callable without arguments) as the section ``name`` (one of ``SOURCES``)."""
        if name not in SOURCES:
            raise ValueError("unknown stats source %r (known: %s)" % (name, ", ".join(SOURCES)))
        self.sources[name] = source

    def render(self, item, may_see=None):
        """The reply body for ``stats <item>`` (item None or "" = the summary). ``may_see(kind, name)``: whether
        the asking user may see a topic or a group (None: everything); the tables leave out the rows it may
        not, ``stats <topic>`` of such a topic is refused, and so are the items that count every user's messages
        together (``BROKER_WIDE``)."""
        item = (item or "").strip()
        store = self.store
        if item == "":
            return codec.encode_summary(self.summary_values())
        if item == "topics":
            return codec.encode_topics(_visible(topic_rows(store), may_see))
        if item == "offsets":
            return codec.encode_offsets(_visible(offset_rows(store), may_see))
        if item == "transactions":
            return codec.encode_transactions(transaction_rows(self.sources["transactions"]()))
        if item in BROKER_WIDE and may_see is not None:
            raise Forbidden("permission denied: stats %s counts every user's messages: an admin's" % item)
        if item == "delay":
            return codec.encode_delay(*self.sources["delay_levels"]())
        if item == "quotas":
            return codec.encode_quotas(self.sources["quotas"]())
        if item == "groups":
            return codec.encode_groups(*group_rows(store, self.positions(), may_see))
        if item == "pop":
            return codec.encode_pop(_visible([codec.PopRow(*r) for r in self.sources.get("pop", list)()], may_see))
        if item == "realtime":
            return codec.encode_realtime(realtime_values(self.counters))
        if item == "reset":
            self.counters.reset_realtime()
            return codec.encode(["reset ok"])
        if item == "help":
            return codec.encode(ITEMS_HELP)
        if item == "config":
            return self.config_view()
        if may_see is not None and not may_see("topic", item):
            raise Forbidden("permission denied: stats %s: the topic is not one this user may subscribe to" % item)
        return codec.encode_topic(topic_figures(item, store, self.counters))

    def positions(self):
        """The positions of the groups other than committed offsets (POP, MQTT), from their sources."""
        out = []
        for name in ("pop_positions", "mqtt_positions"):
            out.extend(self.sources.get(name, list)())
        return out

    def summary_values(self):
        """The summary's ``(key, value)`` pairs: MetaQ's first (``pid`` … ``config_checksum``), then ours."""
        c, store, node = self.counters, self.store, self.sources["node"]()
        return [
            ("pid", os.getpid()),
            ("broker_id", node.broker_id),
            ("port", node.port),
            ("uptime", int(time.time() - c.started)),
            ("version", metaq.__version__),
            ("slave", node.slave),
            ("curr_connections", node.connections),
            ("threads", threading.active_count()),
        ] + c.command_values() + [
            ("total_messages", store.total_messages()),
            ("topics", len(public_topics(store))),
            ("config_checksum", node.config_checksum),
            ("flush_mode", node.flush_mode),
            ("crc32", checksum.IMPLEMENTATION),
            ("log_end_position", store.written_position),
            ("log_flushed_position", store.flushed_position),
            ("flush_rounds", self.flusher.rounds),
        ] + [("flush_time_%s_ms" % name, float(ms)) for name, ms in zip(("p50", "p99", "max"),
                                                                         self.flusher.recent_times(), strict=True)] + [
            ("disk_usage", float(node.disk_usage)),
            ("writes_refused", node.writes_refused),
            ("disk_pressure", node.disk_pressure),
            ("disk_pressure_deleted_segments", node.pressure_deleted_segments),
            ("protocol_errors", c.protocol_errors),
            ("corrupt_reads", store.reads.corrupt_reads),
            ("log_read_bytes", store.reads.log_read_bytes),
            ("filter_skipped_units", c.filter_skipped_units),
            ("long_poll_waiters", sum(1 for topic, _p in self.waiters.keys() if topic not in INTERNAL)),
            ("parked_gets", self.waiters.parked),
            ("loop_turn_pauses", turn_pauses()),
            ("loop_lag_ms", looplag.PROBE.worst_ms()),
            ("zookeeper", node.zookeeper),
        ] + store.idempotence.summary_values() + self.sources["replication"]() + self.sources["delay"]() + \
            self.sources["remoting"]() + self.sources.get("grpc", list)() + self.sources["security"]() + \
            self.sources.get("zero_copy", list)() + self.sources.get("mqtt", list)() + \
            pop_values(self.sources.get("pop", list)())


#: Where counts of topics past ``limits.MAX_STATS_TOPICS`` go (not a legal topic name: no clash).
OTHER_TOPICS = "(other topics)"


def pop_values(rows):
    """The summary's POP pairs (docs/messaging.md "Per-message acknowledgement (POP)"), from ``stats pop``'s rows."""
    return [("pop_groups", len(rows)), ("pop_in_flight", sum(r[2] for r in rows)),
            ("pop_redelivered", sum(r[3] for r in rows)), ("pop_dead_lettered", sum(r[4] for r in rows))]


def security_values(guard, tls_mode, strangers_evicted=0, proxy_refused=0):
    """The summary's security pairs: ``auth on|off``, ``tls on|off|permissive``, reloads of the permissions file,
    the connections not yet logged in that were closed to make room for a newcomer (``strangers_evicted``:
    a rising count means the strangers' cap is being filled, by a crowd or an attack) and the connections of a
    trusted proxy closed for a bad or late PROXY header (``proxy_refused``)."""
    auth, _tls = guard.status()
    return [("auth", auth), ("tls", tls_mode if tls_mode != "off" else "off"), ("acl_users", len(guard.acl.users)
                                                                              if guard.acl is not None else 0),
            ("acl_reloads", guard.reloads), ("acl_reload_error", guard.reload_error is not None),
            ("strangers_evicted", strangers_evicted), ("proxy_refused", proxy_refused)]


def quota_rows(guard, used):
    """``stats quotas``: per user and quota, what it holds and its quota. ``used``: ``{quota: {user: held}}``;
    every user of the permissions file and every user holding something is shown (``-``: no user)."""
    users = set(guard.acl.users) if guard.acl is not None else set()
    for held in used.values():
        users.update(held)
    return [codec.QuotaRow("-" if u is None else u, name, held.get(u, 0), guard.quotas.limit(u, name))
            for u in sorted(users, key=lambda u: (u is None, u or "")) for name, held in sorted(used.items())]


def remoting_values(remoting):
    """The summary's remoting pairs of the RocketMQ remoting server (None: not configured)."""
    if remoting is None:
        return [("remoting_port", 0)]
    return [("remoting_port", remoting.port), ("remoting_connections", len(remoting.connections)),
            ("rocketmq_consumer_groups", len(remoting.clients.groups())),
            ("rocketmq_queue_locks", len(remoting.locks)),
            ("remoting_route_master", remoting.route_addresses().get(0) or "none")]


def grpc_values(port):
    """The summary's pairs of the gRPC port (``rmq5.port.GrpcPort``; None: not configured): its port, connections,
    the calls its service answered, those refused in-band, the messages stored, the connections refused for a flood
    cooldown and the addresses in one."""
    if port is None:
        return [("grpc_port", 0)]
    counts = port.service.counts
    refused, penalized = port.flood_counts()
    return [("grpc_port", port.port or 0), ("grpc_connections", port.connection_count()),
            ("grpc_calls", counts["calls"]), ("grpc_refused", counts["refused"]), ("grpc_sent", counts["sent"]),
            ("grpc_flood_refused", refused), ("grpc_flood_penalized", penalized)]


def public_topics(store):
    """Topics for listings: every known topic but the internal one of delayed delivery (see ``stats delay``)."""
    return [t for t in store.known_topics() if t not in INTERNAL]


def topic_rows(store):
    rows = []
    with_data = {}
    for topic, partition in store.partition_keys():
        with_data.setdefault(topic, []).append(partition)
    for topic in sorted(public_topics(store)):
        parts = with_data.get(topic)
        if not parts:
            rows.append(codec.TopicRow(topic, None))
            continue
        count = sum(store.max_offset(topic, p) - store.min_offset(topic, p) for p in parts)
        rows.append(codec.TopicRow(topic, store.partitions_of(topic), count, store.topic_bytes(topic)))
    return rows


def offset_rows(store):
    return [codec.OffsetRow(t, p, store.min_offset(t, p), store.max_offset(t, p))
            for t, p in sorted(store.partition_keys())]


def group_rows(store, positions=(), may_see=None, most=groups_limits.MAX_GROUP_LAG_ROWS,
               most_bytes=groups_limits.MAX_GROUP_LAG_BYTES):
    """``(GroupRows, left_out)`` of ``stats groups``: the committed offsets of the store's groups and ``positions``
    (the other kinds', ``metaq.groups.lag.Position``), those ``may_see`` allows, with their lag; at most ``most``
    rows in ``most_bytes``, the most behind (``lag.rows``)."""
    committed = (lag.Position(group, "offsets", topic, partition, offset, commit_ms)
                 for group, topic, partition, offset, commit_ms in store.consumer_offsets.entries())
    visible = (p for it in (committed, positions) for p in it
               if may_see is None or (may_see("topic", p.topic) and may_see("group", p.group)))
    return lag.rows(visible, lambda topic, partition: _end(store, topic, partition), most, most_bytes)


def _end(store, topic, partition):
    """The partition's end; None when its topic is no longer configured."""
    try:
        return store.max_offset(topic, partition)
    except MetaqError:
        return None


def _visible(rows, may_see):
    """The rows whose topic (and group, for a group row) ``may_see`` allows; all of them when it is None."""
    if may_see is None:
        return rows
    return [r for r in rows if may_see("topic", r.topic) and (not hasattr(r, "group") or may_see("group", r.group))]


def transaction_rows(transactions):
    """One row per transaction the broker holds (``TransactionManager.in_doubt()``)."""
    return [codec.TransactionRow(t.key, t.state, t.puts, t.bytes, t.begun_ms, t.prepared_ms, t.timeout_s or 0)
            for t in transactions]


def realtime_values(stats):
    duration = time.time() - stats.realtime_since
    return {name: stats.realtime[name].render(duration) for name in REALTIME}


def topic_figures(topic, store, stats):
    keys = [p for t, p in store.partition_keys() if t == topic]
    if topic not in store.known_topics() and not keys:
        code, parts, count, size = 1, 0, 0, 0
    elif not keys:
        code, parts, count, size = 2, store.partitions_of(topic), 0, 0
    else:
        code, parts = 0, store.partitions_of(topic)
        count = sum(store.max_offset(topic, p) - store.min_offset(topic, p) for p in keys)
        size = store.topic_bytes(topic)
    duration = time.time() - stats.realtime_since
    rt = stats.topic_realtime.get(topic)
    realtime = {name: rt[name].render(duration) if rt is not None else "null" for name in REALTIME}
    return codec.TopicFigures(topic, code, parts, count, size, realtime)
