"""Store configuration: topics (names and ``*`` patterns) and the store's knobs.

The server builds a ``StoreConfig`` from its YAML; tests build one directly.
The defaults below are the only ones: the broker's schema (``metaq.server.config``,
``store:``) takes its defaults from here. Every check raises ``ConfigError`` naming
the setting.
"""

import os
import re
from dataclasses import dataclass, field
from typing import List

from metaq import limits
from metaq.idempotence import limits as idempotence_limits
from metaq.keys import limits as keys_limits
from metaq.topics import limits as topics_limits
from metaq.errors import ConfigError, InvalidTopic, UnknownTopic

FLUSH_MODES = ("sync", "async")

#: Smallest segment the store accepts (tests use 4 KiB segments).
MIN_SEGMENT_SIZE = 1024


@dataclass
class TopicSpec:
    """A topic name, or a pattern where ``*`` matches any run of characters, and its partition count."""

    name: str
    partitions: int

    @property
    def is_pattern(self):
        return "*" in self.name


def _default_topics():
    return [TopicSpec("*", 1)]


@dataclass
class StoreConfig:
    """Everything the store needs; time never comes from here (it is passed as ``now_ms``)."""

    data_dir: str
    broker_id: int = 0
    topics: List[TopicSpec] = field(default_factory=_default_topics)
    segment_size: int = 1 << 30
    index_file_units: int = 1 << 20
    key_index_slots: int = 1 << 20  # hash slots of one key index file (keys/files.py): 4 MiB
    key_index_entries: int = 2 << 20  # entries of one key index file: 56 MiB
    flush: str = "sync"
    flush_every_messages: int = 1000
    flush_interval_ms: int = 1000
    checkpoint_interval_ms: int = 1000
    retention_hours: float = 168.0
    disk_warn_ratio: float = 0.75
    disk_danger_ratio: float = 0.90
    max_transfer_size: int = limits.MAX_TRANSFER_BYTES
    force_recovery: bool = False
    max_topics: int = topics_limits.MAX_TOPICS
    max_partitions: int = topics_limits.MAX_TOTAL_PARTITIONS
    # idempotent producers (idempotence/window.py)
    producer_ttl_s: float = idempotence_limits.IDEMPOTENT_PRODUCER_TTL_MS / 1000.0

    def __post_init__(self):
        self.data_dir = os.path.abspath(os.fspath(self.data_dir))
        self.topics = [t if isinstance(t, TopicSpec) else TopicSpec(*t) for t in self.topics]
        self.validate()

    def validate(self):
        if not 0 <= self.broker_id <= limits.MAX_BROKER_ID:
            raise ConfigError("broker_id must be 0..%d, got %r" % (limits.MAX_BROKER_ID, self.broker_id))
        if self.segment_size < MIN_SEGMENT_SIZE:
            raise ConfigError("segment_size must be at least %d bytes, got %r" % (MIN_SEGMENT_SIZE, self.segment_size))
        if self.index_file_units < 1:
            raise ConfigError("index_file_units must be at least 1, got %r" % (self.index_file_units,))
        if self.key_index_slots < 1 or self.key_index_entries < keys_limits.MAX_KEYS_PER_MESSAGE:
            raise ConfigError("key_index_slots must be at least 1 and key_index_entries at least %d"
                              % keys_limits.MAX_KEYS_PER_MESSAGE)
        if self.flush not in FLUSH_MODES:
            raise ConfigError("flush must be one of %s, got %r" % ("/".join(FLUSH_MODES), self.flush))
        for name in ("flush_every_messages", "flush_interval_ms", "checkpoint_interval_ms", "max_transfer_size",
                     "max_topics", "max_partitions"):
            if getattr(self, name) < 1:
                raise ConfigError("%s must be positive, got %r" % (name, getattr(self, name)))
        if not self.producer_ttl_s > 0:
            raise ConfigError("producer_ttl_s must be positive, got %r" % (self.producer_ttl_s,))
        if not self.retention_hours > 0:
            raise ConfigError("retention_hours must be positive, got %r" % (self.retention_hours,))
        for name in ("disk_warn_ratio", "disk_danger_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError("%s must be in (0, 1], got %r" % (name, getattr(self, name)))
        for spec in self.topics:
            _check_spec(spec)

    @property
    def retention_ms(self):
        return self.retention_hours * 3600_000.0


def _check_spec(spec):
    try:
        limits.validate_topic(spec.name.replace("*", "x"))
    except InvalidTopic as exc:
        raise ConfigError("topics: %s" % exc) from None
    if not 1 <= spec.partitions <= limits.MAX_PARTITIONS:
        raise ConfigError("topics: %r must have 1..%d partitions, got %r"
                          % (spec.name, limits.MAX_PARTITIONS, spec.partitions))


class TopicTable:
    """Resolves a topic name to its partition count: exact names first, then patterns in order."""

    def __init__(self, specs):
        self._exact = {}
        self._patterns = []
        for spec in specs:
            if spec.is_pattern:
                regex = ".*".join(re.escape(piece) for piece in spec.name.split("*"))
                self._patterns.append((re.compile(regex), spec.partitions))
            else:
                self._exact.setdefault(spec.name, spec.partitions)
        self._cache = {}

    @property
    def exact_names(self):
        return list(self._exact)

    def partitions_of(self, topic):
        """Partition count of ``topic``; raises InvalidTopic or UnknownTopic."""
        count = self._cache.get(topic)
        if count is not None:
            return count
        limits.validate_topic(topic)
        count = self._exact.get(topic)
        if count is None:
            for regex, n in self._patterns:
                if regex.fullmatch(topic):
                    count = n
                    break
        if count is None:
            raise UnknownTopic("The server does not accept topic %s" % topic)
        if len(self._cache) < 100_000:
            self._cache[topic] = count
        return count
