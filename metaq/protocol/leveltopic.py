"""A priority level's topic name (docs/messaging.md "Priorities"): level k >= 1 of topic ``t`` is stored as the
internal topic ``t%P<k>`` (``level_topic``), level 0 as ``t`` itself. Clients may read those names but never put to
them: every put path refuses them (``is_level_topic``, ``level_refusal``), the ACL rules a level as its topic, and an
operator cannot create them. A naming rule of every topic, read below the put path and the feature that serves
the levels (priorities/wire.py), as the broker's internal topics' names are (journaltopic.py)."""

import re

LEVEL_MARK = "%P"
_LEVEL_RE = re.compile(r"(.+)%P([1-9][0-9]?)")
_LEVEL_BYTES_RE = re.compile(rb".+%P[1-9][0-9]?")


def level_topic(topic, level):
    """The name level ``level`` of ``topic`` is stored under (``topic`` itself for level 0)."""
    return topic if level == 0 else "%s%s%d" % (topic, LEVEL_MARK, level)


def split_level(name):
    """``(topic, level)`` of a level's internal name, or None for any other name."""
    m = _LEVEL_RE.fullmatch(name)
    return None if m is None else (m.group(1), int(m.group(2)))


def is_level_topic(name):
    """True for a level's internal name (``str`` or ``bytes``, as the fast put paths hold it)."""
    if isinstance(name, (bytes, bytearray, memoryview)):
        name = bytes(name)
        return b"%P" in name and _LEVEL_BYTES_RE.fullmatch(name) is not None
    return "%P" in name and _LEVEL_RE.fullmatch(name) is not None


def level_refusal(name):
    return ("%s is a priority level's internal topic: put to %s with a priority (put_prio, Message(priority=N))"
            % (name, split_level(name)[0] if split_level(name) else name))
