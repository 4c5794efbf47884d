"""The OFFSETS frame of the replication stream: the master's committed consumer offsets, sans-IO.

``metaq.protocol.replication`` frames it (type ``T_OFFSETS`` = 9, same header, CRC and version) and calls
``payload_parts`` / ``check_length`` / ``decode`` here. The master sends its whole consumer-offset table once
per link (frames with the SNAPSHOT flag, the last one also END), then the entries that changed, at most every
sync interval (``metaq.server.replication.master``); the slave makes its table the snapshot and applies the
changes (``metaq.server.replication.slave``).

Payload (big-endian)::

    OFFSETS_HEAD  >BI    flags uint8 (SNAPSHOT=1: this frame is part of the master's whole table; END=2: its last
                         frame, only with SNAPSHOT; OWNERS=4: every entry is followed by its owner; no other bit),
                         count uint32 (1..MAX_REPLICATION_OFFSETS_PER_FRAME; 0 only in a SNAPSHOT|END frame: an
                         empty table)
    then count x  OFFSET_ENTRY >BBiqq  group length uint8, topic length uint8, partition int32 (0..MAX_PARTITIONS-1),
                         offset int64 (>= 0, the group's next read offset), commit_ms int64 (>= 0), then the group's
                         and the topic's bytes (each a legal name: ``limits.validate_topic``)
                  with OWNERS, then  owner length uint8 (0..MAX_TX_OWNER_BYTES; 0: the entry has no owner), then
                         the owner's UTF-8 bytes (the user whose commit made the entry: ``metaq.offsets.table``)

The payload is at most ``OFFSETS_HEAD.size + MAX_REPLICATION_OFFSETS_BYTES`` bytes, checked from the frame header
before it is buffered; its entries must fill it exactly, and no (group, topic, partition) may appear twice in one
frame. Any violation is a fatal ``RemoteProtocolError`` naming what was wrong.

**Owners and older slaves.** The handshake has no field in which a slave could say which flags it understands (its
HELLO, PROOF and the frame header are exact-size or all-zero, so an older master would refuse any addition), and a
slave from before OWNERS refuses the bit fatally. So ``frames`` sets OWNERS only on a frame with at least one
owned entry: a master whose entries have no owner (authentication off) sends what such a slave reads, and one with
owners needs its slaves upgraded first (docs/replication.md "The stream"), as for the TOPICS frame.
"""

import struct
from typing import NamedTuple

from metaq import limits
from metaq.offsets import limits as offsets_limits
from metaq.errors import InvalidTopic, RemoteProtocolError

__all__ = ["Offsets", "SNAPSHOT", "END", "OWNERS", "OFFSETS_HEAD", "OFFSET_ENTRY", "OWNER_LEN", "payload_parts",
           "check_length", "decode", "frames", "entry_size"]

#: flags, count of entries.
OFFSETS_HEAD = struct.Struct(">BI")
assert OFFSETS_HEAD.size == 5
#: group length, topic length, partition, offset, commit_ms (the names follow).
OFFSET_ENTRY = struct.Struct(">BBiqq")
assert OFFSET_ENTRY.size == 22
#: the owner's length (with OWNERS; its UTF-8 bytes follow).
OWNER_LEN = struct.Struct(">B")
SNAPSHOT, END, OWNERS = 1, 2, 4
INT64_MAX = 2**63 - 1


class Offsets(NamedTuple):
    """Committed offsets ``((group, topic, partition, offset, commit_ms), ...)``; ``snapshot``: part of the master's
    whole table (``end``: its last frame); otherwise the entries that changed since the last OFFSETS. ``owners``:
    each entry has a sixth field, its owner (a user name, None: no owner)."""

    entries: tuple
    snapshot: bool = False
    end: bool = False
    owners: bool = False


def _fail(reason):
    return RemoteProtocolError("bad OFFSETS: %s" % reason, fatal=True)


def entry_size(entry):
    """Bytes ``entry`` takes in a frame (its names are ASCII: every legal name is); a sixth field, its owner, counts
    as it would with OWNERS."""
    size = OFFSET_ENTRY.size + len(entry[0]) + len(entry[1])
    if len(entry) == 6:
        size += OWNER_LEN.size + (len(entry[5].encode("utf-8")) if entry[5] else 0)
    return size


def _owner_problem(owner):
    if owner is None:
        return None
    if not isinstance(owner, str):
        return "an owner is a user name or None, not %r" % (owner,)
    try:
        size = len(owner.encode("utf-8"))
    except UnicodeEncodeError:
        return "an owner is UTF-8 text, not %r" % (owner,)
    if not 0 < size <= limits.MAX_TX_OWNER_BYTES:
        return "an owner of %d bytes: a user name has 1..%d (limit MAX_TX_OWNER_BYTES)" % (
            size, limits.MAX_TX_OWNER_BYTES)
    return None


def _problem(entry, owners=False):
    """Why ``entry`` cannot be sent or believed, or None."""
    if owners:
        if len(entry) != 6:
            return "an entry is (group, topic, partition, offset, commit_ms, owner), not %r" % (entry,)
        why = _owner_problem(entry[5])
        if why is not None:
            return why
    elif len(entry) != 5:
        return "an entry is (group, topic, partition, offset, commit_ms), not %r" % (entry,)
    group, topic, partition, offset, commit_ms = entry[:5]
    try:
        limits.validate_group(group)
        limits.validate_topic(topic)
    except InvalidTopic as exc:
        return str(exc)
    if not 0 <= partition < limits.MAX_PARTITIONS:
        return "partition %d of %s is out of range 0..%d (limit MAX_PARTITIONS)" % (
            partition, topic, limits.MAX_PARTITIONS - 1)
    if not 0 <= offset <= INT64_MAX:
        return "offset %d of %s/%s-%d is out of range" % (offset, group, topic, partition)
    if not 0 <= commit_ms <= INT64_MAX:
        return "commit time %d of %s/%s-%d is out of range" % (commit_ms, group, topic, partition)
    return None


def _flags_problem(event):
    if event.end and not event.snapshot:
        return "END without SNAPSHOT: only a snapshot has a last frame"
    most = offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME
    low = 0 if event.end else 1
    if not low <= len(event.entries) <= most:
        return "%d entries: a frame carries %d..%d (limit MAX_REPLICATION_OFFSETS_PER_FRAME; none only in a " \
               "snapshot's last frame)" % (len(event.entries), low, most)
    return None


def payload_parts(event):
    """The OFFSETS payload as buffers; ValueError when ``event`` breaks a rule above (nothing is sent)."""
    why = _flags_problem(event)
    if why is not None:
        raise ValueError(why)
    flags = (SNAPSHOT if event.snapshot else 0) | (END if event.end else 0) | (OWNERS if event.owners else 0)
    parts = [OFFSETS_HEAD.pack(flags, len(event.entries))]
    size = 0
    for entry in event.entries:
        why = _problem(entry, event.owners)
        if why is not None:
            raise ValueError(why)
        group, topic, partition, offset, commit_ms = entry[:5]
        body = OFFSET_ENTRY.pack(len(group), len(topic), partition, offset, commit_ms) + group.encode("ascii") \
            + topic.encode("ascii")
        if event.owners:
            owner = entry[5].encode("utf-8") if entry[5] is not None else b""
            body += OWNER_LEN.pack(len(owner)) + owner
        parts.append(body)
        size += len(body)
    if size > offsets_limits.MAX_REPLICATION_OFFSETS_BYTES:
        raise ValueError("OFFSETS entries of %d bytes exceed the %d-byte limit (MAX_REPLICATION_OFFSETS_BYTES)"
                         % (size, offsets_limits.MAX_REPLICATION_OFFSETS_BYTES))
    if len({e[:3] for e in event.entries}) != len(event.entries):
        raise ValueError("an OFFSETS frame names a (group, topic, partition) twice")
    return parts


def check_length(length):
    """Refuse (fatally) a payload length no OFFSETS frame can have, from the header alone."""
    most = OFFSETS_HEAD.size + offsets_limits.MAX_REPLICATION_OFFSETS_BYTES
    if not OFFSETS_HEAD.size <= length <= most:
        raise _fail("a frame of %d bytes: must be %d..%d (limit MAX_REPLICATION_OFFSETS_BYTES)"
                    % (length, OFFSETS_HEAD.size, most))


def decode(payload):
    """An ``Offsets`` event from a whole, CRC-checked payload; RemoteProtocolError (fatal) for any lie."""
    flags, count = OFFSETS_HEAD.unpack_from(payload)
    if flags & ~(SNAPSHOT | END | OWNERS):
        raise _fail("unknown flags %#04x" % flags)
    owners = bool(flags & OWNERS)
    if count > offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME:
        raise _fail("%d entries: a frame carries at most %d (limit MAX_REPLICATION_OFFSETS_PER_FRAME)"
                    % (count, offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME))
    at, end, entries, keys = OFFSETS_HEAD.size, len(payload), [], set()
    for i in range(count):
        if at + OFFSET_ENTRY.size > end:
            raise _fail("entry %d of %d does not fit the frame's %d bytes" % (i + 1, count, end))
        glen, tlen, partition, offset, commit_ms = OFFSET_ENTRY.unpack_from(payload, at)
        at += OFFSET_ENTRY.size
        if at + glen + tlen > end:
            raise _fail("the names of entry %d of %d (%d + %d bytes) do not fit the frame's %d bytes"
                        % (i + 1, count, glen, tlen, end))
        group = bytes(payload[at:at + glen]).decode("ascii", "replace")
        topic = bytes(payload[at + glen:at + glen + tlen]).decode("ascii", "replace")
        at += glen + tlen
        entry = (group, topic, partition, offset, commit_ms)
        if owners:
            owner, at = _owner(payload, at, end, i, count)
            entry += (owner,)
        why = _problem(entry, owners)
        if why is not None:
            raise _fail("entry %d of %d: %s" % (i + 1, count, why))
        if entry[:3] in keys:
            raise _fail("entry %d of %d names %s/%s-%d a second time" % (i + 1, count, group, topic, partition))
        keys.add(entry[:3])
        entries.append(entry)
    if at != end:
        raise _fail("%d entries leave %d of the frame's %d bytes unused" % (count, end - at, end))
    event = Offsets(tuple(entries), bool(flags & SNAPSHOT), bool(flags & END), owners)
    why = _flags_problem(event)
    if why is not None:
        raise _fail(why)
    return event


def _owner(payload, at, end, i, count):
    """``(owner, where the next entry starts)`` for entry ``i`` whose owner starts at ``at`` (None: length 0);
    RemoteProtocolError (fatal) for any lie."""
    if at + OWNER_LEN.size > end:
        raise _fail("the owner of entry %d of %d does not fit the frame's %d bytes" % (i + 1, count, end))
    (olen,) = OWNER_LEN.unpack_from(payload, at)
    at += OWNER_LEN.size
    if olen > limits.MAX_TX_OWNER_BYTES:
        raise _fail("the owner of entry %d of %d is %d bytes: at most %d (limit MAX_TX_OWNER_BYTES)"
                    % (i + 1, count, olen, limits.MAX_TX_OWNER_BYTES))
    if at + olen > end:
        raise _fail("the owner of entry %d of %d (%d bytes) does not fit the frame's %d bytes"
                    % (i + 1, count, olen, end))
    if not olen:
        return None, at
    try:
        return bytes(payload[at:at + olen]).decode("utf-8"), at + olen
    except UnicodeDecodeError:
        raise _fail("the owner of entry %d of %d is not UTF-8" % (i + 1, count)) from None


def frames(entries, snapshot):
    """``entries`` as OFFSETS events within both limits, in order. An entry may have a sixth field, its owner (None:
    none): a frame with an owned entry has OWNERS (its other entries get None), a frame without one has not (and
    its entries five fields: a slave from before OWNERS reads it). A snapshot always ends with an END frame (one
    with no entries for an empty table); changes yield nothing when there are none."""
    entries = list(entries)
    if any(len(e) == 6 for e in entries):  # every entry's size then counts an owner's length byte
        entries = [tuple(e) if len(e) == 6 else tuple(e) + (None,) for e in entries]
    out, chunk, size = [], [], 0
    for entry in entries:
        grown = size + entry_size(entry)
        if chunk and (len(chunk) == offsets_limits.MAX_REPLICATION_OFFSETS_PER_FRAME
                      or grown > offsets_limits.MAX_REPLICATION_OFFSETS_BYTES):
            out.append(_event(chunk, snapshot))
            chunk, grown = [], entry_size(entry)
        chunk.append(entry)
        size = grown
    if chunk or snapshot:
        out.append(_event(chunk, snapshot))
    if snapshot:
        out[-1] = out[-1]._replace(end=True)
    return out


def _event(chunk, snapshot):
    if any(len(e) == 6 and e[5] is not None for e in chunk):
        return Offsets(tuple(chunk), snapshot, owners=True)
    return Offsets(tuple(tuple(e[:5]) for e in chunk), snapshot)
