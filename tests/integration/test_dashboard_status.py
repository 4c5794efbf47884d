"""README "The dashboard": the page's Burrow status column follows the rules of metaq/spark/burrow.py. The
page's own `partitionStatus` (taken from metaq/server/http/static/dashboard.js as served) runs in headless
Chromium over windows of commits that give each status, and its answers equal burrow.py's."""

import html
import json
import os
import re

from metaq.spark.burrow import Commit, partition_status
from tests.harness.http import chromium

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "metaq", "server", "http", "static", "dashboard.js")

NOW = 1000.0
#: (name, [(ts, offset, lag)], current lag) with the status burrow.py gives each
CASES = [
    ("no offset", [], None),
    ("no commits seen", [], 5),
    ("caught up", [(990, 10, 3), (995, 13, 0)], 0),
    ("lag reached 0 in the window", [(990, 10, 0), (995, 12, 2)], 2),
    ("consuming, lag shrinking", [(990, 10, 8), (995, 14, 6), (999, 18, 4)], 4),
    ("lag grows", [(990, 10, 5), (995, 12, 7), (999, 14, 9)], 9),
    ("offset does not move", [(990, 10, 5), (995, 10, 6), (999, 10, 7)], 7),
    ("no commit for longer than the window", [(900, 10, 5), (910, 12, 6)], 6),
    ("offset went back", [(990, 10, 5), (995, 4, 11), (999, 6, 9)], 9),
]


def page_function():
    with open(SCRIPT, encoding="utf-8") as f:
        source = f.read()
    m = re.search(r"\n  function partitionStatus\(window, lag, now\) \{\n.*?\n  \}\n", source, re.S)
    assert m, "partitionStatus not found in dashboard.js"
    return m.group(0)


def test_the_pages_burrow_status_equals_burrow_py_for_each_status(tmp_path):
    cases = [{"name": n, "window": [{"ts": ts, "offset": o, "lag": lag} for ts, o, lag in w], "lag": lag}
             for n, w, lag in CASES]
    page = tmp_path / "status.html"
    page.write_text("<!doctype html><html><body><pre id=out></pre><script>\"use strict\";\n%s\n"
                    "var cases = %s;\ndocument.getElementById('out').textContent = JSON.stringify(cases.map("
                    "function (c) { return partitionStatus(c.window, c.lag, %r); }));\n</script></body></html>"
                    % (page_function(), json.dumps(cases), NOW), encoding="utf-8")
    dom = chromium("file://%s" % page, "--dump-dom", "--user-data-dir=%s" % (tmp_path / "chromium"))
    got = json.loads(html.unescape(re.search(r"<pre id=\"out\">(.*?)</pre>", dom, re.S).group(1)))
    want = [partition_status([Commit(ts, o, lag) for ts, o, lag in w], lag, NOW) for _n, w, lag in CASES]
    assert got == want, list(zip([c[0] for c in CASES], got, want, strict=False))
    assert {"NOTFOUND", "OK", "WARN", "STALL", "STOP", "REWIND"} <= set(want), want  # every status is covered


def test_the_pages_put_rate_moves_for_a_topic_being_written_and_is_zero_for_an_idle_one(broker_factory, tmp_path):
    """The topic table's put and get rates are computed by the page between two refreshes: a topic written
    meanwhile shows a positive put rate, an idle one 0.0, and nothing read shows a get rate of 0.0."""
    import threading

    from metaq.client.local import small_config
    from tests.harness.http import http_port, with_http

    b = broker_factory(with_http(small_config(tmp_path / "data")))
    stop = threading.Event()
    with b.client() as c:
        c.put_ok("t-idle", b"once", 0)
        c.put_ok("t-busy", b"first", 0)

    def write():
        with b.client() as c:
            while not stop.is_set():
                c.put_ok("t-busy", b"more", 0)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        dom = chromium("http://127.0.0.1:%d/" % http_port(b), "--dump-dom", "--user-data-dir=%s" %
                       (tmp_path / "chromium"), budget_ms=8000)
    finally:
        stop.set()
        writer.join(30)
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"<tr><td>(t-\w+)</td><td>\d+</td><td>\d+</td><td>\d+</td><td>([^<]*)</td><td>([^<]*)</td></tr>", dom)}
    assert set(rows) >= {"t-idle", "t-busy"}, dom
    assert rows["t-idle"] == ("0.0", "0.0"), rows  # a second refresh ran: the first shows "…"
    busy_puts, busy_gets = rows["t-busy"]
    assert float(busy_puts) > 0 and busy_gets == "0.0", rows
