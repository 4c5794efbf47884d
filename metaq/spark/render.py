"""Renderings of a :class:`metaq.spark.lagjob.LagReport`: console table, CSV, Parquet, PNG charts and an HTML page.

matplotlib (Agg backend) and pyarrow are imported only when a chart or a Parquet file is written.
"""

import csv
import html
import os
import time

from metaq.admincli import render_table
from metaq.spark.lagjob import BROKER_COLUMNS, GROUP_COLUMNS, PARTITION_COLUMNS

__all__ = ["console_text", "write_csv", "write_parquet", "write_charts", "write_html", "write_overview_png",
           "STATUS_COLORS", "STATUS_MEANING"]

STATUS_COLORS = {"OK": "#2e7d32", "WARN": "#ef8f00", "STOP": "#c62828", "STALL": "#ad1457", "REWIND": "#6a1b9a",
                 "BROKER_DOWN": "#37474f", "NOTFOUND": "#9e9e9e", "ERR": "#c62828",
                 "UP": "#2e7d32", "DOWN": "#c62828"}  # the last two: brokers
STATUS_MEANING = {
    "OK": "the consumer keeps up: no lag now, or the lag was zero at some commit in the window, or it is shrinking",
    "WARN": "the consumer commits advancing offsets but the lag never decreased over the window: too slow",
    "STALL": "the consumer keeps committing the same offset while there is lag: stuck on a message",
    "STOP": "no commit for longer than the window spans, with lag: the consumer is gone or hung",
    "REWIND": "the committed offset went backwards in the window: a reset or a replay",
    "BROKER_DOWN": "the partition's broker did not answer: offsets are the last known ones, lag unknown",
    "NOTFOUND": "no committed offset, or the partition is not on its broker (nothing to judge)",
}


def _fmt(value, column=None):
    if value is None:
        return None
    if isinstance(value, float):
        if column == "complete":
            return "%.0f%%" % (value * 100)
        return "%.1f" % value if column == "catch_up_s" or column == "commit_age_s" else "%.2f" % value
    return value


def _ts(ms):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000.0)) if ms is not None else "-"


def console_text(report):
    """The report as plain tables: brokers (if any is down), groups, partitions."""
    if report.now_ms is None:
        return "no snapshot in the history yet"
    parts = ["metaq consumer lag at %s (%d snapshot%s)" % (_ts(report.now_ms), report.snapshots,
                                                          "" if report.snapshots == 1 else "s")]
    if report.brokers_down:
        parts += ["", "BROKERS NOT ANSWERING", render_table(report.brokers_down, BROKER_COLUMNS)]
    cols = ["group", "kind", "topic", "partition", "committed_offset", "log_end_offset", "lag", "in_flight", "status",
            "consume_rate", "produce_rate", "catch_up_s", "commit_age_s", "owner", "store"]
    rows = [{c: _fmt(r[c], c) for c in cols} for r in report.partitions]
    groups = [{c: _fmt(g[c], c) for c in GROUP_COLUMNS} for g in report.groups]
    parts += ["", render_table(groups, GROUP_COLUMNS), "", render_table(rows, cols)]
    return "\n".join(parts)


def write_csv(rows, columns, path):
    """``rows`` as CSV with a header row; None is an empty cell."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in columns])
    return path


def write_parquet(rows, columns, path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows]) if rows else \
        pa.table({c: pa.array([], pa.string()) for c in columns})
    pq.write_table(table, path)
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _plot_lag_over_time(ax, report):
    import datetime

    by_group = {}
    for r in report.lag_history:
        by_group.setdefault(r["group"], []).append(r)
    for group, rows in sorted(by_group.items()):
        xs = [datetime.datetime.fromtimestamp(r["ts_ms"] / 1000.0) for r in rows]
        ax.plot(xs, [r["lag"] for r in rows], marker="o", markersize=3, linewidth=1.8, label=group)
    ax.set_title("Lag over time per group (messages)")
    ax.set_ylabel("lag (messages)")
    ax.grid(True, alpha=0.3)
    if by_group:
        ax.legend(fontsize=8, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no lag history yet", ha="center", va="center", transform=ax.transAxes)
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    for label in ax.get_xticklabels():
        label.set_rotation(20)
        label.set_fontsize(8)


def _plot_lag_by_partition(ax, report):
    rows = [r for r in report.partitions]
    labels = ["%s  %s/%s%s" % (r["group"], r["topic"], r["partition"], "" if r["store"] == "zk" else
                               " (broker)" if r.get("kind") in (None, "offsets") else " (%s)" % r["kind"])
              for r in rows]
    values = [r["lag"] or 0 for r in rows]
    colors = [STATUS_COLORS.get(r["status"], "#9e9e9e") for r in rows]
    ys = list(range(len(rows)))
    ax.barh(ys, values, color=colors)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_title("Lag per partition now (colour = status)")
    ax.set_xlabel("lag (messages)")
    ax.grid(True, axis="x", alpha=0.3)
    for y, r, v in zip(ys, rows, values, strict=True):
        ax.text(v, y, " %s" % r["status"], va="center", fontsize=7, color=STATUS_COLORS.get(r["status"], "#555"))
    if not rows:
        ax.text(0.5, 0.5, "no consumer group found", ha="center", va="center", transform=ax.transAxes)


def write_charts(report, out_dir):
    """``lag_over_time.png`` and ``lag_by_partition.png`` in ``out_dir``; their paths."""
    plt = _pyplot()
    paths = []
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    _plot_lag_over_time(ax, report)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "lag_over_time.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
    height = max(3.0, 0.8 + 0.28 * len(report.partitions))
    fig, ax = plt.subplots(figsize=(9, height), dpi=100)
    _plot_lag_by_partition(ax, report)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "lag_by_partition.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


def write_overview_png(report, path):
    """One picture of the page: the group table above both charts (for mail, chat or a README)."""
    plt = _pyplot()
    n = max(1, len(report.groups))
    parts_h = max(2.6, 0.8 + 0.28 * len(report.partitions))
    fig = plt.figure(figsize=(11, 1.1 + 0.28 * n + 3.6 + parts_h), dpi=100)
    grid = fig.add_gridspec(3, 1, height_ratios=[0.6 + 0.28 * n, 3.4, parts_h], hspace=0.45)
    ax = fig.add_subplot(grid[0])
    ax.axis("off")
    ax.set_title("metaq consumer lag  -  %s  (%d snapshots)" % (_ts(report.now_ms), report.snapshots), loc="left",
                 fontsize=13, fontweight="bold")
    columns = ["group", "status", "topics", "partitions", "total_lag", "max_lag_partition", "complete"]
    cells = [["-" if _fmt(g[c], c) is None else str(_fmt(g[c], c)) for c in columns] for g in report.groups] or \
        [["-"] * len(columns)]
    table = ax.table(cellText=cells, colLabels=["group", "status", "topics", "partitions", "total lag",
                                                "max lag at", "windows full"], loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    for i, g in enumerate(report.groups, start=1):
        table[i, 1].set_facecolor(STATUS_COLORS.get(g["status"], "#ffffff"))
        table[i, 1].get_text().set_color("white")
    if report.brokers_down:
        down = ", ".join("%s %s" % ("?" if b["broker_id"] is None else b["broker_id"], b["url"])
                         for b in report.brokers_down)
        ax.text(0, -0.05, "Brokers not answering: " + down, transform=ax.transAxes, color=STATUS_COLORS["STOP"],
                fontsize=9, va="top")
    _plot_lag_over_time(fig.add_subplot(grid[1]), report)
    _plot_lag_by_partition(fig.add_subplot(grid[2]), report)
    fig.subplots_adjust(left=0.2, right=0.95, top=0.96, bottom=0.05)
    fig.savefig(path)
    plt.close(fig)
    return path


def _html_table(rows, columns, status_col="status"):
    head = "".join("<th>%s</th>" % html.escape(c) for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = _fmt(r.get(c), c)
            text = "" if v is None else html.escape(str(v))
            if c == status_col and v:
                cells.append('<td><span class="st" style="background:%s">%s</span></td>'
                             % (STATUS_COLORS.get(v, "#9e9e9e"), text))
            else:
                cells.append("<td>%s</td>" % text)
        body.append("<tr>%s</tr>" % "".join(cells))
    return "<table><thead><tr>%s</tr></thead><tbody>%s</tbody></table>" % (head, "".join(body) or
                                                                           "<tr><td>(nothing)</td></tr>")


_CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#f0f0f0}
.st{color:#fff;padding:1px 6px;border-radius:3px;font-weight:bold}img{max-width:100%;border:1px solid #ddd}
.down{background:#fff3f3;border:1px solid #c62828;padding:.5em 1em}"""


def write_html(report, out_dir, charts):
    """``report.html`` in ``out_dir`` showing the tables and the ``charts`` (paths of PNGs in ``out_dir``)."""
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>metaq consumer lag</title>",
             "<style>%s</style></head><body>" % _CSS,
             "<h1>metaq consumer lag</h1><p>At %s, from %d snapshot%s.</p>"
             % (_ts(report.now_ms), report.snapshots, "" if report.snapshots == 1 else "s")]
    if report.brokers_down:
        parts.append("<div class='down'><h2>Brokers not answering</h2>%s</div>"
                     % _html_table(report.brokers_down, BROKER_COLUMNS))
    parts.append("<h2>Groups</h2>" + _html_table(report.groups, GROUP_COLUMNS))
    for path in charts:
        parts.append("<p><img src='%s' alt='%s'></p>" % (html.escape(os.path.basename(path)),
                                                        html.escape(os.path.basename(path))))
    parts.append("<h2>Partitions</h2>" + _html_table(report.partitions, PARTITION_COLUMNS))
    parts.append("<h2>Brokers</h2>" + _html_table(report.brokers, BROKER_COLUMNS))
    legend = "".join("<tr><td><span class='st' style='background:%s'>%s</span></td><td>%s</td></tr>"
                     % (STATUS_COLORS[s], s, html.escape(m)) for s, m in STATUS_MEANING.items())
    parts.append("<h2>Statuses</h2><table>%s</table>" % legend)
    parts.append("<p>Files: lag.csv, groups.csv, brokers.csv, lag.parquet, groups.parquet.</p></body></html>")
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    return path
