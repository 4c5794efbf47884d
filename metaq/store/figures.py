"""The store's figures for ``stats`` and the admin views: a part of ``MessageStore`` (store.py) kept here."""

from metaq.store.results import PartitionStats


class StoreFigures:
    """Mixed into ``MessageStore``: reads its partitions (``_parts``, ``_reader``) and log (``_log``)."""

    def partition_stats(self, topic, partition):
        p = self._reader(topic, partition)
        if p is None:
            return PartitionStats(topic, partition, 0, 0, 0, 0, 0)
        return PartitionStats(topic, partition, p.min, p.visible, p.visible - p.min, self._log_bytes(p),
                              p.size_on_disk())

    def _log_bytes(self, p):
        if p.log_bytes is None:
            p.log_bytes = sum(u[2] for u in p.units(p.min, p.max))
        return p.log_bytes

    def topic_bytes(self, topic):
        """Bytes of the topic's records in the commit log."""
        return sum(self._log_bytes(p) for (t, _n), p in self._parts.items() if t == topic)

    def total_messages(self):
        return sum(p.visible - p.min for p in self._parts.values())

    def appended_messages(self):
        """Messages ever appended up to the written end (the sum of the partitions' max offsets; unlike
        ``total_messages`` it ignores retention, so a slave holding the same log has the same figure)."""
        return sum(p.max for p in self._parts.values())

    def log_bytes_on_disk(self):
        return sum(s.size for s in self._log.segments)
