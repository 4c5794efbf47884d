"""The put_idem burst path: pipelined ``put_idem`` frames stored and answered without the parser's events.

An idempotent producer's pipeline fills the receive buffer with ``put_idem``
frames. They are scanned in one pass (``idempotence.burst.scan_idem_burst``, in
C when built: whole, in range, checksum right, the identity already added to
each frame's data), then taken run by run: frames of one producer-partition
with consecutive sequences, the first above the producer-partition's highest,
are appended with the plain burst writer and recorded in the producer's window
in one step (``MessageStore.put_idempotent_run``) and answered with one blob of
``result 200`` replies per run (``encode_put_acks``), as plain puts are
(``fastput.py``). A frame that is not the start of such a run (a resend, a gap),
or one the run writer does not take (a partition's first put, a segment roll,
the next index file), is decided and stored alone
(``MessageStore.put_idempotent_prepared``) and answered as the general path
would: ``msgId partition offset``, with `` dup`` for a duplicate, naming the
original. In ``sync`` mode every reply waits for the flush of its record (or
of the original's: ``durable`` / ``wait_pos``, as the connection does for any put).

A MetaqError of the store (a sequence too old, a bad partition, a full
disk...) is answered as the general path answers it (``PutPath.failed`` counts
it and turns a full disk into the broker's refusal, ``dispatch.error_reply``
makes the reply) and ends the burst. Anything else stops the burst at that
frame, which the general path then answers as always: a frame the scan does
not take, a topic ``PutPath.write_refusal`` refuses (asked once per topic of a
burst). Nothing is taken while puts are refused. What follows the appends is the put path's (``PutPath.counted``,
``written``); the acks wait as the general path's do (the connection's ``PutPath.settle``).
"""

from metaq import errors
from metaq.protocol.burst import encode_put_acks
from metaq.idempotence.burst import run_end as _run_end, scan_idem_burst
from metaq.idempotence.wire import DUPLICATE_MARK
from metaq.protocol.text import encode_result
from metaq.clock import now_ms
from metaq.serving.putpath import ACK_NOW
from metaq.protocol.text import error_reply
from metaq.serving.takers import DONE, MORE, before_refused_topic, writable_topics

_DUP_TAIL = b" " + DUPLICATE_MARK


class _Burst:
    """The answers of one burst, in order: replies, what each waits for, the partitions it wrote."""

    __slots__ = ("fast", "out", "waits", "touched")

    def __init__(self, fast, out):
        self.fast, self.out = fast, out
        self.waits = []  # (index in out, opaques, log end)
        self.touched = set()

    def answered(self, reply, opaques, log_end):
        """``reply`` (for ``opaques``), sent once the log up to ``log_end`` may be acknowledged (0: at once)."""
        out = self.out
        out.append(reply)
        if log_end:
            self.waits.append((len(out) - 1, opaques, log_end))

    def stored(self, key, count, nbytes):
        self.fast.put_path.counted(key[0], count, nbytes)
        self.touched.add(key)

    def written(self, path, now, durable, wait_pos):
        """The put path's after-write step for the burst (``PutPath.written``); the new flush wait position."""
        if path.written(self.touched, now) != ACK_NOW:
            for i, opaques, log_end in self.waits:
                durable.append((i, opaques))
                if log_end > wait_pos:
                    wait_pos = log_end
        return wait_pos


def take_put_idem(fast, parser, buf, pos, end, cap, out, durable, wait_pos, session):
    """Store and answer the put_idem frames at ``buf[pos:end]`` (in ``parser``'s burst window; ``cap`` of them at
    most): ``(the new flush wait position, the position after the frames taken, MORE / DONE)``.
    ``fast``: the broker's ``FastPuts`` (store, put path, stats, limits); ``session``: the connection's."""
    path = fast.put_path
    if path.refusal is not None:
        return wait_pos, pos, DONE
    owner = session.user if session is not None else None
    frames, data, stop = scan_idem_burst(buf, pos, end, fast.max_body, fast.max_line, cap,
                                         None if owner is None else owner.encode("utf-8"))
    fast.stats.burst_scanned_bytes += stop - pos
    scanned = len(frames)
    frames = before_refused_topic(frames, writable_topics(path, session))
    if not frames:
        return wait_pos, pos, DONE
    now = now_ms()
    burst = _Burst(fast, out)
    n = len(frames)
    i = stored = 0
    status = MORE if n == scanned == cap else DONE
    while i < n:
        j = _run_end(frames, i, n)
        run_frames = frames[i:j] if i or j < n else frames
        taken, runs = path.append_idempotent_run(run_frames, data, now, owner)
        if taken:
            for run in runs:
                first = run.first_frame
                topic, partition = run.key
                burst.stored(run.key, run.count, sum(f[10] for f in run_frames[first:first + run.count]))
                burst.answered(encode_put_acks(run_frames, first, run.count, run.first_id, partition,
                                               run.first_offset),
                               [f[3] for f in run_frames[first:first + run.count]], run.log_end)
            stored += taken
            i += taken
            continue
        f = frames[i]
        i += 1
        topic = f[0].decode("ascii")
        try:
            r, _position, duplicate = path.append_idempotent_prepared(topic, f[1], f[2], data[f[4]:f[4] + f[5]], now,
                                                                    f[8], f[9], f[6] & 0x7FFFFFFF, owner)
        except errors.MetaqError as exc:  # answered as the general path does; the next frames after a new look
            path.failed(topic, exc)
            out.append(error_reply(exc, f[3]))
            status = DONE
            break
        reply = b"%d %d %d" % (r.msg_id, r.partition, r.offset)
        if duplicate:
            reply += _DUP_TAIL
        else:
            stored += 1
            burst.stored((topic, r.partition), 1, f[10])
        burst.answered(encode_result(200, reply, f[3]), (f[3],), r.log_end)
    pos = frames[i - 1][11]
    parser.consume_to(pos)
    fast.stats.burst_puts += stored
    if burst.waits or burst.touched:
        wait_pos = burst.written(path, now, durable, wait_pos)
    return wait_pos, pos, status
