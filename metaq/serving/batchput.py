"""``putb``: a batch of puts of one topic, checked whole, stored through the burst path, answered once.

The order is a put's: the one write decision first (``PutPath.check_write``: the user's permission, the broker's,
the topic's name, a topic-creation quota), asked once for the batch's topic; then every sub-record is checked
(``protocol.putbatch.scan_batch``: count, form, checksums, topic, partitions in range) and the partitions and
the disk room are made sure of (``MessageStore.hold_partition``, ``check_room``) before the first append, so a
refused batch stores nothing. The records are appended by ``PutPath.append_burst`` (the burst path's writer:
the same records a ``put`` stores); where it stops (a segment roll, the next index file) one message goes
through ``PutPath.append`` and the burst resumes. What follows is the put path's (``counted``, ``written``) and
the acknowledgement waits as a put's does, in the connection (``PutPath.settle``: the flush, a slave's ACK).
"""

from collections import Counter
from operator import itemgetter

from metaq import errors
from metaq.protocol.burst import scan_puts
from metaq.protocol.putbatch import encode_runs, scan_batch
from metaq.protocol.text import encode_result
from metaq.clock import now_ms
from metaq.serving.putpath import ACK_NOW
from metaq.store.record import FIXED_OVERHEAD

NO_WAIT = 0
_PARTITION, _LENGTH = itemgetter(1), itemgetter(5)  # a scanned frame's partition and body length


class BatchPuts:
    """The text dispatcher's ``putb`` handler."""

    def __init__(self, put_path, lim, error_reply):
        """``lim``: the broker's ``limits`` settings (a sub-record's body and line lengths); ``error_reply``: the
        dispatcher's error→reply mapping."""
        self.put_path = put_path
        self.max_body = lim.max_body_bytes
        self.max_line = lim.max_line_bytes
        self.error_reply = error_reply

    def putb(self, e, conn):
        """``(reply, flush position)`` of batch ``e``: ``result 200`` with its runs, or one error, nothing stored."""
        path = self.put_path
        store = path.store
        try:
            path.check_write(e.topic, conn.session)
            frames = scan_batch(scan_puts, e, self.max_body, self.max_line, store.partitions_of(e.topic))
            units = {(e.topic, p): n for p, n in Counter(map(_PARTITION, frames)).items()}  # C loops, not Python
            for _topic, partition in units:
                store.hold_partition(e.topic, partition)
            overhead = FIXED_OVERHEAD + len(frames[0][0])
            store.check_room(sum(map(_LENGTH, frames)) + len(frames) * overhead, units,
                             overhead + max(map(_LENGTH, frames)))
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return self.error_reply(exc, e.opaque), NO_WAIT
        now = now_ms()
        try:
            runs, log_end = self._store(e, frames, now)
        except errors.MetaqError as exc:  # the disk, met after the check: what was appended stays (as a burst's)
            return self.error_reply(exc, e.opaque), NO_WAIT
        reply = encode_result(200, encode_runs(runs), e.opaque)
        if path.written({(e.topic, run[1]) for run in runs}, now) == ACK_NOW:
            return reply, NO_WAIT
        return reply, log_end  # the connection acknowledges once ``PutPath.settle`` lets it

    def _store(self, e, frames, now):
        """Append every frame, in order: ``([(first_id, partition, first_offset, count)], log end)``."""
        path = self.put_path
        counted = path.counted
        body = e.body
        runs = []
        log_end = 0
        i, n = 0, len(frames)
        while i < n:
            taken, written = path.append_burst(frames[i:] if i else frames, body, now)
            for key, count, nbytes, first_id, first_offset, _first, end in written:
                counted(key[0], count, nbytes)
                _add(runs, first_id, key[1], first_offset, count)
                log_end = max(log_end, end)
            i += taken
            if i < n:  # the burst writer stopped (a segment roll, the next index file): one put, then on
                f = frames[i]
                r = path.append(e.topic, f[1], f[2], body[f[4]:f[4] + f[5]], now, checksum=f[6] & 0x7FFFFFFF)
                _add(runs, r.msg_id, r.partition, r.offset, 1)
                log_end = max(log_end, r.log_end)
                i += 1
        return runs, log_end


def _add(runs, msg_id, partition, offset, count):
    """Extend the last run when these messages continue it, else start one."""
    if runs:
        first_id, p, first_offset, n = runs[-1]
        if p == partition and first_id + n == msg_id and first_offset + n == offset:
            runs[-1] = (first_id, p, first_offset, n + count)
            return
    runs.append((msg_id, partition, offset, count))
