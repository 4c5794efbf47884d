"""Where a consumer group of any protocol is in a partition, and its lag: the one decision ``stats groups``,
``metaq-admin groups`` and ``metaq-spark-report`` show (docs/operating.md "Consumer groups and their lag"). Pure.

A ``Position`` is what a front-end's state says of one group in one partition; ``kind`` names the protocol's model:

``offsets``       a committed offset (text ``offset`` commits, RocketMQ remoting and gRPC pull consumers): ``position``
                  the committed offset
``pop``           a RocketMQ 5 POP group (gRPC SimpleConsumer, text ``receive``): ``position`` its lowest offset not
                  acknowledged, ``done_ahead`` the offsets above it acknowledged out of order, ``in_flight`` those
                  received and not acknowledged (invisible, or visible again and not yet received again)
``mqtt_shared``   an MQTT shared subscription's group (``$share/<name>/<filter>``, named so): ``position`` the next
                  offset some member is handed
``mqtt_session``  an MQTT persistent session (named by its client id), connected or offline: ``position`` the next
                  offset it is sent, ``in_flight`` its QoS 1 and 2 messages sent and not acknowledged

A group's lag is the messages of the partition from its position to the end it has not consumed (``lag``). An MQTT
position is in the metaq topic its filter reads: the lag counts every message of that partition past it, the ones of
other MQTT names of the topic too.
"""

import heapq
from typing import NamedTuple, Optional

from metaq.protocol.stats import GroupRow, group_line

__all__ = ["KINDS", "Position", "lag", "rows"]

KINDS = ("offsets", "pop", "mqtt_shared", "mqtt_session")


class Position(NamedTuple):
    group: str
    kind: str
    topic: str
    partition: int
    position: int
    committed_ms: Optional[int] = None
    in_flight: Optional[int] = None
    done_ahead: int = 0


def lag(kind, position, end, done_ahead=0):
    """The messages a group of ``kind`` at ``position`` has still to consume of a partition ending at ``end``: those
    from its position to the end, less the ones it acknowledged ahead of it (``done_ahead``: POP's out-of-order
    acknowledgements; 0 for the other kinds). Never below 0 (a position past the end after a cut log)."""
    if kind not in KINDS:
        raise ValueError("unknown group kind %r (known: %s)" % (kind, ", ".join(KINDS)))
    return max(0, end - position - done_ahead)


def rows(positions, end_of, most, most_bytes=None):
    """``(GroupRows, left_out)``: a row per position with its partition's end (``end_of(topic, partition)``; None:
    the partition is gone, the position left out) and its ``lag``; at most ``most`` rows whose lines
    (``stats.group_line``) hold at most ``most_bytes`` together (None: no bound; the callers that bound their answers
    another way), the most behind kept, sorted by group, topic, partition and kind; ``left_out`` the rows past
    them."""
    scored = []
    for p in positions:
        end = end_of(p.topic, p.partition)
        if end is not None:
            scored.append((lag(p.kind, p.position, end, p.done_ahead), end, p))
    kept = scored
    if most is not None and len(scored) > most:
        kept = heapq.nlargest(most, scored, key=_first)
    elif most is not None or most_bytes is not None:
        kept = sorted(scored, key=_first, reverse=True)
    out = [GroupRow(p.group, p.topic, p.partition, p.position, end, n, p.committed_ms, p.kind, p.in_flight)
           for n, end, p in kept]
    if most_bytes is not None:
        used = 0
        for i, r in enumerate(out):
            used += len(group_line(r).encode("utf-8")) + 2
            if used > most_bytes:
                out = out[:i]
                break
    out.sort(key=lambda r: (r.group, r.topic, r.partition, r.kind))
    return out, len(scored) - len(out)


def _first(item):
    return item[0]
