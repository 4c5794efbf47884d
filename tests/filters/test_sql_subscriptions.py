"""The SQL92 subscriptions RocketMQ heartbeats register (filters/remoting.py): compiled once, replaced by the next
heartbeat, kept as their error when bad, and bounded by ``limits.MAX_SQL_SUBSCRIPTIONS`` and
``MAX_HEARTBEAT_SQL_SUBSCRIPTIONS`` at and one past; compiled expressions shared up to ``SQL_FILTER_CACHE``."""

import pytest

from metaq.filters import limits as filters_limits
from metaq.errors import BadFilterExpression, ClientError
from metaq.filters.remoting import SqlSubscriptions
from metaq.filters.sql import SqlFilter, compiled
from metaq.protocol.rocketmq.bodies import ConsumerData, SubscriptionData


def consumer(group, topic, expression, kind="SQL92"):
    return ConsumerData(group, subscriptions=(SubscriptionData(topic, expression, expression_type=kind),))


def test_registered_replaced_kept_as_error_and_dropped_by_a_tag_subscription():
    subs = SqlSubscriptions(lambda group: True)
    assert subs.get("g", "t") is None
    subs.heartbeat([consumer("g", "t", "a > 1")])
    first = subs.get("g", "t")
    assert isinstance(first, SqlFilter) and first.matches({"a": "2"})
    subs.heartbeat([consumer("g", "t", "a > 1")])
    assert subs.get("g", "t") is first  # the same expression is not compiled again
    subs.heartbeat([consumer("g", "t", "a >")])
    assert "at character 3" in subs.get("g", "t")
    subs.heartbeat([consumer("g", "t", "*", "TAG")])
    assert subs.get("g", "t") is None and len(subs) == 0


def test_the_pair_limit_at_and_one_past_and_dead_groups_make_room():
    live = set()
    subs = SqlSubscriptions(lambda group: group in live)
    n = filters_limits.MAX_SQL_SUBSCRIPTIONS
    subs.heartbeat([consumer("g%d" % i, "t", "a = 1") for i in range(n)])
    assert len(subs) == n
    live.update("g%d" % i for i in range(n))
    with pytest.raises(ClientError, match="the limit is %d" % n):
        subs.heartbeat([consumer("new", "t", "a = 1")])
    assert subs.get("new", "t") is None
    subs.heartbeat([consumer("g0", "t", "a = 2")])  # a pair already held is replaced, never refused
    assert subs.get("g0", "t").matches({"a": "2"})
    live.discard("g5")  # a group without a live member: its pair goes first
    subs.heartbeat([consumer("new", "t", "a = 1")])
    assert len(subs) == n and subs.get("g5", "t") is None and subs.get("new", "t") is not None


def test_a_heartbeat_carries_at_most_the_sql_subscription_limit():
    n = filters_limits.MAX_HEARTBEAT_SQL_SUBSCRIPTIONS
    at = [consumer("g%d" % i, "t", "a = %d" % i) for i in range(n)] + [consumer("tags", "t", "*", "TAG")]
    SqlSubscriptions.check(at)
    with pytest.raises(ClientError, match="at most %d SQL92 subscriptions, this one carries %d" % (n, n + 1)):
        SqlSubscriptions.check(at + [consumer("more", "t", "a = 1")])


def test_compiled_expressions_are_shared_up_to_the_cache_limit():
    n = filters_limits.SQL_FILTER_CACHE
    compiled.cache_clear()
    first = compiled("c = 0")
    for i in range(1, n):
        compiled("c = %d" % i)
    assert compiled("c = 0") is first  # n expressions: all kept
    compiled.cache_clear()
    first = compiled("c = 0")
    for i in range(1, n + 1):
        compiled("c = %d" % i)
    assert compiled("c = 0") is not first and compiled("c = 0") == first  # one past: the oldest compiled again
    with pytest.raises(BadFilterExpression):
        compiled("c =")
    assert compiled.cache_info().currsize <= n
