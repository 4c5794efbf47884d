"""Malformed remoting frames: each gets a clean error response or a close, and the broker keeps serving."""

import json
import struct

import pytest

from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from metaq.client.raw import RemotingClient


def frame(header, body=b"", serialize_type=0, total=None, header_len=None):
    header_len = len(header) if header_len is None else header_len
    total = 4 + len(header) + len(body) if total is None else total
    return struct.pack(">iI", total, (serialize_type << 24) | header_len) + header + body


def json_header(**fields):
    return json.dumps(fields).encode()


BROKEN = {
    "length below 4": struct.pack(">ii", 2, 0),
    "negative length": struct.pack(">ii", -5, 0),
    "length over the frame limit": struct.pack(">ii", 20 << 20, 10),
    "unknown serialize type": frame(json_header(code=105, opaque=1), serialize_type=7),
    "header length past the frame": frame(json_header(code=105, opaque=1), header_len=500),
    "header is not JSON": frame(b"{not json"),
    "header is a JSON list": frame(b"[1,2]"),
    "binary header too short": frame(b"\x00\x69\x00", serialize_type=1),
    "binary header ext length past its end": frame(struct.pack(">hbhiii", 105, 0, 121, 1, 0, 0)
                                                   + struct.pack(">i", 999), serialize_type=1),
}


def assert_still_serving(port):
    with RemotingClient(port) as rc:
        assert rc.call(R.GET_ROUTEINFO_BY_TOPIC, {"topic": "tAlive"}).code == C.SUCCESS


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_frames_close_the_connection(rmq_broker, name):
    port = rmq_broker.config["remoting"]["port"]
    with RemotingClient(port) as rc:
        rc.send_raw(BROKEN[name])
        assert rc.is_closed(), name
    assert_still_serving(port)


def test_eof_inside_a_frame_and_a_half_sent_frame(rmq_broker):
    port = rmq_broker.config["remoting"]["port"]
    with RemotingClient(port) as rc:
        rc.send_raw(frame(json_header(code=105, opaque=1, extFields={"topic": "t"}))[:-3])
        rc.sock.shutdown(1)  # EOF with the frame incomplete
        assert rc.is_closed()
    assert_still_serving(port)


def test_bad_fields_get_error_responses_on_a_connection_that_stays_open(rmq_broker):
    port = rmq_broker.config["remoting"]["port"]
    with RemotingClient(port) as rc:
        rc.send_raw(frame(json_header(code="x", opaque=41)))
        r = rc.read()
        assert (r.opaque, r.code, r.is_response) == (41, C.INVALID_PARAMETER, True) and "code" in r.remark
        missing = rc.call(R.SEND_MESSAGE, {"topic": "tB"}, b"body")
        assert missing.code == C.INVALID_PARAMETER and "producerGroup" in missing.remark
        not_a_number = rc.call(R.PULL_MESSAGE, {"consumerGroup": "g", "topic": "tB", "queueId": "zero",
                                                "queueOffset": 0, "maxMsgNums": 1, "sysFlag": 0, "commitOffset": 0,
                                                "suspendTimeoutMillis": 0})
        assert not_a_number.code == C.INVALID_PARAMETER and "queueId" in not_a_number.remark
        assert rc.call(R.HEART_BEAT, body=b"\xff not json").code == C.INVALID_PARAMETER
        assert rc.call(R.HEART_BEAT, body=b'{"no":"client id"}').code == C.INVALID_PARAMETER
        bad_batch = rc.call(R.SEND_BATCH_MESSAGE, {"a": "PG", "b": "tB", "e": 0, "f": 0, "g": 0, "h": 0, "m": "true"},
                            b"\x00\x00\x00\x30garbage")
        assert bad_batch.code == C.INVALID_PARAMETER
        bad_props = rc.call(R.SEND_MESSAGE_V2, {"a": "PG", "b": "tB", "e": 0, "f": 0, "g": 0, "h": 0,
                                                "i": "TAGS\x01a\x02b\x02"}, b"x")
        assert bad_props.code == C.SUCCESS  # Java skips a property without a value, and so do we
        too_big = rc.call(R.SEND_MESSAGE_V2, {"a": "PG", "b": "tB", "e": 0, "f": 0, "g": 0, "h": 0},
                          b"x" * (300 * 1024))
        assert too_big.code == C.MESSAGE_ILLEGAL and "max_body_bytes" in too_big.remark
        assert rc.call(R.GET_MAX_OFFSET, {"topic": "tB", "queueId": 0}).ext_fields["offset"] == "1"


def test_binary_rocketmq_headers_are_answered_in_json(rmq_broker):
    port = rmq_broker.config["remoting"]["port"]
    ext = struct.pack(">h", 5) + b"topic" + struct.pack(">i", 6) + b"tBinar"
    header = struct.pack(">hbhii", 105, 0, 121, 77, 0) + struct.pack(">i", 0) + struct.pack(">i", len(ext)) + ext
    with RemotingClient(port) as rc:
        rc.send_raw(frame(header, serialize_type=1))
        raw = rc.sock.recv(8)
        total, word = struct.unpack(">iI", raw)
        assert word >> 24 == 0  # always JSON back
        rest = b""
        while len(rest) < total - 4:
            rest += rc.sock.recv(65536)
        reply = json.loads(rest[:word])
        assert (reply["code"], reply["opaque"], reply["flag"]) == (0, 77, 1)
        assert json.loads(rest[word:])["queueDatas"][0]["readQueueNums"] == 4
