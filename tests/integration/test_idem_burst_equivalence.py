"""The put_idem burst path against the general path under a long random pipeline: one broker with the fast path,
one without (``burst_puts: False``), small segments and index files (rolls and new index files inside runs), the
same bytes in, cut at random points. Replies, stored messages and counters must be equal, and after a kill -9 the
rebuilt windows must answer a resend of the whole pipeline equally too."""

import random
import re
import socket
import time

import pytest

from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.protocol.message import encode_payload
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize
from tests.harness.broker import consume_all

ATTRIBUTES = [None, "", "c=1", "tg\x02k\x01v\x02", "tg\x02k\x01v"]
COUNTERS = ("cmd_put", "put_failed", "idempotent_puts", "idempotent_duplicates", "idempotent_older_duplicates",
            "idempotent_refused_different", "idempotent_producers")
#: A realtime counter's time parts: its window in whole seconds and the rate over it depend on how long the run took
#: (a busy machine crossed a second on one side only), not on which path stored the puts.
RATE = re.compile(rb",Count/Duration=[^,]+,Duration=\d+")


def idem(topic, partition, body, seq, pid, opaque, attribute=None, flag_bits=0):
    flag, data = encode_payload(body, attribute)
    return serialize(IdempotentPut(topic, partition, flag | flag_bits, data, opaque, metaq_checksum(data), pid,
                                      seq))


def pipeline(rng, n):
    """Three producers over two topics x two partitions: next sequences mostly, resends (same and other content),
    skips, and frames the general path must answer (no such partition, the scheduler's topic, a reserved
    property, plain puts with and without an attribute); then one producer past the window and its old ones."""
    sent, out = {}, []
    for i in range(n):
        pid, topic, part = rng.choice([1, 2, 3]), rng.choice(["ta", "tb"]), rng.randrange(2)
        seqs = sent.setdefault((pid, topic, part), {})
        body = bytes([97 + i % 26]) * rng.choice([1, 100, 1500, 3000])
        attribute = rng.choice(ATTRIBUTES)
        k = rng.random()
        if k < 0.72 or not seqs:
            seq = max(seqs, default=-1) + 1
        elif k < 0.82:
            seq = rng.choice(sorted(seqs))
            body, attribute = seqs[seq]
        elif k < 0.85:
            seq = rng.choice(sorted(seqs))
            body += b"x"  # another message under a stored sequence: 400
        elif k < 0.89:
            seq = max(seqs) + rng.randint(2, 4)  # a gap, filled (or not) later
        else:
            special = [idem(topic, 9, body, 0, pid, i), idem(SCHEDULE_TOPIC, 0, body, 0, pid, i),
                       idem("tc", 0, body, 0, pid, i, attribute="x\x02METAQ_SEQ\x011\x02"),
                       serialize(ev.Put(topic, part, 0, body, i, metaq_checksum(body)))]
            flag, data = encode_payload(body, "a%d" % i)
            special.append(serialize(ev.Put(topic, part, flag, data, i, metaq_checksum(data))))
            out.append(rng.choice(special))
            continue
        seqs.setdefault(seq, (body, attribute))
        out.append(idem(topic, part, body, seq, pid, i, attribute, rng.choice([0, 0, 4])))
    for seq in range(1100):  # past the window (limits.IDEMPOTENCE_WINDOW = 1024)
        out.append(idem("ta", 0, b"long%d" % seq, seq, 9, n + seq))
    for k, (seq, body) in enumerate(((0, b"long0"), (5, b"zz"), (1099, b"long1099"), (1050, b"other"))):
        out.append(idem("ta", 0, body, seq, 9, n + 1100 + k))
    return out


def replies(port, data, count, cuts):
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = 0
    for cut in cuts + [len(data)]:
        sock.sendall(data[start:cut])
        start = cut
        time.sleep(0.001)
    parser, got = TextParser(max_body=1 << 20), []
    while len(got) < count:
        e = parser.next_event()
        if e is NEED_DATA:
            parser.receive_data(sock.recv(1 << 20))
        else:
            got.append((e.code, e.opaque, e.body.split()[1:] if e.code == 200 else e.body))  # ids are clock-based
    sock.close()
    return got


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("flush", ["sync", "async"])
def test_a_long_random_pipeline_is_answered_as_the_general_path_answers_it(broker_factory, tmp_path, flush):
    rng = random.Random(flush)
    frames = pipeline(rng, 2500)
    data = b"".join(frames)
    cuts = sorted(rng.sample(range(1, len(data)), 100))
    seen = {}
    for fast in (True, False):
        b = broker_factory(small_config(tmp_path / ("fast" if fast else "general") / "data",
                                        broker={"burst_puts": fast}, limits={"max_body_bytes": 8192},
                                        store={"flush": flush, "segment_size": 64 * 1024, "index_file_units": 16}),
                           workdir=tmp_path / ("fast" if fast else "general"))
        got = replies(b.port, data, len(frames), cuts)
        with b.client() as c:
            stored = {(t, p): [(r.flag, r.data) for r in consume_all(c, t, p)] for t in ("ta", "tb") for p in (0, 1)}
            s = c.stats_dict()
            counters = [s[k] for k in COUNTERS]
            per_topic = [RATE.sub(b"", c.stats(t).encode()) for t in ("ta", "tb", "tc")]
            burst = int(s["burst_puts"])
        b.kill()
        b.start()
        with b.client() as c:
            producers = c.stats_dict()["idempotent_producers"]
        again = replies(b.port, data, len(frames), [])
        seen[fast] = (got, stored, counters, per_topic, producers, again)
        assert burst > 2000 if fast else burst == 0
    for i, what in enumerate(("replies", "stored", "counters", "topic stats", "producers after kill -9",
                              "replies to the resent pipeline after kill -9")):
        assert seen[True][i] == seen[False][i], what
    codes = {r[0] for r in seen[True][0]}
    assert codes == {200, 400}, codes
    assert sum(1 for r in seen[True][0] if r[0] == 200 and r[2][-1:] == [b"dup"]) > 100
