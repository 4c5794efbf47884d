"""A served message's protobuf bytes (``rmq5.messagebytes``) against a ``Message`` filled field by field through the
generated classes, as the served paths built it before; and the C helper's ``encode_fields`` against its twin."""

import hashlib
import zlib

import pytest

from metaq import speedups
from metaq.protocol.rocketmq.bodies import StoredMessage
from metaq.rmq5.records import TRANSACTION, check_message

pb = pytest.importorskip("metaq.rmq5.messages_pb2")
messagebytes = pytest.importorskip("metaq.rmq5.messagebytes")
from metaq.rmq5.calls import message_of  # noqa: E402
from metaq.rmq5.records import PROP_DELIVER_MS, PROP_SHARDING_KEY, RESERVED_PROPERTIES  # noqa: E402

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
    from metaq import _speedups
    ENCODERS.append(_speedups.encode_fields)

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
    ]
    for entries, results in answers:
        want = filled_ack_response(entries, results)
        assert ack_response_bytes(entries, results) == want.SerializeToString()
