"""The stream-parser base (protocol/stream.py): ``consumed`` counts the bytes of completed frames, across compactions."""

from metaq.protocol import events as ev
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser


def test_consumed_grows_only_when_a_frame_completes():
    p = TextParser()
    p.receive_data(b"version 1\r\nvers")
    assert p.consumed == 0
    assert type(p.next_event()) is ev.Version
    assert p.consumed == len(b"version 1\r\n")
    assert p.next_event() is NEED_DATA and p.in_frame
    p.receive_data(b"ion 2")  # compacts the consumed bytes away: the count survives
    assert p.consumed == len(b"version 1\r\n") and p.next_event() is NEED_DATA
    p.receive_data(b"\r\n")
    assert type(p.next_event()) is ev.Version
    assert p.consumed == len(b"version 1\r\nversion 2\r\n") and not p.in_frame
