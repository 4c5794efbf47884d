"""One file of the key index (RocketMQ's IndexFile, our layout), and the keys a record is indexed under.

Keys of a record (``record_keys``): the words of its RocketMQ ``KEYS`` property (space-separated, as RocketMQ
splits them) and its ``UNIQ_KEY``, found in the attribute after the ``\\x02`` (``protocol.rocketmq.mapping``);
the metaq client sends ``Message(key=...)`` as ``KEYS`` too. At most ``limits.MAX_KEYS_PER_MESSAGE`` keys of
at most ``limits.MAX_KEY_BYTES`` bytes are indexed; the others are stored with the message, not indexed.
A key is indexed per topic: its hash is CRC-32 of ``topic "#" key`` (RocketMQ's ``topic#key``).

File layout (little-endian: derived local data, never sent anywhere), fixed size, mapped::

    0     HEADER (64 bytes)   magic "MQKEYIX1", slots, capacity, count, first log position, min/max store time
    64    slots × 4           entry number + 1 of the newest entry whose hash falls in the slot (0: none)
    ...   capacity × 28       entries, in log order: key hash, log position, record size, store time,
                              previous entry of the same slot + 1 (0: none) — a chain newest first

A file is named by the log position of the first record it indexes (``files.offset_name``) and holds the
entries of the records from there to the next file's name, so retention drops a file once the next one
starts at or below the log start. The header's ``count`` is advisory: which entries are trusted after a
crash comes from the key index's checkpoint (index.py), and ``undo_to`` takes the newer ones back out
(newest first, restoring each slot to the entry's predecessor). No sockets, threads or clock.
"""

import struct
import sys
import zlib
from array import array

from metaq.keys import limits as keys_limits
from metaq.errors import ClientError, StoreError
from metaq.protocol.properties import NAME_VALUE_SEPARATOR, PROP_KEYS, PROP_UNIQ_KEY, PROPERTY_SEPARATOR
from metaq.store.mapped import MappedFile

HEADER = struct.Struct("<8sIIIqqq")
HEADER_SIZE = 64
MAGIC = b"MQKEYIX1"
SLOT = struct.Struct("<I")
#: key hash, log position, record size, store time (ms), previous entry + 1.
ENTRY = struct.Struct("<IqIqI")
ENTRY_SIZE = ENTRY.size
assert HEADER.size <= HEADER_SIZE and ENTRY_SIZE == 28
_COUNT_AT = 16  # the header's count field (after magic, slots, capacity)
_COUNT = struct.Struct("<I")
_TIMES_AT = 32  # min and max store time
_TIMES = struct.Struct("<qq")
NO_TIME = (1 << 63) - 1

_PROPS = PROPERTY_SEPARATOR.encode("ascii")
_NAME_VALUE = NAME_VALUE_SEPARATOR.encode("ascii")
_KEYS = PROP_KEYS.encode("ascii")
_UNIQ = PROP_UNIQ_KEY.encode("ascii")


def key_hash(topic_bytes, key):
    """The entry hash of ``key`` (bytes) in ``topic_bytes``."""
    return zlib.crc32(key, zlib.crc32(b"#", zlib.crc32(topic_bytes)))


def keys_of_properties(props):
    """The keys indexed for the encoded properties ``props`` (bytes after the attribute's first ``\\x02``)."""
    if _KEYS not in props and _UNIQ not in props:
        return []
    keys = []
    for item in props.split(_PROPS):
        name, sep, value = item.partition(_NAME_VALUE)
        if not sep:
            continue
        if name == _KEYS:
            keys.extend(value.split(b" "))
        elif name == _UNIQ:
            keys.append(value)
    out = []
    for k in keys:
        if k and len(k) <= keys_limits.MAX_KEY_BYTES and k not in out:
            out.append(k)
            if len(out) == keys_limits.MAX_KEYS_PER_MESSAGE:
                break
    return out


def data_keys(flag, data):
    """The keys indexed for a record's ``flag`` and ``data`` (attribute block + payload)."""
    if not flag & 1 or len(data) < 4:
        return []
    (n,) = struct.unpack_from(">i", data, 0)
    if n < 0 or n + 4 > len(data):
        return []
    attr = bytes(data[4:4 + n])
    i = attr.find(_PROPS)
    return [] if i < 0 else keys_of_properties(attr[i + 1:])


def check_key(key):
    """A lookup's key as bytes; raises ClientError (via limits' errors) when it cannot be an indexed key."""
    b = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not b or len(b) > keys_limits.MAX_KEY_BYTES or b" " in b or _PROPS in b or _NAME_VALUE in b:
        raise ClientError("a key must be 1..%d bytes without spaces or separators" % keys_limits.MAX_KEY_BYTES)
    return b


class KeyFile:
    """One mapped key index file; ``count`` entries are in use."""

    __slots__ = ("file", "first", "slots", "capacity", "count", "min_ts", "max_ts", "_entries_at")

    def __init__(self, mf, first, slots, capacity, count):
        self.file = mf
        self.first = first
        self.slots = slots
        self.capacity = capacity
        self.count = count
        self._entries_at = HEADER_SIZE + 4 * slots
        self.min_ts, self.max_ts = _TIMES.unpack_from(mf.mm, _TIMES_AT)

    @staticmethod
    def file_size(slots, capacity):
        return HEADER_SIZE + 4 * slots + ENTRY_SIZE * capacity

    @classmethod
    def create(cls, path, first, slots, capacity):
        # no directory fsync here (the event loop creates it): KeyIndex.checkpoint makes the name durable
        # before a checkpoint names the file, and a file a checkpoint names but a power cut lost is rebuilt
        mf = MappedFile.create(path, cls.file_size(slots, capacity), sync_dir=False)
        HEADER.pack_into(mf.mm, 0, MAGIC, slots, capacity, 0, first, NO_TIME, -NO_TIME)
        return cls(mf, first, slots, capacity, 0)

    @classmethod
    def open(cls, path, first):
        """Map an existing file; raises StoreError when its header does not describe it."""
        mf = MappedFile.open(path)
        try:
            if mf.size < HEADER_SIZE:
                raise StoreError("%s is too short" % path)
            magic, slots, capacity, count, got_first, _a, _b = HEADER.unpack_from(mf.mm, 0)
            if (magic != MAGIC or got_first != first or slots < 1 or count > capacity
                    or mf.size != cls.file_size(slots, capacity)):
                raise StoreError("%s has a header that does not describe it" % path)
        except BaseException:
            mf.close()
            raise
        return cls(mf, first, slots, capacity, count)

    @property
    def full(self):
        return self.count >= self.capacity

    def entry_at(self, e):
        return self._entries_at + e * ENTRY_SIZE

    def slot_at(self, h):
        return HEADER_SIZE + 4 * (h % self.slots)

    def append(self, h, position, size, ts):
        """Add one entry (the caller checked ``full``): entry first, then the slot, then the count."""
        mm, e = self.file.mm, self.count
        s = HEADER_SIZE + 4 * (h % self.slots)
        (prev,) = SLOT.unpack_from(mm, s)
        ENTRY.pack_into(mm, self._entries_at + e * ENTRY_SIZE, h, position, size, ts, prev)
        SLOT.pack_into(mm, s, e + 1)
        self.count = e + 1
        _COUNT.pack_into(mm, _COUNT_AT, e + 1)
        if ts < self.min_ts or ts > self.max_ts:
            self.min_ts, self.max_ts = min(self.min_ts, ts), max(self.max_ts, ts)
            _TIMES.pack_into(mm, _TIMES_AT, self.min_ts, self.max_ts)

    def entry(self, e):
        """``(hash, position, size, store time, previous entry + 1)`` of entry ``e``."""
        return ENTRY.unpack_from(self.file.mm, self._entries_at + e * ENTRY_SIZE)

    def head(self, h):
        """Entry number + 1 of the newest entry in ``h``'s slot (0: none)."""
        return SLOT.unpack_from(self.file.mm, HEADER_SIZE + 4 * (h % self.slots))[0]

    def first_at_or_after(self, position):
        """The first entry whose log position is ``>= position`` (``count`` if none): entries are in log order."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[1] < position:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def undo_to(self, n):
        """Take entries ``n..count`` back out, newest first; False when what they hold cannot have been written by
        ``append`` (a torn file: the caller rebuilds it from the log). Then every slot must point below ``n``."""
        mm = self.file.mm
        for e in range(self.count - 1, n - 1, -1):
            h, _pos, _size, _ts, prev = self.entry(e)
            if prev > e:
                return False
            s = HEADER_SIZE + 4 * (h % self.slots)
            if SLOT.unpack_from(mm, s)[0] == e + 1:
                SLOT.pack_into(mm, s, prev)
        start, end = self.entry_at(n), self.entry_at(self.count)
        if end > start:
            mm[start:end] = bytes(end - start)
        self.count = n
        _COUNT.pack_into(mm, _COUNT_AT, n)
        slots = array("I")
        slots.frombytes(mm[HEADER_SIZE:self._entries_at])
        if sys.byteorder != "little":
            slots.byteswap()
        return not slots or max(slots) <= n

    def flush(self):
        """BLOCKING: make the map durable."""
        self.file.sync_map()

    def delete(self):
        """Unlink the file; its map stays valid for a lookup still walking it (and goes with the last reference)."""
        self.file.delete()

    def close(self):
        self.file.close()
