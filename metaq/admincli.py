"""``metaq-admin``: look at a metaq cluster from a terminal or a script.

    metaq-admin --zk 127.0.0.1:2181 topics
    metaq-admin --brokers meta://127.0.0.1:8123 stats
    metaq-admin --zk 127.0.0.1:2181 groups billing --json
    metaq-admin --zk 127.0.0.1:2181 --json brokers    # each member's url, MQTT and RocketMQ addresses
    metaq-admin --zk 127.0.0.1:2181 cluster           # per member: role, addresses, topics, MQTT load, routes
    metaq-admin promote 127.0.0.1:8125 [--force]
    metaq-admin --zk 127.0.0.1:2181 epochs 0 [--forget --yes]   # broker 0's epoch record (docs/replication.md)
    metaq-admin --brokers meta://127.0.0.1:8123 offset-at orders 2026-11-23T09:00:00Z

Brokers come from ZooKeeper (``--zk``, every registered master) or from
``--brokers``. Tables for people, ``--json`` for scripts. Exit codes: 0 ok,
1 a broker or ZooKeeper could not be reached (what could be read is still
shown, with the failure on stderr), 2 usage, 3 the broker refused (promote).

``offset-at TOPIC TIME`` asks every broker, per partition of the topic, for the first offset stored at
or after TIME (ISO 8601, a naive one local time, or ms since the Unix epoch): the text extension
``offset_at``, where a consumer replays from (``Consumer(start_from=...)``).

``promote`` talks to the one slave named (its client port) with the text
extension line ``promote <force 0|1> <opaque>`` and prints its answer.

Brokers with authentication on need credentials: ``--credentials FILE`` (YAML: user, secret_file,
tls), or ``--user NAME --secret-file FILE``; TLS with ``--tls``, ``--ca``, ``--cert``, ``--key``;
unset flags come from the environment (``METAQ_CREDENTIALS``, ``METAQ_USER``, ...:
``metaq.client.security``). Bad credentials settings exit 2.
"""

import argparse
import json
import os
import sys
from datetime import datetime

import metaq
from metaq import errors
from metaq.client.admin import dlq, tools
from metaq.client.cluster import zk_children, zk_data
from metaq.client import replay
from metaq.client import security as client_security
from metaq.client.connection import BrokerConnection
from metaq.client.discovery import ZkDiscovery, ask_broker_id
from metaq.client.admin import groups as groups_cli
from metaq.client.admin import offsets as adminoffsets
from metaq.client.offsets import parse_zk_offset
from metaq.protocol import events as ev
from metaq.protocol import registration
from metaq.protocol.registration import member_of
from metaq.protocol import stats as stats_codec
from metaq.client.admin import timers as timers_cli
from metaq.client.admin import topics as admintopics
from metaq.topics import names as internaltopics
from metaq.client.admin import trace as trace_cli
from metaq.client.admin import clients as clients_cli

EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
#: Seconds a promotion may take at the broker (it stops its link and fsyncs its new epoch).
PROMOTE_TIMEOUT_S = 30.0


# -- reading the cluster ------------------------------------------------------------------


class ClusterView:
    """The brokers to ask (``{broker_id: url}``) and, with ZooKeeper, its client."""

    def __init__(self, zk_connect=None, zk_root="/meta", brokers=(), timeout=5.0, security=None):
        self.timeout = timeout
        self.security = client_security.resolve(security)
        self.cluster = None  # the ZkDiscovery (metaq.client.discovery) with ZooKeeper
        self.problems = []
        self.refusals = []  # the problems that are a 401 or 403: the credentials, not the network
        self.hidden = 0  # rows a listing left out (internal topics, `topics` without --all)
        self.notes = []  # what a listing should say beside its rows (a broker's rows past its limit), on stderr
        self._conns = {}
        self.brokers = {}  # id -> url (ids learnt from each broker's `stats` when not from ZooKeeper)
        if zk_connect:
            self.cluster = ZkDiscovery.connect(zk_connect, zk_root, connect_timeout=timeout)
            self.brokers = dict(self.cluster.broker_urls())
        for url in brokers:
            try:
                self.brokers[ask_broker_id(self.conn(url), self.timeout)] = url
            except (errors.MetaqError, KeyError, ValueError) as exc:
                self._problem("%s: %s%s" % (url, exc, _hint(exc)), exc)

    def close(self):
        for conn in self._conns.values():
            conn.close()
        if self.cluster is not None:
            self.cluster.close()

    def conn(self, url):
        conn = self._conns.get(url)
        if conn is None:
            conn = self._conns[url] = BrokerConnection(url, connect_timeout=self.timeout, request_timeout=self.timeout,
                                                       heartbeat_interval=0, security=self.security)
        return conn

    def stats_of(self, url, item=None, parse=stats_codec.parse):
        """One broker's ``stats <item>`` parsed by ``parse(item, body)`` (by default ``metaq.protocol.stats.parse``:
        typed rows, or a dict of ``key -> value`` for the summary), or None (the failure is recorded)."""
        try:
            reply = self.conn(url).call(ev.Stats(item, 0), timeout=self.timeout)
        except errors.MetaqError as exc:
            self._problem("%s: %s%s" % (url, exc, _hint(exc)), exc)
            return None
        if not isinstance(reply, ev.Result) or reply.code != 200:
            self._problem("%s: stats %s answered %s" % (url, item or "", _refusal(reply)), reply)
            return None
        try:
            return parse(item, reply.body)
        except errors.RemoteProtocolError as exc:
            self.problems.append("%s: stats %s: %s" % (url, item or "", exc))
            return None

    def _problem(self, text, failure):
        """Record a broker that could not be read; a 401 or 403 (``failure``: an error or a reply) among refusals."""
        self.problems.append(text)
        if getattr(failure, "code", None) in (errors.Unauthenticated.code, errors.Forbidden.code):
            self.refusals.append(text)

    def refused_everywhere(self):
        """True when no broker could be asked and at least one refused the credentials (401/403): then nothing a
        command could say about topics or partitions would be true, and the refusal is the answer."""
        return bool(self.refusals) and not self.brokers

    def stats(self, url, item=None):
        """Any ``stats`` item as a dict of ``key -> value`` (first space splits), or None."""
        return self.stats_of(url, item, _pairs)

    def partitions(self):
        """``[(broker_id, topic, partition, min_offset, max_offset)]`` from every broker's ``stats offsets``."""
        rows = []
        for bid, url in sorted(self.brokers.items()):
            for r in self.stats_of(url, "offsets") or ():
                rows.append((bid, r.topic, r.partition, r.min_offset, r.max_offset))
        return rows


def _refusal(reply):
    """A non-200 reply in words, with what to do about a 401/403."""
    if not isinstance(reply, ev.Result):
        return repr(reply)
    return "%d %s%s" % (reply.code, bytes(reply.body).decode("utf-8", "replace"), _hint(reply))


def _hint(failure):
    """What to do about a 401 or 403 (a reply or an error), else ""."""
    code = getattr(failure, "code", None)
    if code == errors.Unauthenticated.code and "refused the credentials" not in str(failure):
        return " (give credentials: --credentials FILE, --user NAME --secret-file FILE, or METAQ_CREDENTIALS)"
    if code == errors.Forbidden.code and "admin" not in str(failure) and " may not " not in str(failure):
        return " (this needs a user with the admin role)"
    return ""


def _pairs(_item, body):
    return stats_codec.parse_pairs(stats_codec.lines(body))


def zk_group_rows(view, only_group=None):
    """Group offsets and owners stored in ZooKeeper: ``[(group, topic, "b-p", offset, owner)]``."""
    if view.cluster is None:
        return []
    zk, base = view.cluster.zk, view.cluster.root + "/consumers"
    rows = []
    groups = [only_group] if only_group else sorted(zk_children(zk, base))
    for group in groups:
        topics = set(zk_children(zk, "%s/%s/offsets" % (base, group)))
        topics |= set(zk_children(zk, "%s/%s/owners" % (base, group)))
        for topic in sorted(topics):
            parts = set(zk_children(zk, "%s/%s/offsets/%s" % (base, group, topic)))
            parts |= set(zk_children(zk, "%s/%s/owners/%s" % (base, group, topic)))
            for part in sorted(parts):
                raw = zk_data(zk, "%s/%s/offsets/%s/%s" % (base, group, topic, part))
                owner = zk_data(zk, "%s/%s/owners/%s/%s" % (base, group, topic, part))
                rows.append((group, topic, part, zk_offset(raw), owner or ""))
    return rows


def zk_offset(raw):
    """The offset in an offsets node (``msgId-offset`` or legacy plain), or None when absent or unreadable."""
    if not raw:
        return None
    try:
        return parse_zk_offset(raw)[0]
    except ValueError:
        return None


# -- commands: each returns (rows as dicts, column order) -----------------------------------


def cmd_stats(view, args):
    rows = []
    for bid, url in sorted(view.brokers.items()):
        values = view.stats(url, args.item)
        if values is not None:
            rows.extend({"broker": bid, "url": url, "key": k, "value": v} for k, v in values.items())
    return rows, ["broker", "url", "key", "value"]


def cmd_topics(view, args):
    """One row per topic. Without ``--all`` the broker's internal topics (``internaltopics.is_internal``) are left
    out, a priority level's messages and bytes counted in its topic's row, and ``view.hidden`` says how many were
    left out."""
    rows, columns = _topic_rows(view)
    if args.all:
        return rows, columns
    by_name = {r["topic"]: r for r in rows}
    shown = []
    for row in rows:
        if not internaltopics.is_internal(row["topic"]):
            shown.append(row)
            continue
        owner = by_name.get(internaltopics.level_owner(row["topic"]))
        if owner is not None:
            owner["messages"] += row["messages"]
            owner["bytes"] += row["bytes"]
    view.hidden = len(rows) - len(shown)
    return shown, columns


def _topic_rows(view):
    per_topic = {}
    for bid, topic, _p, mn, mx in view.partitions():
        t = per_topic.setdefault(topic, {"topic": topic, "brokers": set(), "partitions": 0, "messages": 0})
        t["brokers"].add(bid)
        t["partitions"] += 1
        t["messages"] += mx - mn
    for bid, url in sorted(view.brokers.items()):
        for r in view.stats_of(url, "topics") or ():
            t = per_topic.setdefault(r.topic, {"topic": r.topic, "brokers": set(), "partitions": 0, "messages": 0})
            t["brokers"].add(bid)
            if r.partitions is not None:  # None: the topic holds no data yet (*Empty*)
                t["configured_partitions"] = t.get("configured_partitions", 0) + r.partitions
                t["bytes"] = t.get("bytes", 0) + r.message_bytes
    rows = []
    table = admintopics.table_rows(view)  # each topic's settings (the topic table)
    for topic in sorted(set(per_topic) | set(table)):
        t = per_topic.get(topic, {"brokers": set(), "partitions": 0, "messages": 0})
        s = table.get(topic, {})
        rows.append(dict({k: s.get(k) for k in admintopics.SETTING_COLUMNS}, topic=topic,
                         brokers=",".join(str(b) for b in sorted(t["brokers"])),
                         partitions=t.get("configured_partitions", t["partitions"] or s.get("partitions")),
                         messages=t["messages"], bytes=t.get("bytes", 0)))
    return rows, ["topic", "brokers", "partitions", "messages", "bytes"] + admintopics.SETTING_COLUMNS


def cmd_partitions(view, args):
    rows = [{"topic": topic, "partition": "%d-%d" % (bid, p), "min_offset": mn, "max_offset": mx, "messages": mx - mn}
            for bid, topic, p, mn, mx in view.partitions() if args.topic in (None, topic)]
    rows.sort(key=lambda r: (r["topic"], r["partition"]))
    return rows, ["topic", "partition", "min_offset", "max_offset", "messages"]


def cmd_groups(view, args):
    """Every consumer group's position and lag per partition: the offsets groups keep in ZooKeeper (their lag from
    the partitions' ends), then each broker's ``stats groups`` (every protocol's groups, their lag the broker's:
    ``metaq.groups.lag``); a broker that left rows out past ``limits.MAX_GROUP_LAG_ROWS`` is named in
    ``view.notes``."""
    ends = {(topic, "%d-%d" % (bid, p)): mx for bid, topic, p, _mn, mx in view.partitions()}
    rows = []
    for group, topic, part, offset, owner in zk_group_rows(view, args.group):
        end = ends.get((topic, part))
        lag = None if end is None or offset is None else max(0, end - offset)
        rows.append(_group_row(group, topic, part, offset, owner, "zookeeper", end, lag, "offsets", None))
    for bid, url in sorted(view.brokers.items()):
        page = view.stats_of(url, "groups", lambda _item, body: stats_codec.parse_groups_page(body))
        got, left_out = page or ((), 0)
        if left_out:
            view.notes.append("broker %d (%s) left out %d group rows past its limit (limits.MAX_GROUP_LAG_ROWS): the "
                              "most behind are shown" % (bid, url, left_out))
        for r in got:
            if args.group in (None, r.group):
                rows.append(_group_row(r.group, r.topic, "%d-%d" % (bid, r.partition), r.offset, "", "broker",
                                       r.max_offset, r.lag, r.kind, r.in_flight))
    rows.sort(key=lambda r: (r["group"], r["topic"], r["partition"], r["kind"], r["store"]))
    return rows, ["group", "kind", "topic", "partition", "owner", "committed", "max_offset", "lag", "in_flight",
                  "store"]


def _group_row(group, topic, part, offset, owner, store, end, lag, kind, in_flight):
    return {"group": group, "kind": kind, "topic": topic, "partition": part, "owner": owner, "committed": offset,
            "max_offset": end, "lag": lag, "in_flight": in_flight, "store": store}


def cmd_zk(view, args):
    if view.cluster is None:
        raise SystemExit("metaq-admin: the zk command needs --zk")
    zk = view.cluster.zk
    start = args.path or (view.cluster.root or "/")
    rows = []

    def walk(path):
        data = zk_data(zk, path)
        stat = zk.exists(path)
        rows.append({"path": path, "data": data if data is not None else "",
                     "ephemeral": bool(stat and stat.ephemeralOwner)})
        for child in sorted(zk_children(zk, path)):
            walk(path.rstrip("/") + "/" + child)

    walk(start)
    return rows, ["path", "ephemeral", "data"]


def cmd_epochs(view, args):
    """A broker id's epoch record (``ids/<id>/epochs``: which member was master of which epoch, the latest last;
    docs/replication.md "Epochs outlive the brokers"). ``--forget --yes`` deletes it: the way out of an
    ``ha: auto`` group whose only member that took part in the latest epoch is gone for good (the next election
    then lets any member win, so what only that member held is lost)."""
    if view.cluster is None:
        raise SystemExit("metaq-admin: the epochs command needs --zk (the record is in ZooKeeper)")
    zk = view.cluster.zk
    path = "%s/brokers/ids/%d/epochs" % (view.cluster.root.rstrip("/"), args.broker_id)
    stat = zk.exists(path)
    if stat is None:
        raise SystemExit("metaq-admin: broker %d has no epoch record (%s)" % (args.broker_id, path))
    data, stat = zk.get(path)
    try:
        entries = json.loads(data.decode("utf-8")).get("epochs")
    except (UnicodeDecodeError, ValueError, AttributeError, RecursionError):
        entries = None
    rows = ([{k: e.get(k) for k in ("epoch", "start", "origin", "member", "replication")}
             for e in entries if isinstance(e, dict)] if isinstance(entries, list)
            else [{"epoch": "unreadable (%d bytes): brokers count it as no record" % len(data)}])
    if args.forget:
        if not args.yes:
            raise SystemExit("metaq-admin: --forget deletes broker %d's epoch record %s: the next election may "
                             "then elect a member that misses what the latest epoch acknowledged. Add --yes to "
                             "delete it" % (args.broker_id, path))
        zk.delete(path, version=stat.version)
        print("metaq-admin: deleted %s (it held %d entr%s); the members elect among themselves again"
              % (path, len(rows), "y" if len(rows) == 1 else "ies"), file=sys.stderr)
    return rows, ["epoch", "start", "origin", "member", "replication"]


def cmd_brokers(view, args):
    """Every broker member registered in ZooKeeper, master then slaves: its text url and the other ports it
    publishes beside it (``protocol/registration.py``): MQTT's address and TLS mode, RocketMQ's remoting and gRPC
    addresses, the HTTP API's; ``-`` for a port it does not have. What a device fleet's provisioning reads to hand
    each device its broker's MQTT address (docs/mqtt.md "At scale")."""
    if view.cluster is None:
        raise SystemExit("metaq-admin: the brokers command needs --zk (the brokers' ports are read from ZooKeeper)")
    zk, ids = view.cluster.zk, view.cluster.root.rstrip("/") + "/brokers/ids"
    rows = []
    for bid in sorted(int(c) for c in zk_children(zk, ids) if c.isascii() and c.isdigit()):
        path = "%s/%d" % (ids, bid)
        children = sorted(zk_children(zk, path))
        members = {}
        for child in children:
            if child == "master" or (child.startswith("slave") and child[5:].isascii() and child[5:].isdigit()):
                url = zk_data(zk, "%s/%s" % (path, child))
                if url is not None:
                    slave = None if child == "master" else int(child[5:])
                    members[slave] = {"broker": bid, "role": "master" if slave is None else "slave %d" % slave,
                                      "url": url, "mqtt": None, "mqtt_tls": None, "remoting": None, "grpc": None,
                                      "http": None}
        for child in children:
            member = member_of(child)
            if member is None or member[1] not in members:
                continue
            raw = zk_data(zk, "%s/%s" % (path, child))
            value = registration.load(raw.encode("utf-8")) if raw is not None else None
            if value is None:
                continue
            row = members[member[1]]
            if member[0] == registration.MQTT:
                row["mqtt"] = registration.address(value.get("address"))
                row["mqtt_tls"] = value.get("tls") if row["mqtt"] and value.get("tls") in registration.TLS_MODES \
                    else None
            elif member[0] == registration.HTTP:
                row["http"] = registration.address(value.get("address"))
            else:
                row["remoting"] = registration.address(value.get("remoting"))
                row["grpc"] = registration.address(value.get("grpc"))
        rows.extend(members[k] for k in sorted(members, key=lambda k: -1 if k is None else k))
    return rows, ["broker", "role", "url", "mqtt", "mqtt_tls", "remoting", "grpc", "http"]


#: The stats keys (summary) a broker reports its MQTT cluster routes by: what it follows of the other brokers.
ROUTE_KEYS_PREFIX = "mqtt_cluster_"


def cmd_cluster(view, args):
    """The cluster at a glance (needs --zk): one row per registered member (``cmd_brokers``'s, master then slaves)
    with the role it plays now and whether it may acknowledge writes (its stats: ``replication_writable``, ``yes``
    or ``no (why)``), the topics it holds (``stats topics``, internal ones left out), its MQTT
    connections and sessions (online and offline), and its routes: what it follows of the other brokers for MQTT,
    its ``mqtt_cluster_*`` stats keys as ``key=value`` (``-`` for a broker that reports none), after whether it is in
    the MQTT cluster at all (``mqtt_cluster``: ``on``, or why not, e.g. ``off (no replication port)``). A member
    that does not answer keeps its row from ZooKeeper, ``-`` elsewhere, and is named on stderr."""
    if view.cluster is None:
        raise SystemExit("metaq-admin: the cluster command needs --zk (its members are read from ZooKeeper)")
    return cluster_rows(view, cmd_brokers(view, args)[0])


def cluster_rows(view, members):
    """``cmd_cluster``'s rows and columns for ``members`` (``cmd_brokers``'s rows), each member's stats asked."""
    rows = []
    for m in members:
        s = view.stats(m["url"]) or {}
        held = view.stats_of(m["url"], "topics") if s else None
        topics = sorted({t.topic for t in held or () if not internaltopics.is_internal(t.topic)})
        routes = " ".join("%s=%s" % (k[len(ROUTE_KEYS_PREFIX):], v) for k, v in sorted(s.items())
                          if k.startswith(ROUTE_KEYS_PREFIX))
        rows.append({"broker": m["broker"], "member": m["role"], "role": s.get("replication_role", "-" if not s
                                                                             else "standalone"),
                     "writable": s.get("replication_writable"),
                     "url": m["url"], "mqtt": m["mqtt"], "remoting": m["remoting"], "grpc": m["grpc"],
                     "http": m["http"],
                     "topics": ",".join(topics) or None,
                     "mqtt_connections": _int_or_none(s.get("mqtt_connections")),
                     "mqtt_sessions": _int_or_none(s.get("mqtt_sessions")),
                     "mqtt_offline": _int_or_none(s.get("mqtt_sessions_offline")),
                     "mqtt_cluster": s.get("mqtt_cluster"),
                     "routes": routes or None})
    return rows, ["broker", "member", "role", "writable", "url", "mqtt", "remoting", "grpc", "http", "topics",
                  "mqtt_connections", "mqtt_sessions", "mqtt_offline", "mqtt_cluster", "routes"]


def _int_or_none(value):
    return int(value) if value is not None and value.isdigit() else None


def cmd_transactions(view, args):
    """List the transactions brokers hold; with ``commit KEY`` / ``rollback KEY`` decide a prepared one by hand."""
    rows = []
    for bid, url in sorted(view.brokers.items()):
        for r in view.stats_of(url, "transactions") or ():
            rows.append({"broker": bid, "key": r.key, "state": r.state, "puts": r.puts, "bytes": r.bytes,
                         "begun_ms": r.begun_ms, "prepared_ms": r.prepared_ms})
    if args.action is None:
        return rows, ["broker", "key", "state", "puts", "bytes", "begun_ms", "prepared_ms"]
    if not args.key:
        raise SystemExit("metaq-admin: transactions %s needs the transaction key (see `transactions`)" % args.action)
    holders = [r for r in rows if r["key"] == args.key]
    if not holders:
        raise SystemExit("metaq-admin: no broker holds transaction %s" % args.key)
    kind = "HEURISTIC_COMMIT" if args.action == "commit" else "HEURISTIC_ROLLBACK"
    url = view.brokers[holders[0]["broker"]]
    reply = view.conn(url).call(ev.Transaction(args.key, "metaq-admin", kind, 0), timeout=view.timeout)
    if reply.code != 200:
        raise SystemExit("metaq-admin: broker %d refused: %s" % (holders[0]["broker"], _refusal(reply)))
    return [{"broker": holders[0]["broker"], "key": args.key, "decision": args.action}], ["broker", "key", "decision"]


def parse_time(text):
    """``offset-at``'s TIME: ms since the Unix epoch, or ISO 8601 (``Z`` or an offset; without one, local time)."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a time: %r (ISO 8601 such as 2026-11-23T09:00:00Z, or ms since "
                                         "the Unix epoch)" % text) from None
    try:
        return replay.to_timestamp_ms(when)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_offset_at(view, args):
    rows = []
    for bid, topic, p, mn, mx in view.partitions():
        if topic != args.topic:
            continue
        try:
            offset = replay.offset_at(view.conn(view.brokers[bid]), topic, p, args.time, view.timeout)
        except errors.MetaqError as exc:
            view.problems.append("%s: offset_at %s %d: %s%s" % (view.brokers[bid], topic, p, exc, _hint(exc)))
            continue
        rows.append({"topic": topic, "partition": "%d-%d" % (bid, p), "time_ms": args.time, "offset": offset,
                     "min_offset": mn, "max_offset": mx})
    rows.sort(key=lambda r: r["partition"])
    return rows, ["topic", "partition", "time_ms", "offset", "min_offset", "max_offset"]


def cmd_quotas(view, args):
    """Each broker's quotas per user (``stats quotas``, an admin's): what the user holds and its quota."""
    rows = []
    for bid, url in sorted(view.brokers.items()):
        for r in view.stats_of(url, "quotas") or ():
            if args.user is None or r.user == args.user:
                rows.append({"broker": bid, "user": r.user, "quota": r.quota, "used": r.used, "limit": r.limit})
    return rows, ["broker", "user", "quota", "used", "limit"]


def cmd_pop(view, args):
    """Each broker's per-message acknowledgement state (``stats pop``): per group and topic, the messages in flight,
    redelivered and dead-lettered (docs/messaging.md "Per-message acknowledgement (POP)")."""
    rows = []
    for bid, url in sorted(view.brokers.items()):
        for r in view.stats_of(url, "pop") or ():
            if args.group is None or r.group == args.group:
                rows.append({"broker": bid, "group": r.group, "topic": r.topic, "in_flight": r.in_flight,
                             "redelivered": r.redelivered, "dead_lettered": r.dead_lettered})
    return rows, ["broker", "group", "topic", "in_flight", "redelivered", "dead_lettered"]


COMMANDS = {"stats": cmd_stats, "offset-at": cmd_offset_at, "transactions": cmd_transactions, "topics": cmd_topics,
            "partitions": cmd_partitions, "groups": cmd_groups, "quotas": cmd_quotas, "pop": cmd_pop,
            "zk": cmd_zk, "epochs": cmd_epochs, "brokers": cmd_brokers, "cluster": cmd_cluster}


# -- output -------------------------------------------------------------------------------


def render_table(rows, columns):
    """A plain aligned table (header, rule, rows); ``-`` for a missing value."""
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    if not rows:
        lines.append("(nothing)")
    return "\n".join(lines)


def _cell(value):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else ""
    return str(value)


def promote(address, force, timeout, security=None):
    """Ask the slave at ``address`` (host:port or meta://host:port) to become master; returns an exit code."""
    url = address if address.startswith("meta://") else "meta://" + address
    try:
        with BrokerConnection(url, connect_timeout=timeout, request_timeout=PROMOTE_TIMEOUT_S,
                              heartbeat_interval=0, security=security) as conn:
            reply = conn.call(ev.Promote(force, 0), timeout=max(timeout, PROMOTE_TIMEOUT_S))
    except (errors.MetaqError, ValueError) as exc:
        print("metaq-admin: promote %s: %s" % (address, exc), file=sys.stderr)
        return EXIT_UNREACHABLE
    text = bytes(reply.body).decode("utf-8", "replace")
    if reply.code != 200:
        print("metaq-admin: %s refused the promotion (%d): %s%s" % (address, reply.code, text, _hint(reply)),
              file=sys.stderr)
        return EXIT_REFUSED
    print(text)
    return EXIT_OK


def build_parser():
    p = argparse.ArgumentParser(prog="metaq-admin", description="Inspect a metaq cluster: brokers, topics, "
                                "partitions, consumer groups and the ZooKeeper layout.")
    p.add_argument("--zk", metavar="HOST:PORT[,...]", default=os.environ.get("METAQ_ZK"),
                   help="ZooKeeper connect string (default $METAQ_ZK); brokers are its registered masters")
    p.add_argument("--zk-root", default="/meta", help="ZooKeeper root of the layout (default /meta)")
    p.add_argument("--brokers", metavar="URL[,URL...]", default=os.environ.get("METAQ_BROKERS"),
                   help="meta://host:port brokers to ask directly (default $METAQ_BROKERS)")
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects) instead of a table")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each broker (default 5)")
    p.add_argument("--version", action="version", version="metaq-admin %s" % metaq.__version__)
    client_security.add_arguments(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    s = sub.add_parser("stats", help="every broker's stats (or one stats item)")
    s.add_argument("item", nargs="?", help="stats item: topics, offsets, realtime, groups, <topic> ...")
    admintopics.add_parser(sub)  # topics [list|create|alter|delete] (client/admin/topics.py)
    s = sub.add_parser("partitions", help="each partition's min and max offsets")
    s.add_argument("topic", nargs="?", help="only this topic")
    s = sub.add_parser("groups", help="consumer groups of every protocol (committed offsets, POP, MQTT shared groups "
                       "and persistent sessions): position, lag, in flight per partition")
    s.add_argument("group", nargs="?", help="only this group")
    s = sub.add_parser("pop", help="per-message acknowledgement: messages in flight, redelivered, dead-lettered")
    s.add_argument("group", nargs="?", help="only this group")
    s = sub.add_parser("quotas", help="quotas per user: what each user holds and its quota (admin)")
    s.add_argument("user", nargs="?", help="only this user")
    s = sub.add_parser("transactions", help="transactions held by brokers (in-doubt ones first); decide one by hand")
    s.add_argument("action", nargs="?", choices=("commit", "rollback"),
                   help="commit or roll back a PREPARED XA branch by hand (a heuristic decision)")
    s.add_argument("key", nargs="?", help="the transaction key, as listed (XID:...)")
    s = sub.add_parser("offset-at", help="per partition of a topic, the first offset stored at or after a time")
    s.add_argument("topic")
    s.add_argument("time", type=parse_time, help="ISO 8601 (2026-11-23T09:00:00Z; without a zone: local time) "
                   "or ms since the Unix epoch")
    tools.add_parsers(sub, parse_time)  # put, tail
    adminoffsets.add_parser(sub, parse_time)  # reset-offsets
    dlq.add_parser(sub)  # dlq list|resend
    timers_cli.add_parser(sub)  # timers list|cancel
    trace_cli.add_parser(sub)  # trace ID | --key KEY (where is my message)
    groups_cli.add_parser(sub)  # group-settings list|show|set|delete
    clients_cli.add_parser(sub)  # clients stack|verify (a connected gRPC client asked)
    sub.add_parser("brokers", help="every registered broker member (needs --zk): its url, MQTT address and TLS "
                   "mode, RocketMQ remoting and gRPC addresses (what a device fleet's provisioning reads)")
    sub.add_parser("cluster", help="the cluster (needs --zk): per broker member its role, addresses, topics, MQTT "
                   "connections and sessions, and MQTT routes")
    s = sub.add_parser("zk", help="the ZooKeeper layout under the root, with node data")
    s.add_argument("path", nargs="?", help="start here instead of the root")
    s = sub.add_parser("epochs", help="a broker id's epoch record in ZooKeeper (needs --zk): which member was "
                       "master of which epoch; --forget --yes deletes it (docs/replication.md)")
    s.add_argument("broker_id", type=int, metavar="BROKER_ID")
    s.add_argument("--forget", action="store_true", help="delete the record (with --yes): the way out when the only "
                   "member that took part in the latest epoch is gone for good")
    s.add_argument("--yes", action="store_true", help="confirm --forget")
    s = sub.add_parser("promote", help="make a replication slave the master of its broker id (docs/replication.md); "
                       "needs no --zk/--brokers")
    s.add_argument("address", metavar="HOST:PORT", help="the slave's client address")
    s.add_argument("--force", action="store_true",
                   help="promote even if the slave is behind its master's last known end or still linked to it "
                        "(the reply says how far behind: those messages are lost)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        security = client_security.from_cli(args)
    except errors.ConfigError as exc:
        print("metaq-admin: %s" % exc, file=sys.stderr)
        return EXIT_USAGE
    if args.command == "promote":
        return promote(args.address, args.force, args.timeout, security)
    brokers = [u.strip() for u in (args.brokers or "").split(",") if u.strip()]
    if not args.zk and not brokers:
        print("metaq-admin: give --zk HOST:PORT or --brokers meta://host:port[,...]", file=sys.stderr)
        return EXIT_USAGE
    try:
        view = ClusterView(args.zk, args.zk_root, brokers, args.timeout, security)
    except errors.MetaqError as exc:
        print("metaq-admin: %s" % exc, file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.command in RUNNERS:
        return _run(RUNNERS[args.command], view, args, brokers)
    try:
        if args.command == "topics" and args.action != "list":
            return admintopics.run(view, args)
        rows, columns = COMMANDS[args.command](view, args)
    finally:
        view.close()
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=False))
    else:
        print(render_table(rows, columns))
    if view.hidden and not args.json:
        print("metaq-admin: %d internal topic%s not shown (--all shows them)" % (view.hidden, "s" * (view.hidden > 1)),
              file=sys.stderr)
    for note in view.notes:
        print("metaq-admin: %s" % note, file=sys.stderr)
    for problem in view.problems:
        print("metaq-admin: could not read %s" % problem, file=sys.stderr)
    return EXIT_UNREACHABLE if view.problems else EXIT_OK


#: Commands that print as they go (client/admin/: tools, offsets, dlq, timers): ``run(view, args, brokers, render)``.
RUNNERS = {
    "put": lambda view, args, brokers, render: tools.run_put(view, args, brokers, args.zk),
    "tail": lambda view, args, brokers, render: tools.run_tail(view, args),
    "reset-offsets": lambda view, args, brokers, render: adminoffsets.run(view, args, render),
    "dlq": lambda view, args, brokers, render: dlq.run(view, args, render),
    "timers": lambda view, args, brokers, render: timers_cli.run(view, args, render),
    "trace": lambda view, args, brokers, render: trace_cli.run(view, args, args.json, render_table),
    "group-settings": lambda view, args, brokers, render: groups_cli.run(view, args, render),
    "clients": lambda view, args, brokers, render: clients_cli.run(view, args, args.json),
}


def _run(runner, view, args, brokers):
    def render(rows, columns):
        print(json.dumps(rows, indent=2) if args.json else render_table(rows, columns), flush=True)

    if view.refused_everywhere():  # before the command, which would find no broker and say so misleadingly
        view.close()
        for problem in view.problems:
            print("metaq-admin: could not read %s" % problem, file=sys.stderr)
        return EXIT_REFUSED
    try:
        code = runner(view, args, brokers, render)
    except tools.AdminExit as exc:
        print("metaq-admin: %s" % exc, file=sys.stderr)
        code = exc.code
    except errors.MetaqError as exc:
        print("metaq-admin: %s%s" % (exc, _hint(exc)), file=sys.stderr)
        code = EXIT_REFUSED if isinstance(exc, errors.ClientError) else EXIT_UNREACHABLE
    finally:
        view.close()
    for problem in view.problems:
        print("metaq-admin: could not read %s" % problem, file=sys.stderr)
    return code if code or not view.problems else EXIT_UNREACHABLE


if __name__ == "__main__":
    sys.exit(main())
