import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.errors import RemoteProtocolError
from metaq.protocol.message import (
    HEADER,
    Record,
    decode_payload,
    encode_payload,
    encode_record,
    iter_records,
)

# Reference §2 worked examples.
HELLO_RECORD = bytes.fromhex("00000005 3610a686 0000000000003039 00000000 68656c6c6f")
TAGGED_RECORD = bytes.fromhex("0000000d 469423fc 000000000000303a 00000001 00000004 74616731 68656c6c6f")


def test_header_is_20_bytes_big_endian():
    assert HEADER.size == 20
    assert HEADER.pack(1, 2, 3, 4) == bytes.fromhex("00000001 00000002 0000000000000003 00000004")


def test_worked_example_without_attribute_byte_for_byte():
    flag, data = encode_payload(b"hello", None)
    assert (flag, data) == (0, b"hello")
    assert encode_record(12345, flag, data) == HELLO_RECORD
    assert len(HELLO_RECORD) == 25


def test_worked_example_with_attribute_byte_for_byte():
    flag, data = encode_payload(b"hello", "tag1")
    assert flag == 1
    assert data == b"\x00\x00\x00\x04tag1hello"
    assert encode_record(12346, flag, data) == TAGGED_RECORD
    assert len(TAGGED_RECORD) == 33


def test_worked_examples_decode():
    decoded = list(iter_records(HELLO_RECORD + TAGGED_RECORD))
    (first, end1), (second, end2) = decoded
    assert (first.msg_id, first.flag, first.attribute, first.payload, end1) == (12345, 0, None, b"hello", 25)
    assert first.checksum == 907060870
    assert (second.msg_id, second.flag, second.attribute, second.payload, end2) == (12346, 1, "tag1", b"hello", 58)


def test_empty_attribute_still_sets_the_flag_and_writes_length_zero():
    flag, data = encode_payload(b"x", "")
    assert (flag, data) == (1, b"\x00\x00\x00\x00x")
    assert decode_payload(flag, data) == ("", b"x")


def test_non_ascii_attribute_is_utf8_with_byte_length():
    flag, data = encode_payload(b"p", "café")
    assert data == b"\x00\x00\x00\x05caf\xc3\xa9p"
    assert decode_payload(flag, data) == ("café", b"p")


def test_flag_without_bit0_means_no_attribute_block_even_if_other_bits_are_set():
    assert decode_payload(6, b"\x00\x00\x00\x04tag1hello") == (None, b"\x00\x00\x00\x04tag1hello")


@pytest.mark.parametrize(
    "data",
    [
        b"",  # no room for the length
        b"\x00\x00\x01",  # truncated length
        b"\xff\xff\xff\xffhello",  # negative length
        b"\x00\x00\x00\x0atag1hello",  # one byte past the end
    ],
)
def test_malformed_attribute_block_raises(data):
    with pytest.raises(RemoteProtocolError):
        decode_payload(1, data)


def test_attribute_taking_all_the_data_leaves_an_empty_payload():
    assert decode_payload(1, b"\x00\x00\x00\x04tag1") == ("tag1", b"")


def test_record_properties_and_equality():
    record = Record(7, 1, b"\x00\x00\x00\x01ab", 0)
    assert record.attribute == "a"
    assert record.payload == b"b"
    assert record == Record(7, 1, b"\x00\x00\x00\x01ab", 0)
    with pytest.raises(AttributeError):
        record.msg_id = 8


@pytest.mark.parametrize("cut", range(0, len(HELLO_RECORD)))
def test_partial_final_record_is_skipped_silently(cut):
    buf = HELLO_RECORD + TAGGED_RECORD[:cut]
    result = list(iter_records(buf))
    assert [(r.msg_id, end) for r, end in result] == [(12345, 25)]


def test_empty_buffer_yields_nothing():
    assert list(iter_records(b"")) == []


def test_negative_length_raises():
    bad = struct.pack(">iiqi", -1, 0, 1, 0)
    with pytest.raises(RemoteProtocolError, match="negative length"):
        list(iter_records(HELLO_RECORD + bad))


def test_checksum_mismatch_raises_only_when_verifying():
    corrupt = HELLO_RECORD[:-1] + b"O"
    with pytest.raises(RemoteProtocolError, match="checksum mismatch"):
        list(iter_records(corrupt))
    ((record, end),) = list(iter_records(corrupt, verify=False))
    assert (record.payload, end) == (b"hellO", 25)


def test_accepts_memoryview_and_bytearray():
    for buf in (memoryview(HELLO_RECORD), bytearray(HELLO_RECORD)):
        ((record, _),) = list(iter_records(buf))
        assert record.payload == b"hello"
        assert type(record.data) is bytes


def test_bytearray_can_grow_after_iteration():
    buf = bytearray(HELLO_RECORD)
    assert len(list(iter_records(buf))) == 1
    buf += TAGGED_RECORD  # the view taken by iter_records was released
    assert len(list(iter_records(buf))) == 2


messages = st.tuples(
    st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=300),
    st.none() | st.text(max_size=20),
)


@settings(max_examples=100)
@given(st.lists(messages, max_size=8))
def test_records_round_trip(items):
    buf = b"".join(encode_record(msg_id, *encode_payload(payload, attr)) for msg_id, payload, attr in items)
    decoded = list(iter_records(buf))
    assert [(r.msg_id, r.payload, r.attribute) for r, _ in decoded] == items
    assert (decoded[-1][1] if decoded else 0) == len(buf)
