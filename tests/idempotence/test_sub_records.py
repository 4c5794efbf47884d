"""The idempotent ``send_many``'s encoder of ``putb_idem`` bodies: the C helper's ``encode_idem_sub_records``
gives the Python reference's bytes, and those bytes are put_idem frames a broker's parser reads back; and the
broker's check of a batch body (``scan_idem_batch``), whose one-partition shortcut refuses what the frame-by-frame
check refuses."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import speedups
from metaq.errors import ClientError
from metaq.idempotence import wire
from metaq.idempotence.burst import scan_idem_batch
from metaq.idempotence.wire import IdempotentBatch, IdempotentPut, encode_idem_sub_records_py
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import TextParser

try:
    from metaq.native._bytes import encode_idem_sub_records as _c
except ImportError:  # not built: the Python reference is what runs
    _c = None

needs_c = pytest.mark.skipif(_c is None, reason="metaq.native._bytes was not built")

MAXQ = 2**63 - 1
topics = st.binary(min_size=1, max_size=20).map(lambda b: bytes(0x21 + x % 94 for x in b))


@needs_c
@settings(max_examples=300, deadline=None)
@given(topic=topics, partition=st.integers(0, 2**31 - 1), pid=st.integers(1, MAXQ),
       seq0=st.one_of(st.integers(0, 2**40), st.integers(MAXQ - 2**20, MAXQ - 30)),
       payloads=st.lists(st.binary(max_size=300), max_size=30))
def test_the_c_encoder_equals_the_python_reference(topic, partition, pid, seq0, payloads):
    assert _c(topic, partition, payloads, pid, seq0) == encode_idem_sub_records_py(topic, partition, payloads, pid,
                                                                                   seq0)


@pytest.mark.parametrize("encode", [encode_idem_sub_records_py, wire.encode_idem_sub_records])
def test_the_body_is_put_idem_frames_a_broker_reads_back(encode):
    payloads = [b"", b"hi", b"\r\nput_idem t 0 1 0 -1 1 0 0\r\n", bytes(range(256)) * 40]
    body = encode(b"orders", 5, payloads, MAXQ, MAXQ - len(payloads) + 1)
    parser = TextParser()
    parser.receive_data(body)
    got = [parser.next_event() for _ in payloads]
    assert got == [IdempotentPut("orders", 5, 0, data, 0, metaq_checksum(data), MAXQ, MAXQ - 3 + k)
                   for k, data in enumerate(payloads)]
    assert encode(b"orders", 5, [], 1, 0) == b""


def test_the_c_encoder_is_the_one_used_when_built():
    assert wire.encode_idem_sub_records is speedups.load("encode_idem_sub_records", encode_idem_sub_records_py)


@needs_c
@pytest.mark.parametrize("bad", ["text", bytearray(b"ok"), memoryview(b"ok"), type("B", (bytes,), {})(b"ok")])
def test_the_encoders_refuse_a_payload_that_is_not_bytes(bad):
    for encode in (_c, encode_idem_sub_records_py):
        with pytest.raises(TypeError, match="payload 1 is"):
            encode(b"t", 0, [b"ok", bad], 1, 0)


@needs_c
def test_the_c_encoder_counts_sequences_up_to_the_last_one_a_broker_takes():
    """Sequences end at 2**63-1 (the broker's bound): the C encoder reaches it and refuses to count past it."""
    three = [b"a", b"b", b"c"]
    assert _c(b"t", 0, three, 1, MAXQ - 2) == encode_idem_sub_records_py(b"t", 0, three, 1, MAXQ - 2)
    assert _c(b"t", 0, three, 1, MAXQ - 2).endswith(b" 1 %d 0\r\nc" % MAXQ)
    with pytest.raises(OverflowError, match="run past"):
        _c(b"t", 0, three, 1, MAXQ - 1)
    with pytest.raises(OverflowError):
        _c(b"t", 0, three, MAXQ + 1, 0)


def _batch(*parts):
    """An IdempotentBatch of topic t from ``(topic, partition, payloads, pid, seq0)`` parts."""
    body = b"".join(encode_idem_sub_records_py(*part) for part in parts)
    return IdempotentBatch("t", sum(len(part[2]) for part in parts), body, 0)


@pytest.mark.parametrize("parts, words", [
    (((b"t", 4, [b"a", b"b", b"c"], 7, 0),), "sub-record 0 of 3 is for partition 4, topic t has partitions 0..3"),
    (((b"t", 1, [b"a", b"b"], 7, 0), (b"t", 1, [b"c"], 8, 2)), "sub-record 2 of 3 is of producer 8"),
    (((b"t", 1, [b"a", b"b"], 7, 0), (b"u", 1, [b"c"], 7, 2)), "sub-record 2 of 3 is for topic u"),
    (((b"t", 1, [b"a", b"b"], 7, 0), (b"t", 1, [b"c"], 7, 3)), "sub-record 2 of 3 has sequence 3"),
    (((b"t", 1, [b"a"], 7, 5), (b"t", 1, [b"b"], 7, 5), (b"t", 1, [b"c"], 7, 7)), "sub-record 1 of 3 has sequence 5"),
])
def test_a_one_partition_batch_with_a_fault_is_refused_naming_it(parts, words):
    with pytest.raises(ClientError, match="putb_idem: " + words):
        scan_idem_batch(_batch(*parts), 1 << 20, 4096, 4)


def test_good_batches_of_one_and_of_several_partitions_are_taken():
    frames, _data = scan_idem_batch(_batch((b"t", 3, [b"a", b"b", b"c"], 7, 9)), 1 << 20, 4096, 4)
    assert [(f[1], f[8], f[9]) for f in frames] == [(3, 7, 9), (3, 7, 10), (3, 7, 11)]
    frames, _data = scan_idem_batch(_batch((b"t", 0, [b"a"], 7, 0), (b"t", 1, [b"b"], 7, 4), (b"t", 0, [b"c"], 7, 1)),
                                    1 << 20, 4096, 4)
    assert [(f[1], f[9]) for f in frames] == [(0, 0), (1, 4), (0, 1)]
