"""What the store holds of the features' state, handed to ``MessageStore.open`` by whatever opens a store.

The store keeps the topics' catalog, the consumer offsets, the groups' settings, the key index and the idempotent
producers' windows with its log (it opens, follows, checkpoints and recovers them), and reads filtered records by
its index units; each is defined in its feature's package (topics/, offsets/, groups/, keys/, idempotence/,
filters/) on the store's files, records and follower. So the store imports no feature: ``metaq.storestate``, above
both, names each one's maker once in a ``FeatureState`` and opens stores with it.
"""

from typing import Callable, NamedTuple


class FeatureState(NamedTuple):
    """The makers of the features' state, called by ``MessageStore`` with what the store owns."""

    #: ``(configured TopicTable, data_dir)`` -> the topics' catalog (topics/table.py)
    topic_catalog: Callable
    #: ``(dirs, catalog, partitions, quota, forget_writers)`` -> create/alter/delete (topics/state.py)
    topic_ops: Callable
    #: ``(log, partitions, topics with levels, now_ms, raised)`` -> index files deleted (topics/retention.py)
    topic_retention: Callable
    #: ``(dirs, quota=offsets_quota)`` -> the committed offsets (offsets/table.py)
    consumer_offsets: Callable
    #: ``(data_dir)`` -> the per-group settings (groups/table.py)
    group_table: Callable
    #: ``(dirs, slots, entries)`` -> the key index, a follower of the log (keys/index.py)
    key_index: Callable
    #: ``(root, log, partition_of, put, written, ttl_ms, producer_quota)`` -> the producers' windows
    #: (idempotence/state.py)
    idempotence: Callable
    #: ``(log, partition index, offset, filter, max_count, max_bytes, max_units)`` -> a filtered read
    #: (filters/reads.py)
    read_tagged: Callable
    #: ``(partition index, offset, max_units)`` -> the index bytes a filtered read reads (filters/reads.py)
    index_ranges: Callable
