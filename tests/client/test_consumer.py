"""The consumer against a real broker without ZooKeeper: pull, push, long polling, offsets, retries, filters, lag."""

import os
import threading
import time
from itertools import pairwise

import pytest

from metaq import errors
from metaq.client.consumer import Consumer
from metaq.client.message import Partition
from metaq.client.offsets import LocalFileOffsetStore
from metaq.client.recover import RecoverStore
from metaq.protocol import events as ev
from tests.harness.broker import consume_all
from tests.harness.broker import url_of as url, wait_for as wait_until
from tests.harness.collector import Collector


def direct(broker, group="grp", **kw):
    kw.setdefault("long_poll_ms", 2000)
    return Consumer(group, brokers=[url(broker)], **kw)


def test_fetch_returns_exact_messages(broker):
    with broker.client() as c:
        sent = [c.put_ok("topic1", b"first", 1), c.put_ok("topic1", b"second", 1, attribute="tag=x"),
                c.put_ok("topic1", b"", 1, attribute="")]
    with direct(broker) as consumer:
        msgs = consumer.fetch("topic1", "7-1", 0)
        assert [(m.body, m.attribute, m.offset, m.id, m.partition, m.topic) for m in msgs] == [
            (b"first", None, 0, sent[0][0], Partition(7, 1), "topic1"),
            (b"second", "tag=x", 1, sent[1][0], Partition(7, 1), "topic1"),
            (b"", "", 2, sent[2][0], Partition(7, 1), "topic1")]
        assert [m.body for m in consumer.fetch("topic1", Partition(7, 1), 1)] == [b"second", b""]
        assert consumer.fetch("topic1", "7-1", 3) == []  # nothing there yet
        assert len(consumer.fetch("topic1", "7-1", 0, max_size=1)) == 1  # always at least one whole message


def test_fetch_follows_301(broker):
    with broker.client() as c:
        for i in range(3):
            c.put_ok("topic1", b"m%d" % i, 0)
    with direct(broker) as consumer:
        assert [m.offset for m in consumer.fetch("topic1", "7-0", -5)] == [0, 1, 2]  # below min: moved to 0
        assert consumer.fetch("topic1", "7-0", 99) == []  # past the end: moved to 3, nothing there


def test_fetch_long_poll_waits_for_a_message(broker):
    with direct(broker) as consumer:
        with broker.client() as c:
            c.put_ok("topic1", b"x", 2)
        timer = threading.Timer(0.3, lambda: broker.client().put_ok("topic1", b"late", 2))
        timer.start()
        started = time.monotonic()
        msgs = consumer.fetch("topic1", "7-2", 1, max_wait_ms=60000)  # answered by the put, not the wait's end
        assert [m.body for m in msgs] == [b"late"] and time.monotonic() - started < 30
        timer.join()


def test_push_delivers_every_message_once_in_partition_order(broker):
    with broker.client() as c:
        for i in range(120):
            c.put_ok("topic1", b"m%03d" % i)  # the broker spreads them over 4 partitions
    handler = Collector()
    consumer = direct(broker)
    consumer.subscribe("topic1", handler).start()
    try:
        msgs = handler.wait_for(120)
        assert consumer.assignment() == {"topic1": [Partition(7, p) for p in range(4)]}
        time.sleep(0.2)
        assert sorted(m.body for m in handler.messages) == [b"m%03d" % i for i in range(120)]  # exactly once
        for p in range(4):
            offsets = [m.offset for m in msgs if m.partition == Partition(7, p)]
            assert offsets == list(range(len(offsets)))
        with broker.client() as c:
            c.put_ok("topic1", b"after", 3)
        assert handler.wait_for(121)[-1].body == b"after"
    finally:
        consumer.close()


@pytest.mark.slow
def test_idle_consumer_sleeps_and_wakes_at_once(broker):
    """Idle, a consumer's gets are parked on the broker (no polling loop); a put wakes its get: it is delivered
    long before the 60 s long poll would have ended. Counted on the broker, not timed."""
    with broker.client() as c:
        c.put_ok("topic1", b"warm-up", 0)
    handler = Collector()
    consumer = direct(broker, long_poll_ms=60000)
    consumer.subscribe("topic1", handler).start()

    def broker_stats():
        with broker.client() as c:
            return c.stats_dict()

    try:
        handler.wait_for(1)
        wait_until(lambda: broker_stats()["parked_gets"] == "4", what="one parked get per partition")
        before = broker_stats()["cmd_get"]
        time.sleep(2.0)  # a window of idleness: a polling consumer would send gets in it
        after = broker_stats()
        assert (after["cmd_get"], after["parked_gets"]) == (before, "4"), "the idle consumer sent gets"
        with broker.client() as c:
            for i in range(5):
                c.put_ok("topic1", b"ping%d" % i, i % 4)
                assert handler.wait_for(2 + i, timeout=30)[-1].body == b"ping%d" % i  # woken, not timed out
    finally:
        consumer.close()


def test_offsets_committed_and_a_restart_resumes_there(broker):
    with broker.client() as c:
        for i in range(10):
            c.put_ok("topic1", b"a%d" % i, 0)
    first = Collector()
    consumer = direct(broker, commit_interval=60)
    consumer.subscribe("topic1", first).start()
    first.wait_for(10)
    consumer.commit()
    with broker.client() as c:  # the broker's offset store now says 10 (the next offset to read)
        assert c.call(ev.QueryOffset("grp", "topic1", 0, 1)).body == b"10"
        for i in range(10, 15):
            c.put_ok("topic1", b"a%d" % i, 0)
    first.wait_for(15)
    consumer.close()  # commits 15
    with broker.client() as c:
        assert c.call(ev.QueryOffset("grp", "topic1", 0, 1)).body == b"15"
        c.put_ok("topic1", b"a15", 0)
    second = Collector()
    consumer = direct(broker)
    consumer.subscribe("topic1", second).start()
    try:
        assert [m.body for m in second.wait_for(1)] == [b"a15"]
        time.sleep(0.3)
        assert second.bodies() == [b"a15"]  # nothing before the last commit comes again
    finally:
        consumer.close()
    other = Collector()  # another group starts from the earliest offset
    with direct(broker, group="other") as consumer:
        consumer.subscribe("topic1", other).start()
        other.received_once([b"a%d" % i for i in range(16)])


def test_start_from_latest_skips_old_messages(broker):
    with broker.client() as c:
        c.put_ok("topic1", b"old", 0)
    handler = Collector()
    with direct(broker, start_from="latest") as consumer:
        consumer.subscribe("topic1", handler).start()
        wait_until(lambda: all(f.offset is not None for f in consumer._fetchers.values()))
        with broker.client() as c:
            c.put_ok("topic1", b"new", 0)
        assert [m.body for m in handler.wait_for(1)] == [b"new"]


def test_failing_message_is_retried_then_parked_and_replayed(broker, tmp_path):
    broken = {"on": True}
    handler = Collector(fail=lambda m: m.body == b"bad" and broken["on"])
    with broker.client() as c:
        for body in (b"ok1", b"bad", b"ok2"):
            c.put_ok("topic1", body, 0, attribute="k" if body == b"bad" else None)
    consumer = direct(broker, max_retries=3, retry_backoff=0.01, recover_dir=tmp_path, recover_interval=0.3)
    consumer.subscribe("topic1", handler).start()
    try:
        assert [m.body for m in handler.wait_for(2)] == [b"ok1", b"ok2"]  # later messages still come
        assert handler.calls[b"bad"] == 4  # 1 + max_retries
        [msg] = consumer.parked()["topic1"]
        assert (msg.body, msg.attribute, msg.offset, msg.partition) == (b"bad", "k", 1, Partition(7, 0))
        broken["on"] = False  # the handler works again: the recover thread replays the message
        replayed = handler.wait_for(3)[-1]
        assert (replayed.body, replayed.attribute, replayed.offset) == (b"bad", "k", 1)
        wait_until(lambda: consumer.parked() == {"topic1": []})
    finally:
        consumer.close()


def test_orderly_a_failing_message_holds_its_partition_retried_with_backoff_never_parked(broker, tmp_path):
    """subscribe(..., orderly=True): the failing message is retried past max_retries with a growing backoff, the
    later messages of its partition wait behind it, other partitions go on, and nothing is parked."""
    broken = {"on": True}
    bad_calls = []

    def fail(message):
        if message.body == b"bad":
            bad_calls.append(time.monotonic())
            return broken["on"]
        return False

    handler = Collector(fail=fail)
    with broker.client() as c:
        for body in (b"ok1", b"bad", b"ok2"):
            c.put_ok("topic1", body, 0)
        c.put_ok("topic1", b"other", 1)
    consumer = direct(broker, max_retries=1, retry_backoff=0.05, recover_dir=tmp_path, recover_interval=0.2)
    consumer.subscribe("topic1", handler, orderly=True).start()
    try:
        wait_until(lambda: len(bad_calls) >= 5, what="five attempts at the failing message")
        assert sorted(handler.bodies()) == [b"ok1", b"other"]  # ok2 waits behind bad; partition 1 went on
        assert consumer.parked() in ({}, {"topic1": []})
        gaps = [b - a for a, b in pairwise(bad_calls)]
        assert all(gap >= 0.05 * 2 ** i * 0.9 for i, gap in enumerate(gaps[:4])), gaps  # 0.05, 0.1, 0.2, 0.4 s
        broken["on"] = False
        handler.wait_for(4)
        assert [m.body for m in handler.messages if m.partition.partition == 0] == [b"ok1", b"bad", b"ok2"]
        assert consumer.parked() in ({}, {"topic1": []})
    finally:
        consumer.close()


def test_orderly_a_consumer_closed_while_a_message_fails_begins_with_it_after_a_restart(broker, tmp_path):
    failing = Collector(fail=lambda m: m.body == b"bad")
    with broker.client() as c:
        for body in (b"ok1", b"bad", b"ok2"):
            c.put_ok("topic1", body, 0)
    consumer = direct(broker, max_retries=0, retry_backoff=0.01, recover_dir=tmp_path)
    consumer.subscribe("topic1", failing, orderly=True).start()
    wait_until(lambda: failing.calls.get(b"bad", 0) >= 3, what="the failing message retried")
    consumer.close()  # commits the offset of the message that held the partition, not past it
    working = Collector()
    consumer = direct(broker, recover_dir=tmp_path)
    consumer.subscribe("topic1", working, orderly=True).start()
    try:
        assert [m.body for m in working.wait_for(2)] == [b"bad", b"ok2"]
    finally:
        consumer.close()


def test_without_orderly_the_same_failure_is_parked_and_the_partition_goes_on(broker, tmp_path):
    """The contrast (the default): after 1 + max_retries calls the message is parked and ok2 is delivered."""
    handler = Collector(fail=lambda m: m.body == b"bad")
    with broker.client() as c:
        for body in (b"ok1", b"bad", b"ok2"):
            c.put_ok("topic1", body, 0)
    consumer = direct(broker, max_retries=1, retry_backoff=0.01, recover_dir=tmp_path, recover_interval=60)
    consumer.subscribe("topic1", handler).start()
    try:
        assert [m.body for m in handler.wait_for(2)] == [b"ok1", b"ok2"]
        assert [m.body for m in consumer.parked()["topic1"]] == [b"bad"] and handler.calls[b"bad"] == 2
    finally:
        consumer.close()


def test_parked_message_survives_a_restart(broker, tmp_path):
    with broker.client() as c:
        c.put_ok("topic1", b"poison", 0)
    failing = Collector(fail=lambda m: True)
    consumer = direct(broker, max_retries=1, retry_backoff=0.01, recover_dir=tmp_path, recover_interval=60)
    consumer.subscribe("topic1", failing).start()
    wait_until(lambda: len(consumer.parked().get("topic1", [])) == 1)
    assert failing.calls[b"poison"] == 2
    consumer.close()
    with RecoverStore(tmp_path, "topic1", "grp") as store:
        assert [m.body for _s, m in store.pending()] == [b"poison"]
    working = Collector()
    consumer = direct(broker, recover_dir=tmp_path, recover_interval=0.2)
    consumer.subscribe("topic1", working).start()
    try:  # the offset moved past it, so it comes only from the recover store, exactly once
        assert [m.body for m in working.wait_for(1)] == [b"poison"]
        time.sleep(0.5)
        assert working.bodies() == [b"poison"]
    finally:
        consumer.close()
    with RecoverStore(tmp_path, "topic1", "grp") as store:
        assert len(store) == 0


def test_failing_message_goes_to_the_dead_letter_topic(broker, tmp_path):
    handler = Collector(fail=lambda m: m.body == b"bad")
    with broker.client() as c:
        c.put_ok("topic1", b"bad", 0, attribute="type=order")
        c.put_ok("topic1", b"good", 0)
    consumer = direct(broker, max_retries=2, retry_backoff=0.01, dead_letter_topic="dead", recover_dir=tmp_path)
    consumer.subscribe("topic1", handler).start()
    try:
        assert [m.body for m in handler.wait_for(1)] == [b"good"]
        assert handler.calls[b"bad"] == 3
    finally:
        consumer.close()
    with broker.client() as c:
        records = consume_all(c, "dead", 0) + consume_all(c, "dead", 1)
    assert [(r.payload, r.attribute) for r in records] == [(b"bad", "type=order")]
    assert consumer.parked() == {}  # nothing went to the local store


def test_attribute_filters(broker):
    with broker.client() as c:
        for i, attr in enumerate(["a", "b", None, "a", "c"]):
            c.put_ok("topic1", b"m%d" % i, 0, attribute=attr)
        c.put_ok("topic1", b"end", 0, attribute="end")
    results = {}
    specs = {"one": "a", "several": ["b", "c", "end"], "callable": lambda m: m.attribute is None or m.body == b"end"}
    for name, spec in specs.items():
        handler = results[name] = Collector()
        with direct(broker, group="g-" + name) as consumer:
            consumer.subscribe("topic1", handler, filter=spec).start()
            wait_until(lambda: consumer._fetchers[("topic1", Partition(7, 0))].offset == 6)
    assert results["one"].bodies() == [b"m0", b"m3"]
    assert results["several"].bodies() == [b"m1", b"m4", b"end"]
    assert results["callable"].bodies() == [b"m2", b"end"]


def test_broadcast_consumers_each_get_everything(broker, tmp_path):
    with broker.client() as c:
        for i in range(20):
            c.put_ok("topic1", b"b%d" % i)
    handlers = [Collector(), Collector()]
    consumers = [direct(broker, broadcast=True, offsets_file=tmp_path / ("c%d.json" % n), consumer_id="c%d" % n)
                 for n in range(2)]
    try:
        for consumer, handler in zip(consumers, handlers, strict=True):
            consumer.subscribe("topic1", handler).start()
        for handler in handlers:
            assert sorted(m.body for m in handler.wait_for(20)) == sorted(b"b%d" % i for i in range(20))
    finally:
        for consumer in consumers:
            consumer.close()
    import json
    saved = json.loads((tmp_path / "c0.json").read_text())
    assert sum(e["offset"] for e in saved["grp"]["topic1"].values()) == 20


def test_lag_is_max_offset_minus_committed(broker):
    gate = threading.Event()
    handler = Collector()

    def slow(message):
        if message.offset == 5:
            gate.wait(10)
        handler(message)

    with broker.client() as c:
        for i in range(10):
            c.put_ok("topic1", b"l%d" % i, 0)
        c.put_ok("topic1", b"other", 1)
    consumer = direct(broker, commit_interval=60)
    consumer.subscribe("topic1", slow).start()
    try:
        handler.wait_for(6)  # offsets 0..4 on partition 0, and partition 1's message
        consumer.commit()
        lag = consumer.lag()
        assert lag[("topic1", Partition(7, 0))] == 10 - 5
        assert lag[("topic1", Partition(7, 1))] == 0
        assert lag[("topic1", Partition(7, 2))] == 0
        gate.set()
        handler.wait_for(11)
        consumer.commit()
        assert set(consumer.lag().values()) == {0}
    finally:
        gate.set()
        consumer.close()


def test_bad_inputs_fail_early(broker, tmp_path):
    with pytest.raises(errors.ClientError):
        Consumer("bad group", brokers=[url(broker)])
    with pytest.raises(ValueError, match="start_from"):
        Consumer("grp", brokers=[url(broker)], start_from="middle")
    with pytest.raises(ValueError):
        Consumer("grp")  # neither ZooKeeper nor brokers
    with pytest.raises(ValueError):
        Consumer("grp", brokers=[url(broker)], offset_store="zk")
    with pytest.raises(ValueError):
        Consumer("grp", brokers=[url(broker)], long_poll_ms=120000)
    with pytest.raises(errors.ClientError):
        Consumer("grp", brokers=[url(broker)], dead_letter_topic="no/such")
    consumer = direct(broker)
    with pytest.raises(errors.InvalidTopic):
        consumer.subscribe("bad/topic", print)
    with pytest.raises(errors.ClientError):
        consumer.subscribe("topic1", "not callable")
    with pytest.raises(errors.ClientError):
        consumer.start()  # nothing subscribed
    with pytest.raises(errors.InvalidPartition):
        consumer.fetch("topic1", "seven", 0)
    consumer.close()
    consumer = direct(broker, recover_dir=tmp_path)
    consumer.subscribe("topic1", print).start()
    try:
        with pytest.raises(errors.ClientError):
            consumer.subscribe("topic2", print)  # after start
    finally:
        consumer.close()


@pytest.mark.integration
def test_unreachable_brokers_fail_start(tmp_path):
    consumer = Consumer("grp", brokers=["meta://127.0.0.1:1"], recover_dir=tmp_path)
    consumer.subscribe("topic1", print)
    with pytest.raises(errors.ConnectionLost):
        consumer.start()


def test_push_follows_301_from_a_stored_offset_past_the_end(broker, tmp_path):
    with broker.client() as c:
        for i in range(3):
            c.put_ok("topic1", b"o%d" % i, 0)
    offsets = tmp_path / "offsets.json"  # an offset from an older log, past this partition's end
    LocalFileOffsetStore(offsets, "grp").commit({("topic1", Partition(7, 0)): (50, -1)})
    handler = Collector()
    with direct(broker, offset_store="file", offsets_file=offsets) as consumer:
        consumer.subscribe("topic1", handler).start()
        wait_until(lambda: consumer._fetchers[("topic1", Partition(7, 0))].offset == 3)
        with broker.client() as c:
            c.put_ok("topic1", b"new", 0)
        assert [(m.body, m.offset) for m in handler.wait_for(1)] == [(b"new", 3)]


def test_default_consumer_id_and_member_id(broker, tmp_path):
    consumer = direct(broker)
    ip, pid, hexid = consumer.consumer_id.rsplit("-", 2)
    assert pid == str(os.getpid()) and len(hexid) == 32 and ip.count(".") == 3
    assert consumer.member_id == "grp_" + consumer.consumer_id
    consumer.close()
    consumer.close()  # closing twice is fine
