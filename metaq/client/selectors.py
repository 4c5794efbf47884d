"""Partition selectors: which partition a producer sends a message to.

A selector is any object with ``select(topic, partitions, message) -> Partition``
(``partitions`` is a non-empty list sorted by (broker_id, partition)), or a
plain callable with the same arguments. A selector whose ``ordered`` attribute
is true (``KeySelector``) asks the producer to keep a message on its chosen
partition: a failed send is retried on that partition only, never moved.
"""

import itertools
import random
import zlib

__all__ = ["RoundRobinSelector", "RandomSelector", "KeySelector", "CallableSelector", "as_selector"]


class RoundRobinSelector:
    """MetaQ's default: a counter, ``partitions[counter % len(partitions)]``."""

    ordered = False

    def __init__(self, start=0):
        self._counter = itertools.count(start)

    def select(self, topic, partitions, message):
        """The next partition in turn."""
        return partitions[next(self._counter) % len(partitions)]


class RandomSelector:
    """A uniformly random partition (``seed`` makes the sequence repeatable)."""

    ordered = False

    def __init__(self, seed=None):
        self._random = random.Random(seed)

    def select(self, topic, partitions, message):
        """A random partition."""
        return self._random.choice(partitions)


class KeySelector:
    """Same key, same partition: ``zlib.crc32(key bytes) % len(partitions)``, so messages with one key stay in order.

    The hash is stable across processes and Python versions (unlike ``hash()``).
    A message without a key raises ValueError. Messages keep their partition
    only while the partition list stays the same: when brokers join or leave,
    keys are spread over the new list.
    """

    ordered = True

    def select(self, topic, partitions, message):
        """The partition of ``message.key``."""
        key = message.key_bytes()
        if key is None:
            raise ValueError("KeySelector needs a message key (Message(..., key=...)) for topic %r" % (topic,))
        return partitions[zlib.crc32(key) % len(partitions)]


class CallableSelector:
    """Wraps a plain function ``fn(topic, partitions, message) -> Partition`` as a selector."""

    def __init__(self, fn, ordered=False):
        self.fn = fn
        self.ordered = ordered

    def select(self, topic, partitions, message):
        """Whatever ``fn`` returns."""
        return self.fn(topic, partitions, message)


def as_selector(selector):
    """A selector object for ``selector``: None gives RoundRobinSelector; an object with ``select`` is kept;
    a plain callable is wrapped. TypeError for anything else."""
    if selector is None:
        return RoundRobinSelector()
    if callable(getattr(selector, "select", None)):
        return selector
    if callable(selector):
        return CallableSelector(selector, getattr(selector, "ordered", False))
    raise TypeError("selector must have select(topic, partitions, message) or be callable, got %r" % (selector,))
