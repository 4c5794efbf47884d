"""Offsets collector: one snapshot of every group's committed offsets and every partition's bounds.

A snapshot reads, at one moment (``clock()``, injectable for tests):

* **brokers** — from ZooKeeper (``brokers/ids/<id>``: the ``master`` node if registered, else
  the persistent node's url) and/or a list of urls; each is asked ``stats``; one that does not
  answer is recorded ``DOWN`` with the error, never raised;
* **partitions** — each answering broker's ``stats offsets``
  (``<topic> part <p> min_offset <a> max_offset <b>``);
* **offsets** — ZooKeeper's ``consumers/<group>/offsets/<topic>/<brokerId>-<p>`` (``msgId-offset``
  or the legacy plain ``offset``; the znode's mtime and version say when and how often it was
  written) and ``consumers/<group>/owners/...``, plus each broker's groups of every protocol
  (``stats groups``: committed offsets, POP groups, MQTT shared groups and persistent sessions, each with its
  ``kind``, position, lag as the broker decides it (``metaq.groups.lag``) and messages in flight); a broker that left
  rows out past its limit (``limits.MAX_GROUP_LAG_ROWS``) says so in its row's ``error``.

:func:`write_snapshot` appends it to a history directory as Parquet, one file per table per
snapshot (``<history>/{snapshots,brokers,partitions,offsets}/snapshot-<ts_ms>-<rand>.parquet``,
written under a hidden name and renamed, so a reader never sees half a file). Nothing is ever
rewritten: delete old files to prune the history.
"""

import os
import socket
import time
import uuid
from typing import NamedTuple

from metaq import errors
from metaq.client import security as client_security
from metaq.client.cluster import zk_children, zk_data
from metaq.client.discovery import ZkDiscovery
from metaq.client.connection import BrokerConnection
from metaq.client.message import Partition
from metaq.client.offsets import parse_zk_offset
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec

__all__ = ["Snapshot", "collect_snapshot", "write_snapshot", "known_broker_ids", "TABLES", "arrow_schemas"]

TABLES = ("snapshots", "brokers", "partitions", "offsets")


class Snapshot(NamedTuple):
    """One collection: ``ts_ms`` and the rows (dicts) of each table."""

    ts_ms: int
    snapshots: list
    brokers: list
    partitions: list
    offsets: list

    @property
    def problems(self):
        return ["broker %s (%s): %s" % ("?" if b["broker_id"] is None else b["broker_id"], b["url"] or "-", b["error"])
                for b in self.brokers if b["status"] != "UP"]


def arrow_schemas():
    """The pyarrow schema of every table (explicit, so an empty table still has its columns and types)."""
    import pyarrow as pa

    i64, i32, s = pa.int64(), pa.int32(), pa.string()
    return {
        "snapshots": pa.schema([("ts_ms", i64), ("host", s), ("zk", s), ("brokers", s)]),
        "brokers": pa.schema([("ts_ms", i64), ("broker_id", i32), ("url", s), ("status", s), ("registered", pa.bool_()),
                              ("error", s)]),
        "partitions": pa.schema([("ts_ms", i64), ("broker_id", i32), ("topic", s), ("partition", i32),
                                 ("log_start_offset", i64), ("log_end_offset", i64)]),
        "offsets": pa.schema([("ts_ms", i64), ("group", s), ("topic", s), ("broker_id", i32), ("partition", i32),
                              ("store", s), ("committed_offset", i64), ("committed_msg_id", i64), ("commit_ms", i64),
                              ("commit_version", i64), ("owner", s), ("raw", s), ("kind", s), ("lag", i64),
                              ("in_flight", i64)]),
    }


def collect_snapshot(zk=None, brokers=(), zk_root="/meta", *, clock=time.time, timeout=5.0, known_ids=None,
                     progress=None, security=None):
    """Read one :class:`Snapshot`. ``zk``: ZooKeeper connect string; ``brokers``: urls.

    ``clock()`` gives the snapshot time in seconds (tests inject their own); ``known_ids``
    (``{url: broker_id}``, e.g. from :func:`known_broker_ids`) names a listed broker that is
    down. ``progress(text)`` is told what is being read. A broker that does not answer (or refuses
    the credentials: ``security``, see ``metaq.client.security.resolve``) is a ``DOWN`` row;
    ZooKeeper that cannot be reached raises ``errors.ConnectionLost``.
    """
    security = client_security.resolve(security)
    say = progress or (lambda text: None)
    ts_ms = int(round(clock() * 1000))
    found = {}  # url -> {"broker_id", "registered"}
    zk_rows, owners = [], {}
    if zk:
        say("reading ZooKeeper %s" % zk)
        cluster = ZkDiscovery.connect(zk, zk_root, connect_timeout=timeout)
        try:
            for broker_id, url, registered in _zk_brokers(cluster.zk, cluster.root):
                found[url] = {"broker_id": broker_id, "registered": registered}
            zk_rows, owners = _zk_offsets(cluster.zk, cluster.root, ts_ms)
        finally:
            cluster.close()
    for url in brokers:
        found.setdefault(url, {"broker_id": (known_ids or {}).get(url), "registered": None})
    broker_rows, partition_rows, offset_rows = [], [], list(zk_rows)
    for url, info in sorted(found.items()):
        say("asking broker %s" % url)
        row, parts, groups = _read_broker(url, info, ts_ms, timeout, security)
        broker_rows.append(row)
        partition_rows.extend(parts)
        offset_rows.extend(groups)
    for row in offset_rows:
        if row["owner"] is None:
            row["owner"] = owners.get((row["group"], row["topic"], row["broker_id"], row["partition"]))
    snap_row = {"ts_ms": ts_ms, "host": socket.gethostname(), "zk": zk or "", "brokers": ",".join(brokers)}
    return Snapshot(ts_ms, [snap_row], broker_rows, partition_rows, offset_rows)


def _read_broker(url, info, ts_ms, timeout, security):
    """``(broker row, partition rows, broker-store offset rows)`` of one broker; a DOWN row if it does not answer."""
    row = {"ts_ms": ts_ms, "broker_id": info["broker_id"], "url": url, "status": "UP",
           "registered": info["registered"], "error": None}
    try:
        with BrokerConnection(url, connect_timeout=timeout, request_timeout=timeout, heartbeat_interval=0,
                              max_backoff=timeout, security=security) as conn:
            broker_id = int(stats_codec.parse_summary(_stats(conn, None, timeout))["broker_id"])
            offsets = stats_codec.parse_offsets(_stats(conn, "offsets", timeout))
            groups, left_out = stats_codec.parse_groups_page(_stats(conn, "groups", timeout))
    except (errors.MetaqError, OSError, KeyError, ValueError) as exc:
        row.update(status="DOWN", error=str(exc) or type(exc).__name__)
        return row, [], []
    if info["broker_id"] is not None and info["broker_id"] != broker_id:
        row["error"] = "registered as broker %d but answers as %d" % (info["broker_id"], broker_id)
    row["broker_id"] = broker_id
    if left_out:
        note = "left out %d group rows past its limit (limits.MAX_GROUP_LAG_ROWS): the most behind are reported" \
            % left_out
        row["error"] = note if row["error"] is None else "%s; %s" % (row["error"], note)
    parts = []
    for r in offsets:
        parts.append({"ts_ms": ts_ms, "broker_id": broker_id, "topic": r.topic, "partition": r.partition,
                      "log_start_offset": r.min_offset, "log_end_offset": r.max_offset})
    stored = []
    for r in groups:
        stored.append({"ts_ms": ts_ms, "group": r.group, "topic": r.topic, "broker_id": broker_id,
                       "partition": r.partition, "store": "broker", "committed_offset": r.offset,
                       "committed_msg_id": None, "commit_ms": r.committed_ms, "commit_version": None,
                       "owner": None, "raw": None, "kind": r.kind, "lag": r.lag, "in_flight": r.in_flight})
    return row, parts, stored


def _stats(conn, item, timeout):
    reply = conn.call(ev.Stats(item, 0), timeout=timeout)
    if not isinstance(reply, ev.Result) or reply.code != 200:
        raise errors.RemoteProtocolError("stats %s answered %r" % (item or "", reply))
    return reply.body


def _zk_brokers(zk, root):
    """``[(broker_id, url, registered)]``: every ``brokers/ids/<id>``; registered when its master node exists."""
    out = []
    base = root + "/brokers/ids"
    for name in zk_children(zk, base):
        if not name.isdigit():
            continue
        master = zk_data(zk, "%s/%s/master" % (base, name))
        url = master or zk_data(zk, "%s/%s" % (base, name))
        if url:
            out.append((int(name), url.strip(), bool(master)))
    return out


def _zk_offsets(zk, root, ts_ms):
    """Offset rows from ``consumers/<group>/offsets`` and ``{(group, topic, broker_id, p): owner}`` from ``owners``."""
    rows, owners = [], {}
    base = root + "/consumers"
    for group in sorted(zk_children(zk, base)):
        for topic in zk_children(zk, "%s/%s/owners" % (base, group)):
            for key in zk_children(zk, "%s/%s/owners/%s" % (base, group, topic)):
                part = _partition(key)
                owner = zk_data(zk, "%s/%s/owners/%s/%s" % (base, group, topic, key))
                if part is not None and owner is not None:
                    owners[(group, topic, part.broker_id, part.partition)] = owner
        for topic in sorted(zk_children(zk, "%s/%s/offsets" % (base, group))):
            for key in sorted(zk_children(zk, "%s/%s/offsets/%s" % (base, group, topic))):
                part = _partition(key)
                got = zk_data(zk, "%s/%s/offsets/%s/%s" % (base, group, topic, key), with_stat=True)
                if part is None or got is None:
                    continue
                raw, stat = got
                try:
                    offset, msg_id = parse_zk_offset(raw)
                except ValueError:
                    offset = msg_id = None
                rows.append({"ts_ms": ts_ms, "group": group, "topic": topic, "broker_id": part.broker_id,
                             "partition": part.partition, "store": "zk", "committed_offset": offset,
                             "committed_msg_id": msg_id, "commit_ms": stat.mtime, "commit_version": stat.version,
                             "owner": None, "raw": raw, "kind": "offsets", "lag": None, "in_flight": None})
    return rows, owners


def _partition(key):
    try:
        return Partition.parse(key)
    except ValueError:
        return None


# -- history ------------------------------------------------------------------------------------


def write_snapshot(snapshot, history_dir):
    """Append ``snapshot`` to ``history_dir`` (one Parquet file per table); returns the file paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = arrow_schemas()
    name = "snapshot-%d-%s.parquet" % (snapshot.ts_ms, uuid.uuid4().hex[:8])
    paths = []
    for table in TABLES:
        folder = os.path.join(str(history_dir), table)
        os.makedirs(folder, exist_ok=True)
        data = pa.Table.from_pylist(getattr(snapshot, table), schema=schemas[table])
        tmp = os.path.join(folder, "." + name + ".tmp")
        pq.write_table(data, tmp)
        final = os.path.join(folder, name)
        os.replace(tmp, final)
        paths.append(final)
    return paths


def known_broker_ids(history_dir):
    """``{url: broker_id}`` of every broker that answered in an earlier snapshot (the latest id per url)."""
    import pyarrow.parquet as pq

    folder = os.path.join(str(history_dir), "brokers")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".parquet") and not f.startswith(".")) \
        if os.path.isdir(folder) else []
    ids = {}
    for name in files:  # sorted by snapshot time: later ones win
        for row in pq.read_table(os.path.join(folder, name)).to_pylist():
            if row["status"] == "UP" and row["broker_id"] is not None:
                ids[row["url"]] = row["broker_id"]
    return ids
