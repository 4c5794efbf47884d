"""The ``putb`` codec: the frame, the sub-records' check (with the C and the Python put scanner), the reply's runs."""

import pytest

from metaq import limits, speedups
from metaq.errors import ClientError, RemoteProtocolError
from metaq.protocol.burst import scan_puts_py
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.putbatch import PutBatch, decode_runs, encode_runs, expand_runs, scan_batch, sub_record
from metaq.protocol.text import TextParser, serialize

SCANNERS = [pytest.param(scan_puts_py, id="python")]
if speedups.load("scan_puts", None) is not None:
    SCANNERS.append(pytest.param(speedups.load("scan_puts", None), id="c"))


def body_of(items, topic=b"t"):
    out = []
    for k, (partition, payload, attribute) in enumerate(items):
        flag, data = encode_payload(payload, attribute)
        out.append(sub_record(topic, partition, flag, data, metaq_checksum(data), k))
    return b"".join(out)


ITEMS = [(k % 3, b"m%d" % k * k, "tag%d" % k if k % 2 else None) for k in range(20)]


@pytest.mark.parametrize("scan", SCANNERS)
def test_scan_batch_gives_each_sub_record_as_a_put_frame(scan):
    body = body_of(ITEMS)
    frames = scan_batch(scan, PutBatch("t", len(ITEMS), body, 1), 1 << 20, 2048, 3)
    assert [f[1] for f in frames] == [p for p, _d, _a in ITEMS]
    for f, (_p, payload, attribute) in zip(frames, ITEMS, strict=True):
        flag, data = encode_payload(payload, attribute)
        assert (f[2], bytes(body[f[4]:f[4] + f[5]]), f[6] & 0x7FFFFFFF) == (flag, data, metaq_checksum(data))


@pytest.mark.parametrize("scan", SCANNERS)
def test_scan_batch_refuses_each_fault_naming_it(scan):
    body = body_of(ITEMS)
    bad_sum = body.replace(b"put t 0 0 0 %d 0\r\n" % metaq_checksum(b""), b"put t 0 0 0 %d 0\r\n"
                           % (metaq_checksum(b"") + 1), 1)
    assert bad_sum != body
    cases = [
        (PutBatch("t", 21, body, 1), "the count says 21"),
        (PutBatch("t", 19, body, 1), "the count says 19"),
        (PutBatch("t", 20, body[:-1], 1), "truncated"),
        (PutBatch("t", 20, bad_sum, 1), "sub-record 0 of 20 (byte 0): its checksum"),
        (PutBatch("t", 21, body + body_of([(3, b"x", None)]), 1), "partition 3, topic t has partitions 0..2"),
        (PutBatch("t", 21, body + body_of([(0, b"x", None)], b"u"), 1), "sub-record 20 of 21 is for topic u"),
        (PutBatch("t", 20, b"pit" + body[3:], 1), "not a put line"),
        (PutBatch("t", 1, body_of([(0, b"x" * 65, None)]), 1), "over the limit of 64"),
    ]
    for batch, why in cases:
        with pytest.raises(ClientError) as caught:
            scan_batch(scan, batch, 64 if "limit" in why else 1 << 20, 2048, 3)
        assert why in str(caught.value) and "nothing was stored" in str(caught.value), (why, caught.value)


def test_the_frame_round_trips_and_its_count_is_bounded():
    body = body_of(ITEMS)
    frame = serialize(PutBatch("t", 20, body, -5))
    parser = TextParser()
    parser.receive_data(frame)
    assert parser.next_event() == PutBatch("t", 20, body, -5)
    for count in (0, limits.MAX_BATCH_MESSAGES + 1):
        parser = TextParser()
        parser.receive_data(b"putb t %d 0 3\r\n" % count)
        with pytest.raises(RemoteProtocolError) as caught:
            parser.next_event()
        assert "count" in caught.value.reason and caught.value.opaque == 3
    parser = TextParser()
    parser.receive_data(b"putb t %d 0 3\r\n" % limits.MAX_BATCH_MESSAGES)
    assert parser.next_event().count == limits.MAX_BATCH_MESSAGES


def test_the_documented_example_parses_and_scans():
    frame = b"putb orders 2 51 7\r\nput orders 0 2 0 -1 0\r\nhiput orders 1 3 0 -1 1\r\nabc"
    parser = TextParser()
    parser.receive_data(frame)
    e = parser.next_event()
    assert [f[1] for f in scan_batch(scan_puts_py, e, 1 << 20, 2048, 2)] == [0, 1]


def test_runs_encode_decode_and_expand_in_order():
    runs = [(100, 0, 5, 3), (103, 1, 0, 1), (200, 0, 8, 2)]
    assert decode_runs(encode_runs(runs)) == runs
    assert expand_runs(runs) == [(100, 0, 5), (101, 0, 6), (102, 0, 7), (103, 1, 0), (200, 0, 8), (201, 0, 9)]
    for bad in (b"", b"1 2 3", b"1 0 0 0", b"1 0 0 1;x"):
        with pytest.raises(ValueError):
            decode_runs(bad)
