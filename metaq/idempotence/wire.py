"""The text protocol's ``put_idem`` command (docs/spark.md "The idempotent producer"), sans-IO::

    put_idem <topic> <partition> <len> <flag> <checksum> <pid> <seq> <opaque>\\r\\n<body>
        partition explicit (0..2^31-1), pid 1..2^63-1, seq 0..2^63-1;
        answered as a put: 200 "<msgId> <partition> <offset>"; a duplicate's body has a fourth token, "dup"
        (DUPLICATE_MARK), and names the original

Its event, parser (the general one and the one-step line parser), serializer and registration in
``protocol.commands`` (``metaq.textcommands`` lists this module, so the registry is complete); its burst scanner is
``idempotence.burst``. Also ``putb_idem``, a batch of put_idem frames answered once (below; docs/text-protocol.md
"putb_idem"). The identity the stored record carries is ``idempotence.records``'.
"""

import re
from typing import NamedTuple

from metaq import speedups
from metaq.idempotence import limits as idempotence_limits
from metaq.idempotence.burst import scan_idem_burst
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.events import UNCHECKED
from metaq.protocol.commands import NEEDS_HANDLER, TextCommand, register, token
from metaq.protocol.integers import parse_int

__all__ = ["IdempotentPut", "DUPLICATE_MARK", "IdempotentBatch", "idem_sub_record", "encode_idem_sub_records",
           "encode_idem_sub_records_py", "encode_idem_runs", "decode_idem_runs"]

#: The fourth token of a ``put_idem`` reply that answers a duplicate.
DUPLICATE_MARK = b"dup"

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MAX = 2**63 - 1


class IdempotentPut(NamedTuple):
    """``put_idem topic partition len flag checksum pid seq opaque\\r\\n<body>``: a put stored at most once per
    ``(pid, topic, partition, seq)``.

    ``partition`` is explicit (0..2^31-1), ``producer_id`` 1..2^63-1, ``sequence`` 0..2^63-1. Reply as a
    put's, ``msgId partition offset``; a duplicate's reply names the original and ends with `` dup``.
    """

    topic: str
    partition: int
    flag: int
    body: bytes
    opaque: int
    checksum: int
    producer_id: int
    sequence: int


#: The put_idem line, all ASCII, matched in one step (the general path accepts exactly the same lines).
_FAST_PUT_IDEM = re.compile(rb"put_idem ([!-~]+) ([0-9]{1,10}) ([0-9]{1,10}) (-?[0-9]{1,10}) (-1|[0-9]{1,10}) "
                            rb"([0-9]{1,19}) ([0-9]{1,19}) (-?[0-9]{1,11})")


def _fast_put_idem(raw):
    """(build, length) for a well-formed put_idem line, or None to use the general path (which explains)."""
    m = _FAST_PUT_IDEM.fullmatch(raw)
    if m is None:
        return None
    topic, partition, length, flag, checksum, pid, seq, opaque = m.groups()
    partition, flag, checksum, pid, seq, opaque = (int(partition), int(flag), int(checksum), int(pid), int(seq),
                                                   int(opaque))
    if (partition > _INT32_MAX or checksum > _INT32_MAX or not 1 <= pid <= _INT64_MAX or seq > _INT64_MAX
            or not (_INT32_MIN <= flag <= _INT32_MAX and _INT32_MIN <= opaque <= _INT32_MAX)):
        return None
    topic = topic.decode("ascii")
    return (lambda body: IdempotentPut(topic, partition, flag, body, opaque, checksum, pid, seq)), int(length)


def _parse_put_idem(t):
    topic = t[1]
    partition = parse_int(t[2], "partition", 0, _INT32_MAX)  # explicit: a sequence belongs to one partition
    flag = parse_int(t[4], "flag", _INT32_MIN, _INT32_MAX)
    checksum = parse_int(t[5], "checksum", UNCHECKED, _INT32_MAX)
    pid = parse_int(t[6], "producer id", 1, _INT64_MAX)
    seq = parse_int(t[7], "sequence", 0, _INT64_MAX)
    opaque = parse_int(t[8], "opaque", _INT32_MIN, _INT32_MAX)
    return lambda body: IdempotentPut(topic, partition, flag, body, opaque, checksum, pid, seq)



def _serialize_put_idem(e):
    head = "put_idem %s %d %d %d %d %d %d %d\r\n" % (
        token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.producer_id, e.sequence, e.opaque)
    return b"".join((head.encode("utf-8"), e.body))


register(TextCommand(
    "put_idem", IdempotentPut, (9,), "9 tokens (put_idem <topic> <partition> <len> <flag> <checksum> <pid> <seq> "
    "<opaque>)", _parse_put_idem, _serialize_put_idem, NEEDS_HANDLER, body=3, fast_line=_fast_put_idem,
    burst=scan_idem_burst,
    examples=(b"put_idem t 0 2 0 -1 7 0 1\r\nhi", b"put_idem t 1 2 0 5 9223372036854775807 12 -4\r\nhi")))


# -- putb_idem: a batch of idempotent puts ---------------------------------------------------------------------------
#
#     putb_idem <topic> <count> <length> <opaque>\r\n<length bytes: count put_idem frames>
#
# Each sub-record is a ``put_idem`` frame byte for byte, of the batch's topic, all of one producer id, the
# sequences of each partition consecutive in frame order. Answered once: ``result 200`` with the runs of
# ``protocol.putbatch`` (``<first msgId> <partition> <first offset> <count>``), a run of duplicates ending with
# `` dup``; or one error naming the first bad sub-record, nothing stored.


class IdempotentBatch(NamedTuple):
    """``putb_idem <topic> <count> <length> <opaque>\\r\\n<body>``: ``body`` holds ``count`` put_idem frames."""

    topic: str
    count: int
    body: bytes
    opaque: int


def _parse_putb_idem(t):
    topic = t[1]
    count = parse_int(t[2], "count", 1, idempotence_limits.MAX_IDEMPOTENT_BATCH_MESSAGES)
    opaque = parse_int(t[4], "opaque", _INT32_MIN, _INT32_MAX)
    return lambda body: IdempotentBatch(topic, count, body, opaque)


def _serialize_putb_idem(e):
    return b"putb_idem %s %d %d %d\r\n%s" % (token(e.topic).encode("utf-8"), e.count, len(e.body), e.opaque, e.body)


def idem_sub_record(topic, partition, flag, data, checksum, pid, seq):
    """One sub-record of a ``putb_idem`` (``topic`` as bytes): the put_idem frame, opaque 0."""
    return b"put_idem %s %d %d %d %d %d %d 0\r\n%s" % (topic, partition, len(data), flag, checksum, pid, seq, data)


def encode_idem_sub_records_py(topic, partition, payloads, pid, seq0):
    """A batch's body from ``payloads`` (bytes, flag 0, no attribute block): one checksummed put_idem frame per
    payload for ``partition`` of ``topic`` (bytes), sequences ``seq0, seq0 + 1, ...``. The reference of the C
    helper's ``encode_idem_sub_records`` (the idempotent ``send_many``'s encoder), the same bytes without a
    Python object per message (it raises OverflowError for a number past 64 bits, which no broker accepts)."""
    for k, data in enumerate(payloads):
        if type(data) is not bytes:
            raise TypeError("payload %d is %s, not bytes" % (k, type(data).__name__))
    return b"".join(idem_sub_record(topic, partition, 0, data, metaq_checksum(data), pid, seq0 + k)
                    for k, data in enumerate(payloads))


encode_idem_sub_records = speedups.load("encode_idem_sub_records", encode_idem_sub_records_py)  # the C twin


def encode_idem_runs(runs):
    """A stored batch's reply body from its runs ``(first_id, partition, first_offset, count, duplicate)``."""
    return b";".join(b"%d %d %d %d dup" % run[:4] if run[4] else b"%d %d %d %d" % run[:4] for run in runs)


def decode_idem_runs(body):
    """``[(first_id, partition, first_offset, count, duplicate)]`` of a ``putb_idem`` reply; ValueError if it is
    not one (a duplicate older than the window has offset -1: its own run of 1)."""
    runs = []
    for part in bytes(body).split(b";"):
        words = part.split(b" ")
        dup = len(words) == 5 and words[4] == DUPLICATE_MARK
        if len(words) != 4 and not dup:
            raise ValueError("not a run: %r" % part[:80])
        first_id, partition, offset, count = (int(x) for x in words[:4])
        if count < 1 or partition < 0 or offset < -1 or (offset == -1 and not (dup and count == 1)):
            raise ValueError("a run of %d messages of partition %d from offset %d" % (count, partition, offset))
        runs.append((first_id, partition, offset, count, dup))
    return runs


register(TextCommand(
    "putb_idem", IdempotentBatch, (5,), "5 tokens (putb_idem <topic> <count> <length> <opaque>)", _parse_putb_idem,
    _serialize_putb_idem, NEEDS_HANDLER, body=3,
    examples=(b"putb_idem t 2 58 7\r\nput_idem t 0 2 0 -1 7 0 0\r\nhiput_idem t 0 2 0 -1 7 1 0\r\nho",
              b"putb_idem t 1 29 8\r\nput_idem t 1 2 0 -1 9 5 0\r\nhi")))
