"""The put-burst fast path: many pipelined puts parsed, stored and answered in one pass.

A pipelining producer fills the receive buffer with whole ``put`` frames. For
those, the general path (parser event → dispatcher → ``MessageStore.put`` →
stats → reply) runs once per message. Here the frames at the
head of the buffer are scanned in one pass (``protocol.burst.scan_puts``,
checksums verified), appended in one call per partition run
(``MessageStore.put_burst``), counted once per run and answered with one
``result 200`` blob per run, in order, among the other replies of the burst.
The store reports what it wrote (a ``BurstRun``: partition, first offset,
first message id, count); the replies are encoded here from that and the
frames' opaques (``protocol.burst.encode_put_acks``, in C when built).

Anything unusual is left to the general path, which answers it as always: the
scan stops at the first frame that is not a plain put with a right checksum
and, if it has an attribute, a well-formed one (transactional puts, ``-1``
partitions, bad checksums, errors of any kind), the store stops at the first frame that needs
more than a plain append (new partition, next index file, segment roll), and
nothing is taken at all while puts are refused (slave, disk, failed flush). What
follows the append is the put path's (``PutPath.counted``, ``written``), and the
acks wait as the general path's do (``sync`` flush, ``sync`` replication: the
connection sends them once ``PutPath.settle`` lets it). So the replies are byte
for byte those of the general path (message ids apart, which are clock-based
either way).
"""

from metaq.limits import BURST_SCAN_FRAMES
from metaq.protocol import commands
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)
from metaq.protocol.burst import encode_put_acks, encode_results, scan_puts
from metaq.clock import now_ms
from metaq.serving.putpath import ACK_NOW
from metaq.idempotence.fasttext import take_put_idem
from metaq.serving.takers import DONE, MORE, before_refused_topic, writable_topics
from metaq.timers.fasttext import take_put_ats


class FastPuts:
    """One per broker; ``take`` is called by each connection before each frame of a burst."""

    def __init__(self, put_path, lim):
        """``put_path``: the put path the text dispatcher stores with; ``lim``: the broker's ``limits`` settings (body
        and line lengths)."""
        self.put_path = path = put_path
        self.store = path.store
        self.stats = path.stats
        self.max_body = lim.max_body_bytes
        self.max_line = lim.max_line_bytes

    def take(self, parser, out, durable, wait_pos, session=None):
        """Store and answer the puts (and put_idems) at the head of ``parser``'s buffer; returns the new flush wait
        position.

        Replies go to ``out`` (one entry per partition run); when they wait (``sync`` flush or replication)
        ``(index in out, the run's opaques)`` go to ``durable`` as the general path's do. ``session``: the
        connection's (whose user ``PutPath.write_refusal`` asks about, once per topic of a burst).

        At most ``limits.BURST_SCAN_FRAMES`` frames are scanned first, then twice as many each time every
        frame scanned was taken: a frame the general path must answer costs a scan of that many, never one of
        the whole rest of the buffer (which made a pipeline of refused puts quadratic).
        """
        window = parser.burst_window()
        if window is None:
            return wait_pos
        buf, pos, end = window
        cap = BURST_SCAN_FRAMES
        while pos < end:
            space = buf.find(b" ", pos, pos + _LONGEST_WORD + 1)
            take_once = _TAKERS.get(bytes(buf[pos:space])) if space > 0 else None
            if take_once is None:
                break
            wait_pos, pos, status = take_once(self, parser, buf, pos, end, cap, out, durable, wait_pos, session)
            if status is not MORE:
                break
            cap *= 2
        return wait_pos

    def account(self, runs):
        """Count the stored runs and register their topics (``PutPath.counted``, once per run)."""
        counted = self.put_path.counted
        for run in runs:
            counted(run.key[0], run.count, run.body_bytes)


def take_plain_puts(fast, parser, buf, pos, end, cap, out, durable, wait_pos, session):
    """The puts of ``buf[pos:end]``, ``cap`` at most (``fast``: the ``FastPuts``): ``(wait_pos, pos after the
    frames taken, MORE / DONE)``."""
    path = fast.put_path  # follows the broker's role (promotion, rejoin)
    if path.refusal is not None:
        return wait_pos, pos, DONE
    frames, stop = scan_puts(buf, pos, end, fast.max_body, fast.max_line, cap)
    fast.stats.burst_scanned_bytes += stop - pos
    scanned = len(frames)
    frames = before_refused_topic(frames, writable_topics(path, session))
    if not frames:
        return wait_pos, pos, DONE
    now = now_ms()
    taken, runs = path.append_burst(frames, buf, now)
    if not taken:
        return wait_pos, pos, DONE
    last = frames[taken - 1]
    pos = last[4] + last[5]
    parser.consume_to(pos)
    fast.stats.burst_puts += taken
    fast.account(runs)
    waits = path.written({run[0] for run in runs}, now) != ACK_NOW  # the flush, a slave's ACK: PutPath.settle
    for key, count, _nbytes, first_id, first_offset, first, log_end in runs:
        out.append(encode_put_acks(frames, first, count, first_id, key[1], first_offset))
        if waits:
            durable.append((len(out) - 1, [f[3] for f in frames[first:first + count]]))
            if log_end > wait_pos:
                wait_pos = log_end
    return wait_pos, pos, MORE if taken == scanned == cap else DONE


#: The fast path's taker of each command the registry gives a burst scanner (``protocol.commands.bursts``):
#: plain puts here, an idempotent producer's pipeline (idempotence/fasttext.py), a pipeline of delivery times
#: (timers/fasttext.py).
_TAKER_OF = {"put": take_plain_puts, "put_idem": take_put_idem, "put_at": take_put_ats}
if set(_TAKER_OF) != set(commands.bursts()):  # a burst scanner without a taker, or a taker of no scanner
    raise TypeError("the fast path takes %s, the registry's burst commands are %s"
                    % (sorted(_TAKER_OF), sorted(commands.bursts())))
_TAKERS = {word.encode("ascii"): take for word, take in _TAKER_OF.items()}
_LONGEST_WORD = max(len(word) for word in _TAKERS)


def failed_replies(opaques, body):
    """What puts whose flush failed get instead of their acks: ``result 500 <body>`` per opaque, joined."""
    return encode_results(500, body, opaques)
