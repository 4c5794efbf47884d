"""A consumer's subscriptions: the client-side filter of a topic, its handler, and partitions as the user names them."""

from typing import Callable, NamedTuple, Optional

from metaq import errors
from metaq.client.message import Partition

__all__ = ["Subscription", "make_filter", "as_partition"]


def make_filter(spec):
    """A ``message -> bool`` from ``spec``: None, a callable, an attribute string, or an iterable of them."""
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        return lambda message: message.attribute == spec
    try:
        wanted = frozenset(spec)
    except TypeError:
        raise errors.ClientError("filter must be a callable, an attribute string or strings, got %r" % (spec,)) from None
    if not all(isinstance(a, str) for a in wanted):
        raise errors.ClientError("filter attributes must be strings, got %r" % (spec,))
    return lambda message: message.attribute in wanted


class Subscription(NamedTuple):
    """A topic a consumer subscribed: its handler and filter (``make_filter``); ``orderly``: a failing message
    holds its partition (retried until it succeeds) instead of being parked."""

    topic: str
    handler: Callable
    accept: Optional[Callable]
    orderly: bool = False


def as_partition(partition):
    """A Partition from a Partition, ``(broker_id, partition)`` or ``"b-p"``; InvalidPartition otherwise."""
    if isinstance(partition, Partition):
        return partition
    if isinstance(partition, tuple) and len(partition) == 2:
        return Partition(int(partition[0]), int(partition[1]))
    try:
        return Partition.parse(partition)
    except ValueError as exc:
        raise errors.InvalidPartition(str(exc)) from None
