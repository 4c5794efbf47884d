"""Finding where a broker's log and the one a consumer read diverge, after a failover (docs/replication.md).

Every ``get`` of a consumer's fetcher carries the record it read last and its id (``expect``, events.Get). A
broker whose record at that offset has another id answers 412 (``errors.Diverged``): an async master died
with messages the consumer had read but its slave had not copied, and the promoted slave wrote new messages at
those offsets; or a slave the consumer read while the master was away had its tail cut and rewritten. Reading
on from the consumer's offset would skip the new messages written there, so the fetcher goes back instead.

``Checkpoints`` keeps, per partition, ``(offset, msg_id)`` of records the fetcher read, at most
``limits.MAX_FETCH_CHECKPOINTS``: the newest densely, older ones ever sparser (per power of two, the first record
of the current and of the previous block of that size), so that a divergence ``d`` records back is found with
at most ``3d`` records read again, and the first record read (where the fetcher began) is kept. After a 412 the
fetcher probes them newest first (a get of one record
after each, ``expect`` that record: ``probe_verdict``) and reads on after the newest one the broker holds as it
was read. Logs only ever diverge as a common prefix and different tails (the epoch handshake cuts a slave to the
agreed position), so everything before a matching record matches too: nothing is skipped, and what is read again
is at most about three times the depth of the divergence. If none matches, the fetcher goes back to the first
message stored
``limits.DIVERGENCE_REWIND_MS`` before the oldest of them (``rewind_time_ms``), saying so in a WARNING line.
"""

import threading
from collections import OrderedDict

from metaq import errors
from metaq.client import limits as client_limits
from metaq.protocol.msgid import id_timestamp_ms

#: probe_verdict's answers.
MATCH, MISMATCH, UNKNOWN = "match", "mismatch", "unknown"


class Checkpoints:
    """``(offset, msg_id)`` of records read from one partition, kept at most ``limit`` of them (see the module
    docstring): per power of two 2**k, the first record read in the current block of 2**k offsets and the first
    read in the block before; and the last record read. A divergence ``d`` records back then has a kept record at
    most ``2d`` before it (the level with ``d < 2**k <= 2d``): at most ``3d`` records are read again. ``add`` is
    an append's cost on average (level k changes block once every 2**k records)."""

    LEVELS = 64  # offsets are 64-bit

    def __init__(self, limit=client_limits.MAX_FETCH_CHECKPOINTS):
        if limit < 2 * self.LEVELS + 1:
            raise ValueError("checkpoints need a limit of at least %d (2 per bit of an offset and the last), not %r"
                             % (2 * self.LEVELS + 1, limit))
        self.limit = limit
        self.clear()

    def __len__(self):
        return len(self.newest_first())

    def add(self, offset, msg_id):
        """Remember the record at ``offset`` (read after every one remembered; those at or after it are dropped)."""
        if self._last is not None and offset <= self._last[0]:
            self.cut(offset)
        point = (offset, msg_id)
        cur, prev = self._cur, self._prev
        for k in range(self.LEVELS):
            block = offset >> k
            held = cur[k]
            if held is not None and held[0] == block:
                break  # the same block here, so at every higher level too
            prev[k] = held
            cur[k] = (block, point)
        self._last = point

    def last(self):
        """The record read last, ``(offset, msg_id)``, or None."""
        return self._last

    def newest_first(self):
        points = {held[1] for held in self._cur + self._prev if held is not None}
        if self._last is not None:
            points.add(self._last)
        return sorted(points, reverse=True)

    def cut(self, offset):
        """Forget the records at and after ``offset`` (the fetcher reads on from there)."""
        for level in (self._cur, self._prev):
            for k, held in enumerate(level):
                if held is not None and held[1][0] >= offset:
                    level[k] = None
        for k in range(self.LEVELS):  # a level whose current block was cut keeps the one before as current
            if self._cur[k] is None and self._prev[k] is not None:
                self._cur[k], self._prev[k] = self._prev[k], None
        self._last = None
        kept = self.newest_first()
        self._last = kept[0] if kept else None

    def clear(self):
        self._cur = [None] * self.LEVELS
        self._prev = [None] * self.LEVELS
        self._last = None


class ReadsKept:
    """What the fetchers a rebalance stopped had read (``Checkpoints``), per ``(topic, Partition)``, for this
    consumer's next fetcher of that partition. A failover unregisters a broker's partitions and registers them
    again; a new fetcher would otherwise know only the committed record, and a divergence found then would send it
    back by time (``limits.DIVERGENCE_REWIND_MS``: minutes of messages read again) rather than to the last record
    both logs hold. At most ``limit`` partitions, the oldest dropped; taken once, and only by a fetcher starting
    where the stopped one was (the same offset, and the same last id when the commit holds one)."""

    def __init__(self, limit=client_limits.MAX_KEPT_FETCH_READS):
        if limit < 0:
            raise ValueError("a limit of kept reads must be 0 or more, not %r" % (limit,))
        self.limit = limit
        self._kept = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self):
        with self._lock:
            return len(self._kept)

    def keep(self, key, offset, msg_id, checkpoints):
        """A fetcher of ``key`` stopped at ``offset`` (``msg_id``: the id it commits with it, -1 for none) having
        read ``checkpoints`` (empty ones are not kept)."""
        with self._lock:
            self._kept.pop(key, None)
            if checkpoints.last() is None or self.limit == 0:
                return
            self._kept[key] = (offset, msg_id, checkpoints)
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)

    def take(self, key, offset, msg_id=-1):
        """The checkpoints kept for ``key`` when they end where a fetcher starts (``offset``, and ``msg_id`` the
        group committed with it, when both that and the kept one are above 0), else None; either way they are
        kept no more."""
        with self._lock:
            kept = self._kept.pop(key, None)
        if kept is None or kept[0] != offset or (msg_id > 0 and kept[1] > 0 and kept[1] != msg_id):
            return None
        return kept[2]


def probe_verdict(offset, reply_kind, moved_to=None):
    """What a probe's answer says of the checkpoint at ``offset`` (the probe read from ``offset + 1``).

    ``reply_kind``: ``"value"`` or ``"404"`` (the broker holds ``offset`` as read: MATCH), ``"412"`` (it holds
    another record there: MISMATCH), ``"301"`` with ``moved_to``: past the broker's end (it does not hold
    ``offset``: UNKNOWN, an older checkpoint is tried), or below its minimum (nothing older is held: MATCH, read
    from ``moved_to``)."""
    if reply_kind in ("value", "404"):
        return MATCH
    if reply_kind == "412":
        return MISMATCH
    if reply_kind == "301":
        return MATCH if moved_to > offset + 1 else UNKNOWN
    raise ValueError("unknown probe reply %r" % (reply_kind,))


def rewind_time_ms(msg_ids):
    """When none of the checkpoints matched: the store time to read again from (``offset_at``), the oldest id's
    time less ``limits.DIVERGENCE_REWIND_MS``."""
    if not msg_ids:
        raise errors.ClientError("no message id to rewind from")
    return max(0, min(id_timestamp_ms(m) for m in msg_ids) - client_limits.DIVERGENCE_REWIND_MS)
