"""The text command registry (``protocol.commands``), and the paths it keeps equal by construction.

Every test here is derived from the registry: a command added with its declaration is held to the same checks
without a line written here, except the adapter of a new burst scanner, which the last test asks for by name.
"""

import itertools
import subprocess
import sys
from typing import NamedTuple

import pytest

from metaq.errors import RemoteProtocolError
from metaq.protocol import commands, events as ev
from metaq.protocol.stream import NEED_DATA
from metaq.protocol.text import TextParser, serialize

TABLE = commands.table()
EXAMPLES = [(c.word, frame) for c in TABLE.values() for frame in c.examples]
NOW = 1_700_000_000_000


def parse_all(data, fast=True):
    """Every event of ``data``; with ``fast`` False the fast line parsers are bypassed."""
    parser = TextParser()
    if not fast:
        parser._next_event = _general_only(parser)
    parser.receive_data(data)
    out = []
    while True:
        event = parser.next_event()
        if event is NEED_DATA:
            return out
        out.append(event)


def _general_only(parser):
    """The parser's loop with every line going through its general path (``_parse_line``)."""
    def next_event():
        while True:
            if parser._pending is not None:
                return parser._finish_body()
            line = parser._take_line()
            if line is None:
                return parser._need_data()
            if line:
                event = parser._parse_line(line)
                if event is not None:
                    return event
                if parser._pending is not None:
                    return parser._finish_body()
    return next_event


def test_every_command_is_whole_and_its_need_names_a_field_of_its_event():
    assert len(TABLE) >= 31
    for c in TABLE.values():
        assert commands.by_event(c.event) is c and commands.by_word(c.word) is c
        need = c.need
        if need.field is not None:
            assert need.field in c.event._fields, c.word
        if need.rule == commands.GROUP:
            assert "group" in c.event._fields, c.word
    assert {c.word for c in commands.requests()} == set(TABLE) - {"value", "result"}


@pytest.mark.parametrize("word,frame", EXAMPLES, ids=["%s-%d" % (w, i) for i, (w, _f) in enumerate(EXAMPLES)])
def test_each_example_parses_to_its_event_and_round_trips(word, frame):
    command = TABLE[word]
    [event] = parse_all(frame)
    assert type(event) is command.event
    assert parse_all(frame, fast=False) == [event]  # the fast line parser agrees with the general one
    assert parse_all(serialize(event)) == [event]


def _mutations(frame):
    """The frame with one header token changed to each of a few hostile values (its body kept)."""
    head, sep, body = frame.partition(b"\r\n")
    tokens = head.split(b" ")
    values = [b"", b"-1", b"0", b"x", b"01", b"+1", b"@1", b"99999999999", b"-99999999999", b"2147483648",
              b"9223372036854775808", b"\xff", b"a" * 300]
    for i in range(1, len(tokens)):
        for value in values:
            yield b" ".join(tokens[:i] + [value] + tokens[i + 1:]) + sep + body


def _general(frame):
    """The general path's answer to ``frame``: its events, or the error."""
    try:
        return parse_all(frame, fast=False)
    except RemoteProtocolError as exc:
        return ("error", exc.args[0])


def test_fast_line_parsers_accept_only_what_the_general_path_accepts_and_read_it_alike():
    for c in TABLE.values():
        if c.fast_line is None:
            continue
        taken = 0
        for frame in itertools.chain(c.examples, *(_mutations(f) for f in c.examples)):
            head = frame.partition(b"\r\n")[0]
            fast = c.fast_line(head)
            if fast is None:
                continue
            make, length = fast
            if length > TextParser().max_body:
                continue  # the parser hands such a line to the general path, which refuses it
            expected = _general(frame)
            assert expected == [make(frame.partition(b"\r\n")[2][:length])], frame
            taken += 1
        assert taken, "%s's fast line parser takes none of its examples" % c.word


class _Entry(NamedTuple):
    topic: str
    partition: int
    flag: int
    checksum: int
    due_ms: int
    now_ms: int
    body: bytes
    owner: str = None


def _scan_put(frame):
    frames, _stop = commands.bursts()["put"](frame, 0, len(frame), 1 << 20, 2048, 16)
    return [(f[0].decode(), f[1], f[3], bytes(frame[f[4]:f[4] + f[5]])) for f in frames]


def _scan_put_idem(frame):
    frames, _data, _stop = commands.bursts()["put_idem"](frame, 0, len(frame), 1 << 20, 2048, 16)
    return [(f[0].decode(), f[1], f[3], bytes(frame[f[11] - f[10]:f[11]])) for f in frames]


def _scan_put_at(frame):
    items, _src, _stop = commands.bursts()["put_at"](frame, 0, len(frame), 1 << 20, 16, NOW, b"%TIMER%", _Entry)
    return [(i[0], i[1], i[2], i[6].body) for i in items]


#: Each burst scanner's taken frames as ``(topic, partition, opaque, body)``: a burst command the registry
#: declares needs its adapter here (the test below fails without one).
ADAPTERS = {"put": _scan_put, "put_idem": _scan_put_idem, "put_at": _scan_put_at}


def test_burst_scanners_take_only_frames_the_parser_reads_and_read_them_alike():
    assert set(ADAPTERS) == set(commands.bursts()), "a burst command needs its adapter in this test"
    for word, scan in ADAPTERS.items():
        c = TABLE[word]
        taken = 0
        for frame in itertools.chain(c.examples, *(_mutations(f) for f in c.examples)):
            got = scan(bytearray(frame))
            if not got:
                continue
            expected = _general(frame)
            assert isinstance(expected, list) and len(expected) == 1, (frame, expected)
            event = expected[0]
            assert got == [(event.topic, event.partition, event.opaque, event.body)], frame
            taken += 1
        assert taken, "%s's burst scanner takes none of its examples" % word


class _NoExample(NamedTuple):
    opaque: int


def _declare(**change):
    fields = dict(word="nothing_here", event=_NoExample, counts=(2,), usage="2 tokens",
                  parse=lambda t: _NoExample(int(t[1])), serialize=lambda e: b"nothing_here %d\r\n" % e.opaque,
                  need=commands.NEEDS_USER, examples=(b"nothing_here 1\r\n",))
    fields.update(change)
    return commands.TextCommand(**fields)


@pytest.mark.parametrize("change,says", [
    (dict(examples=()), "an example frame"),
    (dict(need=None), "a Need"),
    (dict(counts=()), "token counts"),
    (dict(body=5), "body length token"),
    (dict(burst=lambda *a: None), "a body"),
    (dict(word="two words"), "a word"),
    (dict(word="put"), "declared twice"),
    (dict(event=ev.Get), "declared twice"),
])
def test_a_declaration_missing_a_part_is_refused_at_once(change, says):
    with pytest.raises(TypeError, match=says):
        commands.register(_declare(**change))
    assert "nothing_here" not in commands.table()


def test_a_declaration_after_the_table_is_complete_is_refused():
    with pytest.raises(TypeError, match="after the table was completed"):
        commands.register(_declare())
    assert "nothing_here" not in commands.table()


def test_the_table_is_not_read_before_every_command_is_declared():
    """The registry imports no declaring module (no import cycle): read before ``textcommands`` completed it, it
    says so rather than answer from half a table."""
    code = ("from metaq.protocol.text import TextParser\n"
            "try:\n    TextParser()\nexcept RuntimeError as exc:\n    print(exc)\n"
            "from metaq import textcommands\nfrom metaq.protocol import commands\n"
            "print(sorted(m.__name__ for m in textcommands.DECLARING_MODULES)[0], len(commands.table()) > 30)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["the text command table is read before every command was declared: import "
                                "metaq.textcommands first", "metaq.admin.wire True"]
