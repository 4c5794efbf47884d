"""The client side of any delivery time (docs/messaging.md "Any delivery time", "Cancel"): ``Message(deliver_at=,
delay=)`` turned into ``put_at``'s ``when``, and ``Producer.cancel``."""

import datetime

from metaq.client.replies import reply_error
from metaq.errors import NotFound
from metaq.protocol.msgid import id_broker
from metaq.timers.wire import TimerCancelCommand

__all__ = ["when_of", "cancel"]


def _ms(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("%s must be a number, got %r" % (what, value))
    if value != value or value < 0 or value > 1e15:  # NaN, negative; 1e15 ms ~ year 33658, seconds ~ 31 M years
        raise ValueError("%s must be a number >= 0 (and not absurdly far), got %r" % (what, value))
    return int(value)


def when_of(deliver_at=None, delay=None):
    """``put_at``'s ``when`` token: ``deliver_at`` (a datetime — naive means local time — or epoch milliseconds)
    gives ``@<ms>``, ``delay`` (a timedelta or seconds) ``+<ms>``; None when neither. ValueError for both, a
    negative value or another type (the broker refuses a time too far ahead)."""
    if deliver_at is not None and delay is not None:
        raise ValueError("give deliver_at or delay, not both")
    if deliver_at is not None:
        if isinstance(deliver_at, datetime.datetime):
            return "@%d" % _ms(round(deliver_at.timestamp() * 1000), "deliver_at")
        if isinstance(deliver_at, float):
            raise ValueError("deliver_at is a datetime or whole epoch milliseconds (an int), got %r" % deliver_at)
        return "@%d" % _ms(deliver_at, "deliver_at (epoch milliseconds)")
    if delay is not None:
        if isinstance(delay, datetime.timedelta):
            return "+%d" % _ms(round(delay.total_seconds() * 1000), "delay")
        _ms(delay, "delay (seconds)")
        return "+%d" % round(delay * 1000)
    return None


def cancel(producer, msg_id, timeout):
    """``"cancelled"``, ``"delivered"``, ``"cancelled"`` (before) or ``"unknown"``: the broker that made ``msg_id``
    decides (exactly one of delivery and cancel wins). Raises MetaqError for a refusal or a broker not reached."""
    if isinstance(msg_id, bool) or not isinstance(msg_id, int):
        raise ValueError("a message id is an int, got %r" % (msg_id,))
    conn = producer.broker_connection(id_broker(msg_id))
    if conn is None:
        raise NotFound("broker %d (of message id %d) is not known to this producer" % (id_broker(msg_id), msg_id))
    reply = conn.call(TimerCancelCommand(msg_id, 0), timeout=timeout)
    if reply.code in (200, 404):
        return reply.body.decode("utf-8", "replace")
    raise reply_error(reply)
