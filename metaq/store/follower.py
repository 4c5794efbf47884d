"""The log follower: every index derived from the commit log follows it through this one mechanism (as RocketMQ's
store feeds its CommitLogDispatchers from its ReputMessageService).

A **subscriber** (``Subscriber``) is derived state with a log ``position``: every record before it is learned, and
the position is saved with the subscriber's own checkpoint. It follows either the flushed end (``FLUSHED``: only
durable records, as the key index) or the written end (``WRITTEN``). The follower decides for all of them:

* **Open** (``add``): the subscriber loads its saved state and says the position it resumes from (at or below the
  saved one: a damaged part of its files is its own to drop). Nothing to trust (None: no state, a damaged one) →
  ``rebuild`` from the log start. A position past the log end (the log lost a tail its state had learned) →
  ``cut`` to the end. A position behind the end → the steps replay the log from there. A subscriber added to a
  running store does the same and catches up without moving the others.
* **Steps** (``step``): from the lowest position among the subscribers that have something left, the follower walks
  at most ``max_bytes`` of log (the records that start within them: one at least, however large); each subscriber
  is handed, a segment at a time, the part of that range past its own position (``learn``) and moved past what it
  learned and past blank segment tails (``advance``). A subscriber further on than the range waits for the lowest
  ones. A subscriber that is ``full`` (optional: it holds what it learned until its owner takes it, and has no room
  now) is passed over, so that it does not hold the others back; its owner wakes the steps once it made room. One
  that is ``passive`` (optional: it has nothing to learn now, as a master's transaction journal from its own
  records) is moved to its end at once and counts as neither moved nor left, so that a busy log does not keep the
  steps running for it.
  Records that retention deleted before a subscriber learned them are passed over (it starts at the log start). A
  walk stopped by bytes that are not a record where one should be stays there: the next step tries again.
* **Cuts** (``cut``: a slave's truncation): every subscriber past the cut is told once, and learns again from it.
* **Log start** (``log_starts``: retention): every subscriber lets go of what lies wholly below the new start.
* **Checkpoint** (``checkpoint``, BLOCKING): every subscriber saves its state with its position.
* **Retention floor** (``retention_floor``): a subscriber that keeps what it learned elsewhere only once its own
  commit is durable (the timer index: SQLite) names the lowest log position retention must keep for it
  (``retention_floor``, optional: None when it needs nothing kept); the follower's floor is the lowest of them.

Adding a derived index is one subscriber: ``add`` it. No sockets, threads or clock: the server drives ``step`` off
its event loop (the flusher's index loop, after each flush round).
"""

from typing import Optional, Protocol

from metaq.store.record import BLANK_MAGIC, MARKER

FLUSHED, WRITTEN = "flushed", "written"


class Subscriber(Protocol):
    """What the follower asks of a derived index."""

    #: FLUSHED or WRITTEN: which end of the log it follows.
    follows: str

    @property
    def position(self) -> int:
        """The log position before which every record is learned (a record boundary)."""

    def load(self, log_start: int, log_end: int) -> Optional[int]:
        """Open the saved state; the position it resumes from, None when nothing saved can be trusted."""

    def rebuild(self, position: int) -> None:
        """Forget everything learned; learn again from ``position``."""

    def learn(self, buf, base: int, rel: int, stop: int, end: int) -> int:
        """Learn the records of ``buf`` (one segment's map, at log position ``base``) from ``rel`` (a record's start)
        while ``rel < stop``, each wholly before ``end``; returns where it stopped (the next record's start, or the
        first bytes that are no record's). May raise (a full disk) once its ``position`` is at the last record it
        learned whole."""

    def advance(self, position: int) -> None:
        """Everything before ``position`` is learned (its records, or a blank tail passed over)."""

    def cut(self, position: int) -> None:
        """The log ends at ``position`` now: forget what was learned at or past it (its position at most that)."""

    def drop_below(self, log_start: int) -> list:
        """Retention moved the log start: let go of state wholly below it; returns the paths deleted."""

    def checkpoint(self, if_changed: bool = False) -> None:
        """BLOCKING: save the state and the position it covers (``if_changed``: only when either moved)."""

    def close(self) -> None:
        """Let go of its files (no save)."""


class LogFollower:
    """The subscribers of one store's commit log (``log_``: ``start``, ``segment_at``); see the module doc."""

    def __init__(self, log_):
        self._log = log_
        self._subs = []

    @property
    def subscribers(self):
        return tuple(self._subs)

    def add(self, sub, log_end):
        """Open ``sub`` against the log ending at ``log_end`` (load, rebuild or cut) and follow it from now on; the
        next steps bring it to the end."""
        start = self._log.start
        start = log_end if start is None else start
        position = sub.load(start, log_end)
        if position is None:
            sub.rebuild(start)
        elif position > log_end:
            sub.cut(log_end)
        self._subs.append(sub)

    def step(self, flushed, written, max_bytes=None, only=None):
        """Hand every subscriber the records past its position up to its end (``flushed`` or ``written``), at most
        ``max_bytes`` of log from the lowest position (None: all of it); True while a subscriber moved and one still
        has more to learn. ``only``: that subscriber alone, the others left where they are (a caller that needs it
        current at once)."""
        ends = {FLUSHED: flushed, WRITTEN: written}
        start = self._log.start
        todo = []
        for sub in self._subs if only is None else (only,):
            if getattr(sub, "passive", False):  # nothing to learn now: it keeps up with its end at once
                if sub.position < ends[sub.follows]:
                    sub.advance(ends[sub.follows])
                continue
            pos = sub.position if start is None else max(sub.position, start)
            if pos < ends[sub.follows] and not getattr(sub, "full", False):
                todo.append((pos, sub))
        if not todo:
            return False
        budget = None if max_bytes is None else min(pos for pos, _sub in todo) + max_bytes
        moved = left = False
        for pos, sub in todo:
            upto = ends[sub.follows]
            if budget is None or pos < budget:
                before = sub.position
                self._feed(sub, pos, upto, budget)
                moved = moved or sub.position > before
            left = left or sub.position < upto
        return moved and left

    def _feed(self, sub, pos, upto, budget):
        """``sub`` learns the records from ``pos`` up to ``upto``, those that start before ``budget``."""
        try:
            while pos < upto:
                seg = self._log.segment_at(pos)
                if seg is None:
                    break
                mm, base = seg.file.mm, seg.start
                end = min(seg.end, upto) - base
                stop = end if budget is None else min(end, budget - base)
                rel = sub.learn(mm, base, pos - base, stop, end)
                pos = base + rel
                if pos >= upto or (budget is not None and pos >= budget):
                    break
                if seg.size - rel < MARKER.size or MARKER.unpack_from(mm, rel)[1] == BLANK_MAGIC:
                    pos = seg.end  # the segment's blank tail: the next record starts the next segment
                    continue
                break  # not a record where one should be: the next step tries again from here
        finally:
            if pos > sub.position:
                sub.advance(pos)

    def remove(self, sub):
        """Stop following the log for ``sub`` (its owner stops); its files are its owner's to close."""
        if sub in self._subs:
            self._subs.remove(sub)

    def retention_floor(self):
        """The lowest log position a subscriber needs kept (``retention_floor``), or None when none does."""
        floors = [f for f in (getattr(sub, "retention_floor", lambda: None)() for sub in self._subs) if f is not None]
        return min(floors) if floors else None

    def cut(self, position):
        """The log was cut back to ``position``: every subscriber past it forgets what lies at or past it, once."""
        for sub in self._subs:
            if sub.position > position:
                sub.cut(position)

    def log_starts(self, log_start):
        """Retention moved the log start to ``log_start``; returns the paths the subscribers deleted."""
        gone = []
        for sub in self._subs:
            gone.extend(sub.drop_below(log_start))
        return gone

    def checkpoint(self, if_changed=False):
        """BLOCKING: every subscriber saves its state and position."""
        for sub in self._subs:
            sub.checkpoint(if_changed)

    def close(self):
        for sub in self._subs:
            sub.close()
        self._subs = []
