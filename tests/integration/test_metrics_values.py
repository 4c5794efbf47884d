"""README "Metrics": the values of the node and replication metrics after causing what they count, each read
from /metrics of a real broker and compared with what `stats` says (the collector test checks names and types,
promtool the format, Prometheus the topic series)."""

from prometheus_client.parser import text_string_to_metric_families

from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from tests.harness.broker import wait_for
from tests.harness.http import request, with_http
from tests.harness.replication import caught_up, master_config, stats


def scrape(broker):
    """``{name: [(labels, value)]}`` of one scrape (counters under their ``_total`` sample name)."""
    r = request(broker, "GET", "/metrics")
    assert r.status == 200, r
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(broker, name):
    [(labels, v)] = scrape(broker)[name]
    return v


def test_put_failures_corrupt_reads_parked_gets_uptime_info_and_loop_lag(broker_factory, tmp_path):
    from tests.integration.test_corrupt_records import flip_payload_byte

    wd = tmp_path / "b"
    b = broker_factory(with_http(small_config(wd / "data")), workdir=wd)
    with b.client() as c:
        for i in range(3):
            c.put_ok("t-bad", b"rec-%02d-" % i + b"x" * 4000, 0)
    assert b.stop() == 0
    flip_payload_byte(b.data_dir, 1)
    b.start()
    assert value(b, "metaq_put_failures_total") == 0 and value(b, "metaq_corrupt_reads_total") == 0
    with b.client() as c:
        refused = c.call(ev.Put("%RESENT%g", 0, 0, b"forged", c.opaque()))  # clients cannot write a journal
        assert refused.code == 400, refused
        assert c.get("t-bad", 0, 1).code == 512  # the corrupt record, never served
        s = c.stats_dict()
    assert value(b, "metaq_put_failures_total") == int(s["put_failed"]) == 1
    assert value(b, "metaq_corrupt_reads_total") == int(s["corrupt_reads"]) == 1

    # two gets long-polling the same empty partition, one another: 3 parked gets on 2 partitions
    waiting = [b.client() for _ in range(3)]
    try:
        for n, (c, partition) in enumerate(zip(waiting, (0, 0, 1), strict=True)):
            c.send(b"get t-wait g %d 0 65536 60000 %d\r\n" % (partition, n))
        wait_for(lambda: value(b, "metaq_parked_gets") == 3, what="three parked gets")
        assert value(b, "metaq_long_poll_waiters") == 2
        with b.client() as c:
            s = c.stats_dict()
            assert (int(s["parked_gets"]), int(s["long_poll_waiters"])) == (3, 2)
            c.put_ok("t-wait", b"wake", 0)  # wakes the two on partition 0
        for c in waiting[:2]:
            assert isinstance(c.read_event(), ev.Value)
        wait_for(lambda: value(b, "metaq_parked_gets") == 1, what="two gets answered")
        assert value(b, "metaq_long_poll_waiters") == 1
    finally:
        for c in waiting:
            c.close()

    with b.client() as c:
        before = int(c.stats_dict()["uptime"])
        version = c.call(ev.Version(c.opaque())).body.decode()
    uptime = value(b, "metaq_uptime_seconds")
    with b.client() as c:
        after = int(c.stats_dict()["uptime"])
    assert before <= uptime <= after + 1
    wait_for(lambda: value(b, "metaq_uptime_seconds") > uptime, what="the uptime to grow")
    [(labels, one)] = scrape(b)["metaq_info"]
    assert one == 1 and labels == {"version": version, "broker_id": "7"}

    # an idle broker runs what is queued in its loop at once: its worst lateness of the last minute is small
    with b.client() as c:
        lag_ms = float(c.stats_dict()["loop_lag_ms"])
    assert 0.0 <= lag_ms < 1000.0
    assert 0.0 <= value(b, "metaq_loop_lag_seconds") < 1.0


def test_replication_slaves_and_lag(broker_factory, tmp_path):
    rport = free_port()
    master = broker_factory(with_http(master_config(tmp_path / "m", rport)), workdir=tmp_path / "m")
    with master.client() as c:
        for i in range(20):
            c.put_ok("t-rep", b"m%02d" % i, i % 2)
    assert value(master, "metaq_replication_slaves") == 0
    slave_cfg = with_http(small_config(tmp_path / "s" / "data", replication={
        "role": "slave", "slave_of": "127.0.0.1:%d" % free_port(), "slave_id": 1}))
    slave = broker_factory(slave_cfg, workdir=tmp_path / "s")
    # no master heard yet: the lag is unknown, said as -1
    assert value(slave, "metaq_replication_lag_messages") == -1 == int(stats(slave)["replication_lag_messages"])
    assert value(slave, "metaq_replication_lag_bytes") == -1
    slave.stop()
    slave.config["replication"]["slave_of"] = "127.0.0.1:%d" % rport
    slave.start()
    wait_for(lambda: value(master, "metaq_replication_slaves") == 1, what="the master to count its slave")
    caught_up(master, slave)
    wait_for(lambda: value(slave, "metaq_replication_lag_messages") == 0, what="the slave's lag to reach 0")
    assert value(slave, "metaq_replication_lag_bytes") == 0
    assert int(stats(slave)["replication_lag_messages"]) == 0
    assert value(master, "metaq_replication_lag_messages") == 0  # 0 on a master
    assert value(slave, "metaq_replication_slaves") == 0
    slave.stop()
    wait_for(lambda: value(master, "metaq_replication_slaves") == 0, what="the master to see its slave gone")


def test_a_slave_held_behind_reports_its_lag_in_bytes(broker_factory, tmp_path):
    """The master never ships a corrupt record: a slave started against a master whose log holds one copies what
    comes before it and stays behind by what follows; `metaq_replication_lag_bytes` says by how much, as `stats`
    does (the master ends the link before a heartbeat tells the slave its message count: that lag stays -1)."""
    from tests.integration.test_corrupt_records import flip_payload_byte

    rport = free_port()
    master = broker_factory(with_http(master_config(tmp_path / "m", rport)), workdir=tmp_path / "m")
    with master.client() as c:
        for i in range(3):
            c.put_ok("t-rep", b"rec-%02d-" % i + b"x" * 4000, 0)
    assert master.stop() == 0
    flip_payload_byte(master.data_dir, 1)  # records 1 and 2 never reach a slave
    master.start()
    slave = broker_factory(with_http(small_config(tmp_path / "s" / "data", replication={
        "role": "slave", "slave_of": "127.0.0.1:%d" % rport, "slave_id": 1})), workdir=tmp_path / "s")
    wait_for(lambda: int(stats(slave)["total_messages"]) == 1, what="the slave to copy the record before it")
    wait_for(lambda: value(slave, "metaq_replication_lag_bytes") > 0, what="the slave's lag in bytes")
    m, s = stats(master), stats(slave)
    behind = int(m["log_end_position"]) - int(s["log_end_position"])
    assert behind > 0 and value(slave, "metaq_replication_lag_bytes") == int(s["replication_lag_bytes"]) == behind
