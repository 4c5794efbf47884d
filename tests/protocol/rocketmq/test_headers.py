"""Typed custom headers: v1/v2 send headers, Java number and boolean parsing, required fields."""

import struct

import pytest

from metaq.errors import RemoteProtocolError
from metaq.protocol.rocketmq.remoting import RemotingParser, make_request
from metaq.protocol.rocketmq.headers import (
    ConsumerGroupHeader,
    ConsumerSendMsgBackHeader,
    EndTransactionHeader,
    PullMessageHeader,
    QueryConsumerOffsetHeader,
    QueueHeader,
    RouteInfoHeader,
    SearchOffsetHeader,
    SendMessageHeader,
    UnregisterClientHeader,
    UpdateConsumerOffsetHeader,
    ViewMessageHeader,
    decode_header,
    decode_send_header,
    java_bool,
    java_int,
    java_long,
    pull_response_fields,
    send_response_fields,
)

V1 = {"producerGroup": "PG", "topic": "T", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4", "queueId": "2",
      "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "0", "properties": "UNIQ_KEY\x01AB\x02WAIT\x01true\x02",
      "reconsumeTimes": "0", "unitMode": "false", "batch": "false", "maxReconsumeTimes": "16"}
V2 = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "2", "f": "0", "g": "1700000000000", "h": "0",
      "i": "UNIQ_KEY\x01AB\x02WAIT\x01true\x02", "j": "0", "k": "false", "l": "16", "m": "false"}
EXPECTED = SendMessageHeader("PG", "T", "TBW102", 4, 2, 0, 1700000000000, 0, "UNIQ_KEY\x01AB\x02WAIT\x01true\x02",
                             0, False, 16, False, None)


def test_send_v1_and_v2_give_the_same_header():
    assert decode_send_header(make_request(10, V1)) == EXPECTED
    assert decode_send_header(make_request(310, V2)) == EXPECTED
    assert decode_send_header(make_request(320, dict(V2, m="true"))) == EXPECTED._replace(batch=True)


def test_send_v2_from_the_cpp_client_with_numbers_and_extra_keys():
    header = (b'{"code":310,"language":"CPP","version":333,"opaque":1,"flag":0,"remark":"","extFields":'
              b'{"a":"PG","b":"T","c":"TBW102","d":4,"e":2,"f":0,"g":"1700000000000","h":0,"i":"","j":0,'
              b'"k":"0","l":16,"m":"0","AccessKey":"","OnsChannel":"ALIYUN","Signature":"x"}}\n')
    parser = RemotingParser()
    parser.receive_data(struct.pack(">iI", 4 + len(header), len(header)) + header)
    h = decode_send_header(parser.next_event())
    assert h == EXPECTED._replace(properties="")


def test_send_header_optional_fields_default():
    minimal = {k: V1[k] for k in ("producerGroup", "topic", "queueId", "sysFlag", "bornTimestamp", "flag")}
    h = decode_send_header(make_request(10, minimal))
    assert (h.default_topic, h.default_topic_queue_nums, h.properties, h.reconsume_times, h.unit_mode,
            h.max_reconsume_times, h.batch, h.broker_name) == ("TBW102", 4, "", 0, False, None, False, None)


@pytest.mark.parametrize("missing", ["producerGroup", "topic", "queueId", "sysFlag", "bornTimestamp", "flag"])
def test_send_header_required_fields(missing):
    ext = dict(V1)
    del ext[missing]
    with pytest.raises(RemoteProtocolError) as info:
        decode_send_header(make_request(10, ext, opaque=77))
    assert info.value.opaque == 77 and not info.value.fatal and missing in info.value.reason


def test_decode_send_header_refuses_other_codes():
    with pytest.raises(ValueError):
        decode_send_header(make_request(11, V1))


@pytest.mark.parametrize("text,value", [("0", 0), ("-1", -1), ("+5", 5), ("2147483647", 2147483647),
                                        ("-2147483648", -2147483648), ("007", 7)])
def test_java_int(text, value):
    assert java_int(text) == value


@pytest.mark.parametrize("text", ["", " 1", "1 ", "1_000", "1.0", "0x10", "2147483648", "-2147483649", "١", "+-1"])
def test_java_int_rejects(text):
    with pytest.raises(RemoteProtocolError):
        java_int(text, "queueId", 3)


def test_java_long_range():
    assert java_long("9223372036854775807") == 2**63 - 1
    with pytest.raises(RemoteProtocolError):
        java_long("9223372036854775808")


@pytest.mark.parametrize("text,value", [("true", True), ("TRUE", True), ("True", True), ("false", False),
                                        ("0", False), ("1", False), ("", False), ("yes", False)])
def test_java_bool(text, value):
    assert java_bool(text) is value


def test_pull_header():
    ext = {"consumerGroup": "CG", "topic": "T", "queueId": "1", "queueOffset": "10", "maxMsgNums": "32",
           "sysFlag": "6", "commitOffset": "-1", "suspendTimeoutMillis": "15000", "subscription": "*",
           "subVersion": "1795324130575", "expressionType": "TAG", "lo": "x", "bname": "b"}
    h = decode_header(PullMessageHeader, make_request(11, ext))
    assert h == PullMessageHeader("CG", "T", 1, 10, 32, 6, -1, 15000, "*", 1795324130575, "TAG", None)
    with pytest.raises(RemoteProtocolError):
        decode_header(PullMessageHeader, make_request(11, dict(ext, queueOffset="x")))


@pytest.mark.parametrize("cls,ext,expected", [
    (QueryConsumerOffsetHeader, {"consumerGroup": "G", "topic": "T", "queueId": "0"}, ("G", "T", 0, True)),
    (QueryConsumerOffsetHeader, {"consumerGroup": "G", "topic": "T", "queueId": "0", "setZeroIfNotFound": "false"},
     ("G", "T", 0, False)),
    (UpdateConsumerOffsetHeader, {"consumerGroup": "G", "topic": "T", "queueId": "3", "commitOffset": "-1"},
     ("G", "T", 3, -1)),
    (SearchOffsetHeader, {"topic": "T", "queueId": "1", "timestamp": "123"}, ("T", 1, 123, "lower")),
    (QueueHeader, {"topic": "T", "queueId": "1"}, ("T", 1, True)),
    (ConsumerSendMsgBackHeader, {"offset": "4096", "group": "G", "delayLevel": "0", "originMsgId": "AB",
                                 "maxReconsumeTimes": "16"}, (4096, "G", 0, "AB", None, False, 16)),
    (EndTransactionHeader, {"producerGroup": "PG", "tranStateTableOffset": "5", "commitLogOffset": "100",
                            "commitOrRollback": "8", "msgId": "ID", "fromTransactionCheck": "true"},
     ("PG", 5, 100, 8, True, "ID", None, None)),
    (UnregisterClientHeader, {"clientID": "c@1", "producerGroup": "", "consumerGroup": "G"}, ("c@1", "", "G")),
    (ConsumerGroupHeader, {"consumerGroup": "G"}, ("G",)),
    (RouteInfoHeader, {"topic": "%RETRY%G"}, ("%RETRY%G", False)),
    (ViewMessageHeader, {"offset": "7"}, (7, None)),
])
def test_other_headers(cls, ext, expected):
    assert tuple(decode_header(cls, make_request(1, ext))) == expected
    if ext:
        with pytest.raises(RemoteProtocolError):
            decode_header(cls, make_request(1, {}))


def test_response_fields_are_complete_strings():
    assert send_response_fields("7F00000100002A9F0000000000000000", 1, 0) == {
        "msgId": "7F00000100002A9F0000000000000000", "queueId": "1", "queueOffset": "0"}
    assert send_response_fields("X", 0, 0, "TX")["transactionId"] == "TX"
    assert pull_response_fields(5, 0, 9) == {"suggestWhichBrokerId": "0", "nextBeginOffset": "5", "minOffset": "0",
                                             "maxOffset": "9"}
