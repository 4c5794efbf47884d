"""The put-burst fast path answers exactly as the general path: one broker with it, one without, same bytes in."""

import random
import re
import socket
import time

import pytest

from metaq import limits
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload, iter_records
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize
from metaq.client.local import small_config
from tests.harness.broker import consume_all

TOPICS = [{"name": "t*", "partitions": 4}]  # any other topic is unknown
PUT_REPLY = re.compile(rb"\d+ (\d+) (\d+)")


def put(topic, partition, body, opaque, checksum=None, tx_key=None, flag=0):
    crc = metaq_checksum(body) if checksum is None else checksum
    return serialize(ev.Put(topic, partition, flag, body, opaque, crc, tx_key))


def mixed_burst(rng, n, reads=True):
    """Mostly plain puts over 3 topics x 4 partitions, with every kind of frame the fast path must leave alone.

    ``reads``: gets and offsets too (in ``sync`` mode what they see depends on when the flushes ran).
    """
    frames = []
    for i in range(n):
        body = b"%d:" % i + bytes([97 + i % 26]) * rng.choice([0, 10, 300, 1500])
        kind = rng.random()
        if kind < 0.75:
            frames.append(put(rng.choice(["t-a", "t-b", "tc"]), rng.randrange(4), body, i))
        else:
            frames.append(_odd_frame(rng, kind, i, body, reads))
    return frames


def _odd_frame(rng, kind, i, body, reads):
    """One frame of ``mixed_burst`` that is no plain put (``kind`` in [0.75, 1)): a refused or special put, a
    read, another command or a blank line."""
    if kind < 0.78:
        return put("t-a", 1, body, i, checksum=(metaq_checksum(body) + 1) % 2**31)  # bad checksum
    elif kind < 0.80:
        return put("unknown", 0, body, i)  # no pattern matches it
    elif kind < 0.82:
        return put("t-a", 9, body, i)  # partition out of range
    elif kind < 0.84:
        return put("t-b", 0, body, i, tx_key="TX:no-such-session:1")  # transactional
    elif kind < 0.86:
        return b"put t-b 2 %d 0 %d\r\n%s" % (len(body), i, body)  # MetaQ's 6-token form
    elif kind < 0.88:
        flag, data = encode_payload(body, "tag%d" % (i % 3))
        return put("tc", 3, data, i, flag=flag)  # attribute block
    elif kind < 0.89 and i % 2:
        return put("tc", 3, b"\x00\x00\x00\x09ab", i, flag=1)  # malformed attribute block
    elif kind < 0.89:
        flag, data = encode_payload(body, "t\x02METAQ_PID\x017\x02")  # put_idem's reserved property
        return put("tc", 3, data, i, flag=flag)
    elif kind < 0.91:
        return put("t-a", 2, body, i, checksum=-1)  # unchecked
    elif kind < 0.94 and reads:
        return serialize(ev.Get("t-a", "g", rng.randrange(4), rng.randrange(3), 4096, i))
    elif kind < 0.96:
        return serialize(ev.Version(i))
    elif kind < 0.98:
        return b"bogus %d\r\n" % i
    elif reads:
        return b"\r\n" + serialize(ev.Offset("t-b", "g", 1, 1 << 40, i))
    else:
        return b"\r\n" + serialize(ev.Version(i))


def send_in_pieces(port, data, cuts, expect):
    """Send ``data`` cut at ``cuts`` (a pause after each piece, so the broker sees partial frames); read replies."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    parser = TextParser(max_body=8 << 20)
    start = 0
    for cut in cuts + [len(data)]:
        sock.sendall(data[start:cut])
        start = cut
        time.sleep(0.002)
    events = []
    while len(events) < expect:
        e = parser.next_event()
        if e is NEED_DATA:
            parser.receive_data(sock.recv(1 << 20))
        else:
            events.append(e)
    sock.close()
    return events


def normalized(e):
    """A reply with the message ids (clock-based) taken out."""
    if isinstance(e, ev.Value):
        return ("value", e.opaque, [(r.partition if hasattr(r, "partition") else None, r.flag, r.checksum, r.data)
                                    for r, _end in iter_records(e.body)])
    m = PUT_REPLY.fullmatch(e.body) if e.code == 200 else None
    if m:
        return ("put", e.opaque, int(m.group(1)), int(m.group(2)))
    return (e.code, e.opaque, e.body)


@pytest.mark.parametrize("flush, pure_python", [("sync", False), ("async", False), ("async", True)])
def test_mixed_pipelined_bursts_get_the_general_paths_replies(broker_factory, tmp_path, monkeypatch, flush,
                                                               pure_python):
    """``pure_python``: the brokers run the C helper's Python twins (METAQ_PURE_PYTHON=1)."""
    monkeypatch.setenv("METAQ_PURE_PYTHON", "1" if pure_python else "0")
    rng = random.Random(7)
    frames = mixed_burst(rng, 1500, reads=flush == "async")
    data = b"".join(frames)
    cuts = sorted(rng.sample(range(1, len(data)), 60))  # partial lines and bodies at buffer boundaries
    replies = {}
    brokers = {}
    for fast in (True, False):
        b = broker_factory(small_config(tmp_path / ("fast" if fast else "general"), topics=TOPICS,
                                        broker={"burst_puts": fast}, store={"flush": flush}))
        brokers[fast] = b
        replies[fast] = [normalized(e) for e in send_in_pieces(b.port, data, cuts, len(frames))]
    assert replies[True] == replies[False]
    assert [r[1] for r in replies[True]] == list(range(len(frames)))  # every opaque once, in order
    codes = {r[0] for r in replies[True]}
    assert {"put", 400, 500}.issubset(codes) and ({"value", 404} <= codes or flush == "sync"), codes
    with brokers[True].client() as c:
        assert int(c.stats_dict()["burst_puts"]) > 500  # most puts took the fast path
        stored = {(t, p): [r.data for r in consume_all(c, t, p)] for t in ("t-a", "t-b", "tc") for p in range(4)}
    with brokers[False].client() as c:
        assert int(c.stats_dict()["burst_puts"]) == 0
        assert stored == {(t, p): [r.data for r in consume_all(c, t, p)] for t in ("t-a", "t-b", "tc")
                          for p in range(4)}


def test_a_burst_cut_inside_every_frame_is_answered_whole(broker):
    bodies = [b"m%04d" % i * 50 for i in range(200)]
    with broker.client() as c:
        c.put_ok("test", b"first", 0)  # the partition is known: the rest can take the fast path
        frames = [put("test", 0, b, i) for i, b in enumerate(bodies)]
        for f in frames:  # each frame in three pieces: inside the line, inside the body, the rest
            for piece in (f[:7], f[7:len(f) - 20], f[len(f) - 20:]):
                c.send(piece)
        replies = [c.read_event() for _ in frames]
        assert [(r.code, r.opaque) for r in replies] == [(200, i) for i in range(len(frames))]
        assert [int(r.body.split()[2]) for r in replies] == list(range(1, 201))
        assert [r.data for r in consume_all(c, "test", 0)] == [b"first"] + bodies


def _all_refused(b, data, count):
    """Send ``data`` in one go and read its ``count`` replies: each a 400, in order."""
    sock = socket.create_connection(("127.0.0.1", b.port), timeout=120)
    sock.sendall(data)
    parser, got = TextParser(max_body=1 << 20), 0
    while got < count:
        e = parser.next_event()
        if e is NEED_DATA:
            parser.receive_data(sock.recv(1 << 20))
        else:
            assert e.code == 400 and e.opaque == got, e
            got += 1
    sock.close()


@pytest.mark.parametrize("command", ["put", "put_idem"])
def test_a_pipeline_of_puts_the_store_refuses_is_not_rescanned_for_each(broker_factory, tmp_path, command):
    """Each refused put (here: a partition the topic does not have) is answered by the general path; the fast
    path must not scan the whole rest of the receive buffer again for each of them (quadratic: one buffer of such
    puts stalled the broker's loop for seconds). ``burst_scanned_bytes`` counts what its scanners were given."""
    n = 5000
    frames = []
    for i in range(n):
        body = b"m%d" % i
        if command == "put":
            frames.append(put("t-a", 9, body, i))
        else:
            frames.append(serialize(IdempotentPut("t-a", 9, 0, body, i, metaq_checksum(body), 5, i)))
    data = b"".join(frames)
    b = broker_factory(small_config(tmp_path / "fast", topics=TOPICS, store={"flush": "async"}))
    _all_refused(b, data, n)
    with b.client() as c:
        s = c.stats_dict()
    scanned = int(s["burst_scanned_bytes"])
    assert int(s["put_failed"]) == n and int(s["burst_puts"]) == 0
    # each refused frame: a scan of at most BURST_SCAN_FRAMES frames (rescanning the rest each time: ~n/2 * len)
    assert len(data) <= scanned <= limits.BURST_SCAN_FRAMES * len(data), (scanned, len(data))


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("count", [limits.BURST_SCAN_FRAMES, limits.BURST_SCAN_FRAMES + 1,
                                   7 * limits.BURST_SCAN_FRAMES + 3])
def test_pipelines_at_and_past_the_first_scan_cap_take_the_fast_path(broker, idempotent, count):
    """``limits.BURST_SCAN_FRAMES``: the first scan's cap; a pipeline of that many frames, one more (the scan looks
    further with twice the cap) and many more are all stored by the fast path, in order."""
    def frame(k):
        body = b"m%d" % k
        if idempotent:
            return serialize(IdempotentPut("t-a", 1, 0, body, k, metaq_checksum(body), 6, k))
        return put("t-a", 1, body, k)

    with broker.client() as c:
        assert c.call(_event_of(frame(0))).code == 200  # the partition's first put (the general path's)
        before = int(c.stats_dict()["burst_puts"])
        c.send(b"".join(frame(k) for k in range(1, count + 1)))
        replies = [c.read_event() for _ in range(count)]
        assert [(r.code, r.opaque) for r in replies] == [(200, k) for k in range(1, count + 1)]
        assert [int(r.body.split()[2]) for r in replies] == list(range(1, count + 1))
        # all but the store's own stops (a put at the middle of a growing index file goes the general way)
        assert count - 2 <= int(c.stats_dict()["burst_puts"]) - before <= count


def _event_of(frame):
    parser = TextParser()
    parser.receive_data(frame)
    return parser.next_event()
