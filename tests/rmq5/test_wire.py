"""gRPC's framing, RocketMQ 5's message checks and its credentials, without a network (metaq/rmq5, auth/proofs)."""

import base64

import pytest

from metaq.auth import proofs
from metaq.rmq5.records import (MAX_GROUP_BYTES, MAX_PROPERTY_BYTES, MAX_RECALL_HANDLE_BYTES, MAX_USER_PROPERTIES,
                                Recall, Refusal, check_message, group_queue, parse_recall_handle, recall_handle)
from metaq.rmq5.wire import (GrpcError, MessageReader, Status, frame, header_list_size, is_grpc_content_type,
                             parse_timeout, quote_message, rpc_name, trailers, trailers_only, unquote_message)

# -- length-prefixed messages ---------------------------------------------------------------------------------


def test_messages_come_out_whole_whatever_the_frame_boundaries():
    stream = frame(b"first") + frame(b"") + frame(b"x" * 70_000)
    for cut in (1, 3, 5, 6, 11, 4096):
        reader, got = MessageReader(), []
        for i in range(0, len(stream), cut):
            got.extend(reader.feed(stream[i:i + cut]))
        assert got == [b"first", b"", b"x" * 70_000] and reader.buffered == 0 and reader.messages == 3


def test_a_message_at_the_limit_is_read_and_one_byte_more_is_refused_from_its_prefix():
    reader = MessageReader(max_bytes=1000)
    assert reader.feed(frame(b"a" * 1000)) == [b"a" * 1000]
    with pytest.raises(GrpcError) as err:
        MessageReader(max_bytes=1000).feed(frame(b"a" * 1001)[:5])  # the prefix alone: nothing of the body kept
    assert err.value.status == Status.RESOURCE_EXHAUSTED and "1001" in err.value.message


@pytest.mark.parametrize("flag, status", [(1, Status.UNIMPLEMENTED), (2, Status.INTERNAL)])
def test_a_compressed_or_unknown_flag_is_refused(flag, status):
    with pytest.raises(GrpcError) as err:
        MessageReader().feed(bytes([flag]) + b"\0\0\0\1x")
    assert err.value.status == status


@pytest.mark.parametrize("value, seconds", [("1S", 1.0), ("250m", 0.25), ("3M", 180.0), ("2H", 7200.0),
                                            ("99999999u", 99.999999), ("5000000n", 0.005), (None, None)])
def test_grpc_timeout_values(value, seconds):
    assert parse_timeout(value) == pytest.approx(seconds) if seconds is not None else parse_timeout(value) is None


@pytest.mark.parametrize("value", ["", "S", "123456789S", "10s", "1.5S", "-1S", "١S", "10"])
def test_a_malformed_grpc_timeout_is_invalid_argument(value):
    with pytest.raises(GrpcError) as err:
        parse_timeout(value)
    assert err.value.status == Status.INVALID_ARGUMENT


def test_grpc_message_is_percent_encoded_utf8_and_decodes_back():
    text = "topic «orders» 100% full\r\n"
    quoted = quote_message(text)
    assert quoted.isascii() and "%25" in quoted and "%0D%0A" in quoted and "%C2%AB" in quoted
    assert unquote_message(quoted) == text
    assert unquote_message("bad %zz escape %") == "bad %zz escape %"


def test_trailers_and_trailers_only():
    assert trailers(Status.OK) == [("grpc-status", "0")]
    only = dict(trailers_only(Status.UNIMPLEMENTED, "no such method"))
    assert only[":status"] == "200" and only["content-type"] == "application/grpc"
    assert only["grpc-status"] == "12" and only["grpc-message"] == "no such method"


def test_paths_and_content_types():
    assert rpc_name("/apache.rocketmq.v2.MessagingService/SendMessage") == "SendMessage"
    assert rpc_name("/apache.rocketmq.v2.MessagingService/") is None
    assert rpc_name("/apache.rocketmq.v2.Admin/ChangeLogLevel") is None
    assert rpc_name("/apache.rocketmq.v2.MessagingService/a/b") is None
    assert is_grpc_content_type("application/grpc") and is_grpc_content_type("application/grpc+proto")
    assert not is_grpc_content_type("application/json") and not is_grpc_content_type(None)


def test_header_list_size_is_http2s_measure():
    assert header_list_size([(":path", "/x"), ("a", "bc")]) == (5 + 2 + 32) + (1 + 2 + 32)


# -- RocketMQ 5 messages -------------------------------------------------------------------------------------


def check(**kw):
    args = dict(topic="orders", tag=None, keys=[], message_id="ID1", group=None, deliver_ms=None,
                user_properties={}, message_type=1)
    args.update(kw)
    return check_message(**args)


def test_a_message_is_laid_out_as_a_remoting_send_stores_it():
    c = check(tag="TagA", keys=["k1", "k2"], user_properties={"color": "red"})
    assert c.properties == {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ID1", "color": "red"}
    assert (c.group, c.deliver_ms, c.message_type) == (None, None, 1)
    fifo = check(group="g-1")
    assert fifo.properties["__SHARDINGKEY"] == "g-1" and fifo.message_type == 2
    timed = check(deliver_ms=1_700_000_000_123)
    assert timed.properties["TIMER_DELIVER_MS"] == "1700000000123" and timed.message_type == 3


@pytest.mark.parametrize("kw, code", [
    (dict(message_id=" "), "ILLEGAL_MESSAGE_ID"),
    (dict(tag="a|b"), "ILLEGAL_MESSAGE_TAG"),
    (dict(tag=" "), "ILLEGAL_MESSAGE_TAG"),
    (dict(keys=["ok", "bad\x01"]), "ILLEGAL_MESSAGE_KEY"),
    (dict(group="g" * MAX_GROUP_BYTES), "ILLEGAL_MESSAGE_GROUP"),
    (dict(user_properties={"KEYS": "x"}), "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    (dict(user_properties={"a\nb": "x"}), "ILLEGAL_MESSAGE_PROPERTY_KEY"),
    (dict(user_properties={"p%d" % i: "v" for i in range(MAX_USER_PROPERTIES + 1)}), "MESSAGE_PROPERTIES_TOO_LARGE"),
    (dict(user_properties={"big": "v" * (MAX_PROPERTY_BYTES - 2)}), "MESSAGE_PROPERTIES_TOO_LARGE"),
    (dict(message_type=4, group="g"), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
    (dict(message_type=4, deliver_ms=5), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
    (dict(group="g", deliver_ms=5), "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"),
])
def test_what_the_proxy_refuses_is_refused_with_its_code(kw, code):
    with pytest.raises(Refusal) as err:
        check(**kw)
    assert err.value.code == code


def test_the_limits_of_a_message_hold_at_the_limit():
    check(group="g" * (MAX_GROUP_BYTES - 1))
    check(user_properties={"p%d" % i: "v" for i in range(MAX_USER_PROPERTIES)})
    check(user_properties={"big": "v" * (MAX_PROPERTY_BYTES - 3)})  # "big" + the value: the limit exactly


def test_a_message_group_always_goes_to_the_same_queue():
    assert group_queue("order-42", 8) == group_queue("order-42", 8)
    assert len({group_queue("order-%d" % i, 8) for i in range(100)}) == 8  # and groups spread over the queues


# -- credentials ---------------------------------------------------------------------------------------------


def test_the_mqv2_signature_is_hex_hmac_sha1_of_the_date_time():
    # computed apart: printf 20261125T120000Z | openssl dgst -sha1 -hmac alice-secret-0123456789
    assert proofs.mqv2_signature(b"alice-secret-0123456789", "20261125T120000Z") == \
        "b3e93bbd942c1b44502f8b575b81b7f03ca612d7"


def test_the_authorization_header_is_read_as_rocketmqs_broker_reads_it():
    value = "MQv2-HMAC-SHA1 Credential=alice/x/y, SignedHeaders=x-mq-date-time, Signature=B3E93BBD"
    assert proofs.parse_mqv2(value) == ("alice", "b3e93bbd")  # the user before "/", the hex in lower case
    for bad in ("MQv1-HMAC-SHA1 Credential=alice, Signature=ab", "MQv2-HMAC-SHA1 Credential=, Signature=ab",
                "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time", "garbage"):
        with pytest.raises(ValueError):
            proofs.parse_mqv2(bad)


def test_a_recall_handle_gives_back_what_it_names_and_others_are_refused():
    r = Recall("tq", "metaq-7", 1_800_000_000_000, "01ABCDEF", 123456789)
    handle = recall_handle(r)
    assert parse_recall_handle(handle) == r
    assert base64.urlsafe_b64decode(handle).decode().startswith("v1 tq metaq-7 1800000000000 01ABCDEF")
    for bad in ("", "%%%", base64.urlsafe_b64encode(b"v1 tq metaq-7 x 01 2").decode(),
                base64.urlsafe_b64encode(b"v2 tq metaq-7 1 01 2").decode()):
        with pytest.raises(Refusal) as err:
            parse_recall_handle(bad)
        assert err.value.code == "BAD_REQUEST"


def test_a_recall_handle_is_read_up_to_its_limit():
    # "v1 <topic> b 1 m 2": 1,536 bytes of text are 2,048 of Base64, the limit
    at = Recall("t" * (MAX_RECALL_HANDLE_BYTES * 3 // 4 - 11), "b", 1, "m", 2)
    assert len(recall_handle(at)) == MAX_RECALL_HANDLE_BYTES and parse_recall_handle(recall_handle(at)) == at
    past = recall_handle(at._replace(topic=at.topic + "t"))
    with pytest.raises(Refusal) as err:
        parse_recall_handle(past)
    assert err.value.code == "BAD_REQUEST" and "at most %d" % MAX_RECALL_HANDLE_BYTES in err.value.message
