"""Appending a burst of plain puts in one call (``MessageStore.put_burst``, the broker's fast path).

The frames come from ``metaq.protocol.burst.scan_puts`` (bodies still in the
receive buffer, checksums verified). Consecutive frames of one partition form
a run; ``write_run`` writes a run's records and index units and formats its
``result 200`` replies with no Python work per message. Store bookkeeping
(``MessageStore._appended``) is done once per run.

Only the plain case is taken; the burst stops at the first frame that would
need anything else, and ``put_burst`` says how many frames it took, so the
caller hands the rest to the general path (``MessageStore.put``), which
answers them exactly as always:

* the (topic, partition) has not been put to through ``put`` yet (topic checks, first index file);
* its index tail is at ``fast_end`` (next index file, or time to prepare it);
* the record would not fit in the active segment (roll, disk check);
* the store is refusing writes (disk).

``metaq._speedups.write_run`` is ``write_run_py`` in C (the tests hold the two equal).
"""

import zlib

from metaq import speedups
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.record import CRC_FIELD, CRC_START, FIXED_OVERHEAD, MESSAGE_MAGIC, head_struct


def write_run_py(log, seg_start, rel, ready, src, frames, i, j, topic, partition, offset, now_ms, first_id, index,
                 unit_at):
    """Write ``frames[i:j]`` (one partition's) as records from ``log[rel:]`` while they end by ``ready``.

    ``log`` is the segment starting at log position ``seg_start``. Record *k*
    gets queue offset ``offset + k``, message id ``first_id + k``, store and
    born time ``now_ms``, its body from ``src``, and its index unit at
    ``index[unit_at + 16k:]``. Returns ``(count, rel_after, replies)``:
    ``replies`` is the ``result 200 <len> <opaque>\\r\\n<msgId> <partition> <offset>``
    of each written record, joined.
    """
    head = head_struct(len(topic))
    hsize = head.size
    replies = []
    count = 0
    with memoryview(src) as body, memoryview(log) as out:
        for _t, _p, flag, opaque, start, n, crc in frames[i:j]:
            end = rel + hsize + n
            if end > ready:
                break
            msg_id = first_id + count
            head.pack_into(out, rel, end - rel, MESSAGE_MAGIC, 0, partition, offset + count, now_ms, now_ms,
                           len(topic), topic, n, crc & 0x7FFFFFFF, msg_id, flag)
            out[rel + hsize:end] = body[start:start + n]
            CRC_FIELD.pack_into(out, rel + 8, zlib.crc32(out[rel + CRC_START:end]))
            UNIT.pack_into(index, unit_at + count * UNIT_SIZE, seg_start + rel, end - rel, 0)
            reply = b"%d %d %d" % (msg_id, partition, offset + count)
            replies.append(b"result 200 %d %d\r\n%s" % (len(reply), opaque, reply))
            rel = end
            count += 1
    return count, rel, b"".join(replies)


write_run = speedups.load("write_run", write_run_py)  # the C twin when built (same results, less CPU)


def append_burst(store, frames, src, now_ms):
    """Append the leading frames that take the plain path; returns ``(taken, runs)``.

    ``runs``: ``(partition_index, count, body_bytes, replies, log_end)`` per run
    written, in order; ``frames[taken:]`` are for the general path.
    """
    runs = []
    seg = store._log.active
    if seg is None or store._refusal is not None:
        return 0, runs
    writers = store._writers
    ids = store._ids
    view, seg_start, size = seg.view, seg.start, seg.size
    n = len(frames)
    i = 0
    while i < n:
        topic, partition = frames[i][0], frames[i][1]
        j = i + 1
        while j < n and frames[j][1] == partition and frames[j][0] is topic:
            j += 1
        p = writers.get((topic.decode("ascii"), partition))
        if p is None:
            break
        overhead = FIXED_OVERHEAD + len(topic)
        while i < j:
            off = p.max
            room = p.fast_end - off
            rel = store._written - seg_start
            first = rel + overhead + frames[i][5]
            if room <= 0 or first > size or rel < 0:
                return i, runs
            ready = seg.ready
            if first > ready:  # as CommitLog.make_room does for a put (and then it writes the record anyway)
                seg.advance_ready(rel)
                ready = max(seg.ready, first)
            t = p.tail
            first_id, k = ids.take(now_ms, min(j - i, room))
            count, rel_after, replies = write_run(view, seg_start, rel, ready, src, frames, i, i + k, topic,
                                                  partition, off, now_ms, first_id, t.mm, (off - t.start) * UNIT_SIZE)
            ids.give_back(k - count)
            nbytes = rel_after - rel
            end = seg_start + rel_after
            store._appended(p, off, end, nbytes, count)
            runs.append((p, count, nbytes - count * overhead, replies, end))
            i += count
    return i, runs
