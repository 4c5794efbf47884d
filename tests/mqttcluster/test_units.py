"""The MQTT cluster's pure parts: the ROUTES and RECORDS frames (whole and byte by byte), the route's aggregation,
the inbox copy and its origin, the resume positions."""

import pytest

from metaq import limits
from metaq.errors import RemoteProtocolError
from metaq.mqtt.records import message_of, record_data
from metaq.mqttcluster import inbox
from metaq.mqttcluster.routes import aggregate
from metaq.mqttcluster.serve import FilterSet
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import MESSAGE, POSITION, RETAINED, Entry
from metaq.protocol.stream import NEED_DATA

ROUTES = rp.Routes(3, ("sensors/#", "+/alarm", "a/b"), (("sensors", 0, 17), ("a", 1, 0)), 5)
RECORDS = rp.Records((Entry(MESSAGE, "sensors", 1, 42, 1, 1700000000000, b"\x00\x00\x00\x02ab-payload"),
                      Entry(POSITION, "sensors", 1, 43),
                      Entry(RETAINED, "%MQTT%", 0, 9, 0, 1700000000001, b"U{\"t\":\"x\"}")))


@pytest.mark.parametrize("event", [ROUTES, RECORDS, rp.Records(())])
def test_frames_round_trip_whole_and_byte_by_byte(event):
    data = rp.serialize(event)
    whole = rp.ReplicationParser()
    whole.receive_data(data)
    assert whole.next_event() == event
    slow = rp.ReplicationParser()
    got = NEED_DATA
    for i in range(len(data)):
        assert got is NEED_DATA
        slow.receive_data(data[i:i + 1])
        got = slow.next_event()
    assert got == event


def test_a_records_frame_that_does_not_fill_itself_is_refused():
    frame = rp.frame_parts(rp.Records(()))  # count 0 ...
    payload = b"\x00\x00\x00\x01"  # ... made count 1 with no entry, its CRC right: only the content is wrong
    head = rp.FRAME_HEADER.pack(rp.MAGIC, rp.VERSION, rp.T_RECORDS, 0, len(payload), 0)[:12]
    crc = rp.crc32(payload, rp.crc32(head))
    p = rp.ReplicationParser()
    p.receive_data(head + crc.to_bytes(4, "big") + payload)
    with pytest.raises(RemoteProtocolError, match="runs past the frame"):
        p.next_event()
    assert frame


def test_routes_bounds():
    too_many = rp.Routes(1, tuple("f%d" % i for i in range(limits.MQTT_CLUSTER_MAX_FILTERS + 1)))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(too_many))
    with pytest.raises(RemoteProtocolError, match="MQTT_CLUSTER_MAX_FILTERS"):
        p.next_event()
    at_limit = rp.Routes(1, tuple("f%d" % i for i in range(limits.MQTT_CLUSTER_MAX_FILTERS)))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(at_limit))
    assert p.next_event() == at_limit


def test_route_aggregation_at_and_past_its_limit():
    filters = ["devices/%d/cmd" % i for i in range(5)] * 3 + ["alerts/#"]
    assert aggregate(filters, most=6) == tuple(sorted(set(filters)))
    assert aggregate(filters, most=5) == ("alerts/#", "devices/#")
    assert aggregate(filters + ["+/x"], most=5) == ("#",)
    assert aggregate(["a%d/x" % i for i in range(4)], most=3) == ("#",)  # whole topics past it too: everything


def test_filter_set_matches_as_mqtt_does():
    fs = FilterSet(["sensors/#", "+/alarm"])
    assert fs.match("sensors") and fs.match("sensors/a/b") and fs.match("door/alarm")
    assert not fs.match("door/open") and not fs.match("$SYS/alarm")
    assert fs.topics(["sensors", "door", "%MQTTIN%", "other"]) == {"sensors", "door", "other"}


def test_inbox_copy_keeps_the_message_and_names_its_origin():
    flag, data = record_data("sensors/r1", b"21.5", 2, "dev-1", {"user_property": [("k", "v")]}, True)
    copy = inbox.copy_of(2, "sensors", 1, 77, flag, data, 1_000)
    m = message_of(inbox.INBOX, *copy)
    assert (m.topic, m.payload, m.qos, m.client_id, m.retain) == ("sensors/r1", b"21.5", 2, "dev-1", True)
    assert m.properties["user_property"] == (("k", "v"),)
    assert inbox.origin_of(*copy) == (2, "sensors", 1, 77)
    plain = inbox.copy_of(1, "sensors", 0, 3, 0, b"from-text", 1_000)  # a text put: topic name = its topic
    m = message_of(inbox.INBOX, *plain)
    assert (m.topic, m.payload, m.qos) == ("sensors", b"from-text", 1)
    expired = record_data("s/x", b"p", 1, None, {"message_expiry_interval": 1}, False, 0)
    assert inbox.copy_of(1, "s", 0, 0, *expired, 5_000) is None


def test_resume_positions_at_and_past_their_limit():
    pos = inbox.Positions(most=2)
    assert pos.copied(1, "t", 0, 5) and pos.copied(1, "t", 0, 3)
    assert pos.get(1, "t", 0) == 6 and pos.is_copied(1, "t", 0, 5) and not pos.is_copied(1, "t", 0, 6)
    assert pos.copied(2, "t", 0, 0)
    assert not pos.copied(3, "t", 0, 0) and pos.refused == 1  # past it: not remembered, said
    assert pos.of(1) == (("t", 0, 6),)
    assert inbox.partition_of(1, "t", 0) == inbox.partition_of(1, "t", 0)
