"""Consumer priorities (docs/messaging.md "Priorities"), sans-IO: the level sub-queues' names, ``put_prio`` and
``get_prio``, and the broker's choice of the level a ``get_prio`` serves.

A priority topic (``metaq-admin topics create <t> --priorities L``) has levels 0..L-1, L-1 the highest. Level 0
is the topic itself (plain ``get``\\ s and RocketMQ pulls see it); level k >= 1 is stored as the internal topic
``<topic>%P<k>`` with the same partition numbers (``level_topic``). Clients may read those names but never put to
them (``is_level_topic``: every put path refuses them), and an operator cannot create them.

Text extensions::

    put_prio <topic> <partition> <len> <flag> <checksum> <priority> <opaque>\\r\\n<body>   answered like put
    get_prio <topic> <group> <partition> <o_0,o_1,...,o_{L-1}> <maxSize> [<maxWaitMs> [<e_0,...,e_{L-1}>]] <opaque>

``get_prio`` carries the consumer's next offset of every level (exactly L of them) and is answered with the
records of ONE level: ``value <len> <opaque>\\r\\n<level>\\n<records as a get's>`` (``decode_get_prio_body``), so
the consumer advances that level's offset; ``result 404`` when no level has anything (after the long poll);
``result 301`` with body ``<level> <offset>`` when a level's offset is outside its partition. The optional
expects (``e_k``: ``<offset>:<msgId>`` of the record level k read last, or ``-`` for none; a get's ``expect``,
events.Get, per level) are checked before anything is read: ``result 412`` with body ``<level> <reason>`` when
this broker holds another record at a level's expected offset (a failover rewrote it; client/priorities.py).

Which level (``choose_level``): the highest level with a backlog, except that a level whose head message has
waited longer than the topic's ``priority_max_wait_ms`` competes by age: among such starved levels the one with
the oldest head goes first (ties: the higher level).
"""

from typing import NamedTuple, Optional, Tuple

from metaq.priorities import limits as priorities_limits
from metaq.protocol.commands import NEEDS_HANDLER, TextCommand, register, token
from metaq.protocol.integers import parse_int
from metaq.protocol.leveltopic import LEVEL_MARK, is_level_topic, level_refusal, level_topic, split_level

__all__ = ["LEVEL_MARK", "level_topic", "split_level", "is_level_topic", "level_refusal", "PriorityPut",
           "PriorityGet", "choose_level", "encode_get_prio_prefix",
           "decode_get_prio_body"]

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


class PriorityPut(NamedTuple):
    """``put_prio <topic> <partition> <len> <flag> <checksum> <priority> <opaque>`` + body."""

    topic: str
    partition: int
    flag: int
    body: bytes
    opaque: int
    checksum: int
    priority: int


class PriorityGet(NamedTuple):
    """``get_prio <topic> <group> <partition> <o_0,...> <maxSize> [<maxWaitMs>] <opaque>``; ``offsets`` a tuple."""

    topic: str
    group: str
    partition: int
    offsets: Tuple[int, ...]
    max_size: int
    opaque: int
    max_wait_ms: Optional[int] = None
    expects: Optional[Tuple[Optional[Tuple[int, int]], ...]] = None  # per level (offset, msg_id) or None; needs a wait


def parse_offsets(token):
    """The ``o_0,o_1,...`` token: 1..MAX_PRIORITY_LEVELS offsets >= 0; ValueError with the reason."""
    parts = token.split(",")
    if len(parts) > priorities_limits.MAX_PRIORITY_LEVELS:
        raise ValueError("get_prio: at most %d offsets (limits.MAX_PRIORITY_LEVELS), got %d"
                         % (priorities_limits.MAX_PRIORITY_LEVELS, len(parts)))
    return tuple(parse_int(p, "offset", 0, _INT64[1]) for p in parts)


def parse_expects(token, levels):
    """The ``e_0,...`` token: one ``<offset>:<msgId>`` or ``-`` per level (``levels`` of them); ValueError with the
    reason."""
    parts = token.split(",")
    if len(parts) != levels:
        raise ValueError("get_prio: give one expect per offset (%d), got %d" % (levels, len(parts)))
    out = []
    for part in parts:
        if part == "-":
            out.append(None)
            continue
        offset, sep, msg_id = part.partition(":")
        if not sep:
            raise ValueError("invalid expect %r: <offset>:<msgId> of the record a level read last, or -" % part[:64])
        out.append((parse_int(offset, "expect offset", 0, _INT64[1]), parse_int(msg_id, "expect msgId", *_INT64)))
    return tuple(out)


def _parse_put_prio(t):
    topic = t[1]
    partition = parse_int(t[2], "partition", -1, _INT32[1])
    flag = parse_int(t[4], "flag", *_INT32)
    checksum = parse_int(t[5], "checksum", -1, _INT32[1])
    priority = parse_int(t[6], "priority", *_INT32)  # the broker answers a priority out of the topic's range
    opaque = parse_int(t[7], "opaque", *_INT32)
    return lambda body: PriorityPut(topic, partition, flag, body, opaque, checksum, priority)


def _parse_get_prio(t):
    partition = parse_int(t[3], "partition", 0, _INT32[1])
    offsets = parse_offsets(t[4])
    max_size = parse_int(t[5], "maxSize", *_INT32)  # <= 0 is answered by the broker, as for get
    max_wait_ms = parse_int(t[6], "maxWaitMs", 0, _INT32[1]) if len(t) >= 8 else None
    expects = parse_expects(t[7], len(offsets)) if len(t) == 9 else None
    return PriorityGet(t[1], t[2], partition, offsets, max_size, parse_int(t[-1], "opaque", *_INT32), max_wait_ms,
                       expects)



def _serialize_put_prio(e):
    head = "put_prio %s %d %d %d %d %d %d\r\n" % (token(e.topic), e.partition, len(e.body), e.flag, e.checksum,
                                                  e.priority, e.opaque)
    return head.encode("utf-8") + e.body


def _serialize_get_prio(e):
    wait = "" if e.max_wait_ms is None else " %d" % e.max_wait_ms
    if e.expects is not None:
        if len(e.expects) != len(e.offsets):
            raise ValueError("get_prio: one expect per offset, %d of them, not %d" % (len(e.offsets), len(e.expects)))
        wait = " %d %s" % (e.max_wait_ms or 0, ",".join("-" if x is None else "%d:%d" % x for x in e.expects))
    return ("get_prio %s %s %d %s %d%s %d\r\n" % (token(e.topic), token(e.group), e.partition,
                                                  ",".join("%d" % o for o in e.offsets), e.max_size, wait,
                                                  e.opaque)).encode("utf-8")


register(TextCommand(
    "put_prio", PriorityPut, (8,), "8 tokens (put_prio <topic> <partition> <len> <flag> <checksum> <priority> "
    "<opaque>)", _parse_put_prio, _serialize_put_prio, NEEDS_HANDLER, body=3,
    examples=(b"put_prio t 0 2 0 -1 1 5\r\nhi",)))
register(TextCommand(
    "get_prio", PriorityGet, (7, 8, 9), "7 to 9 tokens (get_prio <topic> <group> <partition> <o_0,o_1,...> "
    "<maxSize> [<maxWaitMs> [<e_0,e_1,...>]] <opaque>)", _parse_get_prio, _serialize_get_prio, NEEDS_HANDLER,
    examples=(b"get_prio t g 0 0,0 1024 1\r\n", b"get_prio t g 0 3,4 1024 100 2:7,- 2\r\n")))


def encode_get_prio_prefix(level):
    """What a ``get_prio`` reply's body starts with, before the records: the level they belong to."""
    return b"%d\n" % level


def decode_get_prio_body(body):
    """``(level, records bytes)`` of a ``get_prio`` reply's body; ValueError if it does not start with a level."""
    head, sep, rest = bytes(body[:4]).partition(b"\n")
    if not sep or not head.isdigit():
        raise ValueError("a get_prio reply starts with '<level>\\n', got %r" % bytes(body[:16]))
    return int(head), body[len(head) + 1:]


def choose_level(heads, now_ms, max_wait_ms):
    """The level a ``get_prio`` serves: ``heads`` maps each level that has a backlog to the store time (ms) of its
    head message (the next one the consumer reads). None when no level has a backlog.

    The highest level wins, unless some levels' heads have waited more than ``max_wait_ms`` (``now_ms - head >
    max_wait_ms``): then the starved level with the oldest head wins (equal heads: the higher level). So a message
    that has waited more than ``max_wait_ms`` is served before every message stored after it."""
    if not heads:
        return None
    starved = [(head, -level) for level, head in heads.items() if now_ms - head > max_wait_ms]
    if starved:
        return -min(starved)[1]
    return max(heads)


def with_owner_keys(keys):
    """``(topic, partition)`` keys plus, for each priority level's, its topic's key: a ``get_prio`` parks on its topic's
    key (``(topic, partition)``), and an append to any level must wake it."""
    out = list(keys)
    for topic, partition in keys:
        split = split_level(topic) if "%P" in topic else None
        if split is not None:
            out.append((split[0], partition))
    return out
