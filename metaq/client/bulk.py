"""A ``get`` reply decoded in one call (``Consumer.fetch_batch`` / ``iter_batches``): no Python object per message.

``MessageBatch`` keeps the reply's bytes and the index ``protocol.message.scan_reply`` (the C helper when built)
made of it in one pass: each record's id, flag and where its attribute block and payload lie, checksums checked
as ``fetch`` checks them. Messages are read from it as cheaply as asked for: ``ids()`` and ``offsets`` whole,
``payload(k)`` a zero-copy view, iteration ``(offset, id, payload)``, ``message(k)`` the ``Message`` ``fetch``
builds (attribute, properties). A record with an attribute block is decoded by ``Message.from_record`` whenever
its payload is asked for, so every accessor gives what ``fetch`` gives for it.
"""

from metaq.client.message import Message
from metaq.protocol.message import Record, raise_fault, scan_reply

__all__ = ["MessageBatch", "decode_batch"]

_EMPTY = memoryview(b"").cast("q")


class MessageBatch:
    """The messages of one reply of ``topic``'s ``partition``, at offsets ``first_offset .. next_offset - 1``.

    ``len(batch)`` messages; ``payload(k)`` and iteration hand out memoryviews of the reply's bytes (valid as long
    as they are held: copy with ``bytes(view)`` to keep one alone without the reply)."""

    __slots__ = ("topic", "partition", "first_offset", "count", "data", "_q")

    def __init__(self, topic, partition, first_offset, data=b"", index=b"", count=0):
        self.topic = topic
        self.partition = partition
        self.first_offset = first_offset
        self.count = count
        self.data = memoryview(data)
        self._q = memoryview(index).cast("q") if count else _EMPTY

    def __len__(self):
        return self.count

    def __repr__(self):
        return "MessageBatch(%s %s offsets %d..%d, %d messages)" % (
            self.topic, self.partition, self.first_offset, self.next_offset - 1, self.count)

    @property
    def next_offset(self):
        """The offset after the batch's last message: where the next fetch starts."""
        return self.first_offset + self.count

    @property
    def offsets(self):
        """The messages' offsets, a ``range``."""
        return range(self.first_offset, self.first_offset + self.count)

    def ids(self):
        """The messages' ids, a memoryview of int64 (no object per message until indexed)."""
        return self._q[0::6]

    def payload(self, k):
        """Message ``k``'s payload (body): a view of the reply without an attribute block, else ``message(k).body``."""
        q, j = self._q, 6 * k
        if q[j + 1] & 1:
            return self.message(k).body
        return self.data[q[j + 4]:q[j + 5]]

    def payloads(self):
        """Every payload, in offset order (``payload(k)`` for each)."""
        return [self.payload(k) for k in range(self.count)]

    def message(self, k):
        """Message ``k`` as ``fetch`` returns it (RemoteProtocolError for a malformed attribute block, as there)."""
        if not 0 <= k < self.count:
            raise IndexError("message %d of a batch of %d" % (k, self.count))
        q, j = self._q, 6 * k
        record = Record(q[j], q[j + 1], bytes(self.data[self._data_start(k):q[j + 5]]), 0)
        return Message.from_record(self.topic, self.partition, self.first_offset + k, record)

    def messages(self):
        """Every message as ``fetch`` returns them: a ``Message`` each (the per-message path, for convenience)."""
        return [self.message(k) for k in range(self.count)]

    def __iter__(self):
        """``(offset, id, payload)`` for each message, in offset order."""
        q, data, offset = self._q, self.data, self.first_offset
        for j in range(0, 6 * self.count, 6):
            if q[j + 1] & 1:
                yield offset, q[j], self.payload(j // 6)
            else:
                yield offset, q[j], data[q[j + 4]:q[j + 5]]
            offset += 1

    def _data_start(self, k):
        """Where record ``k``'s data begins: its header's start (the previous record's end, or 0) plus 20."""
        return (self._q[6 * k - 1] if k else 0) + 20


def decode_batch(topic, partition, offset, body):
    """The ``MessageBatch`` of a ``get`` reply's ``body`` whose first record is at ``offset``: one ``scan_reply``
    call; RemoteProtocolError where ``iter_records`` raises (a negative length, a checksum mismatch)."""
    index, count, _stop, fault = scan_reply(body)
    if fault is not None:
        raise_fault(fault)
    return MessageBatch(topic, partition, offset, body, index, count)
