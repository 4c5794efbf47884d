"""The timer store's index: ``<data_dir>/timers.db`` (SQLite, WAL), derived from the TIMER_TOPIC records.

The commit log is the source of truth (docs/messaging.md "Any delivery time"); this index is what the broker reads
to find the messages due next, and it keeps each pending message's data, so retention may delete the log
records once they are indexed. It holds:

* ``pending``: one row per scheduled message not yet delivered or cancelled (msg_id, due_ms indexed,
  topic, partition, flag, checksum, born_ms, data, owner: the user whose put scheduled it, or NULL);
* ``owners``: how many pending rows each owner has (``''``: no owner), kept by triggers on ``pending`` in the
  same transactions, so the ``timers`` quota (docs/security.md "Quotas") reads a user's count without counting
  rows; a file from before owners gets the column and its rows counted as no one's on open;
* ``outcomes``: the recent ends (msg_id → delivered | cancelled, at_ms), at most ``MAX_TIMER_OUTCOMES``
  rows (the oldest go first), so a cancel can say which happened;
* ``meta``: ``indexed_position`` (a log position: every TIMER_TOPIC record before it is applied; the timer index
  follows the log from there, ``timers/follow.py``), ``indexed_offset`` (the next TIMER_TOPIC offset to index) and
  ``scan_from`` (a log position: every delivery made before it has its DONE record in the log). A file from
  before positions has no ``indexed_position`` (None): its ``indexed_offset`` is mapped to one on open.

Each ``apply`` is one transaction, with its new ``indexed_position`` and ``indexed_offset``: after a crash the
index restarts exactly where its last commit left it. ``synchronous=FULL``: a commit is on disk when ``apply`` returns.
NORMAL (with WAL) could lose the last commits in a power cut, and the log records they came from may
already be deleted by retention (whose floor is ``indexed_position``); FULL costs one fsync per batch, in
the timer service's own thread, never on the event loop.

Blocking calls (file I/O, fsync): the server calls every method from one dedicated thread. Time is
passed in; no clock here.
"""

import os
import sqlite3

from metaq.errors import StoreError

from metaq.timers.limits import (MAX_TIMER_OUTCOMES, TIMER_INDEX_CACHE_BYTES, TIMER_INDEX_CHECKPOINT_PAGES,
                                 TIMER_INDEX_WAL_BYTES)
from metaq.timers.records import TimerCancel, TimerDone, TimerEntry

FILE_NAME = "timers.db"
DELIVERED, CANCELLED = "delivered", "cancelled"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    msg_id INTEGER PRIMARY KEY, due_ms INTEGER NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    flag INTEGER NOT NULL, checksum INTEGER NOT NULL, born_ms INTEGER NOT NULL, data BLOB NOT NULL, owner TEXT);
CREATE INDEX IF NOT EXISTS pending_due ON pending (due_ms, msg_id);
CREATE TABLE IF NOT EXISTS outcomes (msg_id INTEGER PRIMARY KEY, outcome TEXT NOT NULL, at_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS outcomes_at ON outcomes (at_ms);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
#: The per-owner counts (after ``pending`` has its ``owner`` column, old files included).
_OWNERS = """
CREATE TABLE IF NOT EXISTS owners (owner TEXT PRIMARY KEY, pending INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS pending_owner_in AFTER INSERT ON pending BEGIN
    INSERT INTO owners VALUES (COALESCE(NEW.owner, ''), 1)
        ON CONFLICT (owner) DO UPDATE SET pending = pending + 1;
END;
CREATE TRIGGER IF NOT EXISTS pending_owner_out AFTER DELETE ON pending BEGIN
    UPDATE owners SET pending = pending - 1 WHERE owner = COALESCE(OLD.owner, '');
END;
"""

_COLUMNS = "msg_id, due_ms, topic, partition, flag, checksum, born_ms"
#: Ids per ``IN (...)`` query (SQLite allows 32,766 parameters since 3.32; Debian 12 has 3.40).
_IN_CHUNK = 500


class TimerIndex:
    """The index file, opened; see the module docstring. Not thread-safe: one thread uses it."""

    def __init__(self, data_dir, max_outcomes=MAX_TIMER_OUTCOMES):
        self.path = os.path.join(data_dir, FILE_NAME)
        self.max_outcomes = max_outcomes
        self._db = None
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA cache_size=-%d" % (TIMER_INDEX_CACHE_BYTES // 1024))  # negative: KiB
            self._db.execute("PRAGMA wal_autocheckpoint=%d" % TIMER_INDEX_CHECKPOINT_PAGES)
            self._db.execute("PRAGMA journal_size_limit=%d" % TIMER_INDEX_WAL_BYTES)
            self._db.executescript(_SCHEMA)
            self._add_owners()
            self.held = self._held()
            self.indexed_offset = self._meta("indexed_offset")
            self.indexed_position = self._meta("indexed_position", None)
            self.scan_from = self._meta("scan_from")
        except sqlite3.Error as exc:  # a damaged file, a directory in its place: one line naming it, not a traceback
            self.close()
            raise StoreError("cannot open the timer index %s (or its -wal file): %s. It holds which timed messages "
                             "were delivered or cancelled: restore it from a copy (deleting it would deliver "
                             "them again)" % (self.path, exc)) from None

    def _add_owners(self):
        """Give a file from before owners its ``owner`` column and per-owner counts (its rows: no one's), once; the
        counts, their first values and their triggers in one transaction."""
        db = self._db
        if "owner" not in [row[1] for row in db.execute("PRAGMA table_info(pending)")]:
            db.execute("ALTER TABLE pending ADD COLUMN owner TEXT")
        if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'owners'").fetchone():
            db.executescript("BEGIN; %s INSERT INTO owners SELECT '', COUNT(*) FROM pending HAVING COUNT(*) > 0; "
                             "COMMIT;" % _OWNERS)

    def _held(self):
        """``{owner: pending rows}`` of the users holding any (no owner left out)."""
        rows = self._db.execute("SELECT owner, pending FROM owners WHERE owner != '' AND pending > 0")
        return dict(rows.fetchall())

    def settings(self):
        """SQLite's settings in effect: ``{pragma: value}`` for the cache, checkpoint and log-size bounds."""
        return {name: self._db.execute("PRAGMA %s" % name).fetchone()[0]
                for name in ("cache_size", "wal_autocheckpoint", "journal_size_limit")}

    def close(self):
        if self._db is not None:
            self._db.close()
            self._db = None

    def _meta(self, key, default=0):
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def apply(self, records, indexed_offset, now_ms, scan_from=None, position=None):
        """Apply ``records`` — ``(msg_id, TimerEntry | TimerCancel | TimerDone)`` in log order — and set
        ``indexed_offset``, ``indexed_position`` (when given) and ``scan_from`` (when given and further on: the end
        of the last DONE record among them, before which every delivery has its DONE), in one transaction. Returns
        ``(entries added, ids ended)``."""
        scan_from = scan_from if scan_from is not None and scan_from > self.scan_from else None
        added, ended = 0, []
        db = self._db
        db.execute("BEGIN")
        try:
            run = []  # consecutive entries: one executemany (the thread takes the GIL back once per row, not twice)
            for msg_id, rec in records:
                if isinstance(rec, TimerEntry):
                    run.append((msg_id, rec.due_ms, rec.topic, rec.partition, rec.flag, rec.checksum, rec.born_ms,
                                rec.data, rec.owner, msg_id))
                    continue
                if run:
                    added += self._insert(run)
                    run = []
                if isinstance(rec, TimerCancel):
                    if self._end(rec.msg_id, CANCELLED, now_ms):
                        ended.append(rec.msg_id)
                elif isinstance(rec, TimerDone):
                    ended.extend(self._delivered(rec.msg_ids, now_ms))
            if run:
                added += self._insert(run)
            db.execute("INSERT OR REPLACE INTO meta VALUES ('indexed_offset', ?)", (indexed_offset,))
            if position is not None:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('indexed_position', ?)", (position,))
            if scan_from is not None:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('scan_from', ?)", (scan_from,))
            self._prune()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.indexed_offset = indexed_offset
        if position is not None:
            self.indexed_position = position
        self.held = self._held()
        if scan_from is not None:
            self.scan_from = scan_from
        return added, ended

    def _insert(self, rows):
        """Pending rows for entries not ended before (a re-applied record) nor pending already; how many were new."""
        cur = self._db.executemany("INSERT OR IGNORE INTO pending (%s, data, owner) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? "
                                   "WHERE NOT EXISTS (SELECT 1 FROM outcomes WHERE msg_id = ?)" % _COLUMNS, rows)
        return cur.rowcount  # the rows inserted (sqlite3_changes: not the triggers' own changes)

    def _delivered(self, msg_ids, now_ms):
        """A DONE record's ids: each not ended before (the first end wins) moves from pending to the outcomes as
        delivered, as ``_end`` does one at a time, in a few statements; returns those."""
        db, before = self._db, set()
        for i in range(0, len(msg_ids), _IN_CHUNK):
            chunk = msg_ids[i:i + _IN_CHUNK]
            before.update(row[0] for row in db.execute("SELECT msg_id FROM outcomes WHERE msg_id IN (%s)"
                                                       % ",".join("?" * len(chunk)), chunk))
        new = [i for i in dict.fromkeys(msg_ids) if i not in before]
        db.executemany("DELETE FROM pending WHERE msg_id = ?", [(i,) for i in new])
        db.executemany("INSERT INTO outcomes VALUES (?, ?, ?)", [(i, DELIVERED, now_ms) for i in new])
        return new

    def _end(self, msg_id, outcome, now_ms):
        """A pending entry delivered or cancelled: moved to the outcomes. The first end wins (a CANCEL after a
        DONE changes nothing: the service never writes one, and a replayed log must not either)."""
        if self._db.execute("SELECT 1 FROM outcomes WHERE msg_id = ?", (msg_id,)).fetchone():
            return False
        cur = self._db.execute("DELETE FROM pending WHERE msg_id = ?", (msg_id,))
        if outcome == CANCELLED and cur.rowcount == 0:
            return False  # nothing pending to cancel
        self._db.execute("INSERT INTO outcomes VALUES (?, ?, ?)", (msg_id, outcome, now_ms))
        return True

    def _prune(self):
        (n,) = self._db.execute("SELECT COUNT(*) FROM outcomes").fetchone()
        if n > self.max_outcomes:
            self._db.execute("DELETE FROM outcomes WHERE msg_id IN (SELECT msg_id FROM outcomes "
                             "ORDER BY at_ms, msg_id LIMIT ?)", (n - self.max_outcomes,))

    def rewind(self, offset, position=None):
        """Index again from TIMER_TOPIC ``offset`` and log ``position`` (the log was cut there: a slave's handshake);
        each only moves back. What the cut records had done stays (see timers/follow.py ``cut``)."""
        db = self._db
        db.execute("BEGIN")
        try:
            if offset < self.indexed_offset:
                db.execute("INSERT OR REPLACE INTO meta VALUES ('indexed_offset', ?)", (offset,))
            if position is not None and (self.indexed_position is None or position < self.indexed_position):
                db.execute("INSERT OR REPLACE INTO meta VALUES ('indexed_position', ?)", (position,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.indexed_offset = min(offset, self.indexed_offset)
        if position is not None and (self.indexed_position is None or position < self.indexed_position):
            self.indexed_position = position

    def set_scan_from(self, position):
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('scan_from', ?)", (position,))
        self.scan_from = position

    def due(self, until_ms, limit):
        """Pending rows due at or before ``until_ms``, earliest first, at most ``limit``: tuples
        ``(msg_id, due_ms, topic, partition, flag, checksum, born_ms, data)``."""
        return self._db.execute("SELECT %s, data FROM pending WHERE due_ms <= ? ORDER BY due_ms, msg_id LIMIT ?"
                                % _COLUMNS, (until_ms, limit)).fetchall()

    def due_ids(self, until_ms, limit, after=None):
        """``(due_ms, msg_id)`` of the pending rows due at or before ``until_ms``, earliest first, at most ``limit``,
        past ``after`` (a ``(due_ms, msg_id)``: the last of the previous page)."""
        if after is None:
            return self._db.execute("SELECT due_ms, msg_id FROM pending WHERE due_ms <= ? ORDER BY due_ms, msg_id "
                                    "LIMIT ?", (until_ms, limit)).fetchall()
        return self._db.execute("SELECT due_ms, msg_id FROM pending WHERE due_ms <= ? AND (due_ms > ? OR "
                                "(due_ms = ? AND msg_id > ?)) ORDER BY due_ms, msg_id LIMIT ?",
                                (until_ms, after[0], after[0], after[1], limit)).fetchall()

    def window_rows(self, from_ms, until_ms, limit, max_bytes):
        """The delivery window's rows: as ``due``, due from ``from_ms`` (None: any time) to ``until_ms``, at most
        ``limit`` of them and ``max_bytes`` of their data (at least one row); ``(rows, cut_due)``: ``cut_due`` the due
        time of the first row a bound left out (None when none was)."""
        if from_ms is None:
            cur = self._db.execute("SELECT %s, data FROM pending WHERE due_ms <= ? ORDER BY due_ms, msg_id LIMIT ?"
                                   % _COLUMNS, (until_ms, limit + 1))
        else:
            cur = self._db.execute("SELECT %s, data FROM pending WHERE due_ms >= ? AND due_ms <= ? ORDER BY due_ms, "
                                   "msg_id LIMIT ?" % _COLUMNS, (from_ms, until_ms, limit + 1))
        rows, nbytes = [], 0
        for row in cur:
            nbytes += len(row[7])
            if len(rows) >= limit or (rows and nbytes > max_bytes):
                cur.close()
                return rows, row[1]
            rows.append(row)
        return rows, None

    def next_due(self):
        """The earliest pending due time, or None."""
        row = self._db.execute("SELECT MIN(due_ms) FROM pending").fetchone()
        return row[0]

    def get(self, msg_id):
        return self._db.execute("SELECT %s, data FROM pending WHERE msg_id = ?" % _COLUMNS, (msg_id,)).fetchone()

    def owner_of(self, msg_id):
        """``(True, owner)`` of a pending row (owner None: no one's), ``(False, None)`` when none is pending."""
        row = self._db.execute("SELECT owner FROM pending WHERE msg_id = ?", (msg_id,)).fetchone()
        return (True, row[0]) if row else (False, None)

    def outcome(self, msg_id):
        """``"delivered"``, ``"cancelled"`` or None (pending, unknown, or pruned)."""
        row = self._db.execute("SELECT outcome FROM outcomes WHERE msg_id = ?", (msg_id,)).fetchone()
        return row[0] if row else None

    def list(self, topic=None, limit=100, after=None):
        """Pending rows ``(msg_id, due_ms, topic, partition, size)`` by due time; ``after``: a ``(due_ms, msg_id)``
        to continue past; ``topic``: only that topic's."""
        sql = "SELECT msg_id, due_ms, topic, partition, LENGTH(data) FROM pending WHERE 1"
        args = []
        if topic is not None:
            sql += " AND topic = ?"
            args.append(topic)
        if after is not None:
            sql += " AND (due_ms > ? OR (due_ms = ? AND msg_id > ?))"
            args.extend((after[0], after[0], after[1]))
        sql += " ORDER BY due_ms, msg_id LIMIT ?"
        args.append(limit)
        return self._db.execute(sql, args).fetchall()

    def count(self):
        return self._db.execute("SELECT COUNT(*) FROM pending").fetchone()[0]
