"""The idempotent producers' windows: which ``(pid, seq)`` are stored, and where (pure: no file, no clock).

For each producer-partition ``(pid, topic, partition)`` the table keeps the
highest sequence seen and the offsets of the stored sequences among the last
``window`` ones (``limits.IDEMPOTENCE_WINDOW``). A put's decision (``decide``):

* an unknown producer-partition, or ``seq`` above the highest: store it;
* ``seq`` in the window and stored: a DUPLICATE, answered with the original's offset;
* ``seq`` in the window but not stored (a gap: the retry of a put that never
  arrived while later ones did): store it;
* ``seq`` at or below ``highest - window``: a DUPLICATE whose offset is no longer
  known (``OLDER``). The client never has more than ``window`` sequences of one
  partition unanswered (``metaq.client.producer``), so a sequence that was never
  stored is always within ``window`` of the highest: below that, every sequence
  was stored. This is what a retried Spark task needs: it resends its rows from
  sequence 0, and all those it stored before are answered, not stored again. A
  client that skips ahead by more than the window breaks this bargain (the
  sequences it skipped would be taken for stored ones).

**Why runs.** A producer that writes alone to its partition gets consecutive
offsets for consecutive sequences: its window is one run ``(first seq, first
offset, count)``, three integers in a flat ``array('q')``, however many
sequences it covers. Producers that interleave in one partition break runs;
the worst case is one run per sequence, 24 bytes each (``window`` of them).
Measured (tests/idempotence/test_window.py, tracemalloc): about 420 bytes per
producer-partition written by one producer alone, about 25 KiB for one whose
1024 sequences all interleave with another's.

**A function of the log.** Entries are created and updated only by
``record`` (called for every stored idempotent record, in log order: the
master's puts, a slave's replicated appends, a replay after a restart), and
every time it uses is the record's store time, never a clock. So a rebuild
from the log, a slave's table and the master's table are equal. ``record``
also bounds the table: past ``max_producers`` entries the least recently
written one is evicted (``evicted``), and entries whose last record is more
than ``ttl_ms`` older than the record being recorded expire (``expired``).

**Owners and quotas.** Each window belongs to the user whose put created it (its record's owner:
``idempotence.records``; None for records without one: authentication off, or an older broker's). A user
holds at most its quota of windows (``quota_of(owner)``: ``metaq.auth.quotas``, ``idempotent_producers``);
past it the user's *own* least recently written window is evicted, never another user's, so one user's new
producers cannot break another user's exactly-once sends. An evicted producer-partition is remembered
(``evicted_owner``, at most ``limits.MAX_EVICTED_PRODUCERS``), so that its next put is refused with the
reason instead of being stored as a new producer's. ``max_producers`` still bounds the whole table: a new
window that its owner's quota allows but the full table has no room for is refused at the put (``room``);
the table evicts past it (least recently written first) only when its log says so (a quota lowered since).
A window stays its creator's: another user's put under the same producer id and partition is refused
(``idempotence.state``), except a window without an owner, which the first user who writes to it takes.
The quotas must be the same on a master and its slaves (the same permissions file) for their tables to be
equal.

**Snapshots.** ``copy()`` takes the table's contents and the log position
they cover; ``encode`` turns them into bytes (binary, CRC-checked; ``load``
reads them back) for ``metaq.idempotence.state`` to write. The broker copies
on the loop thread right before a checkpoint (nothing changes the table
meanwhile); a copy from a worker thread while the loop thread records is safe
too: the writer brackets each change with ``begin`` / ``end`` (a sequence
counter, odd while a change is under way) and ``copy`` retries until it read a
table no change touched.
"""

import collections
import struct
import zlib
from array import array
from bisect import bisect_right

from metaq.idempotence import limits as idempotence_limits
from metaq.errors import ClientError

__all__ = ["SequenceTooOld", "ProducerTable", "SnapshotError", "OLDER", "snapshot_position"]

#: ``decide``'s answer for a sequence below the window: stored, its offset no longer known.
OLDER = -1


class SequenceTooOld(ClientError):
    """A sequence below the producer's window: the broker cannot tell whether it was stored (never retried)."""


class SnapshotError(ValueError):
    """A snapshot's bytes fail their checks."""


#: File header: magic, version, CRC-32 of the rest, log position covered, window, ttl_ms, max_producers,
#: evicted, expired, entries.
_HEAD = struct.Struct(">4sHIqIqIqqI")
#: Where the header says the log position covered: after magic, version and CRC.
_POSITION, _POSITION_AT = struct.Struct(">q"), 10
_MAGIC = b"MQPW"
#: Version 2 adds each entry's owner and the evicted producer-partitions; version 1 (no owners) is still read.
_VERSION = 2
_VERSIONS = (1, 2)
#: Entry: pid, partition, highest seq, last store time, topic length, runs.
_ENTRY = struct.Struct(">qiqqHI")
#: Version 2, after each entry's runs: the owner's length (0xFFFF: no owner), then its bytes.
_OWNER_LEN = struct.Struct(">H")
_NO_OWNER = 0xFFFF
#: Version 2, after the entries: the count of evicted producer-partitions, then each: pid, partition, topic length,
#: owner length, topic, owner.
_COUNT = struct.Struct(">I")
_EVICTED = struct.Struct(">qiHH")
_SNAPSHOT_TRIES = 8


class _Window:
    __slots__ = ("high", "runs", "last_ms", "owner")

    def __init__(self, owner=None):
        self.high = -1
        self.runs = array("q")  # (first seq, first offset, count) triples, ascending, disjoint
        self.last_ms = 0
        self.owner = owner  # the user whose put created it (None: no owner)

    def find(self, seq):
        """The offset ``seq`` was stored at, or None."""
        runs = self.runs
        if not runs:
            return None
        i = bisect_right(runs[0::3], seq) - 1
        if i < 0:
            return None
        first, offset, count = runs[3 * i:3 * i + 3]
        return offset + seq - first if seq < first + count else None

    def add(self, seq, offset, window):
        if seq > self.high:
            self.extend(seq, offset, 1, window)
            return
        runs = self.runs
        if seq <= self.high - window or self.find(seq) is not None:
            return  # out of the window, or already there (a replay): nothing to keep
        i = bisect_right(runs[0::3], seq)
        runs[3 * i:3 * i] = array("q", (seq, offset, 1))

    def extend(self, first_seq, first_offset, count, window):
        """``count`` sequences from ``first_seq`` (above ``high``) at offsets from ``first_offset``; the sequences
        that leave the window are dropped."""
        runs = self.runs
        if runs and first_seq == runs[-3] + runs[-1] and first_offset == runs[-2] + runs[-1]:
            runs[-1] += count
        else:
            runs.extend((first_seq, first_offset, count))
        self.high = high = first_seq + count - 1
        floor = high - window + 1
        while runs and runs[0] + runs[2] <= floor:
            del runs[0:3]
        if runs and runs[0] < floor:
            cut = floor - runs[0]
            runs[0] += cut
            runs[1] += cut
            runs[2] -= cut


class ProducerTable:
    """Every producer-partition's window (see the module docstring)."""

    def __init__(self, window=idempotence_limits.IDEMPOTENCE_WINDOW,
                 max_producers=idempotence_limits.MAX_IDEMPOTENT_PRODUCERS,
                 ttl_ms=idempotence_limits.IDEMPOTENT_PRODUCER_TTL_MS, quota_of=None,
                 max_evicted=idempotence_limits.MAX_EVICTED_PRODUCERS):
        """``quota_of(owner)``: the windows user ``owner`` may hold (None: no quota, only ``max_producers``)."""
        if window < 1 or max_producers < 1 or ttl_ms < 1:
            raise ValueError("window, max_producers and ttl_ms must be positive")
        self.window = window
        self.max_producers = max_producers
        self.ttl_ms = ttl_ms
        self.quota_of = quota_of or (lambda owner: max_producers)
        self.max_evicted = max_evicted
        self._entries = collections.OrderedDict()  # (pid, topic, partition) -> _Window, least recently written first
        self._owned = {}  # owner -> OrderedDict of its keys, least recently written first
        self._evicted = collections.OrderedDict()  # evicted (pid, topic, partition) -> its owner, oldest first
        self._grew = False  # a window was made (or taken by an owner) since the last bound
        self.generation = 0  # odd while a change is under way (see snapshot)
        self._depth = 0  # nested begin/end: the generation moves at the outermost pair only
        self._newest = None  # the most recently written window (already last: no move_to_end)
        self.evicted = 0
        self.expired = 0

    def __len__(self):
        return len(self._entries)

    def keys(self):
        """The producer-partitions kept, least recently written first."""
        return list(self._entries)

    def owned(self, owner):
        """The windows ``owner`` holds."""
        keys = self._owned.get(owner)
        return 0 if keys is None else len(keys)

    def owners(self):
        """``{owner: windows held}`` (stats)."""
        return {owner: len(keys) for owner, keys in self._owned.items()}

    def owner(self, pid, topic, partition):
        """``(True, owner)`` of the producer-partition's window, ``(False, None)`` when there is none."""
        w = self._entries.get((pid, topic, partition))
        return (False, None) if w is None else (True, w.owner)

    def evicted_owner(self, pid, topic, partition):
        """``(True, owner)`` when the producer-partition's window was evicted (past its owner's quota or the
        table's bound) and nothing recorded it since; ``(False, None)`` otherwise."""
        key = (pid, topic, partition)
        if key in self._evicted:
            return True, self._evicted[key]
        return False, None

    def refusal(self, pid, topic, partition, owner):
        """Why ``owner`` may not put under the producer-partition now, or None (the one rule; ``room`` for a new
        window): ``("other", its owner)``: the window is another user's; ``("evicted", its owner)``: its window
        was evicted; ``("quota", limit)``, ``("full", max_producers)``: see ``room``."""
        w = self._entries.get((pid, topic, partition))
        if w is not None:
            if w.owner is None or w.owner == owner:
                return None
            return "other", w.owner
        if self._evicted and (pid, topic, partition) in self._evicted:
            return "evicted", self._evicted[(pid, topic, partition)]
        return self.room(owner)

    def room(self, owner):
        """Why a new window of ``owner`` cannot be made now, or None: it may (its own least recently written one
        is evicted when it holds its quota). ``("quota", limit)``: its quota is 0; ``("full", max_producers)``:
        the table is full of other users' windows within their quotas."""
        quota = self.quota_of(owner)
        if quota < 1:
            return "quota", quota
        if self.owned(owner) >= quota:
            return None
        if len(self._entries) >= self.max_producers:
            return "full", self.max_producers
        return None

    def highest(self, pid, topic, partition):
        """The highest sequence recorded for the producer-partition, or None."""
        w = self._entries.get((pid, topic, partition))
        return None if w is None else w.high

    def decide(self, pid, topic, partition, seq):
        """None: store the put; an offset: a duplicate of the message there; ``OLDER``: a duplicate of a message
        stored before the window (its offset no longer known)."""
        w = self._entries.get((pid, topic, partition))
        if w is None or seq > w.high:
            return None
        if seq <= w.high - self.window:
            return OLDER
        return w.find(seq)

    def begin(self):
        """A change starts (records, and the log append they describe): a snapshot now waits for ``end``."""
        self._depth += 1
        if self._depth == 1:
            self.generation += 1

    def end(self):
        self._depth -= 1
        if self._depth == 0:
            self.generation += 1

    def _window(self, key, owner):
        """The window of ``key``, made for ``owner`` when there is none, moved to the most recently written end.
        A window without an owner is taken by the first owner that writes to it."""
        entries = self._entries
        w = entries.get(key)
        if w is None:
            w = entries[key] = _Window(owner)
            self._own(key, owner)
            self._grew = True
            if self._evicted:
                self._evicted.pop(key, None)
        elif w is not self._newest:
            entries.move_to_end(key)
            if w.owner is None and owner is not None:
                self._disown(key, None)
                w.owner = owner
                self._own(key, owner)
                self._grew = True
            else:
                self._owned[w.owner].move_to_end(key)
        elif w.owner is None and owner is not None:
            self._disown(key, None)
            w.owner = owner
            self._own(key, owner)
            self._grew = True
        self._newest = w
        return w

    def _own(self, key, owner):
        keys = self._owned.get(owner)
        if keys is None:
            keys = self._owned[owner] = collections.OrderedDict()
        keys[key] = None

    def _disown(self, key, owner):
        keys = self._owned[owner]
        del keys[key]
        if not keys:
            del self._owned[owner]

    def _drop(self, key, remember):
        """Drop the window of ``key`` (evicted, when ``remember``: its producer's next put is refused; expired)."""
        w = self._entries.pop(key)
        self._disown(key, w.owner)
        if w is self._newest:
            self._newest = None
        if remember:
            self.evicted += 1
            self._evicted[key] = w.owner
            self._evicted.move_to_end(key)
            while len(self._evicted) > self.max_evicted:
                self._evicted.popitem(last=False)
        else:
            self.expired += 1

    def record(self, pid, topic, partition, seq, offset, store_ms, owner=None):
        """A record of ``(pid, seq)`` by ``owner`` was stored at ``offset`` of ``topic``-``partition`` at
        ``store_ms``."""
        w = self._window((pid, topic, partition), owner)
        runs = w.runs
        if seq == w.high + 1 and runs and offset == runs[-2] + runs[-1]:
            runs[-1] += 1  # the common case: the next sequence at the next offset
            w.high = seq
            if runs[0] <= seq - self.window:  # the oldest sequence left the window (one at most)
                if runs[2] == 1:
                    del runs[0:3]
                else:
                    runs[0] += 1
                    runs[1] += 1
                    runs[2] -= 1
        else:
            w.add(seq, offset, self.window)
        self._touched(w, store_ms)

    def fresh(self, pid, topic, partition, seq):
        """True when ``seq`` is above every sequence recorded for the producer-partition (``decide`` stores it, and
        so every later one of a run that starts there)."""
        w = self._entries.get((pid, topic, partition))
        return w is None or seq > w.high

    def record_run(self, pid, topic, partition, first_seq, first_offset, count, store_ms, owner=None):
        """``count`` records of sequences ``first_seq…`` stored at offsets ``first_offset…``, all above the
        highest (``fresh``), by ``owner``: the table ends as ``count`` calls of ``record`` leave it, in one step."""
        key = (pid, topic, partition)
        w = self._entries.get(key)
        if count < 1 or (w is not None and first_seq <= w.high):
            raise ValueError("record_run takes 1+ sequences above the highest (%s), got %d from %d"
                             % (None if w is None else w.high, count, first_seq))
        w = self._window(key, owner)
        w.extend(first_seq, first_offset, count, self.window)
        self._touched(w, store_ms)

    def _touched(self, w, store_ms):
        """``w`` (the newest) was written at ``store_ms``: bound the table (its owner's least recently written
        windows past the owner's quota, then the table's past ``max_producers``, then expiry)."""
        entries = self._entries
        w.last_ms = store_ms
        if self._grew:  # only a new window can take its owner past its quota, or the table past its bound
            self._grew = False
            mine = self._owned[w.owner]
            quota = max(1, self.quota_of(w.owner))  # the window just written stays
            while len(mine) > quota:
                self._drop(next(iter(mine)), True)
            while len(entries) > self.max_producers:
                self._drop(next(iter(entries)), True)
        limit = store_ms - self.ttl_ms
        while entries:
            key = next(iter(entries))
            if entries[key].last_ms >= limit:
                break
            self._drop(key, False)

    def clear(self):
        self.begin()
        self._entries.clear()
        self._owned.clear()
        self._evicted.clear()
        self._newest = None
        self.evicted = self.expired = 0
        self.end()

    # -- snapshots -------------------------------------------------------------------------

    def copy(self, position_of):
        """``(items, position, counters, generation)``: the table as no change touched it (at ``generation``), or
        None after repeated interference
        (``encode`` makes the snapshot's bytes of it). ``position_of()`` is the log position the table covers at
        that moment (read in the same quiet interval). Safe from a worker thread while the loop thread records
        (see the module docstring); on the loop thread itself it succeeds at once.
        """
        for _ in range(_SNAPSHOT_TRIES):
            gen = self.generation
            if gen & 1:
                continue
            try:
                position = position_of()
                items = [(k, w.high, w.last_ms, array("q", w.runs), w.owner) for k, w in list(self._entries.items())]
                counters = (self.evicted, self.expired, list(self._evicted.items()))
            except RuntimeError:  # the dict changed under us
                continue
            if self.generation == gen:
                return items, position, counters, gen
        return None

    def snapshot(self, position_of):
        """``(bytes, position)`` of a ``copy``, or None."""
        copied = self.copy(position_of)
        if copied is None:
            return None
        return self.encode(*copied[:3]), copied[1]

    def encode(self, items, position, counters):
        parts = []
        for (pid, topic, partition), high, last_ms, runs, owner in items:
            tb = topic.encode("utf-8")
            parts.append(_ENTRY.pack(pid, partition, high, last_ms, len(tb), len(runs) // 3))
            parts.append(tb)
            parts.append(_big_endian(runs))
            parts.append(_owner_bytes(owner))
        evicted = counters[2]
        parts.append(_COUNT.pack(len(evicted)))
        for (pid, topic, partition), owner in evicted:
            tb = topic.encode("utf-8")
            ob = b"" if owner is None else owner.encode("utf-8")
            parts.append(_EVICTED.pack(pid, partition, len(tb), _NO_OWNER if owner is None else len(ob)))
            parts.append(tb)
            parts.append(ob)
        body = b"".join(parts)
        head_rest = struct.pack(">qIqIqqI", position, self.window, self.ttl_ms, self.max_producers,
                                counters[0], counters[1], len(items))
        crc = zlib.crc32(head_rest + body)
        return _MAGIC + struct.pack(">HI", _VERSION, crc) + head_rest + body

    def load(self, data):
        """Replace the table with a snapshot's; returns the log position it covers. SnapshotError when the bytes
        fail their checks (the table is then left empty)."""
        self.clear()
        try:
            position, entries, counters = _decode(data)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise SnapshotError(str(exc)) from None
        self.begin()
        self._newest = None
        for key, high, last_ms, runs, owner in entries:
            w = _Window(owner)
            w.high, w.last_ms, w.runs = high, last_ms, runs
            self._entries[key] = w
            self._own(key, owner)
        self.evicted, self.expired, evicted = counters
        self._evicted.update(evicted)
        self.end()
        return position

    def contents(self):
        """``[(key, highest, last store time, runs, owner)]`` in LRU order (a rebuild must give the same list)."""
        return [(k, w.high, w.last_ms, list(w.runs), w.owner) for k, w in self._entries.items()]

    def evicted_keys(self):
        """``[(key, owner)]`` of the evicted producer-partitions remembered, oldest first."""
        return list(self._evicted.items())

    def equal_to(self, other):
        """True when both tables hold the same entries in the same order, and remember the same evicted ones
        (tests: a rebuild equals the original)."""
        return self.contents() == other.contents() and self.evicted_keys() == other.evicted_keys()


_BIG = array("q", [1]).tobytes()[0] == 0


def _big_endian(runs):
    copy = array("q", runs)
    if not _BIG:
        copy.byteswap()
    return copy.tobytes()


def _owner_bytes(owner):
    if owner is None:
        return _OWNER_LEN.pack(_NO_OWNER)
    ob = owner.encode("utf-8")
    return _OWNER_LEN.pack(len(ob)) + ob


def _owner_at(data, at):
    """``(owner, next position)`` of the owner field at ``at``."""
    (olen,) = _OWNER_LEN.unpack_from(data, at)
    at += _OWNER_LEN.size
    if olen == _NO_OWNER:
        return None, at
    owner = bytes(data[at:at + olen]).decode("utf-8")
    if len(owner.encode("utf-8")) != olen:
        raise ValueError("snapshot truncated")
    return owner, at + olen


def snapshot_position(data):
    """The log position a snapshot's bytes say they cover (unchecked: read before deciding whether to keep the
    file), or None when they are too short to say."""
    if len(data) < _POSITION_AT + _POSITION.size:
        return None
    return _POSITION.unpack_from(data, _POSITION_AT)[0]


def _decode(data):
    if len(data) < _HEAD.size or data[:4] != _MAGIC:
        raise ValueError("not a producers snapshot (magic %r)" % bytes(data[:4]))
    magic, version, crc, position, _window, _ttl, _maxp, evicted, expired, count = _HEAD.unpack_from(data)
    if version not in _VERSIONS:
        raise ValueError("snapshot version %d, expected one of %s" % (version, _VERSIONS))
    if zlib.crc32(data[10:]) != crc:
        raise ValueError("snapshot fails its CRC check")
    at = _HEAD.size
    entries = []
    for _ in range(count):
        pid, partition, high, last_ms, tlen, nruns = _ENTRY.unpack_from(data, at)
        at += _ENTRY.size
        topic = bytes(data[at:at + tlen]).decode("utf-8")
        at += tlen
        runs = array("q")
        runs.frombytes(bytes(data[at:at + 24 * nruns]))
        if len(runs) != 3 * nruns:
            raise ValueError("snapshot truncated")
        if not _BIG:
            runs.byteswap()
        at += 24 * nruns
        owner = None
        if version >= 2:
            owner, at = _owner_at(data, at)
        entries.append(((pid, topic, partition), high, last_ms, runs, owner))
    gone = []
    if version >= 2:
        (n,) = _COUNT.unpack_from(data, at)
        at += _COUNT.size
        for _ in range(n):
            pid, partition, tlen, olen = _EVICTED.unpack_from(data, at)
            at += _EVICTED.size
            topic = bytes(data[at:at + tlen]).decode("utf-8")
            at += tlen
            owner = None
            if olen != _NO_OWNER:
                owner = bytes(data[at:at + olen]).decode("utf-8")
                at += olen
            gone.append(((pid, topic, partition), owner))
    if at != len(data):
        raise ValueError("snapshot has %d trailing bytes" % (len(data) - at))
    return position, entries, (evicted, expired, gone)
