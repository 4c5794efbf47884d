"""The key index: message keys → commit-log positions, with time bounds (docs/messaging.md "Key index"; files:
files.py).

Derived data, a subscriber of the store's log follower (``store/follower.py``): the follower hands it the flushed
records past ``indexed_to`` (the position up to which every record's keys are in the index) in steps of
``limits.KEY_INDEX_STEP_BYTES`` (``MessageStore.follow_log``, which the server's flusher calls after each flush
round until the followers are there), and the whole tail at open and at close; ``learn`` walks them in C and
indexes the records with attributes whose bytes hold a key property's mark (``with_key_marks``). So every writer
(a put, the C burst writer, put_idem, a transaction's commit, delayed delivery, a slave's apply of the master's
log) is indexed without knowing of it, and only durable records are.

Crash and rebuild: a checkpoint (``checkpoint``, BLOCKING) msyncs the files, then records ``indexed_to`` and
each file's entry count (``key_checkpoint``). ``load`` trusts the files up to those counts, takes newer entries
back out (``KeyFile.undo_to``), deletes files the checkpoint does not know, and resumes before a file that is torn
or missing (that file and the ones after it are rebuilt from the log); with no checkpoint, or nothing it can
keep, the follower calls ``rebuild`` and the whole index is rebuilt from the log start. Never past the log:
entries at or past the log end are taken out (``cut``: a log that lost its tail, a slave's truncation).

Retention (``drop_below``) deletes a file once the next one starts at or below the log start; an entry whose
record is gone is skipped by lookups. A lookup (``KeySearch``) walks newest first, one map read per ``step``, and
names each read in ``need`` so the server brings cold pages in off its event loop. No sockets, threads or clock.
"""

import logging
from bisect import bisect_right
from typing import NamedTuple, Optional

from metaq import speedups
from metaq.keys import limits as keys_limits
from metaq.errors import ClientError, StoreError
from metaq.protocol.properties import NAME_VALUE_SEPARATOR, PROP_KEYS, PROP_UNIQ_KEY, PROPERTY_SEPARATOR
from metaq.keys.files import KeyFile, check_key, data_keys, key_hash, keys_of_properties
from metaq.store.files import KEY_CHECKPOINT_MAGIC, fsync_dir, unlink_quietly
from metaq.store.follower import FLUSHED
from metaq.store.record import MARKER, MESSAGE_MAGIC, PREFIX, check_record, decode_record

log = logging.getLogger(__name__)


def keyed_records_py(buf, rel, stop, end):
    """Walk the records of ``buf`` from ``rel`` while ``rel < stop`` and a marker fits before ``end`` (a marker not a
    message's, or a size not positive or running past ``end``, stops it): ``(where the walk stopped, [rel of each
    record whose header flag has the attribute bit])``. A record too short to hold its flag has none. The C
    helper's ``keyed_records`` is its twin (one Python call per record here was a fifth of the loop's time under
    a pipelined load)."""
    if rel < 0 or end > len(buf):
        raise ValueError("need 0 <= rel and end <= %d" % len(buf))
    keyed = []
    while rel < stop and end - rel >= MARKER.size:
        total, magic = MARKER.unpack_from(buf, rel)
        if magic != MESSAGE_MAGIC or total <= 0 or total > end - rel:
            break
        if total >= PREFIX.size:
            tlen = int.from_bytes(buf[rel + 40:rel + 42], "big", signed=True)
            flag_at = PREFIX.size + tlen + 16
            if tlen >= 0 and flag_at + 4 <= total and buf[rel + flag_at + 3] & 1:
                keyed.append(rel)
        rel += total
    return rel, keyed


keyed_records = speedups.load("keyed_records", keyed_records_py)

#: What a record whose properties hold a key has in its attribute: every property name follows a ``\x02`` (the
#: attribute's first, or the one ending the property before it) and is followed by ``\x01``.
KEY_MARKS = tuple((PROPERTY_SEPARATOR + name + NAME_VALUE_SEPARATOR).encode("ascii")
                  for name in (PROP_KEYS, PROP_UNIQ_KEY))


def with_key_marks(buf, keyed, end):
    """The records of ``keyed`` (ascending starts of records walked up to ``end``) that may hold a key: those in
    which a ``KEY_MARKS`` mark begins. A record with a key always has one; one that has a mark in its payload only is
    read for keys as before and found to hold none. One ``find`` per mark found, over the whole walk, instead of a
    look at every record's properties: most records with attributes (every MQTT PUBLISH's) hold no key."""
    if not keyed:
        return keyed
    first = keyed[0]
    hits = set()
    for mark in KEY_MARKS:
        at = buf.find(mark, first, end)
        while at >= 0:
            j = bisect_right(keyed, at) - 1  # the record it begins in (or one before a record without attributes)
            hits.add(j)
            nxt = keyed[j + 1] if j + 1 < len(keyed) else end  # one hit per record is enough
            at = buf.find(mark, max(nxt, at + 1), end)
    return [keyed[j] for j in sorted(hits)]

class KeyPage(NamedTuple):
    """One page of a lookup: ``records`` (LogRecords, newest first), the ``cursor`` to pass for the next page
    (None: no more), and how far the index reached (``indexed_to``, log position; ``updated_ms``, store time)."""

    records: list
    cursor: Optional[str]
    indexed_to: int
    updated_ms: int


def parse_cursor(text):
    """``(file, entry)`` of a cursor (``""``/None: the start); raises ClientError on anything else."""
    if not text:
        return None
    if len(text) > keys_limits.MAX_KEY_CURSOR_BYTES:
        raise ClientError("cursor longer than %d bytes" % keys_limits.MAX_KEY_CURSOR_BYTES)
    a, sep, b = str(text).partition(":")
    if not sep or not a.isdigit() or not b.isdigit():
        raise ClientError("bad cursor %r" % (text[:keys_limits.MAX_KEY_CURSOR_BYTES],))
    return int(a), int(b)


class KeyIndex:
    """The key index of one store: its files (oldest first) and ``indexed_to``; a subscriber of the store's log
    follower (``store/follower.py``) that learns only flushed records."""

    follows = FLUSHED

    def __init__(self, dirs, slots, capacity):
        if capacity < keys_limits.MAX_KEYS_PER_MESSAGE or slots < 1:
            raise StoreError("a key index file needs at least %d entries and 1 slot" % keys_limits.MAX_KEYS_PER_MESSAGE)
        self._dirs = dirs
        self.slots, self.capacity = slots, capacity
        self.files = []
        self.indexed_to = 0
        self.mark = (0, ())  # (indexed_to, ((first, count), ...)): one assignment, read by a checkpoint's worker
        self._marks = self._saved = 0  # marks set / the count a checkpoint last saved (KeyIndex.checkpoint)
        self.rebuilt_from = None  # where load had to rebuild from the log (None: nothing)
        self._problem = None  # (why, warn) when load found nothing to keep: said by rebuild

    # -- open / checkpoint ---------------------------------------------------

    def load(self, log_start, log_end):
        """Open the files the checkpoint vouches for, up to its counts; see the module doc. Returns the position to
        index from (a torn or missing file's first position: it and the files after it are rebuilt), None when no
        file can be kept (no checkpoint, the first file torn): ``rebuild`` from the log start."""
        state = self._dirs.read_state(self._dirs.key_checkpoint, KEY_CHECKPOINT_MAGIC)
        try:
            counts = {int(f): int(c) for f, c in state["files"]} if state else {}
            position = int(state["position"]) if state else None
        except (KeyError, TypeError, ValueError):
            counts, position = {}, None
        problem = None if position is not None else "no key index checkpoint"
        bad_at = None  # the first file that is torn, unreadable or missing: rebuilt from the log from there
        for first, path in self._dirs.list_key_files():
            if problem is None and first in counts:
                f = self._open_trusted(path, first, counts[first])
                if f is not None:
                    self.files.append(f)
                    continue
                problem, bad_at = "%s is torn, unreadable or of another size" % path, first
            unlink_quietly(path)  # not vouched for by the checkpoint, or after a problem
        if problem is None:
            oldest = self.files[0].first if self.files else None
            missing = [c for c in sorted(counts) if (oldest is None or c > oldest)
                       and c not in {f.first for f in self.files}]
            if missing:  # files below the oldest one went with retention; one after it must not be missing
                problem, bad_at = "key index file %d is missing" % missing[0], missing[0]
                for f in [f for f in self.files if f.first > bad_at]:
                    self.files.remove(f)
                    f.close()
                    unlink_quietly(f.file.path)
        if problem is not None:
            if bad_at is None or not self.files:  # nothing to keep: the follower rebuilds it from the log start
                self._problem = (problem, bool(state) or bad_at is not None)
                return None
            self._rebuilt_from(bad_at, problem, True)
            position = bad_at
        self.indexed_to = max(position, log_start)
        self._set_mark()
        return self.indexed_to

    def rebuild(self, position):
        """Drop every file; index again from log position ``position`` (the follower: nothing to trust)."""
        problem, warn = self._problem or ("rebuilt on request", True)
        self._problem = None
        for f in self.files:
            f.delete()
        self.files = []
        self._rebuilt_from(position, problem, warn)
        self.indexed_to = position
        self._set_mark()

    def _rebuilt_from(self, position, problem, warn):
        self.rebuilt_from = position
        (log.warning if warn else log.info)("key index: %s; rebuilt from the log from position %d", problem, position)

    def _open_trusted(self, path, first, count):
        try:
            f = KeyFile.open(path, first)
        except (StoreError, OSError, ValueError) as exc:
            log.warning("key index: cannot open %s: %s", path, exc)
            return None
        if f.capacity == self.capacity and f.slots == self.slots and count <= f.count and f.undo_to(count):
            return f
        f.close()
        return None

    def checkpoint(self, if_changed=False):
        """BLOCKING: msync every file, then record ``mark`` as read first (the loop assigns it whole, after the
        entries it counts are written) as trusted. A cut meanwhile makes load rebuild the cut file, never trust it.
        ``if_changed``: nothing when no mark was set since the last one saved (no entry added, nothing cut)."""
        marks = self._marks  # before the mark: a mark set between the two is saved again next time
        if if_changed and marks == self._saved:
            return
        position, counts = self.mark
        for f in list(self.files):
            f.flush()
        fsync_dir(self._dirs.keys)  # the names of the files created since (KeyFile.create does not)
        self._dirs.write_state(self._dirs.key_checkpoint, KEY_CHECKPOINT_MAGIC,
                               {"position": position, "files": [list(c) for c in counts]})
        self._saved = marks

    def close(self):
        for f in self.files:
            f.close()
        self.files = []

    def _set_mark(self):
        self.mark = (self.indexed_to, tuple((f.first, f.count) for f in self.files))
        self._marks += 1

    # -- feeding -------------------------------------------------------------

    @property
    def position(self):
        """The follower's name for ``indexed_to``."""
        return self.indexed_to

    def learn(self, mm, base, rel, stop, end):
        """Index the records of one segment's map ``mm`` (at log position ``base``) from ``rel`` while ``rel < stop``,
        each ending by ``end``; returns where the walk stopped (``follower.Subscriber.learn``). The C walk goes in
        pieces of ``KEY_INDEX_WALK_BYTES`` at most, so the list of keyed records stays bounded."""
        while True:
            walk_stop = min(stop, rel + keys_limits.KEY_INDEX_WALK_BYTES)
            after, keyed = keyed_records(mm, rel, walk_stop, end)
            at = rel
            try:
                for at in with_key_marks(mm, keyed, after):  # only records with attributes can hold keys
                    self._index_record(mm, at, base + at, MARKER.unpack_from(mm, at)[0])
            except BaseException:  # a full disk (a new file): what is indexed stays so, the next step resumes
                self.advance(base + at)  # a record's entries go in all or none
                raise
            stopped_short = after < walk_stop  # a marker that is not a record's, or the end (no move at all)
            rel = after
            if stopped_short or rel >= stop:
                return rel

    def advance(self, position):
        """Every record before ``position`` is indexed."""
        self.indexed_to = max(self.indexed_to, position)
        self._set_mark()

    def _index_record(self, mm, rel, position, total):
        _t, _m, _c, _part, _qoff, sts, _bts, tlen = PREFIX.unpack_from(mm, rel)
        h = rel + 42 + tlen
        flag = int.from_bytes(mm[h + 16:h + 20], "big")
        if not flag & 1:
            return 0
        n = int.from_bytes(mm[h + 20:h + 24], "big", signed=True)
        a = h + 24
        if n < 1 or a + n > rel + total:
            return 0
        i = mm.find(b"\x02", a, a + n)
        if i < 0:
            return 0
        keys = keys_of_properties(mm[i + 1:a + n])
        if keys:
            tb = mm[rel + 42:h]
            self.append_entries([key_hash(tb, k) for k in keys], position, total, sts)
        return len(keys)

    def append_entries(self, hashes, position, size, ts):
        """Add one record's entries (``len(hashes)`` <= ``limits.MAX_KEYS_PER_MESSAGE``), all in one file: a new one
        named by ``position`` when the last one has no room for them all."""
        f = self.files[-1] if self.files else None
        if f is None or f.count + len(hashes) > f.capacity:
            f = self._new_file(position)
        for h in hashes:
            f.append(h, position, size, ts)

    def _new_file(self, first):
        f = KeyFile.create(self._dirs.key_file_path(first), first, self.slots, self.capacity)
        self.files.append(f)
        return f

    # -- cutting -------------------------------------------------------------

    def cut(self, position):
        """The log ends at ``position`` now: take every entry at or past it out."""
        while self.files and self.files[-1].first >= position:
            f = self.files.pop()
            f.delete()
        if self.files:
            f = self.files[-1]
            n = f.first_at_or_after(position)
            if n < f.count and not f.undo_to(n):
                f.undo_to(0)  # torn: refill it from its first record
                self.indexed_to = f.first
        self.indexed_to = min(self.indexed_to, position)
        self._set_mark()

    def drop_below(self, log_start):
        """Retention: delete the files wholly below ``log_start``; returns their paths."""
        gone = []
        while len(self.files) > 1 and self.files[1].first <= log_start:
            f = self.files.pop(0)
            f.delete()
            gone.append(f.file.path)
        if gone:
            self._set_mark()
        return gone

    # -- lookups -------------------------------------------------------------

    def search(self, log_, written, topic, key, since_ms, until_ms, max_count, cursor=None):
        """A ``KeySearch`` of ``key`` in ``topic`` stored within ``[since_ms, until_ms]``; raises ClientError."""
        return KeySearch(self, log_, written, topic, check_key(key), since_ms, until_ms, max_count,
                         parse_cursor(cursor))


class KeySearch:
    """One page of a lookup, one map read per ``step`` (a slot, an entry, or a record); ``need`` names it."""

    def __init__(self, index, log_, written, topic, key, since_ms, until_ms, max_count, cursor):
        self._log, self._written = log_, written
        self._tb = topic.encode("utf-8")
        self._key = key
        self._hash = key_hash(self._tb, key)
        self._since, self._until = since_ms, until_ms
        self._max = max(1, min(max_count, keys_limits.MAX_KEY_QUERY_RESULTS))
        files = [f for f in reversed(index.files) if f.count and f.max_ts >= since_ms and f.min_ts <= until_ms]
        self._next = None  # entry + 1 to read next in the current file; None: its slot first
        if cursor is not None:  # resume: the cursor's file at its entry (0: its slot), or the older ones
            files = [f for f in files if f.first <= cursor[0]]
            if files and files[0].first == cursor[0] and cursor[1]:
                self._next = cursor[1]
        self._files = files
        self._record = None  # (entry position, size) whose record the next step reads
        self.records = []
        self._bytes = 0
        self._scanned = 0
        self.cursor = None
        self.done = not files
        self.indexed_to = index.indexed_to
        self.updated_ms = max((f.max_ts for f in index.files if f.count), default=0)

    def page(self):
        return KeyPage(self.records, self.cursor, self.indexed_to, self.updated_ms)

    def need(self):
        """``(MappedFile, start, end)``: the bytes the next ``step`` reads; None when it reads no map."""
        if self.done:
            return None
        f = self._files[0]
        if self._record is not None:
            pos, size = self._record
            seg = self._log.segment_at(pos)
            return None if seg is None else (seg.file, pos - seg.start, min(pos - seg.start + size, seg.size))
        if self._next is None:
            at = f.slot_at(self._hash)
            return f.file, at, at + 4
        if self._next == 0:
            return None
        at = f.entry_at(self._next - 1)
        return f.file, at, at + 28

    def step(self):
        if self.done:
            return
        f = self._files[0]
        if self._record is not None:
            self._read_record()
            return
        if self._next is None:
            self._next = f.head(self._hash)
            if self._next > f.count:
                self._next = 0
            return
        if self._next == 0:  # this file's chain is walked: the next (older) file, from its slot
            self._files.pop(0)
            self._next = None
            self.done = not self._files
            return
        if self._scanned >= keys_limits.MAX_KEY_SCAN_ENTRIES:
            self._stop()
            return
        self._scanned += 1
        e = self._next - 1
        h, pos, size, ts, prev = f.entry(e) if e < f.count else (0, 0, 0, 0, 0)
        self._next = prev if prev <= e else 0  # never a loop, even in a torn file
        if h == self._hash and self._since <= ts <= self._until:
            self._record = (pos, size)

    def _read_record(self):
        pos, size = self._record
        self._record = None
        seg = self._log.segment_at(pos)
        if seg is None or pos + size > self._written:
            return  # gone with retention, or cut
        rel = pos - seg.start
        if check_record(seg.view, rel, rel + size) != size:
            return
        rec = decode_record(seg.view, rel, position=pos)
        if rec.topic.encode("utf-8") != self._tb or self._key not in data_keys(rec.flag, rec.data):
            return  # a hash collision
        self.records.append(rec)
        self._bytes += size
        if len(self.records) >= self._max or self._bytes >= keys_limits.MAX_KEY_QUERY_BYTES:
            self._stop()

    def _stop(self):
        """End the page here; the cursor resumes where the walk is."""
        self.done = True
        f = self._files[0]
        if self._next:
            self.cursor = "%d:%d" % (f.first, self._next)
        elif len(self._files) > 1:
            self.cursor = "%d:0" % self._files[1].first


def run(search):
    """Step ``search`` to its end (no cold-page care: tests, tools, the benchmark); returns its ``KeyPage``."""
    while not search.done:
        search.step()
    return search.page()
