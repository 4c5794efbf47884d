"""The ``put_at`` burst path (timers/fasttext.py) answers and stores exactly what the general path does.

The same mixed pipeline — mostly plain ``put_at`` frames over two topics and four partitions, with every kind of
frame the fast path must leave to the general one (bad checksums, unknown topics and partitions, ``-1``
partitions, attributes, bad or too distant times, the internal topic, plain puts, other commands) — is sent, cut
at random points, to a broker with the burst path and to one without. Replies (message ids aside, which are
clock-based), the timers each broker holds and the messages each delivers must be the same.
"""

import random
import time

import pytest

from metaq import limits
from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.text import serialize
from metaq.timers.wire import TimerPut
from tests.harness.broker import consume_all, wait_for
from tests.harness.timers import timers
from tests.integration.test_burst_puts import send_in_pieces

TOPICS = [{"name": "t*", "partitions": 4}]
YEARS_11_MS = 11 * 366 * 86_400_000
PICKED_MS = 3_650_000  # the due (after the base) of the -1 frames: their partition is the broker's pick


def put_at(topic, partition, body, opaque, when, checksum=None, flag=0):
    crc = metaq_checksum(body) if checksum is None else checksum
    return serialize(TimerPut(topic, partition, flag, body, opaque, crc, when))


def mixed_timer_burst(rng, n, base_ms):
    """``(frames, soon)``: ``soon`` the bodies due within seconds (delivered during the test)."""
    frames, soon = [], []
    for i in range(n):
        body = b"%d:" % i + bytes([97 + i % 26]) * rng.choice([0, 10, 300, 1500])
        kind = rng.random()
        topic, part = rng.choice(["t-a", "t-b"]), rng.randrange(4)
        if kind < 0.60:
            frames.append(put_at(topic, part, body, i, "@%d" % (base_ms + 3_600_000 + rng.randrange(10_000))))
        elif kind < 0.66:
            frames.append(put_at(topic, part, body, i, "@%d" % (base_ms + 1500)))
            soon.append((topic, part, body))
        elif kind < 0.70:
            frames.append(put_at(topic, part, body, i, "+7200000"))  # relative: its due differs by broker
        elif kind < 0.72:
            frames.append(put_at(topic, part, body, i, "@%d" % (base_ms + 3_600_000), checksum=-1))  # unchecked
        elif kind < 0.74:
            frames.append(put_at(topic, part, body, i, "+10", checksum=(metaq_checksum(body) + 1) % 2**31))
        elif kind < 0.76:
            frames.append(put_at("unknown", 0, body, i, "+10"))
        elif kind < 0.78:
            frames.append(put_at("t-a", 9, body, i, "+10"))  # partition out of range
        elif kind < 0.80:
            frames.append(put_at("t-a", -1, body, i, "@%d" % (base_ms + PICKED_MS)))  # the broker picks
        elif kind < 0.82:
            flag, data = encode_payload(body, "tag%d" % (i % 3))
            frames.append(put_at("t-b", 3, data, i, "@%d" % (base_ms + 3_600_000), flag=flag))  # attribute
        elif kind < 0.84:
            frames.append(put_at("t-a", 0, body, i, rng.choice(["+-5", "@x", "+%d" % YEARS_11_MS, "5"])))
        elif kind < 0.86:
            frames.append(put_at("%TIMER%", 0, body, i, "+10"))
        elif kind < 0.94:
            frames.append(serialize(ev.Put(topic, part, 0, body, i, metaq_checksum(body))))
        elif kind < 0.97:
            frames.append(serialize(ev.Version(i)))
        else:
            frames.append(b"bogus %d\r\n" % i)
    return frames, soon


def normalized(e, minus_one):
    """A reply with the message id taken out (and the partition of a ``-1`` put, which is random)."""
    if e.code == 200 and e.body.endswith(b" -1"):
        _id, part, _off = e.body.split()
        return ("put_at", e.opaque, "any" if e.opaque in minus_one else int(part))
    if e.code == 200 and len(e.body.split()) == 3:
        return ("put", e.opaque, int(e.body.split()[1]))
    return (e.code, e.opaque, e.body)


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_a_mixed_put_at_pipeline_gets_the_general_paths_replies_timers_and_deliveries(broker_factory, tmp_path,
                                                                                    flush):
    rng = random.Random(11)
    base = int(time.time() * 1000)
    frames, soon = mixed_timer_burst(rng, 1200, base)
    minus_one = {i for i, f in enumerate(frames) if f.startswith(b"put_at t-a -1 ")}
    data = b"".join(frames)
    cuts = sorted(rng.sample(range(1, len(data)), 60))
    replies, brokers = {}, {}
    for fast in (True, False):
        b = broker_factory(small_config(tmp_path / ("fast" if fast else "general"), topics=TOPICS,
                                        broker={"burst_puts": fast}, store={"flush": flush}))
        brokers[fast] = b
        with b.client() as c:  # the timer topic's first record: its partition then exists for the fast path
            c.call(TimerPut("t-a", 0, 0, b"first", 0, metaq_checksum(b"first"), "@%d" % (base + 3_600_000)))
        replies[fast] = [normalized(e, minus_one) for e in send_in_pieces(b.port, data, cuts, len(frames))]
    assert replies[True] == replies[False]
    assert [r[1] for r in replies[True]] == list(range(len(frames)))  # every opaque once, in order
    codes = {r[0] for r in replies[True]}
    assert {"put_at", "put", 400}.issubset(codes), codes
    held, delivered = {}, {}
    for fast, b in brokers.items():
        with b.client() as c:
            burst = int(c.stats_dict()["burst_puts"])
            assert (burst > 400) if fast else (burst == 0), burst  # most put_at took the fast path there
            want = len(soon) + sum(1 for r in replies[fast] if r[0] == "put")
            wait_for(lambda c=c, want=want: len([1 for t in ("t-a", "t-b") for p in range(4)
                                                 for r in consume_all(c, t, p)]) >= want, 30, "the soon ones delivered")
            delivered[fast] = sorted((t, p, r.data) for t in ("t-a", "t-b") for p in range(4)
                                     for r in consume_all(c, t, p))
            held[fast] = [(topic, part, due - base, size) for _id, topic, part, due, size in timers(c, limit=1000)]
    # the timers held: the same, due times included where they were absolute; the relative ones (due 2 h after
    # each broker took them) by count, the -1 ones (partition picked by each broker) by count
    for fast in held:
        assert len(held[fast]) < 1000  # all of them listed
    exact = {fast: sorted(r for r in rows if r[2] < 7_000_000 and r[2] != PICKED_MS) for fast, rows in held.items()}
    assert exact[True] == exact[False]
    for kind in (lambda r: r[2] >= 7_000_000, lambda r: r[2] == PICKED_MS):
        assert len([r for r in held[True] if kind(r)]) == len([r for r in held[False] if kind(r)]) > 0
    # and the messages delivered (the soon ones, beside the plain puts of the pipeline)
    assert delivered[True] == delivered[False]
    assert set(soon) <= set(delivered[True])


@pytest.mark.parametrize("count", [limits.BURST_SCAN_FRAMES, limits.BURST_SCAN_FRAMES + 1,
                                   7 * limits.BURST_SCAN_FRAMES + 3])
def test_put_at_pipelines_at_and_past_the_first_scan_cap_take_the_fast_path(broker, count):
    """``limits.BURST_SCAN_FRAMES``, one more and many more put_at frames: all stored by the fast path, in order."""
    due = "@%d" % (int(time.time() * 1000) + 3_600_000)
    with broker.client() as c:
        assert c.call(TimerPut("t-a", 1, 0, b"m0", 0, metaq_checksum(b"m0"), due)).code == 200  # the general path's
        before = int(c.stats_dict()["burst_puts"])
        c.send(b"".join(put_at("t-a", 1, b"m%d" % k, k, due) for k in range(1, count + 1)))
        replies = [c.read_event() for _ in range(count)]
        assert [(r.code, r.opaque, r.body.split()[1:]) for r in replies] == [(200, k, [b"1", b"-1"])
                                                                            for k in range(1, count + 1)]
        ids = [int(r.body.split()[0]) for r in replies]
        assert ids == sorted(ids) and len(set(ids)) == count
        assert count - 2 <= int(c.stats_dict()["burst_puts"]) - before <= count
        wait_for(lambda: set(ids) <= {r[0] for r in timers(c, "t-a")}, 30, "every one indexed")


def _index_rows(path):
    """What a timers.db holds: pending rows, outcomes (without their time) and the indexed offset."""
    import sqlite3
    db = sqlite3.connect(str(path))
    try:
        return (db.execute("SELECT * FROM pending ORDER BY msg_id").fetchall(),
                db.execute("SELECT msg_id, outcome FROM outcomes ORDER BY msg_id").fetchall(),
                db.execute("SELECT value FROM meta WHERE key = 'indexed_offset'").fetchone())
    finally:
        db.close()


def test_the_index_built_from_the_puts_hand_off_equals_the_one_the_log_rebuilds(broker_factory, tmp_path):
    """The master's indexer applies what its own puts, cancels and deliveries wrote as they handed it over
    (``timers_indexed_direct``), not read back from the log. Deleting timers.db makes a restart rebuild it from
    the log alone: the two must be the same, row for row (pending data, outcomes, indexed offset)."""
    import os

    from tests.harness.timers import cancel
    rng = random.Random(5)
    base = int(time.time() * 1000)
    frames, soon = mixed_timer_burst(rng, 600, base)
    data_dir = tmp_path / "d"
    cfg = small_config(data_dir, topics=TOPICS)
    b = broker_factory(cfg, workdir=tmp_path / "w")
    with b.client() as c:
        c.call(TimerPut("t-a", 0, 0, b"first", 0, metaq_checksum(b"first"), "@%d" % (base + 3_600_000)))
        replies = send_in_pieces(b.port, b"".join(frames), sorted(rng.sample(range(1, 10_000), 20)), len(frames))
        soon_at = b" @%d " % (base + 1500)
        ids = [int(e.body.split()[0]) for e in replies
               if e.code == 200 and e.body.endswith(b" -1") and soon_at not in frames[e.opaque]]
        assert len(ids) > 300
        for msg_id in ids[::7]:  # cancels (of ones due in hours): CANCEL records, handed over too
            assert cancel(c, msg_id) == (200, "cancelled")
        plain = sum(1 for e in replies if normalized(e, set())[0] == "put")
        wait_for(lambda: sum(1 for t in ("t-a", "t-b") for p in range(4) for _r in consume_all(c, t, p))
                 >= len(soon) + plain, 30, "the soon ones delivered (DONE records)")
        wait_for(lambda: int(c.stats_dict()["timers_pending"]) == len(timers(c, limit=1000)), 30, "indexed")
        stats = c.stats_dict()
        assert int(stats["timers_indexed_direct"]) > 300, stats["timers_indexed_direct"]
        assert int(stats["timers_delivered"]) >= len(soon)
    b.stop()
    handed = _index_rows(data_dir / "timers.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(str(data_dir / "timers.db") + suffix):
            os.remove(str(data_dir / "timers.db") + suffix)
    b.start()
    with b.client() as c:
        wait_for(lambda: int(c.stats_dict()["timers_pending"]) == len(handed[0]), 30, "rebuilt from the log")
        assert int(c.stats_dict()["timers_indexed_direct"]) == 0
    b.stop()
    rebuilt = _index_rows(data_dir / "timers.db")
    assert rebuilt[2] == handed[2]
    assert rebuilt[1] == handed[1]
    assert rebuilt[0] == handed[0]
