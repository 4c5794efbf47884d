"""The timer service's delivery window (``timers/service.py``; docs/messaging.md "Any delivery time"): the pending
messages due soonest, in memory, in due order. Pure: no gevent, no SQLite, no clock (times come in as arguments).

It holds every pending row not yet ended that is due before ``until`` (a load also takes the rows due at ``until``
itself), at most ``MAX_TIMER_WINDOW_ROWS`` rows and ``MAX_TIMER_WINDOW_BYTES`` of their messages' data (always at
least one row). When a bound, not ``TIMER_WINDOW_MS``, set ``until`` (``cut``), the service extends the window ahead
while it delivers (``extend``); a full window gives its latest rows back to the index for a new row due earlier.
"""

from bisect import insort

from metaq.timers.limits import MAX_TIMER_WINDOW_BYTES, MAX_TIMER_WINDOW_ROWS, TIMER_WINDOW_MS


def _size(item):
    return len(item[2][7])  # (due_ms, msg_id, row): the row's data


class DeliveryWindow:
    """``items``: ``[(due_ms, msg_id, row)]`` sorted (``row`` as ``TimerIndex.due`` gives it); ``until``: None until
    loaded; ``cut``: the window ends before ``TIMER_WINDOW_MS`` because of a bound."""

    def __init__(self, max_rows=MAX_TIMER_WINDOW_ROWS, max_bytes=MAX_TIMER_WINDOW_BYTES):
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.reset()

    def reset(self):
        self.items = []
        self.nbytes = 0  # the rows' data
        self.until = None
        self.cut = False

    def __len__(self):
        return len(self.items)

    def full(self, size):
        """No room for a row of ``size`` data bytes."""
        return len(self.items) >= self.max_rows or self.nbytes + size > self.max_bytes

    def room(self):
        """``(rows, bytes)`` the window may still take (at least 1 each: a load takes one row whatever its size)."""
        return max(self.max_rows - len(self.items), 1), max(self.max_bytes - self.nbytes, 1)

    def index_of(self, msg_id):
        for i, item in enumerate(self.items):
            if item[1] == msg_id:
                return i
        return None

    def remove_at(self, i):
        item = self.items.pop(i)
        self.nbytes -= _size(item)
        return item

    def add(self, entries, ended):
        """Newly indexed ``entries`` (``[(msg_id, TimerEntry)]``) due within the window join it, unless ``ended``
        holds their id; a full window gives back its latest rows for an earlier one, else the new one waits for
        the next extension (``until`` moves before it). True if any joined."""
        if self.until is None:
            return False
        items, joined = self.items, False
        for msg_id, e in entries:
            if e.due_ms >= self.until or msg_id in ended:
                continue
            size = len(e.data)
            while items and e.due_ms < items[-1][0] and self.full(size):
                self.until = self.remove_at(len(items) - 1)[0]
                self.cut = True
            if items and self.full(size):
                self.until = min(self.until, e.due_ms)
                self.cut = True
                continue
            insort(items, (e.due_ms, msg_id, (msg_id, e.due_ms, e.topic, e.partition, e.flag, e.checksum, e.born_ms,
                                              e.data)))
            self.nbytes += size
            joined = True
        return joined

    def load(self, rows, cut_due, until, now, ended):
        """The window becomes a load's ``rows`` (``TimerIndex.window_rows`` up to ``until``; ``cut_due``: the due
        time of the first row a bound left out, or None), less those ``ended``. Returns ``(all ended, the ids
        loaded)``: all ended, when rows were due but every one had ended (delivered, its DONE not indexed yet)."""
        if cut_due is not None:
            until = cut_due  # the rows due at that time go on past the bound: loaded next time
            rows = [r for r in rows if r[1] < until] or rows  # (all due at one time: these now, the rest later)
        self.items = sorted((r[1], r[0], r) for r in rows if r[0] not in ended)
        self.nbytes = sum(_size(item) for item in self.items)
        self.until = until
        self.cut = until < now + TIMER_WINDOW_MS
        return bool(rows) and not self.items, {r[0] for r in rows}

    def extend(self, start, rows, cut_due, until, now, ended):
        """An extension's ``rows``, due from ``start`` (``until`` when it began) to ``until`` (``cut_due``: as for
        ``load``), appended if the window still ends at ``start``; the ids taken, or None when dropped (the window
        was reloaded or gave rows back meanwhile)."""
        if self.until != start or not self.cut or not rows:
            return None
        kept, nbytes = [], self.nbytes  # rows may have joined meanwhile: the room again
        for r in rows:
            nbytes += len(r[7])
            if len(self.items) + len(kept) >= self.max_rows or nbytes > self.max_bytes:
                cut_due = r[1]
                break
            kept.append(r)
        rows = kept
        if cut_due is not None:
            until = cut_due
            rows = [r for r in rows if r[1] < until]
            if not rows:  # all due at one time: left to the next load
                return None
        held = set()  # rows due at the old end may be held already (a full window gave back its latest)
        for item in reversed(self.items):
            if item[0] < start:
                break
            held.add(item[1])
        new = [(r[1], r[0], r) for r in rows if r[0] not in ended and r[0] not in held]
        self.items.extend(new)
        self.nbytes += sum(_size(item) for item in new)
        self.until = until
        self.cut = until < now + TIMER_WINDOW_MS
        return {r[0] for r in rows}
