"""Any delivery time and cancel with real brokers (README "Any delivery time", "Cancel")."""

import time

import pytest

from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.broker import wait_for
from tests.harness.delay import records
from tests.harness.timers import cancel, put_at, put_at_ok, timers


def now_ms():
    return int(time.time() * 1000)


def start(broker_factory, tmp_path, name="b", **sections):
    return broker_factory(small_config(tmp_path / name / "data", **sections), workdir=tmp_path / name)


def wait_delivered(b, topic, count, partitions=(0,), timeout=30):
    def enough():
        with b.client() as c:
            got = records(c, topic, partitions)
        return got if len(got) >= count else None
    return wait_for(enough, timeout, "%d messages delivered to %s" % (count, topic), interval=0.1)


def assert_not_early(c, topic, partition, offset, due_ms):
    """The record at ``offset`` was stored at or after ``due_ms``: the first offset stored since then is not past it."""
    r = c.offset_at(topic, partition, due_ms)
    assert r.code == 200 and int(r.body) <= offset, (r, offset)


def test_put_at_delivers_when_due_with_its_id(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    with b.client() as c:
        t0 = now_ms()
        id1, _ = put_at_ok(c, "orders", b"later", "+1500")
        id2, _ = put_at_ok(c, "orders", b"past", "@1000")  # in the past: delivered at once
        assert {r[0] for r in timers(c)} <= {id1, id2}
    got = wait_delivered(b, "orders", 1)
    assert got[0].msg_id == id2 and got[0].payload == b"past"
    got = wait_delivered(b, "orders", 2)
    assert [(r.msg_id, r.payload) for r in got] == [(id2, b"past"), (id1, b"later")]
    with b.client() as c:
        assert_not_early(c, "orders", 0, 1, t0 + 1500)
        assert timers(c) == []
        assert cancel(c, id1) == (404, "delivered")


@pytest.mark.parametrize("when", ["-5", "@-5", "+-1", "+5s", "garbage", "@", "+%d" % (11 * 366 * 86_400_000)])
def test_bad_when_is_a_clear_error_and_nothing_is_stored(broker_factory, tmp_path, when):
    b = start(broker_factory, tmp_path)
    with b.client() as c:
        r = put_at(c, "orders", b"x", when)
        assert isinstance(r, ev.Result) and r.code == 400, r
        assert b"delivery time" in r.body or b"delay" in r.body
        assert timers(c) == []
        assert records(c, "orders", (0, 1)) == []
        assert c.stats_dict()["timers_pending"] == "0"


def test_internal_topic_is_refused(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    with b.client() as c:
        for r in (c.put("%TIMER%", b"x", partition=0), put_at(c, "%TIMER%", b"x", "+10")):
            assert isinstance(r, ev.Result) and r.code == 400 and b"internal topic for timers" in r.body, r
        assert timers(c) == []


def test_cancel_before_due_and_answers(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    with b.client() as c:
        near, _ = put_at_ok(c, "orders", b"near", "+2000")
        far, _ = put_at_ok(c, "orders", b"far", "+%d" % (365 * 86_400_000))
        keep, _ = put_at_ok(c, "orders", b"keep", "+2500")
        assert cancel(c, near) == (200, "cancelled")
        assert cancel(c, far) == (200, "cancelled")
        assert cancel(c, near) == (404, "cancelled")
        assert cancel(c, 12345) == (404, "unknown")
        assert [r[0] for r in timers(c)] == [keep]
    got = wait_delivered(b, "orders", 1)
    time.sleep(0.5)
    with b.client() as c:
        got = records(c, "orders", (0,))
    assert [r.msg_id for r in got] == [keep]


def test_async_flush_mode_delivers_each_once_and_cancels(broker_factory, tmp_path):
    """The timers under ``flush: async`` (the indexer follows the flushed log position; a flush round wakes it)."""
    b = broker_factory(small_config(tmp_path / "b" / "data", store={"flush": "async", "flush_interval_ms": 50}),
                       workdir=tmp_path / "b")
    with b.client() as c:
        sent = {put_at_ok(c, "t-async", b"a%d" % i, "+%d" % (200 + i), partition=0)[0]: b"a%d" % i for i in range(50)}
        later, _ = put_at_ok(c, "t-async", b"never", "+60000", partition=0)
        assert cancel(c, later) == (200, "cancelled")
        wait_for(lambda: len(records(c, "t-async", (0,))) >= 50 or None, 20, "the fifty delivered")
        wait_for(lambda: int(c.stats_dict()["timers_pending"]) == 0 or None, 10, "nothing pending")
        got = records(c, "t-async", (0,))
    assert sorted((r.msg_id, r.payload) for r in got) == sorted(sent.items())
