"""bench/bench_mqtt.py, bench/bench_mqtt_scale.py and bench/bench_cluster.py's held and fan-out modes run end to end
at tiny sizes: every row of their tables is filled from real brokers (Mosquitto where installed; a real ZooKeeper
for the cluster), every message counted as delivered. Figures are not checked: nothing here is timed."""

import re

import pytest

from bench import bench_cluster, bench_mqtt, bench_mqtt_scale

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_comparison_fills_every_row(capsys):
    bench_mqtt.main(["--runs", "1", "--messages", "400", "--fanout-messages", "5", "--latency-n", "20",
                     "--subscribers", "20"])
    out = capsys.readouterr().out
    for row, _unit in bench_mqtt.ROWS:
        line = next(x for x in out.splitlines() if x.startswith(row.replace("1,000", "20")))
        assert "nan" not in line and re.search(r"\d", line[38:])
    shares = re.search(r"fan-out share delivered: (.*)", out).group(1)
    assert all(float(x.split()[-1]) == 1.0 for x in shares.split(", "))
    if bench_mqtt.mosquitto_path():
        assert "mosquitto" in out.splitlines()[2]


def test_the_scale_run_keeps_every_connection_and_delivers_to_every_subscriber(capsys):
    bench_mqtt_scale.main(["--runs", "1", "--connections", "40", "--subscribers", "20", "--keep-alive", "2",
                           "--fanout-messages", "1", "--fleet-seconds", "2", "--storm-gap", "2"])
    out = capsys.readouterr().out
    assert "| connections open at once (seen by the broker) | 40 |" in out
    sent, answered = re.search(r"over 4 s \| (\d+) / (\d+) \|", out).groups()
    assert int(sent) > 0 and sent == answered
    assert "| connections the broker closed during the pings / open after | 0 / 40 |" in out
    assert re.search(r"\| share delivered \| 1\.000 \|( 1\.000 \|)? \|", out)  # metaq (and Mosquitto, where installed)


def test_the_cluster_holds_connections_over_its_brokers_and_fans_out_to_every_subscriber(capsys):
    bench_cluster.main(["--runs", "1", "--held", "60", "--held-brokers", "3", "--held-keep-alive", "10",
                        "--held-seconds", "2", "--held-every", "1"])
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| 3 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "60 (20)"  # every connection seen, 20 on each broker
    sent, answered = cells[7].split(" / ")
    assert int(sent) > 0 and sent == answered and cells[8] == "0 / 60"
    bench_cluster.main(["--runs", "1", "--fanout-only", "--brokers", "1", "2", "--subscribers", "40",
                        "--messages", "2"])
    rows = [x for x in capsys.readouterr().out.splitlines() if re.match(r"\| [12] \| 40 \|", x)]
    assert len(rows) == 2 and all("| 1.000 |" in x for x in rows)


def test_a_reconnect_wave_spreads_its_devices_evenly_and_each_comes_back_with_its_session(capsys, monkeypatch):
    monkeypatch.setattr(bench_cluster, "RECONNECT_HELD_S", 1)
    bench_cluster.main(["--runs", "1", "--reconnect", "60", "--brokers", "3"])
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| 3 | 60 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "20-20"  # 4 generator processes at least: 6 of them, two to each broker
    assert cells[8] == "60" and cells[9] == "0"


def test_half_the_devices_leaving_at_once_closes_none_of_those_that_stay_on_an_unloaded_cluster(capsys, monkeypatch):
    monkeypatch.setattr(bench_cluster, "RECONNECT_HELD_S", 1)
    bench_cluster.main(["--runs", "1", "--leave", "60", "--brokers", "3"])
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| 3 | 60 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:5] == ["30", "0", "0"] and 0 <= int(cells[5]) < 1000  # and the brokers' loops kept up
