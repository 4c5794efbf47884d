"""The MQTT codec (metaq.mqtt.wire): every control packet of MQTT 3.1.1 and 5.0 round-tripped, the specification's own
bytes parsed, and every malformed input refused with the reason code a server answers with."""

import pytest

from metaq.errors import RemoteProtocolError
from metaq.mqtt.limits import MQTT_MAX_PACKET_BYTES
from metaq.mqtt import wire
from metaq.mqtt.wire import (MQTT_5, MQTT_311, Auth, Connack, Connect, Disconnect, MqttError, MqttParser, PingReq,
                             PingResp, PubAck, PubComp, PubRec, PubRel, Publish, Suback, Subscribe, Subscription,
                             Unsuback, Unsubscribe, Will, encode, encode_varint, refusal)
from metaq.protocol.stream import CLOSED, NEED_DATA

MALFORMED, PROTOCOL = 0x81, 0x82


def parse_all(data, version=None, sender=None, max_packet=MQTT_MAX_PACKET_BYTES, eof=True):
    p = MqttParser(version, max_packet, sender)
    p.receive_data(data)
    if eof:
        p.receive_data(b"")
    out = []
    while True:
        event = p.next_event()
        if event is NEED_DATA or event is CLOSED:
            return out
        out.append(event)


def refused(data, version=None, sender=None, **kw):
    with pytest.raises(MqttError) as info:
        parse_all(data, version, sender, **kw)
    return info.value


def s(text):
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def packet(first, body):
    return bytes((first,)) + encode_varint(len(body)) + body


CONNECT_5_HEAD = s("MQTT") + b"\x05"


def connect5(flags=0x02, props=b"\x00", payload=None):
    return packet(0x10, CONNECT_5_HEAD + bytes((flags,)) + b"\x00\x3c" + props + (payload if payload is not None
                                                                                  else s("c")))


def connect311(flags=0x02, payload=None):
    return packet(0x10, s("MQTT") + b"\x04" + bytes((flags,)) + b"\x00\x3c" + (payload if payload is not None
                                                                              else s("c")))


def after_connect(version, data, sender="client"):
    head = encode(Connect(version, "c"), version)
    return refused(head + data, None, sender)


# -- round trips -------------------------------------------------------------------------------------------------

WILL5 = Will("dev/1/status", b"offline", 1, True,
             {"will_delay_interval": 30, "payload_format_indicator": 1, "message_expiry_interval": 60,
              "content_type": "text/plain", "response_topic": "dev/1/reply", "correlation_data": b"\x00\x01",
              "user_property": (("a", "1"), ("a", "2"))})

CLIENT_5 = [
    Connect(MQTT_5, "dev-1", False, 120, "user", b"\x00pass\xff", WILL5,
            {"session_expiry_interval": 0xFFFFFFFF, "receive_maximum": 20, "maximum_packet_size": 1 << 20,
             "topic_alias_maximum": 10, "request_response_information": 1, "request_problem_information": 0,
             "user_property": (("k", "v"),), "authentication_method": "SCRAM-SHA-1", "authentication_data": b"x"}),
    Publish("a/b", b"", 0),
    Publish("a/b", b"payload", 1, True, False, 1, {"message_expiry_interval": 5, "topic_alias": 3,
                                                   "payload_format_indicator": 0, "content_type": "json",
                                                   "response_topic": "r/1", "correlation_data": b"c",
                                                   "user_property": (("x", "y"), ("x", "y"))}),
    Publish("", b"aliased", 2, False, True, 65535, {"topic_alias": 3}),
    PubAck(1), PubAck(2, 0x10, {"reason_string": "nobody", "user_property": (("a", "b"),)}),
    PubRec(3), PubRec(4, 0x97), PubRel(5), PubRel(6, 0x92, {"reason_string": "gone"}), PubComp(7),
    PubComp(8, 0x92),
    Subscribe(9, (Subscription("a/+", 0), Subscription("b/#", 1, True, True, 1),
                  Subscription("$share/g/c", 2, False, False, 2)),
              {"subscription_identifier": 268_435_455, "user_property": (("s", "t"),)}),
    Unsubscribe(10, ("a/+", "$share/g/c"), {"user_property": (("u", "v"),)}),
    PingReq(),
    Auth(0x18, {"authentication_method": "SCRAM-SHA-1", "authentication_data": b"\x01\x02",
                "reason_string": "go on", "user_property": (("a", "b"),)}),
    Auth(),
    Disconnect(0x04, {"session_expiry_interval": 0, "reason_string": "bye", "user_property": (("a", "b"),)}),
]

SERVER_5 = [
    Connack(True, 0, {"session_expiry_interval": 10, "receive_maximum": 100, "maximum_qos": 1,
                      "retain_available": 0, "maximum_packet_size": 65536, "assigned_client_identifier": "auto-1",
                      "topic_alias_maximum": 5, "reason_string": "ok", "user_property": (("a", "b"),),
                      "wildcard_subscription_available": 1, "subscription_identifier_available": 0,
                      "shared_subscription_available": 1, "server_keep_alive": 60, "response_information": "r/",
                      "server_reference": "other:1883", "authentication_method": "m", "authentication_data": b"d"}),
    Connack(False, 0x84),
    Publish("a/b", b"x", 1, False, True, 12, {"subscription_identifier": (1, 7, 268_435_455)}),
    PubAck(1, 0x87), PubRec(2, 0x91), PubRel(3), PubComp(4),
    Suback(5, (0, 1, 2, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2), {"reason_string": "r"}),
    Unsuback(6, (0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91), {"user_property": (("a", "b"),)}),
    PingResp(),
    Disconnect(0x9C, {"server_reference": "other:1883", "reason_string": "moved"}),
    Disconnect(),
    Auth(0x19),
]

CLIENT_311 = [
    Connect(MQTT_311, "dev-1", False, 65535, "user", b"secret", Will("dev/1/status", b"offline", 2, True)),
    Publish("a/b", b"", 0, True), Publish("a/b", b"x" * 200, 1, False, True, 1), Publish("/", b"y", 2, True, False, 2),
    PubAck(1), PubRec(2), PubRel(3), PubComp(4),
    Subscribe(5, (Subscription("a/+", 0), Subscription("#", 2), Subscription("$share/g/x", 1))),
    Unsubscribe(6, ("a/+", "#")),
    PingReq(), Disconnect(),
]

SERVER_311 = [
    Connack(True, 0), Connack(False, 5), Publish("a/b", b"z", 1, False, False, 9), PubAck(9), PubRec(10),
    PubRel(11), PubComp(12), Suback(13, (0, 1, 2, 0x80)), Unsuback(14), PingResp(),
]


@pytest.mark.parametrize("version, client, server", [(MQTT_5, CLIENT_5, SERVER_5),
                                                     (MQTT_311, CLIENT_311, SERVER_311)])
def test_every_packet_round_trips(version, client, server):
    data = b"".join(encode(p, version) for p in client)
    assert parse_all(data, None, "client") == client
    assert parse_all(data, None, None) == client
    data = b"".join(encode(p, version) for p in server)
    assert parse_all(data, version, "server") == server


def test_byte_by_byte_feeding_gives_the_same_packets():
    data = b"".join(encode(p, MQTT_5) for p in CLIENT_5)
    p = MqttParser(sender="client")
    out = []
    for i in range(len(data)):
        p.receive_data(data[i:i + 1])
        while (event := p.next_event()) is not NEED_DATA:
            out.append(event)
    assert out == CLIENT_5
    assert p.completed == len(CLIENT_5)
    p.receive_data(b"")
    assert p.next_event() is CLOSED


def test_the_shortest_forms_are_written():
    assert encode(PubAck(1), MQTT_5) == b"\x40\x02\x00\x01"
    assert encode(PubAck(1, 0x10), MQTT_5) == b"\x40\x03\x00\x01\x10"
    assert encode(PubRel(1), MQTT_5) == b"\x62\x02\x00\x01"
    assert encode(Disconnect(), MQTT_5) == b"\xe0\x00"
    assert encode(Disconnect(0x8E), MQTT_5) == b"\xe0\x01\x8e"
    assert encode(Auth(), MQTT_5) == b"\xf0\x00"
    assert encode(Connack(False, 0), MQTT_5) == b"\x20\x03\x00\x00\x00"


# -- the specification's bytes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, encoded", [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16_383, b"\xff\x7f"), (16_384, b"\x80\x80\x01"),
    (2_097_151, b"\xff\xff\x7f"), (2_097_152, b"\x80\x80\x80\x01"), (268_435_455, b"\xff\xff\xff\x7f"),
])
def test_variable_byte_integers_of_the_specification(value, encoded):
    """MQTT 5.0 §1.5.5 / 3.1.1 §2.2.3 Table 2.4: the boundaries of each size."""
    assert encode_varint(value) == encoded


@pytest.mark.parametrize("body_len", [0, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152])
def test_remaining_lengths_at_each_size_boundary(body_len):
    topic = s("t")
    data = packet(0x30, topic + b"p" * (body_len - len(topic))) if body_len else b"\xc0\x00"
    (event,) = parse_all(data, MQTT_311)
    assert event == (PingReq() if not body_len else Publish("t", b"p" * (body_len - 3)))


def test_encode_varint_refuses_values_past_four_bytes():
    with pytest.raises(ValueError):
        encode_varint(268_435_456)
    with pytest.raises(ValueError):
        encode_varint(-1)


def test_the_311_connect_example():
    """MQTT 3.1.1 §3.1.2.10 Figure 3.6: name MQTT, level 4, flags 0xCE (user name, password, will QoS 1, will,
    clean session), keep alive 10."""
    head = bytes.fromhex("00044d51545404ce000a")
    body = head + s("client") + s("will/topic") + s(b"bye") + s("user") + s(b"pw")
    (c,) = parse_all(packet(0x10, body))
    assert c == Connect(MQTT_311, "client", True, 10, "user", b"pw", Will("will/topic", b"bye", 1, False))


def test_the_5_connect_example():
    """MQTT 5.0 §3.1.2.11 Figure 3-6: level 5, flags 0xC2 (user name, password, clean start), keep alive 10,
    properties of length 5: Session Expiry Interval 10."""
    body = bytes.fromhex("00044d51545405c2000a0511" "0000000a") + s("client") + s("user") + s(b"pw")
    (c,) = parse_all(packet(0x10, body))
    assert c == Connect(MQTT_5, "client", True, 10, "user", b"pw", None, {"session_expiry_interval": 10})


def test_the_311_publish_example_and_fixed_packets():
    """MQTT 3.1.1 §3.3.2.3 Figure 3.11: topic a/b, packet id 10; CONNACK, PINGREQ, PINGRESP, DISCONNECT bytes."""
    (p,) = parse_all(packet(0x32, bytes.fromhex("0003612f62000a") + b"hi"), MQTT_311)
    assert p == Publish("a/b", b"hi", 1, False, False, 10)
    assert encode(Connack(False, 0), MQTT_311) == b"\x20\x02\x00\x00"
    assert encode(PingReq(), MQTT_311) == b"\xc0\x00"
    assert encode(PingResp(), MQTT_311) == b"\xd0\x00"
    assert encode(Disconnect(), MQTT_311) == b"\xe0\x00"
    assert encode(PubRel(1), MQTT_311) == b"\x62\x02\x00\x01"
    assert encode(Unsuback(1), MQTT_311) == b"\xb0\x02\x00\x01"


def test_a_5_connack_with_properties_in_any_order():
    """A CONNACK as a broker writes it: Topic Alias Maximum 10, then Receive Maximum 20."""
    (c,) = parse_all(bytes.fromhex("200900000622000a210014"), MQTT_5, "server")
    assert c == Connack(False, 0, {"topic_alias_maximum": 10, "receive_maximum": 20})


# -- the maximum packet size -------------------------------------------------------------------------------------

def test_maximum_packet_size_at_and_one_past():
    at = encode(Publish("t", b"x" * 95), MQTT_311)
    assert len(at) == 100
    assert parse_all(at, MQTT_311, max_packet=100) == [Publish("t", b"x" * 95)]
    past = encode(Publish("t", b"x" * 96), MQTT_311)
    e = refused(past, MQTT_311, max_packet=100)
    assert e.reason_code == 0x95


def test_a_packet_past_the_limit_is_refused_before_its_body_is_buffered():
    p = MqttParser(MQTT_5, max_packet=MQTT_MAX_PACKET_BYTES)
    header = b"\x30" + encode_varint(MQTT_MAX_PACKET_BYTES)  # one byte past: 1 + len(varint) + RL
    p.receive_data(header)
    with pytest.raises(MqttError) as info:
        p.next_event()
    assert info.value.reason_code == 0x95
    assert refusal(info.value) == Disconnect(0x95)
    p.receive_data(b"x" * 65536)  # what the peer goes on sending is not kept
    assert p.buffered == len(header)
    with pytest.raises(MqttError):  # and the refusal stays
        p.next_event()


def test_the_default_limit_at_its_edge_waits_for_the_body():
    p = MqttParser(MQTT_5)
    rl = MQTT_MAX_PACKET_BYTES - 1 - len(encode_varint(MQTT_MAX_PACKET_BYTES))
    assert 1 + len(encode_varint(rl)) + rl == MQTT_MAX_PACKET_BYTES
    p.receive_data(b"\x30" + encode_varint(rl))
    assert p.next_event() is NEED_DATA


# -- malformed input ---------------------------------------------------------------------------------------------

def test_a_five_byte_remaining_length_is_malformed_without_waiting_for_the_fifth():
    e = refused(b"\x30\xff\xff\xff\xff", MQTT_5, eof=False)
    assert e.reason_code == MALFORMED and "4 bytes" in e.reason
    assert isinstance(e, RemoteProtocolError) and e.fatal


def test_a_remaining_length_not_in_its_shortest_form_is_malformed():
    assert refused(b"\xc0\x80\x00", MQTT_5).reason_code == MALFORMED


def test_the_largest_remaining_length_is_read():
    """0xFF 0xFF 0xFF 0x7F: 268,435,455, a packet of 268,435,460 bytes (the protocol's own ceiling)."""
    p = MqttParser(MQTT_5, max_packet=268_435_460)
    p.receive_data(b"\x30\xff\xff\xff\x7f")
    assert p.next_event() is NEED_DATA
    p = MqttParser(MQTT_5, max_packet=268_435_459)
    p.receive_data(b"\x30\xff\xff\xff\x7f")
    with pytest.raises(MqttError) as info:
        p.next_event()
    assert info.value.reason_code == 0x95


def test_a_remaining_length_not_yet_whole_waits():
    assert parse_all(b"\x30\xff\xff", MQTT_5, eof=False) == []


@pytest.mark.parametrize("first", [0x61, 0x63, 0x80, 0x81, 0xA0, 0xC1, 0xC2, 0xD8, 0xE1, 0x42, 0x52, 0x72, 0x21,
                                   0x92, 0xB2, 0xF1])
def test_wrong_fixed_header_flags_are_malformed(first):
    e = refused(bytes((first,)) + b"\x02\x00\x01", MQTT_5, None)
    assert e.reason_code == MALFORMED and "flags" in e.reason


def test_wrong_flags_on_a_connect():
    data = bytearray(encode(Connect(MQTT_5, "c"), MQTT_5))
    data[0] |= 0x01
    e = refused(bytes(data))
    assert e.reason_code == MALFORMED and refusal(e) is None


def test_reserved_packet_types():
    assert refused(b"\x00\x00", MQTT_5).reason_code == MALFORMED
    assert refused(b"\xf0\x00", MQTT_311).reason_code == MALFORMED  # AUTH is reserved in 3.1.1


@pytest.mark.parametrize("first", [0x36, 0x37, 0x3E])
def test_publish_qos_3_is_malformed(first):
    assert refused(packet(first, s("t") + b"\x00\x01"), MQTT_5).reason_code == MALFORMED


def test_publish_dup_at_qos_0_is_malformed():
    assert refused(packet(0x38, s("t") + b"\x00"), MQTT_5).reason_code == MALFORMED


@pytest.mark.parametrize("version, data", [
    (MQTT_5, packet(0x32, s("t") + b"\x00\x00\x00")),
    (MQTT_311, packet(0x34, s("t") + b"\x00\x00")),
    (MQTT_5, packet(0x40, b"\x00\x00")),
    (MQTT_311, packet(0x50, b"\x00\x00")),
    (MQTT_5, packet(0x62, b"\x00\x00")),
    (MQTT_5, packet(0x70, b"\x00\x00")),
    (MQTT_5, packet(0x82, b"\x00\x00\x00" + s("a") + b"\x00")),
    (MQTT_311, packet(0x82, b"\x00\x00" + s("a") + b"\x00")),
    (MQTT_5, packet(0xA2, b"\x00\x00\x00" + s("a"))),
    (MQTT_5, packet(0x90, b"\x00\x00\x00\x00")),
    (MQTT_5, packet(0xB0, b"\x00\x00\x00\x00")),
])
def test_packet_identifier_0_is_a_protocol_error(version, data):
    assert refused(data, version).reason_code == PROTOCOL


BAD_UTF8 = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"a\x00b", b"\xf4\x90\x80\x80"]


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_invalid_utf8_and_nul_in_a_topic_name(raw):
    assert refused(packet(0x30, s(raw) + b"\x00"), MQTT_5).reason_code == MALFORMED


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_invalid_utf8_and_nul_in_connect_strings(raw):
    e = refused(connect5(payload=s(raw)))  # the client identifier
    assert e.reason_code == MALFORMED and e.in_connect and refusal(e) == Connack(False, MALFORMED)
    e = refused(connect5(flags=0x82, payload=s("c") + s(raw)))  # the user name
    assert e.reason_code == MALFORMED
    e = refused(connect311(payload=s(raw)))
    assert e.reason_code == MALFORMED and refusal(e) is None  # 3.1.1 has no return code for it: closed
    e = refused(packet(0x82, b"\x00\x01\x00" + s(raw) + b"\x00"), MQTT_5)  # a topic filter
    assert e.reason_code == MALFORMED
    e = refused(packet(0x30, s("t") + props(prop(0x26, s(raw) + s("v")))), MQTT_5)  # a user property's name
    assert e.reason_code == MALFORMED
    e = refused(packet(0x30, s("t") + props(prop(0x03, s(raw)))), MQTT_5)  # the content type
    assert e.reason_code == MALFORMED


def test_a_password_may_hold_any_bytes():
    (c,) = parse_all(connect5(flags=0xC2, payload=s("c") + s("u") + s(b"\x00\xff\xed\xa0\x80")))
    assert c.password == b"\x00\xff\xed\xa0\x80"


def test_a_bom_is_a_character_kept():
    (p,) = parse_all(packet(0x30, s("\ufeffa") + b"\x00"), MQTT_5)
    assert p.topic == "\ufeffa"


def prop(pid, value):
    return bytes((pid,)) + value


def props(*items):
    body = b"".join(items)
    return encode_varint(len(body)) + body


@pytest.mark.parametrize("block, kind", [
    (props(prop(0x11, b"\x00\x00\x00\x01"), prop(0x11, b"\x00\x00\x00\x02")), "connect"),
    (props(prop(0x21, b"\x00\x01"), prop(0x21, b"\x00\x01")), "connect"),
    (props(prop(0x15, s("m")), prop(0x15, s("m"))), "connect"),
    (props(prop(0x23, b"\x00\x01"), prop(0x23, b"\x00\x02")), "publish"),
    (props(prop(0x03, s("a")), prop(0x03, s("b"))), "publish"),
    (props(prop(0x0B, b"\x01"), prop(0x0B, b"\x02")), "subscribe"),
    (props(prop(0x1F, s("a")), prop(0x1F, s("b"))), "puback"),
])
def test_a_property_given_twice_is_a_protocol_error(block, kind):
    data = {"connect": lambda: connect5(props=block),
            "publish": lambda: packet(0x30, s("t") + block),
            "subscribe": lambda: packet(0x82, b"\x00\x01" + block + s("a") + b"\x00"),
            "puback": lambda: packet(0x40, b"\x00\x01\x00" + block)}[kind]()
    e = refused(data, None if kind == "connect" else MQTT_5)
    assert e.reason_code == PROTOCOL and "twice" in e.reason


def test_user_properties_repeat_in_order():
    block = props(prop(0x26, s("k") + s("1")), prop(0x26, s("k") + s("1")), prop(0x26, s("a") + s("2")))
    (p,) = parse_all(packet(0x30, s("t") + block), MQTT_5)
    assert p.properties == {"user_property": (("k", "1"), ("k", "1"), ("a", "2"))}


def test_subscription_identifiers_repeat_only_in_a_servers_publish():
    block = props(prop(0x0B, b"\x01"), prop(0x0B, b"\x02"))
    data = packet(0x30, s("t") + block)
    assert parse_all(data, MQTT_5, "server")[0].properties == {"subscription_identifier": (1, 2)}
    e = refused(data, MQTT_5, "client")
    assert e.reason_code == PROTOCOL
    e = refused(packet(0x30, s("t") + props(prop(0x0B, b"\x01"))), MQTT_5, "client")
    assert e.reason_code == PROTOCOL


@pytest.mark.parametrize("data", [
    packet(0x30, s("t") + props(prop(0x11, b"\x00\x00\x00\x01"))),  # session expiry in PUBLISH
    packet(0x30, s("t") + props(prop(0x1F, s("why")))),  # reason string in PUBLISH
    packet(0x30, s("t") + props(prop(0x18, b"\x00\x00\x00\x01"))),  # will delay outside the will
    packet(0x40, b"\x00\x01\x00" + props(prop(0x26 - 0x25, b"\x00"))),  # payload format in PUBACK
    packet(0xE0, b"\x00" + props(prop(0x23, b"\x00\x01"))),  # topic alias in DISCONNECT
    packet(0xA2, b"\x00\x01" + props(prop(0x0B, b"\x01")) + s("a")),  # subscription id in UNSUBSCRIBE
    packet(0x30, s("t") + props(prop(0x00, b"\x00"))),  # unknown identifiers
    packet(0x30, s("t") + props(prop(0x04, b"\x00"))),
    packet(0x30, s("t") + props(prop(0x7F, b"\x00"))),
    packet(0x30, s("t") + props(b"\x81\x01\x00")),  # a two-byte identifier (0x81): none is defined
    packet(0x30, s("t") + b"\x05\x01\x00"),  # a property length past the packet
    packet(0x30, s("t") + props(prop(0x02, b"\x00\x00"))),  # a four-byte integer cut short
])
def test_properties_not_allowed_unknown_or_cut_are_malformed(data):
    assert refused(data, MQTT_5).reason_code == MALFORMED


def test_properties_not_allowed_in_a_connect_or_a_will():
    assert refused(connect5(props=props(prop(0x18, b"\x00\x00\x00\x01")))).reason_code == MALFORMED
    will = props(prop(0x11, b"\x00\x00\x00\x01")) + s("w") + s(b"p")
    e = refused(connect5(flags=0x06, payload=s("c") + will))
    assert e.reason_code == MALFORMED and refusal(e) == Connack(False, MALFORMED)


@pytest.mark.parametrize("data, code", [
    (connect5(props=props(prop(0x21, b"\x00\x00"))), PROTOCOL),  # receive maximum 0
    (connect5(props=props(prop(0x27, b"\x00\x00\x00\x00"))), PROTOCOL),  # maximum packet size 0
    (connect5(props=props(prop(0x17, b"\x02"))), PROTOCOL),  # request problem information 2
    (connect5(props=props(prop(0x19, b"\x02"))), PROTOCOL),  # request response information 2
])
def test_forbidden_property_values_in_a_connect(data, code):
    e = refused(data)
    assert e.reason_code == code and refusal(e) == Connack(False, code)


@pytest.mark.parametrize("block, code", [
    (props(prop(0x23, b"\x00\x00")), 0x94),  # topic alias 0
    (props(prop(0x01, b"\x02")), PROTOCOL),  # payload format indicator 2
    (props(prop(0x08, s("r/+"))), PROTOCOL),  # a response topic with a wildcard
])
def test_forbidden_property_values_in_a_publish(block, code):
    e = refused(packet(0x30, s("t") + block), MQTT_5)
    assert e.reason_code == code and refusal(e) == Disconnect(code)


def test_authentication_data_without_a_method_is_a_protocol_error():
    e = refused(connect5(props=props(prop(0x16, s(b"d")))))
    assert e.reason_code == PROTOCOL and refusal(e) == Connack(False, PROTOCOL)
    assert refused(packet(0xF0, b"\x18" + props(prop(0x16, s(b"d")))), MQTT_5).reason_code == PROTOCOL
    (a,) = parse_all(packet(0xF0, b"\x18" + props(prop(0x15, s("m")), prop(0x16, s(b"d")))), MQTT_5)
    assert a == Auth(0x18, {"authentication_method": "m", "authentication_data": b"d"})


def test_subscription_identifier_0_is_a_protocol_error():
    e = refused(packet(0x82, b"\x00\x01" + props(prop(0x0B, b"\x00")) + s("a") + b"\x00"), MQTT_5)
    assert e.reason_code == PROTOCOL


def test_connack_properties_with_forbidden_values():
    for pid in (0x24, 0x25, 0x28, 0x29, 0x2A):
        assert refused(packet(0x20, b"\x00\x00" + props(prop(pid, b"\x02"))), MQTT_5, "server").reason_code \
            == PROTOCOL


def test_truncated_packets_are_malformed():
    """Every shorter body of a full CONNECT (its Remaining Length made to fit) ends inside a field."""
    full = encode(CLIENT_5[0], MQTT_5)
    body = full[1 + len(encode_varint(len(full) - 3)):]
    assert len(full) == 1 + len(encode_varint(len(body))) + len(body)
    for n in range(len(body)):
        e = refused(packet(0x10, body[:n]))
        assert e.reason_code == MALFORMED, n
    for pk in (Subscribe(1, (Subscription("a"),)), PubAck(1, 0x10, {"reason_string": "r"}),
               Connack(False, 0, {"receive_maximum": 5})):
        data = encode(pk, MQTT_5)
        body = data[2:]
        for n in range(1 if isinstance(pk, Subscribe) else 0, len(body)):
            if isinstance(pk, PubAck) and n in (2, 3):
                continue  # PUBACK's short forms: no reason code, no properties
            with pytest.raises(MqttError):
                parse_all(packet(data[0], body[:n]), MQTT_5)


def test_bytes_past_a_fixed_body_are_malformed():
    assert refused(packet(0x40, b"\x00\x01\x00"), MQTT_311).reason_code == MALFORMED
    assert refused(packet(0xC0, b"\x00"), MQTT_5).reason_code == MALFORMED
    assert refused(packet(0xE0, b"\x00"), MQTT_311).reason_code == MALFORMED
    assert refused(packet(0xB0, b"\x00\x01\x00"), MQTT_311, "server").reason_code == MALFORMED
    assert refused(packet(0x40, b"\x00\x01\x00\x00\x00"), MQTT_5).reason_code == MALFORMED
    assert refused(connect5(payload=s("c") + b"\x00"), None).reason_code == MALFORMED


def test_the_stream_ending_inside_a_packet_is_malformed():
    data = encode(Publish("t", b"xyz"), MQTT_5)
    assert refused(data[:-1], MQTT_5).reason_code == MALFORMED
    assert refused(data[:1], MQTT_5).reason_code == MALFORMED
    assert parse_all(data, MQTT_5) == [Publish("t", b"xyz")]


def test_a_refusal_is_sticky_and_what_follows_is_dropped():
    p = MqttParser(MQTT_5)
    p.receive_data(packet(0x36, s("t") + b"\x00\x01\x00") + encode(PingReq(), MQTT_5))
    with pytest.raises(MqttError):
        p.next_event()
    with pytest.raises(MqttError):
        p.next_event()


# -- CONNECT -----------------------------------------------------------------------------------------------------

def test_the_first_packet_must_be_a_connect():
    e = refused(encode(PingReq(), MQTT_5), None, "client")
    assert e.reason_code == PROTOCOL and refusal(e) is None


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
def test_a_second_connect_is_a_protocol_error(version):
    e = after_connect(version, encode(Connect(version, "c"), version))
    assert e.reason_code == PROTOCOL
    assert refusal(e) == (Disconnect(PROTOCOL) if version == MQTT_5 else None)


def test_a_wrong_protocol_name_is_closed_without_an_answer():
    e = refused(packet(0x10, s("hj") + b"\x04\x02\x00\x3c" + s("c")))
    assert e.reason_code == 0x84 and refusal(e) is None
    e = refused(packet(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + s("c")).replace(b"MQTT", b"MQTX"))
    assert refusal(e) is None


@pytest.mark.parametrize("name, level", [("MQIsdp", 3), ("MQTT", 3), ("MQTT", 6), ("MQTT", 0)])
def test_an_unsupported_level_gets_connack_0x01(name, level):
    e = refused(packet(0x10, s(name) + bytes((level, 0x02)) + b"\x00\x3c" + s("c")))
    assert e.reason_code == 0x84 and e.in_connect
    assert encode(refusal(e), e.version) == b"\x20\x02\x00\x01"


@pytest.mark.parametrize("flags", [0x03, 0x1E, 0x18, 0x08, 0x20])
def test_connect_flags_that_contradict_are_malformed(flags):
    """Reserved bit 0; will QoS 3; will QoS or will retain without the will flag."""
    e = refused(connect5(flags=flags, payload=s("c") + b"\x00" + s("w") + s(b"p")))
    assert e.reason_code == MALFORMED and refusal(e) == Connack(False, MALFORMED)
    e = refused(connect311(flags=flags, payload=s("c") + s("w") + s(b"p")))
    assert e.reason_code == MALFORMED and refusal(e) is None


def test_a_password_without_a_user_name():
    """Refused in 3.1.1 ([MQTT-3.1.2-22]); allowed in 5.0."""
    assert refused(connect311(flags=0x42, payload=s("c") + s(b"pw"))).reason_code == MALFORMED
    (c,) = parse_all(connect5(flags=0x42, payload=s("c") + s(b"pw")))
    assert c.username is None and c.password == b"pw"


def test_an_empty_client_identifier():
    """3.1.1: only with clean session 1, else CONNACK 0x02 ([MQTT-3.1.3-8]); 5.0: allowed with either."""
    e = refused(connect311(flags=0x00, payload=s("")))
    assert e.reason_code == 0x85 and encode(refusal(e), MQTT_311) == b"\x20\x02\x00\x02"
    assert parse_all(connect311(flags=0x02, payload=s("")))[0].client_id == ""
    assert parse_all(connect5(flags=0x00, payload=s("")))[0].client_id == ""


def test_a_will_topic_with_a_wildcard():
    e = refused(connect5(flags=0x06, payload=s("c") + b"\x00" + s("w/#") + s(b"p")))
    assert e.reason_code == 0x90 and refusal(e) == Connack(False, 0x90)


def test_a_will_without_properties_in_311_and_with_them_in_5():
    (c,) = parse_all(connect5(flags=0x2E, payload=s("c") + props(prop(0x18, b"\x00\x00\x00\x05")) + s("w")
                              + s(b"p")))
    assert c.will == Will("w", b"p", 1, True, {"will_delay_interval": 5})


# -- PUBLISH -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("topic", ["a/+", "a/#", "+", "#", "a+b"])
def test_a_wildcard_in_a_publish_topic_is_refused(topic):
    e = refused(packet(0x30, s(topic) + b"\x00"), MQTT_5)
    assert e.reason_code == 0x90 and refusal(e) == Disconnect(0x90)
    e = refused(packet(0x30, s(topic)), MQTT_311)
    assert e.reason_code == 0x90 and refusal(e) is None


def test_an_empty_topic_name():
    assert refused(packet(0x30, s("")), MQTT_311).reason_code == 0x90
    assert refused(packet(0x30, s("") + b"\x00"), MQTT_5).reason_code == PROTOCOL
    (p,) = parse_all(packet(0x30, s("") + props(prop(0x23, b"\x00\x07")) + b"x"), MQTT_5)
    assert p == Publish("", b"x", 0, properties={"topic_alias": 7})


# -- acknowledgements, reason codes ------------------------------------------------------------------------------

@pytest.mark.parametrize("first, code", [(0x40, 0xFF), (0x40, 0x92), (0x50, 0x01), (0x62, 0x10), (0x70, 0x00 + 0x80),
                                         (0xE0, 0x01), (0xE0, 0x05), (0xF0, 0x01), (0xF0, 0x80)])
def test_reason_codes_not_defined_for_the_packet(first, code):
    body = (b"\x00\x01" if first >> 4 in (4, 5, 6, 7) else b"") + bytes((code,))
    assert refused(packet(first, body), MQTT_5).reason_code == PROTOCOL


def test_server_answers_with_codes_not_defined():
    assert refused(packet(0x20, b"\x00\x06"), MQTT_311, "server").reason_code == PROTOCOL
    assert refused(packet(0x20, b"\x00\x01\x00"), MQTT_5, "server").reason_code == PROTOCOL
    assert refused(packet(0x20, b"\x02\x00\x00"), MQTT_5, "server").reason_code == MALFORMED  # reserved flag bit
    assert refused(packet(0x20, b"\x01\x85\x00"), MQTT_5, "server").reason_code == PROTOCOL  # present + refusal
    assert refused(packet(0x90, b"\x00\x01\x03"), MQTT_311, "server").reason_code == PROTOCOL
    assert refused(packet(0x90, b"\x00\x01\x00\x11"), MQTT_5, "server").reason_code == PROTOCOL
    assert refused(packet(0x90, b"\x00\x01\x00"), MQTT_5, "server").reason_code == PROTOCOL  # no code at all
    assert refused(packet(0xB0, b"\x00\x01\x00\x10"), MQTT_5, "server").reason_code == PROTOCOL


# -- SUBSCRIBE, UNSUBSCRIBE --------------------------------------------------------------------------------------

@pytest.mark.parametrize("version, options, code", [
    (MQTT_5, 0x40, MALFORMED), (MQTT_5, 0x80, MALFORMED),  # reserved bits 6-7
    (MQTT_5, 0x03, PROTOCOL),  # maximum QoS 3
    (MQTT_5, 0x30, PROTOCOL),  # retain handling 3
    (MQTT_311, 0x04, MALFORMED), (MQTT_311, 0x80, MALFORMED), (MQTT_311, 0x03, MALFORMED),
])
def test_subscription_options_refused(version, options, code):
    pre = b"\x00\x01" + (b"\x00" if version == MQTT_5 else b"")
    assert refused(packet(0x82, pre + s("a") + bytes((options,))), version).reason_code == code


def test_subscription_options_decoded():
    (sub,) = parse_all(packet(0x82, b"\x00\x01\x00" + s("a") + b"\x2e"), MQTT_5)
    assert sub.subscriptions == (Subscription("a", 2, True, True, 2),)


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311])
def test_subscribe_and_unsubscribe_without_filters_are_protocol_errors(version):
    pre = b"\x00\x01" + (b"\x00" if version == MQTT_5 else b"")
    assert refused(packet(0x82, pre), version).reason_code == PROTOCOL
    assert refused(packet(0xA2, pre), version).reason_code == PROTOCOL


@pytest.mark.parametrize("topic_filter", ["a/#/b", "a+", "", "$share/g", "$share//a", "a\x00"])
def test_invalid_filters_are_refused(topic_filter):
    e = refused(packet(0x82, b"\x00\x01\x00" + s(topic_filter) + b"\x00"), MQTT_5)
    assert e.reason_code in (0x8F, MALFORMED)
    assert e.reason_code == (MALFORMED if "\x00" in topic_filter else 0x8F)
    assert refused(packet(0xA2, b"\x00\x01\x00" + s(topic_filter)), MQTT_5).reason_code == e.reason_code


def test_no_local_on_a_shared_subscription_is_a_protocol_error():
    assert refused(packet(0x82, b"\x00\x01\x00" + s("$share/g/a") + b"\x04"), MQTT_5).reason_code == PROTOCOL
    assert parse_all(packet(0x82, b"\x00\x01" + s("$share/g") + b"\x00"), MQTT_311)  # an ordinary filter in 3.1.1


# -- who sends what ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pk", [Connack(), Suback(1, (0,)), Unsuback(1, (0,)), PingResp()])
def test_a_server_refuses_packets_only_a_server_sends(pk):
    assert after_connect(MQTT_5, encode(pk, MQTT_5)).reason_code == PROTOCOL


@pytest.mark.parametrize("pk", [Connect(MQTT_5, "c"), Subscribe(1, (Subscription("a"),)), Unsubscribe(1, ("a",)),
                                PingReq()])
def test_a_client_refuses_packets_only_a_client_sends(pk):
    assert refused(encode(pk, MQTT_5), MQTT_5, "server").reason_code == PROTOCOL


# -- encoding ----------------------------------------------------------------------------------------------------

def test_encoding_refuses_what_the_specification_forbids():
    with pytest.raises(ValueError):
        encode(Publish("t", b"", 0, properties={"session_expiry_interval": 1}), MQTT_5)
    with pytest.raises(ValueError):
        encode(Publish("t", b"", 0, packet_id=1), MQTT_5)
    with pytest.raises(ValueError):
        encode(Publish("t", b"", 1), MQTT_5)
    with pytest.raises(ValueError):
        encode(PubAck(0), MQTT_5)
    with pytest.raises(ValueError):
        encode(PubAck(65536), MQTT_5)
    with pytest.raises(ValueError):
        encode(Auth(), MQTT_311)
    with pytest.raises(ValueError):
        encode(Publish("t\x00"), MQTT_5)
    with pytest.raises(ValueError):
        encode(Connect(3, "c"), MQTT_5)


def test_string_length_at_and_one_past_65535():
    at = "k" * 65535
    pk = Publish("t", properties={"user_property": ((at, ""),)})
    assert parse_all(encode(pk, MQTT_5), MQTT_5) == [pk]
    with pytest.raises(ValueError):
        encode(Publish("t", properties={"user_property": ((at + "k", ""),)}), MQTT_5)


def test_protocol_constants():
    assert wire.MAX_REMAINING_LENGTH == 268_435_455
    assert {name for name, _, _ in wire.PROPERTIES.values()} == set(wire.PROPERTY_IDS)
    assert len(wire.PROPERTIES) == 27


def _general_publish(data, version):
    """A PUBLISH's bytes decoded by the general decoder alone (the parser takes a fast path for plain ones)."""
    first, i = data[0], 2 if data[1] < 0x80 else 3
    return wire._decode_publish(wire._Reader(data[i:]), first & 0x0F, version, "client")


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@pytest.mark.parametrize("data", [
    packet(0x30, s("a/b") + b"payload"), packet(0x32, s("a/b") + b"\x00\x07x"), packet(0x3D, s("a/b") + b"\x01\x00"),
    packet(0x31, s("é/ü") + b""), packet(0x30, s("") + b"x"), packet(0x30, s("a/+") + b"x"),
    packet(0x30, s("a\x00b") + b"x"), packet(0x30, s(b"a\xff") + b"x"), packet(0x32, s("a/b") + b"\x00\x00x"),
    packet(0x36, s("a/b") + b"\x00\x01"), packet(0x38, s("a/b")), packet(0x32, s("a/b") + b"\x00"),
    packet(0x30, b"\x00\x09a/b"), packet(0x30, s("a/b") + b"\x03\x01\x00\x00x"), packet(0x30, b"\x00"),
], ids=lambda d: d.hex())
def test_the_publish_fast_path_decodes_or_refuses_as_the_general_decoder(version, data):
    prefix = packet(0x30, s("a/b") + b"\x00")  # a/b is a name the fast path has seen
    try:
        expected = _general_publish(data, version)
    except MqttError as exc:
        assert refused(prefix + data + prefix, version, "client").reason_code == exc.reason_code
        return
    got = parse_all(prefix + data + prefix, version, "client")
    assert got[1] == expected and len(got) == 3


def test_a_topic_length_past_the_packet_is_malformed_though_the_next_packet_holds_a_known_name():
    known = packet(0x30, s("a/b") + b"x")
    short = packet(0x30, b"\x00\x03")  # a name of 3 bytes announced, none in the packet; "a/b" follows it
    assert refused(known + short + known, MQTT_311, "client").reason_code == MALFORMED


def test_encode_pubacks_writes_each_puback_as_encode_does():
    ids = [1, 2, 300, 65535]
    for version in (MQTT_311, MQTT_5):
        assert wire.encode_pubacks(ids) == b"".join(encode(PubAck(i), version) for i in ids)
    assert wire.encode_pubacks([]) == b""


@pytest.mark.parametrize("extra", [0, 1], ids=["at", "past"])
def test_the_names_the_publish_fast_path_remembers_are_bounded_at_and_one_past(extra):
    wire._known_names.clear()
    count = wire.MQTT_KNOWN_NAMES + extra
    names = ["n/%d" % k for k in range(count)]
    got = parse_all(b"".join(encode(Publish(n, b"x"), MQTT_311) for n in names + names[:1]), MQTT_311, "client")
    assert [p.topic for p in got] == names + names[:1]
    assert len(wire._known_names) <= wire.MQTT_KNOWN_NAMES


@pytest.mark.parametrize("qos, packet_id", [(0, None), (1, 7), (2, 65535)])
@pytest.mark.parametrize("props", [{}, {"message_expiry_interval": 5, "user_property": (("a", "b"),),
                                        "subscription_identifier": (3, 268_435_455)}])
@pytest.mark.parametrize("payload", [b"", b"x" * 100, b"y" * 20000])  # remaining lengths of 1, 2 and 3 bytes
def test_with_topic_alias_adds_the_alias_to_an_encoded_publish_and_changes_nothing_else(qos, packet_id, props,
                                                                                          payload):
    p = Publish("a/b/c", payload, qos, True, False, packet_id, props)
    data = encode(p, MQTT_5)
    (plain,) = parse_all(data, MQTT_5, "server")
    named = wire.with_topic_alias(data, 9, True)
    alone = wire.with_topic_alias(data, 9, False)
    assert parse_all(named, MQTT_5, "server") == [Publish("a/b/c", payload, qos, True, False, packet_id,
                                                          dict(plain.properties, topic_alias=9))]
    assert parse_all(alone, MQTT_5, "server") == [Publish("", payload, qos, True, False, packet_id,
                                                          dict(plain.properties, topic_alias=9))]
    assert len(named) - len(data) in (3, 4)  # the property (and a remaining length one byte longer)
