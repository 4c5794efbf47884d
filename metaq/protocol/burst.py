"""Bursts of plain puts found in one pass over a receive buffer (the broker's fast path; sans-IO).

A pipelining producer's receive buffer mostly holds whole frames of the plain
7-token form ``put <topic> <partition> <len> <flag> <checksum> <opaque>\\r\\n<body>``
or the 6-token form of MetaQ's older clients, the same without ``<checksum>``.
``scan_puts`` takes the leading run of such frames whose checksum is right and
stops at the first frame it does not take, leaving it (and everything after it)
to ``TextParser``, which answers it exactly as always. So a frame is taken only when:

* the line is exactly one of those forms, ASCII, with ``\\r\\n``, no longer than ``max_line``;
* topic is 1+ printable ASCII bytes without space; partition ``0..2^31-1`` (not ``-1``);
  ``flag`` ``0..2^31-1``; checksum ``-1`` or ``0..2^31-1``; opaque a signed 32-bit int;
  each number at most 10 digits;
* the announced length is at most ``max_body`` and the whole body is buffered;
* the checksum is ``-1`` (or absent: 6 tokens) or equals ``metaq_checksum(body)``;
* with flag bit 0 (an attribute block), the block is well formed and does not
  carry the idempotent producer's reserved properties (the general path refuses
  both, saying why) nor a ``@SYSFLAG`` (which may mark a compressed body: the
  general path decompresses it).

Each taken frame is ``(topic, partition, flag, opaque, body_start, body_len, crc)``:
``topic`` as bytes (consecutive frames with the same topic share one object),
``crc`` the unsigned CRC-32 of the body (its checksum is ``crc & 0x7FFFFFFF``);
a frame with an attribute has an eighth field, the index unit's tag hash
(``protocol.tags.tag_code`` of the attribute's part before its first ``\\x02``).

The answers to a burst are encoded here too: ``encode_put_acks`` gives the
``result 200`` replies of a run of stored frames (from what the store reports
it wrote: first message id, partition, first offset, count), ``encode_results``
one reply with the same code and body per opaque (the 500s of puts whose
flush failed).

``metaq.native._bytes.scan_puts`` and ``encode_put_acks`` are the same functions in
C; this module uses them when it was built and ``scan_puts_py`` /
``encode_put_acks_py`` otherwise (the tests hold each pair equal).
"""

import re
import zlib

from metaq import speedups
from metaq.protocol.properties import PID_MARK, SEQ_MARK, SYSFLAG_MARK
from metaq.protocol.tags import tag_code, tags_of_attribute

INT32_MAX = 2**31 - 1
#: The idempotent producer's reserved properties (``protocol.properties``) as they appear in an attribute.
_PID_MARK, _SEQ_MARK = PID_MARK, SEQ_MARK

#: The frame header; the numbers are range-checked after the match.
_PUT = re.compile(rb"put ([!-~]+) ([0-9]{1,10}) ([0-9]{1,10}) ([0-9]{1,10}) (?:(-1|[0-9]{1,10}) )?(-?[0-9]{1,10})\r\n")


def scan_puts_py(buf, pos, end, max_body, max_line, max_frames=None):
    """``(frames, next_pos)``: the leading puts of ``buf[pos:end]`` (at most ``max_frames``) and where the first one
    not taken starts."""
    frames = []
    match = _PUT.match
    topic = None
    with memoryview(buf) as view:
        while max_frames is None or len(frames) < max_frames:
            m = match(buf, pos, end)
            if m is None:
                break
            t, partition, length, flag, checksum, opaque = m.groups()
            head_end = m.end()
            partition, length, flag, checksum, opaque = (int(partition), int(length), int(flag),
                                                         -1 if checksum is None else int(checksum), int(opaque))
            body_end = head_end + length
            if (head_end - pos - 2 > max_line or partition > INT32_MAX or flag > INT32_MAX
                    or checksum > INT32_MAX or not -2**31 <= opaque <= INT32_MAX or length > max_body
                    or body_end > end):
                break
            crc = zlib.crc32(view[head_end:body_end])
            if checksum != -1 and checksum != crc & 0x7FFFFFFF:
                break
            if flag & 1:
                tag = _attribute_tag(view[head_end:body_end])
                if tag is None:
                    break
            if t != topic:
                topic = t
            if flag & 1:
                frames.append((topic, partition, flag, opaque, head_end, length, crc, tag))
            else:
                frames.append((topic, partition, flag, opaque, head_end, length, crc))
            pos = body_end
    return frames, pos


def _attribute_tag(data):
    """The index unit's tag hash of a put's data with an attribute block (``store.record.tag_hash``), or None
    when the block is malformed, carries the idempotent producer's reserved properties (the general path
    refuses those, saying why) or a ``@SYSFLAG`` (a compressed body, which the general path decompresses)."""
    if len(data) < 4:
        return None
    alen = int.from_bytes(data[:4], "big", signed=True)
    if alen < 0 or alen > len(data) - 4:
        return None
    attr = bytes(data[4:4 + alen])
    if _PID_MARK in attr or _SEQ_MARK in attr or SYSFLAG_MARK in attr:
        return None
    return tag_code(tags_of_attribute(attr))


scan_puts = speedups.load("scan_puts", scan_puts_py)  # the C twin when built (same results, less CPU)


def encode_put_acks_py(frames, start, count, first_id, partition, first_offset):
    """The ``result 200`` replies, joined, of ``frames[start:start + count]`` stored as messages of ``partition``.

    Frame *k* of the run became message id ``first_id + k`` at offset
    ``first_offset + k``; its reply is ``result 200 <len> <opaque>\r\n<msgId>
    <partition> <offset>`` with the frame's opaque, byte for byte what the
    general path answers (``encode_result``).
    """
    out = []
    append = out.append
    for k in range(count):
        body = b"%d %d %d" % (first_id + k, partition, first_offset + k)
        append(b"result 200 %d %d\r\n%s" % (len(body), frames[start + k][3], body))
    return b"".join(out)


encode_put_acks = speedups.load("encode_put_acks", encode_put_acks_py)  # the C twin when built


def encode_results(code, body, opaques):
    """``result <code> <len> <opaque>\r\n<body>`` for each of ``opaques``, joined (body: bytes)."""
    head = b"result %d %d " % (code, len(body))
    return b"".join(b"%s%d\r\n%s" % (head, opaque, body) for opaque in opaques)
