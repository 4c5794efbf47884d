"""How a RocketMQ message lives in a MetaQ record and back (metaq.protocol.rocketmq.mapping)."""

import pytest

from metaq.errors import RemoteProtocolError
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.rocketmq.bodies import decode_stored_message, parse_offset_msg_id
from metaq.protocol.properties import split_attribute
from metaq.protocol.rocketmq.mapping import (
    message_of_record,
    parse_subscription,
    record_data_from_send,
    retry_copy,
    stored_message_bytes,
)
from metaq.store.record import LogRecord

HOST = ("127.0.0.1", 10911)


def record(flag, data, topic="T", position=4096, offset=7):
    return LogRecord(position, 100, topic, 2, offset, 1700000000123, 1700000000100, 42, flag, data)


def test_send_keeps_body_as_payload_and_tags_first_in_the_attribute():
    flag, data = record_data_from_send(b"body", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U", "DELAY": "3"})
    attribute, payload = decode_payload(flag, data)
    assert flag == 1 and payload == b"body"
    assert attribute == "TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02"  # DELAY is the scheduler's, not stored
    assert split_attribute(attribute) == ("TagA", {"KEYS": "k1 k2", "UNIQ_KEY": "U"}, True)


def test_round_trip_through_a_record_with_internal_fields():
    flag, data = record_data_from_send(b"z", {"u": "v"}, flag=9, sys_flag=2 | 4, reconsume_times=2,
                                       born_host="10.1.2.3:51234")
    msg = message_of_record(record(flag, data), HOST)
    # multi-tags kept, the transaction bits not (a stored message is a committed one)
    assert (msg.body, msg.flag, msg.sys_flag, msg.reconsume_times) == (b"z", 9, 2, 2)
    assert msg.properties == {"u": "v"}  # no TAGS (none sent), no @internal keys
    assert (msg.queue_id, msg.queue_offset, msg.physical_offset, msg.store_host) == (2, 7, 4096, HOST)
    assert msg.born_host == ("10.1.2.3", 51234)  # the producer's address, not the broker's
    decoded, end = decode_stored_message(stored_message_bytes(msg), check_crc=True)
    assert decoded.properties == {"u": "v"} and decoded.born_timestamp == 1700000000100
    assert decoded.born_host == ("10.1.2.3", 51234)


def test_a_body_still_compressed_is_never_stored():
    with pytest.raises(ValueError, match="decompressed body"):
        record_data_from_send(b"x\x9c...", {}, sys_flag=1)
    with pytest.raises(ValueError, match="decompressed body"):
        record_data_from_send(b"...", {}, sys_flag=2 << 8 | 1)


def test_a_record_an_older_broker_stored_compressed_still_tells_consumers_so():
    """Before bodies were stored decompressed, @SYSFLAG kept the compression bits: RocketMQ consumers must
    still get them (they decompress), and the metaq client's reader decompresses (stored_payload)."""
    import zlib

    from metaq.protocol.properties import stored_payload

    packed = zlib.compress(b"original " * 1000)
    flag, data = encode_payload(packed, "Tg\x02@SYSFLAG\x01769\x02KEYS\x01k\x02")  # 769 = 1 | 3 << 8: zlib
    msg = message_of_record(record(flag, data), HOST)
    assert (msg.body, msg.sys_flag, msg.properties) == (packed, 769, {"KEYS": "k", "TAGS": "Tg"})
    _tags, props, _remoting = split_attribute(decode_payload(flag, data)[0])
    assert stored_payload(props, packed) == b"original " * 1000
    assert stored_payload({"KEYS": "k"}, packed) == packed  # not marked: as stored
    assert stored_payload({"@SYSFLAG": "2"}, packed) == packed  # multi-tags only
    with pytest.raises(RemoteProtocolError, match="does not decompress"):
        stored_payload(props, packed[:-9])


def test_text_records_become_messages_with_their_attribute_as_tags():
    flag, data = encode_payload(b"plain", "TagT")
    msg = message_of_record(record(flag, data), HOST)
    assert (msg.body, msg.properties, msg.flag, msg.reconsume_times) == (b"plain", {"TAGS": "TagT"}, 1, 0)
    bare = message_of_record(record(4, b"no attribute"), HOST)
    assert (bare.body, bare.properties, bare.flag) == (b"no attribute", {}, 4)
    odd = message_of_record(record(*encode_payload(b"x", "has\x01sep")), HOST)
    assert odd.properties == {}  # an attribute that cannot be a tag is not passed off as one
    broken = message_of_record(record(1, b"\x00\x00\x00\x50xx"), HOST)
    assert broken.body == b"\x00\x00\x00\x50xx"  # a malformed attribute block: the raw data is the body


def test_properties_that_cannot_be_stored_are_refused():
    with pytest.raises(RemoteProtocolError):
        record_data_from_send(b"x", {"TAGS": "a\x02b"})
    with pytest.raises(RemoteProtocolError):
        record_data_from_send(b"x", {"k": ""})


def test_subscriptions():
    assert parse_subscription("*") is None and parse_subscription("") is None and parse_subscription(None) is None
    assert parse_subscription("A || B ||C").tags == {b"A", b"B", b"C"}
    assert parse_subscription("A || *") is None


def test_retry_copy_counts_deliveries_and_marks_the_origin():
    flag, data = record_data_from_send(b"p", {"TAGS": "T", "UNIQ_KEY": "U1"})
    msg = message_of_record(record(flag, data, topic="orders"), HOST)
    dead, props, times = retry_copy(msg, HOST, 16)
    assert (dead, times) == (False, 1)
    assert props == {"TAGS": "T", "UNIQ_KEY": "U1", "RETRY_TOPIC": "orders", "ORIGIN_MESSAGE_ID": "U1"}
    again = message_of_record(record(*record_data_from_send(b"p", props, reconsume_times=16),
                                     topic="%RETRY%g"), HOST)
    dead, props2, times = retry_copy(again, HOST, 16)
    assert (dead, times, props2["RETRY_TOPIC"]) == (True, 17, "orders")
    plain = message_of_record(record(0, b"text", position=777), HOST)
    origin = retry_copy(plain, HOST, 16)[1]["ORIGIN_MESSAGE_ID"]
    assert parse_offset_msg_id(origin) == ("127.0.0.1", 10911, 777)  # no client id: the offset id


@pytest.mark.parametrize("internal", [
    "@BORNHOST\x01evil:80", "@BORNHOST\x011.2.3.4:99999999999", "@BORNHOST\x01::1:-4", "@BORNHOST\x01:",
    "@BORNHOST\x01[" + "1" * 200 + "]:80",
    "@FLAG\x0199999999999", "@RECONSUME\x01-99999999999", "@SYSFLAG\x0199999999999999"])
def test_forged_internal_properties_never_make_a_record_unencodable(internal):
    """A text put may carry any property: a record whose internal ones lie is still served to RocketMQ consumers
    (with those fields at their defaults), never an error that stops every pull of its queue there."""
    flag, data = encode_payload(b"body", "T\x02" + internal + "\x02")
    msg = message_of_record(record(flag, data), HOST)
    decoded, _end = decode_stored_message(stored_message_bytes(msg), check_crc=True)
    assert decoded.body == b"body" and decoded.properties == {"TAGS": "T"}
    assert decoded.born_host == HOST


def test_a_real_born_host_is_kept_v4_and_v6():
    for host, want in (("10.0.0.9:5", ("10.0.0.9", 5)), ("::1:7", ("::1", 7)), ("[fe80::1]:9", ("fe80::1", 9))):
        flag, data = record_data_from_send(b"b", {}, born_host=host)
        assert message_of_record(record(flag, data), HOST).born_host == want


# -- properties past what RocketMQ carries (found by an attack review: one such message failed every pull of its
# queue with SYSTEM_ERROR, and ended the transaction check-back for good) --------------------------------------

from metaq.protocol.rocketmq.bodies import MAX_PROPERTIES_BYTES, encode_stored_message  # noqa: E402
from metaq.server.remoting.limits import PROPERTIES_HEADROOM  # noqa: E402

ROOM = MAX_PROPERTIES_BYTES - PROPERTIES_HEADROOM


def test_a_send_with_properties_up_to_the_room_is_stored_and_one_byte_past_is_refused():
    def send(value_bytes):
        # "KEYS\x01<value>\x02" is the whole attribute: 7 bytes beside the value
        return record_data_from_send(b"b", {"KEYS": "k" * value_bytes})
    flag, data = send(ROOM - 7)
    assert len(decode_payload(flag, data)[0].encode()) == ROOM
    with pytest.raises(RemoteProtocolError, match="properties and tags take %d bytes: at most %d" % (ROOM + 1, ROOM)):
        send(ROOM - 6)


@pytest.mark.parametrize("attribute", ["t" * 40_000, "tag\x02K\x01" + "v" * 40_000 + "\x02small\x01x",
                                       "x" * (MAX_PROPERTIES_BYTES + 1)])
def test_a_stored_message_with_more_properties_is_served_without_its_largest_ones(attribute):
    flag, data = encode_payload(b"the body", attribute)  # a text put's attribute, or an older record's
    msg = message_of_record(record(flag, data), ("127.0.0.1", 10911))
    encoded = encode_stored_message(msg)  # raised ValueError before: every pull of the queue failed
    back, _end = decode_stored_message(encoded)
    assert back.body == b"the body" and back.properties["METAQ_TRIMMED_PROPERTIES"] == "1"
    assert sum(len(k) + len(v) + 2 for k, v in back.properties.items()) <= ROOM
    if "small" in attribute:
        assert back.properties["small"] == "x"  # only the largest went


def test_properties_within_the_room_are_served_whole():
    flag, data = encode_payload(b"b", "tag\x02K\x01" + "v" * (ROOM - 100))
    back, _end = decode_stored_message(encode_stored_message(message_of_record(record(flag, data), ("1.2.3.4", 1))))
    assert back.properties["K"] == "v" * (ROOM - 100) and "METAQ_TRIMMED_PROPERTIES" not in back.properties


def test_properties_are_measured_in_bytes_not_characters():
    """Four-byte characters: the largest value that encodes within the room is served whole, one character more
    is trimmed (a count of characters alone would pass it)."""
    n = (ROOM - 3) // 4  # "K" + the separators: 3 bytes beside the value
    for chars, trimmed in ((n, False), (n + 1, True)):
        flag, data = encode_payload(b"b", "\x02K\x01" + "\U0001F600" * chars)
        back, _end = decode_stored_message(encode_stored_message(message_of_record(record(flag, data), HOST)))
        assert ("METAQ_TRIMMED_PROPERTIES" in back.properties) is trimmed
        assert trimmed or back.properties["K"] == "\U0001F600" * chars
