"""Bulk decoding of ``get`` replies (``Consumer.fetch_batch`` / ``iter_batches``): the C helper's ``scan_reply``
equals its Python reference, a ``MessageBatch`` gives what the per-message path gives (random replies and real
ones: attribute blocks, properties, compressed sends), and its faults are the per-message path's faults."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client import Consumer, Message, Partition, Producer
from metaq.client import bulk as client_bulk
from metaq.client.bulk import decode_batch
from metaq.errors import RemoteProtocolError
from metaq.protocol.message import encode_record, iter_records, scan_reply_py
from tests.harness.broker import url_of
from tests.harness.native import both

try:
    from metaq.native._bytes import scan_reply as _c
except ImportError:  # not built: the Python reference is what runs
    _c = None

needs_c = pytest.mark.skipif(_c is None, reason="metaq.native._bytes was not built")
PART = Partition(7, 1)


@st.composite
def records(draw):
    """A record's bytes: mostly good; some with an attribute block (well formed or not), a wrong checksum or a
    negative length."""
    body = draw(st.binary(max_size=40))
    kind = draw(st.sampled_from(["plain"] * 4 + ["attr", "badattr", "crc", "neg"]))
    flag = draw(st.sampled_from([0, 2, 1 << 20]))
    if kind == "attr":
        attr = draw(st.text(max_size=8)).encode()
        body, flag = struct.pack(">i", len(attr)) + attr + body, flag | 1
    elif kind == "badattr":
        body, flag = draw(st.sampled_from([b"", b"\x00\x01", b"\xff\xff\xff\xff", b"\x00\x00\x00\x09abc"])), flag | 1
    rec = bytearray(encode_record(draw(st.integers(-2**63, 2**63 - 1)), flag, body))
    if kind == "crc":
        rec[4:8] = struct.pack(">i", (struct.unpack(">i", bytes(rec[4:8]))[0] + 1) % 2**31)
    elif kind == "neg":
        rec[0:4] = struct.pack(">i", -len(body) - 1)
    return bytes(rec)


replies = st.tuples(st.lists(records(), max_size=8), st.binary(max_size=30)).map(
    lambda t: b"".join(t[0]) + (t[1] if t[0] else b""))  # whole records, then maybe a cut-off one


@needs_c
@settings(max_examples=400, deadline=None)
@given(replies, st.booleans())
def test_the_c_scan_equals_the_python_reference(body, verify):
    assert _c(body, verify) == scan_reply_py(body, verify)


@needs_c
@settings(max_examples=300, deadline=None)
@given(replies, st.integers(0, 1000))
def test_the_c_gather_of_payloads_equals_the_python_reference(body, base):
    from metaq.native._bytes import gather_payloads as c_gather
    from metaq.protocol.message import gather_payloads_py

    index, count, _stop, _fault = scan_reply_py(body, False)
    assert c_gather(body, index, count, base) == gather_payloads_py(body, index, count, base)
    offsets, data = gather_payloads_py(body, index, count, base)
    q = memoryview(index).cast("q")
    assert data == b"".join(body[q[6 * k + 4]:q[6 * k + 5]] for k in range(count))
    assert memoryview(offsets).cast("i")[-1] == base + len(data)
    if count:
        for gather in (c_gather, gather_payloads_py):
            with pytest.raises(ValueError, match="fewer records"):
                gather(body, index, count + 1)
            with pytest.raises(ValueError, match="2 GiB"):
                gather(body, index, count, 2**31 - len(data))


def per_message(body):
    """What ``fetch`` does with a reply: records, then a Message each (or the error it raises)."""
    try:
        recs = [rec for rec, _end in iter_records(body)]
    except RemoteProtocolError as exc:
        return "fault", str(exc)
    out = []
    for k, rec in enumerate(recs):
        try:
            out.append(Message.from_record("t", PART, 100 + k, rec))
        except RemoteProtocolError as exc:
            out.append(("bad", str(exc)))
    return "ok", out


def bulk(body):
    try:
        batch = decode_batch("t", PART, 100, body)
    except RemoteProtocolError as exc:
        return "fault", str(exc)
    out = []
    for k in range(len(batch)):
        try:
            out.append(batch.message(k))
        except RemoteProtocolError as exc:
            out.append(("bad", str(exc)))
    return "ok", out


@pytest.mark.parametrize("scan_reply", both(scan_reply_py, "scan_reply"))
@settings(max_examples=400, deadline=None)
@given(body=replies)
def test_bulk_decode_equals_the_per_message_decode(scan_reply, body):
    expected = per_message(body)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(client_bulk, "scan_reply", scan_reply)
        assert bulk(body) == expected
        if expected[0] == "ok" and not any(isinstance(m, tuple) for m in expected[1]):
            batch = decode_batch("t", PART, 100, body)
            assert [(o, i, bytes(p)) for o, i, p in batch] == [(m.offset, m.id, m.body) for m in expected[1]]
            assert list(batch.ids()) == [m.id for m in expected[1]] and list(batch.offsets) == [m.offset
                                                                                                for m in expected[1]]


def test_real_replies_decode_in_bulk_as_fetch_decodes_them(broker):
    sent = [Message("tbulk", b"plain %d" % i) for i in range(300)]
    sent += [Message("tbulk", b"tagged", attribute="tag-a"), Message("tbulk", b"with props", properties={"k": "v"}),
             Message("tbulk", b"", attribute=""), Message("tbulk", b"z" * 5000, attribute="big")]
    with Producer(brokers=[url_of(broker)], selector=lambda t, ps, m: ps[-1]) as plain, \
            Producer(brokers=[url_of(broker)], selector=lambda t, ps, m: ps[-1], compress_over=100) as packing:
        assert plain.send(Message("tbulk", b"create")).success  # the topic's partitions known from here
        assert all(plain.send(m).success for m in sent)
        assert packing.send(Message("tbulk", b"c" * 3000, attribute="packed")).success  # compressed on the wire
        assert plain.send_many("tbulk", [b"many %d" % i for i in range(200)], partition=-1).result(10).success
        part = plain.partitions("tbulk")[-1]
    consumer = Consumer("gbulk", brokers=[url_of(broker)])
    try:
        old, offset = [], 0
        while True:
            got = consumer.fetch("tbulk", part, offset, max_size=4096)
            if not got:
                break
            old += got
            offset = got[-1].offset + 1
        batches = list(consumer.iter_batches("tbulk", part, 0, max_size=4096))
        assert len(batches) > 3  # small replies: several batches, each from the last one's next offset
        new = [m for b in batches for m in b.messages()]
        assert new == old
        assert [(m.attribute, m.properties) for m in new] == [(m.attribute, m.properties) for m in old]
        assert [bytes(p) for b in batches for p in b.payloads()] == [m.body for m in old]
        bodies = [m.body for m in new if m.body != b"create"]
        assert bodies == [m.body for m in sent] + [b"c" * 3000] + [b"many %d" % i for i in range(200)]
        end = consumer.fetch_batch("tbulk", part, len(new))
        assert len(end) == 0 and end.next_offset == len(new)
        past = consumer.fetch_batch("tbulk", part, len(new) + 50)  # outside the partition: followed, as fetch does
        assert len(past) == 0 and past.next_offset == len(new)
    finally:
        consumer.close()
