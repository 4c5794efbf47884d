"""The text protocol's command registry: every command declared once, with everything derived from it.

A command is one ``TextCommand``: its word, its event type, the token counts it takes (and how an error says
them), where its body length is, its parser and serializer, what it needs of the user (``Need``), optionally a
one-step parser of its common line (``fast_line``) and the burst scanner the server's fast path runs
(``burst``), and example frames. ``TextParser``'s table, ``serialize``'s table, the server's permission check and
the fast path's recognition are read from here, and the tests derived from the examples hold the general parser,
the fast line parsers, the burst scanners and the serializers to each other. ``register`` refuses a declaration
that misses a part, at import.

The modules that declare commands (``text`` for MetaQ's own and the core extensions, ``putbatch``, each feature's
wire module) are listed once, in ``metaq.textcommands``, which imports them and then calls ``complete()``.
This module imports none of them (the registry is below every declaration: no import cycle), so the table is read
only once it is whole: ``table()``, ``by_word`` and ``by_event`` before ``complete()`` raise RuntimeError, naming
the module to import, rather than answer from half a table.
"""

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

#: What a request needs of its user; the server's Guard enforces it (the protocol knows no users).
NOTHING = "nothing"  # no user needed (auth, version, quit): a stranger may send it
USER = "user"  # any logged-in user
ADMIN = "admin"  # the admin permission
PUBLISH = "pub"  # publish on the topic the event's ``field`` names
SUBSCRIBE = "sub"  # subscribe on the topic the event's ``field`` names
GROUP = "group"  # subscribe on the event's ``group`` and its ``topic``
HANDLER = "handler"  # decided by the handler (the hot paths, and the one topic-write decision for every put)
RULES = (NOTHING, USER, ADMIN, PUBLISH, SUBSCRIBE, GROUP, HANDLER)


@dataclass(frozen=True)
class Need:
    """A rule and the event field it reads (``topic``), or ``choose(event) -> Need`` when it depends on the
    request (``stats reset`` is an admin's, ``stats`` any user's)."""

    rule: str = NOTHING
    field: Optional[str] = None
    choose: Optional[Callable] = None

    def of(self, event):
        """The Need that applies to ``event``."""
        return self.choose(event) if self.choose is not None else self

    def subject(self, event):
        """The name the rule is about (a topic), or None."""
        return getattr(event, self.field) if self.field else None


NEEDS_NOTHING = Need(NOTHING)
NEEDS_USER = Need(USER)
NEEDS_ADMIN = Need(ADMIN)
NEEDS_HANDLER = Need(HANDLER)
NEEDS_SUBSCRIBER = Need(SUBSCRIBE, "topic")
NEEDS_GROUP_MEMBER = Need(GROUP, "topic")


def depends(choose):
    """A Need chosen per request by ``choose(event) -> Need``."""
    return Need(HANDLER, None, choose)


@dataclass(frozen=True)
class TextCommand:
    """One text command, requests and replies alike (``reply``: ``value``/``result``, never dispatched)."""

    word: str
    event: type
    counts: Tuple[int, ...]
    usage: str  # how the counts are said in an error: "8 tokens (put_at <topic> ...)"
    parse: Callable  # tokens -> event, or (with ``body``) a function of the body that makes the event
    serialize: Callable  # event -> bytes
    need: Need
    body: Optional[int] = None  # the index of the token giving the body's length
    reply: bool = False
    fast_line: Optional[Callable] = None  # raw line -> (make(body), length) or None: the general path decides
    burst: Optional[Callable] = None  # the fast path's scanner of a run of these frames (protocol-level)
    examples: Tuple[bytes, ...] = ()  # whole frames the parser takes (the registry's tests)


_BY_WORD = {}
_BY_EVENT = {}
_complete = False
_fast_lines = ()


def token(text):
    """``text`` as one token of a command line, for the serializers: ValueError when it holds a space, CR or LF,
    which would shift every field after it. (An empty token is the grammar's: fields are split at single spaces;
    the parser decides whether a field may be blank.)"""
    if " " in text or "\r" in text or "\n" in text:
        raise ValueError("%r cannot be sent as a protocol token" % (text,))
    return text


def register(command):
    """Add ``command``; raises TypeError for a declaration that misses a part or takes a word or event twice."""
    c = command
    problems = []
    if not c.word or " " in c.word or not c.word.isascii():
        problems.append("a word of ASCII without spaces")
    if not isinstance(c.event, type):
        problems.append("an event type")
    if not c.counts or min(c.counts) < 1:
        problems.append("its token counts")
    if not c.usage:
        problems.append("how its token counts are said")
    if not callable(c.parse) or not callable(c.serialize):
        problems.append("a parser and a serializer")
    if not isinstance(c.need, Need) or c.need.rule not in RULES:
        problems.append("what it needs of the user (a Need)")
    if c.body is not None and not 0 < c.body < min(c.counts):
        problems.append("a body length token within its counts")
    if c.burst is not None and c.body is None:
        problems.append("a body (a burst scanner takes frames with bodies)")
    if not c.examples:
        problems.append("an example frame")
    if problems:
        raise TypeError("text command %r is declared without %s" % (c.word, ", ".join(problems)))
    if c.word in _BY_WORD or c.event in _BY_EVENT:
        raise TypeError("text command %r (%s) is declared twice" % (c.word, c.event.__name__))
    if _complete:
        raise TypeError("text command %r is declared after the table was completed" % (c.word,))
    _BY_WORD[c.word] = c
    _BY_EVENT[c.event] = c
    return c


def complete():
    """Every declaring module is loaded (``metaq.textcommands`` calls this once it imported them all): the
    table may be read from now on. A ``register`` after this raises TypeError (a late declaration would be missed by
    what was derived from the table)."""
    global _complete, _fast_lines
    _fast_lines = tuple(sorted(((c.word.encode("ascii") + b" ", c.fast_line) for c in _BY_WORD.values()
                                if c.fast_line is not None), key=lambda item: item[0] != b"put "))
    _complete = True


def _incomplete():
    return RuntimeError("the text command table is read before every command was declared: import "
                        "metaq.textcommands first")


def table():
    """``{word: TextCommand}`` of every command; RuntimeError before ``complete()``."""
    if not _complete:
        raise _incomplete()
    return _BY_WORD


def by_word(word):
    """The command ``word`` names, or None; RuntimeError before ``complete()``."""
    if not _complete:
        raise _incomplete()
    return _BY_WORD.get(word)


def by_event(event_type):
    """The command of ``event_type``, or None; RuntimeError before ``complete()``."""
    if not _complete:
        raise _incomplete()
    return _BY_EVENT.get(event_type)


def fast_lines():
    """``(b"<word> ", its one-step line parser)`` of the commands that declare one (``TextCommand.fast_line``), the
    most used first (a plain put); RuntimeError before ``complete()``."""
    if not _complete:
        raise _incomplete()
    return _fast_lines


def requests():
    """Every command a client sends (not ``value``/``result``)."""
    return [c for c in table().values() if not c.reply]


def bursts():
    """``{word: scanner}`` of the commands the server's fast path takes in runs."""
    return {c.word: c.burst for c in table().values() if c.burst is not None}
