"""The lag report against real brokers, a real ZooKeeper and a real local Spark.

Five groups are put into known states over six snapshots taken one (injected) minute apart;
every figure is checked against values computed here from what the test produced and
committed. Then a broker is killed and the report run again through the command line.
"""

import csv
import os
import time

import pytest
from kazoo.client import KazooClient

from metaq.protocol import events as ev
from metaq.client.local import free_port, small_config
from tests.harness.broker import url_of, wait_for

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow

TOPIC = "orders"
STEPS = 6  # snapshots 0..5, 60 s apart
BASE_END = 20  # messages per partition before snapshot 0; +10 per partition before each later snapshot


def end_at(i):
    return BASE_END + 10 * i


# Commits per snapshot i, independent of the code under test.
def caught(i):
    return end_at(i)  # always at the log end


def lagging_slow(i):
    return 5 + 6 * i  # 6 per minute against 10 produced: lag grows


def lagging_fast(i):
    return 2 + 12 * i  # 12 per minute: lag shrinks


def stalled(i):
    return 7  # committed again and again, never moving


def stopped(i):
    return (10, 15)[i] if i < 2 else None  # two commits, then nothing


def rewound(i):
    return (10, 14, 18, 5, 9, 12)[i]


def start_zk_broker(broker_factory, zk_connect, broker_id):
    b = broker_factory(start=False)
    b.config = small_config(os.path.join(str(b.workdir), "data"), zk={"connect": zk_connect},
                            topics=[{"name": TOPIC, "partitions": 2}, {"name": "*", "partitions": 1}])
    b.config["broker"]["id"] = broker_id
    b.data_dir = b.config["broker"]["data_dir"]
    return b.start()


@pytest.fixture
def report_cluster(broker_factory, zk_connect):
    b1 = start_zk_broker(broker_factory, zk_connect, 1)
    b2 = start_zk_broker(broker_factory, zk_connect, 2)
    zk = KazooClient(hosts=zk_connect)
    zk.start(15)
    wait_for(lambda: len(zk.get_children("/meta/brokers/topics-pub/%s" % TOPIC)) == 2
             if zk.exists("/meta/brokers/topics-pub/%s" % TOPIC) else False, what="both brokers registered")
    yield zk_connect, zk, {1: b1, 2: b2}
    zk.stop()
    zk.close()


def zk_commit(zk, group, part, value):
    path = "/meta/consumers/%s/offsets/%s/%s" % (group, TOPIC, part)
    if zk.exists(path):
        zk.set(path, value.encode())
    else:
        zk.create(path, value.encode(), makepath=True)


def play(zk, brokers, clients, i):
    """Produce up to end_at(i) on every partition, then commit what each group has reached at snapshot i."""
    count = BASE_END if i == 0 else 10
    for client in clients.values():
        for p in (0, 1):
            for _ in range(count):
                client.put_ok(TOPIC, b"m", p)
    zk_commit(zk, "caught", "1-0", "%d-%d" % (9000 + i, caught(i)))  # MetaQ's msgId-offset form
    zk_commit(zk, "caught", "2-0", "%d-%d" % (9100 + i, caught(i)))
    zk_commit(zk, "lagging", "1-1", str(lagging_slow(i)))  # the legacy plain form
    zk_commit(zk, "lagging", "2-1", str(lagging_fast(i)))
    if stopped(i) is not None:
        zk_commit(zk, "stopped", "1-1", "-1-%d" % stopped(i))
    zk_commit(zk, "rewound", "2-0", "77-%d" % rewound(i))
    c2 = clients[2]
    assert c2.call(ev.CommitOffset("stalled", TOPIC, 0, stalled(i), c2.opaque())).code == 200  # broker's store
    time.sleep(0.005)  # the broker's commit time has ms resolution: every commit gets its own


def test_lag_report_matches_known_group_states_and_reports_a_dead_broker(spark, report_cluster, tmp_path, capsys):
    cluster = report_cluster
    from metaq.spark.collector import collect_snapshot, write_snapshot
    from metaq.spark.report import main, run_report

    zk_connect, zk, brokers = cluster
    zk.create("/meta/consumers/lagging/owners/%s/1-1" % TOPIC, b"lagging_host-1", makepath=True, ephemeral=True)
    out, history = str(tmp_path / "report"), str(tmp_path / "report" / "history")
    base = time.time() - 1000  # injected snapshot times: in the past, one minute apart
    clients = {bid: b.client() for bid, b in brokers.items()}
    try:
        for i in range(STEPS):
            play(zk, brokers, clients, i)
            snap = collect_snapshot(zk_connect, clock=lambda i=i: base + 60 * i)
            assert snap.problems == []
            write_snapshot(snap, history)
    finally:
        for c in clients.values():
            c.close()
    assert len(os.listdir(os.path.join(history, "offsets"))) == STEPS

    report, problems = run_report(out, collect=False, spark=spark)
    assert problems == [] and report.snapshots == STEPS
    assert report.now_ms == int(round((base + 60 * (STEPS - 1)) * 1000))
    rows = {(r["group"], r["partition"]): r for r in report.partitions}
    last, span = STEPS - 1, 60.0 * (STEPS - 1)
    produce = 10 * (STEPS - 1) / span

    def expect(key, committed, first_committed, status, store="zk"):
        r = rows[key]
        lag = end_at(last) - committed
        consume = (committed - first_committed) / span
        assert (r["committed_offset"], r["log_end_offset"], r["lag"], r["status"], r["store"]) == \
            (committed, end_at(last), lag, status, store), r
        assert r["consume_rate"] == pytest.approx(consume) and r["produce_rate"] == pytest.approx(produce), r
        if lag == 0:
            assert r["catch_up_s"] == 0
        elif consume > produce:
            assert r["catch_up_s"] == pytest.approx(lag / (consume - produce)), r
        else:
            assert r["catch_up_s"] is None, r
        assert r["commit_age_s"] is not None and r["commit_age_s"] >= 0

    expect(("caught", "1-0"), caught(last), caught(0), "OK")
    expect(("caught", "2-0"), caught(last), caught(0), "OK")
    expect(("lagging", "1-1"), lagging_slow(last), lagging_slow(0), "WARN")
    expect(("lagging", "2-1"), lagging_fast(last), lagging_fast(0), "OK")
    assert rows[("lagging", "2-1")]["catch_up_s"] == pytest.approx(240.0)  # 8 messages at 2 more per minute
    expect(("stalled", "2-0"), stalled(last), stalled(0), "STALL", store="broker")
    expect(("stopped", "1-1"), stopped(1), stopped(0), "STOP")
    expect(("rewound", "2-0"), rewound(last), rewound(0), "REWIND")
    assert rows[("lagging", "1-1")]["owner"] == "lagging_host-1" and rows[("caught", "1-0")]["owner"] == "-"
    assert rows[("caught", "1-0")]["window_commits"] == STEPS and rows[("stopped", "1-1")]["window_commits"] == 2
    groups = {g["group"]: g for g in report.groups}
    assert {g: groups[g]["status"] for g in groups} == {
        "caught": "OK", "lagging": "WARN", "stalled": "STALL", "stopped": "STOP", "rewound": "REWIND"}
    assert groups["lagging"]["total_lag"] == (end_at(last) - lagging_slow(last)) + (end_at(last) - lagging_fast(last))
    assert groups["lagging"]["max_lag_partition"] == "orders/1-1" and groups["stalled"]["burrow_status"] == "ERR"
    lag_history = [(h["ts_ms"], h["lag"]) for h in report.lag_history if h["group"] == "lagging"]
    assert [lag for _ts, lag in lag_history] == [2 * end_at(i) - lagging_slow(i) - lagging_fast(i)
                                                 for i in range(STEPS)]

    from metaq.spark.lagjob import run_lag_job

    recent = run_lag_job(spark, history, max_age_s=120)  # the last three snapshots only
    assert recent.snapshots == 3 and [h["ts_ms"] for h in recent.lag_history if h["group"] == "caught"] == [
        int(round((base + 60 * i) * 1000)) for i in (3, 4, 5)]

    # the files: CSV with a header, Parquet, HTML with charts that have real content
    with open(os.path.join(out, "lag.csv"), newline="") as f:
        table = list(csv.reader(f))
    assert table[0][:7] == ["group", "kind", "topic", "partition", "committed_offset", "log_end_offset", "lag"]
    assert len(table) == 1 + len(report.partitions)
    assert ["lagging", "offsets", TOPIC, "1-1", str(lagging_slow(last)), str(end_at(last)),
            str(end_at(last) - lagging_slow(last))] == table[1 + sorted(rows).index(("lagging", "1-1"))][:7]
    import pyarrow.parquet as pq

    assert pq.read_table(os.path.join(out, "lag.parquet")).num_rows == len(report.partitions)
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    for name in ("lag_over_time.png", "lag_by_partition.png"):
        assert "src='%s'" % name in page
        assert_real_image(os.path.join(out, name))
    assert_real_image(os.path.join(out, "overview.png"))
    for status in ("OK", "WARN", "STALL", "STOP", "REWIND"):
        assert ">%s<" % status in page

    # the data source finds the partitions through ZooKeeper too
    by_zk = spark.read.format("metaq").option("zk", zk_connect).option("topic", TOPIC).load()
    assert by_zk.groupBy("partition").count().orderBy("partition").collect() == [
        (part, end_at(last)) for part in ("1-0", "1-1", "2-0", "2-1")]

    # broker 2 dies; one listed broker never existed: both are reported, nothing crashes
    brokers[2].kill()
    dead_url = "meta://127.0.0.1:%d" % free_port()
    capsys.readouterr()
    code = main(["--zk", zk_connect, "--brokers", dead_url, "--out", out, "--timeout", "2"])
    captured = capsys.readouterr()
    assert code == 1, captured
    assert "BROKERS NOT ANSWERING" in captured.out and dead_url in captured.out
    assert "could not read broker 2 (%s)" % url_of(brokers[2]) in captured.err
    assert "metaq-spark-report: [6/6]" in captured.err  # progress, one line per step (not a terminal)
    with open(os.path.join(out, "lag.csv"), newline="") as f:
        after = {(r["group"], r["partition"]): r for r in csv.DictReader(f)}
    for key in (("caught", "2-0"), ("lagging", "2-1"), ("rewound", "2-0"), ("stalled", "2-0")):
        assert after[key]["status"] == "BROKER_DOWN" and after[key]["lag"] == "", after[key]
    assert after[("stalled", "2-0")]["committed_offset"] == "7"  # the broker's own store: last known value
    assert after[("caught", "1-0")]["status"] == "OK" and after[("caught", "1-0")]["lag"] == "0"
    assert float(after[("caught", "1-0")]["commit_age_s"]) < 300  # real clock now: commits seconds ago
    with open(os.path.join(out, "brokers.csv"), newline="") as f:
        down = {r["url"]: r for r in csv.DictReader(f) if r["status"] == "DOWN"}
    assert set(down) == {url_of(brokers[2]), dead_url} and down[url_of(brokers[2])]["broker_id"] == "2"
    assert "Brokers not answering" in open(os.path.join(out, "report.html"), encoding="utf-8").read()
    assert len(os.listdir(os.path.join(history, "offsets"))) == STEPS + 1


def assert_real_image(path):
    """A PNG of some size whose pixels are not all one colour (a chart was drawn)."""
    import matplotlib.image as mpimg
    import numpy as np

    assert os.path.getsize(path) > 10_000, path
    pixels = mpimg.imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 400
    rgb = (pixels[..., :3] * 255).round().astype(np.int64)
    colours = np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2])
    assert len(colours) > 20, (path, len(colours))
    white = np.all(pixels[..., :3] > 0.97, axis=-1).mean()
    assert white < 0.97, (path, white)


def test_a_group_that_committed_once_is_ok_with_its_lag_then_stop_once_a_later_snapshot_sees_no_new_commit(
        spark, broker_factory, tmp_path, capsys):
    """A first report on a group with one commit and lag: one commit shows no trend, so not STALL (and not ERR in
    burrow_status): OK, with its lag and window_commits 1. The next run, with no new commit since, says STOP."""
    from metaq.spark.report import main

    b = broker_factory(small_config(tmp_path / "data"))
    out = str(tmp_path / "report")
    with b.client() as c:
        for i in range(5):
            c.put_ok("once", b"m%d" % i, 0)
        assert c.call(ev.CommitOffset("onceg", "once", 0, 2, c.opaque())).code == 200  # its only commit

    def report():
        assert main(["--brokers", url_of(b), "--out", out, "-q"]) == 0, capsys.readouterr()
        with open(os.path.join(out, "lag.csv"), newline="") as f:
            [row] = [r for r in csv.DictReader(f) if r["group"] == "onceg"]
        with open(os.path.join(out, "groups.csv"), newline="") as f:
            [group] = [g for g in csv.DictReader(f) if g["group"] == "onceg"]
        return row, group

    row, group = report()
    assert (row["status"], row["lag"], row["window_commits"]) == ("OK", "3", "1"), row
    assert (group["status"], group["burrow_status"], group["total_lag"]) == ("OK", "OK", "3"), group
    time.sleep(0.01)  # the next snapshot is later
    row, group = report()
    assert (row["status"], row["lag"], row["window_commits"]) == ("STOP", "3", "1"), row
    assert (group["status"], group["burrow_status"]) == ("STOP", "ERR"), group
