"""Delayed-delivery test helpers: put with a delay level, the delay stats, a partition's records."""

from metaq.protocol import stats as stats_codec
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from tests.harness.broker import consume_all


def put_delayed(c, topic, payload, level, partition=0, attribute=None, checksum=None):
    flag, data = encode_payload(payload, attribute)
    crc = metaq_checksum(data) if checksum is None else checksum
    return c.call(ev.DelayedPut(topic, partition, flag, data, c.opaque(), crc, level))


def put_delayed_ok(c, topic, payload, level, partition=0, attribute=None):
    r = put_delayed(c, topic, payload, level, partition, attribute)
    assert isinstance(r, ev.Result) and r.code == 200, r
    msg_id, part, offset = (int(x) for x in r.body.split())
    assert offset == -1 and (partition == -1 or part == partition)
    return msg_id, part


def delay_stats(c):
    """``{level: {"pending": n, "next_due_ms": v, "delivered": n}}`` and the totals of ``stats delay``."""
    rows, totals = stats_codec.parse_delay(c.stats("delay").encode())
    levels = {r.level: {"delay": r.delay, "pending": str(r.pending),
                        "next_due_ms": "-" if r.next_due_ms is None else str(r.next_due_ms),
                        "delivered": str(r.delivered)} for r in rows}
    return levels, totals


def records(c, topic, partitions):
    return [rec for p in partitions for rec in consume_all(c, topic, p)]
