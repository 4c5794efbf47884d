"""RocketMQ bodies: stored messages checked by an independent decoder written from the reference table,
message ids, properties, batch entries and the JSON bodies."""

import json
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.errors import RemoteProtocolError
from metaq.protocol.rocketmq.bodies import (
    MAGIC_V1,
    MAGIC_V2,
    MAX_PROPERTIES_BYTES,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6,
    BatchEntry,
    BrokerData,
    QueueData,
    StoredMessage,
    create_offset_msg_id,
    decode_batch_messages,
    decode_heartbeat,
    decode_properties,
    decode_stored_message,
    decode_stored_messages,
    encode_batch_messages,
    encode_cluster_info,
    encode_consumer_list,
    encode_properties,
    encode_stored_message,
    encode_topic_route,
    parse_offset_msg_id,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
PROP_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), min_size=1,
                    max_size=20)
PROPS = st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=5)
IPV4 = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255)).map(
    lambda t: "%d.%d.%d.%d" % t)
HOSTS = st.tuples(IPV4, INT32)


# Independent decoder, written from the reference's table (§2.4, IPv4 offsets) -----------------

def reference_decode(record):
    """Read one IPv4 v1 record field by field at the documented offsets."""
    f = {}
    f["total"], = struct.unpack_from(">i", record, 0)
    f["magic"], = struct.unpack_from(">I", record, 4)
    f["crc"], = struct.unpack_from(">i", record, 8)
    f["queue_id"], = struct.unpack_from(">i", record, 12)
    f["flag"], = struct.unpack_from(">i", record, 16)
    f["queue_offset"], = struct.unpack_from(">q", record, 20)
    f["physical_offset"], = struct.unpack_from(">q", record, 28)
    f["sys_flag"], = struct.unpack_from(">i", record, 36)
    f["born_timestamp"], = struct.unpack_from(">q", record, 40)
    f["born_host"] = (".".join(str(b) for b in record[48:52]), struct.unpack_from(">i", record, 52)[0])
    f["store_timestamp"], = struct.unpack_from(">q", record, 56)
    f["store_host"] = (".".join(str(b) for b in record[64:68]), struct.unpack_from(">i", record, 68)[0])
    f["reconsume_times"], = struct.unpack_from(">i", record, 72)
    f["prepared"], = struct.unpack_from(">q", record, 76)
    body_len, = struct.unpack_from(">i", record, 84)
    f["body"] = record[88:88 + body_len]
    pos = 88 + body_len
    topic_len = record[pos]
    f["topic"] = record[pos + 1:pos + 1 + topic_len].decode()
    pos += 1 + topic_len
    prop_len, = struct.unpack_from(">h", record, pos)
    f["properties"] = record[pos + 2:pos + 2 + prop_len].decode()
    f["end"] = pos + 2 + prop_len
    # the consumer-side msgId: bytes 64-71 (store host) and 28-35 (physical offset), upper-case hex
    f["msg_id"] = (record[64:72] + record[28:36]).hex().upper()
    return f


STORED = st.builds(
    StoredMessage,
    topic=st.text(st.sampled_from("abcXYZ019_-%"), min_size=1, max_size=127),
    queue_id=INT32, queue_offset=INT64, physical_offset=INT64, body=st.binary(max_size=300), flag=INT32,
    sys_flag=INT32.map(lambda v: v & ~0x30), born_timestamp=INT64, born_host=HOSTS, store_timestamp=INT64,
    store_host=HOSTS, reconsume_times=INT32, prepared_transaction_offset=INT64, properties=PROPS,
)


@settings(max_examples=300, deadline=None)
@given(STORED)
def test_stored_message_matches_the_reference_layout(msg):
    record = encode_stored_message(msg)
    f = reference_decode(record)
    assert f["total"] == len(record) == f["end"]
    assert f["magic"] == 0xDAA320A7
    assert f["crc"] == zlib.crc32(msg.body) & 0x7FFFFFFF
    assert (f["queue_id"], f["flag"], f["queue_offset"], f["physical_offset"], f["sys_flag"]) == (
        msg.queue_id, msg.flag, msg.queue_offset, msg.physical_offset, msg.sys_flag)
    assert (f["born_timestamp"], f["born_host"], f["store_timestamp"], f["store_host"]) == (
        msg.born_timestamp, msg.born_host, msg.store_timestamp, msg.store_host)
    assert (f["reconsume_times"], f["prepared"], f["body"], f["topic"]) == (
        msg.reconsume_times, msg.prepared_transaction_offset, msg.body, msg.topic)
    assert f["properties"] == "".join("%s\x01%s\x02" % kv for kv in msg.properties.items())
    assert f["msg_id"] == create_offset_msg_id(*msg.store_host, msg.physical_offset)
    assert decode_stored_message(record, check_crc=True) == (msg, len(record))


@settings(max_examples=100, deadline=None)
@given(st.lists(STORED, max_size=4))
def test_pull_body_is_records_back_to_back(msgs):
    body = b"".join(encode_stored_message(m) for m in msgs)
    assert decode_stored_messages(body, check_crc=True) == msgs


def test_known_record_bytes():
    msg = StoredMessage("T", 1, 5, 1000, b"hi", flag=0, sys_flag=0, born_timestamp=7, born_host=("10.0.0.2", 5555),
                        store_timestamp=8, store_host=("127.0.0.1", 10911), properties={"TAGS": "A"})
    record = encode_stored_message(msg)
    expected = (struct.pack(">iiiiiqqiq", 91 + 2 + 1 + 7, -626843481, zlib.crc32(b"hi") & 0x7FFFFFFF,
                            1, 0, 5, 1000, 0, 7)
                + bytes([10, 0, 0, 2]) + struct.pack(">iq", 5555, 8) + bytes([127, 0, 0, 1])
                + struct.pack(">iiqi", 10911, 0, 0, 2) + b"hi" + b"\x01T" + struct.pack(">h", 7) + b"TAGS\x01A\x02")
    assert record == expected
    assert MAGIC_V1 == -626843481


def test_long_topic_uses_v2_magic_and_two_byte_length():
    msg = StoredMessage("t" * 200, 0, 0, 0, b"x")
    record = encode_stored_message(msg)
    assert struct.unpack_from(">i", record, 4)[0] == MAGIC_V2
    assert struct.unpack_from(">h", record, 88 + 1)[0] == 200  # after BODYLEN and the 1-byte body
    assert decode_stored_message(record)[0].topic == "t" * 200


def test_ipv6_hosts_set_sysflag_bits_and_ipv4_clears_them():
    msg = StoredMessage("T", 0, 0, 9, b"", sys_flag=SYSFLAG_COMPRESSED | SYSFLAG_BORNHOST_V6,
                        born_host=("::1", 1), store_host=("2001:db8::7", 10911))
    decoded, _ = decode_stored_message(encode_stored_message(msg))
    assert decoded.sys_flag == SYSFLAG_COMPRESSED | SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
    assert decoded.born_host == ("::1", 1) and decoded.store_host == ("2001:db8::7", 10911)
    v4 = encode_stored_message(msg._replace(born_host=("1.2.3.4", 1), store_host=("1.2.3.4", 2)))
    assert reference_decode(v4)["sys_flag"] == SYSFLAG_COMPRESSED


def test_stored_message_encoder_rejects_what_it_cannot_carry():
    with pytest.raises(ValueError):
        encode_stored_message(StoredMessage("T", 0, 0, 0, b"", properties={"k": "v" * MAX_PROPERTIES_BYTES}))
    with pytest.raises(ValueError):
        encode_stored_message(StoredMessage("T", 0, 0, 0, b"", store_host=("localhost", 1)))
    # a pre-encoded properties string is written as is
    record = encode_stored_message(StoredMessage("T", 0, 0, 0, b"", properties="A\x01b\x02"))
    assert reference_decode(record)["properties"] == "A\x01b\x02"


def test_malformed_records():
    good = encode_stored_message(StoredMessage("T", 0, 0, 0, b"body", properties={"a": "b"}))
    cases = [good[:40], good[:-1], good[:4] + b"\x00\x00\x00\x00" + good[8:],
             struct.pack(">i", 90) + good[4:], struct.pack(">i", len(good) + 1) + good[4:] + b"\x00",
             good[:84] + struct.pack(">i", 1000) + good[88:], good[:84] + struct.pack(">i", -1) + good[88:]]
    for data in cases:
        with pytest.raises(RemoteProtocolError):
            decode_stored_messages(data)
    bad_crc = good[:8] + b"\x00\x00\x00\x01" + good[12:]
    assert decode_stored_message(bad_crc)[0].body == b"body"
    with pytest.raises(RemoteProtocolError):
        decode_stored_message(bad_crc, check_crc=True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 199))
def test_random_record_bytes_raise_only_protocol_errors(data, flip):
    good = encode_stored_message(StoredMessage("T", 0, 0, 0, b"body", properties={"a": "b"}))
    for candidate in (data, good[:flip] + data[:4] + good[flip + 4:]):
        try:
            decode_stored_messages(candidate)
        except RemoteProtocolError:
            pass


# Message ids ------------------------------------------------------------------------------


def test_offset_msg_id_reference_example():
    assert create_offset_msg_id("127.0.0.1", 10911, 0) == "7F00000100002A9F0000000000000000"
    assert parse_offset_msg_id("7F00000100002A9F0000000000000000") == ("127.0.0.1", 10911, 0)
    assert parse_offset_msg_id("7f00000100002a9f00000000000003e8") == ("127.0.0.1", 10911, 1000)


def test_ipv6_offset_msg_id_is_56_hex_digits():
    msg_id = create_offset_msg_id("2001:db8::1", 10911, 2**40)
    assert len(msg_id) == 56 and msg_id == msg_id.upper()
    assert parse_offset_msg_id(msg_id) == ("2001:db8::1", 10911, 2**40)


@pytest.mark.parametrize("bad", ["", "7F", "Z" * 32, "7F 0000100002A9F0000000000000000", "é" * 32, "0" * 33])
def test_bad_msg_ids(bad):
    with pytest.raises(RemoteProtocolError):
        parse_offset_msg_id(bad)


@given(IPV4, INT32, INT64)
def test_msg_id_round_trip(ip, port, offset):
    assert parse_offset_msg_id(create_offset_msg_id(ip, port, offset)) == (ip, port, offset)


# Properties ---------------------------------------------------------------------------------


def test_properties_format():
    assert encode_properties({"TAGS": "A", "KEYS": "k1 k2", "x": None}) == "TAGS\x01A\x02KEYS\x01k1 k2\x02"
    assert decode_properties("TAGS\x01A\x02KEYS\x01k1 k2\x02") == {"TAGS": "A", "KEYS": "k1 k2"}
    assert decode_properties("TAGS\x01A\x02KEYS\x01k") == {"TAGS": "A", "KEYS": "k"}  # last \x02 optional
    assert decode_properties("") == {} and encode_properties({}) == ""
    # items without a separator, or with an empty key or value, are skipped (Java does the same)
    assert decode_properties("junk\x02\x01v\x02k\x01\x02a\x01b\x01c\x02\x02") == {"a": "b\x01c"}


@pytest.mark.parametrize("props", [{"": "v"}, {"k": ""}, {"k\x01": "v"}, {"k": "v\x02"}, {"k": 1}])
def test_properties_that_cannot_round_trip_are_refused(props):
    with pytest.raises(ValueError):
        encode_properties(props)


@given(PROPS)
def test_properties_round_trip(props):
    assert decode_properties(encode_properties(props)) == props


# Batch ---------------------------------------------------------------------------------------


def test_batch_layout_and_round_trip():
    entries = [BatchEntry(b"one", 1, {"TAGS": "A"}), BatchEntry(b"", 0, {})]
    data = encode_batch_messages(entries)
    assert data[:20] == struct.pack(">iiiii", 20 + 3 + 2 + 7, 0, 0, 1, 3)
    assert decode_batch_messages(data) == entries


@given(st.lists(st.builds(BatchEntry, st.binary(max_size=50), INT32, PROPS), max_size=4))
def test_batch_round_trip(entries):
    assert decode_batch_messages(encode_batch_messages(entries)) == entries


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=100))
def test_batch_garbage_gives_protocol_errors_with_the_opaque(data):
    try:
        decode_batch_messages(data, opaque=42)
    except RemoteProtocolError as exc:
        assert exc.opaque == 42 and not exc.fatal


# JSON bodies -----------------------------------------------------------------------------------

REFERENCE_ROUTE = (b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a",'
                   b'"cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},'
                   b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
                   b'"writeQueueNums":4}]}')


def test_topic_route_matches_the_reference_example():
    body = encode_topic_route([BrokerData("broker-a", {0: "127.0.0.1:10911"})], [QueueData("broker-a", 4, 4)])
    assert body == REFERENCE_ROUTE
    route = json.loads(body)
    assert route["brokerDatas"][0]["brokerName"] == route["queueDatas"][0]["brokerName"]
    assert isinstance(route["queueDatas"][0]["perm"], int)  # jsoncpp asInt() needs numbers
    assert json.loads(encode_topic_route([], [], "broker-a:4"))["orderTopicConf"] == "broker-a:4"


def test_cluster_info_and_consumer_list():
    info = json.loads(encode_cluster_info([BrokerData("b", {0: "h:1"}, "C")]))
    assert info == {"brokerAddrTable": {"b": {"brokerAddrs": {"0": "h:1"}, "brokerName": "b", "cluster": "C",
                                              "enableActingMaster": False}},
                    "clusterAddrTable": {"C": ["b"]}}
    assert encode_consumer_list(["1.2.3.4@9", "x@1"]) == b'{"consumerIdList":["1.2.3.4@9","x@1"]}'


def test_heartbeat_java_form():
    body = json.dumps({
        "clientID": "192.0.2.2@19650",
        "consumerDataSet": [{"groupName": "CG", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                             "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                             "subscriptionDataSet": [{"topic": "T", "subString": "*", "classFilterMode": False,
                                                      "tagsSet": [], "codeSet": [], "subVersion": 1795324130575,
                                                      "expressionType": "TAG"}]}],
        "producerDataSet": [{"groupName": "PG"}], "heartbeatFingerprint": 0, "isWithoutSub": False}).encode()
    hb = decode_heartbeat(body)
    assert hb.client_id == "192.0.2.2@19650" and hb.producer_groups == ("PG",)
    (c,) = hb.consumers
    assert (c.group_name, c.consume_type, c.message_model, c.consume_from_where) == (
        "CG", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET")
    assert c.subscriptions[0].sub_version == 1795324130575 and c.subscriptions[0].topic == "T"


def test_heartbeat_cpp_form_with_ordinals_and_string_sub_version():
    body = (b'{"clientID":"127.0.0.1@123#DEFAULT","consumerDataSet":[{"groupName":"CG_CPP","consumeType":1,'
            b'"messageModel":1,"consumeFromWhere":0,"unitMode":false,"subscriptionDataSet":[{"topic":"TopicCpp",'
            b'"subString":"TagA || TagB","subVersion":"1795324130575","tagsSet":["TagA","TagB"]}]}]}\n')
    hb = decode_heartbeat(body)
    assert hb.producer_groups == ()
    (c,) = hb.consumers
    assert (c.consume_type, c.message_model, c.consume_from_where) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    sub = c.subscriptions[0]
    assert (sub.sub_string, sub.sub_version, sub.tags) == ("TagA || TagB", 1795324130575, ("TagA", "TagB"))


@pytest.mark.parametrize("body", [b"", b"[]", b"{}", b'{"clientID":1}', b"\xff", b"[" * 100000])
def test_bad_heartbeat(body):
    with pytest.raises(RemoteProtocolError) as info:
        decode_heartbeat(body, opaque=3)
    assert info.value.opaque == 3


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(
                        st.sampled_from(["clientID", "consumerDataSet", "groupName", "subscriptionDataSet",
                                         "topic", "tagsSet", "subVersion", "producerDataSet", "consumeType"]),
                        c, max_size=4), max_leaves=15))
def test_heartbeat_any_json_gives_data_or_protocol_error(value):
    try:
        decode_heartbeat(json.dumps(value).encode())
    except RemoteProtocolError:
        pass


# -- a heartbeat's names are kept and sent back: bounded (an attack review grew the broker 350 MB with 40
# heartbeats of 8 MiB client ids) --------------------------------------------------------------------------------

from metaq import limits  # noqa: E402
from metaq.server.remoting import limits as remoting_limits  # noqa: E402


@pytest.mark.parametrize("field, most", [("clientID", remoting_limits.MAX_CLIENT_ID_BYTES),
                                         ("consumer", limits.MAX_NAME_BYTES), ("producer", limits.MAX_NAME_BYTES)])
def test_a_heartbeat_name_at_its_limit_is_taken_and_one_byte_past_is_refused(field, most):
    def body(size):
        obj = {"clientID": "c", "consumerDataSet": [{"groupName": "g"}], "producerDataSet": [{"groupName": "p"}]}
        if field == "clientID":
            obj["clientID"] = "i" * size
        else:
            obj["%sDataSet" % field][0]["groupName"] = "n" * size
        return json.dumps(obj).encode()
    hb = decode_heartbeat(body(most))
    assert most in (len(hb.client_id), len(hb.consumers[0].group_name), len(hb.producer_groups[0]))
    with pytest.raises(RemoteProtocolError, match="of %d bytes: it must be 1..%d" % (most + 1, most)) as info:
        decode_heartbeat(body(most + 1), opaque=5)
    assert info.value.opaque == 5 and not info.value.fatal  # answered, the connection kept


def test_an_empty_client_id_is_refused():
    with pytest.raises(RemoteProtocolError, match="clientID of 0 bytes"):
        decode_heartbeat(b'{"clientID": ""}')
