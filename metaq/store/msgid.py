"""Message ids: MetaQ's snowflake variant, strictly increasing within a broker.

``id = ((ts_ms - TWEPOCH) << 22) | (broker_id << 12) | seq`` with a 10-bit
broker id and a 12-bit sequence. Time comes in as ``now_ms``; if it goes
backwards the generator keeps its largest timestamp, and a sequence overflow
borrows the next millisecond, so ids never repeat and never decrease. The
store seeds the generator with the last id in the log at open.
"""

from metaq import limits
from metaq.errors import ConfigError

TWEPOCH = 1303895660503
SEQUENCE_BITS = 12
BROKER_BITS = 10
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
TIMESTAMP_SHIFT = SEQUENCE_BITS + BROKER_BITS


class IdGenerator:
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
        if (last_id >> SEQUENCE_BITS) & ((1 << BROKER_BITS) - 1) > self.broker_id:
            seq = SEQUENCE_MASK  # another broker id wrote it: move to the next millisecond
        if self._ts is None or (ts, seq) > (self._ts, self._seq):
            self._ts, self._seq = ts, seq

    @property
    def last_id(self):
        """The last id handed out (or seeded), None before the first."""
        if self._ts is None:
            return None
        return (self._ts << TIMESTAMP_SHIFT) | self._bits | self._seq

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
        return (self._ts << TIMESTAMP_SHIFT) | self._bits | self._seq

    def take(self, now_ms, count):
        """``(first_id, n)``: ``n`` (1..count) consecutive ids ``first_id…``, as ``n`` calls of ``next_id`` give them."""
        first = self.next_id(now_ms)
        n = min(count, SEQUENCE_MASK - self._seq + 1)
        self._seq += n - 1
        return first, n

    def give_back(self, n):
        """Return the last ``n`` ids of the latest ``take`` unused (fewer than it handed out)."""
        self._seq -= n


def id_timestamp_ms(msg_id):
    """The millisecond timestamp inside an id."""
    return (msg_id >> TIMESTAMP_SHIFT) + TWEPOCH
