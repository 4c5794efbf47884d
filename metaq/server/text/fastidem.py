"""The put_idem burst path: pipelined ``put_idem`` frames stored and answered without the parser's events.

An idempotent producer's pipeline fills the receive buffer with ``put_idem``
frames; the general path (parser event → dispatcher → put path) costs several
times what the store's work does. Here the frames at the head of the buffer are
taken one by one (``protocol.idempotence.scan_put_idem``: whole, in range,
checksum right), each stored with ``MessageStore.put_idempotent`` (which
decides and appends without a yield) and answered as the general path would:
``result 200`` with ``msgId partition offset`` (`` dup`` for a duplicate,
naming the original), waiting for the flush of the original's record in
``sync`` mode (``durable`` / ``wait_pos``, as the connection does for any put).

A MetaqError of the store (a sequence too old, a bad partition, a full
disk...) is answered as the general path answers it (``PutPath.failed`` counts
it and turns a full disk into the broker's refusal, ``dispatch.error_reply``
makes the reply) and ends the burst. Anything else stops the burst at that
frame, which the general path then answers as always: a frame the scan does
not take, a topic the connection may not publish to or the delay scheduler's.
Nothing is taken while puts are refused or replication is synchronous.
"""

from metaq import errors
from metaq.protocol.delay import SCHEDULE_TOPIC
from metaq.protocol.idempotence import DUPLICATE_MARK, scan_put_idem
from metaq.protocol.textwrite import encode_result
from metaq.server.flusher import now_ms
from metaq.server.text.dispatch import error_reply

_INTERNAL_TOPIC = SCHEDULE_TOPIC.encode()
_DUP_TAIL = b" " + DUPLICATE_MARK


def take_put_idem(fast, parser, buf, pos, end, out, durable, wait_pos, may_publish):
    """Store and answer the put_idem frames at ``buf[pos:end]`` (``parser``'s burst window); returns the new
    flush wait position. ``fast``: the broker's ``FastPuts`` (store, put path, stats, limits)."""
    path = fast.put_path
    if path.refusal is not None or path.sync_replication:
        return wait_pos
    store, stats, registry = fast.store, fast.stats, path.registry
    sync_flush = fast.sync_flush
    now = now_ms()
    taken = stored = 0
    touched = set()
    while pos < end:
        frame = scan_put_idem(buf, pos, end, fast.max_body, fast.max_line)
        if frame is None:
            break
        topic_b, partition, flag, pid, seq, opaque, start, length = frame
        if topic_b == _INTERNAL_TOPIC or (may_publish is not None and not may_publish(topic_b)):
            break
        topic = topic_b.decode("ascii")
        body = bytes(buf[start:start + length])
        pos = start + length
        taken += 1
        try:
            r, _position, duplicate = store.put_idempotent(topic, partition, flag, body, now, pid, seq)
        except errors.MetaqError as exc:  # answered as the general path does; the next frames after a new look
            path.failed(topic, exc)
            out.append(error_reply(exc, opaque))
            break
        reply = b"%d %d %d" % (r.msg_id, r.partition, r.offset)
        if duplicate:
            reply += _DUP_TAIL
        else:
            stored += 1
            stats.on_put(topic, length)
            if registry is not None and topic not in registry.registered_topics:
                registry.topic_created(topic)
        out.append(encode_result(200, reply, opaque))
        if sync_flush:
            if r.log_end:
                durable.append((len(out) - 1, (opaque,)))
                if r.log_end > wait_pos:
                    wait_pos = r.log_end
        else:
            touched.add((topic, r.partition))
    if not taken:
        return wait_pos
    parser.consume_to(pos)
    stats.burst_puts += stored
    if touched:
        path.waiters.notify(touched)
        if store.should_flush(now):
            path.flusher.wake()
    return wait_pos
