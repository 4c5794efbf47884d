"""The text commands of per-message acknowledgement (metaq/pop/wire.py): their bounds at the limit and one past,
and the receive reply's body both ways."""

import pytest

from metaq import limits
from metaq.pop import limits as pop_limits
from metaq.errors import RemoteProtocolError
from metaq.pop.wire import Ack, ChangeInvisible, Receive, decode_ack_body, decode_received, encode_ack_body, \
    encode_received
from metaq.protocol.text import TextParser, serialize


def parse(line):
    parser = TextParser()
    parser.receive_data(line)
    return parser.next_event()


def test_receive_batch_and_invisible_bounds_at_the_limit_and_one_past():
    e = parse(b"receive t g %d %d fifo 7\r\n" % (pop_limits.POP_MAX_BATCH, pop_limits.POP_MAX_INVISIBLE_MS))
    assert e == Receive("t", "g", pop_limits.POP_MAX_BATCH, pop_limits.POP_MAX_INVISIBLE_MS, True, 7)
    assert parse(serialize(e)) == e
    assert parse(b"receive t g 1 %d normal 1\r\n" % pop_limits.POP_MIN_INVISIBLE_MS).invisible_ms == \
        pop_limits.POP_MIN_INVISIBLE_MS
    for bad in (b"receive t g %d 1000 normal 1\r\n" % (pop_limits.POP_MAX_BATCH + 1),
                b"receive t g 0 1000 normal 1\r\n",
                b"receive t g 1 %d normal 1\r\n" % (pop_limits.POP_MAX_INVISIBLE_MS + 1),
                b"receive t g 1 %d normal 1\r\n" % (pop_limits.POP_MIN_INVISIBLE_MS - 1),
                b"receive t g 1 1000 lifo 1\r\n"):
        with pytest.raises(RemoteProtocolError):
            parse(bad)


def test_ack_handles_at_the_limit_and_one_past_and_change_invisible():
    hs = ",".join("%d:%d:16:1764100000000" % (i % 4, 100000 + i) for i in range(pop_limits.POP_MAX_ACK_HANDLES))
    line = b"ack t g %s 3\r\n" % hs.encode()
    assert len(line) <= limits.MAX_LINE_BYTES  # the most handles fit a line
    e = parse(line)
    assert isinstance(e, Ack) and len(e.handles) == pop_limits.POP_MAX_ACK_HANDLES
    assert parse(serialize(e)) == e
    with pytest.raises(RemoteProtocolError):
        parse(b"ack t g %s,0:1:1:1 3\r\n" % hs.encode())
    with pytest.raises(RemoteProtocolError):
        parse(b"ack t g 0:1:1:1,,0:2:1:1 3\r\n")
    c = parse(b"change_invisible t g 0:1:1:1 60000 4\r\n")
    assert c == ChangeInvisible("t", "g", "0:1:1:1", 60000, 4) and parse(serialize(c)) == c


def test_reply_bodies_both_ways():
    items = [(0, 5, 1, 1764100000000, "0:5:1:1764100000000", 77, 0, b"hello", 123),
             (3, 9, 2, 1764100000001, "3:9:2:1764100000001", 78, 1, b"", -5)]
    assert [tuple(i) for i in decode_received(encode_received(items))] == items
    assert decode_received(b"") == []
    with pytest.raises(RemoteProtocolError):
        decode_received(encode_received(items)[:-3])
    assert decode_ack_body(encode_ack_body([None, "receipt handle x is expired", None])) == \
        [None, "receipt handle x is expired", None]
