"""``putb``: many messages of one topic in one text frame, answered once (our extension; sans-IO).

::

    putb <topic> <count> <length> <opaque>\\r\\n<length bytes: count sub-records>
    sub-record = put <topic> <partition> <len> <flag> <checksum> <seq>\\r\\n<body>

A sub-record is a plain ``put`` frame byte for byte (the 7-token form, or the 6-token one without a
checksum), of the batch's topic and a partition ``>= 0``; ``<seq>`` is the sender's (the broker ignores
it; the Python client numbers them 0..count-1). So the broker checks the sub-records with the scanner of
its put burst path (``protocol.burst.scan_puts``, in C when built: lengths, checksums, the attribute
block), and stores each as its own record, the record a ``put`` stores. A batch is all or nothing: a count
that does not match the sub-records, a truncated or malformed sub-record, a wrong checksum, another topic,
a partition the topic does not have, more than ``limits.MAX_BATCH_MESSAGES`` messages: ``result 400``
naming the first fault, and nothing stored. The frame's ``<length>`` is a body's: at most the broker's
``limits.max_body_bytes``.

The reply to a stored batch is one ``result 200`` whose body lists its runs in order, a run being
consecutive sub-records stored in one partition with consecutive message ids and offsets::

    <first msgId> <partition> <first offset> <count>[;<first msgId> <partition> <first offset> <count>]...

so sub-record *k* of the batch is the *k*-th message the runs expand to (``expand_runs``).
"""

import re
from operator import itemgetter
from typing import NamedTuple

from metaq import limits, speedups
from metaq.errors import ClientError
from metaq.protocol.commands import NEEDS_HANDLER, TextCommand, register, token
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.integers import INT32_MAX, INT32_MIN, parse_int

_TOPIC, _PARTITION = itemgetter(0), itemgetter(1)

__all__ = ["PutBatch", "scan_batch", "encode_runs", "decode_runs", "expand_runs", "sub_record", "encode_sub_records"]


class PutBatch(NamedTuple):
    """``putb <topic> <count> <length> <opaque>\\r\\n<body>``: ``body`` holds ``count`` sub-records."""

    topic: str
    count: int
    body: bytes
    opaque: int


def _parse_putb(t):
    topic = t[1]
    count = parse_int(t[2], "count", 1, limits.MAX_BATCH_MESSAGES)
    opaque = parse_int(t[4], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: PutBatch(topic, count, body, opaque)


def _serialize_putb(e):
    return b"putb %s %d %d %d\r\n%s" % (token(e.topic).encode("utf-8"), e.count, len(e.body), e.opaque, e.body)


def sub_record(topic, partition, flag, data, checksum, seq):
    """One sub-record's bytes (``topic`` as bytes): the put frame a batch carries."""
    return b"put %s %d %d %d %d %d\r\n%s" % (topic, partition, len(data), flag, checksum, seq, data)


def encode_sub_records_py(topic, partition, payloads, seq0):
    """A batch's body from ``payloads`` (a sequence of bytes, flag 0, no attribute block): one checksummed
    sub-record per payload for ``partition`` of ``topic`` (bytes), numbered from ``seq0``. The reference of the C
    helper's ``encode_sub_records`` (``Producer.send_many``'s encoder), which is the same bytes without a Python
    object per message."""
    for k, data in enumerate(payloads):
        if type(data) is not bytes:
            raise TypeError("payload %d is %s, not bytes" % (k, type(data).__name__))
    return b"".join(sub_record(topic, partition, 0, data, metaq_checksum(data), seq0 + k)
                    for k, data in enumerate(payloads))


encode_sub_records = speedups.load("encode_sub_records", encode_sub_records_py)  # the C twin when built


register(TextCommand(
    "putb", PutBatch, (5,), "5 tokens (putb <topic> <count> <length> <opaque>)", _parse_putb, _serialize_putb,
    NEEDS_HANDLER, body=3,
    examples=(b"putb t 2 41 7\r\nput t 0 2 0 -1 0\r\nhiput t 1 3 0 -1 1\r\nabc",
              b"putb t 1 23 8\r\nput t 0 5 0 -1 0\r\nhello")))

_HEAD = re.compile(rb"put ([!-~]+) ([0-9]{1,10}) ([0-9]{1,10}) ([0-9]{1,10}) (?:(-1|[0-9]{1,10}) )?(-?[0-9]{1,10})\r\n")


def scan_batch(scan, e, max_body, max_line, partitions):
    """The checked frames of batch ``e`` (``scan``: ``protocol.burst.scan_puts``; ``partitions``: the topic's
    partition count), in ``scan_puts``' form with offsets into ``e.body``; ClientError (400) naming the first
    fault otherwise. Nothing here stores anything: a batch refused is refused whole."""
    body = e.body
    end = len(body)
    frames, stop = scan(body, 0, end, max_body, max_line, e.count)
    if stop < end and len(frames) < e.count:
        raise ClientError("putb: sub-record %d of %d (byte %d): %s; nothing was stored"
                          % (len(frames), e.count, stop, _why(body, stop, end, max_body, max_line)))
    if len(frames) != e.count or stop != end:
        raise ClientError("putb: the count says %d messages, the body holds %s; nothing was stored"
                          % (e.count, "%d" % len(frames) if stop == end else "more"))
    topic = e.topic.encode("utf-8")
    if set(map(_TOPIC, frames)) != {topic}:  # C loops: the scanner shares one object per run of a topic
        k = next(k for k, f in enumerate(frames) if f[0] != topic)
        raise ClientError("putb: sub-record %d of %d is for topic %s, the batch for %s; nothing was stored"
                          % (k, e.count, frames[k][0].decode("utf-8", "replace"), e.topic))
    if max(map(_PARTITION, frames)) >= partitions:
        k = next(k for k, f in enumerate(frames) if f[1] >= partitions)
        raise ClientError("putb: sub-record %d of %d is for partition %d, topic %s has partitions 0..%d; nothing "
                          "was stored" % (k, e.count, frames[k][1], e.topic, partitions - 1))
    return frames


def _why(body, pos, end, max_body, max_line):
    """Why the sub-record at ``body[pos:]`` was not taken, in words."""
    m = _HEAD.match(body, pos, end)
    if m is None:
        line_end = body.find(b"\r\n", pos, pos + max_line + 2)
        if line_end < 0:
            return "truncated or not a put line"
        return "not a put line of the batch's form (put <topic> <partition> <len> <flag> <checksum> <seq>)"
    length = int(m.group(3))
    if length > max_body:
        return "its body of %d bytes is over the limit of %d" % (length, max_body)
    if m.end() + length > end:
        return "truncated: its body of %d bytes runs past the batch" % length
    if m.end() - pos - 2 > max_line or max(int(m.group(2)), int(m.group(4))) > INT32_MAX:
        return "a number out of range"
    return "its checksum does not match its body, or its attribute block is malformed or holds reserved or " \
           "compression properties (send those as single puts)"


def encode_runs(runs):
    """A stored batch's reply body from its runs ``(first_id, partition, first_offset, count)``, in order."""
    return b";".join(b"%d %d %d %d" % run for run in runs)


def decode_runs(body):
    """The runs of a batch's reply body: ``[(first_id, partition, first_offset, count)]``; ValueError if it is
    not one."""
    runs = []
    for part in bytes(body).split(b";"):
        first_id, partition, offset, count = (int(x) for x in part.split(b" "))
        if count < 1 or partition < 0 or offset < 0:
            raise ValueError("a run of %d messages of partition %d from offset %d" % (count, partition, offset))
        runs.append((first_id, partition, offset, count))
    return runs


def expand_runs(runs):
    """``[(msg_id, partition, offset)]`` of each message of ``runs``, in the batch's order."""
    out = []
    for first_id, partition, offset, count in runs:
        out.extend((first_id + k, partition, offset + k) for k in range(count))
    return out
