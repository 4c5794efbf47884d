"""examples/orders_pipeline.py, run as the README shows it, against a real broker: right figures, each once."""

import json
import os
import sys
from collections import defaultdict
from datetime import datetime, timezone

import pytest

from tests.harness.broker import url_of
from tests.harness.listeners import is_loopback, run_watching

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import orders_pipeline  # noqa: E402


def run_example(*args, listeners=None):
    """Run the example to its end (it ends by itself); ``listeners``: a set given every (address, port) that the
    example's process tree (PySpark's JVM among it) listened on, sampled through the run."""
    code, stdout, stderr, seen = run_watching([sys.executable, os.path.join(ROOT, "examples", "orders_pipeline.py"),
                                               *args], 600, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    if listeners is not None:
        listeners |= seen
    return stdout


def expected_minutes(n):
    """Revenue and order count per minute of the demo orders, for the minutes the watermark has closed."""
    orders = orders_pipeline.demo_orders(n)
    latest = max(t for _o, _a, t in orders)
    per = defaultdict(lambda: [0.0, 0])
    for _o, amount, t in orders:
        minute = int(t // 60 * 60)
        per[minute][0] += amount
        per[minute][1] += 1
    closed = {m: (round(v[0], 2), v[1]) for m, v in per.items() if m + 60 <= latest - 60}
    assert len(closed) == 8  # ten minutes of orders, the last two still open
    return closed


def test_the_example_pipeline_writes_each_closed_minute_once_to_the_table_and_the_topic(broker, spark, tmp_path):
    url, work = url_of(broker), str(tmp_path / "work")
    listened = set()
    stdout = run_example("--brokers", url, "--demo", "3000", "--work", work, listeners=listened)
    assert "put 3000 demo orders" in stdout
    assert listened, "no listening socket of the example's Spark driver was seen"
    assert all(is_loopback(address) for address, _port in listened), listened  # Spark on 127.0.0.1 only, no UI
    expected = expected_minutes(3000)

    def table():
        rows = spark.read.parquet(os.path.join(work, "revenue")).collect()
        return sorted((int(r["minute"].replace(tzinfo=timezone.utc).timestamp()), r["revenue"], r["orders"])
                      for r in rows)

    def topic():
        rows = spark.read.format("metaq").option("brokers", url).option("topic", "revenue").load().collect()
        out = []
        for r in rows:
            doc = json.loads(bytes(r["value"]))
            minute = int(datetime.fromisoformat(doc["minute"].replace("Z", "+00:00")).timestamp())
            assert r["key"] == datetime.fromtimestamp(minute, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
            out.append((minute, doc["revenue"], doc["orders"]))
        return sorted(out)

    want = sorted((m, rev, n) for m, (rev, n) in expected.items())
    assert [(m, n) for m, _r, n in table()] == [(m, n) for m, _r, n in want]
    assert all(abs(a[1] - b[1]) < 0.011 for a, b in zip(table(), want, strict=True))
    assert topic() == table()  # the same minutes, each once

    run_example("--brokers", url, "--work", work)  # again, from the checkpoints: nothing new, nothing twice
    assert topic() == table() and len(table()) == 8
