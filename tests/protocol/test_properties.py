"""The stored message format's attribute codec (``protocol.properties``): tables of inputs, bad input refused
clearly, and records written before the codec had its own module read the same."""

import struct

import pytest

from metaq.keys.files import data_keys
from metaq.protocol.compression import sys_flag_of
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.properties import (
    PROP_KEYS,
    PROP_SYSFLAG,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    SYSFLAG_MARK,
    compression_bits,
    decode_properties,
    encode_attribute,
    encode_properties,
    pop_int,
    record_properties,
    shown_tags,
    split_attribute,
    without_compression,
)
from metaq.protocol.rocketmq.mapping import RecordFields, message_of_record, record_data_from_send


@pytest.mark.parametrize("props,text", [
    ({}, ""),
    ({"a": "1"}, "a\x011\x02"),
    ({"KEYS": "k1 k2", "UNIQ_KEY": "ID"}, "KEYS\x01k1 k2\x02UNIQ_KEY\x01ID\x02"),
    ({"a": "1", "skipped": None}, "a\x011\x02"),
    ({"ключ": "значение"}, "ключ\x01значение\x02"),
])
def test_properties_encode_and_decode_back(props, text):
    assert encode_properties(props) == text
    assert decode_properties(text) == {k: v for k, v in props.items() if v is not None}


@pytest.mark.parametrize("props,says", [
    ({"": "v"}, "cannot be encoded"),
    ({"k": ""}, "cannot be encoded"),
    ({"k\x01": "v"}, "cannot be encoded"),
    ({"k": "v\x02"}, "cannot be encoded"),
    ({"k": 1}, "must be text"),
    ({1: "v"}, "must be text"),
])
def test_a_property_that_would_not_decode_back_is_refused(props, says):
    with pytest.raises(ValueError, match=says):
        encode_properties(props)


@pytest.mark.parametrize("text,props", [
    ("", {}),
    (None, {}),
    ("a\x011", {"a": "1"}),  # the last pair may lack its \x02
    ("a\x011\x02junk\x02\x01v\x02k\x01\x02b\x01x\x01y\x02", {"a": "1", "b": "x\x01y"}),  # Java's leniency
])
def test_properties_decode_as_java_reads_them(text, props):
    assert decode_properties(text) == props


@pytest.mark.parametrize("tags,props,attribute", [
    (None, {}, "\x02"),
    ("TagA", {}, "TagA\x02"),
    ("TagA", {"KEYS": "k"}, "TagA\x02KEYS\x01k\x02"),
    (None, {"UNIQ_KEY": "ID"}, "\x02UNIQ_KEY\x01ID\x02"),
])
def test_attribute_encodes_and_splits_back(tags, props, attribute):
    assert encode_attribute(tags, props) == attribute
    assert split_attribute(attribute) == (tags, props, True)


@pytest.mark.parametrize("attribute,split", [
    (None, (None, {}, False)),
    ("plain", ("plain", {}, False)),  # a text put's attribute: its tags alone
    ("", ("", {}, False)),
    ("\x02", (None, {}, True)),
])
def test_plain_and_empty_attributes_split(attribute, split):
    assert split_attribute(attribute) == split


def test_bad_attribute_input_is_refused_clearly():
    with pytest.raises(ValueError, match="separator"):
        encode_attribute("a\x02b", {})
    with pytest.raises(ValueError, match="cannot be encoded"):
        encode_attribute("t", {"k": ""})
    with pytest.raises(TypeError, match="an attribute is text"):
        split_attribute(b"TagA\x02")


@pytest.mark.parametrize("attribute,props", [
    (None, {}),
    ("TagA", {PROP_TAGS: "TagA"}),
    ("TagA\x02KEYS\x01k\x02", {PROP_TAGS: "TagA", PROP_KEYS: "k"}),
    ("\x02a\x011\x02", {"a": "1"}),
    ("bad\x01tag", {}),  # tags holding a separator are not shown
])
def test_record_properties_what_a_consumer_and_a_filter_see(attribute, props):
    assert record_properties(attribute) == props


@pytest.mark.parametrize("text,shown", [(None, None), ("", None), ("A", "A"), ("A\x01", None), ("A||B", "A||B")])
def test_shown_tags(text, shown):
    assert shown_tags(text) == shown


@pytest.mark.parametrize("value,number", [(None, 0), ("7", 7), ("-3", -3), ("x", 0), (str(2**31), 0),
                                          (str(-2**31), -2**31)])
def test_pop_int_takes_the_property_out(value, number):
    props = {"@X": value} if value is not None else {}
    assert pop_int(props, "@X") == number
    assert props == {}


def test_compression_bits_come_out_of_an_attribute():
    bits = sys_flag_of("zlib")
    attribute = encode_attribute("T", {PROP_SYSFLAG: str(bits | 2), "a": "1"})
    assert SYSFLAG_MARK in attribute.encode()
    assert compression_bits(attribute) == bits
    assert without_compression(attribute) == encode_attribute("T", {"a": "1", PROP_SYSFLAG: "2"})
    assert without_compression(encode_attribute(None, {PROP_SYSFLAG: str(bits)})) is None
    assert compression_bits("plain@SYSFLAG") == 0 and compression_bits(None) == 0


#: A record's data as a RocketMQ send stored it before the stored format had its own module: the attribute
#: block (int32 length, then tags, \x02, KEYS, UNIQ_KEY, @FLAG) and the payload. These bytes are on disk in data
#: directories written then; they must read the same.
_ATTRIBUTE = "TagA\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01ID1\x02@FLAG\x017\x02"
OLD_DATA = struct.pack(">i", len(_ATTRIBUTE)) + _ATTRIBUTE.encode() + b"hello"


def test_a_record_written_the_old_way_reads_the_same():
    attribute, payload = decode_payload(1, OLD_DATA)
    assert payload == b"hello"
    assert split_attribute(attribute) == ("TagA", {"KEYS": "k1 k2", "UNIQ_KEY": "ID1", "@FLAG": "7"}, True)
    assert record_properties(attribute)[PROP_KEYS] == "k1 k2"
    assert sorted(data_keys(1, OLD_DATA)) == [b"ID1", b"k1", b"k2"]  # the key index reads it the same
    msg = message_of_record(RecordFields("t", 0, 0, 0, 1, OLD_DATA, 1, 2), ("127.0.0.1", 8123))
    assert (msg.body, msg.flag) == (b"hello", 7)
    assert msg.properties == {PROP_TAGS: "TagA", PROP_KEYS: "k1 k2", PROP_UNIQ_KEY: "ID1"}


def test_the_same_message_is_written_to_the_same_bytes():
    """A RocketMQ send and a direct encode of the same message give the old bytes, byte for byte."""
    sent = record_data_from_send(b"hello", {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ID1"}, flag=7)
    assert sent == (1, OLD_DATA)
    assert encode_payload(b"hello", encode_attribute("TagA", {"KEYS": "k1 k2", "UNIQ_KEY": "ID1", "@FLAG": "7"})) \
        == (1, OLD_DATA)
