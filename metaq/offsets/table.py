"""The broker's consumer-offset store: where a consumer group's position lives when it has no ZooKeeper.

One entry per (group, topic, partition): the next offset the group will read
and when it was committed. Entries live in memory and reach the data dir's
``consumer_offsets`` state file (JSON with a magic, length and CRC; written
atomically) at every store checkpoint and at close, so a crash loses at most
one checkpoint interval of commits: the group then re-reads those messages
(at-least-once, like MetaQ's periodic offset commits). RocketMQ clients use
the same store (DESIGN §8).

**Owners.** Each entry belongs to the user whose commit made it (None: no user, authentication off, or an
entry from before owners); a user holds at most its quota of entries (``quota(user, held)``: the quota decision,
``metaq.auth.quotas``, ``consumer_offsets``): a commit of a new entry past it is refused with
``QuotaExceeded``. The owner is kept in the state file (a sixth field; rows of five are still read) and goes to
the slaves with the entry (``snapshot``/``changes`` with ``owners=True``; ``replace``/``replicate`` take it), so a
slave's owners, and its ``held()`` counts, are its master's: a promoted slave holds each user to its quota.

A master's store is copied to its slaves over the replication stream: every change
bumps a version, so the master's sender asks for what changed since the version it
last sent (``changes``) after sending the whole table once per link (``snapshot``);
a slave takes the whole table with ``replace`` and the changes with ``replicate``.
"""

import logging
from collections import OrderedDict

from metaq.errors import ClientError
from metaq.limits import MAX_TX_OWNER_BYTES, validate_group
from metaq.offsets.limits import MAX_CONSUMER_OFFSETS

log = logging.getLogger(__name__)

OFFSETS_MAGIC = b"MQCO"


class ConsumerOffsets:
    """group/topic/partition → (offset, commit_ms), persisted through ``DataDir`` state files."""

    def __init__(self, dirs, max_entries=MAX_CONSUMER_OFFSETS, quota=None):
        """``quota(user, held)``: raises when ``user``, holding ``held`` entries, may not make one more."""
        self._dirs = dirs
        self.max_entries = max_entries
        self.quota = quota
        self._owners = {}  # key -> the user whose commit made it (absent: no owner)
        self._held = {}  # user -> entries it owns
        self._path = dirs.consumer_offsets
        self._entries = {}
        self._version = 0  # bumped by every change; what was last written is _saved
        self._saved = 0
        self._changed = OrderedDict()  # key -> the version of its last change, oldest change first

    def load(self):
        state = self._dirs.read_state(self._path, OFFSETS_MAGIC)
        if not state:
            return 0
        for row in state.get("offsets", ()):
            try:
                group, topic, partition, offset, commit_ms = row[:5]
                key = (str(group), str(topic), int(partition))
                self._entries[key] = (int(offset), int(commit_ms))
                if len(row) == 6 and row[5] is not None:
                    if 0 < len(str(row[5]).encode("utf-8")) <= MAX_TX_OWNER_BYTES:
                        self._own(key, str(row[5]))
                    else:  # no user has such a name (and the replication stream could not carry it)
                        log.warning("consumer offsets: ignored the owner of %r: a user name has 1..%d bytes",
                                    row[:3], MAX_TX_OWNER_BYTES)
            except (TypeError, ValueError):
                log.warning("consumer offsets: ignored a malformed entry %r", row)
        return len(self._entries)

    def held(self):
        """``{user: entries it owns}`` (stats)."""
        return dict(self._held)

    def _own(self, key, owner):
        self._owners[key] = owner
        self._held[owner] = self._held.get(owner, 0) + 1

    def _disown(self, key):
        owner = self._owners.pop(key, None)
        if owner is not None:
            n = self._held.get(owner, 0) - 1
            if n > 0:
                self._held[owner] = n
            else:
                self._held.pop(owner, None)

    def commit(self, group, topic, partition, offset, now_ms, max_offset, owner=None):
        """Record ``offset`` as the group's next read position, committed by user ``owner``; 400 when it is
        negative or past the end, QuotaExceeded when it is a new entry past ``owner``'s quota."""
        validate_group(group)
        if offset < 0 or offset > max_offset:
            raise ClientError("offset %d out of range for %s-%d: committed offsets must be 0..%d (the log end)"
                              % (offset, topic, partition, max_offset))
        key = (group, topic, partition)
        if key not in self._entries and len(self._entries) >= self.max_entries:
            raise ClientError("too many committed offsets on the broker: the limit is %d (group, topic, partition) "
                              "entries; %s cannot commit a new one" % (self.max_entries, group))
        if owner is not None and key not in self._owners:  # a new entry, or one without an owner: it becomes owner's
            if self.quota is not None:
                self.quota(owner, self._held.get(owner, 0))
            self._own(key, owner)
        self._entries[key] = (offset, now_ms)
        self._touch(key)

    def _touch(self, key):
        self._version += 1
        self._changed[key] = self._version
        self._changed.move_to_end(key)

    @property
    def version(self):
        """Bumped by every change (``changes`` takes it)."""
        return self._version

    def snapshot(self, owners=False):
        """``(version, entries)``: every entry as ``entries(owners)`` lists them, and the version they reflect."""
        return self._version, self.entries(owners)

    def changes(self, since, owners=False):
        """``(entries, version)``: the entries changed after version ``since``, oldest change first, each once
        with its current value (and, with ``owners``, its owner as a sixth field); and the version they bring a
        caller to (pass it next time)."""
        keys = []
        for key, version in reversed(self._changed.items()):
            if version <= since:
                break
            keys.append(key)
        entries, own = self._entries, self._owners
        return [key + entries[key] + ((own.get(key),) if owners else ()) for key in reversed(keys)
                if key in entries], self._version

    def _set_owner(self, key, owner):
        if self._owners.get(key) != owner:
            self._disown(key)
            if owner is not None:
                self._own(key, owner)

    def replicate(self, rows):
        """A master's changed entries ``(group, topic, partition, offset, commit_ms[, owner])``: each replaces ours,
        its owner too (None or no sixth field: no owner; the master's word is final, whatever the slave was told
        meanwhile); a new one past ``max_entries`` is skipped. Returns how many were skipped."""
        skipped = 0
        for row in rows:
            key = tuple(row[:3])
            if key not in self._entries and len(self._entries) >= self.max_entries:
                skipped += 1
                continue
            self._entries[key] = (row[3], row[4])
            self._set_owner(key, row[5] if len(row) == 6 else None)
            self._touch(key)
        return skipped

    def replace(self, rows):
        """A master's whole table ``(group, topic, partition, offset, commit_ms[, owner])``: ours becomes exactly
        ``rows``, owners included (an entry only we held goes: the master's table is the group's truth).
        ValueError past ``max_entries``."""
        if len(rows) > self.max_entries:
            raise ValueError("%d committed offsets exceed the limit of %d (MAX_CONSUMER_OFFSETS)"
                             % (len(rows), self.max_entries))
        self._entries = {tuple(r[:3]): (r[3], r[4]) for r in rows}
        self._owners, self._held = {}, {}
        for row in rows:
            if len(row) == 6 and row[5] is not None:
                self._own(tuple(row[:3]), row[5])
        self._changed = OrderedDict()
        for key in self._entries:
            self._touch(key)
        if not self._entries:
            self._version += 1  # an emptied table is a change to save too

    def clamp(self, end_of):
        """Bring every offset past its partition's end (``end_of(topic, partition)``, None: not held) back to
        it; returns how many moved. A promoted slave's table may hold positions in its old master's lost tail
        (the table is copied apart from the log), and the new master writes new messages there: a group
        resuming from such an offset would skip them (docs/replication.md "Modes and failover: what is lost")."""
        moved = 0
        for key, (offset, commit_ms) in list(self._entries.items()):
            end = end_of(key[1], key[2])
            if end is not None and offset > end:
                self._entries[key] = (end, commit_ms)
                self._touch(key)
                moved += 1
        return moved

    def query(self, group, topic, partition):
        """The committed offset, or None when the group never committed one for this partition."""
        entry = self._entries.get((group, topic, partition))
        return entry[0] if entry is not None else None

    def entries(self, owners=False):
        """``[(group, topic, partition, offset, commit_ms)]`` sorted; with ``owners``, each with its owner (None:
        none) as a sixth field."""
        own = self._owners.copy()
        return sorted(k + v + ((own.get(k),) if owners else ()) for k, v in self._entries.copy().items())

    def save(self):
        """BLOCKING (runs beside checkpoints in a pool thread): write the file if anything changed since the last
        save."""
        version = self._version
        if version == self._saved:
            return False
        snapshot = self._entries.copy()  # one C-level copy under the GIL: safe against the loop's writes
        owners = self._owners.copy()
        rows = [[g, t, p, o, ms] + ([owners[(g, t, p)]] if (g, t, p) in owners else [])
                for (g, t, p), (o, ms) in sorted(snapshot.items())]
        self._dirs.write_state(self._path, OFFSETS_MAGIC, {"offsets": rows})
        self._saved = version
        return True
