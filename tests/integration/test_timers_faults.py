"""Timers across kill -9, restarts, retention, cancel racing delivery and a promoted slave (README "Any delivery
time", "Cancel")."""

import glob
import os
import random
import time

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.delay import records
from tests.harness.replication import caught_up, master_config, stats
from tests.harness.timers import cancel, put_at_ok, timers

pytestmark = pytest.mark.fault
YEAR_MS = 365 * 86_400_000


def now_ms():
    return int(time.time() * 1000)


def start(broker_factory, tmp_path, name="b", **sections):
    return broker_factory(small_config(tmp_path / name / "data", **sections), workdir=tmp_path / name)


def delivered(b, topic, partitions=(0, 1)):
    with b.client() as c:
        return records(c, topic, partitions)


def wait_count(b, topic, count, partitions=(0, 1), timeout=40):
    return wait_for(lambda: (lambda got: got if len(got) >= count else None)(delivered(b, topic, partitions)),
                    timeout, "%d messages delivered to %s" % (count, topic), interval=0.2)


def assert_exactly_once_not_early(b, topic, sent, partitions=(0, 1)):
    """Each sent id delivered once, with its payload, stored no earlier than its due time."""
    with b.client() as c:
        for p in partitions:
            for offset, rec in enumerate(records(c, topic, (p,))):
                payload, due = sent[rec.msg_id]
                assert rec.payload == payload
                r = c.offset_at(topic, p, due)
                assert r.code == 200 and int(r.body) <= offset, ("delivered before due", rec.msg_id, due, r)
    got = delivered(b, topic, partitions)
    assert sorted(r.msg_id for r in got) == sorted(sent), "not exactly once"


@pytest.mark.slow
def test_random_due_times_over_10_s_across_a_kill_9_exactly_once(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    rnd = random.Random(7)
    sent = {}
    with b.client() as c:
        for n in range(120):
            payload = b"m-%d" % n
            t = now_ms()
            delay = rnd.randrange(0, 10_000)
            msg_id, _ = put_at_ok(c, "t-rand", payload, "+%d" % delay, partition=n % 2)
            sent[msg_id] = (payload, t + delay)
    wait_count(b, "t-rand", 40)  # some delivered, most pending
    b.kill()
    b.start()
    wait_count(b, "t-rand", len(sent))
    assert_exactly_once_not_early(b, "t-rand", sent)
    # the index rebuilt from the log (timers.db lost): the DONE records say what was delivered
    b.kill()
    files = glob.glob(os.path.join(b.data_dir, "timers.db*"))
    assert os.path.join(b.data_dir, "timers.db") in files
    for f in files:
        os.unlink(f)
    b.start()
    with b.client() as c:
        wait_for(lambda: c.stats_dict()["timers_pending"] == "0", 10, "index rebuilt")
        assert timers(c) == []
    time.sleep(0.5)
    assert_exactly_once_not_early(b, "t-rand", sent)


def test_a_message_due_in_a_year_survives_restarts_and_retention(broker_factory, tmp_path, capsys):
    b = start(broker_factory, tmp_path, store={"segment_size": 65536, "retention_hours": 0.0001,
                                               "retention_check_interval_s": 0.2},
              limits={"max_body_bytes": 32 * 1024})
    with b.client() as c:
        due = now_ms() + YEAR_MS
        far, _ = put_at_ok(c, "t-year", b"next year", "@%d" % due)
        for _ in range(12):  # fill segments so retention deletes the one holding the entry
            c.put_ok("t-fill", b"x" * 20_000)
    first = sorted(os.listdir(os.path.join(b.data_dir, "commitlog")))[0]
    wait_for(lambda: first not in os.listdir(os.path.join(b.data_dir, "commitlog")), 20,
             "retention deleted the first segment")
    b.kill()
    b.start()
    assert b.stop() == 0
    b.start()
    with b.client() as c:
        rows = timers(c, "t-year")
        assert [(r[0], r[1], r[3]) for r in rows] == [(far, "t-year", due)]
        assert c.stats_dict()["timers_pending"] == "1"
    code = admin.main(["--brokers", "meta://127.0.0.1:%d" % b.port, "timers", "list"])
    out = capsys.readouterr().out
    assert code == 0 and str(far) in out and "t-year" in out, out
    code = admin.main(["--brokers", "meta://127.0.0.1:%d" % b.port, "timers", "cancel", str(far)])
    out = capsys.readouterr().out
    assert code == 0 and "cancelled" in out, out
    with b.client() as c:
        assert timers(c) == []


@pytest.mark.slow
def test_cancel_races_delivery_exactly_one_wins_and_the_caller_is_told(broker_factory, tmp_path):
    b = start(broker_factory, tmp_path)
    ids = []
    with b.client() as c:
        due = now_ms() + 2000
        for n in range(200):
            msg_id, _ = put_at_ok(c, "t-race", b"r-%d" % n, "@%d" % (due + n % 20), partition=n % 2)
            ids.append(msg_id)
        wait_for(lambda: now_ms() >= due - 5, 5, "due time")
        answers = {i: cancel(c, i) for i in ids}
    assert set(answers.values()) <= {(200, "cancelled"), (404, "delivered")}, set(answers.values())
    told_delivered = {i for i, a in answers.items() if a == (404, "delivered")}
    time.sleep(0.5)  # room for a cancelled one delivered all the same to show up
    # "delivered" is answered once the delivery is written; it is read once a flush round made it visible
    if told_delivered:
        wait_count(b, "t-race", len(told_delivered))
    got = {r.msg_id for r in delivered(b, "t-race")}
    assert got == told_delivered
    assert len(delivered(b, "t-race")) == len(got)  # none twice
    with b.client() as c:
        for i in ids:  # asked again, the same answer
            assert cancel(c, i)[1] == answers[i][1]


def index_meta(broker, key):
    """A value of the broker's timers.db ``meta`` table, read with SQLite alongside it (WAL: readers welcome)."""
    import sqlite3
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(broker.data_dir, "timers.db"), uri=True)
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return 0 if row is None else row[0]  # never set: 0
    finally:
        db.close()


@pytest.mark.slow
def test_a_slave_promoted_with_timers_pending_delivers_each_once(broker_factory, tmp_path, capsys):
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    sent = {}
    with m.client() as c:
        for n in range(40):
            t = now_ms()
            delay = 300 if n < 10 else 6000 + n * 50
            msg_id, _ = put_at_ok(c, "t-prom", b"p-%d" % n, "+%d" % delay, partition=n % 2)
            sent[msg_id] = (b"p-%d" % n, t + delay)
    wait_count(m, "t-prom", 10)
    caught_up(m, s)
    with s.client() as c:
        wait_for(lambda: c.stats_dict()["timers_pending"] == "30", 10, "the slave indexed the pending timers")
        assert cancel(c, next(iter(sent)))[0] == 503  # a slave refuses cancel like a put
    # the slave indexed the master's DONE records: its recovery check at promotion scans the log from the last
    # of them, not from 0 (store/lookup.py IdScan, a step at a time)
    scan_from = index_meta(s, "scan_from")
    assert 0 < scan_from <= int(stats(s)["log_end_position"]), scan_from
    m.kill()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "slave sees the master gone")
    code = admin.main(["promote", "127.0.0.1:%d" % s.port])
    assert code == admin.EXIT_OK, capsys.readouterr()
    wait_count(s, "t-prom", 40)
    time.sleep(0.5)
    assert_exactly_once_not_early(s, "t-prom", sent)


@pytest.mark.slow
def test_more_messages_due_at_one_time_than_the_window_holds_each_delivered_once(broker_factory, tmp_path):
    from bench.run import pipelined
    from metaq.timers.limits import MAX_TIMER_WINDOW_ROWS
    from metaq.protocol.checksum import metaq_checksum
    from metaq.protocol.text import serialize
    from metaq.timers.wire import TimerPut
    b = start(broker_factory, tmp_path)
    n = MAX_TIMER_WINDOW_ROWS + 1  # the limit and one past
    due = now_ms() + 3000
    frames = [serialize(TimerPut("t-many", 0, 0, b"%d" % i, i, metaq_checksum(b"%d" % i), "@%d" % due))
              for i in range(n)]
    pipelined(b.port, frames, depth=64)
    got = wait_count(b, "t-many", n, partitions=(0,), timeout=120)
    assert sorted(int(r.payload) for r in got) == list(range(n))
    time.sleep(0.5)
    assert len(delivered(b, "t-many", (0,))) == n
    with b.client() as c:
        assert c.offset_at("t-many", 0, due).body == b"0"  # none before the due time
        wait_for(lambda: c.stats_dict()["timers_pending"] == "0", 10, "index emptied")


def test_a_cancel_right_after_a_restart_waits_for_the_recovery_check(broker_factory, tmp_path):
    """A delivery a crash left without its DONE record (written offline here, so certain), and a cancel of it sent
    as soon as the restarted broker answers, while its index still catches up with 20,000 entries: the cancel
    says "delivered" (the recovery check finds the delivery first), never "cancelled" for a message consumers
    already have."""
    from metaq.protocol.message import encode_payload
    from metaq.timers.records import TIMER_TOPIC, encode_entry
    from metaq.server.config import load_config
    from metaq.storestate import open_store

    b = start(broker_factory, tmp_path)
    due = now_ms() + 1500
    with b.client() as c:
        msg_id, _ = put_at_ok(c, "t-early", b"once", "@%d" % due, partition=0)
        wait_for(lambda: len(timers(c)) == 1 or None, 10, "indexed")
    assert b.stop() == 0
    store = open_store(load_config(b.config_path).store_config(), now_ms())
    try:
        flag, data = encode_payload(b"once", None)
        store.put("t-early", 0, flag, data, now_ms(), msg_id=msg_id)  # delivered; its DONE never written
        far = now_ms() + YEAR_MS
        for i in range(20_000):  # entries the restarted index must catch up with first
            store.put(TIMER_TOPIC, 0, 0, encode_entry("t-far", 0, 0, 1, far + i, now_ms(), b"x"), now_ms())
    finally:
        store.close(now_ms())
    while now_ms() <= due:  # due (and delivered) before the restart
        time.sleep(0.05)
    b.start()
    with b.client() as c:
        code, word = cancel(c, msg_id)
        got = [r.msg_id for r in records(c, "t-early", (0,))]
        assert (code, word) == (404, "delivered") and got == [msg_id], (code, word, got)
        wait_for(lambda: int(c.stats_dict()["timers_redeliveries_skipped"]) == 1, 10, "the recovery check")


@pytest.mark.slow
def test_a_rejoining_master_whose_timer_tail_is_cut_indexes_what_the_new_master_wrote_there(broker_factory, tmp_path,
                                                                                             capsys):
    """m indexed %TIMER% records its slave s never copied (the link cut); s promoted writes its own timers at those
    offsets; m back as s's slave has its tail cut by the handshake: its index must index s's records from the cut
    (before the fix it went on from its old offset: s's first timers were never indexed there)."""
    from tests.harness.faults import LinkProxy
    rport, srport = free_port(), free_port()
    proxy = LinkProxy(("127.0.0.1", rport)).start()
    try:
        m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
        s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                           extra_args=["--slave-of", proxy.address, "--slave-id", "1", "--replication-port",
                                       str(srport)])
        far = "+%d" % 3_600_000
        with m.client() as c:
            common = [put_at_ok(c, "t-cut", b"c-%d" % n, far)[0] for n in range(5)]
        caught_up(m, s)
        with s.client() as c:
            wait_for(lambda: c.stats_dict()["timers_pending"] == "5", 10, "the slave indexed the 5")
        proxy.cut()
        wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave's link is cut")
        with m.client() as c:
            lost = [put_at_ok(c, "t-cut", b"l-%d" % n, far)[0] for n in range(3)]
            wait_for(lambda: c.stats_dict()["timers_pending"] == "8", 10, "m indexed its 3 uncopied timers")
        m.kill()
        assert admin.main(["promote", "127.0.0.1:%d" % s.port, "--force"]) == admin.EXIT_OK, capsys.readouterr()
        with s.client() as c:
            new = [put_at_ok(c, "t-cut", b"n-%d" % n, far)[0] for n in range(4)]  # %TIMER% offsets 5..8
        m.extra_args = ["--slave-of", "127.0.0.1:%d" % srport, "--slave-id", "2"]
        m.start()
        caught_up(s, m)
        with m.client() as c:
            wait_for(lambda: set(new) <= {r[0] for r in timers(c)}, 20,
                     lambda: "the new master's timers indexed on m: %r" % sorted(set(new) - {r[0] for r in timers(c)}))
            listed = {r[0] for r in timers(c)}
        # what both logs hold and what s wrote are there; m's lost tail stays pending there (acknowledged put_ats
        # the async failover lost: delivered, not lost, should m be promoted again)
        assert set(common) | set(new) | set(lost) == listed
    finally:
        proxy.close()


@pytest.mark.slow
def test_more_messages_due_within_seconds_than_the_window_holds_arrive_once_in_due_order(broker_factory, tmp_path):
    """2.5 windows' worth of messages due over 3 s: the window (MAX_TIMER_WINDOW_ROWS) is cut by its row limit, and
    is extended ahead while delivery goes on. Each message is delivered once, none before its due time, and each
    partition receives them in due-time order (an extension appended out of order would break it)."""
    import struct

    from bench.run import pipelined
    from metaq.timers.limits import MAX_TIMER_WINDOW_ROWS
    from metaq.protocol.checksum import metaq_checksum
    from metaq.protocol.text import serialize
    from metaq.timers.wire import TimerPut
    b = start(broker_factory, tmp_path)
    n = MAX_TIMER_WINDOW_ROWS * 5 // 2
    first = now_ms() + 8000
    rnd = random.Random(3)
    dues = [first + rnd.randrange(3000) for _ in range(n)]
    frames = [serialize(TimerPut("t-wide", i % 2, 0, struct.pack(">qi", due, i), i,
                                 metaq_checksum(struct.pack(">qi", due, i)), "@%d" % due))
              for i, due in enumerate(dues)]
    pipelined(b.port, frames, depth=64)
    got = wait_count(b, "t-wide", n, timeout=180)
    assert sorted(struct.unpack(">qi", r.payload)[1] for r in got) == list(range(n))  # each once
    with b.client() as c:
        for p in (0, 1):
            in_partition = [struct.unpack(">qi", r.payload)[0] for r in delivered(b, "t-wide", (p,))]
            assert in_partition == sorted(in_partition), "partition %d: not in due order" % p
            for offset in range(0, len(in_partition), 97):  # none stored before its due time (sampled)
                r = c.offset_at("t-wide", p, in_partition[offset])
                assert r.code == 200 and int(r.body) <= offset, ("delivered before due", p, offset, r)
        s = c.stats_dict()
        assert int(s["timers_window_extensions"]) >= 1, s
        wait_for(lambda: c.stats_dict()["timers_pending"] == "0", 10, "index emptied")


@pytest.mark.slow
def test_more_deliveries_left_without_their_done_than_the_window_holds_are_not_delivered_again(broker_factory,
                                                                                             tmp_path):
    """A crash that left more deliveries without their DONE record than MAX_TIMER_WINDOW_ROWS (written offline
    here, so certain): the restarted broker's recovery check finds every one of them, not only the first window's,
    and delivers none a second time."""
    from metaq.timers.limits import MAX_TIMER_WINDOW_ROWS
    from metaq.protocol.checksum import metaq_checksum
    from metaq.protocol.message import encode_payload
    from metaq.timers.records import TIMER_TOPIC, encode_entry
    from metaq.server.config import load_config
    from metaq.storestate import open_store

    b = start(broker_factory, tmp_path)
    assert b.stop() == 0
    n = MAX_TIMER_WINDOW_ROWS + 50  # the limit and past it
    store = open_store(load_config(b.config_path).store_config(), now_ms())
    try:
        due = now_ms() - 60_000
        for i in range(n):
            flag, data = encode_payload(b"m%d" % i, None)
            r = store.put(TIMER_TOPIC, 0, 0, encode_entry("t-left", 0, flag, metaq_checksum(data), due + i, due,
                                                          data), now_ms())
            store.put("t-left", 0, flag, data, now_ms(), msg_id=r.msg_id)  # delivered; its DONE never written
    finally:
        store.close(now_ms())
    b.start()
    with b.client() as c:
        wait_for(lambda: int(c.stats_dict()["timers_redeliveries_skipped"]) == n, 60,
                 lambda: "the recovery check: %s" % c.stats_dict()["timers_redeliveries_skipped"])
        wait_for(lambda: c.stats_dict()["timers_pending"] == "0", 30, "index emptied")
        assert int(c.stats_dict()["timers_delivered"]) == 0
        got = records(c, "t-left", (0,))
    assert [r.payload for r in got] == [b"m%d" % i for i in range(n)]  # once each: none delivered again


@pytest.mark.slow
def test_more_message_data_due_at_once_than_the_window_holds_is_delivered_once_each(broker_factory, tmp_path):
    """20 messages of 4 MiB due at the same moment: 80 MiB, past MAX_TIMER_WINDOW_BYTES (64 MiB). The window takes
    what fits, the rest waits in timers.db, and each is delivered once, none early (the broker does not hold them
    all in memory for it)."""
    from metaq.limits import MAX_BODY_BYTES
    from metaq.timers.limits import MAX_TIMER_WINDOW_BYTES

    b = start(broker_factory, tmp_path, limits={"max_body_bytes": MAX_BODY_BYTES}, store={"segment_size": 64 << 20})
    n = MAX_TIMER_WINDOW_BYTES // MAX_BODY_BYTES + 4
    sent = {}
    due = now_ms() + 4000
    with b.client(timeout=60) as c:
        for i in range(n):
            payload = bytes([65 + i]) * (MAX_BODY_BYTES - 64)
            msg_id, _ = put_at_ok(c, "t-big", payload, "@%d" % due, partition=i % 2)
            sent[msg_id] = (payload, due)
    wait_count(b, "t-big", n, timeout=120)
    assert_exactly_once_not_early(b, "t-big", sent)
    with b.client() as c:
        s = c.stats_dict()
        assert int(s["timers_window_loads"]) + int(s["timers_window_extensions"]) >= 2, s  # it took more than one


def test_a_timers_db_from_before_positions_resumes_from_its_offsets_record_exactly_once(broker_factory, tmp_path):
    """A timers.db written before the index kept a log position (only ``indexed_offset``, here 4 of 8 entries
    indexed) is opened by the broker: it resumes from that offset's record, found through the partition index, so
    the other four are indexed again from the log; each due message is delivered once and the far ones stay
    pending; the next batch records the position."""
    import sqlite3

    b = start(broker_factory, tmp_path)
    soon, far = {}, {}
    with b.client() as c:
        due = now_ms() + 6000
        for i in range(8):
            payload = b"m%d" % i
            if i % 2:
                far[put_at_ok(c, "t-old", payload, "+3600000", partition=0)[0]] = payload
            else:
                soon[put_at_ok(c, "t-old", payload, "@%d" % due, partition=0)[0]] = (payload, due)
        wait_for(lambda: c.stats_dict()["timers_pending"] == "8", 20, "all eight indexed")
    assert b.stop() == 0
    ids = sorted(list(soon) + list(far))  # ids grow with the %TIMER% offsets: offset i holds ids[i]
    db = sqlite3.connect(os.path.join(b.data_dir, "timers.db"))
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'indexed_position'").fetchone() is not None
        db.execute("DELETE FROM meta WHERE key = 'indexed_position'")
        db.execute("UPDATE meta SET value = 4 WHERE key = 'indexed_offset'")
        db.executemany("DELETE FROM pending WHERE msg_id = ?", [(i,) for i in ids[4:]])
        db.commit()
    finally:
        db.close()
    b.start()
    wait_count(b, "t-old", len(soon), partitions=(0,))
    assert_exactly_once_not_early(b, "t-old", soon, partitions=(0,))
    with b.client() as c:
        wait_for(lambda: c.stats_dict()["timers_pending"] == str(len(far)), 20, "the far ones pending")
        assert sorted(r[0] for r in timers(c, "t-old")) == sorted(far)
    assert b.stop() == 0
    db = sqlite3.connect(os.path.join(b.data_dir, "timers.db"))
    try:
        assert db.execute("SELECT value FROM meta WHERE key = 'indexed_position'").fetchone()[0] > 0
        assert db.execute("SELECT value FROM meta WHERE key = 'indexed_offset'").fetchone()[0] >= 8 + 1  # DONEs
    finally:
        db.close()
