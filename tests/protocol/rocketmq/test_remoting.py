"""The remoting frame codec: reference examples byte for byte, both header types, limits, errors, properties."""

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.server.remoting import limits as remoting_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol.rocketmq.remoting import (
    DEFAULT_VERSION,
    RPC_ONEWAY,
    RPC_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    RemotingCommand,
    RemotingParser,
    RequestCode,
    ResponseCode,
    encode_command,
    ext_str,
    make_request,
    not_supported,
    response_for,
)
from metaq.protocol.stream import CLOSED, NEED_DATA

INT32 = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


def frame(header, body=b"", serialize_type=SERIALIZE_JSON):
    """A frame built by hand from the reference's layout (independent of the codec)."""
    return struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + header + body


def parse_all(data, eof=False, **kw):
    parser = RemotingParser(**kw)
    parser.receive_data(data)
    if eof:
        parser.receive_data(b"")
    out = []
    while True:
        event = parser.next_event()
        if event is NEED_DATA or event is CLOSED:
            return out, event
        out.append(event)


def parse_one(data, **kw):
    events, _ = parse_all(data, **kw)
    assert len(events) == 1
    return events[0]


def parse_bytewise(data, **kw):
    parser = RemotingParser(**kw)
    out = []
    for i in range(len(data)):
        parser.receive_data(data[i:i + 1])
        while (event := parser.next_event()) is not NEED_DATA:
            out.append(event)
    parser.receive_data(b"")
    assert parser.next_event() is CLOSED
    return out


def expect_error(data, fatal, eof=False, **kw):
    parser = RemotingParser(**kw)
    parser.receive_data(data)
    if eof:
        parser.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        while parser.next_event() is not NEED_DATA:
            pass
    assert info.value.fatal is fatal
    if fatal:  # a fatal error sticks
        with pytest.raises(RemoteProtocolError) as again:
            parser.next_event()
        assert again.value is info.value
    return parser, info.value


# Reference examples -----------------------------------------------------------------

REFERENCE_JSON = (b'{"code":0,"extFields":{"msgId":"7F00000100002A9F0000000000000000","queueId":"1","queueOffset":"0"},'
                  b'"flag":1,"language":"JAVA","opaque":2,"serializeTypeCurrentRPC":"JSON","version":479}')

REFERENCE_BINARY = bytes.fromhex(
    "00000025 01000021 0069 00 0079 00000001 00000000 00000000 0000000c 0005 746f706963 00000001 54".replace(" ", ""))


def test_reference_json_header_is_written_byte_for_byte():
    cmd = RemotingCommand(0, "JAVA", 479, 2, RPC_RESPONSE, None,
                          {"queueOffset": 0, "msgId": "7F00000100002A9F0000000000000000", "queueId": 1})
    assert encode_command(cmd) == frame(REFERENCE_JSON)


def test_reference_json_header_parses():
    cmd = parse_one(frame(REFERENCE_JSON))
    assert cmd == RemotingCommand(0, "JAVA", 479, 2, 1, None, {"msgId": "7F00000100002A9F0000000000000000",
                                                                "queueId": "1", "queueOffset": "0"}, b"")
    assert cmd.is_response and not cmd.is_oneway


def test_reference_binary_header_worked_example():
    cmd = parse_one(REFERENCE_BINARY)
    assert cmd == RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, "JAVA", 121, 1, 0, None, {"topic": "T"}, b"",
                                  SERIALIZE_ROCKETMQ)


def test_reference_json_form_of_the_same_request_starts_as_documented():
    # The reference's 0x5a-byte header is fastjson's output without "serializeTypeCurrentRPC":"JSON",
    # (33 bytes), which its other example, and Java, do write: both forms are available.
    request = make_request(105, {"topic": "T"}, opaque=1, version=121)
    data = encode_command(request, type_field=False)
    assert data[:8] == bytes.fromhex("0000005e0000005a")
    assert data[8:19] == b'{"code":105'
    assert len(encode_command(request)) == len(data) + len(b'"serializeTypeCurrentRPC":"JSON",')
    cmd = parse_one(data)
    assert (cmd.code, cmd.version, cmd.opaque, cmd.ext_fields, cmd.serialize_type) == (105, 121, 1, {"topic": "T"}, 0)


def test_cpp_client_header_with_mixed_types_and_trailing_newline():
    header = (b'{"code":310,"language":"CPP","version":63,"opaque":7,"flag":0,"remark":"",'
              b'"extFields":{"a":"PG","d":4,"sysFlag":0,"g":"1795324130575","commitOffset":"-1","k":"0","m":"0",'
              b'"unitMode":true,"batch":false,"big":12345678901234567890,"f":1.50,"e":-0,"n":null,'
              b'"AccessKey":"","OnsChannel":"ALIYUN","nested":{"x":[1,"y"]}}}\n')
    cmd = parse_one(frame(header, b"hello"))
    assert cmd.code == 310 and cmd.language == "CPP" and cmd.version == 63 and cmd.opaque == 7
    assert cmd.remark == "" and cmd.body == b"hello"
    assert cmd.ext_fields == {
        "a": "PG", "d": "4", "sysFlag": "0", "g": "1795324130575", "commitOffset": "-1", "k": "0", "m": "0",
        "unitMode": "true", "batch": "false", "big": "12345678901234567890", "f": "1.50", "e": "0",
        "AccessKey": "", "OnsChannel": "ALIYUN", "nested": '{"x":[1,"y"]}',
    }  # null "n" is absent, as Java treats it


def test_header_word_high_byte_is_masked_and_replies_are_json():
    cmd = parse_one(REFERENCE_BINARY)
    data = encode_command(response_for(cmd, ResponseCode.SUCCESS, body=b"x"))
    assert data[4] == 0  # the C++ client reads the word unmasked
    reply = parse_one(data)
    assert reply.serialize_type == SERIALIZE_JSON and reply.opaque == 1 and reply.flag == RPC_RESPONSE


# Flags, opaque, helpers -------------------------------------------------------------


def test_flags():
    assert not make_request(10).is_response and not make_request(10).is_oneway
    oneway = make_request(15, oneway=True)
    assert oneway.flag == RPC_ONEWAY and oneway.is_oneway and not oneway.is_response
    assert RemotingCommand(0, flag=3).is_response and RemotingCommand(0, flag=3).is_oneway


def test_response_for_copies_opaque_and_sets_response_bit():
    request = parse_one(frame(b'{"code":14,"opaque":-5,"flag":2,"language":"CPP","version":63}'))
    reply = response_for(request, ResponseCode.QUERY_NOT_FOUND, remark="not found", ext_fields={"offset": -1})
    assert (reply.opaque, reply.flag, reply.code, reply.remark) == (-5, RPC_RESPONSE, 22, "not found")
    assert parse_one(encode_command(reply)).ext_fields == {"offset": "-1"}


def test_not_supported_says_what_java_says():
    reply = not_supported(make_request(200050, opaque=9))
    assert (reply.code, reply.remark, reply.opaque, reply.flag) == (3, " request type 200050 not supported", 9, 1)


def test_encode_writes_only_strings_and_leaves_nulls_out():
    cmd = RemotingCommand(1, ext_fields={"b": True, "a": 5, "c": None, "d": "x"}, remark=None)
    header = json.loads(encode_command(cmd)[8:])
    assert header["extFields"] == {"a": "5", "b": "true", "d": "x"}
    assert "remark" not in header
    assert list(header) == sorted(header)
    assert "extFields" not in json.loads(encode_command(RemotingCommand(1))[8:])
    assert json.loads(encode_command(RemotingCommand(1, remark=""))[8:])["remark"] == ""


def test_encode_writes_utf8_not_escapes():
    data = encode_command(RemotingCommand(1, remark="é", ext_fields={"k": "\x01v\x02"}))
    assert "é".encode() in data and b"\\u0001v\\u0002" in data


@pytest.mark.parametrize("field,value", [("code", 2**31), ("opaque", -(2**31) - 1), ("flag", True), ("version", "1")])
def test_encode_rejects_non_int32_fields(field, value):
    with pytest.raises(ValueError):
        encode_command(RemotingCommand(**{"code": 1, field: value}))


def test_encode_rejects_header_over_24_bits():
    with pytest.raises(ValueError):
        encode_command(RemotingCommand(1, remark="x" * 0x1000000))


def test_ext_str():
    assert [ext_str(v) for v in ("s", True, False, 7, -3, 1.5, None, [1], {"a": 1})] == [
        "s", "true", "false", "7", "-3", "1.5", None, "[1]", '{"a":1}']
    with pytest.raises(TypeError):
        ext_str(object())


# Incremental parsing ----------------------------------------------------------------


def test_several_frames_in_one_chunk_and_bytewise():
    cmds = [make_request(10, {"a": "x"}, b"body", opaque=1), make_request(34, body=b"", opaque=2),
            response_for(make_request(11, opaque=3), 0, "FOUND", {"k": "v"}, b"\x00" * 300)]
    data = b"".join(encode_command(c) for c in cmds)
    assert parse_all(data, eof=True) == (cmds, CLOSED)
    assert parse_bytewise(data) == cmds


def test_clean_eof_and_eof_inside_a_frame():
    assert parse_all(b"", eof=True) == ([], CLOSED)
    data = encode_command(make_request(10, body=b"abc"))
    for cut in (1, 4, 7, 8, len(data) - 1):
        _, exc = expect_error(data[:cut], fatal=True, eof=True)
        assert "closed inside a frame" in exc.reason


def test_data_after_eof_is_fatal():
    parser = RemotingParser()
    parser.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        parser.receive_data(b"x")
    assert info.value.fatal


# Limits -------------------------------------------------------------------------------


def _prefix(total, header_len, serialize_type=0):
    return struct.pack(">iI", total, (serialize_type << 24) | header_len)


def test_default_frame_limit_is_checked_on_the_prefix():
    assert remoting_limits.MAX_REMOTING_FRAME == 16 * 1024 * 1024
    parser = RemotingParser()
    parser.receive_data(_prefix(remoting_limits.MAX_REMOTING_FRAME - 4, 10))  # exactly at the limit: wait for it
    assert parser.next_event() is NEED_DATA
    _, exc = expect_error(_prefix(remoting_limits.MAX_REMOTING_FRAME - 3, 10)[:4], fatal=True)
    assert "exceeds the limit" in exc.reason


def test_frame_limit_at_and_past():
    cmd = make_request(10, body=b"x" * 100)
    data = encode_command(cmd)
    assert parse_one(data, max_frame=len(data)) == cmd
    expect_error(data, fatal=True, max_frame=len(data) - 1)


def test_header_limit_at_and_past():
    data = encode_command(make_request(10, {"k": "v" * 50}))
    (header_len,) = struct.unpack(">I", data[4:8])
    assert parse_one(data, max_header=header_len).ext_fields == {"k": "v" * 50}
    _, exc = expect_error(data[:8], fatal=True, max_header=header_len - 1)
    assert "header of" in exc.reason
    assert remoting_limits.MAX_REMOTING_HEADER == 1024 * 1024
    parser = RemotingParser()
    parser.receive_data(_prefix(remoting_limits.MAX_REMOTING_HEADER + 4, remoting_limits.MAX_REMOTING_HEADER))
    assert parser.next_event() is NEED_DATA
    expect_error(_prefix(remoting_limits.MAX_REMOTING_HEADER + 5, remoting_limits.MAX_REMOTING_HEADER + 1), fatal=True)


@pytest.mark.parametrize("prefix,reason", [
    (_prefix(3, 0), "less than 4"),
    (_prefix(-1, 0), "less than 4"),
    (_prefix(10, 7), "exceeds the frame"),
    (_prefix(10, 2, serialize_type=2), "unknown serialize type 2"),
    (_prefix(10, 2, serialize_type=0xFF), "unknown serialize type 255"),
])
def test_broken_frame_structure_is_fatal(prefix, reason):
    _, exc = expect_error(prefix, fatal=True)
    assert reason in exc.reason and exc.opaque == 0


# JSON header errors ------------------------------------------------------------------


@pytest.mark.parametrize("header", [
    b"", b"{", b"[1]", b'"x"', b"\xff{}", b'{"code":NaN}', b'{"code":1,"x":Infinity}', b"[" * 100000,
    b'{"code":1} x', "{\"code\":1}".encode("utf-16"),
])
def test_undecodable_json_header_is_fatal(header):
    expect_error(frame(header), fatal=True)


@pytest.mark.parametrize("header,opaque", [
    (b'{"opaque":4}', 4),
    (b'{"code":"10","opaque":4}', 4),
    (b'{"code":1.0,"opaque":4}', 4),
    (b'{"code":true,"opaque":4}', 4),
    (b'{"code":2147483648,"opaque":4}', 4),
    (b'{"code":1,"opaque":4,"flag":"1"}', 4),
    (b'{"code":1,"opaque":4,"extFields":[1]}', 4),
    (b'{"code":1,"opaque":4,"language":[]}', 4),
    (b'{"code":1,"opaque":"4"}', 0),
    (b'{"code":1,"opaque":99999999999}', 0),
])
def test_bad_json_field_is_not_fatal_and_keeps_the_opaque(header, opaque):
    good = make_request(34, opaque=8)
    parser, exc = expect_error(frame(header) + encode_command(good), fatal=False)
    assert exc.opaque == opaque
    assert parser.next_event() == good


def test_json_defaults_and_language_forms():
    cmd = parse_one(frame(b'{"code":34}'))
    assert (cmd.language, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields) == ("JAVA", 0, 0, 0, None, {})
    assert parse_one(frame(b'{"code":34,"language":1}')).language == "CPP"
    assert parse_one(frame(b'{"code":34,"language":"GOLANG"}')).language == "GOLANG"
    assert parse_one(frame(b'{"code":34,"remark":null,"extFields":null}')).remark is None
    assert parse_one(frame(b'{"code":34,"remark":5}')).remark == "5"


# ROCKETMQ binary headers --------------------------------------------------------------


def binary_header(code, language, version, opaque, flag, remark, ext):
    """An independent encoder of RocketMQSerializable.rocketMQProtocolEncode."""
    out = struct.pack(">hbhii", code, language, version, opaque, flag)
    remark_bytes = (remark or "").encode()
    out += struct.pack(">i", len(remark_bytes)) + remark_bytes
    entries = b""
    for key, value in ext.items():
        k, v = key.encode(), value.encode()
        entries += struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v
    return out + struct.pack(">i", len(entries)) + entries


def test_binary_header_with_remark_ext_and_body():
    header = binary_header(-2, 1, 63, -7, 3, "oops é", {"topic": "T", "queueId": "3", "empty": ""})
    cmd = parse_one(frame(header, b"payload", SERIALIZE_ROCKETMQ))
    # a zero-length value reads as null: the entry is absent
    assert cmd == RemotingCommand(-2, "CPP", 63, -7, 3, "oops é", {"topic": "T", "queueId": "3"}, b"payload",
                                  SERIALIZE_ROCKETMQ)


def test_binary_header_unknown_language_and_invalid_utf8():
    header = binary_header(10, 99, 1, 1, 0, None, {})
    assert parse_one(frame(header, b"", SERIALIZE_ROCKETMQ)).language == "OTHER"
    raw = struct.pack(">hbhii", 10, 0, 1, 1, 0) + struct.pack(">i", 1) + b"\xff" + struct.pack(">i", 0)
    assert parse_one(frame(raw, b"", SERIALIZE_ROCKETMQ)).remark == "\ufffd"


@pytest.mark.parametrize("raw", [
    struct.pack(">hbhii", 1, 0, 0, 5, 0),  # too short for the two lengths
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">i", 10) + struct.pack(">i", 0),  # remark past the end
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">i", -1) + struct.pack(">i", 0),
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 5) + b"\x00",  # ext past the end
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 1) + b"\x00",  # truncated key length
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 3) + b"\x00\x01k",  # truncated value length
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 2) + b"\xff\xff",  # negative key length
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 7) + b"\x00\x01k\x00\x00\x00\x09",
    struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 0) + b"junk",  # bytes after the ext fields
])
def test_malformed_binary_header_is_fatal_with_opaque(raw):
    _, exc = expect_error(frame(raw, b"", SERIALIZE_ROCKETMQ), fatal=True)
    assert exc.opaque == 5


# Properties ------------------------------------------------------------------------------

EXT = st.dictionaries(TEXT, TEXT, max_size=6)
COMMANDS = st.builds(
    RemotingCommand,
    code=INT32, language=st.sampled_from(["JAVA", "CPP", "GO", "PYTHON"]), version=INT32, opaque=INT32,
    flag=INT32, remark=st.none() | TEXT, ext_fields=EXT, body=st.binary(max_size=300),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(COMMANDS, min_size=1, max_size=4))
def test_round_trip_whole_and_bytewise(cmds):
    data = b"".join(encode_command(c) for c in cmds)
    assert parse_all(data, eof=True) == (cmds, CLOSED)
    assert parse_bytewise(data) == cmds


@settings(max_examples=200, deadline=None)
@given(code=st.integers(-(2**15), 2**15 - 1), language=st.integers(0, 13), version=st.integers(-(2**15), 2**15 - 1),
       opaque=INT32, flag=INT32, remark=st.none() | TEXT.filter(bool),
       ext=st.dictionaries(TEXT.filter(bool), TEXT.filter(bool), max_size=5), body=st.binary(max_size=50))
def test_binary_header_round_trip(code, language, version, opaque, flag, remark, ext, body):
    data = frame(binary_header(code, language, version, opaque, flag, remark, ext), body, SERIALIZE_ROCKETMQ)
    cmd = parse_one(data)
    assert (cmd.code, cmd.version, cmd.opaque, cmd.flag, cmd.remark, cmd.ext_fields, cmd.body) == (
        code, version, opaque, flag, remark, ext, body)
    assert parse_bytewise(data) == [cmd]
    # answered in JSON, it reads back the same
    assert parse_one(encode_command(cmd)) == RemotingCommand(code, cmd.language, version, opaque, flag, remark, ext,
                                                             body)


def _run_fuzz(data, **kw):
    parser = RemotingParser(**kw)
    try:
        parser.receive_data(data)
        parser.receive_data(b"")
        for _ in range(len(data) + 2):
            try:
                if parser.next_event() is CLOSED:
                    return
            except RemoteProtocolError as exc:
                if exc.fatal:
                    return
    except RemoteProtocolError:
        return


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_remote_protocol_errors(data):
    _run_fuzz(data)
    _run_fuzz(data, max_frame=64, max_header=16)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([0, 1]), st.binary(max_size=120), st.binary(max_size=20))
def test_random_headers_in_valid_frames_raise_only_remote_protocol_errors(serialize_type, header, body):
    _run_fuzz(frame(header, body, serialize_type))


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
                    max_leaves=10),
       st.dictionaries(TEXT, st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT, max_size=4))
def test_any_json_header_gives_a_command_or_a_protocol_error(value, ext):
    for header in ({"code": value, "opaque": 1}, {"code": 1, "extFields": ext, "remark": value}, value):
        try:
            cmd = parse_one(frame(json.dumps(header).encode()))
        except RemoteProtocolError:
            continue
        assert all(isinstance(v, str) for v in cmd.ext_fields.values())
        assert parse_one(encode_command(cmd)) == cmd


def test_java_version_default():
    assert make_request(1).version == DEFAULT_VERSION == 479
