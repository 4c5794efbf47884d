"""What a master's timer service hands the timer index as it writes TIMER_TOPIC (docs/messaging.md "Any delivery
time").

Entries, cancels and DONE records this broker appends to the timer topic are kept here, decoded, with their
offset, message id and log end, so the timer index's subscriber of the log follower (``timers/follow.py``) takes
them as they are, not decoding them again from the log. Pure and bounded (``MAX_TIMER_FRESH`` records,
``MAX_TIMER_FRESH_BYTES`` of their data): past either bound the newest are not kept, and the subscriber decodes what
it does not find here from the log, as a slave's always does. The log stays the truth: what is taken from here is
what was appended at that offset, in the same greenlet, with no yield in between (``add``), and its message id is
the log record's (``get``); a cut of the log or a demotion clears it.
"""

from collections import deque

from metaq.timers.limits import MAX_TIMER_FRESH, MAX_TIMER_FRESH_BYTES
from metaq.store.record import record_size


def _data_len(rec):
    return len(getattr(rec, "data", b""))  # a TimerEntry's message; a cancel or a DONE: nothing to speak of


class Handoff:
    """``(offset, msg_id, record, log end)`` in log order, at most ``limit`` of them and ``max_bytes`` of their
    data."""

    def __init__(self, topic_len, limit=MAX_TIMER_FRESH, max_bytes=MAX_TIMER_FRESH_BYTES):
        self.topic_len = topic_len  # the timer topic's name in bytes (a record's size depends on it)
        self.limit = limit
        self.max_bytes = max_bytes
        self.nbytes = 0  # data bytes of the records kept
        self._items = deque()
        self.taken = 0  # records the indexer took from here

    def __len__(self):
        return len(self._items)

    def add(self, offset, msg_id, rec, log_end):
        size = _data_len(rec)
        if len(self._items) < self.limit and self.nbytes + size <= self.max_bytes:
            self._items.append((offset, msg_id, rec, log_end))
            self.nbytes += size

    def add_run(self, first_offset, first_id, recs, sizes, log_end):
        """A burst's run: ``recs`` at consecutive offsets and ids, their records' data ``sizes`` bytes each, laid
        end to end up to ``log_end``."""
        room = self.limit - len(self._items)
        if room <= 0:
            return
        ends, end = [], log_end
        for size in reversed(sizes):
            ends.append(end)
            end -= record_size(self.topic_len, size)
        ends.reverse()
        items = self._items
        for k in range(min(room, len(recs))):
            size = _data_len(recs[k])
            if self.nbytes + size > self.max_bytes:
                return
            items.append((first_offset + k, first_id + k, recs[k], ends[k]))
            self.nbytes += size

    def clear(self):
        self._items.clear()
        self.nbytes = 0

    def _pop(self):
        item = self._items.popleft()
        self.nbytes -= _data_len(item[2])
        return item

    def head(self, offset):
        """The first kept record if it is the one at ``offset`` (those before it are dropped: indexed), else None."""
        items = self._items
        while items and items[0][0] < offset:
            self._pop()
        return items[0] if items and items[0][0] == offset else None

    def get(self, offset, msg_id):
        """The record kept for ``offset`` if it is message ``msg_id`` (the log's: checked by the caller), else None;
        those before it are dropped (learned)."""
        item = self.head(offset)
        if item is None or item[1] != msg_id:
            return None
        self._pop()
        self.taken += 1
        return item[2]
