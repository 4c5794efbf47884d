"""Message, Partition and SendResult: what goes on the wire and what comes back."""

import pytest

from metaq.client import Message, Partition, SendResult
from metaq.protocol.message import Record, encode_record, iter_records
from metaq.protocol.checksum import metaq_checksum


PARTITION = Partition(7, 1)


def roundtrip(msg, msg_id=42, offset=5, partition=PARTITION):
    flag, data = msg.encode()
    record, _end = next(iter_records(encode_record(msg_id, flag, data)))
    return Message.from_record(msg.topic, partition, offset, record)


@pytest.mark.parametrize("body,attribute", [
    (b"hello", None),
    (b"hello", "attr"),
    (b"", None),
    (b"", "only-attribute"),
    (b"x", ""),
    (bytes(range(256)) * 10, "\u00e9t\u00e9 \u6f22\u5b57 \U0001f600"),
])
def test_encode_decode_round_trip(body, attribute):
    got = roundtrip(Message("topic1", body, attribute))
    assert got.body == body
    assert got.attribute == attribute
    assert (got.id, got.partition, got.offset, got.topic) == (42, Partition(7, 1), 5, "topic1")


def test_flag_and_data_match_metaq_layout():
    assert Message("t", b"abc").encode() == (0, b"abc")
    flag, data = Message("t", b"abc", "k=v").encode()
    assert flag == 1 and data == b"\x00\x00\x00\x03k=vabc"


def test_from_record_keeps_flag_bits():
    data = b"payload"
    rec = Record(msg_id=9, flag=0b100, data=data, checksum=metaq_checksum(data))
    msg = Message.from_record("t", Partition(1, 0), 3, rec)
    assert msg.attribute is None and msg.body == data and msg.flag == 4


def test_body_must_be_bytes():
    with pytest.raises(TypeError):
        Message("t", "text")
    assert Message("t", bytearray(b"ab")).body == b"ab"
    assert Message("t", memoryview(b"ab")).body == b"ab"
    with pytest.raises(TypeError):
        Message("t", b"x", attribute=3)


def test_new_message_has_no_broker_fields():
    msg = Message("t", b"x", key="user-1")
    assert (msg.id, msg.partition, msg.offset) == (None, None, None)
    assert msg.key_bytes() == b"user-1"
    assert Message("t", b"", key=12).key_bytes() == b"12"
    assert Message("t", b"", key=b"\x00").key_bytes() == b"\x00"
    assert Message("t", b"").key_bytes() is None
    assert "topic='t'" in repr(msg)


def test_partition_text_form():
    assert str(Partition(7, 3)) == "7-3"
    assert Partition.parse("7-3") == Partition(7, 3)
    assert Partition.parse("12-10") == Partition(12, 10)
    assert Partition.parse(str(Partition(0, -1))) == Partition(0, -1)
    for bad in ("7", "a-1", "7-", "", "7-x"):
        with pytest.raises(ValueError):
            Partition.parse(bad)
    assert sorted([Partition(1, 0), Partition(0, 10), Partition(0, 2)]) == [
        Partition(0, 2), Partition(0, 10), Partition(1, 0)]


def test_send_result_defaults():
    ok = SendResult(True, Partition(1, 2), 3, 4)
    assert ok.success and ok.error is None and ok.offset == 3 and ok.msg_id == 4
    failed = SendResult(False, error=RuntimeError("x"))
    assert not failed.success and failed.partition is None and failed.offset == -1


def test_an_attribute_holding_the_properties_separator_is_refused():
    """Read back, an attribute is cut at its first \\x02 (the rest is taken for properties): refused at once."""
    with pytest.raises(ValueError, match="properties="):
        Message("t", b"x", attribute="tags\x02KEYS\x01k")
    m = Message("t", b"x", attribute="tags", properties={"KEYS": "k"})  # what was meant
    got = roundtrip(m)
    assert (got.attribute, got.properties) == ("tags", {"KEYS": "k"})


def test_a_key_is_sent_as_keys_only_when_the_index_could_take_it():
    """The key picks the partition (KeySelector) whatever it is; it is also sent as KEYS (README "Key index")
    when it is at most MAX_KEY_BYTES and holds no separator, so no key ever makes a send fail."""
    from metaq.keys import limits as keys_limits

    def keys_of(m):
        return roundtrip(m).properties.get("KEYS")

    assert keys_of(Message("t", b"x", key="order-1")) == "order-1"
    assert keys_of(Message("t", b"x", key=b"k" * keys_limits.MAX_KEY_BYTES)) == "k" * keys_limits.MAX_KEY_BYTES
    assert keys_of(Message("t", b"x", key=b"k" * (keys_limits.MAX_KEY_BYTES + 1))) is None
    assert keys_of(Message("t", b"x", key=b"a\x02b")) is None and keys_of(Message("t", b"x", key=b"a\x01b")) is None
    assert keys_of(Message("t", b"x", key=7)) == "7"
    assert keys_of(Message("t", b"x", key=Partition(7, 0))) is None  # a key of another kind: the partition only
