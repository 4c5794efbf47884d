"""The commit log's positions: how far it is written, flushed and checkpointed (owned by ``MessageStore``).

One small object holds every position the writers and readers of the log
share, and the bookkeeping that moves them, so that no module reaches into
another's state:

* ``written``: the log end; the next record starts here (after a roll: at the next segment's start).
* ``flushed``: the log is durable up to here (``flush_log`` / ``mark_flushed``).
* ``checkpointed``: the position the last checkpoint recorded as durable for log and index.
* ``unflushed_msgs``: records appended past the flushed position (the async flush policy counts them): a
  flush covers what was written when it began (``flush_begins``), the records appended while its fdatasync
  runs stay counted for the next one.
* ``pending`` (``sync`` mode): ``(log end, partition, visible offset)`` per append, in log order:
  a partition's records become visible once the log is flushed past them.

Who moves them: a put, a burst run (``batch.py``) and a replicated record
(``replica.py``) call ``advance``; a replicated blank tail ``skip_to``; a
flush ``flushed_to``; a checkpoint ``checkpointed_at``; a truncation ``cut`` (counted: ``cut_below`` tells a
wait for a flush that the write it waits for was cut).
``MessageStore`` creates the object and hands it to those helper modules; the
server only reads ``MessageStore.written_position`` / ``flushed_position``.
No sockets, threads or clock.
"""

import collections

#: The truncations ``cut_below`` remembers: a wait that saw more cuts than this pass is told its write was cut.
RECENT_CUTS = 16


class LogPositions:
    """Written, flushed and checkpointed positions of one commit log, and the sync-mode visibility queue."""

    __slots__ = ("written", "flushed", "checkpointed", "unflushed_msgs", "pending", "async_visible", "appended",
                 "flush_mark", "flush_cut", "cuts", "_recent_cuts")

    def __init__(self, async_visible):
        self.written = 0
        self.flushed = 0
        self.checkpointed = 0
        self.unflushed_msgs = 0
        self.appended = 0  # records appended so far (counts, with ``flush_mark``, what a flush covered)
        self.flush_mark = None  # (written, appended) when the flush in progress began
        self.flush_cut = None  # the lowest cut while that flush ran: it makes nothing durable past it
        self.pending = collections.deque()
        #: ``async`` flush mode: a record is visible once written (else once flushed).
        self.async_visible = async_visible
        self.cuts = 0  # truncations so far: a wait for a position reads it first, then asks ``cut_below``
        self._recent_cuts = collections.deque(maxlen=RECENT_CUTS)

    def start_at(self, end):
        """After recovery: the log ends (and is durable and checkpointed) at ``end``."""
        self.written = self.flushed = self.checkpointed = end

    def advance(self, p, off, end, total, count=1):
        """Records ``off…`` (``count`` of them, ``total`` bytes) of partition ``p`` were appended, ending at ``end``.

        Moves the written end and ``p``'s maximum; the records are visible now
        (``async``) or once the log is flushed past ``end`` (``sync``). Returns ``end``.
        """
        self.written = end
        p.max = vis = off + count
        p.dirty = True
        if self.async_visible:
            p.visible = vis
        else:
            self.pending.append((end, p, vis))
        if p.log_bytes is not None:
            p.log_bytes += total
        self.unflushed_msgs += count
        self.appended += count
        return end

    def skip_to(self, end):
        """The written end moves to ``end`` with no record (a replicated roll: the next segment's start)."""
        self.written = end

    def flush_begins(self):
        """A flush begins: it covers at least what is written now (loop thread, before its fdatasync starts).
        Returns ``(written, flushed)``."""
        self.flush_mark = (self.written, self.appended)
        self.flush_cut = None
        return self.written, self.flushed

    def flushed_to(self, pos):
        """The log is durable up to ``pos``; returns the keys of the partitions whose visible maximum advanced.

        Records appended while that flush ran are still unflushed (counted for the next one); without a mark
        at or below ``pos`` the count stays as it is (too high at worst: the next flush comes sooner). A cut while
        it ran (``flush_cut``) bounds ``pos``: what it synced past the cut is gone, and the records written there
        since are not synced by it."""
        if self.flush_cut is not None:
            pos, self.flush_cut = min(pos, self.flush_cut), None
        if pos > self.flushed:
            self.flushed = pos
        mark, self.flush_mark = self.flush_mark, None
        if pos >= self.written:
            self.unflushed_msgs = 0
        elif mark is not None and mark[0] <= pos:
            self.unflushed_msgs = min(self.unflushed_msgs, self.appended - mark[1])
        changed = set()
        pending = self.pending
        while pending and pending[0][0] <= pos:
            _end, p, vis = pending.popleft()
            if vis > p.visible:
                p.visible = vis
                changed.add(p.key)
        return changed

    def checkpointed_at(self, pos):
        self.checkpointed = pos

    def cut(self, position):
        """The log was truncated back to ``position``: no position may stay past it."""
        self.written = position
        self.flushed = min(self.flushed, position)
        self.checkpointed = min(self.checkpointed, position)
        self.pending = collections.deque(e for e in self.pending if e[0] <= position)
        self.cuts += 1
        self._recent_cuts.append(position)
        if self.flush_mark is not None:  # a flush is in progress
            self.flush_cut = position if self.flush_cut is None else min(self.flush_cut, position)

    def cut_below(self, seen, pos):
        """Whether a truncation after the first ``seen`` (``cuts`` as read before a wait began) left the log ending
        before ``pos``: what was written up to ``pos`` is gone, whatever is written there later. True as well when
        more truncations came since than are remembered."""
        since = self.cuts - seen
        if since <= 0:
            return False
        if since > len(self._recent_cuts):
            return True
        return min(list(self._recent_cuts)[-since:]) < pos
