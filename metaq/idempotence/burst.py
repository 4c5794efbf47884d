"""Bursts of ``put_idem`` frames in one pass: scanned, checked and given their identity (the broker's fast path;
sans-IO).

An idempotent producer's pipeline fills the receive buffer with whole
``put_idem`` frames. ``scan_idem_burst`` takes the leading run of them that
``scan_put_idem`` takes (whole, every number in range,
checksum right) and whose data ``with_identity`` accepts (a well-formed
attribute block without the reserved properties, and without a ``@SYSFLAG``,
which may mark a compressed body the general path decompresses), and stops at the first frame
that is not such a one, leaving it (and everything after it) to ``TextParser``,
which accepts or explains it.

For each frame taken it writes the data the record will hold (the put's data
with the identity, and its owner when given, in its attribute: ``with_identity``) into one new buffer and
gives ``(topic, partition, flag, opaque, start, length, crc, tag, pid, seq, put_length, frame_end)``:
``topic`` as bytes (consecutive frames with the same topic share one object),
``flag`` the stored flag (bit 0 set), ``start``/``length`` the stored data in the
returned buffer, ``crc`` its unsigned CRC-32 (its checksum is
``crc & 0x7FFFFFFF``) and ``tag`` the index unit's tag hash
(``protocol.tags.tag_code`` of the stored attribute's part before its first
``\\x02``: the put's own tags); ``put_length`` is the length of the put's
own data (the frame's ``<len>``, what the broker's stats count) and ``frame_end``
where the frame ends in ``buf``. The first seven fields are what a plain
put's burst frame holds (``protocol.burst``), so the store appends them with the
same ``write_run``, which writes ``tag`` in the index unit.

``metaq.native._bytes.scan_idem_burst`` is the same function in C; this module uses
it when it was built and ``scan_idem_burst_py`` otherwise (the tests hold the
two equal).
"""

import re
import zlib
from operator import itemgetter

from metaq import speedups
from metaq.errors import ClientError
from metaq.idempotence.records import MAX_PID, MAX_SEQ, with_identity
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.properties import SYSFLAG_MARK
from metaq.protocol.tags import tag_code, tags_of_attribute

__all__ = ["scan_idem_burst", "scan_idem_burst_py", "scan_put_idem", "scan_idem_batch", "run_end"]


#: A whole put_idem frame header as the broker's burst path takes it (``\r\n`` only; anything else, and any
#: number out of range, is left to ``TextParser``, which accepts or explains it).
_FRAME = re.compile(rb"put_idem ([!-~]+) ([0-9]{1,10}) ([0-9]{1,10}) (-?[0-9]{1,10}) (-1|[0-9]{1,10}) "
                    rb"([0-9]{1,19}) ([0-9]{1,19}) (-?[0-9]{1,11})\r\n")
_I32 = 2**31 - 1


def scan_put_idem(buf, pos, end, max_body, max_line):
    """The put_idem frame at ``buf[pos:end]`` as ``(topic bytes, partition, flag, pid, seq, opaque, body_start,
    body_len)`` when it is whole, in range and its checksum (unless -1) is right; else None (the parser's turn)."""
    m = _FRAME.match(buf, pos, end)
    if m is None or m.end() - pos - 2 > max_line:
        return None
    topic, partition, length, flag, checksum, pid, seq, opaque = m.groups()
    partition, length, flag, checksum, pid, seq, opaque = (int(partition), int(length), int(flag), int(checksum),
                                                           int(pid), int(seq), int(opaque))
    start = m.end()
    if (partition > _I32 or checksum > _I32 or not 1 <= pid <= MAX_PID or seq > MAX_SEQ or length > max_body
            or start + length > end or not -_I32 - 1 <= flag <= _I32 or not -_I32 - 1 <= opaque <= _I32):
        return None
    if checksum != -1:
        with memoryview(buf) as view:
            if checksum != metaq_checksum(view[start:start + length]):
                return None
    return topic, partition, flag, pid, seq, opaque, start, length


def scan_idem_burst_py(buf, pos, end, max_body, max_line, max_frames=None, owner=None):
    """``(frames, data, next_pos)``: the leading put_idem frames of ``buf[pos:end]`` (at most ``max_frames``; see the
    module docstring), the buffer their stored data is in, and where the first frame not taken starts. ``owner``
    (bytes: the connection's user, or None) is written after each identity (``records.with_identity``)."""
    owner = None if owner is None else owner.decode("utf-8")
    frames = []
    out = bytearray()
    topic = None
    while max_frames is None or len(frames) < max_frames:
        frame = scan_put_idem(buf, pos, end, max_body, max_line)
        if frame is None:
            break
        t, partition, flag, pid, seq, opaque, start, length = frame
        try:
            stored_flag, data = with_identity(flag, bytes(buf[start:start + length]), pid, seq, owner)
        except ClientError:
            break
        alen = int.from_bytes(data[:4], "big")
        if SYSFLAG_MARK in data[4:4 + alen]:  # the identity added holds none: it was in the put's attribute
            break
        if t != topic:
            topic = t
        at = len(out)
        out += data
        frames.append((topic, partition, stored_flag, opaque, at, len(data), zlib.crc32(data),
                       tag_code(tags_of_attribute(data[4:4 + alen])), pid, seq, length, start + length))
        pos = start + length
    return frames, bytes(out), pos


scan_idem_burst = speedups.load("scan_idem_burst", scan_idem_burst_py)  # the C twin when built


def run_end(frames, i, n):
    """The end of the run of ``frames`` from ``i``: one producer-partition's consecutive sequences."""
    first = frames[i]
    topic, partition, pid, seq = first[0], first[1], first[8], first[9]
    j = i + 1
    while j < n:
        f = frames[j]
        if f[0] is not topic or f[1] != partition or f[8] != pid or f[9] != seq + (j - i):
            break
        j += 1
    return j


_TOPIC, _PARTITION, _PID, _SEQ = itemgetter(0), itemgetter(1), itemgetter(8), itemgetter(9)


def _one_partition_run(frames, topic, pid, partitions):
    """True when ``frames`` are all of ``topic``, of producer ``pid`` and of one partition below ``partitions``,
    with consecutive sequences: the usual batch (a ``send_many`` call is for one partition), checked without a
    Python step per frame. False says nothing: the frame-by-frame check decides, and names the fault."""
    first = frames[0]
    seq0 = first[9]
    return (first[1] < partitions and frames[-1][9] == seq0 + len(frames) - 1
            and set(map(_PARTITION, frames)) == {first[1]} and set(map(_TOPIC, frames)) == {topic}
            and set(map(_PID, frames)) == {pid} and list(map(_SEQ, frames)) == list(range(seq0, seq0 + len(frames))))


def scan_idem_batch(e, max_body, max_line, partitions, owner=None):
    """``(frames, data)`` of ``putb_idem`` batch ``e`` (``idempotence.wire.IdempotentBatch``; ``partitions``: the
    topic's partition count; ``owner``: the connection's user or None), in ``scan_idem_burst``'s form: every
    sub-record a whole put_idem frame that scan takes, of ``e.topic``, of one producer id, each partition's
    sequences consecutive in frame order. ClientError (400) naming the first bad sub-record otherwise: nothing
    here stores anything, so a batch refused is refused whole."""
    body = e.body
    end = len(body)
    frames, data, stop = scan_idem_burst(body, 0, end, max_body, max_line, e.count,
                                         None if owner is None else owner.encode("utf-8"))
    n = e.count
    if len(frames) < n and stop < end:
        raise ClientError("putb_idem: sub-record %d of %d (byte %d) is not a whole put_idem frame with every number "
                          "in range, its checksum right and a well-formed attribute block without reserved or "
                          "compression properties; nothing was stored" % (len(frames), n, stop))
    if len(frames) != n or stop != end:
        raise ClientError("putb_idem: the count says %d messages, the body holds %s; nothing was stored"
                          % (n, "%d" % len(frames) if stop == end else "more"))
    topic = e.topic.encode("utf-8")
    pid = frames[0][8]
    if _one_partition_run(frames, topic, pid, partitions):
        return frames, data
    nxt = {}
    for k, f in enumerate(frames):
        if f[0] != topic:
            raise ClientError("putb_idem: sub-record %d of %d is for topic %s, the batch for %s; nothing was stored"
                              % (k, n, f[0].decode("utf-8", "replace"), e.topic))
        if f[1] >= partitions:
            raise ClientError("putb_idem: sub-record %d of %d is for partition %d, topic %s has partitions 0..%d; "
                              "nothing was stored" % (k, n, f[1], e.topic, partitions - 1))
        if f[8] != pid:
            raise ClientError("putb_idem: sub-record %d of %d is of producer %d, the batch's first of %d; nothing was "
                              "stored" % (k, n, f[8], pid))
        want = nxt.get(f[1])
        if want is not None and f[9] != want:
            raise ClientError("putb_idem: sub-record %d of %d has sequence %d, partition %d's previous one in the "
                              "batch was %d: a batch's sequences must be consecutive; nothing was stored"
                              % (k, n, f[9], f[1], want - 1))
        nxt[f[1]] = f[9] + 1
    return frames, data
