"""The lag report as a PySpark job over the collector's history (:mod:`metaq.spark.collector`).

Keys are ``(group, topic, partition, store, kind)``: ``store`` says where the group keeps its
offsets (``zk`` or ``broker``), ``kind`` the protocol's model (``metaq.groups.lag.KINDS``:
committed ``offsets``, ``pop``, ``mqtt_shared``, ``mqtt_session``). "Now" is the time of the
latest snapshot. Per key:

* ``committed_offset`` (the group's position), ``log_end_offset`` (and ``log_start_offset``):
  the latest snapshot's; ``lag``: the broker's (``metaq.groups.lag.lag``: a POP group's counts
  what it has not acknowledged), for offsets kept in ZooKeeper ``max(log_end_offset -
  committed_offset, 0)`` messages (offsets are sequence numbers); ``in_flight``: messages
  handed out and not acknowledged (POP, an MQTT session's QoS 1 and 2), empty for the others;
* ``consume_rate`` / ``produce_rate`` (messages/s): how far the committed offset / the log end
  moved across the last ``intervals`` snapshots, divided by the time between the first and
  the last of them; ``catch_up_s = lag / (consume_rate - produce_rate)`` when that is
  positive, 0 when there is no lag, empty otherwise (never, at these rates);
* ``commit_age_s``: now minus the commit's own time (the znode's mtime, or the broker's
  ``committed_ms``);
* ``status``: Burrow's rules (:mod:`metaq.spark.burrow`) over the key's window of the last
  ``intervals`` *commits*. A commit is a new value of (offset, commit time, znode version); its
  time in the window is when a snapshot first saw it and its lag the lag then. ``complete`` is
  the fraction of the window filled. A key whose broker did not answer in the latest snapshot
  keeps its last known committed offset with status ``BROKER_DOWN``.

Every rule is plain Spark SQL, no Python UDF: the history is grouped by key once (one
shuffle) into an array of samples sorted by time, and the commits, the window, the rules and
the rates are computed on that array with SQL's higher-order functions (``filter``,
``transform``, ``exists``) in the same stage.
"""

import os

__all__ = ["LagReport", "run_lag_job", "PARTITION_COLUMNS", "GROUP_COLUMNS", "BROKER_COLUMNS"]

PARTITION_COLUMNS = ["group", "kind", "topic", "partition", "committed_offset", "log_end_offset", "lag", "in_flight",
                     "status", "consume_rate", "produce_rate", "catch_up_s", "commit_age_s", "owner", "store",
                     "log_start_offset", "out_of_range", "window_commits", "complete"]
GROUP_COLUMNS = ["group", "kind", "status", "burrow_status", "topics", "partitions", "total_lag", "max_lag",
                 "max_lag_partition", "complete"]
BROKER_COLUMNS = ["broker_id", "url", "status", "registered", "error"]

_KEY = "`group`, topic, broker_id, `partition`, store, kind"
_RANK_SQL = ("CASE status WHEN 'REWIND' THEN 6 WHEN 'STALL' THEN 5 WHEN 'STOP' THEN 4 WHEN 'BROKER_DOWN' THEN 3 "
             "WHEN 'ERR' THEN 3 WHEN 'WARN' THEN 2 WHEN 'OK' THEN 1 ELSE 0 END")


class LagReport:
    """What the job found: rows as dicts, ready to render."""

    def __init__(self, now_ms, snapshots, partitions, groups, brokers, lag_history):
        self.now_ms = now_ms
        self.snapshots = snapshots  # number of snapshots in the history
        self.partitions = partitions  # PARTITION_COLUMNS
        self.groups = groups  # GROUP_COLUMNS
        self.brokers = brokers  # BROKER_COLUMNS, latest snapshot
        self.lag_history = lag_history  # [{"group", "ts_ms", "lag"}]

    @property
    def brokers_down(self):
        return [b for b in self.brokers if b["status"] != "UP"]


def _load(spark, history_dir, table):
    from metaq.spark.collector import arrow_schemas

    path = os.path.join(str(history_dir), table)
    fields = ", ".join("`%s` %s" % (f.name, _ddl(f.type)) for f in arrow_schemas()[table])
    if not os.path.isdir(path) or not any(n.endswith(".parquet") and not n.startswith(".") for n in os.listdir(path)):
        return spark.createDataFrame([], fields)
    return spark.read.schema(fields).parquet(path)


def _ddl(arrow_type):
    return {"int64": "bigint", "int32": "int", "string": "string", "bool": "boolean"}[str(arrow_type)]


def run_lag_job(spark, history_dir, intervals=10, max_age_s=None):
    """Evaluate the history in ``history_dir`` with ``spark``; a :class:`LagReport` (empty if no snapshot yet).

    ``max_age_s``: only snapshots at most this old (before the latest one) are read (None: all).
    """
    if intervals < 2:
        raise ValueError("intervals must be >= 2, got %r" % intervals)
    tables = {t: _load(spark, history_dir, t) for t in ("snapshots", "brokers", "partitions", "offsets")}
    if max_age_s is not None:
        latest = tables["snapshots"].agg({"ts_ms": "max"}).first()[0]
        if latest is not None:
            tables = {t: df.where(df.ts_ms >= latest - int(max_age_s * 1000)) for t, df in tables.items()}
    for table, df in tables.items():
        df.createOrReplaceTempView("mq_" + table)
    sql = spark.sql
    info = sql("SELECT count(*) AS n, max(ts_ms) AS now, slice(sort_array(collect_list(ts_ms), false), 1, %d) "
               "AS recent FROM mq_snapshots" % intervals).first()
    if info["now"] is None:
        return LagReport(None, 0, [], [], [], [])
    now, rate_from = int(info["now"]), int(min(info["recent"]))
    brokers = [r.asDict() for r in sql(
        "SELECT broker_id, url, status, registered, error FROM mq_brokers WHERE ts_ms = %d "
        "ORDER BY broker_id NULLS LAST, url" % now).collect()]
    up = sorted({b["broker_id"] for b in brokers if b["status"] == "UP" and b["broker_id"] is not None})
    history_df = sql(_HISTORY_SQL).cache()
    history_df.createOrReplaceTempView("mq_h")
    sql(_SAMPLES_SQL).createOrReplaceTempView("mq_samples")
    sql(_EVAL_SQL.format(intervals=intervals, rate_from=rate_from)).createOrReplaceTempView("mq_eval")
    up_sql = "array(%s)" % ", ".join(str(b) for b in up) if up else "CAST(array() AS array<int>)"
    report = sql(_REPORT_SQL.format(now=now, intervals=intervals, up=up_sql)).cache()
    report.createOrReplaceTempView("mq_report")
    try:
        partitions = [r.asDict() for r in report.orderBy("group", "topic", "partition", "kind", "store").collect()]
        groups = [r.asDict() for r in sql(_GROUPS_SQL.format(rank=_RANK_SQL)).orderBy("group", "kind").collect()]
        history = [r.asDict() for r in sql(
            "SELECT `group`, ts_ms, sum(lag_n) AS lag FROM mq_h WHERE lag_n IS NOT NULL "
            "GROUP BY `group`, ts_ms ORDER BY `group`, ts_ms").collect()]
    finally:
        report.unpersist()
        history_df.unpersist()
    return LagReport(now, int(info["n"]), partitions, groups, brokers, history)


# Every offsets row with the partition's bounds at the same snapshot and the lag then: the broker's (every kind's
# one decision, metaq.groups.lag), else (ZooKeeper's offsets, a history from before kinds) the end less the offset.
_HISTORY_SQL = """
SELECT o.ts_ms, o.`group`, o.topic, o.broker_id, o.`partition`, o.store, coalesce(o.kind, 'offsets') AS kind,
       o.committed_offset, o.commit_ms, o.commit_version, o.owner, o.in_flight, p.log_start_offset, p.log_end_offset,
       CASE WHEN o.committed_offset IS NULL OR p.log_end_offset IS NULL THEN NULL
            WHEN o.lag IS NOT NULL THEN o.lag
            ELSE greatest(p.log_end_offset - o.committed_offset, 0) END AS lag_n
FROM mq_offsets o LEFT JOIN mq_partitions p
  ON o.ts_ms = p.ts_ms AND o.topic = p.topic AND o.broker_id = p.broker_id AND o.`partition` = p.`partition`
"""

# One row per key: its samples, oldest first (the only shuffle).
_SAMPLES_SQL = """
SELECT {key},
       array_sort(collect_list(struct(ts_ms, committed_offset AS off, commit_ms, commit_version AS ver,
                                      log_start_offset AS lstart, log_end_offset AS lend, lag_n, owner,
                                      in_flight))) AS s
FROM mq_h GROUP BY {key}
""".replace("{key}", _KEY)

# valid: samples with both offsets known; commits: valid samples whose (offset, commit time, version)
# differ from the previous one; w: the last `intervals` commits; rs: the samples of the rate window.
_EVAL_SQL = """
SELECT *,
       size(w) AS n,
       exists(w, e -> e.lag_n = 0) AS any_zero,
       size(filter(w, (e, i) -> i > 0 AND e.off < get(w, i - 1).off)) > 0 AS rewind,
       size(array_distinct(transform(w, e -> e.off))) = 1 AS all_same,
       size(filter(w, (e, i) -> i > 0 AND e.lag_n < get(w, i - 1).lag_n)) = 0 AS lag_never_decreases,
       get(w, 0).ts_ms AS first_ts, get(w, size(w) - 1).ts_ms AS last_ts,
       get(rs, 0) AS r0, get(rs, size(rs) - 1) AS r1
FROM (
  SELECT *, slice(commits, greatest(size(commits) - {intervals} + 1, 1), {intervals}) AS w,
         filter(s, x -> x.ts_ms >= {rate_from} AND x.lag_n IS NOT NULL) AS rs
  FROM (
    SELECT *, filter(valid, (x, i) -> i = 0 OR NOT (x.off <=> get(valid, i - 1).off
                     AND x.commit_ms <=> get(valid, i - 1).commit_ms AND x.ver <=> get(valid, i - 1).ver)) AS commits
    FROM (SELECT *, get(s, size(s) - 1) AS cur, filter(s, x -> x.off IS NOT NULL AND x.lag_n IS NOT NULL) AS valid
          FROM mq_samples)))
"""

_REPORT_SQL = """
SELECT `group`, kind, topic, `partition`, committed_offset, log_end_offset, lag, in_flight, status, consume_rate,
       produce_rate,
       CASE WHEN lag = 0 THEN 0D
            WHEN consume_rate - produce_rate > 0 THEN lag / (consume_rate - produce_rate) END AS catch_up_s,
       commit_age_s, owner, store, log_start_offset, out_of_range, window_commits, complete
FROM (
  SELECT `group`, kind, topic, concat(broker_id, '-', `partition`) AS `partition`, store,
         cur.off AS committed_offset, cur_end AS log_end_offset, cur_start AS log_start_offset,
         CASE WHEN cur.off IS NULL OR cur_end IS NULL THEN NULL ELSE cur.lag_n END AS lag, cur.in_flight AS in_flight,
         CASE WHEN cur_end IS NOT NULL AND r1.ts_ms > r0.ts_ms
              THEN (r1.off - r0.off) * 1000D / (r1.ts_ms - r0.ts_ms) END AS consume_rate,
         CASE WHEN cur_end IS NOT NULL AND r1.ts_ms > r0.ts_ms
              THEN (r1.lend - r0.lend) * 1000D / (r1.ts_ms - r0.ts_ms) END AS produce_rate,
         CASE WHEN cur.commit_ms IS NULL THEN NULL ELSE greatest({now} - cur.commit_ms, 0) / 1000D END AS commit_age_s,
         coalesce(cur.owner, '-') AS owner,
         CASE WHEN cur.off IS NULL OR cur_end IS NULL THEN NULL
              ELSE cur.off < cur_start OR cur.off > cur_end END AS out_of_range,
         n AS window_commits, least(n / {intervals}D, 1D) AS complete,
         CASE WHEN NOT broker_up THEN 'BROKER_DOWN'
              WHEN cur.off IS NULL OR cur_end IS NULL THEN 'NOTFOUND'
              WHEN cur.lag_n <= 0 OR any_zero THEN 'OK'
              WHEN n = 0 THEN 'OK'
              WHEN rewind THEN 'REWIND'
              WHEN ({now} - last_ts) > (last_ts - first_ts) THEN 'STOP'
              WHEN n < 2 THEN 'OK'
              WHEN all_same THEN 'STALL'
              WHEN lag_never_decreases THEN 'WARN'
              ELSE 'OK' END AS status
  FROM (SELECT *, array_contains({up}, broker_id) AS broker_up,
               CASE WHEN cur.ts_ms = {now} THEN cur.lend END AS cur_end,
               CASE WHEN cur.ts_ms = {now} THEN cur.lstart END AS cur_start
        FROM mq_eval)
  WHERE cur.ts_ms = {now} OR NOT broker_up)
"""

_GROUPS_SQL = """
SELECT `group`, kind, max_by(status, rank) AS status,
       CASE WHEN max(rank) >= 3 THEN 'ERR' ELSE max_by(status, rank) END AS burrow_status,
       concat_ws(',', sort_array(collect_set(topic))) AS topics, count(*) AS partitions,
       sum(lag) AS total_lag, max(lag) AS max_lag,
       max_by(concat(topic, '/', `partition`), coalesce(lag, -1)) AS max_lag_partition,
       avg(CASE WHEN complete >= 1D THEN 1D ELSE 0D END) AS complete
FROM (SELECT *, {rank} AS rank FROM mq_report)
GROUP BY `group`, kind
"""
