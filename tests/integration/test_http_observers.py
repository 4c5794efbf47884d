"""What watches the HTTP port, for real: Debian's Prometheus scrapes a broker, promtool checks /metrics, headless
Chromium loads the dashboard (and takes the README's screenshot, docs/dashboard.png)."""

import os
import re
import subprocess

from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.broker import wait_for
from tests.harness.http import PrometheusProcess, chromium, http_port, need, request, with_http

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")


def _put_some(b, topic, n, partition=0):
    with b.client() as c:
        for i in range(n):
            c.put_ok(topic, b"message %d" % i, partition)


def _commit(b, group, topic, partition, offset):
    with b.client() as c:
        r = c.call(ev.CommitOffset(group, topic, partition, offset, c.opaque()))
        assert r.code == 200, r


def test_prometheus_scrapes_the_broker_and_its_query_api_returns_what_stats_reports(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data")))
    _put_some(b, "t-prom", 7)
    _commit(b, "g-prom", "t-prom", 0, 3)
    with b.client() as c:
        topic = c.stats_dict("t-prom")  # `stats <topic>`
        summary = c.stats_dict()
    stats_puts = int(re.match(r"Count=(\d+),", topic["topic_realtime_put"]).group(1))
    assert stats_puts == 7
    prom = PrometheusProcess(tmp_path / "prom", ["127.0.0.1:%d" % http_port(b)]).start()
    try:
        def value(expr):
            found = prom.query(expr)
            return found and float(found[0]["value"][1])

        wait_for(lambda: value('metaq_topic_puts_total{topic="t-prom"}') == stats_puts, 60,
                 what=lambda: "prometheus has the put count: %s; targets %s; log %s" % (
                     prom.query('metaq_topic_puts_total'), prom.targets(), prom.log_tail()))
        assert value('metaq_topic_messages{topic="t-prom"}') == int(topic["message_count"]) == 7
        assert value('metaq_topic_log_bytes{topic="t-prom"}') == int(topic["bytes"])
        assert value('metaq_group_lag_messages{group="g-prom",topic="t-prom",partition="0"}') == 4
        assert value('metaq_replication_epoch') == float(summary["replication_epoch"])
        assert value('metaq_flush_duration_seconds_count') >= 1  # sync flush: every put waited for an fsync
        assert value('up{job="metaq"}') == 1
    finally:
        prom.stop()


def test_promtool_check_metrics_passes_on_the_metrics_output(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data")))
    _put_some(b, "t-lint", 3)
    _commit(b, "g-lint", "t-lint", 0, 1)
    text = request(b, "GET", "/metrics").body
    for name in (b"metaq_topic_puts_total", b"metaq_flush_duration_seconds_bucket", b"metaq_connections",
                 b"metaq_group_lag_messages", b"metaq_transactions", b"metaq_delay_pending_messages",
                 b"metaq_replication_role", b"metaq_disk_usage_ratio", b"metaq_long_poll_waiters"):
        assert name in text, name
    assert b"_created" not in text
    r = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout, r.stderr)


def test_the_dashboard_loads_in_headless_chromium_with_the_brokers_topics_and_groups(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data")))
    for topic, n in (("orders", 40), ("payments", 12), ("audit-log", 5)):
        _put_some(b, topic, n)
    _commit(b, "billing", "orders", 0, 25)
    _commit(b, "fraud-check", "payments", 0, 12)
    url = "http://127.0.0.1:%d/" % http_port(b)
    profile = ["--user-data-dir=%s" % (tmp_path / "chromium")]
    dom = chromium(url, "--dump-dom", *profile, budget_ms=8000)
    assert "refreshing every" in dom and "updated " in dom  # the page's script ran and refreshed the tables
    for name in ("orders", "payments", "audit-log", "billing", "fraud-check"):
        assert ">%s<" % name in dom, name
    # the group table, as the script filled it: billing has 15 to go on orders-0
    assert re.search(r"<td>billing</td><td>orders</td><td>0</td><td>25</td><td>40</td><td>15</td><td class=\"\w+\">",
                     dom), dom
    shot = tmp_path / "dashboard.png"
    chromium(url, "--screenshot=%s" % shot, "--window-size=1280,900", "--hide-scrollbars", *profile,
             budget_ms=12000)
    with open(shot, "rb") as f:
        png = f.read()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    if os.environ.get("METAQ_UPDATE_SCREENSHOT"):  # refresh the README's picture: METAQ_UPDATE_SCREENSHOT=1
        with open(os.path.join(DOCS, "dashboard.png"), "wb") as f:
            f.write(png)
