"""The put-burst fast path: many pipelined puts parsed, stored and answered in one pass.

A pipelining producer fills the receive buffer with whole ``put`` frames. For
those, the general path (parser event → dispatcher → ``MessageStore.put`` →
stats → reply) costs tens of µs of Python per message. Here the frames at the
head of the buffer are scanned in one pass (``protocol.burst.scan_puts``,
checksums verified), appended in one call per partition run
(``MessageStore.put_burst``), counted once per run and answered with one
``result 200`` blob per run, in order, among the other replies of the burst.

Anything unusual is left to the general path, which answers it as always: the
scan stops at the first frame that is not a plain 7-token put with a right
checksum and no attribute flag (transactional puts, ``-1`` partitions, bad
checksums, errors of any kind), the store stops at the first frame that needs
more than a plain append (new partition, next index file, segment roll), and
nothing is taken at all while puts are refused (slave, disk, failed flush) or
replication is synchronous. So the replies are byte for byte those of the
general path (message ids apart, which are clock-based either way).
"""

import re

from metaq.protocol.burst import scan_puts
from metaq.protocol.delay import SCHEDULE_TOPIC
from metaq.protocol.text import encode_result
from metaq.server.flusher import now_ms

_REPLY_HEAD = re.compile(rb"result \d+ (\d+) (-?\d+)\r\n")
_INTERNAL_TOPIC = SCHEDULE_TOPIC.encode()


def _before_internal_topic(frames):
    """The frames before the first put to the delay scheduler's topic (the general path refuses that one)."""
    seen = None
    for i, frame in enumerate(frames):
        topic = frame[0]
        if topic is not seen:  # consecutive frames of one topic share the object: one compare per run
            if topic == _INTERNAL_TOPIC:
                return frames[:i]
            seen = topic
    return frames


class FastPuts:
    """One per broker; ``take`` is called by each connection before each frame of a burst."""

    def __init__(self, dispatcher, lim):
        """``lim``: the broker's ``limits`` settings (body and line lengths)."""
        self.dispatcher = dispatcher
        self.put_path = path = dispatcher.put_path
        self.store = path.store
        self.stats = path.stats
        self.sync_flush = path.sync_flush
        self.max_body = lim.max_body_bytes
        self.max_line = lim.max_line_bytes

    def take(self, parser, out, durable, wait_pos):
        """Store and answer the plain puts at the head of ``parser``'s buffer; returns the new flush wait position.

        Replies go to ``out`` (one entry per partition run); in ``sync`` mode
        their indexes go to ``durable`` as the general path's do.
        """
        window = parser.burst_window()
        if window is None:
            return wait_pos
        buf, pos, end = window
        if not buf.startswith(b"put ", pos):
            return wait_pos
        path = self.put_path  # follows the broker's role (promotion, rejoin)
        if path.refusal is not None or path.sync_replication:
            return wait_pos
        frames, _stop = scan_puts(buf, pos, end, self.max_body, self.max_line)
        frames = _before_internal_topic(frames)
        if not frames:
            return wait_pos
        now = now_ms()
        taken, runs = self.store.put_burst(frames, buf, now)
        if not taken:
            return wait_pos
        last = frames[taken - 1]
        parser.consume_to(last[4] + last[5])
        self.stats.burst_puts += taken
        self._account(runs)
        for _p, _count, _nbytes, replies, log_end in runs:
            out.append(replies)
            if self.sync_flush:
                durable.append(len(out) - 1)
                if log_end > wait_pos:
                    wait_pos = log_end
        if not self.sync_flush:
            path.waiters.notify({run[0].key for run in runs})
            if self.store.should_flush(now):
                path.flusher.wake()
        return wait_pos

    def _account(self, runs):
        stats, registry = self.stats, self.put_path.registry
        for p, count, nbytes, _replies, _end in runs:
            stats.on_puts(p.topic, count, nbytes)
            if registry is not None and p.topic not in registry.registered_topics:
                registry.topic_created(p.topic)


def failed_replies(replies, body):
    """``replies`` (one or more ``result`` replies joined) turned into ``result 500 <body>`` with the same opaques."""
    out = []
    pos = 0
    match = _REPLY_HEAD.match
    while pos < len(replies):
        m = match(replies, pos)
        if m is None:
            raise ValueError("not a result reply at %d: %r" % (pos, replies[pos:pos + 40]))
        out.append(encode_result(500, body, int(m.group(2))))
        pos = m.end() + int(m.group(1))
    return b"".join(out)
