"""The dashboard (``/``): plain server-rendered HTML and a small script, no build step.

The page is rendered with the figures of the moment (broker, disk, replication, topics, groups), every
value escaped (topic and group names are user data). ``static/dashboard.js`` then fetches the JSON API every
``REFRESH_S`` seconds, fills the same tables through ``textContent`` (never as HTML), computes each topic's
put and get rates between two fetches, and judges each group partition with Burrow's rules over the commits
it has seen (``metaq/spark/burrow.py`` is the reference: OK, WARN lag growing, STALL committed offset not
moving while lag > 0, STOP no commit for longer than the window spans, REWIND).
"""

import html
import os

from metaq.protocol.httpreply import Response

#: Seconds between two refreshes of the page's figures.
REFRESH_S = 5

_STATIC = os.path.join(os.path.dirname(__file__), "static")


def _read(name):
    with open(os.path.join(_STATIC, name), "rb") as f:
        return f.read()


def _e(value):
    return html.escape(str(value), quote=True)


def _rows(rows):
    return "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % _e(v) for v in row) for row in rows)


class Dashboard:
    """The page and its script; ``views`` is the API's BrokerViews."""

    def __init__(self, views):
        self.views = views
        self.script = _read("dashboard.js")
        self.style = _read("dashboard.css")

    def page(self, request):
        v = self.views
        may_see = v.guard.visible_to(request.session)
        summary = dict(v.summary())
        repl = dict(v.roles.stats_values())
        ready = v.not_ready()
        topics = v.topic_list(may_see)
        groups = v.group_list(may_see)
        broker_rows = [("broker id", summary.get("broker_id")), ("version", summary.get("version")),
                       ("uptime (s)", summary.get("uptime")),
                       ("ready", "yes" if ready is None else "no: %s" % ready),
                       ("disk usage", "%.1f %%" % (100.0 * float(summary.get("disk_usage") or 0))),
                       ("writes refused", summary.get("writes_refused")),
                       ("connections (text port)", summary.get("curr_connections")),
                       ("messages", summary.get("total_messages"))]
        repl_rows = [(k, repl[k]) for k in sorted(repl)]
        body = _PAGE % {
            "refresh": REFRESH_S,
            "broker": _rows(broker_rows),
            "replication": _rows(repl_rows),
            "topics": _rows((t["topic"], t["partitions"], t["messages"], t["bytes"], "…", "…") for t in topics)
            or _EMPTY % 6,
            "groups": _rows((g["group"], g["topic"], g["partition"], g["offset"], g["max_offset"], g["lag"], "…")
                            for g in groups) or _EMPTY % 7,
        }
        return Response(200, body, "text/html; charset=utf-8",
                        [("Content-Security-Policy", "default-src 'self'; object-src 'none'; base-uri 'none'")])

    def js(self, request):
        return Response(200, self.script, "text/javascript; charset=utf-8")

    def css(self, request):
        return Response(200, self.style, "text/css; charset=utf-8")


_EMPTY = '<tr class="empty"><td colspan="%d">none</td></tr>'

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>metaq dashboard</title>
<link rel="stylesheet" href="/dashboard.css">
</head>
<body data-refresh="%(refresh)s">
<h1>metaq</h1>
<p><a href="/dashboard/topics">a topic, live over MQTT</a></p>
<p id="status">figures as rendered by the broker; refreshing every %(refresh)s s</p>
<section><h2>Broker</h2><table id="broker"><tbody>%(broker)s</tbody></table></section>
<section><h2>Replication</h2><table id="replication"><tbody>%(replication)s</tbody></table></section>
<section><h2>Topics</h2>
<table id="topics"><thead><tr><th>topic</th><th>partitions</th><th>messages</th><th>bytes</th>
<th>puts/s</th><th>gets/s</th></tr></thead><tbody>%(topics)s</tbody></table></section>
<section><h2>Consumer groups (offsets kept by this broker)</h2>
<table id="groups"><thead><tr><th>group</th><th>topic</th><th>partition</th><th>committed</th><th>end</th>
<th>lag</th><th>status</th></tr></thead><tbody>%(groups)s</tbody></table></section>
<script src="/dashboard.js"></script>
</body>
</html>
"""


def add_routes(router, dashboard):
    from metaq.protocol.httpreply import READ
    router.add("GET", "/", READ, dashboard.page)
    router.add("GET", "/dashboard", READ, dashboard.page)
    router.add("GET", "/dashboard.js", READ, dashboard.js)
    router.add("GET", "/dashboard.css", READ, dashboard.css)
