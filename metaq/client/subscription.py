"""A consumer's subscriptions: the client-side filter of a topic, its handler, and partitions as the user names them."""

from typing import Callable, NamedTuple, Optional

from metaq import errors
from metaq.client.message import Partition
from metaq.filters.sql import SqlFilter, compile_sql
from metaq.filters.wire import tag_token
from metaq.filters.limits import MAX_FILTER_TAGS, MAX_TAG_EXPRESSION_BYTES

__all__ = ["Subscription", "make_filter", "broker_tags", "sql_filter", "as_partition"]


def make_filter(spec):
    """A ``message -> bool`` from ``spec``: None, a callable, an attribute string, or an iterable of them."""
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        return lambda message: message.attribute == spec
    try:
        wanted = frozenset(spec)
    except TypeError:
        raise errors.ClientError("filter must be a callable, an attribute string or strings, got %r"
                                 % (spec,)) from None
    if not all(isinstance(a, str) for a in wanted):
        raise errors.ClientError("filter attributes must be strings, got %r" % (spec,))
    return lambda message: message.attribute in wanted


def sql_filter(expression, spec):
    """``(SqlFilter, accept)`` of a SQL92 ``expression`` (None: ``(None, None)``): compiled here, so a bad one
    raises BadFilterExpression (a ClientError naming the position) at subscribe; ``accept`` evaluates it on a
    message's properties and its attribute as ``TAGS``, as the broker does, for a broker that cannot filter.
    ClientError when ``spec`` (an attribute filter) is given too: one filter per subscription."""
    if expression is None:
        return None, None
    if spec is not None:
        raise errors.ClientError("give a subscription filter or a SQL92 expression, not both")
    if not isinstance(expression, str):
        raise errors.ClientError("a SQL92 expression is a str, got %r" % (expression,))
    compiled = compile_sql(expression)

    def accept(message):
        props = dict(message.properties)
        tags = message.attribute
        if tags and "\x01" not in tags and "\x02" not in tags:
            props["TAGS"] = tags
        return compiled.matches(props)
    return compiled, accept


def broker_tags(spec):
    """The ``get_tags`` token that asks the broker to filter for ``spec`` (an attribute string or strings), or None
    when the broker cannot (a callable, no filter, an attribute a token cannot say: ``filters.wire.tag_token``,
    or a token past ``limits.MAX_TAG_EXPRESSION_BYTES`` or ``MAX_FILTER_TAGS`` tags): the client filters alone."""
    if spec is None or callable(spec):
        return None
    tags = [spec] if isinstance(spec, str) else list(spec)
    token = tag_token(tags)
    if token is None or len(token.encode("utf-8")) > MAX_TAG_EXPRESSION_BYTES or len(set(tags)) > MAX_FILTER_TAGS:
        return None
    return token


class Subscription(NamedTuple):
    """A topic a consumer subscribed: its handler, filter (``make_filter``) and the broker's share of it
    (``broker_tags``: the fetcher asks with ``get_tags``, docs/messaging.md "Tag filtering"; the filter still runs);
    ``orderly``: a failing message holds its partition (retried until it succeeds) instead of being parked."""

    topic: str
    handler: Callable
    accept: Optional[Callable]
    orderly: bool = False
    tags: Optional[str] = None
    priorities: int = 0  # a priority topic's levels (client/priorities.py), 0: none
    sql: Optional[SqlFilter] = None  # a SQL92 filter: the fetcher asks with get_sql (docs/messaging.md "SQL92 filters")


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
