"""``metaq-spark-report`` lists every kind of consumer group with its lag: a text group, a POP group, an MQTT shared
group and an offline persistent session (their states: ``tests/groups/test_every_group_lag.py``'s ``groups``)."""

import csv
import os

import pytest

from tests.groups.test_every_group_lag import EXPECTED, _lags, groups  # noqa: F401 (the fixture)
from tests.harness.broker import url_of

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


def test_the_spark_report_lists_every_kind_of_group_with_its_lag(spark, groups, tmp_path, capsys):  # noqa: F811
    from metaq.spark.report import main

    out = str(tmp_path / "report")
    assert main(["--brokers", url_of(groups), "--out", out, "-q"]) == 0, capsys.readouterr()
    with open(os.path.join(out, "lag.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert _lags(rows, number=lambda v: int(v) if v else None) == EXPECTED, rows
    with open(os.path.join(out, "groups.csv"), newline="") as f:
        totals = {(g["group"], g["kind"]): int(g["total_lag"]) for g in csv.DictReader(f)}
    assert {k: totals.get(k) for k in EXPECTED} == {k: v[0] for k, v in EXPECTED.items()}
