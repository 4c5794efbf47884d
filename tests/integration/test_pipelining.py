"""10,000 pipelined puts and gets over 3 topics x 4 partitions, back in order with valid checksums."""

import hashlib
import threading

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload, iter_records
from metaq.protocol.text import serialize
from tests.harness.broker import wait_for

TOPICS = ("t-orders", "t-payments", "t-audit")


def body_for(i):
    return b"%06d:" % i + hashlib.sha256(b"%d" % i).hexdigest().encode() * (1 + i % 5)


def test_ten_thousand_pipelined_puts_and_gets(broker):
    n = 10_000
    sent = {}  # opaque -> (topic, partition, payload)
    frames = []
    for i in range(n):
        topic, partition = TOPICS[i % 3], (i // 3) % 4
        payload = body_for(i)
        flag, data = encode_payload(payload, "a%d" % (i % 7) if i % 2 else None)
        opaque = -2147483648 + i  # MetaQ clients start at MIN_VALUE
        sent[opaque] = (topic, partition, payload)
        frames.append(serialize(ev.Put(topic, partition, flag, data, opaque, metaq_checksum(data))))
    with broker.client(timeout=60) as c:
        writer = threading.Thread(target=c.send, args=(b"".join(frames),))
        writer.start()
        acked = {}
        for _ in range(n):
            r = c.read_event()
            assert r.code == 200, r
            msg_id, partition, offset = (int(x) for x in r.body.split())
            topic, want_partition, payload = sent[r.opaque]
            assert partition == want_partition
            acked[(topic, partition, offset)] = (msg_id, payload)
        writer.join()
        # offsets per partition are 0..k-1 in put order
        for topic in TOPICS:
            for p in range(4):
                offsets = sorted(o for (t, q, o) in acked if (t, q) == (topic, p))
                assert offsets == list(range(len(offsets)))
        # pipelined gets: one get per partition in each burst, 64 KiB each, until all are read
        keys = [(t, p) for t in TOPICS for p in range(4)]
        counts = {k: sum(1 for (t, q, _o) in acked if (t, q) == k) for k in keys}
        got = {k: [] for k in keys}
        while any(len(got[k]) < counts[k] for k in keys):
            todo = [k for k in keys if len(got[k]) < counts[k]]
            c.send(b"".join(serialize(ev.Get(t, "g", p, len(got[(t, p)]), 65536, i))
                            for i, (t, p) in enumerate(todo)))
            for i, k in enumerate(todo):
                r = c.read_event()
                assert isinstance(r, ev.Value) and r.opaque == i, r
                got[k].extend(rec for rec, _ in iter_records(r.body, verify=True))
        for (topic, p), recs in got.items():
            assert len(recs) == counts[(topic, p)]
            for off, rec in enumerate(recs):
                msg_id, payload = acked[(topic, p, off)]
                assert rec.msg_id == msg_id and rec.payload == payload
                assert rec.checksum == metaq_checksum(rec.data)


def test_pipelined_burst_of_mixed_commands_answers_every_opaque(broker):
    burst = []
    for i in range(300):
        if i % 3 == 0:
            burst.append(serialize(ev.Put("test", i % 4, 0, b"x" * i, i, -1)))
        elif i % 3 == 1:
            burst.append(serialize(ev.Version(i)))
        else:
            burst.append(b"bogus %d\r\n" % i)
    with broker.client() as c:
        c.send(b"".join(burst))
        replies = [c.read_event() for _ in range(300)]
    assert [r.opaque for r in replies] == list(range(300))  # in order, nothing dropped
    assert [r.code for r in replies[::3]] == [200] * 100
    assert all(r.code == 400 for r in replies[2::3])


def test_sync_mode_concurrent_puts_share_fsyncs(broker):
    """Group commit: 4 connections x 500 pipelined puts need far fewer fsyncs than puts."""
    clients = [broker.client() for _ in range(4)]
    try:
        before = clients[0].stats_dict()
        rounds_before = int(before["flush_rounds"])
        assert [before["flush_time_%s_ms" % k] for k in ("p50", "p99", "max")] == ["0.000"] * 3  # no round yet
        for i, c in enumerate(clients):
            c.send(b"".join(serialize(ev.Put("test", i, 0, b"gc-%d" % k, k, -1)) for k in range(500)))
        for c in clients:
            assert all(c.read_event().code == 200 for _ in range(500))
        stats = clients[0].stats_dict()
        rounds = int(stats["flush_rounds"]) - rounds_before
        assert 0 < rounds < 2000 / 4
        # every acknowledged put is durable: the flushed position covers the whole log
        assert int(stats["log_flushed_position"]) == int(stats["log_end_position"])
        # the fsync times of those rounds: real, ordered, and below the wall time of the whole load
        p50, p99, worst = (float(stats["flush_time_%s_ms" % k]) for k in ("p50", "p99", "max"))
        assert 0 < p50 <= p99 <= worst < 30_000
    finally:
        for c in clients:
            c.close()


def test_async_mode_flushes_every_n_messages_or_t_ms(broker_factory, tmp_path):
    from metaq.client.local import small_config

    by_count = broker_factory(small_config(tmp_path / "a", store={"flush": "async", "flush_every_messages": 50,
                                                                  "flush_interval_ms": 600_000}))
    with by_count.client() as c:
        for i in range(49):
            c.put_ok("test", b"m%d" % i, 0)
        first = c.stats_dict()
        assert int(first["log_flushed_position"]) < int(first["log_end_position"])  # acked before any flush
        for i in range(60):
            c.put_ok("test", b"n%d" % i, 0)
        wait_for(lambda: int(c.stats_dict()["flush_rounds"]) >= 1)
    by_time = broker_factory(small_config(tmp_path / "b", store={"flush": "async", "flush_every_messages": 100_000,
                                                                 "flush_interval_ms": 200}))
    with by_time.client() as c:
        for i in range(5):
            c.put_ok("test", b"t%d" % i, 1)
        wait_for(lambda: c.stats_dict()["log_flushed_position"] == c.stats_dict()["log_end_position"],
                 what="a flush by time")  # (never, by count: 100,000 messages)
