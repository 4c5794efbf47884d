"""Appending a burst of plain puts in one call (``MessageStore.put_burst``, the broker's fast path).

The frames come from ``metaq.protocol.burst.scan_puts`` (bodies still in the
receive buffer, checksums verified). Consecutive frames of one partition form
a run; ``write_run`` writes a run's records and index units with no Python work
per message. The ids are taken (``IdGenerator.take``) and the positions advanced
(``LogPositions.advance``) once per run, in the same call as the write
(``append_run``), and each run is reported as a ``BurstRun`` (partition, first offset,
first message id, count: the ids and offsets of a run are consecutive); the
store never formats a reply, the front-end answers from those.

Only the plain case is taken; the burst stops at the first frame that would
need anything else, and ``put_burst`` says how many frames it took, so the
caller hands the rest to the general path (``MessageStore.put``), which
answers them exactly as always:

* the (topic, partition) has not been put to through ``put`` yet (topic checks, first index file);
* its index tail is at ``fast_end`` (next index file, or time to prepare it);
* the record would not fit in the active segment (roll, disk check);
* the store is refusing writes (disk: ``BurstWriter.refusal``, which the store sets).

``metaq.native._bytes.write_run`` is ``write_run_py`` in C (the tests hold the pair equal); ``append_run``, the run's
bookkeeping around it, is Python only (compiled with the module where built: ``metaq.native``).
"""

import zlib

from metaq import speedups
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.record import CRC_FIELD, CRC_START, FIXED_OVERHEAD, MESSAGE_MAGIC, head_struct
from metaq.store.results import BurstRun

_new_tuple = tuple.__new__


def write_run_py(log, seg_start, rel, ready, src, frames, i, j, topic, partition, offset, now_ms, first_id, index,
                 unit_at):
    """Write ``frames[i:j]`` (one partition's) as records from ``log[rel:]`` while they end by ``ready``.

    ``log`` is the segment starting at log position ``seg_start``. Record *k*
    gets queue offset ``offset + k``, message id ``first_id + k``, store and
    born time ``now_ms``, its body from ``src``, and its index unit at
    ``index[unit_at + 16k:]`` (with the frame's tag hash when it has one: an
    idempotent put's, ``idempotence.burst``; else 0). A frame's ninth field, when it has one and it is a buffer (an
    idempotent put's ninth is its producer id), holds the body's last bytes (the first ones from ``src``): a body in
    two places is written as it is, not joined first. Returns ``(count, rel_after)``: how many records were written
    (frames ``i … i + count - 1``) and where they end.
    """
    head = head_struct(len(topic))
    hsize = head.size
    count = 0
    with memoryview(src) as body, memoryview(log) as out:
        for frame in frames[i:j]:
            flag, start, n, crc = frame[2], frame[4], frame[5], frame[6]
            end = rel + hsize + n
            if end > ready:
                break
            head.pack_into(out, rel, end - rel, MESSAGE_MAGIC, 0, partition, offset + count, now_ms, now_ms,
                           len(topic), topic, n, crc & 0x7FFFFFFF, first_id + count, flag)
            tail = frame[8] if len(frame) > 8 and isinstance(frame[8], (bytes, bytearray, memoryview)) else None
            head_n = n - (0 if tail is None else len(tail))
            if head_n < 0 or start + head_n > len(body):
                raise ValueError("body or index unit out of range")
            out[rel + hsize:rel + hsize + head_n] = body[start:start + head_n]
            if tail is not None:
                out[rel + hsize + head_n:end] = tail
            CRC_FIELD.pack_into(out, rel + 8, zlib.crc32(out[rel + CRC_START:end]))
            UNIT.pack_into(index, unit_at + count * UNIT_SIZE, seg_start + rel, end - rel,
                           frame[7] if len(frame) > 7 else 0)
            rel = end
            count += 1
    return count, rel


write_run = speedups.load("write_run", write_run_py)  # the C twin when built (same results, less CPU)


def append_run(runs, run_type, log, seg_start, rel, ready, src, frames, i, j, room, topic, partition, p, off, now_ms,
               ids, positions, index, unit_at, overhead):
    """One run of partition ``p`` appended: ``write_run`` of ``frames[i:]`` from ``log[rel:]`` with at most
    ``min(j - i, room)`` ids taken from ``ids`` (an IdGenerator; those unused given back), ``positions``
    (LogPositions) advanced past it, and its ``run_type`` (BurstRun) appended to ``runs``; ``overhead``: a record's
    bytes besides its body. Returns how many records were written."""
    first_id, k = ids.take(now_ms, min(j - i, room))
    count, rel_after = write_run(log, seg_start, rel, ready, src, frames, i, i + k, topic, partition, off, now_ms,
                                 first_id, index, unit_at)
    if count < k:
        ids.give_back(k - count)
    nbytes = rel_after - rel
    end = positions.advance(p, off, seg_start + rel_after, nbytes, count)
    runs.append(_new_tuple(run_type, (p.key, count, nbytes - count * overhead, first_id, off, i, end)))
    return count


class BurstWriter:
    """A store's burst writer: ``append`` is what ``MessageStore.put_burst`` does. ``log``: its CommitLog;
    ``writer((topic, partition))``: the PartitionIndex of a partition already put to, else None
    (``Partitions.writer``); ``ids``: its IdGenerator (set once the log is recovered); ``positions``: its
    LogPositions; ``refusal``: why the store refuses writes now (its disk check sets it at each measurement, the one
    place it is kept), None while it takes them."""

    __slots__ = ("log", "writer", "ids", "positions", "refusal")

    def __init__(self, log, writer, positions):
        self.log = log
        self.writer = writer
        self.ids = None
        self.positions = positions
        self.refusal = None

    def append(self, frames, src, now_ms):
        """Append the leading frames that take the plain path to the active segment; ``(taken, runs)``: a
        ``BurstRun`` per run written, in order; ``frames[taken:]`` are for the general path. Nothing is taken while
        the store refuses writes or has no active segment."""
        seg = self.log.active
        if seg is None or self.refusal is not None:
            return 0, []
        writer, ids, positions = self.writer, self.ids, self.positions
        runs = []
        view, seg_start, size = seg.view, seg.start, seg.size
        n = len(frames)
        i = 0
        while i < n:
            topic, partition = frames[i][0], frames[i][1]
            j = i + 1
            while j < n and frames[j][1] == partition and frames[j][0] is topic:
                j += 1
            p = writer((topic.decode("ascii"), partition))
            if p is None:
                break
            overhead = FIXED_OVERHEAD + len(topic)
            while i < j:
                off = p.max
                room = p.fast_end - off
                rel = positions.written - seg_start
                first = rel + overhead + frames[i][5]
                if room <= 0 or first > size or rel < 0:
                    return i, runs
                ready = seg.ready
                if first > ready:  # as CommitLog.make_room does for a put (and then it writes the record anyway)
                    seg.advance_ready(rel)
                    ready = max(seg.ready, first)
                t = p.tail
                i += append_run(runs, BurstRun, view, seg_start, rel, ready, src, frames, i, j, room, topic,
                                partition, p, off, now_ms, ids, positions, t.mm, (off - t.start) * UNIT_SIZE, overhead)
        return i, runs
