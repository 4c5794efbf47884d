"""Compressed bodies (README "Compressed bodies"): decompressed on arrival, so every reader gets the original bytes.

RocketMQ producers compress bodies over 4 KiB by default (the official C++-based client with zlib); a body
compressed by a RocketMQ 5 producer (zstd, LZ4) or by the metaq ``Producer(compress_over=...)`` is stored the
same way. A body that does not decompress is refused with a clear error and nothing is stored.
"""

import hashlib
import socket
import time
import zlib

import pytest

from bench.rocketmq_peer import run_peer, sized_body
from metaq import errors
from metaq.client import Consumer, Message, Producer
from metaq.client.local import ns_of
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.text import serialize
from metaq.protocol.compression import compress
from metaq.protocol.rocketmq.bodies import decode_stored_messages, encode_batch_messages
from metaq.protocol.rocketmq.remoting import RequestCode as R
from tests.harness.broker import consume_all, url_of
from tests.harness.rocketmq import end_tx, pull, received, require_official_client, send_v1

BIG = {"limits": {"max_body_bytes": 2 << 20}, "store": {"segment_size": 8 << 20}}
SIZES = (8 << 10, 1 << 20)  # over the C++ client's 4 KiB compression threshold; the largest common body


def digest(body):
    return "%d:%s" % (len(body), hashlib.sha256(body).hexdigest())


def every_record(b, topic, parts=4):
    with b.client() as text:
        return [rec for p in range(parts) for rec in consume_all(text, topic, p, max_size=4 << 20)]


def metaq_consumer_bodies(b, topic, parts=4):
    consumer = Consumer("CG-" + topic, brokers=[url_of(b)])
    try:
        out = []
        for p in range(parts):
            offset = 0
            while True:
                got = consumer.fetch(topic, "7-%d" % p, offset, max_size=4 << 20)
                if not got:
                    break
                out.extend(got)
                offset = got[-1].offset + 1
        return out
    finally:
        consumer.close()


@pytest.mark.slow
def test_official_client_compressed_bodies_reach_every_reader_as_sent(rmq_factory, tmp_path):
    require_official_client()
    b = rmq_factory(**BIG)
    ns = ns_of(b)
    expected = {}
    for size, prefix, count in ((SIZES[0], "k8", 3), (SIZES[1], "m1", 2)):
        sent = [s for s in run_peer(tmp_path / ("p" + prefix), "produce", "--ns", ns, "--topic", "tZip", "--count",
                                    count, "--size", size, "--prefix", prefix, "--tags", "Big") if "msg_id" in s]
        assert len(sent) == count and all(s["status"] == 0 for s in sent), sent
        expected.update({sized_body(prefix, i, size).encode(): None for i in range(count)})
    # a text get: the payloads are the bodies the producer was given (before: 140 bytes of zlib for 9,000)
    records = every_record(b, "tZip")
    assert sorted(r.payload for r in records) == sorted(expected)
    assert all(r.attribute.startswith("Big\x02") and "@SYSFLAG" not in r.attribute for r in records)
    # the metaq client
    assert sorted(m.body for m in metaq_consumer_bodies(b, "tZip")) == sorted(expected)
    # RocketMQ consumers: the official push consumer, and a pull through our codec (no compressed flag left)
    got = received(run_peer(tmp_path / "c", "consume", "--ns", ns, "--topic", "tZip", "--group", "CGZip",
                            "--expect", 5, "--digest", "--timeout", 60))
    assert sorted(m["body"] for m in got) == sorted(digest(body) for body in expected)
    pulled = pull_all(b, "tZip")
    assert sorted(m.body for m in pulled) == sorted(expected)
    assert all(m.sys_flag & 0x701 == 0 for m in pulled)  # stored decompressed: no compression bit to act on


@pytest.mark.slow
def test_metaq_producer_compresses_and_rocketmq_consumers_get_the_original(rmq_factory, tmp_path):
    require_official_client()
    b = rmq_factory(**BIG)
    bodies = [sized_body("mq", i, size).encode() for i, size in enumerate(SIZES * 2)]
    codecs = ["zlib", "zlib", "zstd", "lz4"]
    for body, codec in zip(bodies, codecs, strict=True):
        m = Message("tMq", body, attribute="Tz", properties={"KEYS": "k"})
        flag, data = m.encode(4096, codec)
        assert len(data) < len(body) // 10  # what goes on the wire is compressed
        with Producer(brokers=[url_of(b)], compress_over=4096, compression=codec) as producer:
            assert producer.send(m).success
    records = every_record(b, "tMq")
    assert sorted(r.payload for r in records) == sorted(bodies)
    assert {r.attribute for r in records} == {"Tz\x02KEYS\x01k\x02"}  # stored as if sent uncompressed
    got = received(run_peer(tmp_path / "c", "consume", "--ns", ns_of(b), "--topic", "tMq", "--group", "CGMq",
                            "--expect", 4, "--digest", "--timeout", 60))
    assert sorted(m["body"] for m in got) == sorted(digest(body) for body in bodies)
    assert all(m["tags"] == "Big" or m["tags"] == "Tz" for m in got) and all(m["keys"] == "k" for m in got)


def pull_all(b, topic, queues=4):
    """Every message of ``topic`` pulled through our codec, following nextBeginOffset."""
    from metaq.client.raw import RemotingClient

    out = []
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        for q in range(queues):
            offset = 0
            while True:
                r = pull(rc, topic, q, offset)
                if r.code != 0:
                    break
                out.extend(decode_stored_messages(r.body))
                offset = int(r.ext_fields["nextBeginOffset"])
    return out


def test_idempotent_and_delayed_compressed_puts_are_stored_decompressed(rmq_factory):
    """put_idem (its resend still a duplicate) and put_delayed take the same rule as put."""
    b = rmq_factory()
    body = sized_body("idem", 0, 30000).encode()
    with Producer(brokers=[url_of(b)], idempotent=True, compress_over=1024, compression="zstd") as producer:
        first = producer.send(Message("tIdem", body, properties={"KEYS": "i"}))
        assert first.success and not first.duplicate
    flag, data = Message("tDelay", body).encode(1024, "lz4")
    with b.client() as text:
        r = text.call(ev.DelayedPut("tDelay", 0, flag, data, 5, metaq_checksum(data), 1))
        assert r.code == 200, r
        [stored] = consume_all(text, "tIdem", first.partition.partition)
        assert stored.payload == body and "METAQ_PID" in stored.attribute and "@SYSFLAG" not in stored.attribute
        deadline = time.time() + 10
        while not consume_all(text, "tDelay", 0) and time.time() < deadline:
            time.sleep(0.2)
        [delayed] = consume_all(text, "tDelay", 0)
        assert delayed.payload == body and delayed.attribute is None  # it had no attribute: it has none


def test_corrupt_or_oversize_compressed_bodies_are_refused_and_nothing_is_stored(rmq_factory):
    from metaq.client.raw import RemotingClient

    b = rmq_factory()
    body = sized_body("ok", 0, 20000).encode()
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        cases = {
            "garbage": (1, b"this is not zlib at all"),
            "truncated zlib": (1, zlib.compress(body)[:-10]),
            "unknown codec": (1 | 5 << 8, zlib.compress(body)),
            "zip bomb": (1, zlib.compress(b"\0" * (300 << 10))),  # past small_config's 256 KiB body limit
            "zstd marked lz4": (1 | 1 << 8, compress(body, "zstd")[1]),
        }
        for name, (sys_flag, data) in cases.items():
            r = send_v1(rc, "tBad", data, queue=0, sys_flag=sys_flag)
            assert r.code == 13, (name, r)  # MESSAGE_ILLEGAL, and the connection goes on
            assert ("does not decompress" in r.remark or "past" in r.remark or "does not exist" in r.remark), r
        ok = send_v1(rc, "tBad", zlib.compress(body), queue=0, sys_flag=1)
        assert ok.code == 0 and ok.ext_fields["queueOffset"] == "0"  # nothing stored before it
        # a batch: its sysFlag is each message's
        entries = [ev_entry(zlib.compress(sized_body("bt", i, 9000).encode())) for i in range(3)]
        rb = rc.call(R.SEND_BATCH_MESSAGE, batch_header("tBad", 1), encode_batch_messages(entries))
        assert rb.code == 0, rb
        # a half message, committed
        half = send_v1(rc, "tBad", zlib.compress(body), queue=2, sys_flag=1 | 4)
        assert half.code == 0 and end_tx(rc, half, 8).code == 0
    with b.client() as text:
        assert [r.payload for r in consume_all(text, "tBad", 0)] == [body]
        assert [r.payload for r in consume_all(text, "tBad", 1)] == [sized_body("bt", i, 9000).encode()
                                                                     for i in range(3)]
        assert [r.payload for r in consume_all(text, "tBad", 2)] == [body]


def ev_entry(body):
    from metaq.protocol.rocketmq.bodies import BatchEntry

    return BatchEntry(body, 0, {"KEYS": "b"})


def batch_header(topic, queue):
    return {"a": "PG", "b": topic, "c": "TBW102", "d": 4, "e": queue, "f": 1, "g": int(time.time() * 1000),
            "h": 0, "i": "", "j": 0, "k": "false", "m": "true"}  # SEND_MESSAGE_V2's one-letter fields


def test_text_puts_marked_compressed_are_decompressed_or_refused_in_a_pipeline(rmq_factory):
    """A pipeline mixing plain puts (the burst path) with marked ones (the general path): each answered in its
    place; the corrupt one refused with 400 and nothing stored for it."""
    b = rmq_factory()
    body = sized_body("txt", 0, 50000).encode()
    bits, packed = compress(body, "zlib")
    good = encode_payload(packed, "T\x02@SYSFLAG\x01%d\x02" % bits)
    bad = encode_payload(packed[:-20], "T\x02@SYSFLAG\x01%d\x02" % bits)
    frames = [ev.Put("tTxt", 0, 0, b"plain-0", 1, metaq_checksum(b"plain-0")),
              ev.Put("tTxt", 0, good[0], good[1], 2, metaq_checksum(good[1])),
              ev.Put("tTxt", 0, 0, b"plain-1", 3, metaq_checksum(b"plain-1")),
              ev.Put("tTxt", 0, bad[0], bad[1], 4, metaq_checksum(bad[1])),
              ev.Put("tTxt", 0, 0, b"plain-2", 5, metaq_checksum(b"plain-2"))]
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as s:
        s.sendall(b"".join(serialize(f) for f in frames))
        replies = read_results(s, len(frames))
    assert [(r.code, r.opaque) for r in replies] == [(200, 1), (200, 2), (200, 3), (400, 4), (200, 5)]
    assert b"does not decompress" in replies[3].body
    with b.client() as text:
        stored = consume_all(text, "tTxt", 0)
    assert [(r.payload, r.attribute) for r in stored] == [(b"plain-0", None), (body, "T"), (b"plain-1", None),
                                                          (b"plain-2", None)]


def read_results(sock, n):
    from metaq.protocol.text import TextParser

    parser, out = TextParser(), []
    while len(out) < n:
        data = sock.recv(65536)
        assert data, "connection closed after %d replies" % len(out)
        parser.receive_data(data)
        while True:
            e = parser.next_event()
            if not isinstance(e, ev.Result):
                break
            out.append(e)
    return out


def test_records_an_older_broker_stored_compressed_are_decoded_by_readers_and_a_corrupt_one_is_parked(
        rmq_factory, tmp_path):
    """Before the decompress-on-arrival rule, a RocketMQ body was stored compressed with @SYSFLAG kept. Such a
    record still reaches a RocketMQ consumer with its compression flag (it decompresses), the metaq client
    decompresses it, and one that does not decompress is parked by the metaq consumer, which goes on."""
    import time as _time

    from metaq.client.local import SMALL_STORE
    from metaq.store.config import StoreConfig, TopicSpec
    from metaq.storestate import open_store

    b = rmq_factory()
    b.stop()
    body = sized_body("old", 0, 12000).encode()
    packed = zlib.compress(body)
    store = open_store(StoreConfig(data_dir=b.data_dir, broker_id=7, topics=[TopicSpec("t*", 4)],
                                          **SMALL_STORE), int(_time.time() * 1000))
    try:
        now = int(_time.time() * 1000)
        for data in (packed, packed[:-30], b"after"):
            mark = "Old\x02@SYSFLAG\x011\x02" if data != b"after" else "Old\x02"
            flag, record = encode_payload(data, mark)
            store.put("tOld", 0, flag, record, now)
    finally:
        store.close(int(_time.time() * 1000))
    b.start()
    [first, broken, after] = pull_all(b, "tOld", 1)
    assert (first.body, first.sys_flag & 1, broken.sys_flag & 1) == (packed, 1, 1)  # as an older broker served it
    consumer = Consumer("CGOld", brokers=[url_of(b)])
    try:
        assert [m.body for m in consumer.fetch("tOld", "7-0", 0, max_size=1)] == [body]  # one message a get
    finally:
        consumer.close()
    with pytest.raises(errors.RemoteProtocolError, match="does not decompress"):  # fetch: that message's error
        Message.from_record("tOld", None, 1, record_at(b, "tOld", 1))
    seen = []
    consumer = Consumer("CGOld2", brokers=[url_of(b)], recover_dir=str(tmp_path / "recover"), max_retries=0)
    consumer.subscribe("tOld", lambda m: seen.append((m.offset, m.body)))
    consumer.start()
    try:
        deadline = _time.time() + 20
        while len(seen) < 2 and _time.time() < deadline:
            _time.sleep(0.05)
    finally:
        consumer.close()
    assert seen == [(0, body), (2, b"after")]  # the broken one did not stop the partition
    parked = [p for p in (tmp_path / "recover").rglob("*") if p.is_file() and p.stat().st_size > 0]
    assert parked, "the undecodable message was parked, not dropped"


def record_at(b, topic, offset):
    from metaq.protocol.message import iter_records

    with b.client() as text:
        r = text.get(topic, 0, offset, 1 << 16)
    rec, _ = next(iter_records(r.body))
    return rec


def test_a_batch_of_zip_bombs_is_bounded_in_all_not_each(rmq_factory):
    # each bomb inflates to 200 KiB, within the 256 KiB body limit; together they may hold what the same batch sent
    # uncompressed may: one frame (512 KiB here). An attack review: 150 bombs of 4 MiB each in one 616 KB batch held
    # 1.2 GB and stored 600 MB when only each was bounded
    from metaq.client.raw import RemotingClient

    b = rmq_factory(remoting={"max_frame_bytes": 512 << 10})
    bomb = zlib.compress(b"\0" * (200 << 10))
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        r = rc.call(R.SEND_BATCH_MESSAGE, batch_header("tBomb", 0), encode_batch_messages([ev_entry(bomb)] * 3))
        assert r.code == 13 and "decompress to more than remoting.max_frame_bytes (524288) in all" in r.remark, r
        two = rc.call(R.SEND_BATCH_MESSAGE, batch_header("tBomb", 0), encode_batch_messages([ev_entry(bomb)] * 2))
        assert two.code == 0 and two.ext_fields["queueOffset"] == "0", two  # nothing of the refused batch stored
    with b.client() as text:
        assert [len(r.payload) for r in consume_all(text, "tBomb", 0)] == [200 << 10] * 2


def test_a_compressed_batch_is_taken_as_the_same_batch_uncompressed_is(rmq_factory):
    from metaq.client.raw import RemotingClient

    b = rmq_factory()  # the body limit 256 KiB, the frame the default
    bodies = [bytes([65 + i]) * (200 << 10) for i in range(3)]
    with RemotingClient(b.config["remoting"]["port"]) as rc:
        plain = rc.call(R.SEND_BATCH_MESSAGE, dict(batch_header("tSame", 0), f=0),
                        encode_batch_messages([ev_entry(x) for x in bodies]))
        packed = rc.call(R.SEND_BATCH_MESSAGE, batch_header("tSame", 0),
                         encode_batch_messages([ev_entry(zlib.compress(x)) for x in bodies]))
        assert plain.code == 0 and packed.code == 0, (plain.remark, packed.remark)
    with b.client() as text:
        assert [r.payload for r in consume_all(text, "tSame", 0)] == bodies * 2
