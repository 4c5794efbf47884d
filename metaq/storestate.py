"""The store with the features' state it holds: the one list of the makers ``MessageStore`` is opened with.

The store keeps the topics' catalog, the consumer offsets, the groups' settings, the key index and the idempotent
producers' windows, and reads filtered records (store/features.py), but imports none of the features that define
them, since each builds on the store's files, records and follower. This module, at the package root above both,
names them once; whatever opens a store (the broker, tools, tests) opens it with ``open_store``.
"""

from metaq.filters import reads as filtered
from metaq.groups.table import GroupTable
from metaq.idempotence.state import Idempotence
from metaq.keys.index import KeyIndex
from metaq.offsets.table import ConsumerOffsets
from metaq.store.features import FeatureState
from metaq.store.store import MessageStore
from metaq.topics.retention import apply_topic_retention
from metaq.topics.state import TopicOps
from metaq.topics.table import TopicCatalog, TopicTableFile


def topic_catalog(configured, data_dir):
    """The topics' catalog: the config file's names (``configured``), and the table in ``data_dir``, which wins."""
    return TopicCatalog(configured, TopicTableFile(data_dir))


#: The features' state every store holds.
FEATURES = FeatureState(topic_catalog=topic_catalog, topic_ops=TopicOps, topic_retention=apply_topic_retention,
                        consumer_offsets=ConsumerOffsets, group_table=GroupTable, key_index=KeyIndex,
                        idempotence=Idempotence, read_tagged=filtered.read_tagged,
                        index_ranges=filtered.index_ranges)


def open_store(config, now_ms, producer_quota=None, offsets_quota=None):
    """``MessageStore.open`` with the features' state (``FEATURES``); raises as it does."""
    return MessageStore.open(config, now_ms, FEATURES, producer_quota, offsets_quota)
