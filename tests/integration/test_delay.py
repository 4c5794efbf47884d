"""Issue 6 point 4 with real broker processes: delayed messages become visible when due, exactly once."""

import os
import shutil
import subprocess
import time

import pytest

from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.protocol.text import serialize
from metaq.server.config import load_config
from metaq.storestate import open_store
from tests.harness.broker import consume_all, wait_for
from tests.harness.delay import delay_stats, put_delayed, put_delayed_ok, records
from tests.harness.tmpfs import tmpfs

LEVELS = "1s 2s 3s"


def delay_config(data_dir, **sections):
    sections.setdefault("delay", {"levels": LEVELS})
    return small_config(data_dir, **sections)


def start(broker_factory, tmp_path, name="b", **sections):
    return broker_factory(delay_config(tmp_path / name / "data", **sections), workdir=tmp_path / name)


def wait_delivered(b, topic, partitions, count, timeout=20):
    def enough():
        with b.client() as c:
            got = records(c, topic, partitions)
        return got if len(got) >= count else None
    return wait_for(enough, timeout, "%d messages delivered to %s" % (count, topic), interval=0.1)


def assert_exactly_once(got, sent):
    """Each sent msg id arrives once, with its payload."""
    ids = [r.msg_id for r in got]
    assert sorted(ids) == sorted(sent), "missing %s, extra %s" % (set(sent) - set(ids), len(ids) - len(set(ids)))
    for r in got:
        assert r.payload == sent[r.msg_id]


def test_a_delayed_message_is_invisible_until_due_then_arrives_whole(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    with b.client() as c:
        t0 = time.monotonic()
        msg_id, _ = put_delayed_ok(c, "t-delay", b"later", 2, partition=1, attribute="tag-x")
        assert c.get("t-delay", 1, 0).code == 404
        levels, _ = delay_stats(c)
        assert levels[2]["pending"] == "1" and levels[1]["pending"] == "0"
        assert c.stats_dict()["delay_pending"] == "1"
        # level 0 = no delay (RocketMQ): stored at once, answered with its real offset
        r = put_delayed(c, "t-now", b"now", 0)
        assert r.code == 200 and r.body.split()[1:] == [b"0", b"0"], r
        # above the last level counts as the last one (RocketMQ clamps)
        put_delayed_ok(c, "t-clamp", b"clamped", 99)
        assert delay_stats(c)[0][3]["pending"] == "1"
        while True:  # a long poll wakes when the message is delivered
            v = c.get("t-delay", 1, 0, max_wait_ms=5000)
            if isinstance(v, ev.Value) or time.monotonic() - t0 > 10:
                break
        elapsed = time.monotonic() - t0
        assert isinstance(v, ev.Value), v
        assert elapsed >= 1.9, elapsed  # never before it is due (lateness is measured in bench/bench_delay.py)
        (rec,) = records(c, "t-delay", [1])
        assert (rec.msg_id, rec.attribute, rec.payload) == (msg_id, "tag-x", b"later")  # the producer's id
        assert c.get("t-clamp", 0, 0).code == 404  # level 3: not yet
        levels, totals = delay_stats(c)
        assert levels[2]["pending"] == "0" and levels[2]["delivered"] == "1" and levels[2]["next_due_ms"] == "-"
        assert totals["dropped"] == 0
        # the internal topic is no topic of the listings
        assert SCHEDULE_TOPIC not in c.stats("topics")


@pytest.mark.slow
def test_interleaved_levels_are_delivered_in_due_order(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    sent = {}
    with b.client() as c:
        for n, level in enumerate((3, 1, 2, 1, 3, 2)):
            payload = b"L%d-%d" % (level, n)
            msg_id, _ = put_delayed_ok(c, "t-order", payload, level)
            sent[msg_id] = payload
        got = wait_delivered(b, "t-order", [0], 6)
    assert_exactly_once(got, sent)
    assert [r.payload for r in got] == [b"L1-1", b"L1-3", b"L2-2", b"L2-5", b"L3-0", b"L3-4"]


def test_bad_delayed_puts_are_refused_and_store_nothing(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    with b.client() as c:
        r = put_delayed(c, "t-bad", b"x", -1)
        assert r.code == 400 and b"invalid delay level -1" in r.body, r
        r = put_delayed(c, "t-bad", b"x", 1, partition=9)
        assert r.code == 400 and b"wrong partition 9" in r.body, r
        r = put_delayed(c, "t-bad", b"x", 1, checksum=5)
        assert r.code == 400 and b"Checksum failure" in r.body, r
        c.send(b"put_delayed t-bad 0 1 0 -1 later 3\r\nx")
        r = c.read_event()
        assert r.code == 400 and b"invalid delay level 'later'" in r.body, r
        # the internal topic: refused to plain, transactional and delayed puts alike
        for r in (c.put(SCHEDULE_TOPIC, b"x", 0),
                  c.call(ev.Put(SCHEDULE_TOPIC, 0, 0, b"x", c.opaque(), -1, "TX:s:1")),
                  put_delayed(c, SCHEDULE_TOPIC, b"x", 1)):
            assert r.code == 400 and b"internal topic for delayed delivery" in r.body, r
        assert c.call(ev.Version(1)).code == 200  # the connection stays usable
        levels, _ = delay_stats(c)
        assert all(lv["pending"] == "0" for lv in levels.values())
        s = c.stats_dict()
        assert s["delay_pending"] == "0" and s["total_messages"] == "0" and s["put_failed"] == "6", s
        assert s["protocol_errors"] == "1"  # the unparseable level
        time.sleep(1.3)  # past level 1's delay: nothing shows up either
        assert c.get("t-bad", 0, 0).code == 404


@pytest.mark.slow
@pytest.mark.fault
def test_kill_9_and_restarts_deliver_each_message_exactly_once(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    state = os.path.join(b.data_dir, "delay_offsets")
    sent = {}
    with b.client() as c:
        for n in range(4):
            msg_id, _ = put_delayed_ok(c, "t-kill", b"early-%d" % n, 1, partition=n % 2)
            sent[msg_id] = b"early-%d" % n
        wait_delivered(b, "t-kill", [0, 1], 4)
        for n in range(10):
            msg_id, _ = put_delayed_ok(c, "t-kill", b"late-%d" % n, 3, partition=n % 2)
            sent[msg_id] = b"late-%d" % n
    b.kill()  # level 3 still pending
    stale = str(tmp_path / "stale_state")
    shutil.copy(state, stale)  # offsets from before the level-3 deliveries

    b.start()  # kill -9 recovery: the pending messages come when due, once
    got = wait_delivered(b, "t-kill", [0, 1], 14)
    assert_exactly_once(got, sent)

    # a crash after deliveries whose offsets never reached the state file: the log tells
    b.kill()
    shutil.copy(stale, state)
    b.start()
    with b.client() as c:
        levels, totals = delay_stats(c)
        assert totals["redeliveries_skipped"] == 10, totals
        assert all(lv["pending"] == "0" for lv in levels.values())
        assert_exactly_once(records(c, "t-kill", [0, 1]), sent)
        assert "10 of them were delivered before the restart" in b.log_text(since_start=True)

    # graceful restart with messages pending, then once more after delivery: nothing lost, nothing repeated
    with b.client() as c:
        for n in range(3):
            msg_id, _ = put_delayed_ok(c, "t-kill", b"term-%d" % n, 2, partition=n % 2)
            sent[msg_id] = b"term-%d" % n
    assert b.stop() == 0
    b.start()
    assert_exactly_once(wait_delivered(b, "t-kill", [0, 1], 17), sent)
    assert b.stop() == 0
    b.start()
    with b.client() as c:
        assert c.stats_dict()["delay_pending"] == "0"
        assert delay_stats(c)[1]["redeliveries_skipped"] == 0
        assert_exactly_once(records(c, "t-kill", [0, 1]), sent)


@pytest.mark.fault
@pytest.mark.root
def test_delivery_waits_while_the_disk_is_full_then_resumes(broker_factory, tmp_path):
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "16m"):
        cfg = delay_config(mnt / "data", store={"disk_warn_ratio": 0.5, "disk_danger_ratio": 0.5,
                                                "disk_check_interval_s": 0.1})
        b = broker_factory(cfg, workdir=tmp_path / "b")
        sent = {}
        with b.client() as c:
            put_at = time.monotonic()
            for n in range(3):  # level 3 (3 s): room for the disk to fill, and be noticed, before they are due
                msg_id, _ = put_delayed_ok(c, "t-full", b"m-%d" % n, 3)
                sent[msg_id] = b"m-%d" % n
            ballast = str(mnt / "ballast")
            subprocess.run(["fallocate", "-l", "9m", ballast], check=True)
            wait_for(lambda: c.stats_dict()["writes_refused"] == "true", what="writes refused")
            time.sleep(max(0.5, put_at + 3.5 - time.monotonic()))  # past the due time: delivery must wait
            assert c.get("t-full", 0, 0).code == 404
            levels, totals = delay_stats(c)
            assert levels[3]["pending"] == "3" and totals["dropped"] == 0
            os.unlink(ballast)
        got = wait_delivered(b, "t-full", [0], 3)
        assert_exactly_once(got, sent)


@pytest.mark.slow
def test_a_slave_does_not_deliver_it_copies_the_masters_deliveries(broker_factory, tmp_path):
    rport = free_port()
    master = start(broker_factory, tmp_path, "m", replication={"port": rport})
    wd = tmp_path / "s"
    slave = broker_factory(delay_config(wd / "data"), workdir=wd,
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with master.client() as c:
        msg_id, _ = put_delayed_ok(c, "t-rep", b"copied", 1)
    with slave.client() as c:
        assert c.stats_dict()["delay_scheduler"] == "off"
        r = put_delayed(c, "t-rep", b"x", 1)
        assert r.code == 503 and b"slave" in r.body, r
    got = wait_delivered(slave, "t-rep", [0], 1)
    time.sleep(0.5)
    with slave.client() as c:
        got = records(c, "t-rep", [0])
    assert [(r.msg_id, r.payload) for r in got] == [(msg_id, b"copied")]


def test_a_damaged_entry_is_skipped_and_its_level_goes_on(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    assert b.stop() == 0
    store = open_store(load_config(b.config_path).store_config(), int(time.time() * 1000))
    store.put(SCHEDULE_TOPIC, 0, 0, b"not an entry", int(time.time() * 1000))  # as a tool or a bug could
    store.close(int(time.time() * 1000))
    b.start()
    with b.client() as c:
        msg_id, _ = put_delayed_ok(c, "t-after", b"still delivered", 1)
    got = wait_delivered(b, "t-after", [0], 1)
    assert [(r.msg_id, r.payload) for r in got] == [(msg_id, b"still delivered")]
    with b.client() as c:
        assert delay_stats(c)[1]["dropped"] == 1
    assert "of %s is skipped: schedule entry of 12 bytes" % SCHEDULE_TOPIC in b.log_text(since_start=True)


def test_a_pipelined_burst_never_stores_into_the_internal_topic(broker_factory, tmp_path):
    """The put-burst fast path leaves a plain put to the schedule topic to the general path, which refuses it,
    even once the schedule topic's partition exists (a delayed message is pending)."""
    b = start(broker_factory, tmp_path)
    with b.client() as c:
        put_delayed_ok(c, "t-a", b"pending", 3, partition=0)  # creates SCHEDULE_TOPIC partition 2
        frames = []
        for i, topic in enumerate(("t-a", SCHEDULE_TOPIC, "t-a")):
            body = b"burst-%d" % i
            frames.append(ev.Put(topic, 2 if topic == SCHEDULE_TOPIC else 0, 0, body, 100 + i,
                                 metaq_checksum(body)))
        c.send(b"".join(serialize(e) for e in frames))
        replies = [c.read_event() for _ in frames]
        assert [(r.code, r.opaque) for r in replies] == [(200, 100), (400, 101), (200, 102)], replies
        assert b"internal topic" in replies[1].body
        assert len(consume_all(c, SCHEDULE_TOPIC, 2)) == 1  # only the pending entry
        assert [r.payload for r in consume_all(c, "t-a", 0)] == [b"burst-0", b"burst-2"]
        assert int(c.stats_dict()["burst_puts"]) >= 1  # the fast path was on the way


def test_the_schedulers_own_waits_are_not_counted_as_long_polls(broker_factory, tmp_path):
    import threading

    b = start(broker_factory, tmp_path)
    with b.client() as c:
        s = c.stats_dict()
        assert s["delay_scheduler"] == "running" and s["long_poll_waiters"] == "0", s
        with b.client() as poller:
            t = threading.Thread(target=poller.get, args=("t-a", 0, 0), kwargs={"max_wait_ms": 3000})
            t.start()
            wait_for(lambda: c.stats_dict()["long_poll_waiters"] == "1", 5, "one client long poll counted")
            c.put_ok("t-a", b"wake", 0)
            t.join(5)
    assert not t.is_alive()
