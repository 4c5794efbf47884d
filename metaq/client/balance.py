"""Partition assignment for consumer groups: pure functions, no IO (reference §5.3).

Every consumer of a group computes its own share from the same two lists (the
group's consumer ids and the topic's ``"<brokerId>-<partition>"`` strings), so
the functions must give the same answer on every host regardless of the order
the lists were read in. Both lists are sorted the way MetaQ's Java client sorts
them (``String.compareTo``: UTF-16 code units), so ``"0-10"`` comes before
``"0-2"`` and a Python consumer agrees with Java consumers in the same group.
"""


def java_sorted(strings):
    """Distinct ``strings`` in Java ``String.compareTo`` order (UTF-16 code units)."""
    return sorted(set(strings), key=_utf16_key)


def _utf16_key(s):
    return s.encode("utf-16-be", "surrogatepass")


def range_share(index, consumers, partitions):
    """``(start, count)`` of the slice consumer number ``index`` takes from ``partitions`` items.

    Kafka/MetaQ range rule: ``n = P // C`` and ``extra = P % C``; consumer ``i``
    takes ``n + (1 if i < extra else 0)`` items starting at ``n*i + min(i, extra)``.
    """
    if consumers <= 0 or not 0 <= index < consumers:
        raise ValueError("consumer index %r outside 0..%d" % (index, consumers - 1))
    n, extra = divmod(partitions, consumers)
    return n * index + min(index, extra), n + (1 if index < extra else 0)


def range_assign(consumer_ids, partitions, me):
    """The partitions ``me`` owns under MetaQ's default (range) strategy, in sorted order.

    ``consumer_ids`` and ``partitions`` are strings in any order (duplicates are
    ignored); the result is ``[]`` when ``me`` is not among the consumers, or
    when there are more consumers than partitions and ``me`` sorts late.

    >>> range_assign(["c1", "c2", "c3"], [str(i) for i in range(10)], "c2")
    ['4', '5', '6']
    """
    consumers = java_sorted(consumer_ids)
    if me not in consumers:
        return []
    parts = java_sorted(partitions)
    start, count = range_share(consumers.index(me), len(consumers), len(parts))
    return parts[start:start + count]


def range_assignment(consumer_ids, partitions):
    """Every consumer's share at once: ``{consumer_id: [partition, ...]}`` (all consumers present)."""
    return {c: range_assign(consumer_ids, partitions, c) for c in java_sorted(consumer_ids)}
