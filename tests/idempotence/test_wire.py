"""put_idem (parser and writer) and the identity a stored record carries (idempotence/records.py)."""

import pytest

from metaq.errors import ClientError, RemoteProtocolError
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.idempotence.records import MARK, has_identity, identity_in_attribute, stored_identity, with_identity
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.properties import split_attribute
from metaq.protocol.text import TextParser, serialize

MAXQ = 2**63 - 1


def test_put_idem_round_trip():
    e = IdempotentPut("orders", 3, 0, b"hello", 7, metaq_checksum(b"hello"), MAXQ, 0)
    wire = serialize(e)
    assert wire == b"put_idem orders 3 5 0 %d %d 0 7\r\nhello" % (metaq_checksum(b"hello"), MAXQ)
    p = TextParser()
    p.receive_data(wire + b"put_idem t 0 2 1 -1 1 " + str(MAXQ).encode() + b" -5\r\nhi")
    assert p.next_event() == e
    assert p.next_event() == IdempotentPut("t", 0, 1, b"hi", -5, -1, 1, MAXQ)


@pytest.mark.parametrize("line, reason", [
    (b"put_idem t -1 2 0 -1 1 0 9", "invalid partition '-1': must be 0..2147483647"),
    (b"put_idem t 0 2 0 -1 0 0 9", "invalid producer id '0': must be 1..9223372036854775807"),
    (b"put_idem t 0 2 0 -1 9223372036854775808 0 9", "invalid producer id"),
    (b"put_idem t 0 2 0 -1 p 0 9", "invalid producer id 'p': not an integer"),
    (b"put_idem t 0 2 0 -1 1 -1 9", "invalid sequence '-1': must be 0..9223372036854775807"),
    (b"put_idem t 0 2 0 -1 1 9223372036854775808 9", "invalid sequence"),
    (b"put_idem t 0 2 0 x 1 0 9", "invalid checksum 'x'"),
    (b"put_idem t 0 2 z -1 1 0 9", "invalid flag 'z'"),
    (b"put_idem t 0 2 0 -1 1 0 op", "invalid opaque 'op'"),
    (b"put_idem t 0 2 0 -1 1 9", "put_idem needs 9 tokens (put_idem <topic> <partition> <len> <flag> <checksum> "
                                 "<pid> <seq> <opaque>), got 8"),
    (b"put_idem t 0 2 0 -1 1 0 0 9", "put_idem needs 9 tokens"),
])
def test_put_idem_bad_lines_are_refused_and_the_stream_goes_on(line, reason):
    p = TextParser()
    p.receive_data(line + b"\r\nhiversion 10\r\n")
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert reason in info.value.reason and not info.value.fatal
    assert p.next_event() == ev.Version(10)  # the body was skipped


def test_put_idem_bad_length_is_fatal():
    p = TextParser()
    p.receive_data(b"put_idem t 0 -2 0 -1 1 0 9\r\nhi")
    with pytest.raises(RemoteProtocolError) as info:
        p.next_event()
    assert "invalid body length -2: negative" in info.value.reason and info.value.fatal


@pytest.mark.parametrize("attribute, flag_bits, seen_tags, props", [
    (None, 0, None, {}),
    ("color=red", 0, "color=red", {"@FLAG": "1"}),  # RocketMQ consumers see the MetaQ flag, as before
    ("", 0, None, {"@FLAG": "1"}),
    ("T\x02KEYS\x01k1\x02", 0, "T", {"KEYS": "k1"}),  # already a remoting record: its own @FLAG, if any
    ("T\x02KEYS\x01k1", 0, "T", {"KEYS": "k1"}),
    (None, 4, None, {"@FLAG": "4"}),
    ("a", 6, "a", {"@FLAG": "7"}),
])
def test_with_identity_keeps_what_the_user_sent(attribute, flag_bits, seen_tags, props):
    flag, data = encode_payload(b"body", attribute)
    new_flag, new_data = with_identity(flag | flag_bits, data, 7, 12)
    assert new_flag & 1 and new_flag & ~1 == flag_bits
    stored_attribute, payload = decode_payload(new_flag, new_data)
    assert payload == b"body" and MARK in stored_attribute.encode()
    tags, properties, remote = split_attribute(stored_attribute)
    assert remote and tags == seen_tags
    assert properties == dict(props, METAQ_PID="7", METAQ_SEQ="12")
    assert identity_in_attribute(stored_attribute) == (7, 12)


def test_reserved_properties_are_refused():
    flag, data = encode_payload(b"x", "a\x02METAQ_SEQ\x013\x02")
    assert has_identity("a\x02METAQ_SEQ\x013\x02") and not has_identity("METAQ_PID") and not has_identity(None)
    with pytest.raises(ClientError, match="set by the broker"):
        with_identity(flag, data, 1, 1)


def test_the_owner_is_stored_after_the_identity_and_a_put_cannot_name_one():
    flag, data = encode_payload(b"x", "color=red")
    new_flag, new_data = with_identity(flag, data, 7, 12, "alice")
    attribute = decode_payload(new_flag, new_data)[0]
    assert attribute.endswith("\x02METAQ_SEQ\x0112\x02METAQ_OWNER\x01alice\x02")
    assert stored_identity(attribute) == (7, 12, "alice") and identity_in_attribute(attribute) == (7, 12)
    assert stored_identity(decode_payload(*with_identity(flag, data, 7, 12))[0]) == (7, 12, None)  # no owner
    forged_flag, forged = encode_payload(b"x", "a\x02METAQ_OWNER\x01bob\x02")
    with pytest.raises(ClientError, match="set by the broker"):
        with_identity(forged_flag, forged, 1, 1, "alice")


@pytest.mark.parametrize("attribute", [None, "plain", "\x02METAQ_PID\x01x\x02METAQ_SEQ\x011\x02",
                                       "\x02METAQ_PID\x010\x02METAQ_SEQ\x011\x02", "\x02METAQ_PID\x011\x02"])
def test_no_identity_in_other_attributes(attribute):
    assert identity_in_attribute(attribute) is None


@pytest.mark.parametrize("line", [
    b"put_idem t 0 2 0 -1 1 0 9",
    b"put_idem a.b-c 2147483647 2 -2147483648 2147483647 9223372036854775807 9223372036854775807 -2147483648",
    b"put_idem t 2147483648 2 0 -1 1 0 9",  # out of range: the general path explains
    b"put_idem t 0 2 2147483648 -1 1 0 9",
    b"put_idem t 0 2 0 2147483648 1 0 9",
    b"put_idem t 0 2 0 -1 9223372036854775808 0 9",
    b"put_idem t 0 2 0 -1 1 9223372036854775808 9",
    b"put_idem t 0 2 0 -1 1 0 2147483648",
    b"put_idem t 0 2 0 -1 1 0 -2147483649",
    b"put_idem t 0 2 0 -1 01 00 9",
])
def test_the_fast_path_and_the_general_path_agree(line):
    from metaq.idempotence.wire import _fast_put_idem, _parse_put_idem

    fast = _fast_put_idem(line)
    try:
        general = _parse_put_idem(line.decode().split(" "))(b"hi")
    except Exception as exc:  # noqa: BLE001 - the general path refuses it: the fast path must not take it
        assert fast is None, exc
        return
    if fast is not None:
        assert fast[0](b"hi") == general and fast[1] == 2
