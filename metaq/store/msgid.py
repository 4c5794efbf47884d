"""The message-id generator: ids in ``protocol/msgid.py``'s layout, strictly increasing within a broker.

Time comes in as ``now_ms``; if it goes backwards the generator keeps its largest timestamp, and a sequence
overflow borrows the next millisecond, so ids never repeat and never decrease. The store seeds the generator with
the last id in the log at open.
"""

from metaq import limits
from metaq.errors import ConfigError
from metaq.protocol.msgid import SEQUENCE_BITS, SEQUENCE_MASK, TIMESTAMP_SHIFT, TWEPOCH, compose, id_broker


class IdGenerator:
    """One broker's ids (``broker_id``), each larger than the last handed out or seeded (``last_id``)."""

    __slots__ = ("broker_id", "_bits", "_ts", "_seq")

    def __init__(self, broker_id, last_id=None):
        if not isinstance(broker_id, int) or not 0 <= broker_id <= limits.MAX_BROKER_ID:
            raise ConfigError("broker id must be 0..%d, got %r" % (limits.MAX_BROKER_ID, broker_id))
        self.broker_id = broker_id
        self._bits = broker_id << SEQUENCE_BITS
        self._ts = None
        self._seq = 0
        if last_id is not None:
            self.seed(last_id)

    def seed(self, last_id):
        """Make every later id larger than ``last_id``."""
        ts = last_id >> TIMESTAMP_SHIFT
        seq = last_id & SEQUENCE_MASK
        if id_broker(last_id) > self.broker_id:
            seq = SEQUENCE_MASK  # another broker id wrote it: move to the next millisecond
        if self._ts is None or (ts, seq) > (self._ts, self._seq):
            self._ts, self._seq = ts, seq

    @property
    def last_id(self):
        """The last id handed out (or seeded), None before the first."""
        if self._ts is None:
            return None
        return compose(self._ts, self.broker_id, self._seq)

    def next_id(self, now_ms):
        ts = now_ms - TWEPOCH
        if self._ts is None or ts > self._ts:
            self._ts = ts
            self._seq = 0
        else:
            self._seq += 1
            if self._seq > SEQUENCE_MASK:
                self._ts += 1
                self._seq = 0
        return (self._ts << TIMESTAMP_SHIFT) | self._bits | self._seq  # compose(), inlined: once per put

    def take(self, now_ms, count):
        """``(first_id, n)``: ``n`` (1..count) consecutive ids ``first_id…``, as ``n`` calls of ``next_id`` give
        them (``next_id``'s step, inlined: a burst writer takes once per run)."""
        ts = now_ms - TWEPOCH
        if self._ts is None or ts > self._ts:
            self._ts = ts
            seq = 0
        else:
            seq = self._seq + 1
            if seq > SEQUENCE_MASK:
                self._ts = ts = self._ts + 1
                seq = 0
            else:
                ts = self._ts
        n = SEQUENCE_MASK - seq + 1
        if count < n:
            n = count
        self._seq = seq + n - 1
        return (ts << TIMESTAMP_SHIFT) | self._bits | seq, n

    def give_back(self, n):
        """Return the last ``n`` ids of the latest ``take`` unused (fewer than it handed out)."""
        self._seq -= n
