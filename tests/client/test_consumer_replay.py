"""Replay from a time with real brokers: ``Consumer(start_from=<time>)``, ``seek`` to a time or an offset."""

import threading
import time
from datetime import datetime, timezone

import pytest

from metaq import errors
from metaq.client.consumer import Consumer
from metaq.client.local import small_config
from metaq.client.message import Partition
from tests.harness.broker import url_of as url, wait_for
from tests.harness.collector import Collector

GAP_S = 1.1


def now_ms():
    return int(time.time() * 1000)


def bursts(broker, topic, count, size, partition=0):
    """``count`` bursts of ``size`` messages (bodies ``b"<burst>-<i>"``; partition None: message i to partition
    i % 4), ``GAP_S`` apart; the times half way through each gap (ms)."""
    between = []
    with broker.client() as c:
        for n in range(count):
            if n:
                time.sleep(GAP_S / 2)
                between.append(now_ms())
                time.sleep(GAP_S / 2)
            for i in range(size):
                c.put_ok(topic, b"%d-%d" % (n, i), i % 4 if partition is None else partition)
    return between


def bodies(burst, size):
    return [b"%d-%d" % (burst, i) for i in range(size)]


def direct(broker, group, **kw):
    kw.setdefault("long_poll_ms", 1000)
    return Consumer(group, brokers=[url(broker)], commit_interval=0.2, **kw)


def settle(handler, count, quiet=0.5):
    """The messages once ``count`` arrived and nothing more came for ``quiet`` s."""
    handler.wait_for(count)
    time.sleep(quiet)
    return list(handler.messages)


def test_start_from_a_time_replays_exactly_what_was_stored_since_instead_of_the_committed_offset(broker):
    between = bursts(broker, "t-replay", 2, 6)
    first = Collector()
    with direct(broker, "billing") as c:  # the group reads everything and commits its end
        c.subscribe("t-replay", first).start()
        assert [m.body for m in settle(first, 12)] == bodies(0, 6) + bodies(1, 6)
    when = datetime.fromtimestamp(between[0] / 1000, tz=timezone.utc)
    replayed = Collector()
    with direct(broker, "billing", start_from=when) as c:
        c.subscribe("t-replay", replayed).start()
        got = settle(replayed, 6, quiet=1.0)
        assert [m.body for m in got] == bodies(1, 6)  # exactly the second burst: nothing before, no duplicate
        assert [m.offset for m in got] == list(range(6, 12))
        with broker.client() as p:
            p.put_ok("t-replay", b"later", 0)
        assert replayed.wait_for(7)[-1].body == b"later"  # and it goes on consuming as usual
    again = Collector()
    with direct(broker, "billing") as c:  # commits continued from the replay: the group is at its end
        c.subscribe("t-replay", again).start()
        with broker.client() as p:
            p.put_ok("t-replay", b"newest", 0)
        assert [m.body for m in settle(again, 1)] == [b"newest"]


def test_start_from_ms_after_everything_starts_at_the_end(broker):
    bursts(broker, "t-end", 1, 3)
    handler = Collector()
    with direct(broker, "g-end", start_from=now_ms() + 500) as c:
        c.subscribe("t-end", handler).start()
        time.sleep(1.0)
        assert handler.messages == []
        with broker.client() as p:
            p.put_ok("t-end", b"new", 0)
        assert [m.body for m in settle(handler, 1)] == [b"new"]


def test_seek_back_to_a_time_redelivers_from_there(broker):
    between = bursts(broker, "t-seek", 3, 4)
    handler = Collector()
    with direct(broker, "g-seek") as c:
        c.subscribe("t-seek", handler).start()
        settle(handler, 12)
        naive_local = datetime.fromtimestamp(between[1] / 1000)  # a naive datetime is local time
        assert c.seek("7-0", naive_local) == 8
        got = settle(handler, 16)
        assert [m.body for m in got[12:]] == bodies(2, 4)  # from the third burst again, once
        assert c.seek(Partition(7, 0), datetime.fromtimestamp(between[0] / 1000, tz=timezone.utc),
                      topic="t-seek") == 4
        got = settle(handler, 24)
        assert [m.body for m in got[16:]] == bodies(1, 4) + bodies(2, 4)


def test_seek_to_an_offset_and_nothing_fetched_before_it_is_delivered_after_it(broker):
    with broker.client() as c:
        for i in range(20):
            c.put_ok("t-off", b"m%02d" % i, 1)
    seen = []
    seeked = threading.Event()
    consumer = direct(broker, "g-off")

    def handler(message):
        seen.append(message.offset)
        if message.offset == 5 and not seeked.is_set():  # the get fetched 0..19 at once: 6..19 are waiting
            seeked.set()
            assert consumer.seek("7-1", 2) == 2

    with consumer:
        consumer.subscribe("t-off", handler).start()
        deadline = time.monotonic() + 15
        while len(seen) < 24:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        time.sleep(0.5)
        assert seen == list(range(6)) + list(range(2, 20))  # 6..19 of the first fetch were dropped
        assert consumer.seek("7-1", 18) == 18  # from another thread, at the end
        deadline = time.monotonic() + 15
        while len(seen) < 26:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        time.sleep(0.5)
        assert seen[24:] == [18, 19]


def test_seek_refuses_what_this_consumer_does_not_own(broker):
    with broker.client() as c:
        c.put_ok("t-own", b"x", 0)
    consumer = direct(broker, "g-refuse")
    consumer.subscribe("t-own", Collector())
    with pytest.raises(errors.ClientError) as info:
        consumer.seek("7-0", 0)  # not started: nothing is assigned
    assert "t-own 7-0 is not assigned to this consumer (assigned: none)" in str(info.value)
    with consumer:
        consumer.start()
        with pytest.raises(errors.ClientError) as info:
            consumer.seek("9-0", 0)  # no broker 9
        assert "t-own 9-0 is not assigned to this consumer (assigned: t-own/7-0, t-own/7-1" in str(info.value)
        with pytest.raises(errors.ClientError):
            consumer.seek("7-0", 0, topic="t-other")
        with pytest.raises(ValueError):
            consumer.seek("7-0", -1)
        with pytest.raises(ValueError):
            consumer.seek("7-0", "yesterday")
        with pytest.raises(errors.InvalidPartition):
            consumer.seek("seven", 0)
    with pytest.raises(ValueError) as info:
        direct(broker, "g-refuse", start_from="yesterday")
    assert "start_from must be 'earliest', 'latest', a datetime or ms since the Unix epoch" in str(info.value)


def test_offset_at_of_the_consumer_and_its_errors(broker):
    between = bursts(broker, "t-at", 2, 2, partition=3)
    with direct(broker, "g-at") as c:
        assert c.offset_at("t-at", "7-3", between[0]) == 2
        assert c.offset_at("t-at", "7-3", datetime(1970, 1, 1, tzinfo=timezone.utc)) == 0
        with pytest.raises(errors.NotFound) as info:
            c.offset_at("t-at", "7-9", 0)
        assert "partition `9` is not exists" in str(info.value)


@pytest.mark.slow
def test_start_from_replays_partitions_a_rebalance_gives_later_the_first_time_only(broker_factory, tmp_path,
                                                                                     zk_connect):
    b = broker_factory(small_config(tmp_path / "data", zk={"connect": zk_connect}))
    between = bursts(b, "t-group", 2, 8, partition=None)  # 2 messages of each burst on each of 4 partitions

    def member(name, handler, **kw):
        c = Consumer("grp", zk_connect=zk_connect, consumer_id=name, long_poll_ms=1000, commit_interval=0.2,
                     recover_dir=tmp_path / name, **kw)
        return c.subscribe("t-group", handler).start()

    early = Collector()
    b_member = member("b", early)
    early.received_once([b"%d-%d" % (n, i) for n in range(2) for i in range(8)])
    replaying = Collector()
    a_member = member("a", replaying, start_from=datetime.fromtimestamp(between[0] / 1000, tz=timezone.utc))
    try:
        wait_for(lambda: a_member.assignment()["t-group"] == [Partition(7, 0), Partition(7, 1)], 20, "a's share")
        got = settle(replaying, 4)
        assert sorted(m.body for m in got) == [b"1-0", b"1-1", b"1-4", b"1-5"]  # burst 2 of 7-0 and 7-1
        b_member.close()  # 7-2 and 7-3 come to a for the first time: replayed from the time too
        got = settle(replaying, 8)
        assert sorted(m.body for m in got[4:]) == [b"1-2", b"1-3", b"1-6", b"1-7"]
        c_member = member("c", Collector())  # takes 7-2 and 7-3 away, and gives them back when it leaves
        wait_for(lambda: len(a_member.assignment()["t-group"]) == 2, 20, "the rebalance to c")
        c_member.close()
        wait_for(lambda: len(a_member.assignment()["t-group"]) == 4, 20, "the rebalance back to a")
        with b.client() as p:
            p.put_ok("t-group", b"new-2", 2)
        got = settle(replaying, 9, quiet=1.0)
        assert [m.body for m in got[8:]] == [b"new-2"]  # a second assignment reads from the commit: no replay
    finally:
        a_member.close()
