"""``topic <action> <name> <settings> <opaque>`` (topics/wire.py) through the text parser."""

import pytest

from metaq.errors import RemoteProtocolError
from metaq.protocol.text import TextParser
from metaq.protocol.text import serialize
from metaq.topics.wire import TopicCommand


def parse(line):
    p = TextParser()
    p.receive_data(line)
    return p.next_event()


def test_round_trip():
    e = TopicCommand("create", "orders", (("partitions", "4"), ("retention_hours", "2.5")), 7)
    assert serialize(e) == b"topic create orders partitions=4,retention_hours=2.5 7\r\n"
    assert parse(serialize(e)) == e
    assert parse(b"topic list - - 3\r\n") == TopicCommand("list", None, (), 3)
    assert parse(b"topic delete old - 4\r\n") == TopicCommand("delete", "old", (), 4)


@pytest.mark.parametrize("line, reason", [
    (b"topic drop x - 1\r\n", "unknown topic action"),
    (b"topic list x - 1\r\n", "takes no name"),
    (b"topic delete x partitions=2 1\r\n", "takes no settings"),
    (b"topic create x partitions 1\r\n", "key=value"),
    (b"topic create x a=1,a=2 1\r\n", "given twice"),
    (b"topic create x " + b",".join(b"k%d=1" % i for i in range(9)) + b" 1\r\n", "at most 8 settings"),
    (b"topic create ../x - 1\r\n", "illegal topic name"),
    (b"topic create x - 1 2\r\n", "5 tokens"),
])
def test_bad_lines_are_refused_with_the_reason(line, reason):
    with pytest.raises(RemoteProtocolError, match=reason):
        parse(line)
