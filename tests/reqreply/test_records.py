"""Request-reply's pure parts (``metaq.reqreply.records``) and its text commands ``request`` / ``reply``."""

import pytest

from metaq import errors, limits
from metaq.reqreply import limits as reqreply_limits
from metaq.protocol import events as ev
from metaq.protocol.message import decode_payload, encode_payload
from metaq.reqreply.records import (CORRELATION_ID, REPLY_ERROR, REPLY_TO_CLIENT, is_request, properties_of,
                                     reply_properties, reply_topic, request_properties, routing, with_properties)
from metaq.protocol.properties import encode_attribute
from metaq.protocol.text import TextParser, serialize


def parse(data):
    p = TextParser()
    p.receive_data(data)
    return p.next_event()


def test_request_and_reply_lines_round_trip():
    for event in (ev.Request("t", -1, 1, b"body", 7, 12345, 3000), ev.Reply(1, b"xy", -4, -1)):
        assert parse(serialize(event)) == event
    assert serialize(ev.Request("t", 2, 0, b"ab", 9, -1, 1)) == b"request t 2 2 0 -1 1 9\r\nab"
    assert serialize(ev.Reply(0, b"ab", 9, -1)) == b"reply 2 0 -1 9\r\nab"


@pytest.mark.parametrize("line, reason", [
    (b"request t 0 2 0 -1 0 9\r\nab", "timeoutMs"),  # a timeout must be at least 1 ms
    (b"request t 0 2 0 -1 9\r\nab", "8 tokens"),
    (b"reply 2 0 9\r\nab", "5 tokens"),
    (b"reply 2 x -1 9\r\nab", "flag"),
])
def test_bad_request_and_reply_lines_are_refused(line, reason):
    with pytest.raises(errors.RemoteProtocolError, match=reason):
        parse(line)


def test_a_reply_carries_the_requests_routing_and_an_error_when_given():
    req = request_properties("c1", "client-a", 3000, "Blue")
    assert req == {CORRELATION_ID: "c1", REPLY_TO_CLIENT: "client-a", "TTL": "3000", "CLUSTER": "Blue"}
    assert is_request(req) and not is_request({CORRELATION_ID: "c1"})
    rep = reply_properties(dict(req, other="x"))
    assert rep == {"MSG_TYPE": "reply", CORRELATION_ID: "c1", REPLY_TO_CLIENT: "client-a", "TTL": "3000"}
    assert routing(rep) == ("c1", "client-a")
    failed = reply_properties(req, "Boom\x02with\x01separators")
    assert failed[REPLY_ERROR] == "Boom with separators"
    assert reply_topic("Blue") == "Blue_REPLY_TOPIC"
    with pytest.raises(errors.ClientError):
        reply_properties({"k": "v"})


def test_a_long_error_is_cut_to_its_limit():
    text = reply_properties(request_properties("c", "a", 1, "C"),
                            "é" * reqreply_limits.MAX_REPLY_ERROR_BYTES)[REPLY_ERROR]
    assert (len(text.encode()) <= reqreply_limits.MAX_REPLY_ERROR_BYTES
            and text == "é" * (reqreply_limits.MAX_REPLY_ERROR_BYTES // 2))


def test_routing_refuses_missing_or_oversized_fields():
    with pytest.raises(errors.ClientError, match="CORRELATION_ID"):
        routing({REPLY_TO_CLIENT: "a"})
    with pytest.raises(errors.ClientError, match="at most"):
        routing({CORRELATION_ID: "c" * (limits.MAX_NAME_BYTES + 1), REPLY_TO_CLIENT: "a"})


def test_with_properties_adds_to_a_plain_an_attributed_and_a_remoting_message():
    for flag, data in (encode_payload(b"pay", None), encode_payload(b"pay", "tagA"),
                       encode_payload(b"pay", encode_attribute("tagB", {"k": "v"}))):
        flag2, data2 = with_properties(flag | 4, data, {"X": "1"})
        assert flag2 & 5 == 5  # other flag bits kept, attribute bit set
        attribute, payload = decode_payload(flag2, data2)
        assert payload == b"pay"
        tags, props = properties_of(flag2, data2)
        assert props["X"] == "1"
        assert tags == (None if flag == 0 else ("tagA" if "tagA" in attribute else "tagB"))
    with pytest.raises(errors.RemoteProtocolError):
        with_properties(0, b"x", {"bad": "a\x02b"})
