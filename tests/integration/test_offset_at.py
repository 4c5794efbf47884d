"""``offset_at`` (replay from a time) against real brokers: bursts, the ends, bad input, retention, a slave."""

import glob
import os
import time

import pytest

from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol.msgid import id_timestamp_ms
from tests.harness.broker import wait_for
from tests.harness.replication import caught_up, master_config

GAP_S = 1.1


def now_ms():
    return int(time.time() * 1000)


def bursts(client, topic, sizes, partition=0, payload=b"m"):
    """Put bursts of ``sizes`` messages, ``GAP_S`` apart; returns ``(first offsets, [times between bursts],
    [msg ids])``: each time between two bursts is taken half way through the gap."""
    firsts, between, ids = [], [], []
    for n, size in enumerate(sizes):
        if n:
            time.sleep(GAP_S / 2)
            between.append(now_ms())
            time.sleep(GAP_S / 2)
        for i in range(size):
            msg_id, _p, offset = client.put_ok(topic, b"%s-%d-%d" % (payload, n, i), partition)
            if i == 0:
                firsts.append(offset)
            ids.append(msg_id)
    return firsts, between, ids


def offset_at(client, topic, partition, timestamp_ms):
    r = client.offset_at(topic, partition, timestamp_ms)
    assert r.code == 200, r
    return int(r.body)


def test_offset_at_answers_the_first_offset_of_each_burst_and_the_ends(broker):
    with broker.client() as c:
        before = now_ms() - 1
        firsts, between, ids = bursts(c, "t-time", [5, 5, 5])
        assert firsts == [0, 5, 10]
        assert [offset_at(c, "t-time", 0, t) for t in between] == [5, 10]
        assert offset_at(c, "t-time", 0, 0) == 0  # before everything: the first offset
        assert offset_at(c, "t-time", 0, before) == 0
        assert offset_at(c, "t-time", 0, now_ms() + 60_000) == 15  # after everything: the end, where the next goes
        assert offset_at(c, "t-time", 0, 2**63 - 1) == 15
        stored = id_timestamp_ms(ids[5])  # the first message of burst 2, at its own store time: itself
        assert offset_at(c, "t-time", 0, stored) == 5
        assert offset_at(c, "t-time", 0, id_timestamp_ms(ids[4]) + 1) == 5
        assert offset_at(c, "t-time", 1, between[0]) == 0  # a partition without messages: its end, 0
        assert c.put_ok("t-time", b"next", 0)[2] == 15  # the end offset it answered is where the next one went


def test_bad_offset_at_requests_get_clear_errors_and_change_nothing(broker):
    with broker.client() as c:
        c.put_ok("t-bad", b"x", 0)
        r = c.offset_at("t-bad", 9, 0)  # t* topics have partitions 0..3: answered as `offset` answers it
        assert r.code == 404 and r.body == b"The topic `t-bad` in partition `9` is not exists", r
        assert c.call(ev.Offset("t-bad", "g", 9, 0, 1)).code == 404  # the same code as offset's
        for line, reason in [(b"offset_at t-bad 0 -1 5", b"invalid timestamp '-1': must be 0..9223372036854775807"),
                             (b"offset_at t-bad 0 soon 5", b"invalid timestamp 'soon': not an integer"),
                             (b"offset_at t-bad 0 5", b"offset_at needs 5 tokens")]:
            c.send(line + b"\r\n")
            r = c.read_event()
            assert r.code == 400 and reason in r.body, r
        r = c.call(ev.OffsetAt("", 0, 0, 8))
        assert r.code == 400 and r.opaque == 8, r
        assert offset_at(c, "t-bad", 0, 0) == 0  # the connection serves on
        summary = c.stats_dict()
        assert summary["total_messages"] == "1"  # nothing stored by any of it


@pytest.mark.slow
def test_offset_at_after_retention_deleted_the_first_segments_answers_the_first_kept_offset(broker_factory, tmp_path):
    cfg = small_config(tmp_path / "data", store={"retention_hours": 24, "retention_check_interval_s": 0.2})
    b = broker_factory(cfg)
    with b.client() as c:
        before = now_ms() - 1
        firsts, between, _ids = bursts(c, "t-ret", [2000, 5], payload=b"r" * 1200)  # ~2.5 MiB: three segments
    assert b.stop() == 0
    segments = sorted(glob.glob(os.path.join(b.data_dir, "commitlog", "*")))
    assert len(segments) >= 3
    old = time.time() - 48 * 3600  # the sealed segments are two days old: retention deletes them
    for seg in segments[:-1]:
        os.utime(seg, (old, old))
    b.start()
    with b.client() as c:
        low = wait_for(lambda: int(c.call(ev.Offset("t-ret", "g", 0, 0, 1)).body), 10, "retention to run")
        assert 0 < low < firsts[1]
        assert offset_at(c, "t-ret", 0, before) == low  # before the first kept message: the first kept offset
        assert offset_at(c, "t-ret", 0, 0) == low
        assert offset_at(c, "t-ret", 0, between[0]) == firsts[1] == 2000
        assert offset_at(c, "t-ret", 0, now_ms() + 1000) == 2005
        r = c.get("t-ret", 0, low)
        assert isinstance(r, ev.Value)  # the offset it answered is readable


def test_a_slave_answers_offset_at_as_its_master(broker_factory, tmp_path):
    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    slave = broker_factory(small_config(tmp_path / "s" / "data"), workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with master.client() as c:
        firsts, between, _ids = bursts(c, "t-sl", [3, 4, 2], partition=2)
    caught_up(master, slave)
    times = [0] + between + [now_ms() + 1000]
    with master.client() as m, slave.client() as s:
        assert s.stats_dict()["slave"] == "true"
        answers = [offset_at(s, "t-sl", 2, t) for t in times]
        assert answers == [offset_at(m, "t-sl", 2, t) for t in times] == [0, 3, 7, 9]
