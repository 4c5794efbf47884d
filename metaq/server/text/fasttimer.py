"""The ``put_at`` burst path: pipelined puts with a delivery time stored and answered in one pass (README "Any
delivery time").

The general path handles a ``put_at`` in tens of µs of Python (parser event, dispatcher, checks, the ENTRY's
encoding, one store put, one reply); a producer scheduling many messages pipelines them. Here the ``put_at``
frames at the head of the receive buffer are taken in one pass: each is checked as the general path checks it,
its ENTRY record (``protocol.timer.encode_entry``: real topic, partition, flag, checksum, due and born times, the
body) is encoded, and all of them are appended to the timer topic with one ``MessageStore.put_burst`` call (the
plain burst's writer), then answered ``result 200 <len> <opaque>\\r\\n<msgId> <partition> -1`` each, in order —
byte for byte the general path's replies.

Only the plain form is taken: ``put_at <topic> <partition> <len> 0 <checksum> @<ms>|+<ms> <opaque>`` with an
explicit partition that exists, no attribute (flag 0), a checksum that is ``-1`` or right, a delivery time the
general path accepts, a topic the connection may publish to and that is not internal. The first frame that is
anything else, and everything after it, is left to the general path, which answers it as always; nothing is taken
while puts are refused, replication is synchronous, or this broker does not deliver timers (a slave).
"""

import re

from metaq import errors
from metaq.limits import validate_partition
from metaq.protocol.checksum import crc32
from metaq.protocol.delay import SCHEDULE_TOPIC
from metaq.protocol.journaltopic import is_journal
from metaq.protocol.priority import is_level_topic
from metaq.protocol.text import encode_result
from metaq.protocol.timer import TIMER_TOPIC, encode_entry, parse_when
from metaq.server.flusher import now_ms
from metaq.server.text.fastidem import DONE, MORE

#: One plain ``put_at`` line: topic, partition, length, flag 0, checksum, when, opaque.
_LINE = re.compile(rb"put_at ([\x21-\x7e]{1,255}) (\d{1,10}) (\d{1,10}) 0 (-1|\d{1,10}) ([@+]\d{1,19}) "
                   rb"(-?\d{1,10})\r\n")
_TIMER = TIMER_TOPIC.encode()
_INTERNAL = (TIMER_TOPIC, SCHEDULE_TOPIC)
_INT32 = 2 ** 31


def scan_put_ats(buf, pos, end, cap, max_body, now, check_topic):
    """The plain ``put_at`` frames at ``buf[pos:end]`` (at most ``cap``), checked: ``[(topic, partition, opaque,
    entry, frame end, body length)]``. ``check_topic(topic, partition)`` raises what the general path would answer."""
    taken = []
    checked = set()
    while pos < end and len(taken) < cap:
        m = _LINE.match(buf, pos, end)
        if m is None:
            break
        topic_b, part_b, len_b, checksum_b, when_b, opaque_b = m.groups()
        partition, length, checksum, opaque = int(part_b), int(len_b), int(checksum_b), int(opaque_b)
        body_start = m.end()
        body_end = body_start + length
        if partition >= _INT32 or checksum >= _INT32 or not -_INT32 <= opaque < _INT32 or length > max_body \
                or body_end > end:
            break
        body = bytes(buf[body_start:body_end])
        computed = crc32(body) & 0x7FFFFFFF
        if checksum != -1 and checksum != computed:
            break
        try:
            topic = topic_b.decode("ascii")
            if (topic, partition) not in checked:
                check_topic(topic, partition)
                checked.add((topic, partition))
            due = parse_when(when_b, now)
            entry = encode_entry(topic, partition, 0, computed, due, now, body)
        except (errors.MetaqError, UnicodeDecodeError):
            break
        taken.append((topic, partition, opaque, entry, body_end, length))
        pos = body_end
    return taken


def take_put_ats(fast, parser, buf, pos, end, cap, out, durable, wait_pos, may_publish):
    """The ``put_at`` frames of ``buf[pos:end]``, ``cap`` at most (``fast``: the ``FastPuts``): ``(wait_pos, pos
    after the frames taken, MORE / DONE)``, as ``fastput.take_plain_puts``."""
    path = fast.put_path
    timers = path.timers
    if path.refusal is not None or path.sync_replication or timers is None or not timers.enabled:
        return wait_pos, pos, DONE
    store = fast.store

    def check_topic(topic, partition):
        if topic in _INTERNAL or is_journal(topic) or is_level_topic(topic):
            raise errors.ClientError("internal topic")
        if may_publish is not None and not may_publish(topic.encode("ascii")):  # the plain burst's filter: bytes
            raise errors.Forbidden(topic)
        validate_partition(partition, store.partitions_of(topic))
        store.check_creatable(topic, partition)

    now = now_ms()
    scanned = scan_put_ats(buf, pos, end, cap, fast.max_body, now, check_topic)
    if not scanned:
        return wait_pos, pos, DONE
    fast.stats.burst_scanned_bytes += scanned[-1][4] - pos
    src, frames, at = [], [], 0
    for _topic, _partition, opaque, entry, _end, _length in scanned:
        frames.append((_TIMER, 0, 0, opaque, at, len(entry), crc32(entry)))
        src.append(entry)
        at += len(entry)
    taken, runs = store.put_burst(frames, b"".join(src), now)
    if not taken:
        return wait_pos, pos, DONE
    pos = scanned[taken - 1][4]
    parser.consume_to(pos)
    fast.stats.burst_puts += taken
    stats = fast.stats
    registry = path.registry
    for topic, _partition, _opaque, _entry, _end, length in scanned[:taken]:
        stats.on_put(topic, length)
        if registry is not None and topic not in registry.registered_topics:
            registry.topic_created(topic)
    sync_flush = fast.sync_flush
    for _key, count, _nbytes, first_id, _first_offset, first, log_end in runs:
        run = scanned[first:first + count]
        out.append(b"".join(encode_result(200, b"%d %d -1" % (first_id + k, f[1]), f[2])
                            for k, f in enumerate(run)))
        if sync_flush:
            durable.append((len(out) - 1, [f[2] for f in run]))
            if log_end > wait_pos:
                wait_pos = log_end
    if not sync_flush:
        path.waiters.notify({(TIMER_TOPIC, 0)})
        if store.should_flush(now):
            path.flusher.wake()
    return wait_pos, pos, MORE if taken == len(scanned) == cap else DONE
