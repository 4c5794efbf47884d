"""The master's refusals of a slave (README "The epoch handshake"), each with real broker processes: the wrong
broker id, another segment size, an unrelated epoch history, a start below the master's log start.

Each time the master logs why it refused, the slave logs the master's words and copies nothing (its log stays
as it was), and the master goes on serving its producers.
"""

import os

from metaq.client.local import free_port, small_config
from tests.harness.broker import consume_all, wait_for
from tests.harness.replication import master_config, mixed_load, stats


def start_master(broker_factory, tmp_path, **store):
    rport = free_port()
    cfg = master_config(tmp_path / "m", rport)
    cfg["store"].update(store)
    master = broker_factory(cfg, workdir=tmp_path / "m")
    return master, rport


def slave_config(tmp_path, name="s", **store):
    cfg = small_config(os.path.join(str(tmp_path / name), "data"))
    cfg["store"].update(store)
    return cfg


def slave_args(rport):
    return ["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"]


def assert_refused(master, slave, reason):
    """The master refused the slave for ``reason`` (both logs say so) and the slave holds nothing new."""
    wait_for(lambda: reason in master.log_text(), 20, lambda: "the master to refuse (%s): %s"
             % (reason, master.log_text()[-2000:]))
    wait_for(lambda: "the master refused replication (409)" in slave.log_text() and reason in slave.log_text(), 20,
             lambda: "the slave to report the refusal: %s" % slave.log_text()[-2000:])
    s = stats(slave)
    assert s["replication_link"] != "connected"
    assert stats(master)["replication_slaves"] == "0"
    with master.client() as c:  # the master serves on
        c.put_ok("t-a", b"still served", partition=0)
    return s


def test_a_slave_configured_with_another_broker_id_is_refused(broker_factory, tmp_path):
    master, rport = start_master(broker_factory, tmp_path)
    mixed_load(master, 20)
    cfg = slave_config(tmp_path)
    cfg["broker"]["id"] = 8  # the master is broker 7
    slave = broker_factory(cfg, workdir=tmp_path / "s", extra_args=slave_args(rport))
    s = assert_refused(master, slave, "broker id mismatch: this master is broker 7, the slave is configured as 8")
    assert s["log_end_position"] == "0"


def test_a_slave_with_another_segment_size_is_refused(broker_factory, tmp_path):
    master, rport = start_master(broker_factory, tmp_path)
    mixed_load(master, 20)
    slave = broker_factory(slave_config(tmp_path, segment_size=2 << 20), workdir=tmp_path / "s",
                           extra_args=slave_args(rport))
    s = assert_refused(master, slave, "segment size mismatch: the master uses 1048576-byte segments, the slave 2097152")
    assert s["log_end_position"] == "0"


def test_a_slave_whose_log_began_under_another_master_is_refused_and_keeps_its_log(broker_factory, tmp_path):
    master, rport = start_master(broker_factory, tmp_path)
    mixed_load(master, 20)
    # the would-be slave first ran as a master of its own: its log is unrelated to this master's
    other = broker_factory(slave_config(tmp_path), workdir=tmp_path / "s")
    with other.client() as c:
        mine = c.put_ok("t-a", b"written on the other broker", partition=0)
    other_end = stats(other)["log_end_position"]
    other.stop()
    slave = broker_factory(slave_config(tmp_path), workdir=tmp_path / "s", extra_args=slave_args(rport))
    s = assert_refused(master, slave, "shares no epoch with this master's")
    assert "the logs are unrelated" in master.log_text()
    assert s["log_end_position"] == other_end  # never cut against a log it has nothing in common with
    with slave.client() as c:  # and it serves no read of a log no master confirmed
        r = c.get("t-a", 0, mine[2], 1 << 16)
        assert r.code == 503 and b"serves no read until the epoch handshake" in r.body, r
    slave.stop()  # its own data is intact: started alone again, it serves it
    alone = broker_factory(slave_config(tmp_path), workdir=tmp_path / "s")
    with alone.client() as c:
        assert consume_all(c, "t-a", 0)[mine[2]].payload == b"written on the other broker"


def test_a_fresh_slave_below_the_masters_log_start_is_refused(broker_factory, tmp_path):
    # retention of a few seconds: the master's first segments go while the load runs
    master, rport = start_master(broker_factory, tmp_path, retention_hours=2 / 3600.0,
                                 retention_check_interval_s=0.2)
    for seed in range(8):  # ~ 2.5 MB a round: several 1 MiB segments
        mixed_load(master, 120, seed=seed)
        if min_offset_moved(master):
            break
    wait_for(lambda: min_offset_moved(master), 30, "retention to remove the master's first segment")
    slave = broker_factory(slave_config(tmp_path), workdir=tmp_path / "s", extra_args=slave_args(rport))
    s = assert_refused(master, slave, "position 0 is below this master's log start")
    assert "(retention removed it): reseed the slave" in master.log_text()
    assert s["log_end_position"] == "0"


def min_offset_moved(master):
    """The master's first commit-log segment is gone (retention ran)."""
    names = sorted(n for n in os.listdir(os.path.join(master.data_dir, "commitlog")) if n.isdigit())
    return bool(names) and int(names[0]) > 0
