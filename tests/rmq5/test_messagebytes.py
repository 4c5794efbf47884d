"""A served message's protobuf bytes (``rmq5.messagebytes``) against a ``Message`` filled field by field through the
generated classes, as the served paths built it before; and the C helper's ``encode_fields`` against its twin."""

import hashlib
import random
import struct
import zlib

import pytest

from metaq import speedups
from metaq.protocol.rocketmq.bodies import StoredMessage
from metaq.protocol.rocketmq.mapping import UNTRIMMED_CHARS, message_of_record, record_data_from_send
from metaq.rmq5.records import TRANSACTION, check_message
from metaq.store.record import LogRecord

pb = pytest.importorskip("metaq.rmq5.messages_pb2")
messagebytes = pytest.importorskip("metaq.rmq5.messagebytes")
from metaq.rmq5.calls import message_of  # noqa: E402
from metaq.rmq5.records import MAX_USER_PROPERTIES, PROP_DELIVER_MS, PROP_SHARDING_KEY, RESERVED_PROPERTIES  # noqa: E402

HOST = ("192.0.2.7", 8081)
MAX_TRANSFER = 1 << 20


def filled(msg, endpoint, max_transfer, msg_id, served=None):
    """The reference: a ReceiveMessageResponse (PullMessageResponse's fields are the same) filled field by field
    through the generated classes, as the proxy's converter fills a message."""
    props = msg.properties
    body = zlib.decompress(msg.body) if msg.sys_flag & 1 else msg.body
    r = pb.ReceiveMessageResponse()
    m = r.message
    m.topic.name = msg.topic
    m.body = body
    sp = m.system_properties
    sp.message_id = props.get("UNIQ_KEY") or "%X" % msg_id
    sp.body_encoding = pb.IDENTITY
    sp.queue_id = msg.queue_id
    sp.queue_offset = msg.queue_offset
    sp.body_digest.type = pb.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.store_host = "%s:%d" % tuple(endpoint)
    sp.born_host = "%s:%d" % tuple(msg.born_host[:2])
    sp.born_timestamp.FromMilliseconds(msg.born_timestamp)
    sp.store_timestamp.FromMilliseconds(msg.store_timestamp)
    if props.get("TAGS"):
        sp.tag = props["TAGS"]
    sp.keys.extend(k for k in props.get("KEYS", "").split(" ") if k)
    group, deliver = props.get(PROP_SHARDING_KEY), props.get(PROP_DELIVER_MS, "")
    if group:
        sp.message_group = group
        sp.message_type = pb.FIFO
    elif deliver.isdigit():
        sp.delivery_timestamp.FromMilliseconds(int(deliver))
        sp.message_type = pb.DELAY
    else:
        sp.message_type = pb.NORMAL
    m.user_properties.update({k: v for k, v in props.items()
                              if k not in RESERVED_PROPERTIES and not k.startswith(("@", "__"))})
    if served is not None:
        m.topic.name = served.topic
        sp.queue_id, sp.queue_offset, sp.receipt_handle, sp.delivery_attempt = served[1:5]
        sp.invisible_duration.FromMilliseconds(served.invisible_ms)
    return r


def stored(props, body=b"x" * 1024, queue_id=2, queue_offset=77, born=1700000000123, born_host=("198.51.100.1", 5555),
           store_ts=1700000000456, sys_flag=0, topic="t"):
    return StoredMessage(topic, queue_id, queue_offset, 1000, body, 0, sys_flag, born, born_host, store_ts, HOST, 0, 0,
                         props)


def laid_out(message_type=0, tag=None, keys=(), group=None, deliver_ms=None, user=None):
    """The properties a gRPC send stores for such a message (``records.check_message``)."""
    return check_message("t", tag, list(keys), "01ABCDEF", group, deliver_ms, user or {}, message_type).properties


MESSAGES = {
    "normal, no tag, keys or properties": stored(laid_out()),
    "normal with a tag, keys and properties": stored(laid_out(tag="TagA", keys=["k1", "k2"],
                                                              user={"color": "red", "ünï": "çødé ✓"})),
    "fifo": stored(laid_out(group="orders-7", tag="t")),
    "delay": stored(laid_out(deliver_ms=1700000099999, keys=["k"])),
    "transaction": stored(laid_out(message_type=TRANSACTION, user={"a": "b"})),
    "a text put's record: no message id, reserved and internal properties": stored(
        {"TAGS": "x", "KEYS": "a  b ", "DELAY": "3", "@BORNHOST": "1.2.3.4:5", "__x": "y", "u": "v"}, body=b""),
    "queue 0, offset 0, born at 0, an IPv6 host": stored({}, queue_id=0, queue_offset=0, born=0,
                                                         born_host=("2001:db8::1", 1)),
    "before the epoch, a large offset": stored({"UNIQ_KEY": "id"}, born=-5, queue_offset=2 ** 40 + 3),
    "an empty tag, a non-digit delivery time": stored({"TAGS": "", PROP_DELIVER_MS: "soon"}),
    "a compressed body": stored({}, body=zlib.compress(b"z" * 5000), sys_flag=1),
    "a corrupt compressed body, served as stored": stored({}, body=b"not zlib", sys_flag=1),
}
SERVED = {"pulled": None,
          "received": messagebytes.Served("t-from", 3, 99, "1 2 3 4", 2, 30_000),
          "received, zeros": messagebytes.Served("t", 0, 0, "h", 0, 1_500)}


def reference(msg, served):
    try:
        return filled(msg, HOST, MAX_TRANSFER, 0xABCDEF, served)
    except zlib.error:  # a corrupt body goes as stored
        return filled(msg._replace(sys_flag=0), HOST, MAX_TRANSFER, 0xABCDEF, served)


@pytest.mark.parametrize("served", list(SERVED), ids=list(SERVED))
@pytest.mark.parametrize("name", list(MESSAGES), ids=list(MESSAGES))
def test_a_served_message_parses_back_to_what_the_generated_classes_build_field_by_field(name, served):
    msg, served = MESSAGES[name], SERVED[served]
    want = reference(msg, served)
    data = messagebytes.response_bytes(msg, HOST, MAX_TRANSFER, 0xABCDEF, served)
    got = pb.ReceiveMessageResponse.FromString(data)
    assert got == want
    for field in ("topic", "system_properties", "body", "user_properties"):  # field by field, to say which differs
        assert getattr(got.message, field) == getattr(want.message, field), field
    sp, want_sp = got.message.system_properties, want.message.system_properties
    for field in [f.name for f in pb.SystemProperties.DESCRIPTOR.fields]:
        if field in ("keys",):
            assert list(sp.keys) == list(want_sp.keys)
            continue
        if pb.SystemProperties.DESCRIPTOR.fields_by_name[field].has_presence:
            assert sp.HasField(field) == want_sp.HasField(field), field
        assert getattr(sp, field) == getattr(want_sp, field), field
    if not want.message.user_properties:  # no map: the same bytes as protobuf's own encoder writes
        assert data == want.SerializeToString()
    pulled = pb.PullMessageResponse.FromString(data)  # the same field 2 of a pull's response
    assert pulled.message == want.message
    assert message_of(msg, HOST, MAX_TRANSFER, 0xABCDEF) == reference(msg, None).message


def test_a_timestamp_outside_protobufs_range_is_refused_as_protobuf_refuses_it():
    for born in (253402300800 * 1000, -62135596801 * 1000):
        with pytest.raises(ValueError):
            filled(stored({}, born=born), HOST, MAX_TRANSFER, 1)
        with pytest.raises(ValueError):
            messagebytes.response_bytes(stored({}, born=born), HOST, MAX_TRANSFER, 1)
    last = 253402300799 * 1000 + 999
    assert pb.ReceiveMessageResponse.FromString(messagebytes.response_bytes(
        stored({}, born=last), HOST, MAX_TRANSFER, 1)) == filled(stored({}, born=last), HOST, MAX_TRANSFER, 1)


ENCODERS = [messagebytes.encode_fields_py]
if speedups.built():
    from metaq.native import _bytes
    ENCODERS.append(_bytes.encode_fields)

FIELDS = [
    (),
    (1, 0, 2, 1, 3, 127, 4, 128, 5, 300, 6, 2 ** 63 - 1, 7, 2 ** 64 - 1, 8, -1, 9, -2 ** 63),
    (1, b"", 2, b"bytes", 3, "", 4, "ünïcødé ✓", 5, bytearray(b"ba"), 6, memoryview(b"mv")),
    (1, None, 2, (), 3, (1, (2, (3, "deep"))), 4, [1, 5, 2, None], 536870911, 1, 16, 1, 2048, "k"),
    (2, "x" * 300, 3, b"y" * 70000),
]


@pytest.mark.parametrize("fields", FIELDS)
def test_encode_fields_twins_write_the_same_bytes(fields):
    outs = {encode(fields) for encode in ENCODERS} | {encode(list(fields)) for encode in ENCODERS}
    assert len(outs) == 1


def test_encode_fields_writes_what_protobuf_reads():
    data = messagebytes.encode_fields((1, (1, "ns", 2, "name"), 2, 9, 3, -7))
    q = pb.MessageQueue.FromString(data)
    assert (q.topic.resource_namespace, q.topic.name, q.id, q.permission) == ("ns", "name", 9, -7)


@pytest.mark.parametrize("fields, error", [
    ((1,), ValueError), ((0, 1), ValueError), ((536870912, 1), ValueError), ((1.0, 1), TypeError),
    (("1", 1), TypeError), ((1, 1.5), TypeError), ((1, object()), TypeError), ((1, 2 ** 64), OverflowError),
    ((1, -2 ** 63 - 1), OverflowError), ((1, "\ud800"), UnicodeEncodeError), ("12", TypeError),
])
def test_encode_fields_twins_refuse_the_same(fields, error):
    for encode in ENCODERS:
        with pytest.raises(error):
            encode(fields)


def test_encode_fields_refuses_nesting_past_its_depth():
    deep = (1, "x")
    for _ in range(messagebytes.MAX_DEPTH):
        deep = (1, deep)
    for encode in ENCODERS:
        assert encode(deep)
        with pytest.raises(ValueError):
            encode((1, deep))


def filled_send_response(entries):
    """The reference: a SendMessageResponse filled through the generated classes, as a send answered before."""
    from metaq.rmq5.calls import status
    out = [pb.SendResultEntry(status=status(e.code, e.message), message_id=e.message_id,
                              transaction_id=e.transaction_id, offset=e.offset, recall_handle=e.recall_handle)
           for e in entries]
    top = out[0].status if len({o.status.code for o in out}) == 1 else status("MULTIPLE_RESULTS")
    return pb.SendMessageResponse(status=top, entries=out)


def test_a_send_answer_is_the_same_bytes_as_the_generated_classes_write():
    from metaq.rmq5.sends import Entry, response_bytes
    answers = [
        [Entry("OK", None, "01AB", offset=0)],
        [Entry("OK", None, "01AB", offset=77), Entry("OK", None, "01AC", offset=78)],
        [Entry("OK", None, "01AB", transaction_id="5:01AB", offset=5)],
        [Entry("OK", None, "01AB", offset=2 ** 40, recall_handle="djEgdCBiIDEgMDFBQiA3")],
        [Entry("OK", None, "01AB", offset=3), Entry("MESSAGE_BODY_EMPTY", "a message without a body", "01AC")],
        [Entry("FORBIDDEN", "no PUB on tø", ""), Entry("FORBIDDEN", "no PUB on tø", "x")],
        [Entry("HA_NOT_AVAILABLE", "not the master", "01AB", offset=9)],
    ]
    for entries in answers:
        want = filled_send_response(entries)
        assert response_bytes(entries) == want.SerializeToString()
        assert pb.SendMessageResponse.FromString(response_bytes(entries)) == want


def filled_ack_response(entries, results):
    """The reference: an AckMessageResponse filled through the generated classes, as an ack answered before."""
    from metaq.rmq5.calls import status
    out = [pb.AckMessageResultEntry(message_id=m, receipt_handle=h, status=status("OK") if r is None else
                                    status("INVALID_RECEIPT_HANDLE", str(r)))
           for (m, h), r in zip(entries, results, strict=True)]
    codes = {o.status.code for o in out}
    top = out[0].status if len(codes) == 1 else status("MULTIPLE_RESULTS", "the entries' results differ")
    return pb.AckMessageResponse(status=top, entries=out)


def test_an_ack_answer_is_the_same_bytes_as_the_generated_classes_write():
    from metaq.pop.records import InvalidHandle
    from metaq.rmq5.receives import ack_response_bytes
    answers = [
        ([("01AB", "0 1 2 3")], [None]),
        ([("01AB", "0 1 2 3"), ("", "0 2 2 3")], [None, None]),
        ([("01AB", "0 1 2 3"), ("01AC", "bad")], [None, InvalidHandle("a receipt handle 'bad': malformed")]),
        ([("01AB", "x"), ("01AC", "y")], [InvalidHandle("expired"), InvalidHandle("of an older delivery")]),
        ([("ünï", "")], [InvalidHandle("empty")]),
        ([("01A%d" % i, "0 %d 1 3" % i) for i in range(32)], [None] * 32),
        ([("01A%d" % i, "0 %d 1 3" % i) for i in range(32)], [None] * 31 + [InvalidHandle("expired")]),
    ]
    for entries, results in answers:
        want = filled_ack_response(entries, results)
        assert ack_response_bytes(entries, results) == want.SerializeToString()


def _record(flag, data, topic="t", partition=2, queue_offset=77, born=1700000000123, store_ts=1700000000456):
    return LogRecord(1000, 0, topic, partition, queue_offset, store_ts, born, 0xABCDEF, flag, data)


def _sent(body=b"x" * 1024, born_host="198.51.100.1:5555", **message):
    """A record as a gRPC send stores it (``records.check_message``, then ``mapping.record_data_from_send``)."""
    return _record(*record_data_from_send(body, laid_out(**message), born_host=born_host))


def _attribute(attribute, body=b"x" * 64, **fields):
    """A record whose attribute is ``attribute`` (text, or bytes as stored), as a text put may store it."""
    raw = attribute.encode("utf-8") if isinstance(attribute, str) else attribute
    return _record(1, struct.pack(">i", len(raw)) + raw + body, **fields)


_ROOM = UNTRIMMED_CHARS

#: Records the one pass reads itself (a RocketMQ or gRPC producer's), and the others, which it hands to the general
#: mapping; each must come out as the general mapping serves it.
ONE_PASS = {
    "a gRPC send: no tag, keys or properties": _sent(),
    "tag, keys, unicode properties": _sent(tag="TagA", keys=["k1", "k2"], user={"color": "red", "ünï": "çødé ✓"}),
    "fifo": _sent(group="orders-7", tag="t"),
    "delay": _sent(deliver_ms=1700000099999, keys=["k"]),
    "transaction": _sent(message_type=TRANSACTION, user={"a": "b"}),
    "an empty body": _sent(body=b""),
    "a large body": _sent(body=bytes(range(256)) * 4096),
    "an IPv6 producer": _sent(born_host="[2001:db8::1]:7"),
    "no producer's address": _sent(born_host=None),
    "a forged producer's address": _attribute("\x02@BORNHOST\x01not-a-host:1\x02UNIQ_KEY\x01u"),
    "a producer's port out of range": _attribute("\x02@BORNHOST\x011.2.3.4:99999"),
    "repeated keys: the last value, in the first place": _attribute(
        "T\x02a\x01x\x02b\x01y\x02a\x01z\x02UNIQ_KEY\x01u1\x02UNIQ_KEY\x01u2\x02KEYS\x01p\x02KEYS\x01q r"),
    "items without a separator, an empty key or value, a value holding one": _attribute(
        "\x02lonely\x02\x01v\x02k\x01\x02k2\x01a\x01b\x02\x02"),
    "a stored TAGS beside the tags": _attribute("tg\x02TAGS\x01other\x02u\x01v"),
    "tags not shown (a separator in them), a stored TAGS": _attribute("t\x01g\x02TAGS\x01other"),
    "empty tags, a stored TAGS": _attribute("\x02TAGS\x01only"),
    "internal, reserved and __ properties": _attribute(
        "\x02@FLAG\x017\x02@RECONSUME\x013\x02@other\x01x\x02__x\x01y\x02TRACE_ON\x01true\x02__STARTDELIVERTIME\x015"
        "\x02DELAY\x013\x02u\x01v"),
    "a non-digit delivery time": _attribute("\x02TIMER_DELIVER_MS\x01soon"),
    "properties at the untrimmed bound": _attribute("\x02u\x01" + "v" * (_ROOM - 6 - 3)),
}
GENERAL = {
    "a text put: no attribute": _record(0, b"plain"),
    "a text put: an attribute without properties": _attribute("plain attribute"),
    "an empty attribute": _attribute(""),
    "a malformed attribute block": _record(1, struct.pack(">i", 99) + b"short"),
    "a delivery time in other digits, an empty group": _attribute("\x02TIMER_DELIVER_MS\x01١٢٣\x02__SHARDINGKEY\x01"),
    "undecodable attribute bytes": _attribute(b"\xff\x02u\x01\xfe\xfd\x02UNIQ_KEY\x01id"),
    "@SYSFLAG: multi-tags": _attribute("a b\x02@SYSFLAG\x012\x02u\x01v"),
    "@SYSFLAG: a compressed body of an older record": _attribute("\x02@SYSFLAG\x011", zlib.compress(b"z" * 5000)),
    "properties one past the untrimmed bound": _attribute("\x02u\x01" + "v" * (_ROOM - 6 - 3 + 1)),
    "properties trimmed": _attribute("\x02big\x01" + "v" * 40_000 + "\x02small\x01s"),
    "a long forged producer's address": _attribute("\x02@BORNHOST\x01" + "9" * 100 + ":1"),
}


@pytest.mark.parametrize("served", list(SERVED), ids=list(SERVED))
@pytest.mark.parametrize("name", list(ONE_PASS) + list(GENERAL), ids=list(ONE_PASS) + list(GENERAL))
def test_a_record_served_in_one_pass_is_what_the_general_mapping_serves(name, served):
    rec, served = {**ONE_PASS, **GENERAL}[name], SERVED[served]
    msg = message_of_record(rec, HOST)
    data = messagebytes.record_response_bytes(rec, HOST, MAX_TRANSFER, served)
    assert data == messagebytes.response_bytes(msg, HOST, MAX_TRANSFER, rec.msg_id, served)
    assert pb.ReceiveMessageResponse.FromString(data) == reference(msg, served)


@pytest.mark.parametrize("name", list(ONE_PASS), ids=list(ONE_PASS))
def test_a_producers_record_is_served_without_the_general_mapping(name, monkeypatch):
    want = messagebytes.record_response_bytes(ONE_PASS[name], HOST, MAX_TRANSFER)

    def unwanted(*_args):
        raise AssertionError("mapped through message_of_record")
    monkeypatch.setattr(messagebytes, "message_of_record", unwanted)
    assert messagebytes.record_response_bytes(ONE_PASS[name], HOST, MAX_TRANSFER) == want


def test_a_record_past_the_timestamp_range_is_refused_by_both_ways():
    sent = _sent()
    for rec in (_attribute("\x02TIMER_DELIVER_MS\x01" + str(253402300800 * 1000)),
                _record(sent.flag, sent.data, born=-2 ** 62)):
        with pytest.raises(ValueError):
            messagebytes.record_response_bytes(rec, HOST, MAX_TRANSFER)
        with pytest.raises(ValueError):
            messagebytes.response_bytes(message_of_record(rec, HOST), HOST, MAX_TRANSFER, rec.msg_id)


#: Both definitions of ``served_record`` (the C one where it was built: with OpenSSL), each case run against both.
SERVERS = [messagebytes.served_record_py]
if speedups.built() and hasattr(_bytes, "served_record"):
    SERVERS.append(_bytes.served_record)


def _serve(server, rec, served, endpoint="192.0.2.7:8081"):
    """``server``'s answer for ``rec``, its born host learned first when it did not know it (as ``served_bytes``)."""
    args = (rec.data, rec.flag, rec.topic, rec.partition, rec.queue_offset, rec.born_ts_ms, rec.store_ts_ms,
            rec.msg_id, endpoint, served, messagebytes._CONTEXT)
    out = server(*args)
    if isinstance(out, str):
        messagebytes.learn_born_host(out)
        out = server(*args)
    return out


@pytest.mark.parametrize("served", list(SERVED), ids=list(SERVED))
@pytest.mark.parametrize("name", list(ONE_PASS) + list(GENERAL), ids=list(ONE_PASS) + list(GENERAL))
def test_served_record_twins_write_the_same_bytes_and_leave_the_same_records(name, served):
    rec, served = {**ONE_PASS, **GENERAL}[name], SERVED[served]
    outs = [_serve(server, rec, served) for server in SERVERS]
    assert all(out == outs[0] for out in outs)
    assert (outs[0] is None) == (name in GENERAL)
    if outs[0] is not None:
        msg = message_of_record(rec, HOST)
        assert outs[0] == messagebytes.response_bytes(msg, HOST, MAX_TRANSFER, rec.msg_id, served)


def _with_users(count):
    return _attribute("\x02" + "".join("u%d\x01v%d\x02" % (i, i) for i in range(count)) + "u0\x01last")


@pytest.mark.parametrize("rec, taken", [
    (_with_users(MAX_USER_PROPERTIES), True),  # the proxy's bound, a repeated key among them
    (_with_users(MAX_USER_PROPERTIES + 1), False),  # one past it: the general mapping serves it
    (_attribute("\x02TIMER_DELIVER_MS\x01" + "1" * 18), False),  # out of protobuf's range: the general one refuses
    (_attribute("\x02TIMER_DELIVER_MS\x01" + "1" * 19), False),
    (_attribute("\x02TIMER_DELIVER_MS\x01" + "1" * 19 + "\x02__SHARDINGKEY\x01g"), True),  # a group: not a delay
    (_attribute("\x02u\x01v", born=2 ** 63), False),  # an int past 64 bits
], ids=["users at the bound", "users past it", "18 digits past the range", "19 digits", "a group's delivery time",
        "a born time past 64 bits"])
def test_served_record_twins_take_and_leave_the_same_edges(rec, taken):
    outs = [_serve(server, rec, None) for server in SERVERS]
    assert all(out == outs[0] for out in outs)
    assert (outs[0] is not None) == taken
    try:
        want = messagebytes.response_bytes(message_of_record(rec, HOST), HOST, MAX_TRANSFER, rec.msg_id)
    except ValueError:
        assert outs[0] is None
        with pytest.raises(ValueError):
            messagebytes.record_response_bytes(rec, HOST, MAX_TRANSFER)
        return
    assert messagebytes.record_response_bytes(rec, HOST, MAX_TRANSFER) == want


_KEYS = ["UNIQ_KEY", "KEYS", "TAGS", "__SHARDINGKEY", "TIMER_DELIVER_MS", "@BORNHOST", "@SYSFLAG", "@FLAG", "__x",
         "TRACE_ON", "DELAY", "u", "ü", "", "k\x01", "@"]
_VALUES = ["", "v", "1700000000000", "١٢٣", "a b  c", " ", "1.2.3.4:5", "[::1]:9", "x\x01y", "✓" * 3, "0"]


def test_served_record_twins_agree_with_the_general_mapping_on_random_records():
    rng = random.Random(57)
    for _ in range(3000):
        items = ["%s\x01%s" % (rng.choice(_KEYS), rng.choice(_VALUES)) if rng.random() < 0.9 else rng.choice(_KEYS)
                 for _ in range(rng.randrange(8))]
        tags = rng.choice(["", "t", "a||b", "x\x01y", "ü"])
        rec = _attribute(tags + "\x02" + "\x02".join(items) + rng.choice(["", "\x02"]),
                         rng.choice([b"", b"body", bytes(range(256))]))
        served = rng.choice(list(SERVED.values()))
        outs = [_serve(server, rec, served) for server in SERVERS]
        assert all(out == outs[0] for out in outs), rec
        try:
            want = messagebytes.response_bytes(message_of_record(rec, HOST), HOST, MAX_TRANSFER, rec.msg_id, served)
        except ValueError:
            assert outs[0] is None
            continue
        assert outs[0] is None or outs[0] == want, rec
        assert messagebytes.record_response_bytes(rec, HOST, MAX_TRANSFER, served) == want


@pytest.mark.parametrize("server", SERVERS, ids=lambda s: s.__module__)
def test_a_receives_messages_are_served_each_as_record_response_bytes_serves_it(server, monkeypatch):
    """``received_response_bytes`` (a receive's batch, one loop) gives each message the bytes
    ``record_response_bytes`` gives it with its ``Served``, by either twin, the general mapping's records
    included."""
    from metaq.pop.service import Received
    monkeypatch.setattr(messagebytes, "served_record", server)
    recs = list({**ONE_PASS, **GENERAL}.values())
    recs = [r for r in recs if _try(lambda r=r: messagebytes.record_response_bytes(r, HOST, MAX_TRANSFER))]
    received = [Received("t-from", i % 4, 100 + i, 1 + i % 3, "%d:%d:1:%d" % (i % 4, 100 + i, 5000 + i),
                         5000 + i, rec) for i, rec in enumerate(recs)]
    got = messagebytes.received_response_bytes(received, HOST, MAX_TRANSFER, 30_000)
    assert got == [messagebytes.record_response_bytes(
        r.record, HOST, MAX_TRANSFER, messagebytes.Served(r.topic, r.partition, r.offset, r.handle, r.attempt, 30_000))
        for r in received]
    assert len(got) == len(recs) > len(ONE_PASS)


def _try(fn):
    try:
        fn()
    except ValueError:
        return False
    return True
