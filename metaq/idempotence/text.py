"""The text handler of ``put_idem`` (``idempotence/wire.py``; docs/spark.md "The idempotent producer"): a put
stored once per ``(pid, topic, partition, seq)``; a duplicate is answered with the original's id and offset and
`` dup``, once the original is durable (as any put is answered, ``ack_put``); and of ``putb_idem``, a batch of them
answered once (docs/text-protocol.md "putb_idem").
"""

from collections import Counter
from operator import itemgetter

from metaq import errors
from metaq.idempotence.burst import run_end, scan_idem_batch
from metaq.idempotence.wire import DUPLICATE_MARK, encode_idem_runs
from metaq.protocol.text import encode_result
from metaq.clock import now_ms
from metaq.serving.putpath import ACK_NOW
from metaq.serving.batchput import BatchPuts
from metaq.serving.putchecks import uncompressed, verified_checksum
from metaq.store.record import FIXED_OVERHEAD

NO_WAIT = 0
_PARTITION, _SIZE, _PAYLOAD = itemgetter(1), itemgetter(5), itemgetter(10)  # of idempotence.burst's frames


class TextIdempotentPuts:
    """``put_idem`` over the put path (its permission is the topic-write decision every put asks)."""

    def __init__(self, put_path, max_body, *, ack_put, error_reply):
        """``ack_put(e, r, now, reply, conn)``: how a stored put is answered (the dispatcher's, per the flush and
        replication modes); ``error_reply(exc, opaque)``: the dispatcher's one error→reply mapping."""
        self.put_path = put_path
        self.max_body = max_body
        self.ack_put = ack_put
        self.error_reply = error_reply

    def put_idem(self, e, conn):
        path = self.put_path
        try:
            path.check_write(e.topic, conn.session)
            verified_checksum(e, attribute=False)  # the stored data gets the identity and a new checksum
            e = uncompressed(e, self.max_body)
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return self.error_reply(exc, e.opaque), NO_WAIT
        now = now_ms()
        try:
            r, _position, duplicate = path.append_idempotent(e.topic, e.partition, e.flag, e.body, now,
                                                             e.producer_id, e.sequence,
                                                             owner=conn.session.user if conn.session else None)
        except errors.MetaqError as exc:
            return self.error_reply(exc, e.opaque), NO_WAIT
        body = b"%d %d %d" % (r.msg_id, r.partition, r.offset)
        if duplicate:
            body += b" " + DUPLICATE_MARK
            if not r.log_end:  # the original is gone (retention): nothing to wait for
                return encode_result(200, body, e.opaque), NO_WAIT
        return self.ack_put(e, r, now, encode_result(200, body, e.opaque), conn)


class TextIdempotentBatches(BatchPuts):
    """``putb_idem`` (``idempotence.wire.IdempotentBatch``): a batch of one producer's put_idem frames, checked
    whole, decided and stored by the idempotent run writer, answered once.

    The order is ``putb``'s (``serving/batchput.py``): the write decision once for the batch's topic; every
    sub-record checked (``idempotence.burst.scan_idem_batch``: form, checksum, topic, partition, one producer
    id, each partition's sequences consecutive), the producer-partitions admitted, no batch past its next
    sequence and every resent frame the message stored under its sequence (``MessageStore.check_idempotent_batch``),
    the partitions and the disk room made sure of, all before the first append, so a refused batch stores nothing,
    whichever of its partitions the fault is in. Then each producer-partition's frames are
    decided as single put_idem frames are: a sequence already stored is a duplicate (the original's id and
    offset), the rest go to ``MessageStore.put_idempotent_run`` (one append and one table step per run), one
    at a time through ``put_idempotent_prepared`` where the run writer stops. Acknowledged as ``putb`` is."""

    def putb_idem(self, e, conn):
        path = self.put_path
        store = path.store
        owner = conn.session.user if conn.session is not None else None
        try:
            path.check_write(e.topic, conn.session)
            frames, data = scan_idem_batch(e, self.max_body, self.max_line, store.partitions_of(e.topic), owner)
            store.check_idempotent_batch(e.topic, frames, owner)
            per_partition = Counter(map(_PARTITION, frames))
            for partition in sorted(per_partition):
                store.hold_partition(e.topic, partition)
            overhead = FIXED_OVERHEAD + len(frames[0][0])
            sizes = list(map(_SIZE, frames))
            store.check_room(sum(sizes) + len(frames) * overhead,
                             {(e.topic, p): n for p, n in per_partition.items()}, overhead + max(sizes))
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return self.error_reply(exc, e.opaque), NO_WAIT
        now = now_ms()
        try:
            runs, log_end = self._store_idem(e, frames, data, now, owner)
        except errors.MetaqError as exc:  # the disk, met after the check: what was appended stays (a resend's dups)
            path.failed(e.topic, exc, counted_only=True)
            return self.error_reply(exc, e.opaque), NO_WAIT
        reply = encode_result(200, encode_idem_runs(runs), e.opaque)
        if path.written({(e.topic, run[1]) for run in runs if not run[4]}, now) == ACK_NOW:
            return reply, NO_WAIT
        return reply, log_end  # the connection acknowledges once ``PutPath.settle`` lets it (a duplicate's original)

    def _store_idem(self, e, frames, data, now, owner):
        """Decide and append every frame, in order: ``([(first_id, partition, first_offset, count, dup)], the log
        end the reply waits for)`` (a duplicate's: its original's)."""
        path = self.put_path
        counted = path.counted
        runs = []
        log_end = 0
        i, n = 0, len(frames)
        while i < n:
            j = n if i == 0 and _one_run(frames) else run_end(frames, i, n)
            taken, written = path.append_idempotent_run(frames[i:j] if i or j < n else frames, data, now, owner)
            if taken:
                for run in written:
                    first = i + run.first_frame
                    counted(e.topic, run.count, sum(map(_PAYLOAD, frames[first:first + run.count])))
                    _add(runs, run.first_id, run.key[1], run.first_offset, run.count, False)
                    log_end = max(log_end, run.log_end)
                i += taken
                continue
            f = frames[i]
            i += 1
            r, _position, duplicate = path.append_idempotent_prepared(e.topic, f[1], f[2], data[f[4]:f[4] + f[5]], now,
                                                                    f[8], f[9], f[6] & 0x7FFFFFFF, owner)
            if not duplicate:
                counted(e.topic, 1, f[10])
            _add(runs, r.msg_id, r.partition, r.offset, 1, duplicate)
            log_end = max(log_end, r.log_end)
        return runs, log_end


def _one_run(frames):
    """True when a checked batch's ``frames`` (``scan_idem_batch``'s: one topic and producer, each partition's
    sequences consecutive) are one run: the last frame's sequence is the first's plus the frames between, on the
    same partition, so no other partition's frame is among them."""
    first, last = frames[0], frames[-1]
    return last[1] == first[1] and last[9] == first[9] + len(frames) - 1


def _add(runs, msg_id, partition, offset, count, duplicate):
    """Extend the last run when these messages continue it (same partition, kind, consecutive ids and offsets)."""
    if runs and offset >= 0:
        first_id, p, first_offset, k, dup = runs[-1]
        if p == partition and dup == duplicate and first_offset >= 0 and first_id + k == msg_id \
                and first_offset + k == offset:
            runs[-1] = (first_id, p, first_offset, k + count, dup)
            return
    runs.append((msg_id, partition, offset, count, duplicate))
