"""Which RocketMQ half messages a check-back round asks about, and which it gives up on (pure; time passed in).

RocketMQ's rules (``TransactionalMessageServiceImpl#check``, ``BrokerConfig``), with the broker's clock:

* A round runs every ``transaction_check_interval_ms`` (RocketMQ 4's default 60 s).
* A half message is due once ``transaction_timeout_ms`` (6 s) have passed since it was stored, or, when its
  send carried the property ``CHECK_IMMUNITY_TIME_IN_SECONDS``, that many seconds (-1 or a value that is no
  number: the timeout). RocketMQ counts from the producer's born timestamp; we count from our own store time,
  so a producer's clock cannot make a message due early or never.
* A due message already checked ``transaction_check_max`` (15) times is given up: rolled back (RocketMQ
  discards it). Otherwise it is checked once more, and that check counts whether or not a producer of its
  group is online to receive it (RocketMQ counts it before it looks for a channel); without one the
  message simply waits for the next round.
* At most ``limit`` messages (``limits.MAX_CHECKS_PER_ROUND``) are acted on per round, the oldest first; the
  rest wait for the next round.
"""

from typing import NamedTuple

from metaq.transactions import limits as transactions_limits


class Round(NamedTuple):
    """What one round does: ``check`` and ``give_up`` hold half-message numbers, oldest first."""

    check: list
    give_up: list
    deferred: int  # due but past the round's limit: left for the next round


def immunity_ms(value):
    """The wait before the first check of a message whose ``CHECK_IMMUNITY_TIME_IN_SECONDS`` is ``value``
    (a property's text, or None when absent): that many seconds, capped at ``limits.MAX_CHECK_IMMUNITY_S``;
    the timeout for None, -1 or a value that is not a whole number."""
    if value is None:
        return -1
    try:
        seconds = int(value)
    except ValueError:
        return -1
    if seconds < 0:
        return -1
    return min(seconds, transactions_limits.MAX_CHECK_IMMUNITY_S) * 1000


def is_due(stored_ms, immunity, now_ms, timeout_ms):
    """Whether a message stored at ``stored_ms`` may be checked at ``now_ms``."""
    return now_ms - stored_ms >= (timeout_ms if immunity < 0 else immunity)


def plan_round(halves, now_ms, timeout_ms, check_max, limit=transactions_limits.MAX_CHECKS_PER_ROUND):
    """The ``Round`` for ``halves`` (objects with ``number``, ``stored_ms``, ``checks``, ``immunity_ms``)."""
    due = sorted((h for h in halves if is_due(h.stored_ms, h.immunity_ms, now_ms, timeout_ms)),
                 key=lambda h: (h.stored_ms, h.number))
    taken = due[:limit]
    check = [h.number for h in taken if h.checks < check_max]
    give_up = [h.number for h in taken if h.checks >= check_max]
    return Round(check, give_up, len(due) - len(taken))


def first_half_number(pending, now):
    """Where half-message numbers start in this run: past the pending ones and past any number an earlier run
    can have given (a thousand per millisecond of uptime), so a late end never finds a newer message under an
    old number."""
    return max(now * 1000, max(pending, default=0) + 1)


#: The producer group of a half message sent over gRPC (RocketMQ 5's proxy uses the topic as the group): the gRPC
#: port checks these back on its clients' Telemetry streams, the remoting port's check-back leaves them alone.
GRPC_GROUP_PREFIX = "%GRPC%"
