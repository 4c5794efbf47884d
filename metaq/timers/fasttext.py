"""The ``put_at`` burst path: pipelined puts with a delivery time stored and answered in one pass (docs/messaging.md
"Any delivery time").

The general path handles a ``put_at`` one by one in Python (parser event, dispatcher, checks, the ENTRY's
encoding, one store put, one reply); a producer scheduling many messages pipelines them. Here the ``put_at``
frames at the head of the receive buffer are taken in one pass: each is checked as the general path checks it,
its ENTRY record (``timers.records.encode_entry``: real topic, partition, flag, checksum, due and born times, the
body) is encoded, and all of them are appended to the timer topic with one ``MessageStore.put_burst`` call (the
plain burst's writer), then answered ``result 200 <len> <opaque>\\r\\n<msgId> <partition> -1`` each, in order —
byte for byte the general path's replies.

Only the plain form is taken: ``put_at <topic> <partition> <len> 0 <checksum> @<ms>|+<ms> <opaque>`` with an
explicit partition that exists, no attribute (flag 0), a checksum that is ``-1`` or right, a delivery time the
general path accepts, a topic ``PutPath.write_refusal`` lets the connection's user write. The first frame that is
anything else, and everything after it, is left to the general path, which answers it as always; nothing is taken
while puts are refused or this broker does not deliver timers (a slave).
"""

from metaq import errors
from metaq.limits import validate_partition
from metaq.clock import now_ms
from metaq.serving.putpath import ACK_NOW
from metaq.serving.takers import DONE, MORE
from metaq.timers.burst import encode_timer_acks, scan_put_ats
from metaq.timers.records import TIMER_TOPIC, TimerEntry

_TIMER = TIMER_TOPIC.encode()


def checked(items, check_topic):
    """``items`` (``scan_put_ats``'s) up to the first whose topic and partition ``check_topic`` refuses (it raises
    what the general path would answer)."""
    seen = set()
    for k, item in enumerate(items):
        key = (item[0], item[1])
        if key not in seen:
            try:
                check_topic(*key)
            except errors.MetaqError:
                return items[:k]
            seen.add(key)
    return items


def take_put_ats(fast, parser, buf, pos, end, cap, out, durable, wait_pos, session):
    """The ``put_at`` frames of ``buf[pos:end]``, ``cap`` at most (``fast``: the ``FastPuts``): ``(wait_pos, pos
    after the frames taken, MORE / DONE)``, as ``fastput.take_plain_puts``."""
    path = fast.put_path
    timers = path.timers
    if path.refusal is not None or timers is None or not timers.enabled:
        return wait_pos, pos, DONE
    store = fast.store

    def check_topic(topic, partition):  # once per topic and partition of a burst
        path.check_write(topic, session)
        validate_partition(partition, store.partitions_of(topic))
        store.check_creatable(topic, partition)

    now = now_ms()
    owner = session.user if session is not None else None
    items, src, _nxt = scan_put_ats(buf, pos, end, fast.max_body, cap, now, _TIMER, TimerEntry, owner)
    scanned = checked(items, check_topic)
    if not scanned:
        return wait_pos, pos, DONE
    try:
        timers.check_room(owner, len(scanned))
    except errors.MetaqError:  # the general path answers each, up to the one past the quota or the limit
        return wait_pos, pos, DONE
    fast.stats.burst_scanned_bytes += scanned[-1][3] - pos
    taken, runs = path.append_burst([item[5] for item in scanned], src, now)
    if not taken:
        return wait_pos, pos, DONE
    pos = scanned[taken - 1][3]
    parser.consume_to(pos)
    fast.stats.burst_puts += taken
    timers.count_written(owner, taken)
    counts = {}
    for item in scanned[:taken]:
        c = counts.get(item[0])
        counts[item[0]] = (1, item[4]) if c is None else (c[0] + 1, c[1] + item[4])
    for topic, (count, size) in counts.items():
        path.counted(topic, count, size)
    waits = path.written({(TIMER_TOPIC, 0)}, now) != ACK_NOW  # the flush, a slave's ACK: PutPath.settle
    for _key, count, _nbytes, first_id, first_offset, first, log_end in runs:
        run = scanned[first:first + count]
        timers.written_run(first_offset, first_id, [f[6] for f in run], [f[5][5] for f in run], log_end)
        out.append(encode_timer_acks(scanned, first, count, first_id))
        if waits:
            durable.append((len(out) - 1, [f[2] for f in run]))
            if log_end > wait_pos:
                wait_pos = log_end
    return wait_pos, pos, MORE if taken == len(scanned) == cap else DONE
