"""The one decision every front-end asks before a group reads: may this group consume now, and with which
maximum of retries (docs/concepts.md "Per-group settings"). Pure: the group's settings (``table.GroupSettings``
or None) are passed in.

Front-ends: the text ``get``/``get_tags``/``get_sql``/``get_prio`` (server/text/dispatch.py), POP ``receive``
(pop/service.py: the text command and gRPC ReceiveMessage), RocketMQ remoting pulls, heartbeats and send-backs
(server/remoting/), gRPC's Settings and ReceiveMessage (rmq5/telemetry.py, rmq5/receives.py) and PullMessage
(rmq5/pulls.py).
"""

from typing import NamedTuple, Optional

from metaq.errors import ConsumptionDisabled

#: The broker id RocketMQ's pull answer suggests for its master (MixAll.MASTER_ID).
MASTER_ID = 0


class Decision(NamedTuple):
    """``refusal``: why the group may not consume now (None: it may); ``max_retries``: the group's redeliveries
    after the first before a dead letter (None: the front-end's default); ``slave_when_slow``: the slave a slow
    remoting pull is sent to (None: the master, as without settings)."""

    refusal: Optional[str]
    max_retries: Optional[int]
    slave_when_slow: Optional[int]


#: The Decision of a group without settings (the same for every such group).
_UNSET = Decision(None, None, None)


def decide(settings, group, broadcasting=False):
    """The Decision for ``group`` with ``settings`` (None: no entry, everything as without the table);
    ``broadcasting``: the reader is a RocketMQ consumer in BROADCASTING mode."""
    if settings is None:
        return _UNSET
    refusal = None
    if not settings.consumption_enabled:
        # RocketMQ's broker: NO_PERMISSION, "subscription group no permission, <group>"
        refusal = ("subscription group no permission, %s: its consumption is disabled (group setting "
                   "consumption_enabled=false)" % group)
    elif broadcasting and not settings.broadcast_allowed:
        refusal = ("the consumer group[%s] can not consume by broadcast way (group setting broadcast_allowed=false)"
                   % group)
    return Decision(refusal, settings.max_retries, settings.read_from_slave_when_slow)


def require(settings, group, broadcasting=False):
    """``decide``, raising ConsumptionDisabled (403; NO_PERMISSION on remoting; FORBIDDEN on gRPC) on a refusal."""
    d = decide(settings, group, broadcasting)
    if d.refusal is not None:
        raise ConsumptionDisabled(d.refusal)
    return d


def fifo(settings, asked):
    """Whether a group receives in order, one message of a message group at a time: what its client ``asked`` (a
    gRPC consumer's Settings) or the group's ``fifo`` setting (RocketMQ 5's clients leave it to the broker)."""
    return bool(asked) or (settings is not None and settings.fifo)


def max_attempts(settings, default):
    """Deliveries before a dead letter for POP and gRPC: the group's ``max_retries`` + 1 (the first delivery and
    its retries, as RocketMQ's proxy turns retryMaxTimes into its backoff policy's max attempts), else
    ``default``."""
    if settings is None or settings.max_retries is None:
        return default
    return settings.max_retries + 1


def max_reconsume_times(settings, requested, default):
    """A remoting send-back's maximum: the request's own maxReconsumeTimes when it carries one (``requested``), else
    the group's ``max_retries``, else the broker's ``default``."""
    if requested is not None:
        return requested
    if settings is not None and settings.max_retries is not None:
        return settings.max_retries
    return default


def suggest_broker(settings, backlog_bytes, memory_bytes):
    """The broker id a remoting pull answer suggests (RocketMQ's suggestWhichBrokerId): the group's slave when its
    backlog after this pull (``backlog_bytes``: the log's end less the last pulled record's position) is larger than
    the part of the log kept in memory (``memory_bytes``), else the master."""
    if settings is None or settings.read_from_slave_when_slow is None:
        return MASTER_ID
    return settings.read_from_slave_when_slow if backlog_bytes > memory_bytes else MASTER_ID
