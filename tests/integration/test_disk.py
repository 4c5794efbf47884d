"""A small tmpfs filled for real (F4) and retention with injected time, on a real broker."""

import glob
import math
import os
import subprocess
import time

import pytest

from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.broker import consume_all
from tests.harness.tmpfs import ext4_with_reserve, tmpfs


def remount(path, size):
    subprocess.run(["mount", "-o", "remount,size=%s" % size, str(path)], check=True)


def fill(client, topic, payload_size, limit=10_000):
    """Put until the broker refuses; returns (acked {(p, offset): payload}, first refusal)."""
    acked = {}
    for i in range(limit):
        payload = b"%06d" % i + b"f" * (payload_size - 6)
        r = client.put(topic, payload, i % 2)
        if r.code != 200:
            return acked, r
        _mid, p, off = (int(x) for x in r.body.split())
        acked[(p, off)] = payload
    raise AssertionError("the disk never filled")


def wait_until_writes_resume(client, topic, partition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while client.put(topic, b"after", partition).code != 200:
        assert time.monotonic() < deadline, "writes did not resume"
        time.sleep(0.1)


def assert_all_present(client, topic, acked):
    for p in (0, 1):
        records = consume_all(client, topic, p)
        for (q, off), payload in acked.items():
            if q == p:
                assert records[off].payload == payload


@pytest.mark.fault
@pytest.mark.root
def test_full_disk_refuses_writes_cleanly_and_resumes_after_space_returns(broker_factory, tmp_path):
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "6m"):
        cfg = small_config(mnt / "data", store={"disk_warn_ratio": 1.0, "disk_danger_ratio": 1.0,
                                                 "disk_check_interval_s": 0.2},
                           limits={"max_body_bytes": 64 * 1024})
        b = broker_factory(cfg)
        try:
            with b.client() as c:
                acked, refusal = fill(c, "t-fill", 8000)
                assert refusal.code == 507 and b"disk" in refusal.body.lower(), refusal
                for p in (0, 1, 0):  # every further put of that size gets the same clear answer, no ack
                    r = c.put("t-fill", b"m" * 8000, p)
                    assert r.code == 507 and r.body == refusal.body
                assert c.call(ev.Version(1)).code == 200  # the broker stays up and serving
                assert_all_present(c, "t-fill", acked)
                leftovers = [f for f in glob.glob(str(mnt / "data" / "commitlog" / "*"))
                             if os.path.getsize(f) != 1 << 20]
                assert leftovers == []  # no half-allocated segment left behind
                remount(mnt, "16m")
                wait_until_writes_resume(c, "t-fill", 0)
                assert_all_present(c, "t-fill", acked)
        finally:
            b.kill()


@pytest.mark.fault
@pytest.mark.root
def test_danger_mark_refuses_writes_before_the_disk_is_full(broker_factory, tmp_path):
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "10m"):
        cfg = small_config(mnt / "data", store={"disk_warn_ratio": 0.5, "disk_danger_ratio": 0.5,
                                                 "disk_check_interval_s": 0.1,
                                                 "retention_check_interval_s": 3600},
                           limits={"max_body_bytes": 64 * 1024})
        b = broker_factory(cfg)
        try:
            with b.client() as c:
                acked, refusal = fill(c, "t-mark", 8000)
                assert refusal.code == 507 and b"danger mark" in refusal.body, refusal
                assert c.stats_dict()["writes_refused"] == "true"
                remount(mnt, "64m")
                wait_until_writes_resume(c, "t-mark", 1)
                assert c.stats_dict()["writes_refused"] == "false"
                assert_all_present(c, "t-mark", acked)
        finally:
            b.kill()


def test_retention_deletes_old_segments_and_moves_the_minimum(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", store={"retention_hours": 24, "retention_check_interval_s": 0.2})
    b = broker_factory(cfg)
    with b.client() as c:
        for i in range(2000):  # ~2.5 MiB: three segments of 1 MiB
            c.put_ok("t-ret", b"%05d" % i + b"r" * 1200, 0)
    assert b.stop() == 0
    segments = sorted(glob.glob(os.path.join(b.data_dir, "commitlog", "*")))
    assert len(segments) >= 3
    old = time.time() - 48 * 3600  # inject time: the sealed segments are two days old
    for seg in segments[:-1]:
        os.utime(seg, (old, old))
    b.start()
    deadline = time.monotonic() + 10
    with b.client() as c:
        while True:
            low = int(c.call(ev.Offset("t-ret", "g", 0, 0, 1)).body)
            if low > 0:
                break
            assert time.monotonic() < deadline, "retention did not run"
            time.sleep(0.1)
        r = c.get("t-ret", 0, 0)
        assert (r.code, int(r.body)) == (301, low)
        records = consume_all(c, "t-ret", 0, start=low)
        assert records[0].payload[:5] == b"%05d" % low and len(records) == 2000 - low
    remaining = sorted(glob.glob(os.path.join(b.data_dir, "commitlog", "*")))
    assert remaining == segments[-1:]
    assert "retention deleted" in b.log_text(since_start=True)


def df_percent(path):
    """``df``'s Use% of the filesystem holding ``path`` (what an operator compares ``stats`` with)."""
    out = subprocess.run(["df", "--output=pcent", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.splitlines()[-1].strip().rstrip("%"))


def exact_usage(path):
    """used / (used + available to non-root), from statvfs: df's Use% before it rounds up."""
    st = os.statvfs(str(path))
    used = st.f_blocks - st.f_bfree
    return used / (used + st.f_bavail)


def fill_to(path, ratio, name):
    """Allocate files so that the filesystem of ``path`` is at least ``ratio`` full (by df's reckoning).

    ext4 counts blocks reserved for delayed allocation (the broker's dirty maps) as used until
    writeback settles them, so one allocation sized from a first reading can come up short: the
    filesystem is synced before each reading and topped up until the ratio is reached.
    """
    for i in range(10):
        os.sync()
        st = os.statvfs(str(path))
        used, room = st.f_blocks - st.f_bfree, st.f_blocks - st.f_bfree + st.f_bavail
        more = int((ratio * room - used) * st.f_frsize)
        if more <= 0:
            return
        subprocess.run(["fallocate", "-l", str(more), str(path / (name if i == 0 else "%s.%d" % (name, i)))],
                       check=True)
    raise AssertionError("%s did not reach %.3f full" % (path, ratio))


def assert_stats_is_df(c, mnt):
    for _ in range(50):  # compared while the filesystem holds still (the broker's own work may move it)
        before = exact_usage(mnt)
        usage = float(c.stats_dict()["disk_usage"])
        df = df_percent(mnt)
        exact = exact_usage(mnt)
        if exact == before:
            break
        time.sleep(0.05)
    assert abs(usage - exact) < 0.0001, (usage, exact)  # stats' 4 decimals of df's fraction, now
    assert math.ceil(usage * 100) == df == math.ceil(exact * 100)
    return usage


SMALL_FILESYSTEMS = {
    "tmpfs": lambda mnt: tmpfs(mnt, "64m"),
    # half the blocks kept for root: used / size would show half of what df shows
    "ext4 with a root reserve": lambda mnt: ext4_with_reserve(mnt, 128, 50),
}


@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("fs", sorted(SMALL_FILESYSTEMS))
def test_stats_disk_usage_is_the_figure_df_shows_and_the_write_gate_uses(broker_factory, tmp_path, fs):
    mnt = tmp_path / "mnt"
    with SMALL_FILESYSTEMS[fs](mnt):
        # the periodic check is far off: stats must measure, not repeat the figure of the broker's start
        cfg = small_config(mnt / "data", store={"disk_warn_ratio": 0.9, "disk_danger_ratio": 0.9,
                                                 "disk_check_interval_s": 3600,
                                                 "retention_check_interval_s": 3600})
        b = broker_factory(cfg)
        try:
            with b.client() as c:
                c.put_ok("t-df", b"before", 0)
                start = assert_stats_is_df(c, mnt)
                fill_to(mnt, 0.555, "ballast-1")  # half full: writes still taken
                assert assert_stats_is_df(c, mnt) > start + 0.5
                assert c.stats_dict()["writes_refused"] == "false"
                c.put_ok("t-df", b"at half", 0)
                fill_to(mnt, 0.925, "ballast-2")  # past the 90% danger mark, as df sees it
                usage = assert_stats_is_df(c, mnt)
                assert usage > 0.9 and c.stats_dict()["writes_refused"] == "true"
                r = c.put("t-df", b"refused", 0)
                assert r.code == 507 and b"disk usage %.1f%%" % (usage * 100) in r.body, r
                for f in mnt.glob("ballast-2*"):
                    os.unlink(str(f))
                assert assert_stats_is_df(c, mnt) < 0.6
                assert c.stats_dict()["writes_refused"] == "false"
                c.put_ok("t-df", b"after", 0)
        finally:
            b.kill()
