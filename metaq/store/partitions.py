"""``Partitions``: the store's table of partition indexes, and which of them puts may go to.

Every ``PartitionIndex`` the store holds is here by ``(topic, partition)``; the writers are the ones a put has
already been checked for (the topic's settings, the quota), so later puts skip those checks. The store and the
parts of it that change the table (topic changes, recovery, replication) do so through these methods; the others
read it. A partition created here counts in the quota; a topic dropped here leaves it.
"""

from metaq.store.index import PartitionIndex


class Partitions:
    def __init__(self, dirs, units_per_file, quota):
        """``dirs``: the DataDir; ``units_per_file``: index units of a new index file; ``quota``: the TopicQuota."""
        self._dirs = dirs
        self._units_per_file = units_per_file
        self._quota = quota
        self._all = {}  # (topic, partition) -> PartitionIndex, every partition with an index (never replaced: ``get``)
        #: ``get(key)``: the PartitionIndex of ``key`` (``(topic, partition)``), or None. The dict's own lookup.
        self.get = self._all.get
        self._writers = {}  # (topic, partition) -> PartitionIndex, checked for puts (never replaced: ``writer``)
        #: ``writer(key)``: the PartitionIndex of ``key`` if puts to it were checked already (``hold_writer``), else
        #: None. The dict's own lookup: a burst asks once per run, with no Python frame of ours.
        self.writer = self._writers.get
        self.made = 0  # moves whenever a partition appears (added, made) or a topic's go (``drop``)
        self.made_listeners = []  # each called with no argument whenever ``made`` moves (``_moved``)

    # -- reading ----------------------------------------------------------------

    def __getitem__(self, key):
        return self._all[key]

    def __contains__(self, key):
        return key in self._all

    def __len__(self):
        return len(self._all)

    def keys(self):
        """A read-only view of every ``(topic, partition)``."""
        return self._all.keys()

    def values(self):
        """A read-only view of every PartitionIndex."""
        return self._all.values()

    def items(self):
        """A read-only view of every ``((topic, partition), PartitionIndex)``."""
        return self._all.items()

    def of(self, topic):
        """``{partition: PartitionIndex}`` of ``topic``."""
        return {n: p for (t, n), p in self._all.items() if t == topic}

    def topics(self):
        """The names of every topic with a partition here."""
        return {t for t, _n in self._all}

    # -- changes ----------------------------------------------------------------

    def add(self, p):
        """Take ``p``, a PartitionIndex loaded from the data dir."""
        self._all[p.key] = p
        self._moved()
        self._quota.added(p.topic)

    def make(self, topic, partition):
        """The PartitionIndex of ``topic``-``partition``, created (empty, counted in the quota) if there is none."""
        p = self._all.get((topic, partition))
        if p is None:
            p = PartitionIndex(self._dirs, topic, partition, self._units_per_file)
            self._all[p.key] = p
            self._moved()
            self._quota.added(topic)
        return p

    def _moved(self):
        """``made`` moves: a partition appeared or a topic's went. Its listeners are told now, so none asks per wake."""
        self.made += 1
        for fn in self.made_listeners:
            fn()

    def hold_writer(self, topic, partition):
        """Mark ``topic``-``partition`` checked for puts (the caller checked); returns its PartitionIndex."""
        p = self._writers[(topic, partition)] = self.make(topic, partition)
        return p

    def evict_writers(self, topic):
        """Puts to ``topic`` are checked again (its settings changed, or it is deleted)."""
        for key in [k for k in self._writers if k[0] == topic]:
            del self._writers[key]

    def drop(self, topic):
        """Close and forget every partition of ``topic`` (its files stay: the caller removes them). ``made`` moves,
        also for a topic none of whose partitions had an index: a reader of its partitions looks again."""
        self._moved()
        self.evict_writers(topic)
        for key in [k for k in self._all if k[0] == topic]:
            self._all.pop(key).close()
        self._quota.forget(topic)

    def close_all(self, discard_prepared=True):
        """Close every partition's index files (the table stays)."""
        for p in list(self._all.values()):
            p.close(discard_prepared)
