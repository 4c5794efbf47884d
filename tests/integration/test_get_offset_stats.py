"""get / offset / stats semantics against a real broker: whole records, 301/404, long polling."""

import threading
import time

from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.message import iter_records


def test_get_returns_whole_records_within_max_size(broker):
    with broker.client() as c:
        for i in range(10):
            c.put_ok("test", b"%02d" % i + b"x" * 98, 0)
        r = c.get("test", 0, 0, max_size=3 * 122 + 50)  # room for 3 records (20 + 100 bytes each)... and a bit
        recs = [rec for rec, _ in iter_records(r.body)]
        assert len(r.body) == sum(20 + len(x.data) for x in recs)  # no partial record
        assert [x.payload[:2] for x in recs] == [b"00", b"01", b"02"]


def test_get_returns_one_message_larger_than_max_size(broker):
    big = b"B" * 200_000
    with broker.client() as c:
        c.put_ok("test", big, 1)
        c.put_ok("test", b"small", 1)
        r = c.get("test", 1, 0, max_size=1024)
        [rec] = [rec for rec, _ in iter_records(r.body)]
        assert rec.payload == big  # never a wedge: at least one whole message
        [rec] = c.get_records("test", 1, 1, 1024)
        assert rec.payload == b"small"


def test_404_at_end_301_outside(broker):
    with broker.client() as c:
        for i in range(3):
            c.put_ok("test", b"m%d" % i, 2)
        r = c.get("test", 2, 3)
        assert (r.code, r.body) == (404, b"Could not find message at position 3")
        r = c.get("test", 2, 10)
        assert (r.code, r.body) == (301, b"3")
        r = c.get("test", 2, -5)
        assert (r.code, r.body) == (301, b"0")
        # an empty partition of a configured topic is simply empty
        r = c.get("test", 3, 0)
        assert r.code == 404
        r = c.get("nosuchtopic", 0, 0)  # '*' pattern: legal, empty
        assert r.code == 404


def test_offset_clamps_to_min_and_max(broker):
    with broker.client() as c:
        for _ in range(5):
            c.put_ok("test", b"m", 0)
        answers = [c.call(ev.Offset("test", "g", 0, o, 1)).body for o in (-100, 0, 3, 5, 99)]
        assert answers == [b"0", b"0", b"3", b"5", b"5"]
        r = c.call(ev.Offset("test", "g", 9, 0, 2))  # as in MetaQ: no such partition is a 404
        assert r.code == 404 and b"partition `9`" in r.body


def test_long_poll_is_woken_by_the_append(broker):
    with broker.client() as c, broker.client() as p:
        c.put_ok("test", b"first", 0)
        started = time.monotonic()
        c.send(b"get test g 0 1 65536 10000 42\r\n")

        def produce():
            time.sleep(0.3)
            p.put_ok("test", b"second", 0)

        t = threading.Thread(target=produce)
        t.start()
        r = c.read_event()
        waited = time.monotonic() - started
        t.join()
        assert isinstance(r, ev.Value) and r.opaque == 42
        [rec] = [rec for rec, _ in iter_records(r.body)]
        assert rec.payload == b"second"
        assert 0.25 < waited < 5.0  # woken by the put, long before the 10 s wait


def test_long_poll_times_out_with_404_and_other_requests_are_served_meanwhile(broker):
    with broker.client() as c:
        started = time.monotonic()
        c.send(b"get test g 1 0 65536 400 1\r\nversion 2\r\n")
        first = c.read_event()
        assert first.opaque == 2 and first.code == 200  # served while the get waits
        second = c.read_event()
        assert (second.opaque, second.code) == (1, 404)
        assert time.monotonic() - started >= 0.35


def test_stats_items(broker):
    with broker.client() as c:
        for i in range(4):
            c.put_ok("test", b"abc", i)
        c.get("test", 0, 0)
        summary = c.stats_dict()
        assert list(summary)[:8] == ["pid", "broker_id", "port", "uptime", "version", "slave",
                                     "curr_connections", "threads"]
        assert summary["broker_id"] == "7" and summary["cmd_put"] == "4" and summary["total_messages"] == "4"
        topics = c.stats_dict("topics")
        assert topics["test"].startswith("partitions 4 message_count 4 message_bytes ")
        offsets = c.stats("offsets")
        assert "test part 3 min_offset 0 max_offset 1\r\n" in offsets
        realtime = c.stats_dict("realtime")
        assert realtime["realtime_put"].startswith("Count=4,Value=4,")
        one = c.stats("test").split("\r\n")
        assert one[1:5] == ["test", "resultCode 0", "partitions 4", "message_count 4"]
        assert c.stats("unknown-topic").split("\r\n")[2] == "resultCode 1"
        assert "reset ok" in c.stats("reset")
        assert c.stats_dict("realtime")["realtime_put"] == "null"
        assert "offsets" in c.stats("help")
        config = c.call(ev.Stats("config", 5))
        assert b"segment_size" in config.body
        # MetaQ's Java encoder writes a blank item as two spaces
        c.send(b"stats  -1000\r\n")
        r = c.read_event()
        assert r.opaque == -1000 and r.body.startswith(b"STATS\r\npid ")


def test_long_poll_answers_before_the_waking_puts_ack(broker_factory, tmp_path):
    """With ``flush: async`` a put's ack waits for nothing: the long poll it wakes answers first (its consumer's
    latency holds no ack send), here on the one connection that sent both."""
    b = broker_factory(small_config(tmp_path / "b", store={"flush": "async"}))
    with b.client() as c:
        c.put_ok("test", b"first", 3)
        c.send(b"get test g 3 1 65536 10000 7\r\n")
        time.sleep(0.3)  # parked
        c.send(b"put test 3 6 0 8\r\nsecond")
        first, second = c.read_event(), c.read_event()
        assert isinstance(first, ev.Value) and first.opaque == 7  # the woken get's reply goes out first
        assert [rec.payload for rec, _ in iter_records(first.body)] == [b"second"]
        assert (second.opaque, second.code) == (8, 200)


def test_long_poll_sees_a_put_of_the_same_burst(broker_factory, tmp_path):
    """A put made visible after the get missed but before its wait began (here: the next frame of the same burst,
    ``flush: async``: visible at once) is answered at once, not at the end of the wait."""
    b = broker_factory(small_config(tmp_path / "b", store={"flush": "async"}))
    with b.client() as c:
        c.put_ok("test", b"first", 2)
        started = time.monotonic()
        c.send(b"get test g 2 1 65536 30000 7\r\nput test 2 6 0 8\r\nsecond")
        replies = {r.opaque: r for r in (c.read_event(), c.read_event())}
        assert time.monotonic() - started < 15  # not the 30 s wait
        assert isinstance(replies[7], ev.Value)
        assert [rec.payload for rec, _ in iter_records(replies[7].body)] == [b"second"]
        assert replies[8].code == 200


def test_realtime_counts_after_a_reset_start_again(broker):
    """A topic's puts are counted through counters kept per topic (``BrokerStats.on_puts``): after ``stats reset``
    the next puts count in the new realtime figures, the broker's and the topic's, never in the ones reset."""
    with broker.client() as c:
        for i in range(2):
            c.put_ok("test", b"abcd", i)
        assert c.stats_dict("realtime")["realtime_put"].startswith("Count=2,Value=2,")
        assert "reset ok" in c.stats("reset")
        for i in range(3):
            c.put_ok("test", b"abcd", i)
        assert c.stats_dict("realtime")["realtime_put"].startswith("Count=3,Value=3,")
        assert c.stats_dict("realtime")["realtime_message_size"].startswith("Count=3,Value=12,")
        one = dict(line.split(" ", 1) for line in c.stats("test").split("\r\n") if " " in line)
        assert one["topic_realtime_put"].startswith("Count=3,Value=3,")
        assert c.stats_dict()["cmd_put"] == "5"
