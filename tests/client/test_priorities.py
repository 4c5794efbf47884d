"""Consumer priorities against a real broker (README "Priorities"): a backlog of mixed priorities drains highest
first through raw ``get_prio`` requests and through the metaq consumer, order within a level kept, nothing lost
or duplicated; the starvation bound; the bad inputs; per-level offsets across a consumer restart; the remoting
``PRIORITY`` property; a parked ``get_prio`` woken by a put to a level."""

import json
import random
import subprocess
import sys
import threading
import time

import pytest

from metaq import limits
from metaq.priorities import limits as priorities_limits
from metaq.client.consumer import Consumer
from metaq.client.local import free_port, rmq_config, small_config
from metaq.client.message import Message
from metaq.client.producer import Producer
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.admin.wire import ResetOffset
from metaq.priorities.wire import PriorityGet, decode_get_prio_body
from metaq.protocol.rocketmq.bodies import BatchEntry, decode_stored_messages, encode_batch_messages
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.topics.wire import TopicCommand
from tests.harness.broker import url_of as url, wait_for
from tests.harness.http import request, with_http
from tests.harness.replication import caught_up, master_config
from tests.harness.rocketmq import pull, send_v1

LEVELS = 3
#: SEND_BATCH_MESSAGE's header (SendMessageRequestHeaderV2's one-letter keys: group, topic, ..., batch).
BATCH_FIELDS = {"a": "PG", "b": "jobs", "c": "TBW102", "d": 4, "e": 0, "f": 0, "h": 0, "i": "", "m": "true"}


def create(client, name, **settings):
    r = client.call(TopicCommand("create", name, tuple((k, str(v)) for k, v in settings.items()), client.opaque()))
    assert r.code == 200, r
    return json.loads(r.body)


def backlog(client, topic, count=300, seed=7):
    """``count`` puts of interleaved random priorities; returns {level: [bodies in put order]}."""
    rnd = random.Random(seed)
    sent = {k: [] for k in range(LEVELS)}
    for i in range(count):
        level = rnd.randrange(LEVELS)
        body = b"m%d-p%d" % (i, level)
        r = client.put_prio(topic, body, level, partition=0)
        assert r.code == 200, r
        sent[level].append(body)
    return sent


def ends(client, topic):
    """Each level's max offset of partition 0 (``offset`` past the end answers the max)."""
    out = []
    for k in range(LEVELS):
        name = topic if k == 0 else "%s%%P%d" % (topic, k)
        r = client.call(ev.Offset(name, "g", 0, 1 << 40, client.opaque()))
        out.append(int(r.body) if r.code == 200 else r)
    return out


def assert_highest_first(levels, bodies, sent):
    """``levels``: the level of each delivered message in order; ``bodies``: per level, in delivery order."""
    assert levels == sorted(levels, reverse=True), "a lower level was served while a higher one had a backlog"
    for k in range(LEVELS):
        assert bodies[k] == sent[k]  # every message once, in put order within its level


def test_raw_get_prio_drains_a_mixed_backlog_highest_first(broker):
    with broker.client() as c:
        create(c, "jobs", partitions=1, priorities=LEVELS,
               priority_max_wait_ms=priorities_limits.MAX_PRIORITY_MAX_WAIT_MS)
        sent = backlog(c, "jobs")
        assert ends(c, "jobs") == [len(sent[k]) for k in range(LEVELS)]
        offsets, levels, bodies = [0] * LEVELS, [], {k: [] for k in range(LEVELS)}
        while True:
            r = c.get_prio("jobs", 0, offsets, max_size=200)  # a few records per reply
            if isinstance(r, ev.Result):
                assert r.code == 404, r
                break
            level, records = r
            assert records
            levels.extend([level] * len(records))
            bodies[level].extend(rec.data for rec in records)
            offsets[level] += len(records)
        assert_highest_first(levels, bodies, sent)
        assert offsets == [len(sent[k]) for k in range(LEVELS)]
        assert [rec.data for rec in c.get_records("jobs", 0, 0)][:3] == sent[0][:3]  # plain get: level 0
        assert c.get_records("jobs%P2", 0, 0)[0].data == sent[2][0]  # a level read by its internal name


def test_the_consumer_drains_highest_first_and_keeps_offsets_per_level(broker):
    with broker.client() as c:
        create(c, "jobs", partitions=1, priorities=LEVELS,
               priority_max_wait_ms=priorities_limits.MAX_PRIORITY_MAX_WAIT_MS)
        sent = backlog(c, "jobs")
    got, lock, first, go_on = [], threading.Lock(), threading.Event(), threading.Event()

    def handler(m):
        with lock:
            got.append((m.priority, m.body))
        first.set()
        go_on.wait(30)  # the first message is held until the lag was read

    total = sum(len(v) for v in sent.values())
    consumer = Consumer("workers", brokers=[url(broker)], long_poll_ms=500, max_size=300, commit_interval=0.2)
    with consumer.subscribe("jobs", handler, priorities=LEVELS):
        consumer.start()
        assert first.wait(30)
        assert sum(consumer.lag().values()) == total  # every level's backlog: the first message is not done yet
        go_on.set()
        wait_for(lambda: len(got) >= total, what=lambda: "%d of %d delivered" % (len(got), total))
        wait_for(lambda: sum(consumer.lag().values()) == 0, 10, lambda: "lag %s" % consumer.lag())
    bodies = {k: [b for lv, b in got if lv == k] for k in range(LEVELS)}
    assert_highest_first([lv for lv, _b in got], bodies, sent)
    broker.stop()
    broker.start()  # the broker-kept offsets of every level survive its restart
    with broker.client() as c:  # each level's offset is committed under its own name
        for k in range(LEVELS):
            name = "jobs" if k == 0 else "jobs%%P%d" % k
            r = c.call(ev.QueryOffset("workers", name, 0, c.opaque()))
            assert (r.code, int(r.body)) == (200, len(sent[k]))
        r = c.call(ResetOffset("workers", "jobs%P1", 0, 1, True, c.opaque()))  # metaq-admin reset-offsets, per level
        assert r.code == 200 and json.loads(r.body) == {"old": len(sent[1]), "new": 1}, r
        assert c.call(ResetOffset("workers", "jobs%P1", 0, len(sent[1]), True, c.opaque())).code == 200
        for k in range(LEVELS):
            assert c.put_prio("jobs", b"after-%d" % k, k, partition=0).code == 200
    got.clear()
    restarted = Consumer("workers", brokers=[url(broker)], long_poll_ms=500, commit_interval=0.2)
    with restarted.subscribe("jobs", handler, priorities=LEVELS):
        restarted.start()
        wait_for(lambda: len(got) >= LEVELS, what=lambda: got)
        time.sleep(0.3)  # room for a wrongly redelivered message to arrive
    assert got == [(k, b"after-%d" % k) for k in reversed(range(LEVELS))]  # only the new ones, highest first


def test_a_message_that_waited_past_the_bound_goes_before_younger_higher_ones(broker):
    with broker.client() as c:
        create(c, "slow", partitions=1, priorities=LEVELS, priority_max_wait_ms=200)
        assert c.put_prio("slow", b"old-low", 0, partition=0).code == 200
        time.sleep(0.4)  # the level-0 head is now older than the bound (not an assertion on time)
        for i in range(5):
            assert c.put_prio("slow", b"new-high-%d" % i, 2, partition=0).code == 200
        level, records = c.get_prio("slow", 0, [0, 0, 0])
        assert (level, [r.data for r in records]) == (0, [b"old-low"])
        level, records = c.get_prio("slow", 0, [1, 0, 0])
        assert level == 2 and records[0].data == b"new-high-0"


def test_bad_inputs_are_refused_and_nothing_is_stored(broker):
    with broker.client() as c:
        create(c, "jobs", partitions=1, priorities=LEVELS)
        c.put_ok("plain", b"x", 0)
        for topic, level, why in (("jobs", 3, b"out of range"), ("jobs", -1, b"out of range"),
                                  ("plain", 1, b"has no priorities")):
            r = c.put_prio(topic, b"x", level, partition=0)
            assert r.code == 400 and why in r.body, r
        r = c.put("jobs%P1", b"x", partition=0)  # a level's internal name: never put to directly
        assert r.code == 400 and b"internal topic" in r.body
        assert ends(c, "jobs") == [0, 0, 0]
        assert c.get_records("plain", 0, 0)[0].data == b"x" and len(c.get_records("plain", 0, 0)) == 1
        for offsets, why in (([0, 0], b"one offset per level"),
                             ([0] * (priorities_limits.MAX_PRIORITY_LEVELS + 1), b"at most")):
            r = c.call(PriorityGet("jobs", "g", 0, tuple(offsets), 1 << 20, c.opaque()))
            assert r.code == 400 and why in r.body, r
        r = c.get_prio("plain", 0, [0, 0])
        assert r.code == 400 and b"has no priorities" in r.body
        c.send(b"get_prio jobs g 0 0,x,0 1000 5\r\n")
        r = c.read_event()
        assert r.code == 400 and b"not an integer" in r.body
        for bad in (1, priorities_limits.MAX_PRIORITY_LEVELS + 1):
            r = c.call(TopicCommand("create", "bad%d" % bad, (("priorities", str(bad)),), c.opaque()))
            assert r.code == 400 and b"priorities must be" in r.body, r
        assert (create(c, "widest", priorities=priorities_limits.MAX_PRIORITY_LEVELS)["priorities"]
                == priorities_limits.MAX_PRIORITY_LEVELS)
        r = c.call(TopicCommand("create", "jobs%P1", (), c.opaque()))
        assert r.code == 400 and b"internal name" in r.body
        r = c.call(TopicCommand("alter", "jobs", (("priorities", "2"),), c.opaque()))
        assert r.code == 400 and b"can only grow" in r.body
        r = c.call(TopicCommand("delete", "jobs", (), c.opaque()))
        assert r.code == 400 and b"not supported yet" in r.body
        r = c.get_prio("jobs", 0, [5, 0, 0])  # past level 0's end: moved, level and offset named
        assert (r.code, r.body) == (301, b"0 0")


def test_a_parked_get_prio_is_woken_by_a_put_to_any_level(broker):
    with broker.client() as c:
        create(c, "wake", partitions=1, priorities=LEVELS)
    timer = threading.Timer(0.3, lambda: broker.client().put_prio("wake", b"late", 2, partition=0))
    timer.start()
    try:
        with broker.client() as c:
            r = c.get_prio("wake", 0, [0, 0, 0], max_wait_ms=limits.MAX_WAIT_MS)  # answered by the put
            assert r[0] == 2 and [rec.data for rec in r[1]] == [b"late"]
    finally:
        timer.join()


def test_the_producer_sends_priorities(broker):
    with broker.client() as c:
        create(c, "jobs", partitions=1, priorities=LEVELS)
    with Producer(brokers=[url(broker)]) as producer:
        r = producer.send(Message("jobs", b"urgent", priority=2))
        assert r.success and r.offset == 0
        r = producer.send(Message("jobs", b"too high", priority=LEVELS))
        assert not r.success and "out of range" in str(r.error)
        with pytest.raises(ValueError, match="transaction"):
            with producer.transaction():
                producer.send(Message("jobs", b"x", priority=1))
    with Producer(brokers=[url(broker)], idempotent=True) as producer:
        with pytest.raises(ValueError, match="idempotently"):
            producer.send(Message("jobs", b"x", priority=1))
    with pytest.raises(ValueError, match="both a delay level and a priority"):
        Message("jobs", b"x", priority=1, delay_level=2)
    with broker.client() as c:
        level, records = c.get_prio("jobs", 0, [0, 0, 0])
        assert (level, [x.data for x in records]) == (2, [b"urgent"])
        assert ends(c, "jobs") == [0, 0, 1]


def test_remoting_priority_property(broker_factory, tmp_path):
    b = broker_factory(rmq_config(tmp_path / "rb" / "data"), workdir=tmp_path / "rb")
    with b.client() as c:
        create(c, "jobs", partitions=1, priorities=LEVELS)
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        assert send_v1(rc, "jobs", b"rmq-high", props={"PRIORITY": "2"}).code == 0
        assert send_v1(rc, "jobs", b"rmq-low", props={}).code == 0
        r = send_v1(rc, "jobs", b"x", props={"PRIORITY": "7"})
        assert r.code != 0 and "out of range" in (r.remark or "")
        r = send_v1(rc, "jobs", b"x", props={"PRIORITY": "high"})
        assert r.code != 0 and "not a priority level" in (r.remark or "")
        r = send_v1(rc, "jobs", b"x", props={"PRIORITY": "1", "DELAY": "1"})
        assert r.code != 0 and "both a delay level and a priority" in (r.remark or "")
        batch = dict(BATCH_FIELDS, g=int(time.time() * 1000))
        r = rc.call(R.SEND_BATCH_MESSAGE, batch, encode_batch_messages([BatchEntry(b"b", 0, {"PRIORITY": "1"})]))
        assert r.code != 0 and "batch cannot hold messages with a PRIORITY" in (r.remark or "")
        pulled = decode_stored_messages(pull(rc, "jobs", 0, 0).body)  # a RocketMQ pull of the topic: level 0
        assert [m.body for m in pulled] == [b"rmq-low"]
    with b.client() as c:
        assert ends(c, "jobs") == [1, 0, 1]
        r = c.call(PriorityGet("jobs", "g", 0, (0, 0, 0), 1 << 20, c.opaque()))
        level, body = decode_get_prio_body(r.body)
        assert level == 2 and b"rmq-high" in body



def test_priorities_set_by_metaq_admin_and_over_http(broker_factory, tmp_path):
    b = broker_factory(with_http(rmq_config(tmp_path / "data")))
    out = subprocess.run([sys.executable, "-m", "metaq.admincli", "--brokers", url(b), "topics", "create", "cli",
                          "--priorities", "3", "--priority-max-wait-ms", "500"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out
    made = request(b, "PUT", "/api/topics/web?priorities=2")
    assert made.status == 201, made
    table = {t["name"]: t for t in request(b, "GET", "/api/topic-table").json()["topics"]}
    assert (table["cli"]["priorities"], table["cli"]["priority_max_wait_ms"]) == (3, 500)
    assert (table["web"]["priorities"], table["web"]["priority_max_wait_ms"]) == (2, None)
    assert request(b, "PATCH", "/api/topics/cli?priorities=2").status == 400  # never fewer levels
    with b.client() as c:
        assert c.put_prio("web", b"x", 1, partition=0).code == 200
        assert c.put_prio("web", b"x", 2, partition=0).code == 400


def test_a_slave_serves_the_levels_as_its_master(broker_factory, tmp_path):
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(str(tmp_path / "s" / "data")), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with m.client() as c:
        create(c, "jobs", partitions=1, priorities=LEVELS,
               priority_max_wait_ms=priorities_limits.MAX_PRIORITY_MAX_WAIT_MS)
        sent = backlog(c, "jobs", count=60)
    caught_up(m, s)

    def drained(b):
        with b.client() as c:
            offsets, out = [0] * LEVELS, []
            while True:
                r = c.get_prio("jobs", 0, offsets)
                if isinstance(r, ev.Result):
                    if r.code == 400 and b"has no priorities" in r.body:
                        return None  # a slave that has not taken the master's table yet
                    assert r.code == 404, r
                    return out
                out.extend((r[0], rec.data) for rec in r[1])
                offsets[r[0]] += len(r[1])

    wait_for(lambda: drained(s), what="the slave to take the table")
    assert drained(s) == drained(m) == [(k, b) for k in reversed(range(LEVELS)) for b in sent[k]]


def test_a_priority_subscription_refuses_what_it_cannot_do(broker):
    from datetime import datetime, timezone

    from metaq import errors

    with Consumer("g", brokers=[url(broker)], start_from=datetime.now(timezone.utc)) as consumer:
        with pytest.raises(errors.ClientError, match="start_from a time"):
            consumer.subscribe("jobs", print, priorities=LEVELS)
    with Consumer("g", brokers=[url(broker)]) as consumer:
        for bad in (1, priorities_limits.MAX_PRIORITY_LEVELS + 1, "3"):
            with pytest.raises(errors.ClientError, match="priorities must be"):
                consumer.subscribe("jobs", print, priorities=bad)
        consumer.subscribe("jobs", print, priorities=priorities_limits.MAX_PRIORITY_LEVELS)
