"""Per-message acknowledgement against a real broker (docs/messaging.md "Per-message acknowledgement (POP)"): two
consumers of one partition get different messages, an unacknowledged message comes back with attempt 2, past the
maximum attempts it is in %DLQ%<group>, the state survives kill -9, and `stats pop` shows it."""

import json
import threading
import time

import pytest

from metaq.pop import limits as pop_limits
from metaq import admincli as admin
from metaq.admin.wire import DlqList
from metaq.client.local import small_config
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.client.pop import SimpleConsumer
from metaq.protocol import stats as stats_codec
from tests.harness.broker import wait_for

GROUP = "workers"


def url(b):
    return "meta://127.0.0.1:%d" % b.port


def put(b, topic, n, partition=0):
    with b.client() as c:
        return [c.put_ok(topic, b"m%d" % i, partition)[2] for i in range(n)]


def bodies(got):
    return sorted(r.message.body for r in got)


def test_two_consumers_of_one_partition_get_different_messages_and_acks_end_them(broker_factory, tmp_path, capsys):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "one", "partitions": 1}]))
    put(b, "one", 6)
    with SimpleConsumer(url(b), GROUP, "one", invisible_ms=60_000) as a, \
            SimpleConsumer(url(b), GROUP, "one", invisible_ms=60_000) as c:
        got_a, got_c = a.receive(3), c.receive(3)
        assert len(got_a) == 3 and len(got_c) == 3
        assert not set(bodies(got_a)) & set(bodies(got_c))
        assert {r.attempt for r in got_a + got_c} == {1}
        assert a.ack(*got_a) == [None] * 3 and c.ack(*got_c) == [None] * 3
        assert a.ack(got_a[0]) == [None]  # a repeated ack is fine
        assert a.receive(3) == []
        # another group reads the same messages: its own state
        with SimpleConsumer(url(b), "other", "one") as o:
            assert len(o.receive(32)) == 6
    with b.client() as cl:
        rows = stats_codec.parse("pop", cl.stats("pop").encode())
        assert (GROUP, "one", 0) in [(r.group, r.topic, r.in_flight) for r in rows]
        assert ("other", "one", 6) in [(r.group, r.topic, r.in_flight) for r in rows]
        assert int(cl.stats_dict()["pop_in_flight"]) == 6
    assert admin.main(["--brokers", url(b), "--json", "pop", "other"]) == admin.EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert [(r["group"], r["topic"], r["in_flight"]) for r in shown] == [("other", "one", 6)]


def test_an_unacked_message_comes_back_with_attempt_2_and_change_invisible_holds_it(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "one", "partitions": 1}]))
    put(b, "one", 2)
    with SimpleConsumer(url(b), GROUP, "one", invisible_ms=300) as a:
        first, held = a.receive(2)
        old = held.handle
        a.change_invisible(held, 60_000)
        assert a.ack(old)[0] is not None  # the handle of before the change no longer acks
        time.sleep(0.4)
        again = a.receive(2, wait_s=2)
        assert [(r.message.body, r.attempt) for r in again] == [(first.message.body, 2)]
        assert a.ack(first)[0] is not None  # the first delivery's handle is refused
        assert a.ack(*again, held) == [None, None]
    with b.client() as cl:
        assert int(cl.stats_dict()["pop_redelivered"]) == 1


@pytest.mark.slow
def test_past_the_maximum_attempts_the_message_is_in_the_dead_letter_topic(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "one", "partitions": 1}]))
    put(b, "one", 1)
    inv = pop_limits.POP_MIN_INVISIBLE_MS
    with SimpleConsumer(url(b), GROUP, "one", invisible_ms=inv) as a:
        attempts = []
        deadline = time.monotonic() + 30
        while len(attempts) < pop_limits.POP_MAX_ATTEMPTS and time.monotonic() < deadline:
            attempts += [r.attempt for r in a.receive(1, wait_s=1)]
        assert attempts == list(range(1, pop_limits.POP_MAX_ATTEMPTS + 1))
        time.sleep(inv / 1000 + 0.05)
        assert a.receive(1) == []  # the 17th receive moved it to the dead letters
    with b.client() as cl:
        assert int(cl.stats_dict()["pop_dead_lettered"]) == 1

        def letters():  # what metaq-admin dlq list shows, once the copy is flushed
            return json.loads(cl.call(DlqList(GROUP, 10, cl.opaque())).body)["dead_letters"]
        wait_for(letters, what="the dead letter listed")
        assert [(d["topic"], d["body"], d["reconsume_times"]) for d in letters()] == \
            [("one", "m0", pop_limits.POP_MAX_ATTEMPTS)]


@pytest.mark.fault
def test_the_state_survives_kill_9(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "four", "partitions": 4}]))
    for p in range(4):
        put(b, "four", 3, p)
    with SimpleConsumer(url(b), GROUP, "four", invisible_ms=200) as a:
        got = a.receive(8)
        assert len(got) == 8
        acked, unacked = got[:5], got[5:]
        assert a.ack(*acked) == [None] * 5
    b.kill()
    b.start()
    time.sleep(0.25)
    with SimpleConsumer(url(b), GROUP, "four", invisible_ms=60_000) as a:
        after = a.receive(32)
    seen = {(r.message.partition, r.message.offset): r.attempt for r in after}
    assert not {(r.message.partition, r.message.offset) for r in acked} & set(seen)  # no acked message again
    assert all(seen[(r.message.partition, r.message.offset)] == 2 for r in unacked)  # no unacked one lost
    assert len(seen) == 12 - 5


def test_fifo_message_groups_come_one_at_a_time_in_order(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "one", "partitions": 1}]))
    with Producer(brokers=[url(b)]) as p:
        for i, g in enumerate("AABAB"):
            assert p.send(Message("one", b"%s%d" % (g.encode(), i), properties={"__SHARDINGKEY": g})).success
    with SimpleConsumer(url(b), GROUP, "one", fifo=True, invisible_ms=60_000) as a:
        first = a.receive(10)
        assert [r.message.body for r in first] == [b"A0"]
        assert a.receive(10) == []
        a.ack(*first)
        second = a.receive(10)
        assert [r.message.body for r in second] == [b"A1", b"B2"]
        a.ack(*second)
        assert [r.message.body for r in a.receive(10)] == [b"A3", b"B4"]


def test_a_receive_with_a_wait_answers_when_a_message_arrives_or_one_expires(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "two", "partitions": 2}]))
    with SimpleConsumer(url(b), GROUP, "two", invisible_ms=400) as a:
        timer = threading.Timer(0.3, lambda: put(b, "two", 1, partition=1))
        timer.start()
        t0 = time.monotonic()
        got = a.receive(4, wait_s=30)
        waited = time.monotonic() - t0
        timer.join()
        # answered when the message came, not at the end of the 30 s wait
        assert [(r.message.partition, r.attempt) for r in got] == [(1, 1)] and 0.2 < waited < 15
        t0 = time.monotonic()
        again = a.receive(4, wait_s=30)  # nothing new: the wait ends when the one in flight expires
        waited = time.monotonic() - t0
        assert [(r.message.partition, r.attempt) for r in again] == [(1, 2)] and 0.2 < waited < 15
        t0 = time.monotonic()
        a.ack(*again)
        assert a.receive(4, wait_s=0.3) == [] and time.monotonic() - t0 >= 0.25


def test_long_message_groups_stay_apart_at_the_limit_and_one_past(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "one", "partitions": 1}]))
    at = "g" * pop_limits.POP_MAX_MESSAGE_GROUP_CHARS
    past = ["h" * pop_limits.POP_MAX_MESSAGE_GROUP_CHARS + tail for tail in ("1", "2")]  # one past, same start
    with Producer(brokers=[url(b)]) as p:
        for i, g in enumerate([at, past[0], past[1], at, past[0]]):
            assert p.send(Message("one", b"%d" % i, properties={"__SHARDINGKEY": g})).success
    with SimpleConsumer(url(b), GROUP, "one", fifo=True, invisible_ms=60_000) as a:
        first = a.receive(10)
        assert [r.message.body for r in first] == [b"0", b"1", b"2"]  # three groups: the long ones apart
        a.ack(*first)
        assert [r.message.body for r in a.receive(10)] == [b"3", b"4"]
