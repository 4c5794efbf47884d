"""The pure parts of the admin commands: wire parsing, the members table's bound, line splitting, clamping."""

import pytest

from metaq import errors
from metaq.admin import wire as adminwire
from metaq.client.admin.dlq import id_batches
from metaq.admin.service import TextGroupMembers
from metaq.client.admin.tools import safe_text, split_lines
from metaq.client.admin.offsets import clamp
from metaq.protocol.text import TextParser, serialize


@pytest.mark.parametrize("event", [adminwire.GroupInfo("g", 1), adminwire.ResetOffset("g", "t", 0, 5, True, 2),
                                   adminwire.DlqList("g", 10, 3), adminwire.DlqResend("g", None, 4),
                                   adminwire.DlqResend("g", ("id1", "0-3"), 5)])
def test_admin_events_round_trip(event):
    p = TextParser()
    p.receive_data(serialize(event))
    assert p.next_event() == event


@pytest.mark.parametrize("line, reason", [(b"reset_offset g t 0 ten 0 1\r\n", "invalid offset"),
                                          (b"reset_offset g t 0 -1 0 1\r\n", "invalid offset"),
                                          (b"dlq_list g 0 1\r\n", "invalid max"),
                                          (b"dlq_list g 1001 1\r\n", "invalid max"),
                                          (b"group_info g\r\n", "needs 3 tokens")])
def test_bad_admin_lines_are_refused_and_the_parser_goes_on(line, reason):
    p = TextParser()
    p.receive_data(line + b"group_info g 9\r\n")
    with pytest.raises(errors.RemoteProtocolError, match=reason):
        p.next_event()
    assert p.next_event() == adminwire.GroupInfo("g", 9)


def test_members_table_is_bounded_and_forgets_closed_connections():
    m = TextGroupMembers(max_members=2)
    m.seen("g", 1, "a:1", 0.0)
    m.seen("g", 2, "a:2", 1.0)
    m.seen("g", 3, "a:3", 2.0)  # one past the bound: the least recently seen goes
    assert [cid for cid, _peer, _idle in m.of("g", 5.0)] == [2, 3] and len(m) == 2

    class Conn:
        conn_id = 3
    m.connection_closed(Conn())
    assert [cid for cid, _p, _i in m.of("g", 5.0)] == [2]


def test_put_lines_and_safe_text():
    assert split_lines(b"a\nb\r\n\nc") == [b"a", b"b", b"", b"c"]
    assert split_lines(b"a\n") == [b"a"] and split_lines(b"") == []
    assert safe_text(b"ok \xff\x00\n\xc3\xa9") == "ok \\xff\\x00\\n\u00e9"


def test_clamp_and_id_batches():
    assert clamp(5, 0, 10) == (5, False) and clamp(-3, 2, 10) == (2, True) and clamp(99, 0, 10) == (10, True)
    batches = id_batches(["x" * 100] * 40, budget=1000)
    assert sum(len(b) for b in batches) == 40 and all(len(",".join(b)) <= 1000 for b in batches)
