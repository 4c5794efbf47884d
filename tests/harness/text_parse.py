"""Helpers shared by the text-protocol tests: run a TextParser over bytes and record what it says."""

from typing import NamedTuple

from metaq.errors import RemoteProtocolError
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)


class ErrorOutcome(NamedTuple):
    """A comparable record of a RemoteProtocolError."""

    kind: str
    reason: str
    opaque: int
    fatal: bool


def error_outcome(exc):
    return ErrorOutcome("error", exc.reason, exc.opaque, exc.fatal)


def drain(parser):
    """Call next_event until NEED_DATA, CLOSED or a fatal error; return the events and errors seen."""
    out = []
    while True:
        try:
            event = parser.next_event()
        except RemoteProtocolError as exc:
            out.append(error_outcome(exc))
            if exc.fatal:
                return out
            continue
        if event is NEED_DATA:
            return out
        out.append(event)
        if event is CLOSED:
            return out


def _is_final(outcomes):
    last = outcomes[-1] if outcomes else None
    return last is CLOSED or (isinstance(last, ErrorOutcome) and last.fatal)


def parse_chunks(chunks, eof=False, **limits):
    """Feed ``chunks`` one by one (draining after each), then EOF if asked; return all outcomes.

    Empty chunks are left out: only ``eof`` ends the stream.
    """
    parser = TextParser(**limits)
    out = []
    for chunk in filter(None, chunks):
        parser.receive_data(chunk)
        out += drain(parser)
        if _is_final(out):
            return out
    if eof:
        parser.receive_data(b"")
        out += drain(parser)
    return out


def parse_whole(data, eof=False, **limits):
    """Outcomes of feeding ``data`` in one piece."""
    return parse_chunks([data], eof, **limits)


def parse_bytewise(data, eof=False, **limits):
    """Outcomes of feeding ``data`` one byte at a time."""
    return parse_chunks([data[i : i + 1] for i in range(len(data))], eof, **limits)


def parse_one(data):
    """The single event in ``data`` (fed whole and byte by byte, which must agree)."""
    whole = parse_whole(data)
    assert parse_bytewise(data) == whole
    assert len(whole) == 1, whole
    return whole[0]
