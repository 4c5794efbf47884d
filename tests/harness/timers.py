"""Timer test helpers: put_at, cancel, the timers listing, over a raw text connection."""

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.timers.wire import TimerCancelCommand, TimerList, TimerPut, parse_rows


def put_at(c, topic, payload, when, partition=0):
    flag, data = encode_payload(payload, None)
    return c.call(TimerPut(topic, partition, flag, data, c.opaque(), metaq_checksum(data), when))


def put_at_ok(c, topic, payload, when, partition=0):
    r = put_at(c, topic, payload, when, partition)
    assert isinstance(r, ev.Result) and r.code == 200, r
    msg_id, part, offset = (int(x) for x in r.body.split())
    assert offset == -1
    return msg_id, part


def cancel(c, msg_id):
    """``(code, outcome)``."""
    r = c.call(TimerCancelCommand(msg_id, c.opaque()))
    return r.code, r.body.decode()


def timers(c, topic="*", limit=1000):
    r = c.call(TimerList(topic, limit, c.opaque()))
    assert r.code == 200, r
    return parse_rows(r.body)
