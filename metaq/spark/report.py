"""``metaq-spark-report``: collect an offsets snapshot, then run the PySpark lag job and write the report.

    metaq-spark-report --zk 127.0.0.1:2181 --out /var/lib/metaq-report
    metaq-spark-report --brokers meta://10.0.0.1:8123,meta://10.0.0.2:8123 --out report/
    metaq-spark-report --out report/ --no-collect          # re-evaluate the history only

Each run appends one snapshot to ``OUT/history`` (``--history``), so running it every minute
from cron builds the window Burrow's rules need. Writes into ``OUT``: ``report.html`` with
``lag_over_time.png``, ``lag_by_partition.png`` and ``overview.png``; ``lag.csv``,
``groups.csv``, ``brokers.csv`` (header row first); ``lag.parquet`` and ``groups.parquet``;
and prints the tables. Progress goes to stderr (a bar on a terminal, one line per step
otherwise). Exit codes: 0 ok; 1 a broker or ZooKeeper did not answer (reported, and the
report is still written); 2 usage.
"""

import argparse
import os
import sys
import time

import metaq
from metaq import errors
from metaq.client import security as client_security
from metaq.spark.session import local_session

__all__ = ["main", "run_report", "Progress", "spark_session"]

EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE = 0, 1, 2


class Progress:
    """Steps of a run on ``stream``: a redrawn bar on a terminal, plain lines otherwise, nothing when quiet."""

    def __init__(self, total, stream=None, quiet=False, width=24):
        self.total, self.done, self.width, self.quiet = total, 0, width, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = ""

    def step(self, text):
        self.done = min(self.done + 1, self.total)
        self._show(text, newline_when_plain=True)

    def note(self, text):
        """Detail inside the current step (only a terminal shows it)."""
        if self.tty:
            self._show(text, newline_when_plain=False)

    def _show(self, text, newline_when_plain):
        if self.quiet:
            return
        if self.tty:
            filled = self.width * self.done // max(self.total, 1)
            line = "[%s%s] %d/%d %s" % ("#" * filled, "." * (self.width - filled), self.done, self.total, text)
            pad = max(0, len(self._last) - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._last = line
        elif newline_when_plain:
            self.stream.write("metaq-spark-report: [%d/%d] %s\n" % (self.done, self.total, text))
        self.stream.flush()

    def finish(self):
        """End the bar's line (before other output, e.g. the JVM's start-up messages)."""
        if self.tty and not self.quiet and self._last:
            self.stream.write("\n")
            self.stream.flush()
            self._last = ""


def spark_session(master="local[*]"):
    """``(spark, created)``: the running SparkSession if there is one, else a new local one (``local_session``:
    on loopback only, UI off, quiet)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        return SparkSession.builder.getOrCreate(), False
    spark = local_session("metaq-spark-report", master, {"spark.sql.shuffle.partitions": "4"})  # loopback only
    return spark, True


def run_report(out_dir, zk=None, brokers=(), *, zk_root="/meta", history_dir=None, collect=True, intervals=10,
               max_age_s=7 * 86400, spark=None, master="local[*]", clock=time.time, timeout=5.0, progress=None,
               security=None):
    """Collect a snapshot (unless ``collect`` is False), run the lag job, write every output.

    Returns ``(report, problems)``: the :class:`metaq.spark.lagjob.LagReport` and the list of
    things that did not answer. ``max_age_s``: evaluate only the snapshots this recent (before
    the latest one). ``spark``: a session to use (default: the running one, or a new local one
    that is stopped at the end). ``security``: credentials and TLS for the brokers
    (``metaq.client.security``; None: the environment).
    """
    from metaq.spark.lagjob import run_lag_job

    progress = progress or Progress(6, quiet=True)
    os.makedirs(out_dir, exist_ok=True)
    history_dir = history_dir or os.path.join(out_dir, "history")
    if collect:
        problems = _collect(zk, brokers, zk_root, history_dir, clock, timeout, progress, security)
    else:
        problems = []
        progress.step("not collecting (--no-collect)")
        progress.step("history in %s" % history_dir)
    progress.step("starting Spark")
    created = False
    if spark is None:
        progress.finish()  # the JVM prints its own start-up lines
        spark, created = spark_session(master)
    try:
        progress.step("running the lag job")
        report = run_lag_job(spark, history_dir, intervals, max_age_s)
    finally:
        if created:
            spark.stop()
    _write_outputs(report, out_dir, progress)
    progress.finish()
    return report, problems


def _collect(zk, brokers, zk_root, history_dir, clock, timeout, progress, security=None):
    """Take a snapshot and append it to the history; the list of what did not answer."""
    from metaq.spark import collector

    progress.step("collecting offsets")
    try:
        snap = collector.collect_snapshot(zk, brokers, zk_root, clock=clock, timeout=timeout,
                                          known_ids=collector.known_broker_ids(history_dir), progress=progress.note,
                                          security=security)
    except errors.MetaqError as exc:
        progress.step("no snapshot taken; using the history in %s" % history_dir)
        return ["ZooKeeper %s: %s" % (zk, exc)]
    progress.step("appending the snapshot to %s" % history_dir)
    collector.write_snapshot(snap, history_dir)
    return snap.problems


def _write_outputs(report, out_dir, progress):
    from metaq.spark import render
    from metaq.spark.lagjob import BROKER_COLUMNS, GROUP_COLUMNS, PARTITION_COLUMNS

    progress.step("writing CSV and Parquet")
    for name, rows, columns in (("lag", report.partitions, PARTITION_COLUMNS),
                                ("groups", report.groups, GROUP_COLUMNS)):
        render.write_csv(rows, columns, os.path.join(out_dir, name + ".csv"))
        render.write_parquet(rows, columns, os.path.join(out_dir, name + ".parquet"))
    render.write_csv(report.brokers, BROKER_COLUMNS, os.path.join(out_dir, "brokers.csv"))
    progress.step("drawing charts and the HTML page")
    charts = render.write_charts(report, out_dir)
    render.write_overview_png(report, os.path.join(out_dir, "overview.png"))
    render.write_html(report, out_dir, charts)


def build_parser():
    p = argparse.ArgumentParser(prog="metaq-spark-report", description="Consumer-lag report of a metaq cluster: "
                                "collect an offsets snapshot, evaluate the history with PySpark (Burrow's rules), "
                                "write tables, CSV, Parquet and an HTML page with charts.")
    p.add_argument("--zk", metavar="HOST:PORT[,...][/chroot]", default=os.environ.get("METAQ_ZK"),
                   help="ZooKeeper: brokers, group offsets and owners (default $METAQ_ZK)")
    p.add_argument("--zk-root", default="/meta", help="root of MetaQ's layout in ZooKeeper (default /meta)")
    p.add_argument("--brokers", metavar="URL[,URL...]", default=os.environ.get("METAQ_BROKERS"),
                   help="meta://host:port brokers to ask as well (default $METAQ_BROKERS)")
    p.add_argument("--out", required=True, metavar="DIR", help="where the report goes")
    p.add_argument("--history", metavar="DIR", help="the snapshot history (default OUT/history)")
    p.add_argument("--no-collect", action="store_true", help="do not take a snapshot; evaluate the history only")
    p.add_argument("--intervals", type=int, default=10, help="commits in Burrow's window (default 10)")
    p.add_argument("--max-age-hours", type=float, default=168.0,
                   help="read only the snapshots of this many hours before the latest (default 168: a week)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each broker (default 5)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress and no table")
    p.add_argument("--version", action="version", version="metaq-spark-report %s" % metaq.__version__)
    client_security.add_arguments(p)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    brokers = [u.strip() for u in (args.brokers or "").split(",") if u.strip()]
    if not args.no_collect and not args.zk and not brokers:
        print("metaq-spark-report: give --zk HOST:PORT and/or --brokers meta://host:port[,...] "
              "(or --no-collect)", file=sys.stderr)
        return EXIT_USAGE
    if args.intervals < 2:
        print("metaq-spark-report: --intervals must be >= 2", file=sys.stderr)
        return EXIT_USAGE
    try:
        security = client_security.from_cli(args)
    except errors.ConfigError as exc:
        print("metaq-spark-report: %s" % exc, file=sys.stderr)
        return EXIT_USAGE
    try:  # fail early, before collecting, without the spark extra
        import importlib

        for module in ("pyspark", "pyarrow", "matplotlib"):
            importlib.import_module(module)
    except ImportError as exc:
        print("metaq-spark-report: %s; install the extra: pip install 'metaq[spark]'" % exc, file=sys.stderr)
        return EXIT_USAGE
    progress = Progress(6, quiet=args.quiet)
    report, problems = run_report(args.out, args.zk, brokers, zk_root=args.zk_root, history_dir=args.history,
                                  collect=not args.no_collect, intervals=args.intervals,
                                  max_age_s=args.max_age_hours * 3600, master=args.master,
                                  timeout=args.timeout, progress=progress, security=security)
    if not args.quiet:
        from metaq.spark.render import console_text

        print(console_text(report))
        print("\nreport: %s" % os.path.join(args.out, "report.html"))
    for problem in problems:
        print("metaq-spark-report: could not read %s" % problem, file=sys.stderr)
    return EXIT_UNREACHABLE if problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
