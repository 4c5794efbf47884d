"""The stream-parser base (protocol/stream.py): ``completed`` counts finished frames, not bytes of a frame under way."""

import pytest

from metaq import errors
from metaq.protocol import events as ev
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser


def test_completed_grows_when_a_frame_completes_not_when_its_header_line_does():
    p = TextParser()
    p.receive_data(b"version 1\r\nput t 0 5 0 -1 2\r\nab")
    assert p.completed == 0
    assert type(p.next_event()) is ev.Version and p.completed == 1
    assert p.next_event() is NEED_DATA and p.in_frame
    assert p.completed == 1  # the put's line is parsed, its body is not all here: not complete
    p.receive_data(b"c")  # compacts the parsed bytes away: the count survives
    assert p.next_event() is NEED_DATA and p.completed == 1
    p.receive_data(b"de")
    assert type(p.next_event()) is ev.Put and p.completed == 2 and not p.in_frame


def test_a_refused_line_completes_a_frame_and_a_fatal_error_does_not():
    p = TextParser(max_line=64)
    p.receive_data(b"nonsense 1\r\n")
    with pytest.raises(errors.RemoteProtocolError):
        p.next_event()
    assert p.completed == 1
    p.receive_data(b"x" * 100)
    with pytest.raises(errors.RemoteProtocolError) as exc:
        p.next_event()
    assert exc.value.fatal and p.completed == 1
