"""The replication stream's TOPICS frame (type 10, ``metaq.protocol.replication``): the master's topic table, and
the owner of each topic a user's put created, applied by the slave (``metaq.server.replication.slave``).

Payload: the UTF-8 JSON object of the master's topic table (``metaq.topics.table``, ``<data_dir>/topics.json``:
its own ``format`` versions it, and a slave refuses a format it does not read), 1..MAX_TOPIC_TABLE_BYTES bytes,
checked from the frame header before it is buffered. The frame may add one key to that object::

    "owners": [[topic, user, partitions], ...]   the topics users' puts created (``metaq.store.quota``): each a
                  legal topic name (``limits.validate_topic``), at most once; the user 1..MAX_TX_OWNER_BYTES bytes
                  of UTF-8; partitions (what the topic counts against the user's ``partitions`` quota) 1..
                  MAX_PARTITIONS (how many entries: as many as the payload's MAX_TOPIC_TABLE_BYTES hold)

and one more::

    "groups": {...}   the master's group settings table (``metaq.groups.table``, ``<data_dir>/groups.json``: its own
                  ``format`` versions it), sent once the master's group table has been changed; the slave's table
                  becomes exactly it (an empty one without the key), checked as the slave takes it
                  (``GroupTable.apply_json``); a slave from before group settings ignores it

Its presence is the frame's owners flag: the slave's owners become exactly these (none without the key).
``encode`` writes it only when some topic has an owner, so a master whose topics have none (authentication off)
sends byte for byte the table's file, as before owners. Anything the payload says that is not so (not UTF-8,
not a JSON object, owners not a list, a bad or repeated entry) is a fatal ``RemoteProtocolError``
naming it; the table itself is checked as the slave takes it (``TopicTableFile.apply_json``).

**Owners and older slaves.** A slave from before owners reads the table and ignores the key (its topics keep
no owners, as before). A master sends TOPICS when its table is not empty or some topic has an owner: a slave
from before the TOPICS frame ends the link at it ("unknown frame type 10"): upgrade slaves first
(docs/replication.md "The stream").
"""

import json
from typing import NamedTuple

from metaq import limits
from metaq.topics import limits as topics_limits
from metaq.errors import InvalidTopic, RemoteProtocolError

__all__ = ["Topics", "OWNERS_KEY", "GROUPS_KEY", "encode", "payload_parts", "check_length", "decode", "owner_problem"]

#: The key of the table's JSON object that carries the owners (its presence: the owners flag).
OWNERS_KEY = "owners"
#: The key that carries the master's group settings table (absent: the master has none).
GROUPS_KEY = "groups"


class Topics(NamedTuple):
    """``table``: the payload, the UTF-8 JSON of the master's topic table (``encode`` makes it); ``owners``:
    ``((topic, user, partitions), ...)`` it carries under ``"owners"`` (empty: the key is absent); ``groups``: the
    group settings table's JSON object it carries under ``"groups"`` (None: the key is absent)."""

    table: bytes
    owners: tuple = ()
    groups: dict = None


def _fail(reason):
    return RemoteProtocolError("bad TOPICS: %s" % reason, fatal=True)


def owner_problem(entry):
    """Why ``entry`` is not ``(topic, user, partitions)`` a frame may carry, or None."""
    if not isinstance(entry, (tuple, list)) or len(entry) != 3:
        return "an owner is [topic, user, partitions], not %r" % (entry,)
    topic, user, partitions = entry
    if not isinstance(topic, str):
        return "a topic is a name, not %r" % (topic,)
    try:
        limits.validate_topic(topic)
    except InvalidTopic as exc:
        return str(exc)
    if not isinstance(user, str):
        return "the owner of topic %s is a user name, not %r" % (topic, user)
    try:
        size = len(user.encode("utf-8"))
    except UnicodeEncodeError:
        return "the owner of topic %s is UTF-8 text, not %r" % (topic, user)
    if not 0 < size <= limits.MAX_TX_OWNER_BYTES:
        return "the owner of topic %s has %d bytes: a user name has 1..%d (limit MAX_TX_OWNER_BYTES)" % (
            topic, size, limits.MAX_TX_OWNER_BYTES)
    if type(partitions) is not int or not 1 <= partitions <= limits.MAX_PARTITIONS:
        return "topic %s owned with %r partitions: 1..%d (limit MAX_PARTITIONS)" % (
            topic, partitions, limits.MAX_PARTITIONS)
    return None


def _owners_problem(owners):
    seen = set()
    for i, entry in enumerate(owners):
        why = owner_problem(entry)
        if why is not None:
            return "owner %d of %d: %s" % (i + 1, len(owners), why)
        if entry[0] in seen:
            return "owner %d of %d names topic %s a second time" % (i + 1, len(owners), entry[0])
        seen.add(entry[0])
    return None


def encode(table, owners=(), groups=None):
    """A ``Topics`` event from the table's JSON object ``table`` (``TopicTableFile.to_json()``) and its owned
    topics ``[(topic, user, partitions)]``: without owners its payload is the table's file byte for byte
    (``TopicTableFile.encode``). ValueError for an owner no frame may carry or a payload past MAX_TOPIC_TABLE_BYTES
    (the caller may send the table alone)."""
    owners = tuple(tuple(o) for o in owners)
    why = _owners_problem(owners)
    if why is not None:
        raise ValueError(why)
    for key in (OWNERS_KEY, GROUPS_KEY):
        if key in table:
            raise ValueError("a topic table has no %r key of its own" % key)
    if owners:
        table = dict(table, **{OWNERS_KEY: [list(o) for o in owners]})
    if groups is not None:
        table = dict(table, **{GROUPS_KEY: groups})
    event = Topics(json.dumps(table, indent=1, sort_keys=True).encode("utf-8") + b"\n", owners, groups)
    why = _size_problem(len(event.table))
    if why is not None:
        raise ValueError(why)
    return event


def _size_problem(length):
    if not 0 < length <= topics_limits.MAX_TOPIC_TABLE_BYTES:
        return "TOPICS frame of %d bytes: must be 1..%d (limit MAX_TOPIC_TABLE_BYTES)" % (
            length, topics_limits.MAX_TOPIC_TABLE_BYTES)
    return None


def check_length(length):
    """Refuse (fatal) a TOPICS frame header announcing a payload outside 1..MAX_TOPIC_TABLE_BYTES."""
    why = _size_problem(length)
    if why is not None:
        raise RemoteProtocolError(why, fatal=True)


def payload_parts(event):
    """The payload of ``event``; ValueError for a size or an owner no frame may carry."""
    why = _size_problem(len(event.table)) or _owners_problem(event.owners)
    if why is not None:
        raise ValueError(why)
    return [event.table]


def decode(payload):
    """A ``Topics`` event from a whole, CRC-checked payload; RemoteProtocolError (fatal) for any lie about owners
    or a payload that is not a UTF-8 JSON object."""
    table = bytes(payload)
    try:
        state = json.loads(table.decode("utf-8"))
    except UnicodeDecodeError:
        raise _fail("the table is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise _fail("the table is not JSON: %s" % exc) from None
    if not isinstance(state, dict):
        raise _fail("the table is a JSON object, not %s" % type(state).__name__)
    groups = state.get(GROUPS_KEY)
    if groups is not None and not isinstance(groups, dict):
        raise _fail("%r is the group settings table, a JSON object, not %s" % (GROUPS_KEY, type(groups).__name__))
    if OWNERS_KEY not in state:
        return Topics(table, (), groups)
    owners = state[OWNERS_KEY]
    if not isinstance(owners, list):
        raise _fail("%r is a list of [topic, user, partitions], not %s" % (OWNERS_KEY, type(owners).__name__))
    why = _owners_problem(owners)
    if why is not None:
        raise _fail(why)
    return Topics(table, tuple(tuple(o) for o in owners), groups)
