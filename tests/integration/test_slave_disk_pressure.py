"""Disk pressure on real brokers: a slave whose disk is smaller than its master's log, and what ``stats`` and
``/readyz`` say at each mark (issue 41 point 3; docs/operating.md "Disk").

A slave follows the store's retention rule as a master does: under pressure (above the warn mark, or too little
free for the next segment) its oldest sealed segments go before their time, and a copy that meets a full disk runs
retention at once, so the slave catches up instead of reconnecting for good. A reader of an offset it deleted gets
``result 301`` naming its new first offset; every offset it kept reads as on the master.
"""

import os

import pytest

from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from tests.harness.broker import consume_all, wait_for
from tests.harness.http import request, with_http
from tests.harness.replication import stats
from tests.harness.tmpfs import fill as fill_disk
from tests.harness.tmpfs import tmpfs

pytestmark = [pytest.mark.fault, pytest.mark.root]

SEGMENT = 1 << 20  # small_config's segment_size


def fill(mount, ratio):
    """A filler file bringing ``mount``'s usage to about ``ratio`` (df's used / (used + available))."""
    st = os.statvfs(str(mount))
    room = (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize
    return fill_disk(mount, leave=room - int(room * ratio))


def readyz(b):
    r = request(b, "GET", "/readyz")
    return r.status, r.text


def master_with_a_log_of(broker_factory, tmp_path, messages):
    """A master holding ``messages`` of about 4 KB over t-a's four partitions; (master, replication port)."""
    rport = free_port()
    master = broker_factory(small_config(tmp_path / "m" / "data", replication={"port": rport}), workdir=tmp_path / "m")
    body = b"m" * 4000
    with master.client(timeout=30) as c:
        for i in range(messages):
            c.put_ok("t-a", body + b"%d" % i, i % 4)
    return master, rport


def slave_on(mount, rport, broker_factory, warn, danger):
    cfg = small_config(mount / "data")
    cfg["store"].update({"disk_warn_ratio": warn, "disk_danger_ratio": danger, "retention_check_interval_s": 600})
    return broker_factory(with_http(cfg), workdir=mount.parent / "s",  # its log file off the full disk
                          extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])


@pytest.mark.parametrize("marks", [(0.6, 0.9), (0.95, 1.0)], ids=["above-the-warn-mark", "no-room-for-a-segment"])
def test_a_slave_on_a_disk_smaller_than_its_masters_log_frees_its_oldest_segments_and_catches_up(
        broker_factory, tmp_path, marks):
    """The master holds about twice the slave's disk. With the warn mark at 0.6 the slave frees segments as it goes
    above it; at 0.95 the disk (10 segments) is full at about 0.9: it frees them because the next segment does not
    fit. Retention's interval is far longer than the test: the refused copy itself runs it."""
    master, rport = master_with_a_log_of(broker_factory, tmp_path, 5000)
    mount = tmp_path / "slave"
    with tmpfs(mount, "10m"):
        slave = slave_on(mount, rport, broker_factory, *marks)
        wait_for(lambda: stats(slave)["log_end_position"] == stats(master)["log_end_position"], 60,
                 lambda: "the slave catches up: %s" % slave.log_text()[-3000:])
        s = stats(slave)
        assert int(s["disk_pressure_deleted_segments"]) >= 5, s
        assert "segments deleted before their retention time on this slave" in slave.log_text()
        wait_for(lambda: readyz(slave)[0] == 200, 10, lambda: "the slave is ready again: %s" % (readyz(slave),))
        with master.client(timeout=30) as mc, slave.client(timeout=30) as sc:
            for part in range(4):
                first = int(sc.call(ev.Offset("t-a", "g", part, 0, sc.opaque())).body)
                assert first > 0, "the slave kept partition %d whole on a disk smaller than its log" % part
                r = sc.get("t-a", part, 0)
                assert isinstance(r, ev.Result) and r.code == 301 and int(r.body) == first, r
                theirs = consume_all(mc, "t-a", part, first)
                # the log is caught up; its partition index follows it (the slave's log follower), soon after
                wait_for(lambda part=part, first=first, theirs=theirs: consume_all(sc, "t-a", part, first) == theirs,
                         30, lambda part=part: "partition %d of the slave reads as the master's" % part)
                assert theirs


def test_stats_and_readyz_say_the_disk_pressure_at_each_mark(broker_factory, tmp_path):
    """``disk_pressure`` is none below the warn mark, warn above it (still ready), full above the danger mark (not
    ready, with the reason); a slave's readiness names its disk, not its dropped link."""
    mount = tmp_path / "disk"
    with tmpfs(mount, "32m"):
        rport = free_port()
        cfg = small_config(mount / "m", replication={"port": rport})
        cfg["store"].update({"disk_warn_ratio": 0.5, "disk_danger_ratio": 0.8})
        master = broker_factory(with_http(cfg), workdir=tmp_path / "m")
        scfg = small_config(mount / "s")
        scfg["store"].update({"disk_warn_ratio": 0.5, "disk_danger_ratio": 0.8})
        slave = broker_factory(with_http(scfg), workdir=tmp_path / "s",
                               extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
        with master.client() as c:
            c.put_ok("t-a", b"before", 0)
        wait_for(lambda: readyz(slave)[0] == 200, 10, lambda: "the slave is ready: %s" % (readyz(slave),))
        assert stats(master)["disk_pressure"] == stats(slave)["disk_pressure"] == "none"
        assert readyz(master)[0] == 200

        filler = fill(mount, 0.65)
        for b in (master, slave):
            assert stats(b)["disk_pressure"] == "warn", stats(b)
            assert readyz(b)[0] == 200, readyz(b)  # pressure short of refusing writes leaves it ready

        os.unlink(filler)
        filler = fill(mount, 0.85)
        assert stats(master)["disk_pressure"] == "full"
        status, text = readyz(master)
        assert status == 503 and "writes are refused" in text and "danger mark" in text, text
        with master.client() as c:
            assert c.put("t-a", b"refused", 0).code == 507
        wait_for(lambda: stats(slave)["disk_pressure"] == "full", 10, "the slave's disk check")
        status, text = readyz(slave)
        assert status == 503 and "slave cannot store what it replicates" in text and "danger mark" in text, text

        os.unlink(filler)
        wait_for(lambda: readyz(master)[0] == 200 and readyz(slave)[0] == 200, 10,
                 lambda: "both ready once space returns: %s %s" % (readyz(master), readyz(slave)))
        assert stats(master)["disk_pressure"] == stats(slave)["disk_pressure"] == "none"


def test_a_caught_up_slave_found_past_its_danger_mark_frees_segments_at_once_with_nothing_more_to_copy(
        broker_factory, tmp_path):
    """The slave's last copy (here a filler file) took its disk past the danger mark and the master writes nothing
    more, so no copy is refused: its disk check runs retention now, not at the interval (600 s here)."""
    master, rport = master_with_a_log_of(broker_factory, tmp_path, 1500)
    mount = tmp_path / "slave"
    with tmpfs(mount, "10m"):
        slave = slave_on(mount, rport, broker_factory, 0.7, 0.9)
        wait_for(lambda: stats(slave)["log_end_position"] == stats(master)["log_end_position"], 60,
                 lambda: "the slave catches up: %s" % slave.log_text()[-3000:])
        assert readyz(slave)[0] == 200 and int(stats(slave)["disk_pressure_deleted_segments"]) == 0
        fill(mount, 0.95)
        wait_for(lambda: readyz(slave)[0] == 200 and stats(slave)["disk_pressure"] != "full", 10,
                 lambda: "the slave frees segments and is ready again: %s %s" % (readyz(slave), stats(slave)))
        assert int(stats(slave)["disk_pressure_deleted_segments"]) >= 1
        assert "segments deleted before their retention time on this slave" in slave.log_text()


def test_a_slave_whose_warn_mark_is_1_deletes_nothing_early_and_says_why_it_is_not_ready(broker_factory, tmp_path):
    """A warn mark of 1.0 means nothing is deleted before its time, on a slave as on a master (which refuses puts
    then): the slave stops copying when its disk is full, and ``/readyz`` and ``stats`` name the disk."""
    master, rport = master_with_a_log_of(broker_factory, tmp_path, 3000)
    mount = tmp_path / "slave"
    with tmpfs(mount, "6m"):
        slave = slave_on(mount, rport, broker_factory, 1.0, 1.0)
        wait_for(lambda: "No space left" in slave.log_text(), 30, "the slave's disk fills")
        refused = "slave cannot store what it replicates: disk full"
        wait_for(lambda: readyz(slave)[0] == 503 and refused in readyz(slave)[1], 10,
                 lambda: "readyz names the full disk: %s" % (readyz(slave),))
        s = stats(slave)
        assert s["disk_pressure"] == "full" and s["disk_pressure_deleted_segments"] == "0", s
        assert int(s["log_end_position"]) < int(stats(master)["log_end_position"])
