"""An MQTT message in a metaq record and back (metaq/mqtt/records.py; docs/mqtt.md "Topics")."""

import base64
import zlib

import pytest

from metaq.client.message import Message
from metaq.mqtt.records import (PLAIN_QOS, RecordRefusal, message_of, partition_for, placement, record_data,
                                stored_message)
from metaq.mqtt.topicmap import DEFAULT_MAP, TopicMap
from metaq.protocol.message import Record, encode_payload
from metaq.protocol.rocketmq.mapping import record_data_from_send


def test_placement_is_the_topic_maps_and_refuses_only_dollar_names_and_record_separators():
    assert placement(DEFAULT_MAP, "sensors/room1/temp") == ("sensors", zlib.crc32(b"sensors/room1/temp"))
    assert placement(DEFAULT_MAP, "plain")[0] == "plain"
    for fallback in ("/leading/slash", "caf\u00e9/x", "a b/c"):
        assert placement(DEFAULT_MAP, fallback)[0] == "mqtt"
    for bad in ("$SYS/uptime", "$x"):
        with pytest.raises(RecordRefusal) as exc:
            placement(DEFAULT_MAP, bad)
        assert exc.value.what == "topic"


def test_a_record_is_its_names_message_only_in_a_topic_the_map_puts_the_name_in():
    ruled = TopicMap([{"filter": "/devices/#", "topic": "devices"}])
    flag, data = record_data("/devices/1/up", b"v", 1, "d1", None)
    assert message_of("devices", flag, data, ruled).topic == "/devices/1/up"
    assert message_of("mqtt", flag, data, ruled).topic == "/devices/1/up"  # the default rule's: written before
    assert message_of("other", flag, data, ruled).topic == "other"  # a name forged into another topic
    flag, data = record_data("sensors/x", b"v", 1, "d1", None)
    assert message_of("sensors", flag, data, ruled).topic == "sensors/x"
    assert message_of("devices", flag, data, ruled).topic == "devices"


def test_the_partition_is_the_crc32_of_the_whole_name_and_stable():
    assert partition_for("sensors/a", 1) == 0
    assert partition_for("sensors/a", 4) == partition_for("sensors/a", 4)
    assert partition_for("sensors/room1/temp", 7) == zlib.crc32(b"sensors/room1/temp") % 7


def test_a_record_keeps_the_name_qos_and_mqtt5_properties_and_gives_them_back():
    props = {"content_type": "application/json", "response_topic": "replies/x", "correlation_data": b"\x00\x01\xff",
             "payload_format_indicator": 1, "user_property": (("k", "v"), ("k", "w\x01\x02"), ("\u00e9", ""))}
    flag, data = record_data("sensors/room1", b"{}", 2, "dev-1", props)
    m = message_of("sensors", flag, data)
    assert (m.topic, m.qos, m.client_id, m.payload) == ("sensors/room1", 2, "dev-1", b"{}")
    assert m.properties == props
    # the Python client (and RocketMQ consumers) see them as properties
    msg = Message.from_record("sensors", 0, 0, Record(1, flag, data, 0))
    assert msg.body == b"{}" and msg.properties["MQTT_TOPIC"] == "sensors/room1"
    assert msg.properties["MQTT_QOS"] == "2" and msg.properties["MQTT_CONTENT_TYPE"] == "application/json"


@pytest.mark.parametrize("properties", [
    {}, {"content_type": "", "payload_format_indicator": 0, "user_property": ()},
    {"content_type": "a/b", "response_topic": "r/t", "correlation_data": b"\x00c", "payload_format_indicator": 1,
     "user_property": (("k", "v"), ("k", "w"), ("\u00e9", "")), "message_expiry_interval": 30, "topic_alias": 3},
    {"message_expiry_interval": 0}], ids=["none", "empty", "all", "expiry"])
def test_the_message_a_publisher_has_is_the_one_its_record_gives_back(properties):
    """What a subscriber served from the publisher's turn gets (``stored_message``) is what one served from the log
    gets: the properties a record keeps, no others."""
    for client_id in ("", "c1"):
        for qos in (0, 1, 2):
            for retain in (False, True):
                flag, data = record_data("t/x", b"body", qos, client_id, properties, retain, 5000)
                assert stored_message("t/x", b"body", qos, client_id, properties, retain, 5000) == \
                    message_of("t", flag, data)


@pytest.mark.parametrize("properties", [None, {"content_type": "t"}], ids=["plain", "v5"])
def test_a_name_holding_a_record_separator_is_kept_in_base64_and_given_back(properties):
    for name in ("a\x01b/c", "/x\x02", "\x01"):
        flag, data = record_data(name, b"p", 1, "dev", properties, True)
        m = message_of("mqtt", flag, data)
        assert (m.topic, m.payload, m.retain) == (name, b"p", True)
        msg = Message.from_record("mqtt", 0, 0, Record(1, flag, data, 0))
        assert "MQTT_TOPIC" not in msg.properties
        assert msg.properties["MQTT_TOPIC_B64"] == base64.b64encode(name.encode()).decode()
    # a record written before (MQTT_TOPIC, never MQTT_TOPIC_B64) reads as it did
    flag, data = encode_payload(b"old", "\x02MQTT_TOPIC\x01sensors/a\x02MQTT_QOS\x011\x02")
    assert message_of("sensors", flag, data)[:4] == ("sensors/a", 1, None, b"old")
    flag, data = encode_payload(b"bad", "\x02MQTT_TOPIC_B64\x01not base64!\x02")
    assert message_of("mqtt", flag, data).topic == "mqtt"  # one that does not decode: the topic's plain message


def test_a_field_holding_a_record_separator_is_refused():
    with pytest.raises(RecordRefusal) as exc:
        record_data("sensors/a", b"", 0, "dev", {"content_type": "a\x02b"})
    assert exc.value.what == "content type"


def test_a_record_put_over_another_protocol_is_its_topic_at_qos_1_with_its_properties():
    m = message_of("orders", *encode_payload(b"hello", None))
    assert (m.topic, m.qos, m.client_id, m.payload, m.properties) == ("orders", PLAIN_QOS, None, b"hello", {})
    flag, data = record_data_from_send(b"rmq", {"KEYS": "k1", "color": "red"}, flag=3)
    m = message_of("orders", flag, data)
    assert m.payload == b"rmq" and dict(m.properties["user_property"]) == {"KEYS": "k1", "color": "red"}
    # a record whose MQTT_TOPIC names another topic (forged by a text put) is its own topic's
    flag, data = record_data("other/x", b"p", 1, None, {})
    assert message_of("orders", flag, data).topic == "orders"


def test_a_publish_without_properties_is_stored_alike_every_time_and_a_bad_client_id_refused_every_time():
    """The attribute of a PUBLISH without MQTT 5 properties is remembered (the hot path of a device's publishes):
    the record is the one the full mapping writes, and a refusal is never remembered as an answer."""
    for retain in (False, True):
        for _ in range(2):
            flag, data = record_data("sensors/room1", b"21.5", 1, "dev-1", {}, retain)
            assert (flag, data) == record_data("sensors/room1", b"21.5", 1, "dev-1", {"payload_format_indicator": 0},
                                               retain)
            m = message_of("sensors", flag, data)
            assert (m.topic, m.qos, m.client_id, m.payload, m.retain) == ("sensors/room1", 1, "dev-1", b"21.5", retain)
    for _ in range(2):
        with pytest.raises(RecordRefusal):
            record_data("sensors/room1", b"x", 0, "dev\x01", {})


def test_the_deliveries_keep_at_most_mqtt_shared_decodes_records_decoded_and_publishes_encoded():
    from metaq.mqtt.limits import MQTT_SHARED_DECODES, MQTT_SHARED_DECODES_BYTES
    from metaq.mqtt import wire
    from metaq.mqtt.decoded import Decoded

    d = Decoded()
    assert (d.count, d.nbytes) == (MQTT_SHARED_DECODES, MQTT_SHARED_DECODES_BYTES)
    flag, data = record_data("t/x", b"body", 0, "dev", {})
    for i in range(MQTT_SHARED_DECODES):
        d.packet((i, i), d.message((i, i), "t", flag, data), False, wire.MQTT_5)
    first = d.message((0, 0), "t", flag, data)
    assert first.topic == "t/x" and first.payload == b"body"
    assert len(d._messages) == len(d._packets) == MQTT_SHARED_DECODES  # at the limit: all kept
    assert d.message((0, 0), "t", flag, data) is first
    d.message((MQTT_SHARED_DECODES, 0), "t", flag, data)  # one past: the oldest goes
    d.packet((MQTT_SHARED_DECODES, 0), first, False, wire.MQTT_5)
    assert len(d._messages) == len(d._packets) == MQTT_SHARED_DECODES
    assert (0, 0) not in d._messages and (0, 0, False, wire.MQTT_5) not in d._packets
    assert d.packet((1, 1), first, False, wire.MQTT_5) == wire.encode(
        wire.Publish("t/x", b"body", 0, False, False, None, {}), wire.MQTT_5)


def test_the_deliveries_keep_at_most_mqtt_shared_decodes_bytes_of_payloads():
    from metaq.mqtt.limits import MQTT_SHARED_DECODES_BYTES
    from metaq.mqtt.decoded import Decoded

    d = Decoded()
    quarter = MQTT_SHARED_DECODES_BYTES // 4
    big = [record_data("t/x", bytes([i]) * quarter, 0, "dev", {}) for i in range(5)]
    for i in range(4):  # at the limit: all four kept
        d.message((i, 0), "t", *big[i])
    assert len(d._messages) == 4 and d._messages.held == MQTT_SHARED_DECODES_BYTES
    d.message((4, 0), "t", *big[4])  # one past: the oldest goes
    assert len(d._messages) == 4 and (0, 0) not in d._messages and (4, 0) in d._messages
    assert d._messages.held == MQTT_SHARED_DECODES_BYTES
    flag, data = record_data("t/x", b"y" * (MQTT_SHARED_DECODES_BYTES + 1), 0, "dev", {})
    assert d.message((5, 0), "t", flag, data).payload == b"y" * (MQTT_SHARED_DECODES_BYTES + 1)
    assert (5, 0) not in d._messages and len(d._messages) == 4  # larger than the whole bound alone: not kept


def test_what_is_kept_per_topic_name_is_kept_only_for_names_up_to_the_bound():
    """Names may be 65,535 bytes: 4,096 remembered attributes and placements of such names, and 32 staging plans on
    each connection, would hold hundreds of MiB. A name up to ``MQTT_KEPT_NAME`` characters is kept; one past is
    encoded, placed and staged at each message, with the same result."""
    from metaq.mqtt.limits import MQTT_KEPT_NAME
    from metaq.mqtt.publishes import remember_plan
    from metaq.mqtt.records import _plain_attribute
    topics = TopicMap()
    at, past = "k/" + "a" * (MQTT_KEPT_NAME - 2), "k/" + "b" * (MQTT_KEPT_NAME - 1)
    for name, kept in ((at, True), (past, False)):
        before = _plain_attribute.cache_info()
        first = record_data(name, b"v", 1, "bound-client", None)
        assert record_data(name, b"v", 1, "bound-client", None) == first
        after = _plain_attribute.cache_info()
        assert (after.hits - before.hits, after.misses - before.misses) == ((1, 1) if kept else (0, 0)), name
        placed_before = topics._placed.cache_info().currsize
        assert topics.place(name) == ("k", zlib.crc32(name.encode()))
        assert message_of("k", *first, topics).topic == name
        assert topics._placed.cache_info().currsize == placed_before + (1 if kept else 0)
        plans = {}
        remember_plan(plans, topics, name, "bound-client")
        assert (name.encode() in plans) is kept
