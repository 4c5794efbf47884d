"""The text protocol's ``put_idem`` command (docs/spark.md "The idempotent producer"), sans-IO::

    put_idem <topic> <partition> <len> <flag> <checksum> <pid> <seq> <opaque>\\r\\n<body>
        partition explicit (0..2^31-1), pid 1..2^63-1, seq 0..2^63-1;
        answered as a put: 200 "<msgId> <partition> <offset>"; a duplicate's body has a fourth token, "dup"
        (DUPLICATE_MARK), and names the original

Its event, parser (the general one and the one-step line parser), serializer and registration in
``protocol.commands`` (``protocol.text`` imports this module, so the registry is complete); its burst scanner is
``idempotence.burst``. The identity the stored record carries is ``idempotence.records``'.
"""

import re
from typing import NamedTuple

from metaq.idempotence.burst import scan_idem_burst
from metaq.protocol.events import UNCHECKED
from metaq.protocol.commands import NEEDS_HANDLER, TextCommand, register, token
from metaq.protocol.integers import parse_int

__all__ = ["IdempotentPut", "DUPLICATE_MARK"]

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
